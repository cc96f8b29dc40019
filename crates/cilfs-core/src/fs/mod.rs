//! The filesystem layer: inodes, directories, extents and xattrs as items of one B+tree of
//! journaled metadata blocks (the fs tree), free space in two more trees, file data written in
//! place. Every metadata change is one journal transaction ([`txn::FsTx`]). POSIX-shaped
//! operations return typed errors; the FUSE adapter only translates.
//!
//! Concurrency: one reader-writer lock over the filesystem state (the header, the inode cache,
//! the page cache). Creates, unlinks, links and setattr's mode, owner and times build their
//! transaction without it and take it shared to check and publish, side by side
//! (`shared_tx.rs`); other changes take it exclusively, lookups share it; no data IO happens
//! under it:
//! data IO runs under the inode's own IO lock (`cache/iolock.rs`) only, with the blocks it writes
//! reserved but not yet mapped. Log forces (fsync) run outside it. docs/ARCHITECTURE.md has the
//! lock table.
//!
//! Layout: `posix/` holds the operations a request reaches, one file per family; `txn/` the
//! tree-transaction API; `items/` the items' encodings; `tree/` the B+tree; `space/` free
//! space, inode numbers and each file's block map; `cache/` what is kept in memory (inodes,
//! pages, IO locks); `rules/` pure POSIX rules; `tests/` the tests, by subject. The checker
//! (`crate::check`) is built on this layer, never called by it.

pub mod cache;
pub mod error;
pub mod items;
pub mod mkfs;
mod posix;
pub mod rules;
pub mod space;
pub mod stats;
pub mod tenant;
pub mod tree;
pub mod txn;
pub mod types;

pub use error::{FsError, FsResult};
pub use items::dir::DirEntry;
pub use items::inode::{Attr, FileType, Inode, Timespec, ROOT_INO};
pub use stats::FsStats;

/// The smallest log in which every operation fits one reservation on a filesystem of
/// `block_size`-byte blocks. The largest reservation is a quarter of the log's capacity
/// (`Journal::max_reservation_bytes`), and the capacity is at least three quarters of the log
/// whatever iclogs a mount picks (two of them are kept back, and the log must hold four rings
/// of them).
pub fn min_log_bytes(block_size: u32) -> u64 {
    (largest_reservation_bytes(block_size) * 16).div_ceil(3)
}

/// The reservation the largest change on `block_size`-byte blocks needs
/// (`posix::xattr::largest_change_buffers`).
fn largest_reservation_bytes(block_size: u32) -> u64 {
    let buffers = posix::xattr::largest_change_buffers(block_size);
    crate::trans::Reservation::for_buffers(buffers, block_size).unit_bytes
}

use crate::journal::Journal;
use items::header::{Header, TREE_FS};
use rules::change::ChangeCounter;
use tree::keys::{key, KIND_INODE};
use txn::busy::{Busy, BusyGuard};

use crate::util::lockstat::{LockWaitStats, LockWaits};
use crate::util::sync::{
    rank, RankedMutex, RankedMutexGuard, RankedReadGuard, RankedRwLock, RankedWriteGuard,
};
use cache::inode_cache::{AllShards, InodeCache, InodeMap};
use std::sync::Arc;
use txn::{FsTx, ReadView, TreeRead};

/// How the change attribute is maintained (docs/journal.md section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IversionMode {
    /// Bump only when queried since the last bump, or when the inode is logged anyway.
    #[default]
    Lazy,
    /// Bump and log on every change.
    Eager,
}

/// Data ordering (docs/journal.md section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataMode {
    /// Newly allocated blocks are written before the transaction that maps them commits.
    #[default]
    Ordered,
    Writeback,
}

/// When reads and readdir update atime (the `noatime`, `relatime` and `strictatime` mount
/// options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimeMode {
    Never,
    /// Linux's default: when atime is not after mtime or ctime, or is a day old.
    #[default]
    Relative,
    Strict,
}

