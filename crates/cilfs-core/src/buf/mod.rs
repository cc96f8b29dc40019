//! Metadata buffers: blocks of the data device with the byte ranges changed since they were last
//! written back, and the cache that hands out the newest in-memory version of each block.

mod copies;
mod ranges;

pub use copies::BufState;
pub use ranges::RangeSet;

use crate::log::item::{ItemKey, LogItem, WriteBack, WriteBackCtx};
use crate::log::item_format::{buf_item_len, encode_buf_item_into};
use crate::log::stamp::write_lsn_stamp;
use crate::log::Lsn;
use crate::util::lockstat::LockWaits;
use crate::util::sync::{rank, Ranked, RankedMutex, RankedMutexGuard};
use cilfs_device::{AlignedBuf, Device, DeviceError};
use cilfs_sync::RwLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

/// A buffer held to change it: no one else reads or writes it meanwhile.
pub type BufGuard = Ranked<cilfs_sync::ArcRwLockWriteGuard<BufData>, { rank::BUF }>;
/// A buffer held to read it: readers share it (every descent reads the root and the upper
/// nodes), a writer waits for them. Borrowed from the buffer rather than counted on its
/// lock's `Arc`: reads are held for moments, and the count's increment and decrement moved
/// the root's and the upper nodes' lines between the cores on every step of every descent.
pub type BufReadGuard<'a> = Ranked<cilfs_sync::RwLockReadGuard<'a, BufData>, { rank::BUF }>;

/// The contents and log state of one block.
#[derive(Debug)]
pub struct BufData {
    pub data: AlignedBuf,
    /// Ranges changed since the last write back: every checkpoint that logs this block logs all
    /// of them, so that moving the item forward in the AIL never drops an older change.
    pub dirty: RangeSet,
    /// The block keeps an LSN stamp (and the fs UUID) at this offset.
    pub lsn_offset: Option<u16>,
    /// Freed in a transaction: logged as a cancel record, never written back.
    pub cancelled: bool,
    /// `[start, end)`: bytes that mean nothing in the block's format now (a tree node's free
    /// middle). They are never logged, so a replay may leave anything there, and the content
    /// CRC of the block's log items skips them (`item_format::BUF_CONTENT_CRC`).
    pub unlogged: Option<(u32, u32)>,
    /// Bumped by every transaction that commits a change to the block: a transaction works on
    /// its own copy and publishes only if the block is still the version it copied.
    pub version: u64,
}

impl BufData {
    /// Runs `write` on the block, then puts back the LSN stamp that was at `stamp_at`: the
    /// stamp in the buffer may be newer than anything the written bytes carry (write back
    /// stamps it in place), and they never overwrite it.
    pub fn keeping_stamp(&mut self, stamp_at: Option<u16>, write: impl FnOnce(&mut BufData)) {
        const N: usize = crate::log::stamp::LSN_STAMP_BYTES;
        let saved = stamp_at.map(|o| {
            let o = usize::from(o);
            let end = (o + N).min(self.data.len());
            let mut bytes = [0u8; N];
            bytes[..end - o].copy_from_slice(&self.data[o..end]);
            (o, end, bytes)
        });
        write(self);
        if let Some((o, end, bytes)) = saved {
            self.data[o..end].copy_from_slice(&bytes[..end - o]);
        }
    }
}

#[derive(Debug)]
pub struct Buf {
    blkno: u64,
    /// This buffer's identity, never reused: after an eviction the block's next buffer starts
    /// its versions again from 0, so a version alone names a state only with the buffer it
    /// was read in (`buf/copies.rs`).
    uid: u64,
    state: Arc<RwLock<BufData>>,
    pins: AtomicU32,
    /// Whether the bytes read from the device passed their read check (`verify_once`):
    /// `UNCHECKED` until the first reader that knows the block's type checks them.
    checked: AtomicU8,
    /// What the read check found wrong, once it failed.
    failure: std::sync::OnceLock<String>,
    /// `BufData::version`, readable without the lock: a commit checking what it read looks at
    /// every block it touched (some twenty for a create), under the filesystem's exclusive
    /// lock, where no commit can move a version, so the lock would only cost time there.
    /// In a cache line of its own: the buffer's reference count and pins, beside it, change
    /// with every lookup, insert and checkpoint, and a thread's copy of a node checks this on
    /// every step through it (`buf/copies.rs`).
    version: crate::util::counter::Padded,
}

