#![allow(clippy::unwrap_used)]

use super::tree::{keys, node};
use super::tx::Trees;
use super::types::{Cred, RenameFlags, SetAttr};
use super::xattr::XattrFlags;
use super::*;
use crate::format::superblock::SbLog;
use crate::journal::{JournalConfig, PushMode};
use crate::log::{FlushPolicy, LogConfig};
use crate::mkfs::{write_filesystem, Layout};
use cilfs_device::{CrashOptions, Device, SimDevice};
use std::sync::atomic::{AtomicI64, Ordering};

pub(crate) const BS: u32 = 2048;
pub(crate) const BLOCKS: u64 = 8192; // 16 MiB

pub(crate) fn layout() -> Layout {
    Layout {
        uuid: [0x22; 16],
        block_size: BS,
        data_blocks: BLOCKS,
        log: SbLog::Internal { start: 1 },
        log_blocks: 512, // 1 MiB
        backups: false,
    }
}

pub(crate) fn jcfg() -> JournalConfig {
    JournalConfig {
        log: LogConfig {
            logbufs: 2,
            logbsize: 32 * 1024,
            policy: FlushPolicy::Reduced,
        },
        cil_limit: Some(64 * 1024),
        push_mode: PushMode::Inline,
        cache_bytes_max: Some(1 << 20),
        log_force_interval: None,
        cil_sharding: Default::default(),
    }
}

/// A clock tests move by hand: time stands still unless a test advances it.
#[derive(Clone)]
pub(crate) struct TestClock(Arc<AtomicI64>);

impl TestClock {
    pub fn new() -> Self {
        TestClock(Arc::new(AtomicI64::new(1_000_000_000_000)))
    }
    pub fn advance_ms(&self, ms: i64) {
        self.0.fetch_add(ms * 1_000_000, Ordering::Relaxed);
    }
    pub fn clock(&self) -> Clock {
        let c = self.0.clone();
        Arc::new(move || {
            let ns = c.load(Ordering::Relaxed);
            Timespec {
                sec: ns / 1_000_000_000,
                nsec: (ns % 1_000_000_000) as u32,
            }
        })
    }
}

pub(crate) fn new_dev(seed: u64) -> Arc<SimDevice> {
    let dev = Arc::new(SimDevice::new(BLOCKS * u64::from(BS), seed));
    write_filesystem(&*dev, None, &layout(), &mut |_, _| {}).unwrap();
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    mkfs::format(&j, 0, 0).unwrap();
    j.unmount().unwrap();
    dev
}

pub(crate) fn mount(dev: &Arc<SimDevice>, opts: FsOptions) -> Arc<Fs> {
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    Fs::open(j, opts).unwrap()
}

/// The checker finds nothing wrong, live and after a clean unmount.
pub(crate) fn assert_clean(fs: &Fs) {
    let r = check::check(fs).unwrap();
    assert!(r.is_clean(), "check found: {:#?}", r.problems);
}

fn opts(clock: &TestClock) -> FsOptions {
    FsOptions {
        clock: clock.clock(),
        ..FsOptions::default()
    }
}

const U: Cred = Cred::user(1000, 1000);

/// A regular file `name` made by `U` in the root directory: its inode number.
fn file_in_root(fs: &Fs, name: &[u8]) -> u64 {
    fs.mknod(U, ROOT_INO, name, inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino
}

fn names(fs: &Fs, dir: u64) -> Vec<String> {
    let mut out: Vec<String> = fs
        .readdir(dir, 0, 10_000)
        .unwrap()
        .into_iter()
        .map(|(e, _)| String::from_utf8(e.name).unwrap())
        .collect();
    out.sort();
    out
}

#[test]
fn namespace_operations_and_errors() {
    let clock = TestClock::new();
    let dev = new_dev(1);
    let fs = mount(&dev, opts(&clock));
    let root = fs.getattr(ROOT_INO).unwrap();
    assert_eq!(root.kind, FileType::Directory);
    assert_eq!(root.nlink, 2);
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap();
    assert_eq!((d.uid, d.gid, d.nlink), (1000, 1000, 2));
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
    let f = fs.mknod(U, d.ino, b"f", inode::S_IFREG | 0o644, 0).unwrap();
    assert!(matches!(
        fs.mknod(U, d.ino, b"f", inode::S_IFREG | 0o644, 0),
        Err(FsError::Exists)
    ));
    assert!(matches!(fs.lookup(d.ino, b"nope"), Err(FsError::NotFound)));
    assert!(matches!(fs.lookup(f.ino, b"x"), Err(FsError::NotDir)));
    assert!(matches!(
        fs.mkdir(U, ROOT_INO, &[b'a'; 256], 0o755),
        Err(FsError::NameTooLong)
    ));
    assert!(fs.mkdir(U, ROOT_INO, &[b'a'; 255], 0o755).is_ok());
    assert_eq!(fs.lookup(d.ino, b"f").unwrap().ino, f.ino);
    assert_eq!(fs.lookup(d.ino, b"..").unwrap().ino, ROOT_INO);
    assert_eq!(names(&fs, d.ino), vec![".", "..", "f"]);
    assert!(matches!(fs.rmdir(ROOT_INO, b"d"), Err(FsError::NotEmpty)));
    assert!(matches!(fs.unlink(ROOT_INO, b"d"), Err(FsError::IsDir)));
    assert!(matches!(fs.rmdir(d.ino, b"f"), Err(FsError::NotDir)));
    // Hard links and symlinks.
    let l = fs.link(f.ino, ROOT_INO, b"hard").unwrap();
    assert_eq!(l.nlink, 2);
    assert!(matches!(
        fs.link(d.ino, ROOT_INO, b"dirlink"),
        Err(FsError::NotPermitted)
    ));
    let s = fs.symlink(U, ROOT_INO, b"sym", b"d/f").unwrap();
    assert_eq!(fs.readlink(s.ino).unwrap(), b"d/f");
    let long = vec![b'x'; 4095];
    let s2 = fs.symlink(U, ROOT_INO, b"long", &long).unwrap();
    assert_eq!(fs.readlink(s2.ino).unwrap(), long);
    // Special files.
    let fifo = fs
        .mknod(U, ROOT_INO, b"fifo", inode::S_IFIFO | 0o600, 0)
        .unwrap();
    assert_eq!(fifo.kind, FileType::Fifo);
    let cdev = fs
        .mknod(
            Cred::ROOT,
            ROOT_INO,
            b"null",
            inode::S_IFCHR | 0o666,
            0x0103,
        )
        .unwrap();
    assert_eq!((cdev.kind, cdev.rdev), (FileType::CharDevice, 0x0103));
    // Rename: plain, over a file, noreplace, exchange, dir into itself.
    fs.rename(d.ino, b"f", ROOT_INO, b"g", RenameFlags::default())
        .unwrap();
    assert!(matches!(fs.lookup(d.ino, b"f"), Err(FsError::NotFound)));
    assert_eq!(fs.lookup(ROOT_INO, b"g").unwrap().ino, f.ino);
    let nr = RenameFlags {
        noreplace: true,
        exchange: false,
    };
    assert!(matches!(
        fs.rename(ROOT_INO, b"g", ROOT_INO, b"hard", nr),
        Err(FsError::Exists)
    ));
    let ex = RenameFlags {
        noreplace: false,
        exchange: true,
    };
    fs.rename(ROOT_INO, b"sym", ROOT_INO, b"fifo", ex).unwrap();
    assert_eq!(fs.lookup(ROOT_INO, b"sym").unwrap().ino, fifo.ino);
    assert_eq!(fs.lookup(ROOT_INO, b"fifo").unwrap().ino, s.ino);
    let sub = fs.mkdir(U, d.ino, b"sub", 0o755).unwrap();
    assert!(matches!(
        fs.rename(ROOT_INO, b"d", sub.ino, b"loop", RenameFlags::default()),
        Err(FsError::Invalid(_))
    ));
    fs.rename(d.ino, b"sub", ROOT_INO, b"sub2", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(fs.lookup(sub.ino, b"..").unwrap().ino, ROOT_INO);
    // Replacing a file drops its link.
    fs.rename(ROOT_INO, b"hard", ROOT_INO, b"sym", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 2);
    assert!(
        matches!(fs.getattr(fifo.ino), Err(FsError::NotFound)),
        "the replaced fifo is freed"
    );
    fs.unlink(ROOT_INO, b"g").unwrap();
    fs.unlink(ROOT_INO, b"sym").unwrap();
    assert!(matches!(fs.getattr(f.ino), Err(FsError::NotFound)));
    fs.rmdir(ROOT_INO, b"sub2").unwrap();
    fs.rmdir(ROOT_INO, b"d").unwrap();
    assert_eq!(
        fs.getattr(ROOT_INO).unwrap().nlink,
        3,
        "root, its '.', and the 255-byte dir"
    );
    // Everything survives a clean remount.
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    let mut want = vec![".", "..", "fifo", "long", "null"];
    let longname = String::from_utf8(vec![b'a'; 255]).unwrap();
    want.push(&longname);
    want.sort();
    assert_eq!(names(&fs, ROOT_INO), want);
    assert_eq!(
        fs.readlink(fs.lookup(ROOT_INO, b"fifo").unwrap().ino)
            .unwrap(),
        b"d/f"
    );
    assert_clean(&fs);
}

#[test]
fn file_data_sparse_truncate_fallocate_seek() {
    let clock = TestClock::new();
    let dev = new_dev(2);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    let free0 = fs.statfs().bfree;
    assert_eq!(fs.write(U, f, 0, b"hello").unwrap(), 5);
    assert_eq!(fs.read(f, 0, 100).unwrap(), b"hello");
    // A write far out leaves a hole that reads as zeros.
    fs.write(U, f, 100_000, b"end").unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!(a.size, 100_003);
    assert_eq!(
        a.blocks_512,
        2 * u64::from(BS / 512),
        "two blocks allocated (small files get no preallocation), the rest sparse"
    );
    let mid = fs.read(f, 5, 99_995).unwrap();
    assert!(mid.iter().all(|&b| b == 0));
    assert_eq!(fs.read(f, 99_998, 10).unwrap(), b"\0\0end");
    assert_eq!(fs.seek(f, 0, true).unwrap(), 0);
    assert_eq!(fs.seek(f, 0, false).unwrap(), u64::from(BS));
    assert_eq!(
        fs.seek(f, 20_000, true).unwrap(),
        100_000 / u64::from(BS) * u64::from(BS)
    );
    assert!(matches!(fs.seek(f, 200_000, true), Err(FsError::NoData)));
    // Unaligned overwrite across blocks.
    let big: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    fs.write(U, f, 1000, &big).unwrap();
    let back = fs.read(f, 0, 12_000).unwrap();
    assert_eq!(&back[..5], b"hello");
    assert_eq!(&back[1000..11_000], &big[..]);
    // Truncate down frees, truncate up reads zeros past the old end.
    fs.setattr(
        U,
        f,
        SetAttr {
            size: Some(1500),
            ..Default::default()
        },
    )
    .unwrap();
    fs.setattr(
        U,
        f,
        SetAttr {
            size: Some(6000),
            ..Default::default()
        },
    )
    .unwrap();
    let back = fs.read(f, 0, 10_000).unwrap();
    assert_eq!(back.len(), 6000);
    assert_eq!(&back[1000..1500], &big[..500]);
    assert!(
        back[1500..].iter().all(|&b| b == 0),
        "no stale bytes after truncate up"
    );
    // fallocate and punch hole.
    fs.fallocate(U, f, 0, 20_000, false, false).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 20_000);
    fs.write(U, f, 0, &vec![7u8; 20_000]).unwrap();
    fs.fallocate(U, f, 3000, 8000, true, true).unwrap();
    let back = fs.read(f, 0, 20_000).unwrap();
    assert!(back[..3000].iter().all(|&b| b == 7));
    let nz: Vec<usize> = (3000..11_000).filter(|&i| back[i] != 0).collect();
    assert!(
        nz.is_empty(),
        "non-zero at {:?}..{:?} ({} bytes)",
        nz.first(),
        nz.last(),
        nz.len()
    );
    assert!(back[11_000..].iter().all(|&b| b == 7));
    assert_eq!(fs.getattr(f).unwrap().size, 20_000);
    // Punching holes into a sparse file allocates nothing, edges included.
    let sp = file_in_root(&fs, b"sparse");
    fs.setattr(
        U,
        sp,
        SetAttr {
            size: Some(100_000),
            ..SetAttr::default()
        },
    )
    .unwrap();
    fs.fallocate(U, sp, 5000, 50_000, true, true).unwrap();
    fs.fallocate(U, sp, 0, 5000, true, true).unwrap();
    fs.fallocate(U, sp, 99_990, 5, true, true).unwrap();
    assert_eq!(fs.getattr(sp).unwrap().blocks_512, 0, "blocks for a hole");
    assert_eq!(fs.read(sp, 0, 100).unwrap(), vec![0u8; 100]);
    // Unlinking gives every block back (after the freeing checkpoint is stable).
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.statfs().bfree, free0);
    assert_clean(&fs);
}

