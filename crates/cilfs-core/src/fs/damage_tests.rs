//! Damaged metadata on the simulated device: every access ends (no spinning thread), with the
//! data or an error, and damage that changes what a file reads is found by the checker.

#![allow(clippy::unwrap_used)]

use super::tests::{jcfg, mount, new_dev, TestClock};
use super::tree::node::{INTERIOR_ENTRY_BYTES, NODE_HEADER_BYTES, NODE_LSN_OFFSET};
use super::types::Cred;
use super::*;
use crate::log::recover::write_lsn_stamp;
use crate::log::Lsn;
use cilfs_device::rng::SimRng;
use cilfs_device::{AlignedBuf, Device, SimDevice, WriteFlags};

const FILES: usize = 150;

fn content(i: usize) -> Vec<u8> {
    vec![(i % 250) as u8 + 1; 3000 + (i % 7) * 700]
}

/// A cleanly unmounted filesystem of `FILES` files with data, its fs tree two levels deep or
/// more; returns the device and the fs tree's root block.
fn populated() -> (Arc<SimDevice>, u64) {
    let clock = TestClock::new();
    let dev = new_dev(500);
    let fs = mount(
        &dev,
        FsOptions {
            clock: clock.clock(),
            ..FsOptions::default()
        },
    );
    for i in 0..FILES {
        let name = format!("file-with-a-longer-name-{i:04}");
        let f = fs
            .mknod(Cred::ROOT, ROOT_INO, name.as_bytes(), 0o100_644, 0)
            .unwrap()
            .ino;
        fs.write(Cred::ROOT, f, 0, &content(i)).unwrap();
    }
    let root = {
        let st = fs.state.read();
        let r = fs.hdr(&st).roots().fs;
        r
    };
    assert!(root.level >= 1, "the fs tree has an interior root");
    fs.unmount().unwrap();
    (dev, root.blkno)
}

/// Mounts a copy of `img` and reads every file; Ok(true) if all read back as written.
fn read_all(dev: &Arc<SimDevice>) -> Result<bool, FsError> {
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg())?;
    let fs = Fs::open(j, FsOptions::default())?;
    let mut same = true;
    for i in 0..FILES {
        let name = format!("file-with-a-longer-name-{i:04}");
        let got = fs
            .lookup(ROOT_INO, name.as_bytes())
            .and_then(|a| fs.read(a.ino, 0, 1 << 20));
        same &= got.is_ok_and(|d| d == content(i));
    }
    same &= fs
        .readdir(ROOT_INO, 0, 10_000)
        .is_ok_and(|v| v.len() == FILES + 2);
    Ok(same)
}

/// Flipped bits in the keys of the fs tree's root (a stamp that still verifies, as a bad
/// memory write before the CRC was taken would leave): every read ends, and any flip that
/// changes what a file reads is found by the checker.
#[test]
fn flipped_root_keys_never_hang_and_are_found_when_they_matter() {
    let (dev, root) = populated();
    let img = dev.stable_image();
    let len = dev.len();
    let mut rng = SimRng::new(77);
    let bs = tests::BS as usize;
    let (mut harmful, mut found) = (0, 0);
    for case in 0..48 {
        let d = Arc::new(SimDevice::from_image(img.clone(), len, case));
        let at = root * bs as u64;
        let mut b = AlignedBuf::zeroed(bs);
        d.read(at, &mut b).unwrap();
        let count = usize::from(u16::from_le_bytes([b[6], b[7]]));
        let entry = rng.below(count.max(1) as u64) as usize;
        let bit = rng.below(128) as usize;
        let p = NODE_HEADER_BYTES + entry * INTERIOR_ENTRY_BYTES + bit / 8;
        b[p] ^= 1 << (bit % 8);
        let o = usize::from(NODE_LSN_OFFSET);
        let lsn = Lsn::from_raw(u64::from_le_bytes(b[o..o + 8].try_into().unwrap()));
        write_lsn_stamp(&mut b, NODE_LSN_OFFSET, lsn, &tests::layout().uuid);
        d.write(at, &b, WriteFlags::FUA).unwrap();
        let intact = read_all(&d).unwrap_or(false);
        let r = check::check_image(d.clone() as Arc<dyn Device>, None);
        let clean = r.as_ref().is_ok_and(|(r, _)| r.is_clean());
        if !intact {
            harmful += 1;
            assert!(
                !clean,
                "case {case}: entry {entry} bit {bit}: reads changed, check clean"
            );
            found += 1;
        }
    }
    eprintln!("{harmful} of 48 flips changed what files read; the checker found {found}");
}