/// `Buf::checked`: read from the device and not yet checked.
const UNCHECKED: u8 = 0;
/// Checked, or never needing it: made in memory (`get_fresh`) or changed there since the read.
const CHECKED: u8 = 1;
/// Failed its read check: every reader that asks gets the failure again.
const FAILED: u8 = 2;

impl Buf {
    pub fn blkno(&self) -> u64 {
        self.blkno
    }

    /// Neither pinned (in the CIL or a checkpoint not yet stable) nor holding changes not yet
    /// written back; a buffer whose lock is held counts as neither, to be safe.
    fn is_clean_and_unpinned(&self) -> bool {
        self.pins.load(Ordering::Acquire) == 0
            && self.state.try_read().is_some_and(|g| g.dirty.is_empty())
    }

    /// Runs `check` on the block's bytes if they came from the device and no one checked them
    /// yet (`g` is the caller's hold of this buffer's lock): once per read from the device,
    /// so a descent through blocks in memory pays one atomic load per block. A block changed
    /// in memory since the read (by a commit, which read it first) is not checked: its stamp
    /// is stale until write back. A failure sticks: every later call returns it, and the
    /// block is never taken as good while this buffer lasts.
    pub fn verify_once(
        &self,
        g: &BufData,
        check: impl FnOnce(&[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        match self.checked.load(Ordering::Acquire) {
            CHECKED => return Ok(()),
            FAILED => return Err(self.failure.get().cloned().unwrap_or_default()),
            _ => {}
        }
        if g.version != 0 || !g.dirty.is_empty() || g.cancelled {
            self.checked.store(CHECKED, Ordering::Release);
            return Ok(());
        }
        match check(&g.data) {
            Ok(()) => {
                self.checked.store(CHECKED, Ordering::Release);
                Ok(())
            }
            Err(what) => {
                let _ = self.failure.set(what);
                self.checked.store(FAILED, Ordering::Release);
                Err(self.failure.get().cloned().unwrap_or_default())
            }
        }
    }

    /// This buffer's identity (see `uid`).
    pub fn uid(&self) -> u64 {
        self.uid
    }

    pub fn lock(&self) -> BufGuard {
        Ranked::acquire(|| self.state.write_arc())
    }

    /// `lock` by the push's late write, under the log writer: a rank of its own
    /// (`rank::LATE_BUF`), since only the push waits for a block written late.
    fn lock_late(&self) -> Ranked<cilfs_sync::ArcRwLockWriteGuard<BufData>, { rank::LATE_BUF }> {
        Ranked::acquire(|| self.state.write_arc())
    }

    pub fn try_lock(&self) -> Option<BufGuard> {
        self.state.try_write_arc().map(Ranked::tried)
    }

    /// `lock`, its waits counted in `waits` (polled a moment before blocking).
    pub fn lock_counted(&self, waits: &LockWaits) -> BufGuard {
        Ranked::acquire(|| {
            waits.acquire_short(|| self.state.try_write_arc(), || self.state.write_arc())
        })
    }

    pub fn read(&self) -> BufReadGuard<'_> {
        Ranked::acquire(|| self.state.read())
    }

    /// `read`, its waits counted in `waits` (polled a moment before blocking).
    pub fn read_counted(&self, waits: &LockWaits) -> BufReadGuard<'_> {
        Ranked::acquire(|| waits.acquire_short(|| self.state.try_read(), || self.state.read()))
    }

