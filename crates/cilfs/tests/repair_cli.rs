//! `cilfs repair` on image files: what it says it changes, its exit codes, `-n` writing
//! nothing, and a second run finding nothing to do.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

mod common;
use cilfs_core::fs::items::header::Header;
use cilfs_device::{AlignedBuf, Device, FileDevice, FileDeviceOptions, WriteFlags};
use common::{cilfs, log_inode_count_change, mkfs, s, sha1};
use std::path::Path;
use std::process::Output;

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cilfs args`, asserting its exit status; returns what it said.
fn expect(args: &[&str], status: i32) -> String {
    let out = cilfs(args);
    assert_eq!(out.status.code(), Some(status), "{args:?}: {}", said(&out));
    said(&out)
}

/// Zeroes the fs tree's root block (the root directory's inode lives in it).
fn zero_fs_root(img: &Path) {
    let dev = FileDevice::open(img, FileDeviceOptions::default()).unwrap();
    let geo = cilfs_core::Geometry::read(&dev, None).unwrap();
    let bs = geo.sb.block_size as usize;
    let hdr = geo.metadata_area().0;
    let mut b = AlignedBuf::zeroed(bs);
    dev.read(hdr * bs as u64, &mut b).unwrap();
    let root = Header::decode(&b, hdr).unwrap().fs_root.blkno;
    dev.write(root * bs as u64, &AlignedBuf::zeroed(bs), WriteFlags::FUA)
        .unwrap();
    dev.flush().unwrap();
}

#[test]
fn repair_fixes_a_miscounted_header_in_a_dirty_log_and_n_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    mkfs(&img, "64M");
    // Left as a crash leaves it: the wrong count is in the log, to be replayed.
    drop(log_inode_count_change(&img, 1));
    let sum = sha1(&img);
    let out = expect(&["repair", "-n", s(&img)], 1);
    assert!(out.contains("a repair would make"), "{out}");
    assert!(out.contains("header: inode count 2 -> 1"), "{out}");
    assert_eq!(sha1(&img), sum, "repair -n wrote to the image");
    let out = expect(&["repair", s(&img)], 0);
    assert!(out.contains("log: not clean"), "{out}");
    assert!(out.contains("header: inode count 2 -> 1"), "{out}");
    assert!(out.contains("repaired: consistent"), "{out}");
    expect(&["check", s(&img)], 0);
    let out = expect(&["repair", s(&img)], 0);
    assert!(out.contains("nothing to repair"), "{out}");
}

#[test]
fn repair_rebuilds_a_zeroed_fs_tree_root() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    mkfs(&img, "64M");
    zero_fs_root(&img);
    // Damage found, not a check that gave up: exit 1, the block named.
    let out = expect(&["check", s(&img)], 1);
    assert!(out.contains("is corrupt"), "{out}");
    let out = expect(&["repair", s(&img)], 0);
    assert!(out.contains("fs tree rebuilt"), "{out}");
    assert!(out.contains("the root directory was missing"), "{out}");
    assert!(out.contains("repaired: consistent"), "{out}");
    expect(&["check", s(&img)], 0);
    let out = expect(&["repair", s(&img)], 0);
    assert!(out.contains("nothing to repair"), "{out}");
}
