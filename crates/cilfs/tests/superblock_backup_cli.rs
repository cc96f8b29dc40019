//! Backup superblocks through the commands, on a real image file: the primary zeroed, `info`
//! and `check` read the backup and say so (check exits 1), `repair` writes the primary back,
//! a mount reads the backup and rewrites the primary; the image cut short by a block, check
//! reports the lost end copy and repair restores it.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

use cilfs_core::fs::{Fs, FsOptions};
use cilfs_core::journal::{Journal, JournalConfig};
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Output;
use std::sync::Arc;

mod common;
use common::{cilfs, mkfs, s};

const SIZE_BYTES: u64 = 64 << 20;
/// mkfs's default block size: the front copy is block 1 MiB / 4096, the end copy the last.
const FRONT: u64 = 256;
const LAST: u64 = SIZE_BYTES / 4096 - 1;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn zero_sector_0(img: &Path) {
    let mut f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    f.write_all(&[0u8; 512]).unwrap();
    f.sync_all().unwrap();
}

fn sector_0(img: &Path) -> Vec<u8> {
    let mut f = std::fs::File::open(img).unwrap();
    let mut b = vec![0u8; 512];
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut b).unwrap();
    b
}

fn check(img: &Path) -> (Option<i32>, String) {
    let o = cilfs(&["check", s(img)]);
    (o.status.code(), text(&o))
}

#[test]
fn primary_zeroed_info_and_check_read_the_backup_and_repair_writes_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    mkfs(&img, "64M");
    let info = text(&cilfs(&["info", s(&img)]));
    assert!(
        info.contains(&format!(
            "copies at blocks {FRONT} (byte 1048576) and {LAST}"
        )),
        "{info}"
    );
    zero_sector_0(&img);

    let info = cilfs(&["info", s(&img)]);
    assert!(info.status.success(), "{}", text(&info));
    assert!(
        text(&info).contains("primary damaged (superblock: bad magic"),
        "{}",
        text(&info)
    );
    let (code, out) = check(&img);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!("using the backup at block {FRONT}")),
        "{out}"
    );

    let dry = cilfs(&["repair", "-n", s(&img)]);
    assert!(
        text(&dry).contains(&format!(
            "would rewrite the primary from the backup at block {FRONT}"
        )),
        "{}",
        text(&dry)
    );
    assert_eq!(sector_0(&img), vec![0u8; 512], "repair -n wrote nothing");

    let fixed = cilfs(&["repair", s(&img)]);
    assert_eq!(fixed.status.code(), Some(0), "{}", text(&fixed));
    assert!(
        text(&fixed).contains(&format!(
            "rewrote the primary from the backup at block {FRONT}"
        )),
        "{}",
        text(&fixed)
    );
    assert_eq!(&sector_0(&img)[..8], b"CILFS\0SB");
    let (code, out) = check(&img);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("superblock:"), "{out}");
    // A second repair finds nothing to do.
    let again = text(&cilfs(&["repair", s(&img)]));
    assert!(again.contains("nothing to repair"), "{again}");
}

/// The mount (through the library: the FUSE mount tests need root) reads the backup and
/// rewrites the primary; what was written before is all there.
#[test]
fn primary_zeroed_a_mount_reads_the_backup_and_rewrites_the_primary() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    mkfs(&img, "64M");
    zero_sector_0(&img);
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(&img, FileDeviceOptions::default()).unwrap());
    let j = Journal::open(dev, None, JournalConfig::default()).unwrap();
    assert_eq!(j.geometry().from_backup, Some(FRONT));
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    let root = fs.getattr(1).unwrap();
    assert_eq!(root.ino, 1);
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(&sector_0(&img)[..8], b"CILFS\0SB");
    let (code, out) = check(&img);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn image_cut_short_by_a_block_check_reports_the_end_copy_and_repair_restores_it() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    mkfs(&img, "64M");
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    f.set_len(SIZE_BYTES - 4096).unwrap();
    drop(f);
    let (code, out) = check(&img);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!("the backup at block {LAST} is missing")),
        "{out}"
    );
    let fixed = cilfs(&["repair", s(&img)]);
    assert_eq!(fixed.status.code(), Some(0), "{}", text(&fixed));
    assert!(text(&fixed).contains("extended"), "{}", text(&fixed));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), SIZE_BYTES);
    let (code, out) = check(&img);
    assert_eq!(code, Some(0), "{out}");
}