    /// Whether a writer holds the lock or waits for its readers to leave (when `try_read`
    /// would fail), seen without taking it: a commit checks each block it only read this way,
    /// and taking and dropping a read hold of the root and the upper nodes moved their locks'
    /// cache lines between the cores on every commit.
    pub fn locked_exclusive(&self) -> bool {
        self.state.is_locked_exclusive()
    }

    pub fn try_read(&self) -> Option<BufReadGuard<'_>> {
        self.state.try_read().map(Ranked::tried)
    }

    /// The block's version as last published (see `version`).
    pub fn version(&self) -> u64 {
        self.version.0.load(Ordering::Acquire)
    }

    /// A commit changed the block (its lock held as `g`): a new version.
    pub fn bump_version(&self, g: &mut BufData) {
        g.version += 1;
        self.version.0.store(g.version, Ordering::Release);
    }

    /// Formats the item payload a checkpoint logs for this block now into `out`.
    pub fn format_into(&self, g: &BufData, out: &mut Vec<u8>) {
        encode_buf_item_into(
            out,
            self.blkno,
            g.cancelled,
            g.lsn_offset,
            &g.data,
            g.dirty.ranges(),
            g.unlogged,
        );
    }

    /// The length of that payload.
    pub fn formatted_len(g: &BufData) -> usize {
        buf_item_len(g.dirty.ranges().iter().map(|r| r.1 as usize))
    }
}

/// Bytes a checkpoint writes into a block when it is pushed, rather than a transaction at its
/// commit. A context keeps the newest of a block's late writes (merged into the widest, when
/// their ranges nest: `CilCtx::set_late`), so its checkpoint logs the block as the last commit
/// of the context left it, and commits never lock or copy it: the
/// filesystem header, which nearly every commit changes (`fs/txn/late.rs`), is written this way.
/// Commits that write a block's bytes late must reach the CIL in the order they made them.
///
/// Counters (`counters`) are not bytes but changes: each context sums its commits' changes of
/// a counter, and its push moves the block's counter by the sum from where the last push left
/// it. So commits that change counters alone may reach the CIL in any order, and a context's
/// checkpoint holds exactly the changes of the commits in it and before it. The bytes of a
/// late write never change a counter that a write of the context lists (the push keeps those
/// as they were around the bytes), unless `counters_set` says its bytes hold the counters'
/// first values (mkfs). So a write whose bytes cover counters must list each of them, with a
/// change of nothing for one it does not move (`Header::counter_changes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateWrite {
    pub offset: usize,
    /// Empty: the commit changes counters only.
    pub bytes: Vec<u8>,
    /// Where the block keeps its LSN stamp, which the bytes never overwrite.
    pub lsn_offset: u16,
    /// (offset, change) of little-endian u64 counters, each at most once.
    pub counters: Vec<(usize, CounterChange)>,
    /// The bytes set the counters they cover, from which `counters` then move them: only a
    /// context's first late write of the block may (`CilCtx::set_late`).
    pub counters_set: bool,
}

/// How a commit moves a counter of a block written late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterChange {
    /// Adds (wrapping: a decrement is its two's complement).
    Add(u64),
    /// Raises to at least this.
    Max(u64),
}

impl CounterChange {
    /// The counter at `v` moved by this change.
    pub fn apply(self, v: u64) -> u64 {
        match self {
            CounterChange::Add(d) => v.wrapping_add(d),
            CounterChange::Max(m) => v.max(m),
        }
    }

    /// Whether it leaves every counter as it is.
    pub fn is_nothing(self) -> bool {
        matches!(self, CounterChange::Add(0) | CounterChange::Max(0))
    }

    /// This change followed by `later`, as one; None if they are of different kinds.
    pub fn then(self, later: CounterChange) -> Option<CounterChange> {
        match (self, later) {
            (CounterChange::Add(a), CounterChange::Add(b)) => {
                Some(CounterChange::Add(a.wrapping_add(b)))
            }
            (CounterChange::Max(a), CounterChange::Max(b)) => Some(CounterChange::Max(a.max(b))),
            _ => None,
        }
    }
}

