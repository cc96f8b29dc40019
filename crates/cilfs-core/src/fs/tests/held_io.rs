//! The held-IO tests (docs/concurrency.md, invariant 1): a device that holds one IO until released (one inode's data
//! write, a metadata read of a block not in the cache, a log write a `sync` mount waits for),
//! and operations on other inodes that must complete while it is held. Nothing is timed: the
//! operations record whether the IO was still held when they finished, and a test only gives
//! up waiting for them (then fails) after a minute.

#![allow(clippy::unwrap_used)]

use crate::fs::tests::{assert_clean, jcfg, new_dev};
use crate::fs::types::{Cred, SetAttr};
use crate::fs::*;
use cilfs_device::{Device, IoStats, SimDevice, WriteFlags};
use std::sync::{mpsc, Condvar, Mutex};
use std::time::Duration;

const U: Cred = Cred::user(1000, 1000);

/// What the held inode's data starts with; no metadata block does.
const MAGIC: &[u8; 16] = b"held-by-the-test";

/// Which IO the device holds while armed.
#[derive(Debug, Clone, Default)]
enum Trigger {
    /// Every write whose data starts with `MAGIC`.
    #[default]
    DataMagic,
    /// The first read of a block the device has not read before.
    ColdRead,
    /// The first write with FUA (a log commit record).
    LogCommit,
}

#[derive(Debug, Default)]
struct Hold {
    armed: bool,
    trigger: Trigger,
    /// Writes waiting in the device now.
    held: usize,
    /// One-shot triggers have fired.
    fired: bool,
    /// Blocks read so far (byte offsets / 512).
    read: std::collections::HashSet<u64>,
}

/// Holds the IO `Trigger` picks while armed; everything else passes.
#[derive(Debug)]
struct HoldingDevice {
    inner: Arc<SimDevice>,
    hold: Mutex<Hold>,
    changed: Condvar,
}

impl HoldingDevice {
    fn new(inner: Arc<SimDevice>) -> Arc<Self> {
        Arc::new(HoldingDevice {
            inner,
            hold: Mutex::new(Hold::default()),
            changed: Condvar::new(),
        })
    }

    fn arm(&self, trigger: Trigger) {
        let mut h = self.hold.lock().unwrap();
        h.armed = true;
        h.fired = false;
        h.trigger = trigger;
    }

    fn release(&self) {
        self.hold.lock().unwrap().armed = false;
        self.changed.notify_all();
    }

    fn held(&self) -> usize {
        self.hold.lock().unwrap().held
    }

    /// Waits until an IO is held (the thread doing it got that far). A test whose operation
    /// never does the IO it is meant to hold fails after a minute instead of waiting forever.
    fn wait_until_held(&self) {
        let h = self.hold.lock().unwrap();
        let (h, _) = self
            .changed
            .wait_timeout_while(h, Duration::from_secs(60), |h| h.held == 0)
            .unwrap();
        assert!(h.held > 0, "the operation never did the IO the test holds");
    }

    /// Holds the calling thread's IO if `hit`, until released.
    fn maybe_hold(&self, hit: impl FnOnce(&mut Hold) -> bool) {
        let mut h = self.hold.lock().unwrap();
        if !h.armed || h.fired || !hit(&mut h) {
            return;
        }
        if !matches!(h.trigger, Trigger::DataMagic) {
            h.fired = true;
        }
        h.held += 1;
        self.changed.notify_all();
        while h.armed {
            h = self.changed.wait(h).unwrap();
        }
        h.held -= 1;
    }
}

