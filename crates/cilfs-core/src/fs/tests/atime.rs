//! Access times: relatime, noatime, strictatime, readdir, lazytime and read-only mounts.

use super::*;

fn atime_opts(clock: &TestClock, atime: AtimeMode, lazytime: bool) -> FsOptions {
    FsOptions {
        atime,
        lazytime,
        ..opts(clock)
    }
}

fn set_atime(fs: &Fs, ino: u64, t: Timespec) {
    let sa = SetAttr {
        atime: Some(crate::fs::types::SetTime::At(t)),
        ..SetAttr::default()
    };
    fs.setattr(U, ino, sa).unwrap();
}

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

#[test]
fn relatime_moves_atime_after_a_change_or_a_day_without_a_change_or_a_force() {
    let clock = TestClock::new();
    clock.advance_ms(10 * DAY_MS);
    let dev = new_dev(43);
    let fs = mount(&dev, atime_opts(&clock, AtimeMode::Relative, false));
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, b"data").unwrap();
    let mtime = times(&fs, f).1;
    let change = fs.change_attr(f).unwrap();
    let forces = fs.journal().stats().log.log_forces;
    // An atime set long ago (as touch -a -d 2001 does) is older than mtime: the read moves it.
    set_atime(&fs, f, Timespec { sec: 1000, nsec: 0 });
    let ctime_after_touch = times(&fs, f).2;
    clock.advance_ms(1000);
    let now = fs.now();
    let logs = fs.stats.snapshot().inode_logs;
    assert_eq!(fs.read(f, 0, 100).unwrap(), b"data");
    assert_eq!(
        times(&fs, f),
        (now, mtime, ctime_after_touch),
        "atime moved, mtime and ctime did not"
    );
    assert_eq!(fs.stats.snapshot().atime_updates, 1);
    assert_eq!(fs.stats.snapshot().inode_logs, logs + 1, "a logged change");
    assert_eq!(
        fs.change_attr(f).unwrap(),
        change + 1,
        "only setattr bumped it"
    );
    // Newer than mtime and ctime, less than a day old: reads leave it.
    for _ in 0..3 {
        clock.advance_ms(60_000);
        fs.read(f, 0, 100).unwrap();
        assert_eq!(times(&fs, f).0, now);
    }
    // A day old: moved again.
    clock.advance_ms(DAY_MS);
    let later = fs.now();
    fs.read(f, 0, 100).unwrap();
    assert_eq!(times(&fs, f).0, later);
    // A write makes mtime newer: the next read moves it; one at EOF counts.
    clock.advance_ms(1000);
    fs.write(U, f, 4, b"more").unwrap();
    clock.advance_ms(1000);
    let last = fs.now();
    assert!(fs.read(f, 100, 10).unwrap().is_empty());
    assert_eq!(times(&fs, f).0, last);
    assert_eq!(fs.stats.snapshot().atime_updates, 3);
    assert_eq!(
        fs.journal().stats().log.log_forces,
        forces,
        "no atime update forced the log"
    );
    // Read with O_NOATIME: left alone.
    clock.advance_ms(2 * DAY_MS);
    fs.read_opts(f, 0, 10, false).unwrap();
    assert_eq!(times(&fs, f).0, last);
    // Logged: a crash after the next checkpoint keeps it.
    fs.read(f, 0, 10).unwrap();
    let kept = times(&fs, f).0;
    fs.sync().unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, atime_opts(&clock, AtimeMode::Never, false));
    assert_eq!(times(&fs, f).0, kept);
    assert_clean(&fs);
}

