//! Read-only: switched at runtime and back, refused for a read-only mount, waiting for open
//! transactions.

use super::*;

/// A remount read-only at runtime (`set_read_only`): every change is refused with `ReadOnly`
/// (EROFS), what was written before is on disk with a clean log (a crash then replays
/// nothing), and nothing more reaches the device while read-only, not even a sync; switched
/// back, changes go through the journal again and survive a crash by replay.
#[test]
fn a_runtime_switch_to_read_only_leaves_the_log_clean_and_back_to_read_write_writes_again() {
    let clock = TestClock::new();
    let dev = new_dev(41);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"before");
    fs.write(U, f, 0, b"written before the remount").unwrap();
    fs.mkdir(U, ROOT_INO, b"dir", 0o755).unwrap();
    assert!(!fs.journal().superblock().clean);

    fs.set_read_only(true).unwrap();
    assert!(fs.is_read_only());
    assert!(fs.journal().superblock().clean, "the superblock says clean");
    let writes = dev.stats().writes;
    assert!(matches!(fs.write(U, f, 0, b"x"), Err(FsError::ReadOnly)));
    assert!(matches!(
        fs.mkdir(U, ROOT_INO, b"d2", 0o755),
        Err(FsError::ReadOnly)
    ));
    assert!(matches!(
        fs.unlink(ROOT_INO, b"before"),
        Err(FsError::ReadOnly)
    ));
    clock.advance_ms(48 * 3600 * 1000);
    assert_eq!(fs.read(f, 0, 64).unwrap(), b"written before the remount");
    fs.sync().unwrap();
    fs.set_read_only(true).unwrap();
    assert_eq!(dev.stats().writes, writes, "a read-only filesystem wrote");

    // A crash now finds the log clean and every file.
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    {
        let c = mount(&crashed, opts(&clock));
        let r = c.journal().recovery_report();
        assert!(r.was_clean, "{r:?}");
        assert_eq!(r.checkpoints_replayed, 0, "{r:?}");
        assert_eq!(c.read(f, 0, 64).unwrap(), b"written before the remount");
        assert_eq!(names(&c, ROOT_INO), [".", "..", "before", "dir"]);
        assert_clean(&c);
    }

    // Read-write again: the superblock says the log is in use before anything is logged.
    fs.set_read_only(false).unwrap();
    assert!(!fs.is_read_only());
    assert!(!fs.journal().superblock().clean);
    let g = file_in_root(&fs, b"after");
    fs.write(U, g, 0, b"written after").unwrap();
    fs.fsync(g).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let c = mount(&crashed, opts(&clock));
    assert!(!c.journal().recovery_report().was_clean);
    assert_eq!(c.read(g, 0, 64).unwrap(), b"written after");
    assert_eq!(names(&c, ROOT_INO), [".", "..", "after", "before", "dir"]);
    assert_clean(&c);
}

/// A filesystem mounted read-only from the start has no writable devices behind it: it
/// refuses to be switched to read-write.
#[test]
fn a_read_only_mount_is_not_switched_to_read_write() {
    let clock = TestClock::new();
    let dev = new_dev(42);
    let fs = mount(
        &dev,
        FsOptions {
            read_only: true,
            ..opts(&clock)
        },
    );
    assert!(matches!(fs.set_read_only(false), Err(FsError::ReadOnly)));
    fs.set_read_only(true).unwrap();
    assert!(fs.is_read_only());
}

/// A switch to read-only waits for transactions already open (they commit and are made
/// clean with the rest) and refuses new ones at once.
#[test]
fn a_switch_to_read_only_waits_for_open_transactions_and_refuses_new_ones() {
    use crate::journal::JournalError;
    use crate::trans::Reservation;
    let clock = TestClock::new();
    let dev = new_dev(43);
    let fs = mount(&dev, opts(&clock));
    let j = Arc::clone(fs.journal());
    let open = j.begin(Reservation { unit_bytes: 4096 }).unwrap();
    std::thread::scope(|s| {
        let switching = s.spawn(|| fs.set_read_only(true));
        let frozen = (0..10_000).any(|_| {
            j.is_frozen() || {
                std::thread::sleep(std::time::Duration::from_millis(1));
                false
            }
        });
        assert!(frozen, "the freeze began");
        assert!(matches!(
            j.begin(Reservation { unit_bytes: 4096 }),
            Err(JournalError::ReadOnly)
        ));
        assert!(matches!(j.begin_unreserved(), Err(JournalError::ReadOnly)));
        // Held open, the transaction keeps the freeze from finishing.
        assert!(!switching.is_finished());
        assert!(!j.superblock().clean);
        drop(open);
        switching.join().unwrap().unwrap();
    });
    assert!(j.superblock().clean);
    fs.set_read_only(false).unwrap();
    j.begin(Reservation { unit_bytes: 4096 }).unwrap();
}
