//! Operations that find no log space: they wait for it outside the filesystem lock, and log
//! what they change.

use super::*;

/// Every byte of log space the journal will grant, held by transactions the caller keeps.
fn hold_all_log_space(j: &Journal) -> Vec<crate::journal::Transaction<'_>> {
    use crate::trans::Reservation;
    let mut held = Vec::new();
    for unit in [j.max_reservation_bytes(), 64 * 1024, 4096, 512, 1] {
        while let Some(t) = j.try_begin(Reservation { unit_bytes: unit }).unwrap() {
            held.push(t);
        }
    }
    assert!(!held.is_empty());
    held
}

/// Returns once an operation waits for log space: in the grant queue (an optimistic commit,
/// holding no lock), or outside the lock it gave up (`Retry::LogSpace`; the counter itself,
/// since `Fs::stats` takes the filesystem lock). `finished` says whether the operation ended
/// (it must not, with no space to have). On a failure the held space goes back first, so the
/// blocked thread ends and the scope reports the panic instead of hanging; the 30 s limit
/// only turns a hang into a failure.
fn wait_for_a_log_space_wait(
    fs: &Fs,
    j: &Journal,
    started: std::time::Instant,
    held: &mut Vec<crate::journal::Transaction<'_>>,
    finished: impl Fn() -> bool,
    what: &str,
) {
    while fs.stats.retries_log_space.get() == 0 && j.grant.read(|g| g.waiting()) == 0 {
        if started.elapsed() > std::time::Duration::from_secs(30) {
            held.clear();
            panic!("the {what} never waited for log space with no lock held");
        }
        if finished() {
            held.clear();
            panic!("the {what} found log space");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A write that finds no log space waits for it before it changes anything, and then logs
/// what it changes. Under the exclusive lock, its first run used to put the pages, the times
/// and the bumped counter in memory and only then give up to wait: the second found nothing
/// left to log, so after a clean remount the counter read back lower than a query had
/// returned (fs crash seed 3131), and the new mtime was gone. Such a write now commits
/// optimistically and waits in the grant queue; the exclusive path (writes that map blocks)
/// begins its transaction before it changes anything.
#[test]
fn a_write_that_waits_for_log_space_logs_its_change() {
    use std::time::Instant;
    let clock = TestClock::new();
    let dev = new_dev(95);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[1u8; 4096]).unwrap();
    fs.sync().unwrap();
    let seen = fs.change_attr(f).unwrap();
    clock.advance_ms(1);
    let j = Arc::clone(fs.journal());
    let mut held = hold_all_log_space(&j);
    std::thread::scope(|s| {
        // An overwrite of a cached block: no block to allocate, so its transaction is the
        // inode's alone.
        let writer = s.spawn(|| fs.write(U, f, 0, &[2u8; 100]));
        let started = Instant::now();
        wait_for_a_log_space_wait(
            &fs,
            &j,
            started,
            &mut held,
            || writer.is_finished(),
            "write",
        );
        drop(std::mem::take(&mut held));
        assert_eq!(writer.join().unwrap().unwrap(), 100);
    });
    let mtime = times(&fs, f).1;
    assert_eq!(mtime, (clock.clock())());
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(fs.read(f, 0, 2).unwrap(), [2u8, 2]);
    assert_eq!(times(&fs, f).1, mtime, "the write's mtime was logged");
    let now = fs.change_attr(f).unwrap();
    assert!(
        now > seen,
        "the contents changed after a query returned {seen}, but it reads {now} after a clean remount"
    );
    assert_clean(&fs);
}

/// An operation that finds no log space waits for it outside the filesystem lock (docs/concurrency.md, invariant 1):
/// while a create waits (the test holds every byte of log space), a getattr and a lookup of
/// another inode complete; once the space is given back the create completes, once. Before,
/// the create waited inside the lock and both stayed blocked. The 30 s limits only turn such a
/// hang into a failure.
#[test]
fn an_operation_waiting_for_log_space_holds_no_lock_others_need() {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};
    let clock = TestClock::new();
    let dev = new_dev(93);
    let fs = mount(&dev, opts(&clock));
    let other = file_in_root(&fs, b"other");
    fs.sync().unwrap();
    let j = Arc::clone(fs.journal());
    let mut held = hold_all_log_space(&j);
    std::thread::scope(|s| {
        let creator = s.spawn(|| fs.mknod(U, ROOT_INO, b"new", items::inode::S_IFREG | 0o644, 0));
        let started = Instant::now();
        wait_for_a_log_space_wait(
            &fs,
            &j,
            started,
            &mut held,
            || creator.is_finished(),
            "create",
        );
        let (tx, rx) = mpsc::channel();
        let fs2 = &fs;
        s.spawn(move || {
            let r = (
                fs2.getattr(other).map(|a| a.ino),
                fs2.lookup(ROOT_INO, b"other").map(|a| a.ino),
            );
            let _ = tx.send(r);
        });
        let got = rx.recv_timeout(Duration::from_secs(30));
        if got.is_err() {
            held.clear();
        }
        assert!(
            matches!(got, Ok((Ok(a), Ok(b))) if a == other && b == other),
            "getattr and lookup of another inode did not complete while the create waited: {got:?}"
        );
        assert!(!creator.is_finished(), "the create did not wait");
        drop(std::mem::take(&mut held));
        let made = creator.join().unwrap().unwrap();
        assert_eq!(fs.lookup(ROOT_INO, b"new").unwrap().ino, made.ino);
    });
    assert_eq!(names(&fs, ROOT_INO), [".", "..", "new", "other"]);
    assert_clean(&fs);
}

/// A device of `block_size` blocks whose log is `log_blocks` long, made and unmounted with
/// journal configuration `cfg`.
fn dev_with_log(block_size: u32, log_blocks: u64, cfg: &JournalConfig) -> Arc<SimDevice> {
    let blocks = (16 << 20) / u64::from(block_size);
    let dev = Arc::new(SimDevice::new(blocks * u64::from(block_size), 41));
    let l = Layout {
        block_size,
        data_blocks: blocks,
        log_blocks,
        ..layout()
    };
    write_filesystem(&*dev, None, &l, &mut |_, _| {}).unwrap();
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, *cfg).unwrap();
    mkfs::format(&j, 0, 0).unwrap();
    j.unmount().unwrap();
    dev
}