impl Buf {
    /// Applies `w` to the block and formats into `out` what a checkpoint logs for it now (the
    /// push, for the context it is writing; no commit changes a block written late).
    pub fn apply_late(&self, w: &LateWrite, out: &mut Vec<u8>) {
        let mut g = self.lock_late();
        let (a, b) = (w.offset, w.offset + w.bytes.len());
        assert!(
            b <= g.data.len(),
            "a late write past the end of block {}",
            self.blkno
        );
        for &(at, _) in &w.counters {
            assert!(
                at + 8 <= g.data.len(),
                "a late counter past the end of block {}",
                self.blkno
            );
        }
        // Each counter from where the last push left it, unless these bytes set it.
        let base: Vec<Option<u64>> = w
            .counters
            .iter()
            .map(|&(at, _)| (!w.counters_set).then(|| counter_at(&g.data, at)))
            .collect();
        g.keeping_stamp(Some(w.lsn_offset), |g| {
            g.data[a..b].copy_from_slice(&w.bytes);
            for (&(at, change), base) in w.counters.iter().zip(base) {
                let v = base.unwrap_or_else(|| counter_at(&g.data, at));
                g.data[at..at + 8].copy_from_slice(&change.apply(v).to_le_bytes());
            }
        });
        if b > a {
            g.dirty.insert(a as u32, (b - a) as u32);
        }
        for &(at, _) in &w.counters {
            g.dirty.insert(at as u32, 8);
        }
        g.cancelled = false;
        g.lsn_offset = Some(w.lsn_offset);
        self.bump_version(&mut g);
        out.clear();
        self.format_into(&g, out);
    }
}

/// The little-endian u64 counter at `at` of a block.
fn counter_at(data: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&data[at..at + 8]);
    u64::from_le_bytes(v)
}

impl LogItem for Buf {
    fn key(&self) -> ItemKey {
        self.blkno
    }

    fn pins(&self) -> &AtomicU32 {
        &self.pins
    }

    fn prepare_write_back(&self, lsn: Lsn, ctx: &WriteBackCtx) -> WriteBack {
        let Some(mut g) = self.state.try_write() else {
            return WriteBack::Busy;
        };
        if self.pins.load(Ordering::Acquire) > 0 {
            return WriteBack::Pinned;
        }
        if g.cancelled {
            g.dirty.clear();
            return WriteBack::Stale;
        }
        if let Some(off) = g.lsn_offset {
            // The write verifier: a block the format refuses never reaches the disk, and it
            // keeps its dirty state (the journal shuts down).
            if let Some(check) = ctx.check_at(off) {
                if let Err(what) = check(&g.data, self.blkno) {
                    return WriteBack::Invalid { what };
                }
            }
            write_lsn_stamp(&mut g.data, off, lsn, &ctx.uuid);
        }
        g.dirty.clear();
        WriteBack::Write {
            offset: self.blkno * g.data.len() as u64,
            data: g.data.clone(),
        }
    }
}

type BlockMap = crate::util::numhash::NumberMap<Arc<Buf>>;

/// Maps the buffers are spread over by block number: one map behind one lock was taken some
/// fifty times by every create, from every thread.
const MAP_SHARDS: usize = 16;

/// Slots of a thread's recently used buffers (`HOT`), direct-mapped by block number.
const HOT_SLOTS: usize = 64;

/// A cache's identity in `HOT` (caches of several filesystems share the threads).
static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

type HotSlot = Option<(u64, u64, Arc<Buf>)>;

