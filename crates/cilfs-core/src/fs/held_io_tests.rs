//! Issue 17's held-write test: a device that holds one inode's data writes until released,
//! and operations on other inodes (create, write, fsync, unlink, mkdir, rename, readdir, a
//! chmod of the held inode itself, the periodic flush) that must all complete while it is
//! held. Nothing is timed: the operations record whether the write was still held when they
//! finished, and the test only gives up waiting for them (then fails) after a minute.

#![allow(clippy::unwrap_used)]

use super::tests::{assert_clean, jcfg, new_dev};
use super::types::{Cred, SetAttr};
use super::*;
use cilfs_device::{Device, IoStats, SimDevice, WriteFlags};
use std::sync::{mpsc, Condvar, Mutex};
use std::time::Duration;

const U: Cred = Cred::user(1000, 1000);

/// What the held inode's data starts with; no metadata block does.
const MAGIC: &[u8; 16] = b"held-by-the-test";

#[derive(Debug, Default)]
struct Hold {
    armed: bool,
    /// Writes waiting in the device now.
    held: usize,
}

/// Holds every write whose data starts with `MAGIC` while armed; everything else (log writes,
/// metadata write back, flushes, other files' data) passes.
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

    fn arm(&self) {
        self.hold.lock().unwrap().armed = true;
    }

    fn release(&self) {
        self.hold.lock().unwrap().armed = false;
        self.changed.notify_all();
    }

    fn held(&self) -> usize {
        self.hold.lock().unwrap().held
    }

    /// Waits until a write is held (the thread writing the held inode got that far).
    fn wait_until_held(&self) {
        let mut h = self.hold.lock().unwrap();
        while h.held == 0 {
            h = self.changed.wait(h).unwrap();
        }
    }
}

impl Device for HoldingDevice {
    fn read(&self, offset: u64, buf: &mut [u8]) -> cilfs_device::Result<()> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> cilfs_device::Result<()> {
        if buf.starts_with(MAGIC) {
            let mut h = self.hold.lock().unwrap();
            if h.armed {
                h.held += 1;
                self.changed.notify_all();
                while h.armed {
                    h = self.changed.wait(h).unwrap();
                }
                h.held -= 1;
            }
        }
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

fn mount_holding(dev: &Arc<HoldingDevice>) -> Arc<Fs> {
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    Fs::open(j, FsOptions::default()).unwrap()
}

fn file(fs: &Fs, name: &[u8]) -> u64 {
    fs.mknod(U, ROOT_INO, name, inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino
}

fn held_data() -> Vec<u8> {
    let mut d = MAGIC.to_vec();
    d.resize(3 * 2048 + 100, 0x5A);
    d
}

/// Operations on inodes other than `held` (and a chmod of `held`), run while its data write
/// is held; returns how many writes were still held when they had all finished.
fn others(fs: &Fs, held: u64, dev: &HoldingDevice, round: u32) -> usize {
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
    dev.held()
}

/// Runs `hold` (which ends in a held write of inode `held`) on a thread, then `others` on
/// another; fails unless they all finished while the write was held.
fn while_held(fs: &Arc<Fs>, dev: &Arc<HoldingDevice>, held: u64, round: u32, hold: fn(&Fs, u64)) {
    dev.arm();
    let holder = {
        let fs = Arc::clone(fs);
        std::thread::spawn(move || hold(&fs, held))
    };
    dev.wait_until_held();
    let (tx, rx) = mpsc::channel();
    let other = {
        let (fs, dev) = (Arc::clone(fs), Arc::clone(dev));
        std::thread::spawn(move || tx.send(others(&fs, held, &dev, round)).unwrap())
    };
    // Not a measure of speed: only how long to wait before calling it stuck.
    let outcome = rx.recv_timeout(Duration::from_secs(60));
    dev.release();
    holder.join().unwrap();
    other.join().unwrap();
    let still_held = outcome.expect("operations on other inodes waited for the held write");
    assert_eq!(
        still_held, 1,
        "round {round}: the other operations must finish while the write is still held"
    );
}

#[test]
fn operations_on_other_inodes_complete_while_one_inodes_data_write_is_held() {
    let sim = new_dev(1701);
    let dev = HoldingDevice::new(Arc::clone(&sim));
    let fs = mount_holding(&dev);
    let a = file(&fs, b"a");
    let data = held_data();

    // Round 1: a write into new blocks of `a` (written in place before the mapping commits).
    while_held(&fs, &dev, a, 1, |fs, a| {
        fs.write(U, a, 0, &held_data()).unwrap();
    });
    assert_eq!(fs.read(a, 0, data.len() as u32).unwrap(), data);

    // Round 2: `a`'s own fsync writing back an overwrite from the page cache.
    fs.fsync(a).unwrap();
    while_held(&fs, &dev, a, 2, |fs, a| {
        let mut d = held_data();
        d[20] = 0x77;
        fs.write(U, a, 0, &d).unwrap();
        fs.fsync(a).unwrap();
    });

    let mut want = data.clone();
    want[20] = 0x77;
    fs.unmount().unwrap();
    drop(fs);
    let fs = super::tests::mount(&sim, FsOptions::default());
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