fn mount_with(dev: &Arc<SimDevice>, cfg: &JournalConfig) -> Arc<Fs> {
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, *cfg).unwrap();
    Fs::open(j, FsOptions::default()).unwrap()
}

/// A transaction that logs more buffers than it reserved at begin (`TX_MAX_BUFFERS`; here
/// 100 blocks of one extent, each cancelled as a freed remote value's are) reserves the rest
/// before it reaches the CIL: the log's space accounting never runs behind what it holds
/// (before, a debug build stopped at "logged more than it reserved", and a release build
/// went on with the tail unguarded). It commits, every byte it reserved is given back, and a
/// crash after it recovers to a clean filesystem.
#[test]
fn a_transaction_logging_past_its_reservation_reserves_the_rest_before_it_commits() {
    let dev = new_dev(41);
    let fs = mount(&dev, FsOptions::default());
    let j = Arc::clone(fs.journal());
    let n = 100;
    assert!(n > crate::fs::txn::TX_MAX_BUFFERS);
    let seq = {
        let mut st = fs.write_state();
        let ((), seq) = fs
            .with_tx(&mut st, |t, _| {
                let (start, got) = t.alloc_extent(n, n)?.unwrap();
                assert_eq!(got, n);
                for b in start..start + got {
                    let r = t.tx.buf(b)?;
                    t.tx.cancel(r);
                }
                t.free_extent(start, got)?;
                assert!(t.tx.logged_buffers() as u64 > n);
                Ok(((), vec![]))
            })
            .unwrap();
        seq
    };
    j.force(seq).unwrap();
    assert_eq!(
        j.grant.read(|g| g.reserved),
        0,
        "reserved bytes left behind"
    );
    file_in_root(&fs, b"after");
    fs.sync().unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    let back = mount(&crashed, FsOptions::default());
    back.lookup(ROOT_INO, b"after").unwrap();
    assert_clean(&back);
}

/// mkfs refuses a log too small for the largest transaction on large blocks (an xattr value
/// of 64 KiB replaced), and on the smallest log it takes such a replace works, repeatedly.
#[test]
fn the_smallest_log_mkfs_takes_holds_the_largest_transaction() {
    use crate::mkfs::{min_log_bytes, LayoutError};
    let bs = 65536u32;
    let min = min_log_bytes(bs);
    assert!(min > 1 << 20, "{min}");
    assert!(matches!(
        Layout::new(64 << 20, u64::from(bs), Some(1 << 20), None),
        Err(LayoutError::LogTooSmall { .. })
    ));
    assert_eq!(
        min_log_bytes(4096),
        1 << 20,
        "4 KiB blocks keep the 1 MiB minimum"
    );
    let l = Layout::new(64 << 20, u64::from(bs), Some(min), None).unwrap();
    let cfg = JournalConfig {
        log: LogConfig {
            logbufs: 2,
            logbsize: 256 * 1024,
            policy: FlushPolicy::Reduced,
        },
        cil_limit: None,
        ..jcfg()
    };
    let dev = Arc::new(SimDevice::new(64 << 20, 42));
    write_filesystem(&*dev, None, &l, &mut |_, _| {}).unwrap();
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    mkfs::format(&j, 0, 0).unwrap();
    j.unmount().unwrap();
    let fs = mount_with(&dev, &cfg);
    let f = file_in_root(&fs, b"f");
    for r in 0..6u8 {
        let v: Vec<u8> = (0..65536u32).map(|i| (i as u8) ^ r).collect();
        fs.setxattr(f, b"user.big", &v, XattrFlags::default())
            .unwrap();
        file_in_root(&fs, format!("g{r}").as_bytes());
        assert_eq!(fs.getxattr(f, b"user.big").unwrap(), v);
    }
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert_clean(&fs);
}

/// On a log too small for a value's blocks (128 KiB, whose largest reservation holds a dozen
/// 2 KiB blocks), setxattr refuses the value with E2BIG before it logs anything; smaller
/// values and everything else go on working.
#[test]
fn an_xattr_value_no_reservation_of_the_log_could_hold_is_refused() {
    let cfg = JournalConfig {
        log: LogConfig {
            logbufs: 2,
            logbsize: 16 * 1024,
            policy: FlushPolicy::Reduced,
        },
        cil_limit: Some(16 * 1024),
        ..jcfg()
    };
    let dev = dev_with_log(2048, 64, &cfg);
    let fs = mount_with(&dev, &cfg);
    let f = file_in_root(&fs, b"f");
    let flags = XattrFlags::default();
    assert!(matches!(
        fs.setxattr(f, b"user.big", &[7u8; 20_000], flags),
        Err(FsError::AttrTooBig)
    ));
    fs.setxattr(f, b"user.small", &[8u8; 100], flags).unwrap();
    assert_eq!(fs.getxattr(f, b"user.small").unwrap(), vec![8u8; 100]);
    assert!(matches!(fs.getxattr(f, b"user.big"), Err(FsError::NoAttr)));
    file_in_root(&fs, b"g");
    assert_clean(&fs);
}