cilfs_sync::thread_local! {
    /// Each thread's recently used buffers: (cache id, block, buffer). The upper tree nodes
    /// are looked up by every descent of every thread; finding them here saves taking a
    /// map's lock, whose cache line the cores otherwise pass between them on every lookup.
    /// A buffer held here has a second holder, so eviction (which drops only a buffer the
    /// map alone holds) leaves it in the map: the slot and the map agree on the buffer of a
    /// block for as long as the slot keeps it.
    static HOT: std::cell::RefCell<[HotSlot; HOT_SLOTS]> =
        const { std::cell::RefCell::new([const { None }; HOT_SLOTS]) };
}

/// A block number's bits spread by a multiplicative hash: its high bits choose a map and a
/// hot slot, so neighbouring blocks land in different ones.
fn spread(blkno: u64) -> u64 {
    blkno.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn hot_slot(blkno: u64) -> usize {
    (spread(blkno) >> 58) as usize % HOT_SLOTS
}

/// All buffers in memory. Buffers that only the cache holds (not in a transaction, the CIL or
/// the AIL, hence clean and unpinned) are evicted when the cache passes `max_bytes`.
#[derive(Debug)]
pub struct BufCache {
    id: u64,
    dev: Arc<dyn Device>,
    block_size: u32,
    max_buffers: usize,
    bufs: [RankedMutex<BlockMap, { rank::BUF_MAP }>; MAP_SHARDS],
    /// Buffers in all the maps (changed under the map's lock).
    count: AtomicUsize,
    /// Bumped by every eviction pass: a read that raced with one may be older than what was
    /// evicted, and is retried.
    evictions: std::sync::atomic::AtomicU64,
    evicted: std::sync::atomic::AtomicU64,
    /// The next eviction pass runs when the cache holds more than this many buffers: a pass
    /// that finds little to evict (everything dirty) is not repeated on every insert.
    next_pass_at: AtomicUsize,
}

impl BufCache {
    pub fn new(dev: Arc<dyn Device>, block_size: u32, max_bytes: u64) -> Self {
        Self {
            id: NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed),
            dev,
            block_size,
            max_buffers: (max_bytes / u64::from(block_size)).max(16) as usize,
            bufs: std::array::from_fn(|_| RankedMutex::new(BlockMap::default())),
            count: AtomicUsize::new(0),
            evictions: std::sync::atomic::AtomicU64::new(0),
            evicted: std::sync::atomic::AtomicU64::new(0),
            next_pass_at: AtomicUsize::new((max_bytes / u64::from(block_size)).max(16) as usize),
        }
    }

    /// The map that holds `blkno`.
    fn map(&self, blkno: u64) -> &RankedMutex<BlockMap, { rank::BUF_MAP }> {
        let i = (spread(blkno) >> 60) as usize % MAP_SHARDS;
        &self.bufs[i]
    }

    /// The buffer of `blkno`, read from the device on first use.
    pub fn get(&self, blkno: u64) -> Result<Arc<Buf>, DeviceError> {
        let slot = hot_slot(blkno);
        let hot = HOT.with(|h| match &h.borrow()[slot] {
            Some((id, b, buf)) if *id == self.id && *b == blkno => Some(Arc::clone(buf)),
            _ => None,
        });
        if let Some(b) = hot {
            return Ok(b);
        }
        let b = self.get_from_map(blkno)?;
        // Replaced outside the borrow: dropping the old buffer takes no lock, but keep the
        // slot's borrow as short as can be.
        let old = HOT.with(|h| h.borrow_mut()[slot].replace((self.id, blkno, Arc::clone(&b))));
        drop(old);
        Ok(b)
    }

    /// `get` through the maps.
    fn get_from_map(&self, blkno: u64) -> Result<Arc<Buf>, DeviceError> {
        loop {
            if let Some(b) = self.map(blkno).lock().get(&blkno) {
                return Ok(Arc::clone(b));
            }
            let epoch = self.evictions.load(Ordering::Acquire);
            let mut data = AlignedBuf::zeroed(self.block_size as usize);
            self.dev
                .read(blkno * u64::from(self.block_size), &mut data)?;
            let bufs = self.map(blkno).lock();
            if let Some(b) = bufs.get(&blkno) {
                // Another thread read it meanwhile: its copy (perhaps already modified) wins.
                return Ok(Arc::clone(b));
            }
            if self.evictions.load(Ordering::Acquire) != epoch {
                // A newer version may have been written back and evicted while we read.
                continue;
            }
            return Ok(self.insert(bufs, blkno, data, UNCHECKED));
        }
    }

    /// Block `blkno`, to be written whole: a block not in memory is not read but starts
    /// zeroed. Only for a block its caller allocated (no one else can be reading it for its
    /// contents); one still in memory, from before it was freed, is returned as it is.
    pub fn get_fresh(&self, blkno: u64) -> Arc<Buf> {
        let bufs = self.map(blkno).lock();
        if let Some(b) = bufs.get(&blkno) {
            // Its caller writes it whole: what it held (even bytes that failed their check,
            // from before the block was freed) is never read for its meaning again.
            b.checked.store(CHECKED, Ordering::Release);
            return Arc::clone(b);
        }
        let data = AlignedBuf::zeroed(self.block_size as usize);
        self.insert(bufs, blkno, data, CHECKED)
    }

    /// Adds a buffer for `blkno` holding `data` to its map (whose lock `bufs` is), and runs an
    /// eviction pass when the cache has grown past its mark. `checked`: `UNCHECKED` for bytes
    /// read from the device.
    fn insert(
        &self,
        mut bufs: RankedMutexGuard<'_, BlockMap, { rank::BUF_MAP }>,
        blkno: u64,
        data: AlignedBuf,
        checked: u8,
    ) -> Arc<Buf> {
        static NEXT_UID: AtomicU64 = AtomicU64::new(1);
        let b = Arc::new(Buf {
            blkno,
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            state: Arc::new(RwLock::new(BufData {
                data,
                dirty: RangeSet::default(),
                lsn_offset: None,
                cancelled: false,
                unlogged: None,
                version: 0,
            })),
            pins: AtomicU32::new(0),
            checked: AtomicU8::new(checked),
            failure: std::sync::OnceLock::new(),
            version: crate::util::counter::Padded(AtomicU64::new(0)),
        });
        bufs.insert(blkno, Arc::clone(&b));
        let count = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        drop(bufs);
        if count > self.next_pass_at.load(Ordering::Relaxed) {
            self.evict_pass();
        }
        b
    }

    /// Reads blocks `start..start + n` with one device read into `scratch` (at least `n`
    /// blocks; the caller keeps it from one run to the next: a fresh buffer a run was a
    /// tenth of the checker's time in page faults) and caches those `want` names that are
    /// not in memory yet. Read-ahead: one IO where `get` of each would be `n`. Stops caching
    /// (without an error) if an eviction ran meanwhile: a block written back and evicted
    /// during the read may be older on what was read than on the device, and is left to
    /// `get`.
    pub fn read_ahead(
        &self,
        start: u64,
        n: usize,
        want: &dyn Fn(u64) -> bool,
        scratch: &mut [u8],
    ) -> Result<(), DeviceError> {
        let bs = self.block_size as usize;
        let epoch = self.evictions.load(Ordering::Acquire);
        // No more than `scratch` holds.
        let n = n.min(scratch.len() / bs);
        let data = &mut scratch[..n * bs];
        self.dev.read(start * u64::from(self.block_size), data)?;
        for (blkno, block) in (start..).zip(data.chunks(bs)) {
            if !want(blkno) {
                continue;
            }
            let bufs = self.map(blkno).lock();
            if self.evictions.load(Ordering::Acquire) != epoch {
                break;
            }
            if !bufs.contains_key(&blkno) {
                self.insert(bufs, blkno, AlignedBuf::from_slice(block), UNCHECKED);
            }
        }
        Ok(())
    }

    /// Block `blkno` if it is in memory (no read of the device needed).
    pub fn cached(&self, blkno: u64) -> Option<Arc<Buf>> {
        self.map(blkno).lock().get(&blkno).map(Arc::clone)
    }

    /// Drops buffers only the cache holds until the cache is at 7/8 of its limit, each map
    /// down to its share, and sets when the next pass runs. A pinned or dirty buffer holds the
    /// only copy newer than the disk and is never dropped: in a live journal the CIL, a
    /// checkpoint in flight or the AIL holds it too, but a journal shut down by an IO error
    /// lets go of a failed checkpoint's items with their pins and changes, and its readers
    /// must still see what was committed in memory.
    fn evict_pass(&self) {
        let target = (self.max_buffers / 8 * 7).div_ceil(MAP_SHARDS);
        for map in &self.bufs {
            let mut bufs = map.lock();
            let excess = bufs.len().saturating_sub(target);
            let victims: Vec<u64> = bufs
                .iter()
                // Clones are made under the map's lock, which we hold, or from a thread's
                // hot slot, which is a holder itself: a count of 1 stays 1.
                .filter(|(_, b)| Arc::strong_count(b) == 1 && b.is_clean_and_unpinned())
                .map(|(k, _)| *k)
                .take(excess)
                .collect();
            if victims.is_empty() {
                continue;
            }
            // Under the map's lock, as the removals: a read of one of these blocks that began
            // before them finds the count moved when it comes to insert.
            self.evictions.fetch_add(1, Ordering::AcqRel);
            for k in victims {
                if let Some(b) = bufs.remove(&k) {
                    self.count.fetch_sub(1, Ordering::Relaxed);
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                    drop(b);
                }
            }
        }
        let again = self.len().max(self.max_buffers) + self.max_buffers / 8;
        self.next_pass_at.store(again, Ordering::Relaxed);
    }

    /// Evicts what it can if the cache is over its limit (after the AIL wrote buffers back).
    pub fn trim(&self) {
        if self.len() > self.max_buffers {
            self.evict_pass();
        }
    }

    /// More buffers than the limit: the AIL should write some back so they can be evicted.
    pub fn over_limit(&self) -> bool {
        self.len() > self.max_buffers
    }

    /// Buffers evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use cilfs_device::SimDevice;

    /// Read-ahead reads a run with one device read, caches only the blocks asked for (with
    /// what the device holds), and leaves a block already in memory as it is.
    #[test]
    fn read_ahead_caches_the_wanted_blocks_with_one_read() {
        let dev = Arc::new(SimDevice::new(4096 * 64, 7));
        for b in 0..64u8 {
            dev.write(
                u64::from(b) * 4096,
                &[b + 1; 4096],
                cilfs_device::WriteFlags::NONE,
            )
            .unwrap();
        }
        let cache = BufCache::new(dev.clone(), 4096, 1 << 20);
        let held = cache.get(12).unwrap();
        held.lock().data[0] = 0xEE;
        let reads = dev.stats().reads;
        let mut scratch = AlignedBuf::zeroed(32 * 4096);
        cache
            .read_ahead(10, 20, &|b| b % 2 == 0, &mut scratch)
            .unwrap();
        assert_eq!(dev.stats().reads, reads + 1);
        for b in 10..30u64 {
            assert_eq!(cache.cached(b).is_some(), b % 2 == 0, "block {b}");
        }
        assert_eq!(cache.cached(20).unwrap().read().data[..], [21u8; 4096][..]);
        assert!(Arc::ptr_eq(&cache.cached(12).unwrap(), &held));
        assert_eq!(held.read().data[0], 0xEE);
        // What is cached is read no more.
        cache.get(28).unwrap();
        assert_eq!(dev.stats().reads, reads + 1);
    }

    /// The cache stays near its limit over its maps (plus what the thread's hot slots keep),
    /// evicts only buffers nobody else holds, and a block read again after eviction comes
    /// back from the device.
    #[test]
    fn eviction_keeps_the_cache_near_its_limit_and_spares_held_buffers() {
        let dev = Arc::new(SimDevice::new(4096 * 1024, 7));
        let cache = Arc::new(BufCache::new(dev, 4096, 64 * 4096));
        let held: Vec<Arc<Buf>> = (0..8).map(|b| cache.get(b).unwrap()).collect();
        held[0].lock().data[0] = 0xAB;
        // Another thread reads the rest: its hot slots go with it.
        let reader = Arc::clone(&cache);
        std::thread::spawn(move || {
            for b in 8..1000 {
                reader.get(b).unwrap();
                let limit = 64 + 64 / 8 + 1 + 2 * HOT_SLOTS;
                assert!(reader.len() <= limit, "{} buffers", reader.len());
            }
        })
        .join()
        .unwrap();
        assert!(cache.evicted() >= 1000 - 64 - 64 / 8 - 1 - 2 * HOT_SLOTS as u64);
        for h in &held {
            let again = cache.cached(h.blkno()).unwrap();
            assert!(
                Arc::ptr_eq(h, &again),
                "block {} was evicted while held",
                h.blkno()
            );
        }
        assert_eq!(cache.get(0).unwrap().lock().data[0], 0xAB);
        // An evicted block is no longer in memory and is read again from the device.
        let evicted = (8..1000).find(|b| cache.cached(*b).is_none()).unwrap();
        assert_eq!(cache.get(evicted).unwrap().lock().data[0], 0);
    }

    /// A buffer still pinned, or holding changes not written back, stays cached when nothing
    /// else holds it (a journal shut down by an IO error let go of its failed checkpoint's
    /// items): reads must keep seeing what was committed in memory, not the older disk block.
    #[test]
    fn eviction_keeps_pinned_and_dirty_buffers_nobody_else_holds() {
        let dev = Arc::new(SimDevice::new(4096 * 1024, 7));
        // The smallest cache: a pass leaves about one buffer in each of its maps, so more kept
        // buffers than maps can only be the rule at work.
        let cache = BufCache::new(dev, 4096, 0);
        // Each on a thread of its own, whose hot slots (holders too) end with it.
        std::thread::scope(|s| {
            s.spawn(|| {
                for b in 0..32u64 {
                    let buf = cache.get(b).unwrap();
                    let mut g = buf.lock();
                    g.data[0] = 0xA0 | b as u8;
                    if b < 16 {
                        buf.pins().fetch_add(1, Ordering::AcqRel);
                    } else {
                        g.dirty.insert(0, 1);
                    }
                }
            });
        });
        std::thread::scope(|s| {
            s.spawn(|| {
                for b in 32..1000 {
                    cache.get(b).unwrap();
                }
            });
        });
        assert!(cache.evicted() >= 900, "{} evicted", cache.evicted());
        for b in 0..32u64 {
            let kept = cache.cached(b);
            let what = if b < 16 { "pinned" } else { "dirty" };
            let kept = kept.unwrap_or_else(|| panic!("{what} block {b} evicted"));
            assert_eq!(kept.lock().data[0], 0xA0 | b as u8);
        }
    }

    /// A thread's hot slots keep the buffer of a block only for the cache it came from: two
    /// filesystems in one process share the threads.
    #[test]
    fn hot_slots_serve_only_their_own_cache() {
        let caches: Vec<BufCache> = (0..2u8)
            .map(|i| {
                let dev = Arc::new(SimDevice::new(4096 * 64, 7));
                dev.write(3 * 4096, &[i + 1; 4096], cilfs_device::WriteFlags::NONE)
                    .unwrap();
                BufCache::new(dev, 4096, 16 * 4096)
            })
            .collect();
        for _ in 0..3 {
            for (i, c) in caches.iter().enumerate() {
                let b = c.get(3).unwrap();
                assert_eq!(b.lock().data[0], i as u8 + 1);
                assert!(Arc::ptr_eq(&b, &c.cached(3).unwrap()));
            }
        }
    }
}
