//! `cilfs crashtest fs`: random POSIX workloads on the filesystem core (no FUSE) over recorded
//! simulated devices, crash images at flush/FUA points and between them, then recovery, the
//! checker, and a model.
//!
//! What a recovered image must show (docs/journal.md section 8, docs/crash-model.md):
//! - recovery and mount succeed and `check` finds nothing;
//! - the namespace (names, types, link counts, directory sizes) is exactly the one after some
//!   prefix of the operations: never half an operation (so rename is atomic), and never less than
//!   every operation an fsync of one of the inodes it touched, a sync or an unmount made durable
//!   (a regular file's size is not part of it: a size grown by a write into blocks the file owns
//!   is logged later, like data in a page cache; the contents checks cover it);
//! - a file fsynced and not modified afterwards has exactly the contents it had;
//! - in ordered mode no byte of any file is one it was never written with (only values written
//!   to that file at that offset, or zeros where it held a hole by then): a size is never logged
//!   ahead of its data, so an appended file reads as a prefix of what was written;
//! - a change attribute read before the crash is below the one read after for a file whose
//!   contents differ;
//! - every xattr is the one of that prefix, its value byte for byte, ACLs included (random valid
//!   ACLs, default ACLs inherited by creates, chmod rewriting the mask), and every permission
//!   bit; the checker verifies that each access ACL and its inode's mode agree.
//!
//! Renames may leave whiteouts (RENAME_WHITEOUT, as overlayfs asks); O_TMPFILEs are written
//! and held open, then named by a link, released (which frees them) or left orphans by the
//! crash, which the next mount reclaims.
//!
//! fallocate runs in every mode (preallocation, punched holes, zeroed ranges, collapsed and
//! inserted ranges): a file's bytes in a range punched or zeroed may read as zeros from then
//! on, and once a file had a range collapsed or inserted its bytes may be zeros or any value
//! written to it (data moved, or a hole a crash mid-shift left); every other check holds.
//!
//! Tenants are configured as they go: projects set on random inodes (so renames and links
//! across projects meet EXDEV) and limits set and lifted on the root, which are xattrs there;
//! each inode's project is part of the compared metadata, and so are the inode flags that
//! forbid nothing (nodump, noatime, sync), set and cleared on random inodes. Limits run on a
//! clock that never sleeps (waits are counted, not waited).
//!
//! Bursts of creates and unlinks with long names in a directory of their own (`churn`, left out
//! of the compared namespace) grow and shrink the fs tree, so freed tree nodes are reused for
//! xattr values and file data and the other way round; the checker runs after every operation
//! and the blocks that change role are counted.
//!
//! In background mode the filesystem runs beside its operations what a mount runs: the
//! journal's threads (push worker, AIL worker, concurrent iclog IO), the flusher (the mount's
//! 30 s write back, every few hundred microseconds here), and two more operation threads that
//! create and unlink in one directory (`side`): what recovery brings back of them must be a cut
//! of some serial order of their operations, and their fsynced files must be there whole. The
//! devices complete IO
//! late and out of order (`RecordedSet::with_jitter`). The threads' timing is the machine's: a
//! seed replays the workload's choices, not its interleaving, except in the scheduled build
//! (`scripts/sched-crashtest`, `recorded::scheduled`), where a seed replays the interleaving
//! and the IO too.

mod side;

use crate::recorded::{pick_crash_point, RecordedSet};
use cilfs_core::check;
use cilfs_core::format::superblock::SbLog;
use cilfs_core::fs::rules::acl;
use cilfs_core::fs::types::XattrFlags;
use cilfs_core::fs::types::{Cred, RenameFlags, SetAttr};
use cilfs_core::fs::{DataMode, FileType, Fs, FsError, FsOptions, Timespec, ROOT_INO};
use cilfs_core::journal::{CilSharding, Journal, JournalConfig, PushMode};
use cilfs_core::log::{FlushPolicy, LogConfig};
use cilfs_core::mkfs::{write_filesystem, Layout};
use cilfs_device::rng::SimRng;
use cilfs_device::{Device, SimDevice, SparseImage, Survival};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

const BS: u32 = 2048;
const DATA_BLOCKS: u64 = 8192;
const LOG_BLOCKS: u64 = 128;
const OPS_PER_RUN: usize = 600;
const POINTS_PER_RUN: usize = 100;
const NAMES: u64 = 6;
const FILE_MAX: u64 = 48 * 1024;
/// The directory of the create/unlink bursts, outside the compared namespace.
const CHURN: &[u8] = b"churn";
/// Background mode's other operation threads (`side`), and the directory they share, outside
/// the compared namespace.
const SIDE_THREADS: usize = 2;
const SIDE_DIR: &[u8] = b"side";

/// A name of the root that the compared namespace leaves out.
fn hidden(name: &[u8]) -> bool {
    name == CHURN || name == SIDE_DIR
}

#[derive(Debug, Clone, Copy)]
pub struct FsCrashConfig {
    pub seed: u64,
    pub points: usize,
    pub policy: FlushPolicy,
    pub data: DataMode,
    /// Only this run (numbered from 0, as failures name it), its crash points exactly as in the
    /// whole exploration: replays one failure in seconds instead of every run before it.
    pub only_run: Option<u64>,
    /// The mount's threads instead of one (see the module comment).
    pub background: bool,
    /// The log on a device of its own (`SbLog::External`), crashed with the data device.
    pub external_log: bool,
}

pub use crate::journal_crash::CrashReport;

/// Type, size (directories only), link count, permission bits (ACLs change them), project,
/// inode flags (with the extent size hint's) and the extent size hint.
type InodeMeta = (FileType, u64, u32, u16, u32, u32, u32);

/// The visible metadata: names, per inode type, size and link count, and every xattr (by the
/// digest of its value).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Meta {
    entries: BTreeMap<(u64, Vec<u8>), u64>,
    inodes: BTreeMap<u64, InodeMeta>,
    xattrs: BTreeMap<(u64, Vec<u8>), u64>,
}