#[test]
fn xattrs_and_the_change_xattr() {
    let clock = TestClock::new();
    let dev = new_dev(3);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.setxattr(f, b"user.a", b"1", XattrFlags::default())
        .unwrap();
    fs.setxattr(f, b"user.b", &[9u8; 300], XattrFlags::default())
        .unwrap();
    // Names outside Linux's namespaces are refused as ext4 and XFS refuse them.
    for (name, unsupported) in [
        (&b"bogus.a"[..], true),
        (b"userx", true),
        (b"system.foo", true),
        (b"user.", false),
    ] {
        let r = fs.setxattr(f, name, b"1", XattrFlags::default());
        let g = fs.getxattr(f, name);
        for r in [r.map(|_| ()), g.map(|_| ())] {
            match r {
                Err(FsError::NotSupported(_)) if unsupported => {}
                Err(FsError::Invalid(_)) if !unsupported => {}
                other => panic!("{}: {other:?}", String::from_utf8_lossy(name)),
            }
        }
    }
    for name in [&b"trusted.t"[..], b"security.s"] {
        fs.setxattr(f, name, b"1", XattrFlags::default()).unwrap();
        assert_eq!(fs.getxattr(f, name).unwrap(), b"1");
        fs.removexattr(f, name).unwrap();
    }
    assert!(matches!(
        fs.setxattr(
            f,
            b"user.a",
            b"2",
            XattrFlags {
                create: true,
                replace: false
            }
        ),
        Err(FsError::Exists)
    ));
    assert!(matches!(
        fs.setxattr(
            f,
            b"user.c",
            b"2",
            XattrFlags {
                create: false,
                replace: true
            }
        ),
        Err(FsError::NoAttr)
    ));
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"1");
    let mut l = fs.listxattr(f).unwrap();
    l.sort();
    assert_eq!(
        l,
        vec![b"user.a".to_vec(), b"user.b".to_vec()],
        "the change xattr is not listed"
    );
    let c: u64 = String::from_utf8(fs.getxattr(f, xattr::CHANGE_XATTR).unwrap())
        .unwrap()
        .parse()
        .unwrap();
    assert!(matches!(
        fs.setxattr(f, xattr::CHANGE_XATTR, b"1", XattrFlags::default()),
        Err(FsError::NotPermitted)
    ));
    fs.removexattr(f, b"user.a").unwrap();
    assert!(matches!(fs.getxattr(f, b"user.a"), Err(FsError::NoAttr)));
    let c2: u64 = String::from_utf8(fs.getxattr(f, xattr::CHANGE_XATTR).unwrap())
        .unwrap()
        .parse()
        .unwrap();
    assert!(c2 > c);
    assert_clean(&fs);
}

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

#[test]
fn fsynced_file_survives_crash_and_orphans_are_reclaimed() {
    for seed in 0..8 {
        let clock = TestClock::new();
        let dev = new_dev(10 + seed);
        let fs = mount(&dev, opts(&clock));
        let f = file_in_root(&fs, b"kept");
        fs.write(U, f, 0, &vec![0xAB; 10_000]).unwrap();
        fs.fsync(f).unwrap();
        fs.sync().unwrap();
        let free_before = fs.statfs().bfree;
        // An open file, unlinked, with data: an orphan until release, or until the next mount.
        let o = file_in_root(&fs, b"orphan");
        fs.open_inode(o).unwrap();
        fs.write(U, o, 0, &vec![1u8; 50_000]).unwrap();
        fs.unlink(ROOT_INO, b"orphan").unwrap();
        assert_eq!(
            fs.read(o, 0, 10).unwrap(),
            vec![1u8; 10],
            "still readable while open"
        );
        fs.sync().unwrap();
        let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
        drop(fs);
        let fs = mount(&crashed, opts(&clock));
        assert_eq!(
            fs.read(f, 0, 20_000).unwrap(),
            vec![0xAB; 10_000],
            "seed {seed}"
        );
        assert!(
            matches!(fs.getattr(o), Err(FsError::NotFound)),
            "orphan reclaimed at mount"
        );
        assert_eq!(fs.stats.snapshot().orphans_reclaimed, 1);
        fs.sync().unwrap();
        assert_eq!(fs.statfs().bfree, free_before, "its blocks are free again");
        assert_clean(&fs);
    }
}

#[test]
fn full_device_gives_enospc_and_unlink_still_works() {
    let clock = TestClock::new();
    let dev = new_dev(6);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"big");
    let chunk = vec![5u8; 1 << 20];
    let mut off = 0;
    // Fill with shrinking writes until not even one block fits.
    let mut size = chunk.len();
    loop {
        match fs.write(U, f, off, &chunk[..size]) {
            Ok(n) => off += n as u64,
            Err(FsError::NoSpace) if size > BS as usize => size /= 2,
            Err(e) => {
                assert!(matches!(e, FsError::NoSpace), "{e}");
                break;
            }
        }
        assert!(off < 64 << 20, "never ran out of space");
    }
    assert!(
        off > 12 << 20,
        "most of the 16 MiB device was usable: {off}"
    );
    // Creates (which need a few blocks for the tree) run out soon after.
    let mut created = 0;
    let err = loop {
        match fs.mknod(
            U,
            ROOT_INO,
            format!("more{created}").as_bytes(),
            inode::S_IFREG | 0o644,
            0,
        ) {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
        assert!(created < 5000, "creates never ran out of space");
    };
    assert!(matches!(err, FsError::NoSpace), "{err}");
    // Overwrites need no new space.
    fs.write(U, f, 0, b"still writable in place").unwrap();
    // What was written is intact; unlink works and gives the space back.
    assert_eq!(fs.read(f, off - 10, 10).unwrap(), vec![5u8; 10]);
    fs.unlink(ROOT_INO, b"big").unwrap();
    fs.sync().unwrap();
    let f2 = file_in_root(&fs, b"again");
    fs.write(U, f2, 0, &chunk).unwrap();
    assert_clean(&fs);
}

