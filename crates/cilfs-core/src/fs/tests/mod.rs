#![allow(clippy::unwrap_used)]

use crate::check;
use crate::format::superblock::SbLog;
use crate::fs::rules::acl;
use crate::fs::tree::{keys, node};
use crate::fs::txn::Trees;
use crate::fs::types::XattrFlags;
use crate::fs::types::{Cred, RenameFlags, SetAttr};
use crate::fs::*;
use crate::journal::{JournalConfig, PushMode};
use crate::log::{FlushPolicy, LogConfig};
use crate::mkfs::{write_filesystem, Layout};
use cilfs_device::{CrashOptions, Device, SimDevice};
use cilfs_sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

mod acls;
mod atime;
mod change;
mod checker;
mod concurrent;
mod damage;
mod data;
mod delalloc;
mod extsize;
mod fallocate;
mod free_space;
mod held_io;
mod iflags;
mod label;
mod log_damage;
mod log_space;
mod logged_data;
mod logging;
mod model;
mod namespace;
mod ordered_data;
mod overlay_upper;
#[cfg(loom)]
mod publish_model;
mod read_only;
mod sb_backup;
mod setid;
mod shutdown;
mod tenant;
mod timestamps;
mod trim;
mod unwritten;
mod verify;
mod xattrs;

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
    fs.mknod(U, ROOT_INO, name, items::inode::S_IFREG | 0o644, 0)
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
                    items::inode::S_IFREG | 0o644,
                    0,
                )
                .unwrap()
                .ino;
            fs.write(U, f, 0, data).unwrap();
            f
        })
        .collect()
}

/// The blocks the checker finds in `role`.
pub(crate) fn blocks_with_role(fs: &Fs, role: check::Role) -> std::collections::HashSet<u64> {
    assert_clean(fs);
    blocks_of(fs, role).into_iter().collect()
}

/// Permission bits of `ino`, set-user-ID, set-group-ID and sticky included.
fn perm(fs: &Fs, ino: u64) -> u32 {
    u32::from(fs.getattr(ino).unwrap().perm)
}

/// The inodes `FsOptions::attrs_changed` was told about, in order.
fn attrs_changed_log(o: &mut FsOptions) -> Arc<Mutex<Vec<u64>>> {
    let told = Arc::new(Mutex::new(Vec::new()));
    let t = Arc::clone(&told);
    o.attrs_changed = Some(Arc::new(move |ino| t.lock().push(ino)));
    told
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

/// atime, mtime and ctime of `ino`.
fn times(fs: &Fs, ino: u64) -> (Timespec, Timespec, Timespec) {
    let a = fs.getattr(ino).unwrap();
    (a.atime, a.mtime, a.ctime)
}