/// Which changes are forced to the log before the operation returns (the `sync` and
/// `dirsync` mount options); the rest become stable with the next checkpoint, fsync or sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    #[default]
    None,
    /// Every transaction that changes a directory (creates, links, unlinks, renames, and any
    /// change of a directory's own attributes).
    Dirs,
    /// Every transaction. File data written into the page cache is not a transaction: the
    /// kernel sends an fsync after each write on a `sync` mount (MS_SYNCHRONOUS).
    All,
}

pub type Clock = Arc<dyn Fn() -> Timespec + Send + Sync>;
/// Told of an inode whose attributes changed beyond what the reply to the operation shows.
pub type AttrsChanged = Arc<dyn Fn(u64) + Send + Sync>;
/// The groups of a process, by pid: its filesystem gid and supplementary groups (the FUSE
/// adapter reads them from /proc).
pub type GroupsOf = Arc<dyn Fn(u32) -> Vec<u32> + Send + Sync>;
/// Whether process `pid`, running as filesystem uid `uid`, holds CAP_FSETID (the FUSE adapter
/// reads it from /proc); `None` when that cannot be told (the process is gone).
pub type HoldsFsetid = Arc<dyn Fn(u32, u32) -> Option<bool> + Send + Sync>;
/// Whether process `pid` holds capability `cap` in the initial user namespace (the FUSE
/// adapter reads its effective set from /proc); `None` when that cannot be told. Asked only
/// for callers a request does not name (`Caller::KernelChecked`).
pub type Capable = Arc<dyn Fn(u32, types::Capability) -> Option<bool> + Send + Sync>;

#[derive(Clone)]
pub struct FsOptions {
    pub iversion: IversionMode,
    /// Timestamp granularity in nanoseconds [default 1 ms].
    pub tsgran_ns: u32,
    pub data: DataMode,
    pub read_only: bool,
    /// Time source (tests use a controlled clock).
    pub clock: Clock,
    /// Inodes kept in memory before unopened ones are dropped [default: what a sixty-fourth of
    /// the machine's memory holds, 200,000..4,000,000].
    pub inode_cache_max: usize,
    /// File data pages kept in memory (half of it may be dirty) [default 256 MiB].
    pub page_cache_bytes: u64,
    /// When reads update atime [default relatime].
    pub atime: AtimeMode,
    /// Keep timestamp updates (atime by reads, mtime and ctime by writes into blocks the file
    /// owns) in memory until the inode is logged for another reason, fsync, write back or
    /// unmount, instead of logging each (the `lazytime` mount option) [default off].
    pub lazytime: bool,
    /// Called (outside the filesystem lock) when a write or fallocate cleared set-user-ID or
    /// set-group-ID: the kernel caches the mode and learns of the change from no reply, so
    /// the FUSE adapter invalidates its copy [default: nobody].
    pub attrs_changed: Option<AttrsChanged>,
    /// The groups of a caller's process, for the set-group-ID rules [default: none known].
    pub groups_of: Option<GroupsOf>,
    /// Whether a caller holds CAP_FSETID, which keeps set-user-ID and set-group-ID through
    /// changes of the data [default: root does, nobody else].
    pub holds_fsetid: Option<HoldsFsetid>,
    /// The capabilities of a caller the request does not name [default: none known, so such
    /// a caller is refused what needs one].
    pub capable: Option<Capable>,
    /// POSIX ACLs stored and inherited; without, their xattrs are refused [default on].
    pub acl: bool,
    /// Whether a readdir moves the directory's atime as `atime` says (`diratime`), or never
    /// (`nodiratime`) [default on].
    pub diratime: bool,
    /// Changes forced before the operation returns [default none].
    pub sync: SyncMode,
    /// Time source of the tenants' IO limits (tests use a virtual clock) [default: the
    /// system's].
    pub io_clock: Option<Arc<dyn cilfs_device::Clock>>,
    /// An fsync whose file has at most this many bytes of dirty pages puts them in the log
    /// with its checkpoint instead of writing them in place first, so that it costs one log
    /// write and no data-device flush before it; 0 writes everything in place (the
    /// `logdata` mount option) [default 64 KiB].
    pub log_data_max: u64,
    /// Buffered writes into holes only promise blocks; write back chooses them, writes the
    /// data and maps it written in one transaction (`space/delalloc.rs`). Off (`nodelalloc`),
    /// such a write maps its blocks unwritten in a transaction of its own [default on].
    pub delalloc: bool,
}