#[test]
fn readdir_moves_a_directorys_atime_as_a_read_does() {
    let clock = TestClock::new();
    clock.advance_ms(10 * DAY_MS);
    let dev = new_dev(44);
    let fs = mount(&dev, atime_opts(&clock, AtimeMode::Relative, false));
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    fs.mknod(U, d, b"f", items::inode::S_IFREG | 0o644, 0)
        .unwrap();
    set_atime(&fs, d, Timespec { sec: 1000, nsec: 0 });
    clock.advance_ms(1000);
    let now = fs.now();
    assert_eq!(names(&fs, d), vec![".", "..", "f"]);
    assert_eq!(times(&fs, d).0, now);
    // A read of a directory is EISDIR and moves nothing.
    clock.advance_ms(2 * DAY_MS);
    assert!(matches!(fs.read(d, 0, 10), Err(FsError::IsDir)));
    assert_eq!(times(&fs, d).0, now);
    assert_clean(&fs);
}

#[test]
fn noatime_never_and_strictatime_always_moves_atime() {
    let clock = TestClock::new();
    clock.advance_ms(10 * DAY_MS);
    for (mode, seed) in [(AtimeMode::Never, 45), (AtimeMode::Strict, 46)] {
        let dev = new_dev(seed);
        let fs = mount(&dev, atime_opts(&clock, mode, false));
        let f = file_in_root(&fs, b"f");
        let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
        fs.write(U, f, 0, b"data").unwrap();
        let old = Timespec { sec: 1000, nsec: 0 };
        set_atime(&fs, f, old);
        set_atime(&fs, d, old);
        for _ in 0..3 {
            clock.advance_ms(1);
            fs.read(f, 0, 10).unwrap();
            fs.readdir(d, 0, 10).unwrap();
            let want = match mode {
                AtimeMode::Never => old,
                _ => fs.now(),
            };
            assert_eq!((times(&fs, f).0, times(&fs, d).0), (want, want), "{mode:?}");
        }
        // Nothing moves it twice at one instant.
        let n = fs.stats.snapshot().atime_updates;
        fs.read(f, 0, 10).unwrap();
        assert_eq!(fs.stats.snapshot().atime_updates, n, "{mode:?}");
        assert_eq!(n, if mode == AtimeMode::Never { 0 } else { 6 });
        assert_clean(&fs);
    }
}

#[test]
fn lazytime_keeps_timestamps_in_memory_until_the_inode_is_logged() {
    let clock = TestClock::new();
    clock.advance_ms(10 * DAY_MS);
    let dev = new_dev(47);
    let fs = mount(&dev, atime_opts(&clock, AtimeMode::Relative, true));
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[1u8; 4096]).unwrap();
    fs.sync().unwrap();
    clock.advance_ms(1000);
    let txs = fs.stats.snapshot().transactions;
    // A read and an overwrite of blocks the file owns: new times, no transaction.
    fs.read(f, 0, 10).unwrap();
    let read_at = fs.now();
    clock.advance_ms(1000);
    fs.write(U, f, 0, &[2u8; 100]).unwrap();
    let written_at = fs.now();
    assert_eq!(times(&fs, f), (read_at, written_at, written_at));
    assert_eq!(fs.stats.snapshot().transactions, txs, "nothing logged yet");
    // fsync logs them: a crash after it keeps them.
    fs.fsync(f).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert_eq!(times(&fs, f), (read_at, written_at, written_at));
    assert_clean(&fs);
}

#[test]
fn a_read_only_mount_moves_no_atime() {
    let clock = TestClock::new();
    clock.advance_ms(10 * DAY_MS);
    let dev = new_dev(48);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, b"data").unwrap();
    let before = times(&fs, f).0;
    fs.unmount().unwrap();
    drop(fs);
    clock.advance_ms(2 * DAY_MS);
    let ro = FsOptions {
        read_only: true,
        atime: AtimeMode::Strict,
        ..opts(&clock)
    };
    let fs = mount(&dev, ro);
    assert_eq!(fs.read(f, 0, 10).unwrap(), b"data");
    fs.readdir(ROOT_INO, 0, 10).unwrap();
    assert_eq!(times(&fs, f).0, before);
    assert_eq!(fs.stats.snapshot().atime_updates, 0);
}
