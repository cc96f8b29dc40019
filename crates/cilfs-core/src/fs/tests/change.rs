//! The change attribute, lazy and eager.

use super::*;

/// A change attribute query of an inode not in memory reads its item and leaves it out of
/// memory, under the shared state lock only (it loaded the inode under the exclusive one); the
/// inode's next change still moves the value past what the query returned.
#[test]
fn a_change_query_of_an_inode_not_in_memory_takes_no_exclusive_lock() {
    let clock = TestClock::new();
    let dev = new_dev(42);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, b"x").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    let in_memory = |fs: &Fs| fs.read_state().inodes.lock(f).contains_key(&f);
    let exclusive = |fs: &Fs| {
        fs.lock_waits()
            .iter()
            .find(|l| l.name == "fs state (exclusive)")
            .map(|l| l.acquired)
            .unwrap()
    };
    assert!(!in_memory(&fs));
    let before = exclusive(&fs);
    let q1 = fs.change_attr(f).unwrap();
    assert_eq!(exclusive(&fs), before, "queried under the shared lock");
    assert!(!in_memory(&fs), "not put in memory");
    assert_eq!(fs.change_attr(f).unwrap(), q1, "nothing changed");
    fs.write(U, f, 0, b"y").unwrap();
    assert!(fs.change_attr(f).unwrap() > q1, "the next change moves it");
    assert!(matches!(fs.change_attr(12_345), Err(FsError::NotFound)));
    assert_clean(&fs);
}

#[test]
fn lazy_change_attribute() {
    let clock = TestClock::new();
    let dev = new_dev(4);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[1u8; 100]).unwrap();
    // Time stands still and nobody asked: a 1-byte overwrite logs no inode.
    let before = fs.stats.snapshot();
    for i in 0..50 {
        fs.write(U, f, i, &[2u8]).unwrap();
    }
    let after = fs.stats.snapshot();
    assert_eq!(
        after.inode_logs, before.inode_logs,
        "no inode logged without a query or a tick"
    );
    assert_eq!(after.transactions, before.transactions);
    assert_eq!(after.change_bumps_skipped - before.change_bumps_skipped, 50);
    // A query, then a write: the counter moves, once.
    let q1 = fs.change_attr(f).unwrap();
    fs.write(U, f, 0, &[3u8]).unwrap();
    let q2 = fs.change_attr(f).unwrap();
    assert!(q2 > q1);
    let logs = fs.stats.snapshot().inode_logs;
    fs.write(U, f, 0, &[4u8]).unwrap();
    assert_eq!(
        fs.stats.snapshot().inode_logs,
        logs + 1,
        "queried since the last bump: logged"
    );
    fs.write(U, f, 0, &[5u8]).unwrap();
    assert_eq!(
        fs.stats.snapshot().inode_logs,
        logs + 1,
        "not queried again: not logged"
    );
    // A timestamp tick logs the inode and bumps.
    let q3 = fs.change_attr(f).unwrap();
    clock.advance_ms(1);
    fs.write(U, f, 0, &[6u8]).unwrap();
    let q4 = fs.change_attr(f).unwrap();
    assert!(q4 > q3);
    // It only grows across a clean remount...
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    let q5 = fs.change_attr(f).unwrap();
    assert!(q5 >= q4);
    fs.write(U, f, 0, &[7u8]).unwrap();
    let q6 = fs.change_attr(f).unwrap();
    assert!(q6 > q5, "a loaded inode starts queried");
    // ... and across a crash: the epoch lifts every value above what was seen before.
    fs.write(U, f, 0, &[8u8]).unwrap();
    let q7 = fs.change_attr(f).unwrap();
    fs.write(U, f, 0, &[9u8]).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    let q8 = fs.change_attr(f).unwrap();
    assert!(q8 > q7, "after a crash: {q8} must exceed {q7}");
    assert_clean(&fs);
}

#[test]
fn eager_change_attribute_logs_every_write() {
    let clock = TestClock::new();
    let dev = new_dev(5);
    let fs = mount(
        &dev,
        FsOptions {
            iversion: IversionMode::Eager,
            ..opts(&clock)
        },
    );
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[1u8; 10]).unwrap();
    let before = fs.stats.snapshot();
    for i in 0..20 {
        fs.write(U, f, i, &[2u8]).unwrap();
    }
    let after = fs.stats.snapshot();
    assert_eq!(after.inode_logs - before.inode_logs, 20);
    assert_eq!(after.change_bumps - before.change_bumps, 20);
    assert_clean(&fs);
}
