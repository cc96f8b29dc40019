//! Timestamps across the whole range the inode item holds (an i64 of seconds, as the kernel's
//! time64): before 1970, past 2038 and 2486, at both ends, kept exactly through a remount;
//! nanoseconds of a second or more are EINVAL.

use super::*;
use crate::fs::types::SetTime;

fn set_times(fs: &Fs, ino: u64, t: Timespec) -> FsResult<Attr> {
    let sa = SetAttr {
        atime: Some(SetTime::At(t)),
        mtime: Some(SetTime::At(t)),
        ..SetAttr::default()
    };
    fs.setattr(U, ino, sa)
}

const TIMES: [Timespec; 8] = [
    Timespec {
        sec: i64::MIN,
        nsec: 0,
    },
    Timespec {
        sec: -(1 << 31),
        nsec: 0,
    },
    Timespec {
        sec: -2_208_988_800,
        nsec: 500_000_000,
    },
    Timespec {
        sec: -1,
        nsec: 999_999_999,
    },
    Timespec { sec: 0, nsec: 0 },
    Timespec {
        sec: (1 << 31) - 1,
        nsec: 1,
    },
    Timespec {
        sec: 16_299_260_425,
        nsec: 0,
    },
    Timespec {
        sec: i64::MAX,
        nsec: 999_999_999,
    },
];

/// Every time, from the first second an i64 holds to the last, comes back as it was set, in
/// memory and after a remount (no clamping: the range is the kernel's own), and the image
/// checks clean.
#[test]
fn times_from_the_first_to_the_last_second_are_kept_exactly() {
    let clock = TestClock::new();
    let dev = new_dev(81);
    let fs = mount(&dev, opts(&clock));
    let files: Vec<u64> = (0..TIMES.len())
        .map(|i| file_in_root(&fs, format!("t{i}").as_bytes()))
        .collect();
    for (&f, &t) in files.iter().zip(&TIMES) {
        let a = set_times(&fs, f, t).unwrap();
        assert_eq!((a.atime, a.mtime), (t, t));
    }
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    for (&f, &t) in files.iter().zip(&TIMES) {
        let a = fs.getattr(f).unwrap();
        assert_eq!((a.atime, a.mtime), (t, t), "after the remount");
    }
    assert_clean(&fs);
}

/// A billion nanoseconds or more is EINVAL (as utimensat answers), and the times stay.
#[test]
fn a_billion_nanoseconds_is_invalid_and_changes_nothing() {
    let clock = TestClock::new();
    let dev = new_dev(82);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    let before = fs.getattr(f).unwrap();
    for nsec in [1_000_000_000, u32::MAX] {
        let r = set_times(&fs, f, Timespec { sec: 5, nsec });
        assert!(matches!(r, Err(FsError::Invalid(_))), "{r:?}");
    }
    let after = fs.getattr(f).unwrap();
    assert_eq!(
        (after.atime, after.mtime, after.ctime),
        (before.atime, before.mtime, before.ctime)
    );
    assert_clean(&fs);
}