/// Damage made through raw transactions: the checker must name each kind.
#[test]
fn checker_finds_damage() {
    let clock = TestClock::new();
    let dev = new_dev(7);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[1u8; 5000]).unwrap();
    assert_clean(&fs);
    let damage = |what: &dyn Fn(&mut tx::FsTx<'_>)| {
        let mut st = fs.state.write();
        let mut t = fs.begin(&st).unwrap();
        what(&mut t);
        fs.commit(&mut st, t).unwrap();
    };
    // A wrong link count.
    damage(&|t| {
        let k = keys::key(f, keys::KIND_INODE, 0);
        let mut i = Inode::decode(f, &t.get(header::TREE_FS, k).unwrap().unwrap(), 0).unwrap();
        i.nlink = 3;
        t.insert(header::TREE_FS, k, &i.encode()).unwrap();
    });
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("link count 3 but 1 names")),
        "{:?}",
        r.problems
    );
    // A file block also marked free.
    let ext = {
        let st = fs.state.read();
        let mut v = fs.view(&st);
        extent::extents_in(&mut v, f, 0, 1).unwrap()[0]
    };
    damage(&|t| {
        t.insert(header::TREE_FREE_BY_BLOCK, node::Key::new(ext.disk, 1), &[])
            .unwrap();
        t.insert(header::TREE_FREE_BY_SIZE, node::Key::new(1, ext.disk), &[])
            .unwrap();
        t.hdr.free_blocks += 1;
    });
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems.iter().any(|p| p.contains("owned twice")),
        "{:?}",
        r.problems
    );
    // A name pointing nowhere.
    damage(&|t| {
        ops::dir_add(
            t,
            ROOT_INO,
            &DirEntry {
                ino: 999_999,
                kind: FileType::Regular,
                name: b"ghost".to_vec(),
            },
        )
        .unwrap();
    });
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("which does not exist")),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("size 1 but 2 entries")),
        "{:?}",
        r.problems
    );
}

/// The checker reads every item key and every xattr value block: an inode item off offset 0
/// (one flipped bit; lookups can no longer find it), a malformed orphan item, a value block
/// stamped as if it were a tree node, and bytes past a value's end are all reported.
#[test]
fn checker_rejects_misplaced_inode_items_and_damaged_xattr_values() {
    let clock = TestClock::new();
    let dev = new_dev(8);
    let fs = mount(&dev, opts(&clock));
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let f = file_in_root(&fs, b"f");
    let value = vec![0x6b; 2 * BS as usize + 100];
    fs.setxattr(f, b"user.big", &value, XattrFlags::default())
        .unwrap();
    assert_clean(&fs);
    let damage = |what: &dyn Fn(&mut tx::FsTx<'_>)| {
        let mut st = fs.state.write();
        let mut t = fs.begin(&st).unwrap();
        what(&mut t);
        fs.commit(&mut st, t).unwrap();
    };
    let problems = || check::check(&fs).unwrap().problems;
    // Bit 31 of the inode item's offset flipped.
    damage(&|t| {
        let k = keys::key(d, keys::KIND_INODE, 0);
        let v = t.get(header::TREE_FS, k).unwrap().unwrap();
        t.remove(header::TREE_FS, k).unwrap();
        t.insert(
            header::TREE_FS,
            keys::key(d, keys::KIND_INODE, 0x8000_0000),
            &v,
        )
        .unwrap();
    });
    fs.state.write().inodes.shard_mut(d).remove(&d);
    assert!(matches!(fs.lookup(ROOT_INO, b"d"), Err(FsError::NotFound)));
    let p = problems();
    assert!(
        p.iter().any(|p| p.contains("offset 0x80000000, not 0")),
        "{p:?}"
    );
    // An orphan item for inode 0.
    damage(&|t| {
        t.insert(
            header::TREE_FS,
            keys::key(keys::ORPHAN_OWNER, keys::KIND_ORPHAN, 0),
            &[],
        )
        .unwrap();
    });
    let p = problems();
    assert!(
        p.iter().any(|p| p.contains("malformed orphan item")),
        "{p:?}"
    );
    // A value block stamped like a tree node, and bytes past the value's end.
    let blocks: Vec<u64> = blocks_of(&fs, check::Role::XattrValue);
    assert_eq!(blocks.len(), 3);
    let uuid = fs.journal().geometry().sb.uuid;
    damage(&|t| {
        let r = t.tx.buf(blocks[0]).unwrap();
        let mut b = t.tx.data(r).to_vec();
        crate::log::stamp::write_lsn_stamp(
            &mut b,
            node::NODE_LSN_OFFSET,
            crate::log::Lsn::from_raw(1 << 32),
            &uuid,
        );
        t.tx.write(r, 0, &b);
        let r = t.tx.buf(blocks[2]).unwrap();
        t.tx.write(r, BS as usize - 1, &[1]);
    });
    let p = problems();
    assert!(
        p.iter().any(|p| p.contains(&format!(
            "xattr value block {} carries a metadata LSN stamp",
            blocks[0]
        ))),
        "{p:?}"
    );
    assert!(
        p.iter().any(|p| p.contains(&format!(
            "xattr value block {} holds bytes past the value's end",
            blocks[2]
        ))),
        "{p:?}"
    );
}

/// The blocks the checker finds in `role`, even when it finds problems.
/// Files `f0`..`f{n-1}` in the root, each holding `data`; their inode numbers.
fn files_holding(fs: &Fs, n: usize, data: &[u8]) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let f = fs
                .mknod(
                    U,
                    ROOT_INO,
                    format!("f{i}").as_bytes(),
                    inode::S_IFREG | 0o644,
                    0,
                )
                .unwrap()
                .ino;
            fs.write(U, f, 0, data).unwrap();
            f
        })
        .collect()
}

fn blocks_of(fs: &Fs, role: check::Role) -> Vec<u64> {
    check::check(fs)
        .unwrap()
        .blocks
        .iter()
        .filter(|e| e.2 == role)
        .flat_map(|&(s, l, _)| s..s + l)
        .collect()
}

/// Allocates every free extent, owned by nothing: tests then give pieces back to shape the free
/// space, and `give_back` the rest before checking.
fn take_all_free_space(fs: &Fs) -> Vec<(u64, u64)> {
    let mut taken = Vec::new();
    let mut st = fs.state.write();
    fs.with_tx(&mut st, |t, _| {
        while let Some(e) = t.alloc_extent(u64::MAX >> 1, 1)? {
            taken.push(e);
        }
        Ok(((), vec![]))
    })
    .unwrap();
    taken
}

/// Index of the longest of `extents`.
fn longest(extents: &[(u64, u64)]) -> usize {
    (0..extents.len()).max_by_key(|&i| extents[i].1).unwrap()
}

fn give_back(fs: &Fs, taken: &[(u64, u64)]) {
    let mut st = fs.state.write();
    fs.with_tx(&mut st, |t, _| {
        for &(s, l) in taken {
            t.free_extent(s, l)?;
        }
        Ok(((), vec![]))
    })
    .unwrap();
}

/// A mount whose CIL holds a quarter of the log before a checkpoint, so that the frees of a
/// test's few hundred transactions stay busy until it forces the log.
fn mount_with_a_large_cil(dev: &Arc<SimDevice>, clock: &TestClock) -> Arc<Fs> {
    let cfg = JournalConfig {
        cil_limit: Some(256 * 1024),
        ..jcfg()
    };
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    Fs::open(j, opts(clock)).unwrap()
}