impl std::fmt::Debug for FsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsOptions")
            .field("iversion", &self.iversion)
            .field("tsgran_ns", &self.tsgran_ns)
            .field("data", &self.data)
            .field("read_only", &self.read_only)
            .field("atime", &self.atime)
            .field("lazytime", &self.lazytime)
            .field("acl", &self.acl)
            .field("diratime", &self.diratime)
            .field("sync", &self.sync)
            .field("log_data_max", &self.log_data_max)
            .field("delalloc", &self.delalloc)
            .finish()
    }
}

/// The default inode cache: a sixty-fourth of the machine's memory (384 MiB, 1.5 million
/// inodes, on 24 GiB), at least the 200,000 that used to be fixed. Inodes that fall out are read
/// back through the tree, which costs a lookup in a million-entry directory a second descent.
pub fn default_inode_cache_max() -> usize {
    // An entry with its share of the hash table, and room for the inode's heap parts.
    let per_entry = (std::mem::size_of::<(u64, InodeMem)>() + 64) as u64;
    let n = crate::util::memory::total_bytes() / 64 / per_entry;
    usize::try_from(n)
        .unwrap_or(usize::MAX)
        .clamp(200_000, 4_000_000)
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            iversion: IversionMode::Lazy,
            tsgran_ns: 1_000_000,
            data: DataMode::Ordered,
            read_only: false,
            clock: Arc::new(Timespec::now),
            inode_cache_max: default_inode_cache_max(),
            page_cache_bytes: 256 << 20,
            atime: AtimeMode::Relative,
            lazytime: false,
            attrs_changed: None,
            groups_of: None,
            holds_fsetid: None,
            capable: None,
            acl: true,
            diratime: true,
            sync: SyncMode::None,
            io_clock: None,
            log_data_max: DEFAULT_LOG_DATA_MAX,
            delalloc: true,
        }
    }
}

/// `FsOptions::log_data_max` by default: as ZFS's intent log writes up to 32 KiB of a
/// synchronous write into the log, a few blocks of small files and appends.
pub const DEFAULT_LOG_DATA_MAX: u64 = 64 << 10;

/// An inode in memory: the authoritative copy while cached (changes happen under the
/// filesystem's write lock), its change counter, and who holds it open.
/// The inodes in memory, each boxed: growing the table moves 16 bytes an entry instead of a
/// whole inode, and it grows under the exclusive state lock (a doubling at a million inodes
/// moved some 200 MB there, 8% of a two-thread create run).
pub(crate) type InodeTable = crate::util::numhash::NumberMap<Box<InodeMem>>;

#[derive(Debug)]
pub(crate) struct InodeMem {
    pub inode: Inode,
    pub change: ChangeCounter,
    /// Open handles: an unlinked inode lives until the last one is released.
    pub open: u32,
    /// The checkpoint holding the last change of this inode (what fsync forces).
    pub last_seq: u64,
    /// The checkpoint holding the last change fdatasync must make stable: anything but a
    /// change of timestamps and change counter alone (`InodeMem::committed`).
    pub last_data_seq: u64,
    /// The in-memory inode is ahead of the log (a size grown by a write, not yet logged).
    pub unlogged: bool,
    /// File-block ranges `[a, b)` that writes mapped past the end of the file for the
    /// appends to come (speculative preallocation, `posix/write.rs`), noted once the write mapped
    /// them: the last release frees what of them is still past the end, as XFS trims its
    /// post-EOF blocks at close. Only these: a fallocate takes its range out of them, so
    /// blocks it asked for stay.
    pub spec_prealloc: Vec<(u64, u64)>,
    /// Read from disk with blocks and no `INODE_PREALLOC`: blocks past its end may be
    /// speculative preallocation an earlier mount left (`Inode::may_hold_stale_prealloc`),
    /// which the next last release looks for and frees.
    pub stale_prealloc: bool,
    /// An optimistic commit that frees this inode (an unlink of its last name, nobody holding
    /// it) passed its check and has not yet published or let go: nobody may open it
    /// meanwhile (`open_inode` waits), as its check found it unopened. Such an entry may
    /// stand for an inode not otherwise in memory; it is never trimmed.
    pub freeing: bool,
}

