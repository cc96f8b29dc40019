//! The filesystem label: root's to set, at most 255 bytes, kept across a remount, and a crash
//! at any write of its change leaves the old label or the new one on an image that mounts.

#![allow(clippy::unwrap_used)]

use crate::fs::tests::{jcfg, mount, new_dev, BLOCKS, BS};
use crate::fs::types::Cred;
use crate::fs::*;
use cilfs_device::{Device, RecordingDevice, SimDevice, Survival};

#[test]
fn the_label_is_roots_bounded_and_kept() {
    let dev = new_dev(21);
    let fs = mount(&dev, FsOptions::default());
    assert_eq!(fs.label(), b"");
    assert!(matches!(
        fs.set_label(Cred::user(1000, 1000), b"x"),
        Err(FsError::NotPermitted)
    ));
    assert!(matches!(
        fs.set_label(Cred::ROOT, &[b'a'; 256]),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.set_label(Cred::ROOT, b"a\0b"),
        Err(FsError::Invalid(_))
    ));
    fs.set_label(Cred::ROOT, &[b'l'; 255]).unwrap();
    fs.set_label(Cred::ROOT, b"scratch").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(mount(&dev, FsOptions::default()).label(), b"scratch");
}

#[test]
fn a_crash_at_any_write_of_a_label_change_keeps_one_label_whole() {
    let size = BLOCKS * u64::from(BS);
    let base = new_dev(22);
    let fs = mount(&base, FsOptions::default());
    fs.set_label(Cred::ROOT, b"old").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let rec = Arc::new(RecordingDevice::new(
        SimDevice::from_image(base.stable_image(), size, 0),
        base.stable_image(),
    ));
    let j = Journal::open(Arc::clone(&rec) as Arc<dyn Device>, None, jcfg()).unwrap();
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    let from = rec.op_count();
    fs.set_label(Cred::ROOT, b"new label").unwrap();
    let to = rec.op_count();
    assert!(to > from);
    for point in from..=to {
        for torn in [false, true] {
            let img = rec.crash_image(point, &mut |_, sectors| match (torn, sectors) {
                (true, n) => Survival::Torn((0..n).map(|i| i % 2 == 0).collect()),
                _ => Survival::Kept,
            });
            let crashed = Arc::new(SimDevice::from_image(img, size, 0));
            let got = mount(&crashed, FsOptions::default()).label();
            assert!(
                got == b"old" || got == b"new label",
                "crash at {point}: label {got:?}"
            );
            if point == to {
                assert_eq!(got, b"new label", "durable when set_label returned");
            }
        }
    }
}