/// Unlinking many one-block files leaves as many one-block free extents, busy until the
/// checkpoint that freed them is stable. An allocation must still find the large free extent
/// beyond them: the by-size search looked at the 64 smallest candidates only, all busy, and
/// failed with ENOSPC on a device that was 80% free (and stayed so while no checkpoint came).
#[test]
fn allocation_looks_past_many_busy_small_extents() {
    let clock = TestClock::new();
    let dev = new_dev(61);
    let fs = mount_with_a_large_cil(&dev, &clock);
    let block = vec![3u8; BS as usize];
    let files = files_holding(&fs, 300, &block);
    fs.sync().unwrap();
    let checkpoints = || fs.journal().stats().log.checkpoints;
    let before = checkpoints();
    // Every other file: its block's neighbours stay allocated, so each free is an extent alone.
    for i in (0..300).step_by(2) {
        fs.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    assert_eq!(checkpoints(), before, "a checkpoint made the frees stable");
    let g = file_in_root(&fs, b"new");
    let other = vec![9u8; BS as usize];
    let first_write = dev.volatile_writes();
    fs.write(U, g, 0, &other).unwrap();
    let data_writes = first_write..dev.volatile_writes();
    assert!(
        !data_writes.is_empty(),
        "the new block was not written in place"
    );
    assert_eq!(fs.read(g, 0, BS).unwrap(), other);
    assert_eq!(fs.read(files[1], 0, BS).unwrap(), block);
    assert_clean(&fs);
    // A crash that keeps the new file's data write and loses everything else since the sync:
    // the unlinks are gone, so every file is back, and none may show the new file's bytes.
    let crashed = Arc::new(dev.crash_with(&mut |i, _| {
        if data_writes.contains(&i) {
            cilfs_device::Survival::Kept
        } else {
            cilfs_device::Survival::Lost
        }
    }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    for (i, &f) in files.iter().enumerate() {
        assert_eq!(fs.read(f, 0, BS).unwrap(), block, "file f{i}");
    }
    assert_clean(&fs);
}

/// The last, exhaustive search: the smallest extents and the largest are all busy, and only a
/// middle-sized one (neither among the first candidates nor the largest) is usable.
#[test]
fn allocation_reads_every_extent_before_enospc() {
    let clock = TestClock::new();
    let fs = mount_with_a_large_cil(&new_dev(62), &clock);
    // Take all free space, then give back pieces: a middle extent M first, made stable, then
    // 100 one-block extents and a large one L, left busy.
    let taken = take_all_free_space(&fs);
    let mut st = fs.state.write();
    let (start, len) = *taken.iter().max_by_key(|e| e.1).unwrap();
    assert!(len > 3000, "one large free extent after mkfs: {taken:?}");
    let (m, m_len) = (start + 2000, 600);
    let (l, l_len) = (start + 200, 1500);
    fs.with_tx(&mut st, |t, _| {
        t.free_extent(m, m_len).map(|()| ((), vec![]))
    })
    .unwrap();
    fs.journal().force_all().unwrap();
    fs.with_tx(&mut st, |t, _| {
        for k in 0..100 {
            t.free_extent(start + 2 * k, 1)?;
        }
        t.free_extent(l, l_len)?;
        Ok(((), vec![]))
    })
    .unwrap();
    let got = fs
        .with_tx(&mut st, |t, _| {
            let one = t.alloc_extent(1, 1)?;
            let four = t.alloc_extent(4, 4)?;
            Ok(((one, four), vec![]))
        })
        .unwrap()
        .0;
    let in_m = |e: Option<(u64, u64)>| e.is_some_and(|(s, n)| s >= m && s + n <= m + m_len);
    assert!(
        in_m(got.0) && in_m(got.1),
        "allocated {got:?} outside {m}+{m_len}"
    );
}

/// With every free block busy (freed by a checkpoint not yet stable) and none left otherwise,
/// operations that need a new tree node force the log before their transaction instead of
/// failing inside it: a failure there, after the transaction logged changes, shut the journal
/// down. Hundreds of renames with long names split the target directory's leaves many times.
#[test]
fn renames_with_only_busy_space_force_the_log_instead_of_shutting_down() {
    let clock = TestClock::new();
    let fs = mount_with_a_large_cil(&new_dev(63), &clock);
    let a = fs.mkdir(U, ROOT_INO, b"a", 0o755).unwrap().ino;
    let b = fs.mkdir(U, ROOT_INO, b"b", 0o755).unwrap().ino;
    let name = |i: usize| format!("{i:04}-{}", "n".repeat(200)).into_bytes();
    for i in 0..300 {
        fs.mknod(U, a, &name(i), inode::S_IFREG | 0o644, 0).unwrap();
    }
    fs.sync().unwrap();
    let mut taken = take_all_free_space(&fs);
    {
        let mut st = fs.state.write();
        let largest = longest(&taken);
        let (start, len) = taken[largest];
        assert!(len > 500, "{taken:?}");
        // Give some back: busy until a checkpoint is stable, the only free space there is.
        fs.with_tx(&mut st, |t, _| {
            t.free_extent(start, 500).map(|()| ((), vec![]))
        })
        .unwrap();
        taken[largest] = (start + 500, len - 500);
    }
    for i in 0..300 {
        fs.rename(a, &name(i), b, &name(i), RenameFlags::default())
            .unwrap_or_else(|e| panic!("rename {i}: {e}"));
    }
    assert_eq!(names(&fs, b).len(), 302, "300 names with . and ..");
    // The space taken above belongs to nothing: give it back before checking.
    give_back(&fs, &taken);
    assert_clean(&fs);
}

/// A large xattr value needs contiguous blocks, which the count-based space check does not
/// promise: with free space in single blocks and one large extent busy, setxattr forces the
/// log and tries again instead of failing with ENOSPC.
#[test]
fn a_large_xattr_forces_the_log_when_only_a_busy_extent_is_long_enough() {
    let clock = TestClock::new();
    let fs = mount_with_a_large_cil(&new_dev(64), &clock);
    let f = file_in_root(&fs, b"f");
    fs.sync().unwrap();
    let mut taken = take_all_free_space(&fs);
    {
        let mut st = fs.state.write();
        let largest = longest(&taken);
        let (start, len) = taken[largest];
        assert!(len > 2000, "{taken:?}");
        // 600 single blocks made stable, then a long extent left busy.
        fs.with_tx(&mut st, |t, _| {
            for k in 0..600 {
                t.free_extent(start + 2 * k, 1)?;
            }
            Ok(((), vec![]))
        })
        .unwrap();
        drop(st);
        fs.journal().force_all().unwrap();
        let mut st = fs.state.write();
        fs.with_tx(&mut st, |t, _| {
            t.free_extent(start + 1500, 100).map(|()| ((), vec![]))
        })
        .unwrap();
        // What stays taken: the odd blocks below 1200, and the rest around the long extent.
        taken[largest] = (start + 1600, len - 1600);
        for k in 0..600 {
            taken.push((start + 2 * k + 1, 1));
        }
        taken.push((start + 1200, 300));
    }
    let value = vec![0x5a; 3 * BS as usize];
    fs.setxattr(f, b"user.big", &value, XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getxattr(f, b"user.big").unwrap(), value);
    give_back(&fs, &taken);
    assert_clean(&fs);
}

/// df comes back after a delete without a sync (issue 24, item 5): the blocks of an unlinked
/// file stay busy until the checkpoint that freed them is stable, but statfs counts them as
/// free and available, as XFS does (they belong to no file). The promise holds: a file that
/// needs them gets them, by forcing the log before it allocates, never by reusing a block whose
/// free a crash could still undo.
#[test]
fn statfs_counts_an_unlinked_files_busy_blocks_as_free_and_writes_can_use_them() {
    let clock = TestClock::new();
    let dev = new_dev(65);
    let fs = mount_with_a_large_cil(&dev, &clock);
    fs.sync().unwrap();
    let before = fs.statfs();
    let within_1pct = |now: u64, then: u64| now.abs_diff(then) * 100 <= then;
    let chunk = vec![0x6b; 64 * 1024];
    let chunk_blocks = chunk.len() as u64 / u64::from(BS);
    let write_file = |name: &[u8], chunks: u64| {
        let f = fs
            .mknod(U, ROOT_INO, name, inode::S_IFREG | 0o644, 0)
            .unwrap()
            .ino;
        for i in 0..chunks {
            fs.write(U, f, i * chunk.len() as u64, &chunk)
                .unwrap_or_else(|e| panic!("chunk {i} of {chunks}: {e}"));
        }
        f
    };
    // 4 MiB, made stable: a quarter of the device.
    let big = write_file(b"big", 64);
    fs.fsync(big).unwrap();
    let big_blocks = 64 * chunk_blocks;
    assert!(fs.statfs().bavail + big_blocks <= before.bavail);
    let checkpoints = || fs.journal().stats().log.checkpoints;
    let at_unlink = checkpoints();
    fs.unlink(ROOT_INO, b"big").unwrap();
    assert_eq!(
        checkpoints(),
        at_unlink,
        "a checkpoint made the frees stable"
    );
    let busy = fs.stats().busy_blocks;
    assert!(busy >= big_blocks, "only {busy} blocks busy");
    let after = fs.statfs();
    assert!(
        within_1pct(after.bfree, before.bfree) && within_1pct(after.bavail, before.bavail),
        "before the file {before:?}, after its unlink {after:?} with {busy} blocks busy"
    );
    // A file of nearly everything statfs calls available: more than is free outside the busy
    // extents, so its writes must force the log to get them.
    let chunks = after.bavail * 98 / 100 / chunk_blocks;
    assert!(chunks * chunk_blocks > after.bavail - busy);
    let next = write_file(b"next", chunks);
    assert!(
        checkpoints() > at_unlink,
        "the busy blocks were used unforced"
    );
    assert_eq!(fs.stats().busy_blocks, 0);
    let last = (chunks - 1) * chunk.len() as u64;
    assert_eq!(fs.read(next, last, chunk.len() as u32).unwrap(), chunk);
    assert_clean(&fs);
    // A crash now: the unlink was stable before any of its blocks was reused, so it stays done,
    // and no block belongs to both files.
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert!(matches!(
        fs.lookup(ROOT_INO, b"big"),
        Err(FsError::NotFound)
    ));
    assert_clean(&fs);
}

/// The blocks the checker finds in `role`.
pub(crate) fn blocks_with_role(fs: &Fs, role: check::Role) -> std::collections::HashSet<u64> {
    assert_clean(fs);
    blocks_of(fs, role).into_iter().collect()
}

/// Tree nodes freed by many unlinks are reused for large xattr values: the values must come back
/// byte for byte, never stamped with an LSN (a stamp offset left on the freed node's buffer made
/// write-back and replay overwrite bytes 16..43 of every value block).
fn xattr_values_in_reused_node_blocks(crash: bool) {
    let clock = TestClock::new();
    let dev = new_dev(if crash { 71 } else { 70 });
    let fs = mount(&dev, opts(&clock));
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let long = |i: usize| format!("{i:0>200}").into_bytes();
    for i in 0..1500 {
        fs.mknod(U, d, &long(i), inode::S_IFREG | 0o644, 0).unwrap();
    }
    fs.sync().unwrap();
    let nodes_before = blocks_with_role(&fs, check::Role::TreeNode);
    for i in 0..1500 {
        fs.unlink(d, &long(i)).unwrap();
    }
    fs.sync().unwrap();
    let f = file_in_root(&fs, b"f");
    let mut rng = 0x1234_5678_9abc_def0u64 ^ u64::from(crash);
    let mut values = Vec::new();
    for i in 0..20 {
        let v: Vec<u8> = (0..5000)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        let name = format!("user.x{i}").into_bytes();
        fs.setxattr(f, &name, &v, XattrFlags::default()).unwrap();
        values.push((name, v));
    }
    fs.fsync(f).unwrap();
    let reused = blocks_with_role(&fs, check::Role::XattrValue)
        .intersection(&nodes_before)
        .count();
    assert!(reused > 0, "no value landed in a freed tree node");
    for (n, v) in &values {
        assert_eq!(&fs.getxattr(f, n).unwrap(), v, "before remount");
    }
    let dev = if crash {
        let c = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
        drop(fs);
        c
    } else {
        fs.unmount().unwrap();
        drop(fs);
        dev
    };
    let fs = mount(&dev, opts(&clock));
    for (n, v) in &values {
        assert!(
            &fs.getxattr(f, n).unwrap() == v,
            "{} differs after remount ({reused} values in reused blocks)",
            String::from_utf8_lossy(n)
        );
    }
    assert_clean(&fs);
}

#[test]
fn xattr_values_in_reused_node_blocks_survive_a_clean_unmount() {
    xattr_values_in_reused_node_blocks(false);
}

#[test]
fn xattr_values_in_reused_node_blocks_survive_a_crash() {
    xattr_values_in_reused_node_blocks(true);
}

/// An ACL xattr value from (tag, perm, id) entries.
pub(crate) fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(t, p, i) in entries {
        v.extend_from_slice(&t.to_le_bytes());
        v.extend_from_slice(&p.to_le_bytes());
        v.extend_from_slice(&i.to_le_bytes());
    }
    v
}

fn acl_of(fs: &Fs, ino: u64, name: &[u8]) -> Option<acl::Acl> {
    match fs.getxattr(ino, name) {
        Ok(v) => acl::Acl::parse(&v).unwrap(),
        Err(FsError::NoAttr) => None,
        Err(e) => panic!("{e}"),
    }
}

const NOBODY: u32 = 65534;
const X: u32 = u32::MAX;

/// ACLs: validated before they are stored, kept in step with the mode both ways (chmod
/// rewrites the mask, an access ACL sets the group bits), a minimal ACL folded into the mode,
/// inherited from a directory's default ACL instead of the umask, and kept across a remount
/// and a crash.
#[test]
fn acls_are_validated_kept_in_step_with_the_mode_and_inherited() {
    use acl::{ACCESS, DEFAULT, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    let clock = TestClock::new();
    let dev = new_dev(90);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    let deny = acl_value(&[
        (USER_OBJ, 6, X),
        (USER, 0, NOBODY),
        (GROUP_OBJ, 4, X),
        (MASK, 4, X),
        (OTHER, 4, X),
    ]);
    fs.setxattr(f, ACCESS, &deny, XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getxattr(f, ACCESS).unwrap(), deny);
    assert_eq!(fs.getattr(f).unwrap().perm, 0o644);
    // chmod rewrites the mask (not the owning group's entry).
    let chmod = |mode: u32| {
        fs.setattr(
            U,
            f,
            SetAttr {
                mode: Some(mode),
                ..Default::default()
            },
        )
        .unwrap()
    };
    chmod(0o600);
    let a = acl_of(&fs, f, ACCESS).unwrap();
    assert_eq!(a.mode_bits(), 0o600);
    assert!(a.entries().contains(&acl::Entry {
        tag: GROUP_OBJ,
        perm: 4,
        id: X
    }));
    // An ACL with a wider mask widens the group bits.
    let grant = acl_value(&[
        (USER_OBJ, 6, X),
        (USER, 4, NOBODY),
        (GROUP_OBJ, 0, X),
        (MASK, 6, X),
        (OTHER, 0, X),
    ]);
    fs.setxattr(f, ACCESS, &grant, XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o660);
    // A minimal ACL is the mode: nothing is stored.
    let minimal = acl_value(&[(USER_OBJ, 7, X), (GROUP_OBJ, 5, X), (OTHER, 0, X)]);
    fs.setxattr(f, ACCESS, &minimal, XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o750);
    assert!(acl_of(&fs, f, ACCESS).is_none());
    // Malformed ACLs are refused and change nothing.
    for bad in [
        acl_value(&[
            (USER_OBJ, 6, X),
            (USER, 4, 7),
            (GROUP_OBJ, 4, X),
            (OTHER, 4, X),
        ]),
        acl_value(&[(USER_OBJ, 9, X), (GROUP_OBJ, 4, X), (OTHER, 4, X)]),
        vec![2, 0, 0, 0, 1],
    ] {
        assert!(matches!(
            fs.setxattr(f, ACCESS, &bad, XattrFlags::default()),
            Err(FsError::Invalid(_))
        ));
    }
    assert_eq!(fs.getattr(f).unwrap().perm, 0o750);
    // A default ACL belongs to directories.
    assert!(matches!(
        fs.setxattr(f, DEFAULT, &deny, XattrFlags::default()),
        Err(FsError::Access)
    ));
    // Inheritance: the default ACL replaces the umask.
    let umask = Cred { umask: 0o022, ..U };
    let d = fs.mkdir(umask, ROOT_INO, b"d", 0o777).unwrap();
    assert_eq!(d.perm, 0o755, "no default ACL: the umask applies");
    let def = acl_value(&[
        (USER_OBJ, 7, X),
        (USER, 7, NOBODY),
        (GROUP_OBJ, 5, X),
        (MASK, 7, X),
        (OTHER, 5, X),
    ]);
    fs.setxattr(d.ino, DEFAULT, &def, XattrFlags::default())
        .unwrap();
    let x = fs
        .mknod(umask, d.ino, b"x", inode::S_IFREG | 0o666, 0)
        .unwrap();
    assert_eq!(x.perm, 0o664);
    let xa = acl_of(&fs, x.ino, ACCESS).unwrap();
    assert_eq!(xa.mode_bits(), 0o664);
    assert!(acl_of(&fs, x.ino, DEFAULT).is_none());
    let y = fs.mkdir(umask, d.ino, b"y", 0o777).unwrap();
    assert_eq!(y.perm, 0o775);
    assert_eq!(fs.getxattr(y.ino, DEFAULT).unwrap(), def);
    let s = fs.symlink(umask, d.ino, b"s", b"x").unwrap();
    assert!(acl_of(&fs, s.ino, ACCESS).is_none(), "symlinks get no ACL");
    assert_clean(&fs);
    // Kept across a clean remount and a crash after fsync.
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(acl_of(&fs, x.ino, ACCESS).unwrap(), xa);
    fs.setxattr(f, ACCESS, &deny, XattrFlags::default())
        .unwrap();
    fs.fsync(f).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert_eq!(fs.getxattr(f, ACCESS).unwrap(), deny);
    assert_eq!(fs.getxattr(y.ino, DEFAULT).unwrap(), def);
    assert_clean(&fs);
}

/// Setting an access ACL clears set-group-ID for a caller outside the file's group, as Linux
/// does; and with `noacl` the ACL names are refused.
#[test]
fn acl_set_by_an_outsider_clears_set_group_id_and_noacl_refuses_acls() {
    use acl::{ACCESS, GROUP_OBJ, OTHER, USER_OBJ};
    let clock = TestClock::new();
    let dev = new_dev(91);
    let fs = mount(&dev, opts(&clock));
    let f = fs
        .mknod(U, ROOT_INO, b"f", inode::S_IFREG | 0o2755, 0)
        .unwrap()
        .ino;
    let v = acl_value(&[(USER_OBJ, 7, X), (GROUP_OBJ, 5, X), (OTHER, 4, X)]);
    fs.set_xattr_as(U, f, ACCESS, Some(&v), XattrFlags::default())
        .unwrap();
    assert_eq!(
        fs.getattr(f).unwrap().perm,
        0o2754,
        "the owner is in the group"
    );
    let outsider = Cred::user(1000, 2000);
    fs.set_xattr_as(outsider, f, ACCESS, Some(&v), XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o754);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(
        &dev,
        FsOptions {
            acl: false,
            ..opts(&clock)
        },
    );
    assert!(matches!(
        fs.setxattr(f, ACCESS, &v, XattrFlags::default()),
        Err(FsError::NotSupported(_))
    ));
    assert!(matches!(
        fs.getxattr(f, ACCESS),
        Err(FsError::NotSupported(_))
    ));
}

/// The checker finds an access ACL that disagrees with the mode, and a default ACL on a file.
#[test]
fn checker_finds_acls_out_of_step() {
    use acl::{ACCESS, DEFAULT, GROUP_OBJ, OTHER, USER_OBJ};
    let clock = TestClock::new();
    let fs = mount(&new_dev(92), opts(&clock));
    let f = file_in_root(&fs, b"f");
    let v = acl_value(&[(USER_OBJ, 7, X), (GROUP_OBJ, 0, X), (OTHER, 0, X)]);
    let mut st = fs.state.write();
    fs.with_tx(&mut st, |t, _| {
        xattr::put(t, f, ACCESS, Some(&v), XattrFlags::default())?;
        xattr::put(t, f, DEFAULT, Some(&v), XattrFlags::default())?;
        Ok(((), vec![]))
    })
    .unwrap();
    drop(st);
    let p = check::check(&fs).unwrap().problems;
    assert!(
        p.iter()
            .any(|p| p.contains("mode 644 but its access ACL gives 700")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("default ACL on a non-directory")),
        "{p:?}"
    );
}

/// Permission bits of `ino`, set-user-ID, set-group-ID and sticky included.
fn perm(fs: &Fs, ino: u64) -> u32 {
    u32::from(fs.getattr(ino).unwrap().perm)
}

fn set_mode(fs: &Fs, ino: u64, mode: u32) {
    let sa = SetAttr {
        mode: Some(mode),
        ..SetAttr::default()
    };
    fs.setattr(Cred::ROOT, ino, sa).unwrap();
}

/// The inodes `FsOptions::attrs_changed` was told about, in order.
fn attrs_changed_log(o: &mut FsOptions) -> Arc<Mutex<Vec<u64>>> {
    let told = Arc::new(Mutex::new(Vec::new()));
    let t = Arc::clone(&told);
    o.attrs_changed = Some(Arc::new(move |ino| t.lock().push(ino)));
    told
}

#[test]
fn data_changes_clear_set_user_and_group_id_as_linux_does() {
    let clock = TestClock::new();
    let dev = new_dev(41);
    let mut o = opts(&clock);
    // Process 77 is also in group 500; every other process has no supplementary groups.
    o.groups_of = Some(Arc::new(|pid| if pid == 77 { vec![500] } else { vec![] }));
    let told = attrs_changed_log(&mut o);
    let fs = mount(&dev, o);
    let f = fs
        .mknod(Cred::ROOT, ROOT_INO, b"f", inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    fs.setattr(
        Cred::ROOT,
        f,
        SetAttr {
            gid: Some(500),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let size = |s| SetAttr {
        size: Some(s),
        ..SetAttr::default()
    };
    type Change<'a> = (&'a str, Box<dyn Fn(Cred) -> FsResult<()> + 'a>);
    let changes: Vec<Change> = vec![
        ("write", Box::new(|c| fs.write(c, f, 0, b"x").map(|_| ()))),
        (
            "truncate",
            Box::new(|c| fs.setattr(c, f, size(3000)).map(|_| ())),
        ),
        (
            "truncate to the same size",
            Box::new(|c| {
                let s = fs.getattr(f)?.size;
                fs.setattr(c, f, size(s)).map(|_| ())
            }),
        ),
        (
            "fallocate",
            Box::new(|c| fs.fallocate(c, f, 0, 8192, false, false)),
        ),
        (
            "fallocate keeping the size",
            Box::new(|c| fs.fallocate(c, f, 20_000, 4096, true, false)),
        ),
        (
            "punching whole blocks",
            Box::new(|c| fs.fallocate(c, f, 2048, 2048, true, true)),
        ),
        (
            "punching past the end",
            Box::new(|c| fs.fallocate(c, f, 1 << 20, 4096, true, true)),
        ),
    ];
    let outsider = U;
    let member_by_supplementary_group = Cred { pid: 77, ..U };
    let member_by_primary_group = Cred::user(1000, 500);
    for (what, change) in &changes {
        for (mode, who, left) in [
            (0o2666, outsider, 0o666),
            (0o2676, outsider, 0o676),
            (0o4666, outsider, 0o666),
            (0o6676, outsider, 0o676),
            (0o6666, member_by_supplementary_group, 0o2666),
            (0o2676, member_by_supplementary_group, 0o676),
            (0o2666, member_by_primary_group, 0o2666),
            (0o6676, Cred::ROOT, 0o6676),
        ] {
            set_mode(&fs, f, mode);
            told.lock().clear();
            change(who).unwrap();
            assert_eq!(
                format!("{:o}", perm(&fs, f)),
                format!("{left:o}"),
                "{what} by {who:?} of a {mode:o} file"
            );
            // Truncate answers with the new attributes; the others must say they changed.
            let want = match left != mode && !what.starts_with("truncate") {
                true => vec![f],
                false => vec![],
            };
            assert_eq!(*told.lock(), want, "{what} by {who:?} of a {mode:o} file");
        }
    }
    drop(changes);
    // A truncate by a caller without CAP_FSETID comes with the mode the kernel cleared
    // set-user-ID from (its older rule keeps set-group-ID without group execute).
    set_mode(&fs, f, 0o6666);
    let sa = SetAttr {
        size: Some(10),
        mode: Some(0o2666),
        ..SetAttr::default()
    };
    fs.setattr(U, f, sa).unwrap();
    assert_eq!(format!("{:o}", perm(&fs, f)), "666");
    // The cleared bits are logged: a crash right after an fsync keeps them cleared.
    set_mode(&fs, f, 0o6666);
    fs.write(U, f, 0, b"y").unwrap();
    fs.fsync(f).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert_eq!(perm(&fs, f), 0o666);
    assert_clean(&fs);
}

#[test]
fn chown_clears_set_user_and_group_id_as_linux_does() {
    let clock = TestClock::new();
    let dev = new_dev(42);
    let fs = mount(&dev, opts(&clock));
    let owner = |uid: Option<u32>, gid: Option<u32>| SetAttr {
        uid,
        gid,
        ..SetAttr::default()
    };
    let f = fs
        .mknod(Cred::ROOT, ROOT_INO, b"f", inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    let d = fs.mkdir(Cred::ROOT, ROOT_INO, b"d", 0o755).unwrap().ino;
    // (file owner, group, mode, caller, new owner, new group, mode left), as on ext4.
    for (uid, gid, mode, who, to_uid, to_gid, left) in [
        // Root too loses set-user-ID, and set-group-ID when group execute is set.
        (0, 0, 0o6755, Cred::ROOT, Some(1000), None, 0o755),
        (0, 0, 0o4644, Cred::ROOT, Some(0), None, 0o644),
        (0, 0, 0o2644, Cred::ROOT, Some(1000), None, 0o2644),
        (0, 0, 0o2644, Cred::ROOT, None, Some(1000), 0o2644),
        // An owner outside the file's group loses set-group-ID even without group execute.
        (1000, 0, 0o2644, U, Some(1000), None, 0o644),
        (1000, 0, 0o2644, U, None, Some(1000), 0o644),
        // An owner in the file's group keeps it.
        (1000, 1000, 0o2644, U, Some(1000), None, 0o2644),
        (1000, 1000, 0o6644, U, None, Some(1000), 0o2644),
    ] {
        fs.setattr(Cred::ROOT, f, owner(Some(uid), Some(gid)))
            .unwrap();
        set_mode(&fs, f, mode);
        fs.setattr(who, f, owner(to_uid, to_gid)).unwrap();
        let a = fs.getattr(f).unwrap();
        assert_eq!(
            format!("{:o}", a.perm),
            format!("{left:o}"),
            "{uid}:{gid} {mode:o} chown by {who:?} to {to_uid:?}:{to_gid:?}"
        );
        assert_eq!(
            (a.uid, a.gid),
            (to_uid.unwrap_or(uid), to_gid.unwrap_or(gid))
        );
    }
    // Directories keep both (set-group-ID on a directory is inheritance, not privilege).
    set_mode(&fs, d, 0o6775);
    fs.setattr(Cred::ROOT, d, owner(Some(1000), Some(1000)))
        .unwrap();
    assert_eq!(perm(&fs, d), 0o6775);
    assert_clean(&fs);
}

fn atime_opts(clock: &TestClock, atime: AtimeMode, lazytime: bool) -> FsOptions {
    FsOptions {
        atime,
        lazytime,
        ..opts(clock)
    }
}

/// atime, mtime and ctime of `ino`.
fn times(fs: &Fs, ino: u64) -> (Timespec, Timespec, Timespec) {
    let a = fs.getattr(ino).unwrap();
    (a.atime, a.mtime, a.ctime)
}

fn set_atime(fs: &Fs, ino: u64, t: Timespec) {
    let sa = SetAttr {
        atime: Some(super::types::SetTime::At(t)),
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
    fs.mknod(U, d, b"f", inode::S_IFREG | 0o644, 0).unwrap();
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

/// An operation that finds no log space waits for it outside the filesystem lock (issue 17):
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
        let creator = s.spawn(|| fs.mknod(U, ROOT_INO, b"new", inode::S_IFREG | 0o644, 0));
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

/// How the kernel finds an inode it forgot from a file handle: LOOKUP of "." in it, for any
/// type; an unlinked inode is gone; the generation is the creation time.
#[test]
fn lookup_of_dot_finds_any_inode_by_number() {
    let clock = TestClock::new();
    let dev = new_dev(1801);
    let fs = mount(&dev, opts(&clock));
    let f = fs
        .mknod(U, ROOT_INO, b"f", inode::S_IFREG | 0o644, 0)
        .unwrap();
    assert_eq!(fs.lookup(f.ino, b".").unwrap(), f);
    assert!(matches!(fs.lookup(f.ino, b".."), Err(FsError::NotDir)));
    clock.advance_ms(5);
    let g = fs
        .mknod(U, ROOT_INO, b"g", inode::S_IFREG | 0o644, 0)
        .unwrap();
    assert_ne!(f.generation, g.generation);
    assert_ne!(f.generation, 0);
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert!(matches!(fs.lookup(f.ino, b"."), Err(FsError::NotFound)));
}

/// After a push the header block in memory decodes to the header the filesystem works with:
/// commits leave it to the push (a late write), through every kind of change (counters,
/// roots, the free list growing and shrinking), and a remount finds the same header.
#[test]
fn the_header_block_holds_the_header_through_every_kind_of_change() {
    let clock = TestClock::new();
    let dev = new_dev(41);
    let fs = mount(&dev, opts(&clock));
    // The block is written when the checkpoint is pushed: it holds the header as the last
    // commit before the push left it.
    let assert_block_holds_header = |what: &str| {
        fs.journal.force_all().unwrap();
        let buf = fs.journal.buf(fs.hdr_blk).unwrap();
        let on_block = header::Header::decode(&buf.lock().data, fs.hdr_blk).unwrap();
        assert_eq!(on_block, *fs.read_state().hdr.lock(), "after {what}");
    };
    let start = fs.read_state().hdr.lock().clone();
    // Many names in a few directories: leaves split and the fs tree's root moves up.
    let dirs: Vec<u64> = (0..4)
        .map(|d| {
            fs.mkdir(U, ROOT_INO, format!("d{d}").as_bytes(), 0o755)
                .unwrap()
                .ino
        })
        .collect();
    for i in 0..600 {
        let name = format!("a-fairly-long-file-name-to-fill-leaves-{i:05}");
        fs.mknod(U, dirs[i % 4], name.as_bytes(), inode::S_IFREG | 0o644, 0)
            .unwrap();
    }
    assert_block_holds_header("creates");
    assert_ne!(
        fs.read_state().hdr.lock().fs_root,
        start.fs_root,
        "the root moved"
    );
    // One-block files, every other one removed: free space in many pieces, so the
    // free-space trees grow and take nodes from their free list.
    let files = files_holding(&fs, 800, &[7u8; 100]);
    fs.sync().unwrap();
    assert_block_holds_header("small files");
    fs.setattr(
        U,
        files[1],
        SetAttr {
            size: Some(0),
            ..SetAttr::default()
        },
    )
    .unwrap();
    assert_block_holds_header("a truncate");
    for i in (0..800).step_by(2) {
        fs.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    assert_block_holds_header("unlinks of files");
    for i in (0..600).step_by(2) {
        let name = format!("a-fairly-long-file-name-to-fill-leaves-{i:05}");
        fs.unlink(dirs[i % 4], name.as_bytes()).unwrap();
    }
    assert_block_holds_header("unlinks");
    let hdr = fs.read_state().hdr.lock().clone();
    assert_ne!(hdr.freelist, start.freelist, "the free list changed");
    assert_clean(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(*fs.read_state().hdr.lock(), hdr, "after a remount");
}

/// A file in the root, opened and appended to a block at a time, block i filled with i (so
/// speculative preallocation maps blocks past its end once it has 16).
fn appended_file(fs: &Fs, name: &[u8], n: u64) -> u64 {
    let bs = u64::from(BS);
    let f = fs
        .mknod(U, ROOT_INO, name, inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    fs.open_inode(f).unwrap();
    for i in 0..n {
        fs.write(U, f, i * bs, &[i as u8; BS as usize]).unwrap();
    }
    f
}

/// A crash before the last release leaves speculative preallocation mapped past the end of a
/// file; the mount after it cannot know those blocks from memory, so the next last release
/// frees every block past the end of a file no fallocate preallocated, and keeps them where
/// one did (its `INODE_PREALLOC` survives the crash).
#[test]
fn preallocation_left_by_a_crash_goes_at_the_next_last_release() {
    let clock = TestClock::new();
    let dev = new_dev(43);
    let fs = mount(&dev, opts(&clock));
    let bs = u64::from(BS);
    let f = appended_file(&fs, b"log", 100);
    let g = appended_file(&fs, b"reserved", 40);
    fs.fallocate(U, g, 40 * bs, 64 * bs, true, false).unwrap();
    let h = appended_file(&fs, b"sparse", 20);
    // A hole punched in it: fewer blocks than its size, yet some past its end.
    fs.fallocate(U, h, 2 * bs, 16 * bs, true, true).unwrap();
    for ino in [f, g, h] {
        fs.fsync(ino).unwrap();
    }
    let blocks = |fs: &Fs, ino| fs.getattr(ino).unwrap().blocks_512 / (bs / 512);
    let (f_before, h_before) = (blocks(&fs, f), blocks(&fs, h));
    assert!(f_before > 100, "appends preallocated past the end");
    assert!(h_before > 4, "the appends preallocated past the end");
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let mut o = opts(&clock);
    let told = attrs_changed_log(&mut o);
    let fs = mount(&crashed, o);
    assert_eq!(
        blocks(&fs, f),
        f_before,
        "mapped past the end after the crash"
    );
    let free = fs.statfs().bfree;
    for ino in [f, g, h] {
        fs.open_inode(ino).unwrap();
        fs.release_inode(ino).unwrap();
    }
    assert_eq!(
        *told.lock(),
        vec![f, h],
        "the kernel's cached block counts of the trimmed files dropped, and only theirs"
    );
    assert_eq!(blocks(&fs, f), 100, "speculation the crash left was freed");
    assert_eq!(blocks(&fs, g), 104, "fallocated blocks past the end kept");
    assert_eq!(
        blocks(&fs, h),
        4,
        "blocks past the end of a sparse file freed"
    );
    assert_eq!(fs.read(f, 99 * bs, 4).unwrap(), vec![99u8; 4]);
    assert_eq!(fs.read(h, 19 * bs, 2).unwrap(), vec![19u8; 2]);
    assert_eq!(
        fs.statfs().bfree,
        free + (f_before - 100) + (h_before - 4),
        "the freed blocks are free space again"
    );
    assert_clean(&fs);
}

/// Speculative preallocation serves appends and goes at the last release: an appended file
/// keeps no blocks past its end once closed, a write far past the end preallocates nothing,
/// and blocks fallocate mapped past the end stay.
#[test]
fn speculative_preallocation_is_trimmed_at_the_last_release() {
    let clock = TestClock::new();
    let dev = new_dev(42);
    let fs = mount(&dev, opts(&clock));
    let bs = u64::from(BS);
    let blocks = |ino| fs.getattr(ino).unwrap().blocks_512 / (bs / 512);
    let appended = |name: &[u8], n: u64| appended_file(&fs, name, n);
    let f = appended(b"log", 100);
    assert!(blocks(f) > 100, "appends preallocated past the end");
    // Another handle keeps it: its writer may append into the blocks.
    fs.open_inode(f).unwrap();
    fs.release_inode(f).unwrap();
    assert!(blocks(f) > 100, "trimmed while still open");
    fs.release_inode(f).unwrap();
    assert_eq!(blocks(f), 100, "blocks past the end after the last release");
    assert_eq!(fs.read(f, 99 * bs, 4).unwrap(), vec![99u8; 4]);
    // A write far past the end leaves a hole and preallocates nothing.
    fs.open_inode(f).unwrap();
    fs.write(U, f, 1 << 30, b"far").unwrap();
    assert_eq!(blocks(f), 101);
    fs.release_inode(f).unwrap();
    // fallocate's blocks past the end are the caller's.
    let g = appended(b"reserved", 40);
    fs.fallocate(U, g, 40 * bs, 64 * bs, true, false).unwrap();
    fs.release_inode(g).unwrap();
    assert_eq!(blocks(g), 104, "fallocated blocks past the end kept");
    assert_eq!(fs.getattr(g).unwrap().size, 40 * bs);
    // An append after a fallocate far past the end preallocates again; the release frees
    // only what that append reserved, not the fallocated blocks.
    let h = appended(b"reserved-far", 20);
    fs.fallocate(U, h, 100 * bs, 64 * bs, true, false).unwrap();
    fs.write(U, h, 20 * bs, &[9; BS as usize]).unwrap();
    fs.release_inode(h).unwrap();
    assert_eq!(blocks(h), 20 + 1 + 64, "only speculative blocks trimmed");
    assert_clean(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(fs.getattr(f).unwrap().blocks_512 / (bs / 512), 101);
    assert_eq!(fs.getattr(g).unwrap().blocks_512 / (bs / 512), 104);
    assert_clean(&fs);
}

/// Two names with one 56-bit hash share a bucket. A reader whose buffer holds one entry at a
/// time (the kernel's fills wherever it fills) still gets every name exactly once, also when
/// it removes each name as it gets it.
#[test]
fn readdir_in_small_steps_returns_every_name_of_a_shared_hash_bucket() {
    use super::tree::keys::name_hash;
    let clock = TestClock::new();
    let dev = new_dev(43);
    let fs = mount(&dev, opts(&clock));
    // Found by a birthday search: one hash, two names.
    let (a, b) = (&b"c9e18924c91b36e"[..], &b"c4fe0f87f7ce859"[..]);
    assert_eq!(name_hash(a), name_hash(b));
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let mut want: Vec<Vec<u8>> = vec![a.to_vec(), b.to_vec()];
    want.extend((0..40).map(|i| format!("filler-{i}").into_bytes()));
    for n in &want {
        fs.mknod(U, d, n, inode::S_IFREG | 0o644, 0).unwrap();
    }
    for step in [1, 2, 3, 7] {
        let (mut got, mut cookie) = (Vec::new(), 0);
        loop {
            let batch = fs.readdir(d, cookie, step).unwrap();
            // The caller's buffer takes only the first entry of each batch.
            let Some((e, next)) = batch.into_iter().next() else {
                break;
            };
            got.push(e.name);
            cookie = next;
        }
        got.retain(|n| n != b"." && n != b"..");
        got.sort();
        let mut w = want.clone();
        w.sort();
        assert_eq!(got, w, "batches of {step}, one entry taken from each");
    }
    // A reader that removes each name it is given (rm -r, Go's RemoveAll) one entry at a
    // time: the removals must not hide a name not yet returned.
    let e = fs.mkdir(U, ROOT_INO, b"e", 0o755).unwrap().ino;
    for n in &want {
        fs.mknod(U, e, n, inode::S_IFREG | 0o644, 0).unwrap();
    }
    let (mut removed, mut cookie) = (0, 0);
    while let Some((entry, next)) = fs.readdir(e, cookie, 1).unwrap().into_iter().next() {
        if entry.name != b"." && entry.name != b".." {
            fs.unlink(e, &entry.name).unwrap();
            removed += 1;
        }
        cookie = next;
    }
    assert_eq!(removed, want.len(), "names hidden by removals");
    fs.rmdir(ROOT_INO, b"e").unwrap();
    // Unlinking the first name of the bucket leaves the second listed.
    fs.unlink(d, a).unwrap();
    let names: Vec<Vec<u8>> = fs
        .readdir(d, 0, 1000)
        .unwrap()
        .into_iter()
        .map(|(e, _)| e.name)
        .collect();
    assert!(names.iter().any(|n| n == b));
    assert_clean(&fs);
}

/// A tree node a transaction allocates is written whole, so its block is never read from the
/// device first (a synchronous read per split, in the middle of a create).
#[test]
fn new_tree_nodes_are_not_read_from_the_device() {
    let dev = new_dev(61);
    let fs = mount(&dev, FsOptions::default());
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    for i in 0..100 {
        fs.mknod(
            U,
            d,
            format!("w{i:03}").as_bytes(),
            inode::S_IFREG | 0o644,
            0,
        )
        .unwrap();
    }
    // Every block of every tree in the cache: a split takes its block from the free list,
    // and the free-space trees' leaves are read only when the list is topped up.
    assert!(super::check::check(&fs).unwrap().is_clean());
    let levels = fs.tree_levels();
    let reads = dev.stats().reads;
    // Enough names (with the inodes beside them) to split leaves many times over, and the
    // tree to grow a level, all within a cache that holds the whole tree.
    for i in 0..1500 {
        fs.mknod(
            U,
            d,
            format!("n{i:04}").as_bytes(),
            inode::S_IFREG | 0o644,
            0,
        )
        .unwrap();
    }
    assert!(fs.tree_levels() > levels, "the tree did not grow");
    assert_eq!(dev.stats().reads, reads, "blocks read while creating");
    assert_clean(&fs);
}

/// A filesystem of 64 KiB blocks works: its free-space leaves hold empty values, whose offset
/// (the end of the block) a u16 cannot hold, and mkfs wrote leaves that every later read
/// refused as corrupt.
#[test]
fn a_filesystem_of_64k_blocks_creates_writes_and_checks_clean() {
    let bs = 65536u32;
    let layout = Layout {
        block_size: bs,
        data_blocks: 512,
        log_blocks: 64,
        ..layout()
    };
    let dev = Arc::new(SimDevice::new(
        (layout.data_blocks + layout.log_blocks + 8) * u64::from(bs),
        64,
    ));
    write_filesystem(&*dev, None, &layout, &mut |_, _| {}).unwrap();
    let cfg = JournalConfig {
        log: LogConfig {
            logbsize: 256 * 1024,
            ..jcfg().log
        },
        cache_bytes_max: Some(64 << 20),
        ..jcfg()
    };
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    mkfs::format(&j, 0, 0).unwrap();
    j.unmount().unwrap();
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    for i in 0..50 {
        let f = fs
            .mknod(U, d, format!("f{i}").as_bytes(), inode::S_IFREG | 0o644, 0)
            .unwrap()
            .ino;
        fs.write(U, f, i * 1000, &[i as u8; 3000]).unwrap();
    }
    fs.unlink(d, b"f7").unwrap();
    assert_clean(&fs);
}

/// Splits of the fs tree take their blocks from the free list while it holds more than the
/// quarter kept for the free-space trees, so they leave those trees (whose roots every
/// allocation reads) alone: the free block count does not move until the list is topped up.
#[test]
fn fs_tree_splits_take_blocks_from_the_free_list() {
    let dev = new_dev(62);
    let fs = mount(&dev, FsOptions::default());
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let hdr = || {
        let st = fs.read_state();
        let h = st.hdr.lock();
        (h.freelist.len(), h.free_blocks)
    };
    let (list, free) = hdr();
    let low = super::alloc::freelist_band(super::header::freelist_capacity(BS as usize)).0;
    assert!(
        list > low + 4,
        "a list of {list} leaves no room to take from"
    );
    let mut i = 0;
    while hdr().0 > list - 4 {
        assert!(i < 5000, "5000 creates took no block from the free list");
        fs.mknod(
            U,
            d,
            format!("{i:0>100}").as_bytes(),
            inode::S_IFREG | 0o644,
            0,
        )
        .unwrap();
        i += 1;
    }
    assert_eq!(
        hdr().1,
        free,
        "splits took blocks from the free-space trees"
    );
    assert_clean(&fs);
}

/// An fsync whose data write fails returns the error and keeps the pages dirty: the next
/// fsync writes them. Taken pages are marked clean; dropped after the failure, the next fsync
/// found nothing to write and succeeded, and a crash then showed the old contents.
#[test]
fn an_fsync_whose_data_write_fails_keeps_its_pages_for_the_next() {
    use cilfs_device::FaultMode;
    let clock = TestClock::new();
    let dev = new_dev(97);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[1u8; 3 * 4096]).unwrap();
    fs.sync().unwrap();
    fs.write(U, f, 0, &[2u8; 3 * 4096]).unwrap();
    // The fsync's first device operation is its data write: every block it needs is cached.
    dev.inject_fault(dev.op_count(), FaultMode::Once);
    assert!(
        fs.fsync(f).is_err(),
        "the injected fault did not reach the fsync"
    );
    dev.clear_fault();
    fs.fsync(f).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    let got = fs.read(f, 0, 3 * 4096).unwrap();
    assert!(
        got == vec![2u8; 3 * 4096],
        "the fsynced bytes were lost: {:?}",
        &got[..8]
    );
    assert_clean(&fs);
}

/// Blocks of `dev` that hold a tree leaf whose free middle is not all zero: what a leaf
/// written whole, logged without that middle, and replayed onto a reused block looks like.
fn leaves_with_stale_middles(dev: &SimDevice) -> usize {
    let bs = BS as usize;
    let mut block = vec![0u8; bs];
    (0..BLOCKS)
        .filter(|&b| {
            dev.read(b * bs as u64, &mut block).unwrap();
            block[..4] == node::NODE_MAGIC.to_le_bytes() && block[4] == 0 && {
                let (lo, hi) = node::unused_stretch(&block);
                block[lo..hi].iter().any(|&x| x != 0)
            }
        })
        .count()
}

/// A node a split makes is logged without its free middle (`Node::used_ranges`). Replayed onto
/// a block that held a file's data, it keeps that data in its middle, and everything else of
/// the filesystem is as it was: every name, and a clean check.
#[test]
fn a_new_node_replayed_onto_a_used_block_needs_nothing_of_its_middle() {
    let clock = TestClock::new();
    let dev = new_dev(31);
    let fs = mount(&dev, opts(&clock));
    // Blocks full of 0xEE, then freed and stable: the allocator hands them out again.
    let junk = file_in_root(&fs, b"junk");
    fs.write(U, junk, 0, &vec![0xEE; 3 << 20]).unwrap();
    fs.fsync(junk).unwrap();
    fs.unlink(ROOT_INO, b"junk").unwrap();
    fs.sync().unwrap();
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let mut want = Vec::new();
    for i in 0..1500 {
        let name = format!("name-{i:05}-{}", "x".repeat(i % 23));
        fs.mknod(U, d, name.as_bytes(), inode::S_IFREG | 0o644, 0)
            .unwrap();
        want.push(name);
    }
    fs.journal.force_all().unwrap();
    // Every write not yet flushed is lost: the nodes are on disk only through the log.
    let crashed = Arc::new(dev.crash_with(&mut |_, _| cilfs_device::Survival::Lost));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert!(
        leaves_with_stale_middles(&crashed) > 0,
        "no replayed leaf landed on a block that held data: the test misses its case"
    );
    want.extend([".".to_string(), "..".to_string()]);
    want.sort();
    let got = names(&fs, d);
    assert!(got == want, "{} names, {} wanted", got.len(), want.len());
    assert_clean(&fs);
}

/// A checkpoint whose image of the header is its counters alone recovers to the header memory
/// held. A commit that changes leaves alone writes only the header's 24 bytes of counters late
/// (`Header::encode_counters`); once the log is covered the header block is written back and
/// clean, so the next checkpoint logs those bytes and nothing else of it, and a crash after
/// that checkpoint must bring back the counters it moved over the roots and free list the
/// block held. (The crash campaign makes few such images: a review counted 12 in 4,000.)
#[test]
fn a_header_logged_as_its_counters_alone_recovers() {
    let clock = TestClock::new();
    let dev = new_dev(1731);
    let fs = mount(&dev, opts(&clock));
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    for i in 0..40 {
        fs.mknod(U, d, format!("a{i}").as_bytes(), 0o100_644, 0)
            .unwrap();
    }
    // Five creates after a cover, none of which splits a node (else again).
    let mut n = 0;
    let before = loop {
        fs.journal.cover().unwrap();
        let before = fs.hdr(&fs.read_state()).clone();
        let leaves_only = (0..5).all(|_| {
            n += 1;
            fs.mknod(U, d, format!("b{n}").as_bytes(), 0o100_644, 0)
                .unwrap();
            let h = fs.hdr(&fs.read_state()).clone();
            (h.roots(), &h.freelist) == (before.roots(), &before.freelist)
        });
        if leaves_only {
            break before;
        }
    };
    fs.journal.force_all().unwrap();
    let expect = fs.hdr(&fs.read_state()).clone();
    // Leaves alone changed: the roots and the free list are the block's.
    assert_eq!(
        (expect.roots(), &expect.freelist),
        (before.roots(), &before.freelist)
    );
    assert_eq!(expect.inode_count, before.inode_count + 5);
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert_eq!(*fs.hdr(&fs.read_state()), expect);
    assert_eq!(fs.readdir(d, 0, 1000).unwrap().len(), 40 + n + 2);
    assert_clean(&fs);
}

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

/// The checker finds a leaf that the in-place edits would refuse (`node::check_leaf_layout`):
/// one whose keys are out of order (which decoding refuses too) and one whose values are not
/// packed (which decoding accepts), each made in memory from a clean fs tree leaf.
#[test]
fn the_checker_finds_a_leaf_with_keys_out_of_order_or_values_not_packed() {
    use node::{LEAF_ENTRY_BYTES, NODE_HEADER_BYTES};
    let clock = TestClock::new();
    let fs = mount(&new_dev(47), opts(&clock));
    for i in 0..3u8 {
        let f = file_in_root(&fs, &[b'f', b'0' + i]);
        fs.write(U, f, 0, &[i; 100]).unwrap();
    }
    assert_clean(&fs);
    let root = fs.read_state().hdr.lock().fs_root;
    assert_eq!(root.level, 0, "the fs tree is one leaf");
    let buf = fs.journal.buf(root.blkno).unwrap();
    let entry = |i: usize| NODE_HEADER_BYTES + i * LEAF_ENTRY_BYTES;
    let problems = || check::check(&fs).unwrap().problems;
    let clean = buf.lock().data.to_vec();
    // Keys 0 and 1 swapped, their values with them.
    {
        let mut g = buf.lock();
        let (a, b) = (
            g.data[entry(0)..entry(1)].to_vec(),
            g.data[entry(1)..entry(2)].to_vec(),
        );
        g.data[entry(0)..entry(1)].copy_from_slice(&b);
        g.data[entry(1)..entry(2)].copy_from_slice(&a);
    }
    let found = problems();
    assert!(
        found.iter().any(|p| p.contains("out of order")),
        "keys out of order not found: {found:?}"
    );
    // The last (lowest) value moved 8 bytes down into the free middle, its offset with it:
    // every key still finds its value, but the values are no longer packed.
    {
        let mut g = buf.lock();
        g.data.copy_from_slice(&clean);
        let count = usize::from(u16::from_le_bytes([g.data[6], g.data[7]]));
        let e = entry(count - 1);
        let off = usize::from(u16::from_le_bytes([g.data[e + 16], g.data[e + 17]]));
        let len = usize::from(u16::from_le_bytes([g.data[e + 18], g.data[e + 19]]));
        assert!(
            len > 0 && off - 8 >= entry(count),
            "a value with room below it"
        );
        g.data.copy_within(off..off + len, off - 8);
        g.data[e + 16..e + 18].copy_from_slice(&((off - 8) as u16).to_le_bytes());
    }
    node::Node::decode(&buf.lock().data, root.blkno, header::TREE_FS).expect("it decodes");
    let found = problems();
    assert!(
        found.iter().any(|p| p.contains("not packed")),
        "values not packed not found: {found:?}"
    );
    buf.lock().data.copy_from_slice(&clean);
    assert_clean(&fs);
}