impl InodeMem {
    /// `inode` as read from the tree, just loaded.
    pub(crate) fn loaded(inode: Inode) -> Self {
        InodeMem {
            change: ChangeCounter::loaded(inode.change),
            stale_prealloc: inode.may_hold_stale_prealloc(),
            inode,
            open: 0,
            last_seq: 0,
            last_data_seq: 0,
            unlogged: false,
            spec_prealloc: Vec::new(),
            freeing: false,
        }
    }

    /// Notes that checkpoint `seq` holds a change of this inode; `data`: one fdatasync must
    /// make stable (anything but timestamps and the change counter alone, which fdatasync
    /// leaves to the next fsync or checkpoint, as XFS and ext4 do).
    pub(crate) fn committed(&mut self, seq: u64, data: bool) {
        self.last_seq = self.last_seq.max(seq);
        if data {
            self.last_data_seq = self.last_data_seq.max(seq);
        }
    }
}

/// What the state lock (`Fs::state`) guards. Under it exclusive, code reaches the header and
/// the inode cache through `get_mut` and `InodeCache::all`, at no cost; under it shared,
/// optimistic publishes change them side by side (`shared_tx.rs`), so anyone else holding it
/// shared locks them for a moment (`Fs::hdr`, `InodeCache::lock`), never while waiting for
/// anything else.
#[derive(Debug)]
pub(crate) struct FsState {
    pub hdr: RankedMutex<Header, { rank::HDR }>,
    pub inodes: InodeCache,
    pub cache: cache::pagecache::PageCache,
}

#[derive(Debug)]
pub struct Fs {
    pub(crate) journal: Arc<Journal>,
    pub(crate) hdr_blk: u64,
    pub(crate) state: RankedRwLock<FsState, { rank::STATE }>,
    pub(crate) busy: Busy,
    /// Inode numbers for new inodes (runs per directory).
    pub(crate) inos: space::ino_alloc::InoAlloc,
    /// Per-inode IO locks, held across data IO (before `state` in the lock order).
    pub(crate) io: cache::iolock::IoLocks,
    /// Per-project limits on file data IO (`tenant.rs`).
    pub(crate) throttle: Arc<cilfs_device::Throttle<Arc<dyn cilfs_device::Device>>>,
    /// Contention on `state` (shared and exclusive) and `busy` (the lock table).
    pub(crate) state_read_waits: LockWaits,
    pub(crate) state_write_waits: LockWaits,
    pub(crate) busy_waits: LockWaits,
    /// Publishes under the shared state lock take their turn here, for their header merge
    /// and CIL insert only: both then happen in one order (`shared_tx.rs`).
    pub(crate) publishing: crate::util::adaptive::AdaptiveMutex,
    pub(crate) publish_waits: LockWaits,
    /// Bumped by every publish under the shared lock that moves a tree's root, before the
    /// header shows the new one: a reader under that lock that began from the old root
    /// finds out and runs again (`ReadView`).
    pub(crate) roots_moved: std::sync::atomic::AtomicU64,
    /// Contention on the header's lock inside `state` (the inode cache counts its own).
    pub(crate) hdr_waits: LockWaits,
    pub(crate) opts: FsOptions,
    /// Read-only now: `opts.read_only`, or switched at runtime (`set_read_only`, a remount).
    pub(crate) read_only: std::sync::atomic::AtomicBool,
    pub(crate) bs: u32,
    /// Raised by every recovery; folded into the change attribute users see.
    pub(crate) epoch: u64,
    pub(crate) stats: stats::FsCounters,
    /// Inodes with file data written in place that no data-device flush since is known to
    /// cover: fsync flushes for those only (`posix/sync.rs`); one whose data all went into
    /// the log needs none. A leaf lock.
    pub(crate) unflushed: cilfs_sync::Mutex<std::collections::HashSet<u64>>,
    /// Orphans reclaimed, and their waiters (`posix/open.rs` `once_more_after_releases`). A
    /// leaf lock.
    pub(crate) orphans_reclaimed: (cilfs_sync::Mutex<u64>, cilfs_sync::Condvar),
}