impl Device for HoldingDevice {
    fn read(&self, offset: u64, buf: &mut [u8]) -> cilfs_device::Result<()> {
        self.maybe_hold(|h| {
            let first_time = h.read.insert(offset / 512);
            matches!(h.trigger, Trigger::ColdRead) && first_time
        });
        self.hold.lock().unwrap().read.insert(offset / 512);
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> cilfs_device::Result<()> {
        self.maybe_hold(|h| match h.trigger {
            Trigger::DataMagic => buf.starts_with(MAGIC),
            Trigger::LogCommit => flags.contains(WriteFlags::FUA),
            Trigger::ColdRead => false,
        });
        self.inner.write(offset, buf, flags)
    }
    fn flush(&self) -> cilfs_device::Result<()> {
        self.inner.flush()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}

/// A mount whose fsyncs write their data in place, where these tests hold it (a few pages
/// would go into the log instead, `logged_data.rs`).
fn mount_holding(dev: &Arc<HoldingDevice>, opts: FsOptions) -> Arc<Fs> {
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    Fs::open(
        j,
        FsOptions {
            log_data_max: 0,
            ..opts
        },
    )
    .unwrap()
}

/// Runs `hold` on a thread until the device holds its IO, then `others` on another; returns
/// what `others` returned, which it must have done while the IO was still held.
fn while_held<R: Send + 'static>(
    fs: &Arc<Fs>,
    dev: &Arc<HoldingDevice>,
    trigger: Trigger,
    hold: impl FnOnce(&Fs) + Send + 'static,
    others: impl FnOnce(&Fs) -> R + Send + 'static,
) -> R {
    dev.arm(trigger);
    let holder = {
        let fs = Arc::clone(fs);
        std::thread::spawn(move || hold(&fs))
    };
    dev.wait_until_held();
    let (tx, rx) = mpsc::channel();
    let other = {
        let (fs, dev) = (Arc::clone(fs), Arc::clone(dev));
        std::thread::spawn(move || {
            let r = others(&fs);
            tx.send((r, dev.held())).unwrap();
        })
    };
    // Not a measure of speed: only how long to wait before calling it stuck.
    let outcome = rx.recv_timeout(Duration::from_secs(60));
    dev.release();
    holder.join().unwrap();
    other.join().unwrap();
    let (r, still_held) = outcome.expect("operations on other inodes waited for the held IO");
    assert_eq!(
        still_held, 1,
        "the other operations must finish while the IO is still held"
    );
    r
}

fn file(fs: &Fs, name: &[u8]) -> u64 {
    fs.mknod(U, ROOT_INO, name, items::inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino
}

fn held_data() -> Vec<u8> {
    let mut d = MAGIC.to_vec();
    d.resize(3 * 2048 + 100, 0x5A);
    d
}

/// Creates `name` in directory `dir`, writes 5000 bytes of `byte` into it and fsyncs it.
fn create_write_fsync(fs: &Fs, dir: u64, name: &[u8], byte: u8) {
    let g = fs
        .mknod(U, dir, name, items::inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    fs.write(U, g, 0, &[byte; 5000]).unwrap();
    fs.fsync(g).unwrap();
}

/// Operations on inodes other than `held` (and a chmod of `held`), run while its data write
/// is held; returns how many writes were still held when they had all finished.
fn others(fs: &Fs, held: u64, round: u32) {
    let b = file(fs, format!("b{round}").as_bytes());
    fs.write(U, b, 0, &vec![0xB0; 10_000]).unwrap();
    fs.fsync(b).unwrap();
    fs.write(U, b, 100, b"overwrite in the page cache").unwrap();
    fs.fsync(b).unwrap();
    let c = format!("c{round}");
    file(fs, c.as_bytes());
    fs.unlink(ROOT_INO, c.as_bytes()).unwrap();
    let d = format!("d{round}");
    fs.mkdir(U, ROOT_INO, d.as_bytes(), 0o755).unwrap();
    fs.rename(
        ROOT_INO,
        format!("b{round}").as_bytes(),
        ROOT_INO,
        format!("moved{round}").as_bytes(),
        Default::default(),
    )
    .unwrap();
    assert!(fs.readdir(ROOT_INO, 0, 1000).unwrap().len() >= 3);
    assert_eq!(
        fs.read(b, 100, 9).unwrap(),
        b"overwrite".to_vec(),
        "another file reads while the held write waits"
    );
    // The held inode's own metadata needs no IO lock.
    fs.setattr(
        Cred::ROOT,
        held,
        SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        },
    )
    .unwrap();
    // The periodic flush skips the inode whose IO is in flight.
    fs.writeback_idle().unwrap();
    fs.journal().force_all().unwrap();
}

#[test]
fn operations_on_other_inodes_complete_while_one_inodes_data_write_is_held() {
    let sim = new_dev(1701);
    let dev = HoldingDevice::new(Arc::clone(&sim));
    let fs = mount_holding(&dev, FsOptions::default());
    let a = file(&fs, b"a");
    let data = held_data();

    // Round 1: a write into new blocks of `a` (mapped unwritten), written back by its fsync
    // (the data in place, then the blocks marked written).
    while_held(
        &fs,
        &dev,
        Trigger::DataMagic,
        move |fs| {
            fs.write(U, a, 0, &held_data()).unwrap();
            fs.fsync(a).unwrap();
        },
        move |fs| others(fs, a, 1),
    );
    assert_eq!(fs.read(a, 0, data.len() as u32).unwrap(), data);

    // Round 2: `a`'s own fsync writing back an overwrite from the page cache.
    fs.fsync(a).unwrap();
    while_held(
        &fs,
        &dev,
        Trigger::DataMagic,
        move |fs| {
            let mut d = held_data();
            d[20] = 0x77;
            fs.write(U, a, 0, &d).unwrap();
            fs.fsync(a).unwrap();
        },
        move |fs| others(fs, a, 2),
    );

    let mut want = data.clone();
    want[20] = 0x77;
    fs.unmount().unwrap();
    drop(fs);
    let fs = crate::fs::tests::mount(&sim, FsOptions::default());
    assert_eq!(fs.read(a, 0, want.len() as u32).unwrap(), want);
    assert_eq!(fs.getattr(a).unwrap().perm, 0o600);
    for round in 1..=2 {
        let b = fs
            .lookup(ROOT_INO, format!("moved{round}").as_bytes())
            .unwrap();
        assert_eq!(fs.read(b.ino, 0, 3).unwrap(), vec![0xB0; 3]);
    }
    assert_clean(&fs);
}

/// A lookup that needs a metadata block not in the buffer cache reads it outside the
/// filesystem lock: creates, writes and fsyncs in another directory go on meanwhile.
#[test]
fn a_metadata_read_of_a_cold_block_holds_no_lock_others_need() {
    let sim = new_dev(1702);
    {
        let fs = crate::fs::tests::mount(&sim, FsOptions::default());
        let a = fs.mkdir(U, ROOT_INO, b"a", 0o755).unwrap().ino;
        // Enough long names that `a`'s entries fill leaves of their own.
        for i in 0..120 {
            let name = format!("{i:03}-{}", "x".repeat(200));
            fs.mknod(U, a, name.as_bytes(), items::inode::S_IFREG | 0o644, 0)
                .unwrap();
        }
        fs.mkdir(U, ROOT_INO, b"b", 0o755).unwrap();
        fs.unmount().unwrap();
    }
    // A cold cache: every block is read from the device when first needed.
    let dev = HoldingDevice::new(Arc::clone(&sim));
    let fs = mount_holding(&dev, FsOptions::default());
    let b = fs.lookup(ROOT_INO, b"b").unwrap().ino;
    let a = fs.lookup(ROOT_INO, b"a").unwrap().ino;
    // What `b`'s operations need is read now; `a`'s entries are not.
    create_write_fsync(&fs, b, b"warm", 1);
    let retries_before = fs.stats.snapshot().retries_read;
    let name = format!("{:03}-{}", 77, "x".repeat(200));
    while_held(
        &fs,
        &dev,
        Trigger::ColdRead,
        move |fs| {
            assert!(fs.lookup(a, name.as_bytes()).is_ok());
        },
        move |fs| {
            create_write_fsync(fs, b, b"new", 2);
            fs.unlink(b, b"warm").unwrap();
        },
    );
    assert!(fs.stats.snapshot().retries_read > retries_before);
    fs.unmount().unwrap();
    drop(fs);
    let fs = crate::fs::tests::mount(&sim, FsOptions::default());
    let g = fs.lookup(b, b"new").unwrap().ino;
    assert_eq!(fs.read(g, 0, 5000).unwrap(), vec![2; 5000]);
    assert_clean(&fs);
}

/// On a `sync` mount an operation forces the log before it returns, but not under the
/// filesystem lock: while its commit record is held, lookups, reads and readdir go on.
#[test]
fn a_sync_mounts_force_holds_no_lock_others_need() {
    let sim = new_dev(1703);
    let dev = HoldingDevice::new(Arc::clone(&sim));
    let opts = FsOptions {
        sync: SyncMode::All,
        ..FsOptions::default()
    };
    let fs = mount_holding(&dev, opts);
    let f = file(&fs, b"f");
    fs.write(U, f, 0, b"kept").unwrap();
    let forces_before = fs.stats.snapshot().deferred_sync_forces;
    while_held(
        &fs,
        &dev,
        Trigger::LogCommit,
        |fs| {
            fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap();
        },
        move |fs| {
            assert_eq!(fs.lookup(ROOT_INO, b"f").unwrap().ino, f);
            assert_eq!(fs.read(f, 0, 4).unwrap(), b"kept".to_vec());
            assert!(fs.readdir(ROOT_INO, 0, 100).unwrap().len() >= 2);
            fs.getattr(f).unwrap();
        },
    );
    assert!(fs.stats.snapshot().deferred_sync_forces > forces_before);
    fs.unmount().unwrap();
}

/// The last release of a file read back after a crash looks for blocks its speculative
/// preallocation left past its end. Those extents may be in a leaf not in the cache: its read
/// happens with no lock another inode's operations need (it gives up and reads outside the
/// filesystem lock, as every other operation's first read does).
#[test]
fn a_release_reading_cold_extents_past_the_end_holds_no_lock_others_need() {
    let sim = new_dev(1704);
    let bs = u64::from(crate::fs::tests::BS);
    let p = {
        // Speculative preallocation serves appends that map their blocks as they come.
        let o = FsOptions {
            delalloc: false,
            ..FsOptions::default()
        };
        let fs = crate::fs::tests::mount(&sim, o);
        let p = file(&fs, b"p");
        fs.open_inode(p).unwrap();
        // One extent per block written, with holes between: its extents fill several leaves
        // after the one holding its inode.
        for i in 0..300 {
            fs.write(U, p, 2 * i * bs, &[1; 16]).unwrap();
        }
        // Appends: speculative preallocation maps blocks past the end.
        let end = fs.getattr(p).unwrap().size;
        for i in 0..20 {
            fs.write(U, p, end + i * bs, &vec![2; bs as usize]).unwrap();
        }
        // Made after `p`, so that items after `p`'s fill leaves of their own: the mount's look
        // at the last leaf (orphans) reads nothing of `p`'s.
        let b = fs.mkdir(U, ROOT_INO, b"b", 0o755).unwrap().ino;
        for i in 0..200 {
            let name = format!("{i:03}-{}", "y".repeat(100));
            fs.mknod(U, b, name.as_bytes(), items::inode::S_IFREG | 0o644, 0)
                .unwrap();
        }
        fs.fsync(p).unwrap();
        fs.sync().unwrap();
        assert!(
            fs.getattr(p).unwrap().blocks_512 / (bs / 512) > 320,
            "preallocated past the end"
        );
        p
        // A crash here: the file is never released.
    };
    let crashed = Arc::new(sim.crash(cilfs_device::CrashOptions { torn_writes: true }));
    // Recovery, and a clean unmount that releases nothing: the next mount starts cold, with
    // the speculation still past the end.
    crate::fs::tests::mount(&crashed, FsOptions::default())
        .unmount()
        .unwrap();
    let dev = HoldingDevice::new(Arc::clone(&crashed));
    let fs = mount_holding(&dev, FsOptions::default());
    // Only `p`'s name and inode are read; the extents past its end stay on the device.
    assert_eq!(fs.lookup(ROOT_INO, b"p").unwrap().ino, p);
    fs.open_inode(p).unwrap();
    let retries_before = fs.stats.snapshot().retries_read;
    while_held(
        &fs,
        &dev,
        Trigger::ColdRead,
        move |fs| fs.release_inode(p).unwrap(),
        move |fs| {
            // Blocks these need that are not in the cache are read too: the device holds
            // only the first read after it was armed, the release's.
            let b = fs.lookup(ROOT_INO, b"b").unwrap().ino;
            create_write_fsync(fs, b, b"new", 2);
            fs.unlink(b, b"new").unwrap();
        },
    );
    assert!(fs.stats.snapshot().retries_read > retries_before);
    assert_eq!(
        fs.getattr(p).unwrap().blocks_512 / (bs / 512),
        300 + 20,
        "the blocks past the end were freed: the written ones stay"
    );
    assert_clean(&fs);
}

/// An open of an inode whose item is not in the buffer cache reads it with no filesystem lock
/// held: creates, writes, fsyncs and unlinks in another directory finish while that read is
/// held. (It read the leaf under the exclusive lock, so everything waited for the device.)
#[test]
fn an_open_reading_a_cold_inode_holds_no_lock_others_need() {
    let sim = new_dev(1705);
    let far = {
        let fs = crate::fs::tests::mount(&sim, FsOptions::default());
        fs.mkdir(U, ROOT_INO, b"b", 0o755).unwrap();
        let a = fs.mkdir(U, ROOT_INO, b"a", 0o755).unwrap().ino;
        // Enough inodes in `a`'s run that the middle ones' items are in leaves of their own.
        let mut middle = 0;
        for i in 0..300 {
            let ino = fs
                .mknod(
                    U,
                    a,
                    format!("f{i}").as_bytes(),
                    items::inode::S_IFREG | 0o644,
                    0,
                )
                .unwrap()
                .ino;
            if i == 150 {
                middle = ino;
            }
        }
        fs.unmount().unwrap();
        middle
    };
    let dev = HoldingDevice::new(Arc::clone(&sim));
    let fs = mount_holding(&dev, FsOptions::default());
    let b = fs.lookup(ROOT_INO, b"b").unwrap().ino;
    create_write_fsync(&fs, b, b"warm", 1);
    let retries_before = fs.stats.snapshot().retries_read;
    let attr = while_held(
        &fs,
        &dev,
        Trigger::ColdRead,
        move |fs| {
            assert_eq!(fs.open_inode(far).unwrap().ino, far);
        },
        move |fs| {
            create_write_fsync(fs, b, b"new", 2);
            fs.unlink(b, b"warm").unwrap();
            fs.getattr(b).unwrap()
        },
    );
    assert_eq!(attr.ino, b);
    assert!(fs.stats.snapshot().retries_read > retries_before);
    fs.release_inode(far).unwrap();
    assert_clean(&fs);
}

/// A create, link or unlink whose "directory" is a file whose data write is held answers
/// ENOTDIR without waiting for that write: the directory's names are its IO lock, which the
/// file's write holds. (They waited for the write, then found no directory.)
#[test]
fn a_namespace_operation_in_a_file_whose_write_is_held_is_refused_at_once() {
    let sim = new_dev(1706);
    let dev = HoldingDevice::new(Arc::clone(&sim));
    let fs = mount_holding(&dev, FsOptions::default());
    let a = file(&fs, b"a");
    let b = file(&fs, b"b");
    let r = while_held(
        &fs,
        &dev,
        Trigger::DataMagic,
        move |fs| {
            fs.write(U, a, 0, &held_data()).unwrap();
            fs.fsync(a).unwrap();
        },
        move |fs| {
            [
                fs.mknod(U, a, b"x", items::inode::S_IFREG | 0o644, 0).err(),
                fs.link(b, a, b"y").err(),
                fs.unlink(a, b"z").err(),
            ]
        },
    );
    assert!(
        r.iter().all(|e| matches!(e, Some(FsError::NotDir))),
        "{r:?}"
    );
    assert_eq!(fs.read(a, 0, 16).unwrap(), MAGIC.to_vec());
    assert_clean(&fs);
}

/// The file block of `ino` at disk block `disk`, if it maps it.
fn file_block_at(fs: &Fs, ino: u64, disk: u64) -> Option<u64> {
    let st = fs.read_state();
    let mut v = fs.view(&st);
    crate::fs::space::map::extents_in(&mut v, ino, 0, crate::fs::tree::keys::OFFSET_MAX)
        .unwrap()
        .iter()
        .find(|e| e.disk <= disk && disk < e.disk + e.len)
        .map(|e| e.file + (disk - e.disk))
}

/// The AIL writes back a block the log holds as a file's data; the file is removed meanwhile,
/// and the block goes to another file's direct write. That write waits until the older image
/// landed: otherwise the image lands on the new owner's data, live and after a crash.
#[test]
fn a_freed_block_is_written_by_its_next_owner_after_its_write_back_landed() {
    let sim = new_dev(63);
    let dev = HoldingDevice::new(Arc::clone(&sim));
    let mut cfg = jcfg();
    cfg.push_mode = crate::journal::PushMode::Background;
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    let bs = u64::from(crate::fs::tests::BS);
    let f = file(&fs, b"old");
    let mut old = MAGIC.to_vec();
    old.resize(bs as usize, 0x4d);
    fs.write(U, f, 0, &old).unwrap();
    fs.fsync(f).unwrap();
    let disk = {
        let st = fs.read_state();
        let mut v = fs.view(&st);
        crate::fs::space::map::extents_in(&mut v, f, 0, 1).unwrap()[0].disk
    };
    assert!(
        fs.journal().is_logged_data(disk),
        "the fsync logged the block"
    );
    // The AIL's write of the block in place is held.
    dev.arm(Trigger::DataMagic);
    let cover = {
        let fs = Arc::clone(&fs);
        std::thread::spawn(move || fs.journal().cover().map(drop))
    };
    dev.wait_until_held();
    let (tx, rx) = mpsc::channel();
    let other = {
        let fs = Arc::clone(&fs);
        std::thread::spawn(move || {
            fs.unlink(ROOT_INO, b"old").unwrap();
            fs.sync().unwrap();
            // Direct writes until the freed block is the new file's.
            let g = file(&fs, b"new");
            let chunk = 64;
            let mut at = 0;
            while file_block_at(&fs, g, disk).is_none() {
                fs.write_direct(U, g, at * bs, &vec![0x77; (chunk * bs) as usize])
                    .unwrap();
                at += chunk;
                assert!(at < crate::fs::tests::BLOCKS, "block {disk} never reused");
            }
            tx.send(g).unwrap();
        })
    };
    // Released once the new owner waits for the write back, or (the bug) is done without.
    let waits = || fs.journal().writing_back.waits();
    let mut done = None;
    while done.is_none() && waits() == 0 {
        done = rx.try_recv().ok();
        std::thread::yield_now();
    }
    let waited = waits() > 0;
    dev.release();
    cover.join().unwrap().unwrap();
    other.join().unwrap();
    let g = done.unwrap_or_else(|| rx.recv().unwrap());
    let mut raw = vec![0u8; bs as usize];
    sim.read(disk * bs, &mut raw).unwrap();
    assert!(
        raw == vec![0x77; bs as usize],
        "the older image landed over the new data: block {disk} starts {:?}",
        &raw[..16]
    );
    let fb = file_block_at(&fs, g, disk).unwrap();
    assert_eq!(
        fs.read(g, fb * bs, bs as u32).unwrap(),
        vec![0x77; bs as usize]
    );
    assert!(
        waited,
        "the new owner's write did not wait for the held write back"
    );
}