/// FNV-1a over the value, finalized: names a value in `Meta`; values are compared byte for
/// byte against `Model::values` after recovery.
fn digest(v: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ v.len() as u64;
    for &b in v {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    SimRng::derive(h, 0).next_u64()
}

#[derive(Debug, Default)]
struct Model {
    /// Metadata after each operation (index 0: before the first).
    states: Vec<Arc<Meta>>,
    /// Background mode: what each of the other operation threads did, in order.
    side: Vec<Vec<side::SideOp>>,
    /// Syncs, unmounts and shutdowns: (device op count when it began, when it returned).
    /// Once it returned, everything any thread had returned from before it began is durable.
    barriers: Vec<(usize, usize)>,
    /// Device operation count when each operation started.
    started_at: Vec<usize>,
    /// (device op count when it returned, operations that must survive).
    durable: Vec<(usize, usize)>,
    /// Per inode, the operations that changed it in any way (data included).
    modified: HashMap<u64, Vec<usize>>,
    /// Per inode, the last operation that committed a change to it (what its fsync forces).
    last_commit: HashMap<u64, usize>,
    /// Writes: inode -> (offset, length, byte) of every write.
    writes: HashMap<u64, Vec<(u64, u64, u8)>>,
    /// Per inode, its contents as far as zeros go (`Zeros`).
    zeros: HashMap<u64, Zeros>,
    /// Per inode, the first collapse or insert of it: from then on its bytes may be any value
    /// written to it (moved) or zero (a crash mid-shift leaves holes).
    shifted: HashMap<u64, usize>,
    /// (device op count at the fsync's return, inode, fsync op index, contents then).
    synced: Vec<(usize, u64, usize, Arc<Vec<u8>>)>,
    /// (device op count at the query, inode, value read, contents then).
    queried: Vec<(usize, u64, u64, Arc<Vec<u8>>)>,
    /// Every xattr value set, by digest.
    values: HashMap<u64, Arc<Vec<u8>>>,
    /// Digests of values whose blocks had been tree nodes or file data before.
    reused_values: HashSet<u64>,
}

/// Where a regular file may read as zeros: every byte written is nonzero, so a zero is a byte
/// the file held as a hole (past the end at a write, or grown by a truncate).
#[derive(Debug, Default)]
struct Zeros {
    /// The size now, and per byte below it whether it holds written data.
    size: u64,
    written: Vec<bool>,
    /// Per byte, the first operation after which the file held a zero there.
    since: Vec<usize>,
}

impl Zeros {
    /// Bytes `[size, to)` become part of the file as zeros at operation `op`.
    fn grow(&mut self, to: u64, op: usize) {
        let (from, to) = (self.size as usize, to as usize);
        if to <= from {
            return;
        }
        self.written.resize(to, false);
        if self.since.len() < to {
            self.since.resize(to, usize::MAX);
        }
        for s in &mut self.since[from..to] {
            *s = (*s).min(op);
        }
        self.size = to as u64;
    }

    fn write(&mut self, off: u64, len: u64, op: usize) {
        self.grow(off, op);
        let end = (off + len) as usize;
        if self.written.len() < end {
            self.written.resize(end, false);
        }
        self.written[off as usize..end].fill(true);
        self.size = self.size.max(end as u64);
    }

    fn truncate(&mut self, to: u64, op: usize) {
        if to < self.size {
            self.written.truncate(to as usize);
            self.size = to;
        }
        self.grow(to, op);
    }

    /// Whether byte `p` may read as zero in a state no newer than operation `newest`.
    fn zero_ok(&self, p: usize, newest: usize) -> bool {
        self.since.get(p).is_some_and(|&s| s <= newest)
    }
}

impl Model {
    fn required_at(&self, g: usize) -> usize {
        self.durable
            .iter()
            .filter(|(at, _)| *at <= g)
            .map(|(_, k)| *k)
            .max()
            .unwrap_or(0)
    }

    /// Operations that had started by device op `g`: the newest prefix recovery may show.
    fn started_by(&self, g: usize) -> usize {
        self.started_at.iter().filter(|&&s| s < g).count()
    }
}

fn layout(external: bool) -> Layout {
    Layout {
        uuid: [0x3c; 16],
        block_size: BS,
        data_blocks: DATA_BLOCKS,
        log: if external {
            SbLog::External {
                log_uuid: [0xc3; 16],
            }
        } else {
            SbLog::Internal { start: 1 }
        },
        log_blocks: LOG_BLOCKS,
        backups: false,
    }
}

fn journal_config(policy: FlushPolicy, cil_limit: u64, background: bool) -> JournalConfig {
    if background {
        return crate::recorded::with_mount_threads(journal_config(policy, cil_limit, false));
    }
    JournalConfig {
        log: LogConfig {
            logbufs: 2,
            logbsize: 16 * 1024,
            policy,
        },
        cil_limit: Some(cil_limit),
        push_mode: PushMode::Inline,
        cache_bytes_max: Some(256 * u64::from(BS)),
        log_force_interval: None,
        // Every checkpoint a merge of the CIL's shards.
        cil_sharding: CilSharding::Rotate,
    }
}

const CIL_LIMITS: [u64; 3] = [8 * 1024, 24 * 1024, 64 * 1024];

/// Fresh images of the data device (and the log device), formatted with the directories the
/// workload starts from.
fn base_images(external: bool) -> Result<Vec<(SparseImage, u64)>, String> {
    let len = DATA_BLOCKS * u64::from(BS);
    let log_len = (LOG_BLOCKS + 1) * u64::from(BS);
    let dev = Arc::new(SimDevice::new(len, 0));
    let log = Arc::new(SimDevice::new(log_len, 0));
    let logdev = external.then(|| log.clone() as Arc<dyn Device>);
    write_filesystem(&*dev, logdev.as_deref(), &layout(external), &mut |_, _| {})
        .map_err(|e| e.to_string())?;
    let j = Journal::open(
        dev.clone() as Arc<dyn Device>,
        logdev,
        journal_config(FlushPolicy::Reduced, 64 * 1024, false),
    )
    .map_err(|e| e.to_string())?;
    cilfs_core::fs::mkfs::format(&j, 0, 0).map_err(|e| e.to_string())?;
    // The burst directory is there before the recording starts, like the root.
    let clock = Arc::new(AtomicI64::new(0));
    let fs = Fs::open(j, fs_options(DataMode::Ordered, &clock)).map_err(|e| e.to_string())?;
    fs.mkdir(Cred::ROOT, ROOT_INO, CHURN, 0o755)
        .map_err(|e| format!("mkdir churn: {e}"))?;
    fs.mkdir(Cred::ROOT, ROOT_INO, SIDE_DIR, 0o755)
        .map_err(|e| format!("mkdir side: {e}"))?;
    fs.unmount().map_err(|e| e.to_string())?;
    drop(fs);
    let mut v = vec![(dev.stable_image(), len)];
    if external {
        v.push((log.stable_image(), log_len));
    }
    Ok(v)
}

/// The tenants' time: moves only by the waits it is asked for, at once.
#[derive(Debug, Default)]
struct InstantClock(cilfs_sync::Mutex<std::time::Duration>);

impl cilfs_device::Clock for InstantClock {
    fn now(&self) -> std::time::Duration {
        *self.0.lock()
    }
    fn sleep(&self, d: std::time::Duration) {
        *self.0.lock() += d;
    }
}

fn fs_options(data: DataMode, clock: &Arc<AtomicI64>) -> FsOptions {
    let c = Arc::clone(clock);
    FsOptions {
        data,
        io_clock: Some(Arc::new(InstantClock::default())),
        clock: Arc::new(move || {
            let ms = c.load(Ordering::Relaxed);
            Timespec {
                sec: ms / 1000,
                nsec: ((ms % 1000) * 1_000_000) as u32,
            }
        }),
        ..FsOptions::default()
    }
}

/// Mounts the data device `devs[0]`, with the log device `devs[1]` if there is one.
fn open_fs(
    devs: &[Arc<dyn Device>],
    cfg: &FsCrashConfig,
    cil: u64,
    clock: &Arc<AtomicI64>,
) -> Result<Arc<Fs>, String> {
    let j = Journal::open(
        Arc::clone(&devs[0]),
        devs.get(1).cloned(),
        journal_config(cfg.policy, cil, cfg.background),
    )
    .map_err(|e| format!("journal: {e}"))?;
    Fs::open(j, fs_options(cfg.data, clock)).map_err(|e| format!("mount: {e}"))
}

/// Walks the namespace from the root; with `values`, records every xattr value seen (inherited
/// ACLs included) for the byte-for-byte comparison after recovery.
fn meta_of(fs: &Fs, mut values: Option<&mut HashMap<u64, Arc<Vec<u8>>>>) -> Result<Meta, String> {
    let mut m = Meta::default();
    let mut dirs = vec![ROOT_INO];
    let a = fs.getattr(ROOT_INO).map_err(|e| e.to_string())?;
    let project = |ino| fs.project(ino).map_err(|e| format!("project {ino}: {e}"));
    let attrs = |ino| match fs.file_attr(ino) {
        Ok(fa) => Ok((fa.flags, fa.extsize)),
        Err(e) => Err(format!("flags {ino}: {e}")),
    };
    m.inodes.insert(
        ROOT_INO,
        (
            a.kind,
            a.size,
            a.nlink,
            a.perm,
            project(ROOT_INO)?,
            attrs(ROOT_INO)?.0,
            attrs(ROOT_INO)?.1,
        ),
    );
    // Regular files' sizes are left out (see the module comment).
    let size_of = |a: &cilfs_core::fs::Attr| {
        if a.kind == FileType::Directory {
            a.size
        } else {
            0
        }
    };
    while let Some(d) = dirs.pop() {
        for (e, _) in fs.readdir(d, 0, 1 << 20).map_err(|e| e.to_string())? {
            if e.name == b"." || e.name == b".." || (d == ROOT_INO && hidden(&e.name)) {
                continue;
            }
            m.entries.insert((d, e.name.clone()), e.ino);
            if let std::collections::btree_map::Entry::Vacant(v) = m.inodes.entry(e.ino) {
                let a = fs
                    .getattr(e.ino)
                    .map_err(|x| format!("entry {:?}: {x}", String::from_utf8_lossy(&e.name)))?;
                let (flags, extsize) = attrs(e.ino)?;
                v.insert((
                    a.kind,
                    size_of(&a),
                    a.nlink,
                    a.perm,
                    project(e.ino)?,
                    flags,
                    extsize,
                ));
                if a.kind == FileType::Directory {
                    dirs.push(e.ino);
                }
            }
        }
    }
    for &ino in m.inodes.keys() {
        for n in fs
            .listxattr(ino)
            .map_err(|e| format!("listxattr {ino}: {e}"))?
        {
            let v = fs
                .getxattr(ino, &n)
                .map_err(|e| format!("getxattr {ino}: {e}"))?;
            let d = digest(&v);
            if let Some(values) = values.as_deref_mut() {
                values.entry(d).or_insert_with(|| Arc::new(v));
            }
            m.xattrs.insert((ino, n), d);
        }
    }
    Ok(m)
}

/// What the blocks of the data area hold now, by role, from the checker (which must find
/// nothing wrong).
fn roles(fs: &Fs) -> Result<HashMap<u64, check::Role>, String> {
    let r = check::check(fs).map_err(|e| format!("check could not run: {e}"))?;
    if !r.is_clean() {
        return Err(format!("live check: {}", r.problems.join("; ")));
    }
    Ok(r.blocks
        .iter()
        .filter(|e| e.2 != check::Role::Free)
        .flat_map(|&(s, l, role)| (s..s + l).map(move |b| (b, role)))
        .collect())
}

/// Follows blocks across operations: the last role each block had, and what changed role.
#[derive(Debug, Default)]
struct RoleHistory {
    last: HashMap<u64, check::Role>,
    /// Blocks that were ever a tree node or file data.
    node_or_data: HashSet<u64>,
}

impl RoleHistory {
    /// Records the roles after an operation; returns the blocks that are xattr values now and
    /// were tree nodes or file data before, and counts every block that changed role.
    fn update(&mut self, now: &HashMap<u64, check::Role>, report: &mut CrashReport) -> Vec<u64> {
        use check::Role::{FileData, TreeNode, XattrValue};
        let mut values_in_reused = Vec::new();
        for (&b, &r) in now {
            if let Some(&before) = self.last.get(&b) {
                if before != r && [TreeNode, FileData, XattrValue].contains(&before) {
                    report.blocks_changed_role += 1;
                }
            }
            if r == XattrValue
                && self.last.get(&b) != Some(&XattrValue)
                && self.node_or_data.contains(&b)
            {
                values_in_reused.push(b);
            }
            if matches!(r, TreeNode | FileData) {
                self.node_or_data.insert(b);
            }
            self.last.insert(b, r);
        }
        values_in_reused
    }
}

fn contents(fs: &Fs, ino: u64) -> Result<Vec<u8>, String> {
    fs.read(ino, 0, FILE_MAX as u32 * 2)
        .map_err(|e| e.to_string())
}

fn name(n: u64) -> Vec<u8> {
    format!("f{n}").into_bytes()
}

/// An O_TMPFILE in directory `d`, written (recorded in `m` as any file's writes): unnamed
/// and open, an orphan if the crash comes before its link or release. None if out of space.
fn tmpfile(
    fs: &Fs,
    m: &mut Model,
    rng: &mut SimRng,
    d: u64,
    op: usize,
) -> Result<Option<u64>, String> {
    let t = match fs.tmpfile(Cred::ROOT, d, 0o100_644) {
        Ok(a) => a.ino,
        Err(FsError::NoSpace) => return Ok(None),
        Err(e) => return Err(format!("op {op}: tmpfile: {e}")),
    };
    if let Some(z) = m.zeros.get_mut(&t) {
        z.truncate(0, op);
    }
    let len = 1 + rng.below(8 * 1024);
    let byte = (SimRng::derive(t, op as u64).next_u64() as u8) | 1;
    match fs.write(Cred::ROOT, t, 0, &vec![byte; len as usize]) {
        Ok(_) => {
            m.writes.entry(t).or_default().push((0, len, byte));
            m.zeros.entry(t).or_default().write(0, len, op);
            m.modified.entry(t).or_default().push(op);
        }
        Err(FsError::NoSpace) => {}
        Err(e) => return Err(format!("op {op}: tmpfile write: {e}")),
    }
    Ok(Some(t))
}

/// A burst in `churn`: if it is empty, up to 120 files with long names (so the fs tree splits),
/// some with data; otherwise all of them unlinked (so its nodes are freed). Two operations, so
/// the roles are looked at in between.
fn churn(fs: &Fs, rng: &mut SimRng, op: usize) -> Result<(), String> {
    let d = fs
        .lookup(ROOT_INO, CHURN)
        .map_err(|e| format!("lookup churn: {e}"))?
        .ino;
    let there: Vec<Vec<u8>> = fs
        .readdir(d, 0, 1 << 20)
        .map_err(|e| format!("readdir churn: {e}"))?
        .into_iter()
        .map(|(e, _)| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    if !there.is_empty() {
        for n in there {
            fs.unlink(d, &n).map_err(|e| format!("churn unlink: {e}"))?;
        }
        return Ok(());
    }
    for i in 0..20 + rng.below(100) {
        let name = format!("{op}-{i:0>170}").into_bytes();
        match fs.mknod(Cred::ROOT, d, &name, 0o100_644, 0) {
            Ok(a) => {
                if rng.chance(1, 4) {
                    let len = 1 + rng.below(6000) as usize;
                    match fs.write(Cred::ROOT, a.ino, 0, &vec![0xC7; len]) {
                        Ok(_) | Err(FsError::NoSpace) => {}
                        Err(e) => return Err(format!("churn write: {e}")),
                    }
                }
            }
            Err(FsError::NoSpace) => break,
            Err(e) => return Err(format!("churn create: {e}")),
        }
    }
    Ok(())
}

/// The filesystem mounted now, for the flusher of background mode; None while the workload
/// unmounts, shuts down or remounts it.
type Mounted = cilfs_sync::RwLock<Option<Arc<Fs>>>;

/// Runs one workload, recording the model.
fn workload(
    seed: u64,
    cfg: &FsCrashConfig,
    cil: u64,
    report: &mut CrashReport,
) -> Result<(RecordedSet, Model), String> {
    let set = if cfg.background {
        RecordedSet::with_jitter(base_images(cfg.external_log)?, seed)
    } else {
        RecordedSet::new(base_images(cfg.external_log)?, seed)
    };
    let mounted = Mounted::default();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let r = cilfs_sync::thread::scope(|scope| {
        let _stop_beside = crate::recorded::StopOnDrop(&stop);
        let flusher = cfg
            .background
            .then(|| scope.spawn(|| flusher(&mounted, &stop, seed)));
        let sides: Vec<_> = (0..SIDE_THREADS)
            .filter(|_| cfg.background)
            .map(|who| {
                let (mounted, stop, set) = (&mounted, &stop, &set);
                scope.spawn(move || side::side_ops(mounted, stop, set, seed, who))
            })
            .collect();
        let r = run_ops(&set, &mounted, seed, cfg, cil, report);
        stop.store(true, Ordering::Relaxed);
        let flushed = flusher.map_or(Ok(()), |f| {
            f.join()
                .unwrap_or_else(|_| Err("the flusher panicked".into()))
        });
        let flushed = flushed.map_err(|e| format!("flusher: {e}"));
        let mut side = Vec::new();
        let mut side_err = Ok(());
        for (who, t) in sides.into_iter().enumerate() {
            match t.join() {
                Ok(Ok(ops)) => side.push(ops),
                Ok(Err(e)) => side_err = side_err.and(Err(format!("side thread {who}: {e}"))),
                Err(_) => side_err = side_err.and(Err(format!("side thread {who} panicked"))),
            }
        }
        r.and_then(|mut m| {
            flushed?;
            side_err?;
            m.side = side;
            Ok(m)
        })
    });
    Ok((set, r?))
}

/// The flusher of background mode: the mount's 30 s write back of idle inodes' dirty pages,
/// every few hundred microseconds here, beside the workload's operations.
fn flusher(
    mounted: &Mounted,
    stop: &std::sync::atomic::AtomicBool,
    seed: u64,
) -> Result<(), String> {
    let mut rng = SimRng::derive(seed, 3);
    while !stop.load(Ordering::Relaxed) {
        cilfs_sync::thread::sleep(std::time::Duration::from_micros(rng.below(800)));
        if crate::SCHEDULED && rng.below(32) != 0 {
            continue;
        }
        let m = mounted.read();
        let Some(fs) = m.as_ref() else { continue };
        match fs.writeback_idle() {
            Ok(()) => {}
            // A workload's shutdown leaves the mount refusing everything until it remounts.
            Err(_) if fs.is_shut_down() => {}
            Err(FsError::NoSpace) => {}
            Err(e) => return Err(format!("write back: {e}")),
        }
    }
    Ok(())
}

/// The workload's operations, recording the model.
fn run_ops(
    set: &RecordedSet,
    mounted: &Mounted,
    seed: u64,
    cfg: &FsCrashConfig,
    cil: u64,
    report: &mut CrashReport,
) -> Result<Model, String> {
    let dev: Vec<Arc<dyn Device>> = set
        .devs
        .iter()
        .map(|d| Arc::clone(d) as Arc<dyn Device>)
        .collect();
    let clock = Arc::new(AtomicI64::new(1_000_000_000));
    let mut rng = SimRng::new(seed);
    let mut fs = open_fs(&dev, cfg, cil, &clock)?;
    *mounted.write() = Some(Arc::clone(&fs));
    let mut m = Model::default();
    let mut history = RoleHistory::default();
    history.update(&roles(&fs)?, report);
    m.states.push(Arc::new(meta_of(&fs, Some(&mut m.values))?));
    let mut open_files: Vec<u64> = Vec::new();
    // O_TMPFILEs held open and not yet named (also in `open_files`).
    let mut tmpfiles: Vec<u64> = Vec::new();
    let cred = Cred::ROOT;
    // Scheduled with the mount's threads, every lock is a step of the scheduler: shorter runs.
    let ops = if crate::SCHEDULED && cfg.background {
        OPS_PER_RUN / 4
    } else {
        OPS_PER_RUN
    };
    for i in 0..ops {
        let op = i + 1; // operation numbers start at 1; state i+1 is after it
        m.started_at.push(set.op_count());
        if rng.chance(1, 2) {
            clock.fetch_add(1, Ordering::Relaxed);
        }
        let cur = m.states.last().cloned().unwrap_or_default();
        let dirs: Vec<u64> = cur
            .inodes
            .iter()
            .filter(|(_, v)| v.0 == FileType::Directory)
            .map(|(k, _)| *k)
            .collect();
        let files: Vec<u64> = cur
            .inodes
            .iter()
            .filter(|(_, v)| v.0 == FileType::Regular)
            .map(|(k, _)| *k)
            .collect();
        let pick = |rng: &mut SimRng, v: &[u64]| v[rng.below(v.len() as u64) as usize];
        // This thread's own: the flusher commits beside it in background mode.
        let tx_before = cilfs_core::fs::stats::transactions_by_this_thread();
        let mut touched: Vec<u64> = Vec::new();
        let mut set_value: Option<u64> = None;
        let ok_or_expected = |r: Result<(), FsError>| -> Result<(), String> {
            match r {
                Ok(())
                | Err(
                    FsError::Exists
                    | FsError::NotFound
                    | FsError::NotEmpty
                    | FsError::IsDir
                    | FsError::NotDir
                    | FsError::Invalid(_)
                    | FsError::CrossProject
                    | FsError::NoSpace,
                ) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        };
        match rng.below(116) {
            0..=14 => {
                let d = pick(&mut rng, &dirs);
                let n = name(rng.below(NAMES));
                if let Ok(a) = fs.mknod(cred, d, &n, 0o100_644, 0) {
                    // A number used again starts empty; zeros it held before stay allowed.
                    if let Some(z) = m.zeros.get_mut(&a.ino) {
                        z.truncate(0, op);
                    }
                    touched.extend([a.ino, d]);
                }
            }
            15..=19 => {
                let d = pick(&mut rng, &dirs);
                if let Ok(a) = fs.mkdir(cred, d, &name(rng.below(NAMES)), 0o755) {
                    touched.extend([a.ino, d]);
                }
            }
            20..=44 if !files.is_empty() => {
                let f = pick(&mut rng, &files);
                let off = rng.below(FILE_MAX);
                let short = rng.bool();
                let len = 1 + rng.below(if short { 16 } else { 12 * 1024 });
                let byte = (SimRng::derive(f, op as u64).next_u64() as u8) | 1;
                // One in five as O_DIRECT: new blocks written in place before the transaction
                // that maps them, owned ones through the page cache and written back at once.
                let data = vec![byte; len as usize];
                let r = if rng.chance(1, 5) {
                    fs.write_direct(cred, f, off, &data)
                } else {
                    fs.write(cred, f, off, &data)
                };
                match r {
                    Ok(_) => {
                        m.writes.entry(f).or_default().push((off, len, byte));
                        m.zeros.entry(f).or_default().write(off, len, op);
                        m.modified.entry(f).or_default().push(op);
                        touched.push(f);
                    }
                    Err(FsError::NoSpace) => {}
                    Err(e) => return Err(format!("op {op}: write: {e}")),
                }
            }
            45..=49 if !files.is_empty() => {
                let f = pick(&mut rng, &files);
                let size = rng.below(FILE_MAX);
                fs.setattr(
                    cred,
                    f,
                    SetAttr {
                        size: Some(size),
                        ..SetAttr::default()
                    },
                )
                .map_err(|e| format!("op {op}: truncate: {e}"))?;
                m.zeros.entry(f).or_default().truncate(size, op);
                m.modified.entry(f).or_default().push(op);
                touched.push(f);
            }
            50..=59 => {
                let d = pick(&mut rng, &dirs);
                let n = name(rng.below(NAMES));
                if let Some(&ino) = cur.entries.get(&(d, n.clone())) {
                    let r = if cur.inodes[&ino].0 == FileType::Directory {
                        fs.rmdir(d, &n)
                    } else {
                        fs.unlink(d, &n)
                    };
                    ok_or_expected(r).map_err(|e| format!("op {op}: remove: {e}"))?;
                    m.modified.entry(ino).or_default().push(op);
                    touched.extend([ino, d]);
                }
            }
            60..=69 => {
                let (d1, d2) = (pick(&mut rng, &dirs), pick(&mut rng, &dirs));
                let (n1, n2) = (name(rng.below(NAMES)), name(rng.below(NAMES)));
                let flags = RenameFlags {
                    noreplace: rng.chance(1, 6),
                    exchange: rng.chance(1, 6),
                    whiteout: rng.chance(1, 6),
                };
                let r = fs.rename(d1, &n1, d2, &n2, flags);
                ok_or_expected(r).map_err(|e| format!("op {op}: rename: {e}"))?;
                for k in [(d1, n1), (d2, n2)] {
                    if let Some(&ino) = cur.entries.get(&k) {
                        m.modified.entry(ino).or_default().push(op);
                        touched.push(ino);
                    }
                }
                touched.extend([d1, d2]);
            }
            70..=73 if !files.is_empty() => {
                let f = pick(&mut rng, &files);
                let d = pick(&mut rng, &dirs);
                if fs.link(f, d, &name(rng.below(NAMES))).is_ok() {
                    touched.extend([f, d]);
                }
            }
            74..=83 => {
                // fsync of a file or a directory.
                let all: Vec<u64> = cur.inodes.keys().copied().collect();
                let x = pick(&mut rng, &all);
                let regular = cur.inodes[&x].0 == FileType::Regular;
                if regular && rng.chance(1, 3) {
                    // fdatasync: its data and size are made stable, a checkpoint that moved
                    // only its timestamps need not be, so it is no durability point for the
                    // namespace; its contents are checked as an fsync's are, when the
                    // recovered state reaches it.
                    fs.fdatasync(x)
                        .map_err(|e| format!("op {op}: fdatasync: {e}"))?;
                } else {
                    fs.fsync(x).map_err(|e| format!("op {op}: fsync: {e}"))?;
                    let need = m.last_commit.get(&x).copied().unwrap_or(0);
                    m.durable.push((set.op_count(), need));
                }
                if regular {
                    let c = contents(&fs, x)?;
                    m.synced.push((set.op_count(), x, op, Arc::new(c)));
                }
            }
            84..=85 => {
                let began = set.op_count();
                fs.sync().map_err(|e| format!("op {op}: sync: {e}"))?;
                m.durable.push((set.op_count(), op - 1));
                m.barriers.push((began, set.op_count()));
            }
            86..=89 if !files.is_empty() => {
                let f = pick(&mut rng, &files);
                let v = fs
                    .change_attr(f)
                    .map_err(|e| format!("op {op}: change: {e}"))?;
                let c = contents(&fs, f)?;
                m.queried.push((set.op_count(), f, v, Arc::new(c)));
            }
            90..=92 if !files.is_empty() => {
                // Hold a file open (it may be unlinked while open, an orphan at the crash).
                let f = pick(&mut rng, &files);
                fs.open_inode(f)
                    .map_err(|e| format!("op {op}: open: {e}"))?;
                open_files.push(f);
            }
            93..=94 if !open_files.is_empty() => {
                let f = open_files.swap_remove(rng.below(open_files.len() as u64) as usize);
                fs.release_inode(f)
                    .map_err(|e| format!("op {op}: release: {e}"))?;
                if !open_files.contains(&f) {
                    tmpfiles.retain(|&t| t != f);
                }
            }
            96..=98 => {
                // Xattrs on any inode, small (in the tree) or large (in blocks of their own):
                // set, create-only, replace-only or removed. Values are random bytes.
                let all: Vec<u64> = cur.inodes.keys().copied().collect();
                let f = pick(&mut rng, &all);
                let xname = format!("user.x{}", rng.below(4));
                let r = if rng.chance(1, 4) {
                    fs.removexattr(f, xname.as_bytes())
                } else {
                    let len = if rng.bool() {
                        1 + rng.below(60)
                    } else {
                        u64::from(BS) + 1 + rng.below(9 * u64::from(BS))
                    };
                    let mut vr = SimRng::derive(seed ^ 0x5a5a, op as u64);
                    let v: Vec<u8> = (0..len).map(|_| vr.next_u64() as u8).collect();
                    let d = digest(&v);
                    m.values.insert(d, Arc::new(v.clone()));
                    let flags = match rng.below(4) {
                        0 => XattrFlags {
                            create: true,
                            replace: false,
                        },
                        1 => XattrFlags {
                            create: false,
                            replace: true,
                        },
                        _ => XattrFlags::default(),
                    };
                    set_value = Some(d);
                    fs.setxattr(f, xname.as_bytes(), &v, flags)
                };
                match r {
                    Ok(()) => touched.push(f),
                    // AttrTooBig: a replace of one large value by another needs more log than
                    // a reservation of this small log holds (`FsTx::could_log`).
                    Err(
                        FsError::NoAttr | FsError::Exists | FsError::NoSpace | FsError::AttrTooBig,
                    ) => set_value = None,
                    Err(e) => return Err(format!("op {op}: xattr: {e}")),
                }
            }
            99 | 100 => churn(&fs, &mut rng, op).map_err(|e| format!("op {op}: {e}"))?,
            101 | 102 => {
                // A random valid ACL: an access ACL on any inode (the mode follows it), or a
                // default ACL on a directory (creates below inherit it).
                let all: Vec<u64> = cur.inodes.keys().copied().collect();
                let f = pick(&mut rng, &all);
                let dir = cur.inodes[&f].0 == FileType::Directory;
                let name = if dir && rng.bool() {
                    acl::DEFAULT
                } else {
                    acl::ACCESS
                };
                let r = if rng.chance(1, 5) {
                    fs.removexattr(f, name)
                } else {
                    fs.setxattr(f, name, &random_acl(&mut rng), XattrFlags::default())
                };
                match r {
                    Ok(()) => touched.push(f),
                    Err(FsError::NoAttr | FsError::NoSpace) => {}
                    Err(e) => return Err(format!("op {op}: acl: {e}")),
                }
            }
            103 => {
                // chmod: rewrites an access ACL's mask.
                let all: Vec<u64> = cur.inodes.keys().copied().collect();
                let f = pick(&mut rng, &all);
                let sa = SetAttr {
                    mode: Some(rng.below(0o1000) as u32),
                    ..SetAttr::default()
                };
                fs.setattr(cred, f, sa)
                    .map_err(|e| format!("op {op}: chmod: {e}"))?;
                touched.push(f);
            }
            104 | 105 => {
                // A project on any inode (0 takes it out).
                let all: Vec<u64> = cur.inodes.keys().copied().collect();
                let f = pick(&mut rng, &all);
                match fs.set_project(Cred::ROOT, f, rng.below(3) as u32) {
                    Ok(()) => touched.push(f),
                    Err(FsError::NoSpace) => {}
                    Err(e) => return Err(format!("op {op}: set project: {e}")),
                }
            }
            106 => {
                // A project's limits set or lifted: an xattr of the root.
                let id = 1 + rng.below(2) as u32;
                let n = |rng: &mut SimRng| rng.bool().then(|| 1 + rng.below(1000));
                let limits = cilfs_device::TenantLimits {
                    write_iops: n(&mut rng),
                    write_bytes_per_s: n(&mut rng),
                    read_iops: n(&mut rng),
                    read_bytes_per_s: n(&mut rng),
                };
                match fs.set_tenant_limits(Cred::ROOT, id, limits) {
                    Ok(()) => touched.push(ROOT_INO),
                    Err(FsError::NoSpace) => {}
                    Err(e) => return Err(format!("op {op}: tenant limits: {e}")),
                }
            }
            107 => {
                // Inode flags that forbid nothing (nodump, noatime, sync), set or cleared, and
                // the extent size hint kept, cleared or set (the item changes length): refused,
                // changing nothing, where XFS refuses it (a file with data blocks, a symlink).
                use cilfs_core::fs::items::inode::{INODE_NOATIME, INODE_NODUMP, INODE_SYNC};
                use cilfs_core::fs::types::{ATTR_EXTSIZE, ATTR_EXTSZINHERIT, ATTR_HINT_FLAGS};
                let all: Vec<u64> = cur.inodes.keys().copied().collect();
                let f = pick(&mut rng, &all);
                let bits = [INODE_NODUMP, INODE_NOATIME, INODE_SYNC];
                let flags = bits.iter().filter(|_| rng.bool()).fold(0, |a, b| a | b);
                let now = fs.file_attr(f).map_err(|e| format!("op {op}: {e}"))?;
                let hint_flag = match cur.inodes[&f].0 {
                    FileType::Directory => ATTR_EXTSZINHERIT,
                    _ => ATTR_EXTSIZE,
                };
                let (hint_flags, extsize) = match rng.below(4) {
                    0 => (now.flags & ATTR_HINT_FLAGS, now.extsize),
                    n => (hint_flag, [0, 2, 8][n as usize - 1] * BS),
                };
                let want = cilfs_core::fs::types::FileAttr {
                    flags: flags | hint_flags,
                    project: now.project,
                    extsize,
                };
                match fs.set_file_attr(Cred::ROOT, f, want) {
                    Ok(_) => touched.push(f),
                    Err(FsError::NoSpace | FsError::Invalid(_)) => {}
                    Err(e) => return Err(format!("op {op}: set flags: {e}")),
                }
            }
            108 => {
                // The shutdown ioctl (data and log flushed first), and a mount that recovers.
                for f in open_files.drain(..) {
                    fs.release_inode(f).map_err(|e| e.to_string())?;
                }
                tmpfiles.clear();
                // The other threads stop first: an operation of theirs that returned after the
                // log was forced would be lost, which their model does not follow.
                *mounted.write() = None;
                let began = set.op_count();
                fs.shutdown(cilfs_core::fs::types::ShutdownMode::Default)
                    .map_err(|e| format!("op {op}: shutdown: {e}"))?;
                m.barriers.push((began, set.op_count()));
                if fs.unmount().is_ok() {
                    return Err(format!("op {op}: unmount after a shutdown succeeded"));
                }
                tally(&fs, report);
                drop(fs);
                m.durable.push((set.op_count(), op - 1));
                fs = open_fs(&dev, cfg, cil, &clock)?;
                *mounted.write() = Some(Arc::clone(&fs));
            }
            112..=115 if !files.is_empty() => {
                let f = pick(&mut rng, &files);
                fallocate(&fs, &mut rng, &mut m, f, op).map_err(|e| format!("op {op}: {e}"))?;
                touched.push(f);
            }
            95 => {
                // Clean unmount and mount again.
                for f in open_files.drain(..) {
                    fs.release_inode(f).map_err(|e| e.to_string())?;
                }
                tmpfiles.clear();
                *mounted.write() = None;
                let began = set.op_count();
                fs.unmount().map_err(|e| format!("op {op}: unmount: {e}"))?;
                m.barriers.push((began, set.op_count()));
                tally(&fs, report);
                drop(fs);
                m.durable.push((set.op_count(), op - 1));
                fs = open_fs(&dev, cfg, cil, &clock)?;
                *mounted.write() = Some(Arc::clone(&fs));
            }
            109 | 110 => {
                let d = pick(&mut rng, &dirs);
                if let Some(t) = tmpfile(&fs, &mut m, &mut rng, d, op)? {
                    open_files.push(t);
                    tmpfiles.push(t);
                    touched.push(t);
                }
            }
            111 if !tmpfiles.is_empty() => {
                // A held O_TMPFILE named: linkat.
                let t = tmpfiles[rng.below(tmpfiles.len() as u64) as usize];
                let d = pick(&mut rng, &dirs);
                match fs.link(t, d, &name(rng.below(NAMES))) {
                    Ok(_) => {
                        tmpfiles.retain(|&x| x != t);
                        m.modified.entry(t).or_default().push(op);
                        touched.extend([t, d]);
                    }
                    Err(FsError::Exists | FsError::CrossProject | FsError::NoSpace) => {}
                    Err(e) => return Err(format!("op {op}: link a tmpfile: {e}")),
                }
            }
            _ => {}
        }
        if cilfs_core::fs::stats::transactions_by_this_thread() > tx_before {
            for t in touched {
                m.last_commit.insert(t, op);
            }
        }
        let reused = history.update(&roles(&fs).map_err(|e| format!("op {op}: {e}"))?, report);
        if let (Some(d), false) = (set_value, reused.is_empty()) {
            m.reused_values.insert(d);
        }
        m.states.push(Arc::new(meta_of(&fs, Some(&mut m.values))?));
    }
    *mounted.write() = None;
    tally(&fs, report);
    drop(fs);
    Ok(m)
}

/// A random fallocate of file `f` at operation `op`: preallocation (keeping the size or not),
/// a punched hole, a zeroed range (keeping the size or not), or a collapsed or inserted range
/// of whole blocks (sometimes not whole: EINVAL), each recorded in the model.
fn fallocate(fs: &Fs, rng: &mut SimRng, m: &mut Model, f: u64, op: usize) -> Result<(), String> {
    let bs = u64::from(BS);
    let cred = Cred::ROOT;
    let (mut off, mut len) = (rng.below(FILE_MAX), 1 + rng.below(12 * 1024));
    let mode = rng.below(7);
    if mode >= 5 && !rng.chance(1, 10) {
        (off, len) = (off / bs * bs, len.div_ceil(bs) * bs);
    }
    let keep = matches!(mode, 1 | 2 | 4);
    let r = match mode {
        0 | 1 => fs.fallocate(cred, f, off, len, keep, false),
        2 => fs.fallocate(cred, f, off, len, true, true),
        3 | 4 => fs.zero_range(cred, f, off, len, keep),
        5 => fs.collapse_range(cred, f, off, len),
        _ => fs.insert_range(cred, f, off, len),
    };
    match r {
        Ok(()) => {}
        Err(FsError::Invalid(_) | FsError::NoSpace) => return Ok(()),
        Err(e) => return Err(format!("fallocate mode {mode}: {e}")),
    }
    m.modified.entry(f).or_default().push(op);
    let z = m.zeros.entry(f).or_default();
    let size = z.size;
    match mode {
        2..=4 => {
            // Bytes of the range inside the file may read as zeros from now on.
            let to = (off + len).min(size) as usize;
            if z.since.len() < to {
                z.since.resize(to, usize::MAX);
            }
            for p in off.min(size) as usize..to {
                z.since[p] = z.since[p].min(op);
            }
        }
        5 => {
            z.truncate(size.saturating_sub(len), op);
            m.shifted.entry(f).or_insert(op);
        }
        6 => {
            z.grow(size + len, op);
            m.shifted.entry(f).or_insert(op);
        }
        _ => {}
    }
    if !keep && mode != 5 && mode != 6 {
        z.grow(off + len, op);
    }
    Ok(())
}

/// Where value `b` was written, for a stale-data failure: which file's old block it may be.
fn sources_of(m: &Model, b: u8) -> String {
    let mut v: Vec<String> = m
        .writes
        .iter()
        .flat_map(|(ino, w)| {
            w.iter()
                .filter(|x| x.2 == b)
                .map(move |&(o, l, _)| format!("inode {ino} [{o}, {})", o + l))
        })
        .collect();
    v.extend(side::written_with(&m.side, b));
    v.join(", ")
}

fn tally(fs: &Fs, report: &mut CrashReport) {
    let s = fs.journal().stats();
    report.checkpoints += s.log.checkpoints;
    report.log_bytes += s.log.log_bytes;
    report.data_logged_bytes += fs.stats().data_logged_bytes;
    report.conflicts += fs.stats().conflicts;
}

fn random_fate(rng: &mut SimRng, sectors: usize) -> Survival {
    match rng.below(3) {
        0 => Survival::Lost,
        1 => Survival::Kept,
        _ => Survival::Torn((0..sectors).map(|_| rng.bool()).collect()),
    }
}

fn check_point(
    set: &RecordedSet,
    m: &Model,
    g: usize,
    rng: &mut SimRng,
    cfg: &FsCrashConfig,
    cil: u64,
    counts: &mut (u64, u64),
) -> Result<(), String> {
    // Scheduled, recovery and the checks run on the run's main task alone: every task spawned
    // lives until the end of the run there, and each costs every later step. What is explored
    // is the workload's interleavings, not the checker's.
    let cfg = &FsCrashConfig {
        background: cfg.background && !crate::SCHEDULED,
        ..*cfg
    };
    let images = set.crash_images(g, &mut |_, n| random_fate(rng, n));
    if images.is_empty() {
        return Err("no image".into());
    }
    let dev: Vec<Arc<dyn Device>> = images
        .into_iter()
        .zip(&set.devs)
        .map(|(img, d)| Arc::new(SimDevice::from_image(img, d.len(), 1)) as Arc<dyn Device>)
        .collect();
    let clock = Arc::new(AtomicI64::new(2_000_000_000));
    let fs = open_fs(&dev, cfg, cil, &clock).map_err(|e| format!("recovery failed: {e}"))?;
    let report = check::check(&fs).map_err(|e| format!("check could not run: {e}"))?;
    if !report.is_clean() {
        return Err(format!("check: {}", report.problems.join("; ")));
    }
    let got = meta_of(&fs, None)?;
    let required = m.required_at(g);
    let newest = m.started_by(g);
    let Some(k) = (required..=newest.min(m.states.len() - 1))
        .rev()
        .find(|&k| *m.states[k] == got)
    else {
        let any = m.states.iter().position(|s| **s == got);
        let names_only = (required..=newest.min(m.states.len() - 1))
            .find(|&k| m.states[k].entries == got.entries && m.states[k].inodes == got.inodes);
        return Err(match (any, names_only) {
            (Some(k), _) => format!("recovered the namespace after operation {k}, but operations up to {required} were durable (newest possible {newest})"),
            (None, Some(k)) => format!("the names match operation {k} but xattrs differ: {}", xattr_diff(&m.states[k], &got)),
            (None, None) => format!("recovered a namespace that no prefix of operations produced (durable up to {required}, newest possible {newest})"),
        });
    };
    side::check_side(&fs, &m.side, &m.barriers, g, cfg.data)?;
    // Xattrs: the digests matched; compare each value byte for byte with the one set.
    for ((ino, n), d) in &got.xattrs {
        let v = fs
            .getxattr(*ino, n)
            .map_err(|e| format!("getxattr {ino}: {e}"))?;
        let want = m.values.get(d).ok_or_else(|| {
            format!(
                "inode {ino}: xattr {} holds a value never set",
                String::from_utf8_lossy(n)
            )
        })?;
        if v != **want {
            return Err(format!(
                "inode {ino}: xattr {} differs from the value set",
                String::from_utf8_lossy(n)
            ));
        }
        counts.0 += 1;
        if m.reused_values.contains(d) {
            counts.1 += 1;
        }
    }
    // Contents: fsynced and untouched since, exact; ordered mode, nothing never written.
    for (at, ino, op, c) in &m.synced {
        if *at > g || !got.inodes.contains_key(ino) {
            continue;
        }
        let touched_after = m
            .modified
            .get(ino)
            .is_some_and(|v| v.iter().any(|&o| o > *op && o <= newest));
        if touched_after || k < *op {
            continue;
        }
        let now = contents(&fs, *ino)?;
        if now != **c {
            return Err(format!("inode {ino} fsynced at operation {op} and not changed since: contents differ after recovery"));
        }
    }
    if cfg.data == DataMode::Ordered {
        for (&ino, &(kind, ..)) in &got.inodes {
            if kind != FileType::Regular {
                continue;
            }
            let c = contents(&fs, ino)?;
            let writes = m.writes.get(&ino).map(Vec::as_slice).unwrap_or(&[]);
            let zeros = m.zeros.get(&ino);
            if m.shifted.get(&ino).is_some_and(|&s| s <= newest) {
                if let Some(p) = c
                    .iter()
                    .position(|&b| b != 0 && !writes.iter().any(|w| w.2 == b))
                {
                    return Err(format!(
                        "inode {ino} byte {p} is {:#x}, a value never written to it (stale data)",
                        c[p]
                    ));
                }
                continue;
            }
            for (p, &b) in c.iter().enumerate() {
                if b == 0 && !zeros.is_some_and(|z| z.zero_ok(p, newest)) {
                    return Err(format!(
                        "inode {ino} byte {p} reads zero, a byte it never held as zero by operation {newest} (a size logged ahead of its data)"
                    ));
                }
                let p = p as u64;
                if b != 0
                    && !writes
                        .iter()
                        .any(|&(o, l, v)| v == b && p >= o && p < o + l)
                {
                    return Err(format!(
                        "inode {ino} byte {p} is {b:#x}, a value never written there (stale data); written elsewhere: {}",
                        sources_of(m, b)
                    ));
                }
            }
        }
    }
    for (at, ino, v, c) in &m.queried {
        if *at > g || !got.inodes.contains_key(ino) {
            continue;
        }
        let now = contents(&fs, *ino)?;
        let after = fs.change_attr(*ino).map_err(|e| e.to_string())?;
        if now != **c && after <= *v {
            return Err(format!("inode {ino}: contents changed but the change attribute {after} is not above {v} read before the crash"));
        }
    }
    Ok(())
}

pub fn run_fs_crashtest(
    cfg: &FsCrashConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> CrashReport {
    let mut report = CrashReport::default();
    let mut run = cfg.only_run.unwrap_or(0);
    while report.passed + report.failed < cfg.points {
        if cfg.only_run.is_some_and(|r| r != run) {
            break;
        }
        let run_seed = SimRng::derive(cfg.seed, run).next_u64();
        let todo = POINTS_PER_RUN.min(cfg.points - report.passed - report.failed);
        let c = *cfg;
        match crate::recorded::scheduled(run_seed, move || one_run(&c, run, run_seed, todo)) {
            Ok(r) => report.merge(r),
            Err(e) => {
                report.runs += 1;
                report.failed += 1;
                report
                    .failures
                    .push(format!("run {run} (seed {run_seed}): {e}"));
            }
        }
        progress(report.passed + report.failed, cfg.points);
        run += 1;
    }
    report
}

/// Run `run` of the seed: its workload, then `todo` crash points.
fn one_run(cfg: &FsCrashConfig, run: u64, run_seed: u64, todo: usize) -> CrashReport {
    let mut report = CrashReport {
        runs: 1,
        ..CrashReport::default()
    };
    let cil = CIL_LIMITS[(run % CIL_LIMITS.len() as u64) as usize];
    let (set, model) = match workload(run_seed, cfg, cil, &mut report) {
        Ok(w) => w,
        Err(e) => {
            report.failed += 1;
            report
                .failures
                .push(format!("run {run} (seed {run_seed}): workload failed: {e}"));
            return report;
        }
    };
    report.traces.push(set.fingerprint());
    let n = set.op_count();
    let durability = set.durability_points();
    let mut rng = SimRng::derive(run_seed, 1);
    for _ in 0..todo {
        let g = pick_crash_point(&mut rng, &durability, n);
        let mut counts = (0, 0);
        match check_point(&set, &model, g, &mut rng, cfg, cil, &mut counts) {
            Ok(()) => {
                report.passed += 1;
                report.xattr_values_checked += counts.0;
                report.xattr_values_in_reused_blocks += counts.1;
            }
            Err(e) => {
                report.failed += 1;
                report.failures.push(format!(
                    "run {run} (seed {run_seed}) crash after device operation {g} of {n}: {e}"
                ));
            }
        }
    }
    report
}

/// A valid ACL in xattr form: owner, up to three named users, owning group, up to two named
/// groups, a mask whenever something is named (sometimes also without), other.
fn random_acl(rng: &mut SimRng) -> Vec<u8> {
    let mut e: Vec<(u16, u16, u32)> = vec![(acl::USER_OBJ, rng.below(8) as u16, u32::MAX)];
    let users = rng.below(4);
    for i in 0..users {
        e.push((acl::USER, rng.below(8) as u16, 1000 + i as u32 * 7));
    }
    e.push((acl::GROUP_OBJ, rng.below(8) as u16, u32::MAX));
    let groups = rng.below(3);
    for i in 0..groups {
        e.push((acl::GROUP, rng.below(8) as u16, 100 + i as u32));
    }
    if users + groups > 0 || rng.bool() {
        e.push((acl::MASK, rng.below(8) as u16, u32::MAX));
    }
    e.push((acl::OTHER, rng.below(8) as u16, u32::MAX));
    let mut v = 2u32.to_le_bytes().to_vec();
    for (t, p, i) in e {
        v.extend_from_slice(&t.to_le_bytes());
        v.extend_from_slice(&p.to_le_bytes());
        v.extend_from_slice(&i.to_le_bytes());
    }
    v
}

fn xattr_diff(want: &Meta, got: &Meta) -> String {
    let mut out = Vec::new();
    for (k, d) in &want.xattrs {
        match got.xattrs.get(k) {
            None => out.push(format!(
                "inode {} lost {}",
                k.0,
                String::from_utf8_lossy(&k.1)
            )),
            Some(g) if g != d => out.push(format!(
                "inode {} {} has another value",
                k.0,
                String::from_utf8_lossy(&k.1)
            )),
            Some(_) => {}
        }
    }
    for k in got.xattrs.keys().filter(|k| !want.xattrs.contains_key(*k)) {
        out.push(format!(
            "inode {} gained {}",
            k.0,
            String::from_utf8_lossy(&k.1)
        ));
    }
    out.join(", ")
}