/// Registers the read and write verifiers of the blocks the filesystem stamps (tree nodes and
/// the header) with the journal (`Journal::register_block_check`).
pub(crate) fn register_block_checks(journal: &Journal) {
    journal.register_block_check(tree::node::NODE_LSN_OFFSET, tree::node::verify_node);
    journal.register_block_check(items::header::HEADER_LSN_OFFSET, verify_header);
}

/// The structure check of the header block: it decodes.
fn verify_header(block: &[u8], blkno: u64) -> Result<(), String> {
    match Header::decode(block, blkno) {
        Ok(_) => Ok(()),
        Err(FsError::Corrupt { what, .. }) => Err(what),
        Err(e) => Err(e.to_string()),
    }
}

/// The change attribute users see: the unclean-mount epoch above the counter, so a value
/// returned before a crash is never returned again after it.
pub fn visible_change(epoch: u64, counter: u64) -> u64 {
    (epoch << 44) + counter
}

impl Fs {
    /// Mounts the filesystem on an open journal (which has recovered the log): reads the header
    /// and frees the inodes an earlier mount left orphaned.
    pub fn open(journal: Arc<Journal>, opts: FsOptions) -> FsResult<Arc<Fs>> {
        let bs = journal.block_size();
        let (first, _) = journal.metadata_area();
        register_block_checks(&journal);
        if largest_reservation_bytes(bs) > journal.max_reservation_bytes() {
            // A log made by an older mkfs on large blocks, or a small test log: an xattr
            // value too large for a reservation is refused (E2BIG), and any other change
            // that outgrew one would shut the journal down rather than overrun the tail.
            tracing::warn!(
                "the log holds reservations of {} bytes, less than the largest change on \
                 {bs}-byte blocks needs: large xattr values will be refused; a log of {} \
                 bytes or more has room",
                journal.max_reservation_bytes(),
                min_log_bytes(bs)
            );
        }
        let hdr = {
            let buf = journal.buf(first)?;
            let g = buf.read();
            // Decoded first: a block that holds no header at all says so (mkfs interrupted,
            // another filesystem) rather than failing its stamp.
            let hdr = Header::decode(&g.data, first)?;
            journal.verify_read(&buf, &g, items::header::HEADER_LSN_OFFSET)?;
            hdr
        };
        // The superblock and the header must agree on the data area: blocks past the device's
        // end, or a header that reaches them, would fail or land elsewhere at random.
        let (_, end) = journal.metadata_area();
        if hdr.data_start != first + 1 || hdr.data_end != end {
            return Err(FsError::corrupt(
                first,
                format!(
                    "the header's data area is blocks {}..{}, the superblock's {}..{end}: one \
                     of them is damaged",
                    hdr.data_start,
                    hdr.data_end,
                    first + 1
                ),
            ));
        }
        let epoch = journal.superblock().unclean_epoch;
        let journal_data = Arc::clone(&journal.data);
        let inos = space::ino_alloc::InoAlloc::new(hdr.next_ino);
        let fs = Arc::new(Fs {
            journal,
            hdr_blk: first,
            state: RankedRwLock::new(FsState {
                hdr: RankedMutex::new(hdr),
                inodes: InodeCache::new(opts.inode_cache_max),
                cache: cache::pagecache::PageCache::new(opts.page_cache_bytes, bs),
            }),
            busy: Busy::default(),
            inos,
            io: cache::iolock::IoLocks::new(),
            throttle: cilfs_device::Throttle::with_clock(
                Arc::clone(&journal_data),
                opts.io_clock
                    .clone()
                    .unwrap_or_else(|| Arc::new(cilfs_device::SystemClock::default())),
            ),
            state_read_waits: LockWaits::new("fs state (shared)"),
            state_write_waits: LockWaits::new("fs state (exclusive)"),
            busy_waits: LockWaits::new("busy extents"),
            publish_waits: LockWaits::new("publish turn"),
            publishing: crate::util::adaptive::AdaptiveMutex::new(),
            roots_moved: std::sync::atomic::AtomicU64::new(0),
            hdr_waits: LockWaits::new("header"),
            read_only: std::sync::atomic::AtomicBool::new(opts.read_only),
            opts,
            bs,
            epoch,
            unflushed: Default::default(),
            orphans_reclaimed: Default::default(),
            stats: stats::FsCounters::default(),
        });
        if !fs.opts.read_only {
            fs.reclaim_orphans()?;
        }
        // A read-only open (check, a read-only mount) goes on without the limits when the
        // root's xattrs do not read: the damage is check's to report, and every other file's
        // to keep working around.
        match fs.load_tenant_limits() {
            Err(FsError::Corrupt { blkno, what }) if fs.opts.read_only => {
                tracing::warn!("tenant limits not loaded: block {blkno}: {what}")
            }
            r => r?,
        }
        Ok(fs)
    }

    /// The filesystem state, shared; counted in the lock table.
    pub(crate) fn read_state(&self) -> RankedReadGuard<'_, FsState, { rank::STATE }> {
        self.state.read_counted(&self.state_read_waits)
    }

    /// The filesystem state, exclusive; counted in the lock table.
    pub(crate) fn write_state(&self) -> RankedWriteGuard<'_, FsState, { rank::STATE }> {
        self.state.write_counted(&self.state_write_waits)
    }

    /// The busy extents; counted in the lock table.
    pub(crate) fn lock_busy(&self) -> BusyGuard<'_> {
        self.busy.lock_counted(&self.busy_waits)
    }

    /// The header, locked for a moment (the state lock held shared); counted in the lock table.
    pub(crate) fn hdr<'s>(&self, st: &'s FsState) -> RankedMutexGuard<'s, Header, { rank::HDR }> {
        st.hdr.lock_short(&self.hdr_waits)
    }

    /// Every lock of the lock table with its contention so far (what `cilfs bench fs` reports).
    pub fn lock_waits(&self) -> Vec<LockWaitStats> {
        // One hold: a second shared hold by this thread would wait behind a queued writer
        // while this one keeps that writer waiting.
        let st = self.read_state();
        vec![
            self.io.waits.snapshot(),
            self.state_read_waits.snapshot(),
            self.state_write_waits.snapshot(),
            self.busy_waits.snapshot(),
            self.publish_waits.snapshot(),
            self.hdr_waits.snapshot(),
            st.inodes.waits.snapshot(),
            st.cache.waits.snapshot(),
            self.journal.buf_waits.snapshot(),
            self.journal.cil_waits.snapshot(),
            self.journal.space_waits.snapshot(),
            self.journal.grant.waits.snapshot(),
        ]
    }

    pub fn journal(&self) -> &Arc<Journal> {
        &self.journal
    }

    pub fn block_size(&self) -> u32 {
        self.bs
    }

    /// Levels of the filesystem tree (directory entries and inodes): the nodes a point lookup
    /// visits.
    pub fn tree_levels(&self) -> u8 {
        let st = self.read_state();
        let level = self.hdr(&st).root(TREE_FS).level;
        level + 1
    }

    pub fn options(&self) -> &FsOptions {
        &self.opts
    }

    pub(crate) fn now(&self) -> Timespec {
        (self.opts.clock)().truncated(self.opts.tsgran_ns)
    }

    /// Whether changes are refused now (mounted `ro`, or switched by a remount).
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn check_writable(&self) -> FsResult<()> {
        if self.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        // After a shutdown nothing changes, not even in memory (EIO, as XFS).
        if self.journal.is_shut_down() {
            return Err(FsError::Journal(crate::journal::JournalError::Shutdown));
        }
        Ok(())
    }

    /// Whether the filesystem is shut down (an IO error, or `Fs::shutdown`): every request
    /// fails with EIO until the unmount, and the next mount recovers from the log.
    pub fn is_shut_down(&self) -> bool {
        self.journal.is_shut_down()
    }

    /// Whether it was shut down by `Fs::shutdown`, the shutdown ioctl.
    pub fn is_shut_down_on_request(&self) -> bool {
        self.journal.is_shut_down_on_request()
    }

    /// Starts a transaction on the state held under the write lock.
    pub(crate) fn begin<'a>(&'a self, st: &FsState) -> FsResult<FsTx<'a>> {
        FsTx::begin_copying(&self.journal, || self.hdr(st), self.hdr_blk, &self.busy)
    }

    /// Commits and adopts the transaction's header.
    pub(crate) fn commit(&self, st: &mut FsState, t: FsTx<'_>) -> FsResult<u64> {
        let (seq, hdr) = t.commit()?;
        txn::retry::committed();
        let h = st.hdr.get_mut();
        if h.roots() != hdr.roots() {
            // No reader runs beside this commit, but a view must never trust roots copied
            // before it (`ReadView`'s `Reshape`).
            self.roots_moved
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        *h = hdr;
        stats::count_transaction(&self.stats);
        Ok(seq)
    }

    /// Runs `f` in a transaction and commits it. `f` returns its result and the inodes it
    /// changed (their `last_seq` becomes the commit's checkpoint, for fsync). An error after
    /// changes were logged shuts the journal down: the half-done change is never written.
    pub(crate) fn with_tx<R>(
        &self,
        st: &mut FsState,
        f: impl FnOnce(&mut FsTx<'_>, &mut AllShards<'_>) -> FsResult<(R, Vec<u64>)>,
    ) -> FsResult<(R, u64)> {
        self.with_tx_sync(st, true, f)
    }

    /// `with_tx`; `may_force` false exempts it from `sync` and `dirsync` (an atime update is
    /// no change: Linux's sync mounts leave it asynchronous too).
    pub(crate) fn with_tx_sync<R>(
        &self,
        st: &mut FsState,
        may_force: bool,
        f: impl FnOnce(&mut FsTx<'_>, &mut AllShards<'_>) -> FsResult<(R, Vec<u64>)>,
    ) -> FsResult<(R, u64)> {
        // Changes asked for are refused at their entry points (`check_writable`); a runtime
        // read-only switch writes back through here before the journal refuses everything.
        if self.opts.read_only {
            return Err(FsError::ReadOnly);
        }
        st.inodes.all().for_each_table(|t| {
            self.trim_cache(t);
        });
        let mut t = self.begin(st)?;
        match f(&mut t, &mut st.inodes.all()) {
            Ok((r, touched)) => {
                let seq = self.commit(st, t)?;
                let mut inodes = st.inodes.all();
                for &ino in &touched {
                    if let Some(m) = inodes.get_mut(&ino) {
                        m.committed(seq, true);
                    }
                }
                if may_force {
                    self.force_if_sync(seq, || {
                        touched
                            .iter()
                            .any(|i| inodes.get(i).is_some_and(|m| m.inode.is_dir()))
                    })?;
                }
                Ok((r, seq))
            }
            Err(e) => {
                if t.tx.logged_buffers() == 0 {
                    drop(t);
                    Err(e)
                } else {
                    Err(t.abort(e))
                }
            }
        }
    }

    /// An inode, from the cache or read through `t` (a transaction or a read view).
    pub(crate) fn inode_mut<'m>(
        t: &mut dyn TreeRead,
        inodes: &'m mut dyn InodeMap,
        ino: u64,
    ) -> FsResult<&'m mut InodeMem> {
        if !inodes.contains_key(&ino) {
            let inode = read_inode(t, ino)?;
            inodes.insert(ino, Box::new(InodeMem::loaded(inode)));
        }
        match inodes.get_mut(&ino) {
            Some(m) => Ok(m),
            None => unreachable!("inserted above"),
        }
    }

    /// A `sync` mount's force of checkpoint `seq`, or a `dirsync` mount's when a directory
    /// changed (`dir_changed`, asked only then). The operation is not over until its change is
    /// on disk, but the force waits outside the state lock when it runs through `retrying`.
    pub(crate) fn force_if_sync(
        &self,
        seq: u64,
        dir_changed: impl FnOnce() -> bool,
    ) -> FsResult<()> {
        let force = match self.opts.sync {
            SyncMode::None => false,
            SyncMode::All => true,
            SyncMode::Dirs => dir_changed(),
        };
        if force && seq > self.journal.completed_seq() && !txn::retry::owe_force(seq) {
            self.journal.force(seq)?;
        }
        Ok(())
    }

    /// Loads an inode into the cache outside a transaction (write lock held).
    pub(crate) fn load<'s>(&self, st: &'s mut FsState, ino: u64) -> FsResult<&'s mut InodeMem> {
        let FsState { hdr, inodes, .. } = st;
        let mut v = ReadView::new(&self.journal, hdr.get_mut().roots());
        Self::inode_mut(&mut v, inodes.shard_mut(ino), ino)
    }

    /// Reads an inode without caching it (read paths under the shared lock).
    pub(crate) fn peek_inode(&self, st: &FsState, ino: u64) -> FsResult<Inode> {
        if let Some(m) = st.inodes.lock(ino).get(&ino) {
            return Ok(m.inode.clone());
        }
        let mut v = self.view(st);
        read_inode(&mut v, ino)
    }

    /// Drops cached inodes nobody holds open once the cache is over its limit. Safe for the
    /// change attribute: a reloaded inode starts queried. Runs on one shard of the cache
    /// (`InodeCache`), against its share of the limit; returns an inode it dropped, if any
    /// (for `InodeCache::removed`). An orphan stays: its last release's reclaim looks for it
    /// in memory.
    fn trim_cache(&self, inodes: &mut InodeTable) -> Option<u64> {
        let max = cache::inode_cache::shard_max(self.opts.inode_cache_max);
        if inodes.len() < max {
            return None;
        }
        let completed = self.journal.completed_seq();
        let target = max / 4 * 3;
        let excess = inodes.len() - target;
        let victims: Vec<u64> = inodes
            .iter()
            .filter(|(_, m)| {
                m.open == 0
                    && m.inode.nlink > 0
                    && m.last_seq <= completed
                    && !m.unlogged
                    && !m.freeing
            })
            .map(|(&i, _)| i)
            .take(excess)
            .collect();
        for &i in &victims {
            inodes.remove(&i);
        }
        victims.first().copied()
    }

    /// A read view of the trees under the state lock: the roots as they are now, with
    /// `roots_moved` as it was then, so that a reader finds out if a commit beside it moves a
    /// root or splits a node on its way (`ReadView`'s `Reshape`).
    pub(crate) fn view<'a>(&'a self, st: &'a FsState) -> ReadView<'a> {
        let (roots, seen) = {
            let h = self.hdr(st);
            (
                h.roots(),
                self.roots_moved.load(std::sync::atomic::Ordering::Acquire),
            )
        };
        ReadView {
            reshape: Some(txn::Reshape {
                roots_moved: &self.roots_moved,
                seen,
                path: Vec::new(),
            }),
            ..ReadView::new(&self.journal, roots)
        }
    }
}

pub(crate) fn read_inode(t: &mut dyn TreeRead, ino: u64) -> FsResult<Inode> {
    match t.t_get(TREE_FS, key(ino, KIND_INODE, 0))? {
        Some(v) => Inode::decode(ino, &v, 0),
        None => Err(FsError::NotFound),
    }
}

/// Logs an inode (its item, so its leaf), storing the change counter's current value; whether
/// an item of that inode was there before.
pub(crate) fn log_inode(
    t: &mut FsTx<'_>,
    m: &mut InodeMem,
    stats: &stats::FsCounters,
) -> FsResult<bool> {
    m.inode.change = m.change.peek();
    m.inode.disk_size = m.inode.ordered_size();
    let was = t.insert(TREE_FS, key(m.inode.ino, KIND_INODE, 0), &m.inode.encode())?;
    // A size held back by dirty pages is logged again once they are written back.
    m.unlogged = m.inode.disk_size != m.inode.size;
    stats.inode_logs.add(1);
    Ok(was.is_some())
}

#[cfg(test)]
pub(crate) mod tests;
