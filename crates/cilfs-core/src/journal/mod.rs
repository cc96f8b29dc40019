//! The journal: ties the log writer, CIL, AIL and log space together into a transactional store
//! of metadata blocks. `open` recovers; `commit` never waits for IO; `force` makes a checkpoint
//! stable; `unmount` leaves a log that needs no replay.

mod logged_data;
mod open;
mod push;
mod space;
mod stats;

pub use logged_data::LOGGED_BLOCKS_MAX;
pub use open::{counters_exhausted, scan, RecoveryReport};
pub use stats::JournalStats;

use crate::ail::{Ail, AilWorker, WritebackIo};
use crate::buf::{Buf, BufCache, BufData, BufState, LateWrite};
use crate::cil::{Cil, CilLimits};
use crate::format::{FormatError, Superblock};
// Every copy, backups first: a mount from a backup rewrites the damaged primary with its
// first superblock write.
use crate::format::geometry::{write_superblock, Geometry, GeometryError};
use crate::log::item::BlockCheck;
use crate::log::recover::RecoveryError;
use crate::log::writer::ConfigError;
use crate::log::{FlushClock, LogConfig, LogCounters, LogSpace, LogWriter, Lsn};
use crate::trans::grant::GrantHead;
use crate::trans::{Reservation, TransJournal};
use crate::util::lockstat::LockWaits;
use crate::util::sync::{rank, RankedMutex, RankedMutexGuard};
use cilfs_device::{Device, DeviceError, WriteFlags};
use cilfs_sync::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// A transaction in this journal (`Journal::begin`).
pub type Transaction<'j> = crate::trans::Transaction<'j, Journal>;

#[derive(Debug, Error)]
pub enum JournalError {
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    #[error("{0}")]
    Geometry(#[from] GeometryError),
    #[error("log recovery: {0}")]
    Recovery(#[from] RecoveryError),
    #[error("log configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("superblock: {0}")]
    Format(#[from] FormatError),
    #[error("the journal is shut down after an IO error")]
    Shutdown,
    /// A transaction's copy of a block was changed under it by another commit: it did not
    /// publish anything (changes run one at a time today, so this is a bug).
    #[error("block {blkno} changed under a transaction")]
    Conflict { blkno: u64 },
    #[error("a reservation of {need} bytes can never fit the log (at most {max})")]
    ReservationTooLarge { need: u64, max: u64 },
    #[error("block {blkno} is outside the metadata area {first}..{end}")]
    BlockOutOfRange { blkno: u64, first: u64, end: u64 },
    /// Recovery found damage in the stable part of the log (`LogEnd::Damaged`): replaying
    /// only what comes before it would drop committed checkpoints without a word.
    #[error(
        "{0}. The mount is refused, since replaying the log only up to the damage would lose \
         those checkpoints without a word. `cilfs repair` replays it up to the damage and \
         discards the rest (their changes are lost); a read-only mount with `-o \
         ro,norecovery` shows the files as written in place, without the log"
    )]
    DamagedLog(String),
    /// A metadata block failed its check on the first use after a read from the device
    /// (`Journal::verify_read`): the filesystem maps it to a corrupt block.
    #[error("metadata block {blkno} is corrupt: {what}")]
    BadBlock { blkno: u64, what: String },
    /// A metadata block failed its check before write back: the journal shut down and the
    /// block was not written.
    #[error("metadata block {blkno} failed its check before write back: {what}")]
    BadWrite { blkno: u64, what: String },
    /// Frozen by a remount read-only (`Journal::freeze`): no transaction until `thaw`.
    #[error("the filesystem is read-only")]
    ReadOnly,
    /// A freeze found transactions still open after waiting for them.
    #[error("transactions still open after {0:?}: not frozen")]
    FreezeTimedOut(std::time::Duration),
}

/// Who runs CIL pushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PushMode {
    /// The committing or forcing thread pushes itself: fully deterministic, for crash tests.
    #[default]
    Inline,
    /// A background worker pushes when the CIL passes its space limit.
    Background,
}

/// Which shard of the CIL a commit takes (`cil/shards.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CilSharding {
    /// Its thread's, so that threads seldom meet and a thread's relogs stay in one shard.
    #[default]
    ByThread,
    /// Two commits in a shard, then the next of three (the crash explorers): a checkpoint
    /// holds both relogs within a shard and images the push merges from several. A block
    /// logged in several shards is counted in each, so contexts reach their limits sooner.
    Rotate,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct JournalConfig {
    pub log: LogConfig,
    /// Override of the CIL space limit S in bytes.
    pub cil_limit: Option<u64>,
    pub push_mode: PushMode,
    /// Memory for cached metadata buffers before clean ones are evicted [default: a sixteenth of
    /// the machine's memory, 128 MiB..2 GiB].
    pub cache_bytes_max: Option<u64>,
    /// Background mode: how long the push worker waits for a push request before it forces the
    /// log itself, or covers it if nothing was committed meanwhile [default: 30 s, as XFS's log
    /// worker; at least 10 ms]. So commits too light to fill the CIL to its limit are
    /// checkpointed within about this interval.
    pub log_force_interval: Option<std::time::Duration>,
    pub cil_sharding: CilSharding,
}

/// The smallest default metadata cache.
pub const DEFAULT_CACHE_BYTES: u64 = 128 << 20;
/// AIL write back IOs in flight at once in background mode.
const AIL_QUEUE_DEPTH: usize = 16;

/// The default metadata cache: a sixteenth of the machine's memory, between 128 MiB and 2 GiB.
/// Metadata that falls out of it is read back from the device, so a working set larger than it
/// (a million-entry directory holds ~200 MB of tree blocks) pays a device read per lookup.
pub fn default_cache_bytes() -> u64 {
    (crate::util::memory::total_bytes() / 16).clamp(DEFAULT_CACHE_BYTES, 2 << 30)
}

/// Log space accounting (docs/journal.md section 4), under one lock.
#[derive(Debug)]
pub(crate) struct SpaceState {
    /// Bytes charged by CIL contexts not yet written.
    pub cil_charged: u64,
    /// Where the next record goes.
    pub head: Lsn,
    /// The tail as of the last completed data-device flush: log space before it may be reused.
    pub safe_tail: Lsn,
}

#[derive(Debug)]
pub struct Journal {
    pub(crate) data: Arc<dyn Device>,
    pub(crate) logdev: Option<Arc<dyn Device>>,
    pub(crate) geo: Geometry,
    pub(crate) sb: RankedMutex<Superblock, { rank::SB }>,
    pub(crate) cfg: JournalConfig,
    pub(crate) limits: CilLimits,
    pub(crate) space_math: LogSpace,
    pub(crate) cache: BufCache,
    pub(crate) cil: Cil,
    /// With `cil_room`: the push switched contexts (or the journal shut down), for committers
    /// blocked at the hard limit.
    pub(crate) cil_switched: Condvar,
    pub(crate) cil_room: RankedMutex<(), { rank::CIL_ROOM }>,
    /// `CilSharding::Rotate`: the shard the next commit takes.
    pub(crate) cil_next_shard: std::sync::atomic::AtomicUsize,
    /// Contention on the metadata buffer locks and on the CIL lock (the lock table).
    pub(crate) buf_waits: LockWaits,
    pub(crate) cil_waits: LockWaits,
    /// Contention on `space`'s lock, which every commit takes to turn its reservation into
    /// its context's charge.
    pub(crate) space_waits: LockWaits,
    pub(crate) writer: RankedMutex<LogWriter, { rank::WRITER }>,
    /// The writer's clock of data-device flushes: the AIL publishes write back a flush of the
    /// commit path covered (ail policy, `ail::Publish::Deferred`).
    pub(crate) flush_clock: Arc<FlushClock>,
    pub(crate) space: RankedMutex<SpaceState, { rank::SPACE }>,
    /// The highest checkpoint sequence that is stable (or was empty). Stored under `space`'s
    /// lock (`set_completed_seq`), so that a waiter on `checkpoint_done` misses no change;
    /// read without it: every transaction asks for it (to prune busy extents), and the
    /// lock's cache line went between the cores.
    pub(crate) completed: AtomicU64,
    /// With `space`: a checkpoint completed, or a holder let go of the writer
    /// (`release_writer`).
    pub(crate) checkpoint_done: Condvar,
    /// The highest sequence a forcer is waiting for: the pusher writes that context next
    /// even when it is smaller than S.
    pub(crate) force_target: AtomicU64,
    /// Reservations, FIFO; its `in_use` mirrors `space` (see `publish_space`).
    pub(crate) grant: GrantHead,
    pub(crate) ail: RankedMutex<Ail, { rank::AIL }>,
    /// How AIL write back IO goes out; held across that IO (the AIL lock is not), so it
    /// serialises pushers.
    pub(crate) ail_writeback: RankedMutex<WritebackIo, { rank::AIL_WRITEBACK }>,
    pub(crate) counters: Arc<LogCounters>,
    pub(crate) extra: stats::ExtraCounters,
    pub(crate) shut_down: Arc<AtomicBool>,
    /// Blocks whose write back is in flight (`WritingBack`).
    pub(crate) writing_back: Arc<crate::log::item::WritingBack>,
    /// The shutdown came from `shut_down_on_request`, not from an error.
    pub(crate) shut_down_requested: AtomicBool,
    /// Remounted read-only (`freeze`): clean on disk, no transaction admitted, nothing written.
    pub(crate) frozen: AtomicBool,
    pub(crate) worker: Mutex<Option<push::Worker>>,
    pub(crate) ail_worker: Mutex<Option<AilWorker>>,
    /// First and end block of the area metadata buffers may live in.
    pub(crate) meta_first: u64,
    pub(crate) meta_end: u64,
    pub(crate) recovered: RecoveryReport,
    /// No write back ahead of need: only reservation relief frees log space (crash explorers
    /// and tests, see `set_ail_push_ahead`).
    pub(crate) ahead_paused: AtomicBool,
    /// The structure checks of stamped blocks, by stamp offset (`register_block_check`).
    pub(crate) block_checks: cilfs_sync::RwLock<Vec<(u16, BlockCheck)>>,
    /// Blocks whose read check failed and was logged (each once, up to `BAD_BLOCKS_LOGGED`).
    pub(crate) bad_blocks: Mutex<std::collections::BTreeSet<u64>>,
    /// File data blocks the log holds whole (`logged_data.rs`); a leaf lock.
    pub(crate) logged_data: Mutex<logged_data::LoggedData>,
    /// How many blocks `logged_data` holds, read without its lock (reads skip it at 0).
    pub(crate) logged_data_len: std::sync::atomic::AtomicUsize,
}

/// Failed blocks logged one by one; past this many, only the count grows.
const BAD_BLOCKS_LOGGED: usize = 1024;

impl Journal {
    /// The log space accounting, locked; its waits counted (`space_waits`).
    pub(crate) fn space(&self) -> RankedMutexGuard<'_, SpaceState, { rank::SPACE }> {
        self.space.lock_short(&self.space_waits)
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovered
    }

    pub fn superblock(&self) -> Superblock {
        self.sb.lock().clone()
    }

    pub fn cil_limits(&self) -> CilLimits {
        self.limits
    }

    /// Blocks `[first, end)` of the data device, where metadata buffers live.
    pub fn metadata_area(&self) -> (u64, u64) {
        (self.meta_first, self.meta_end)
    }

    pub fn block_size(&self) -> u32 {
        self.geo.sb.block_size
    }

    /// The largest reservation `begin` accepts (a quarter of the usable log).
    pub fn max_reservation_bytes(&self) -> u64 {
        self.capacity() / 4
    }

    /// Starts a transaction, waiting (FIFO) for log space.
    pub fn begin(&self, r: Reservation) -> Result<Transaction<'_>, JournalError> {
        self.check_alive()?;
        self.reserve(r.unit_bytes)?;
        Ok(Transaction::new(self, r.unit_bytes))
    }

    /// Starts a transaction if its log space is there now, without waiting for any.
    pub fn try_begin(&self, r: Reservation) -> Result<Option<Transaction<'_>>, JournalError> {
        self.check_alive()?;
        Ok(self
            .try_reserve(r.unit_bytes)?
            .then(|| Transaction::new(self, r.unit_bytes)))
    }

    /// A transaction without log space yet (`Transaction::reserve`): an optimistic operation
    /// builds its changes first and reserves only to commit them, so that it never holds log
    /// space while it waits for a lock.
    pub fn begin_unreserved(&self) -> Result<Transaction<'_>, JournalError> {
        self.check_alive()?;
        if self.is_frozen() {
            return Err(JournalError::ReadOnly);
        }
        Ok(Transaction::new(self, 0))
    }

    /// Waits until a reservation of `r` has been granted (making space as `begin` does), then
    /// gives it back: for a caller that must not wait while holding its locks, before it tries
    /// again with `try_begin`.
    pub fn wait_for_space(&self, r: Reservation) -> Result<(), JournalError> {
        self.reserve(r.unit_bytes)?;
        self.release_reservation(r.unit_bytes);
        Ok(())
    }

    /// The newest in-memory version of a metadata block.
    /// Metadata block `blkno` if it is in the buffer cache (None also when out of range).
    pub fn cached_buf(&self, blkno: u64) -> Option<Arc<Buf>> {
        self.is_metadata_block(blkno)
            .then(|| self.cache.cached(blkno))
            .flatten()
    }

    pub fn buf(&self, blkno: u64) -> Result<Arc<Buf>, JournalError> {
        self.check_metadata_block(blkno)?;
        Ok(self.cache.get(blkno)?)
    }

    /// Caches the blocks of `start..start + n` that `want` names with one read
    /// (`BufCache::read_ahead`, `scratch` holding `n` blocks), for a caller about to read
    /// them one by one.
    pub fn read_ahead(
        &self,
        start: u64,
        n: u64,
        want: &dyn Fn(u64) -> bool,
        scratch: &mut [u8],
    ) -> Result<(), JournalError> {
        self.check_metadata_block(start)?;
        self.check_metadata_block(start.saturating_add(n.max(1) - 1))?;
        let n = usize::try_from(n).map_err(|_| JournalError::BlockOutOfRange {
            blkno: start,
            first: self.meta_first,
            end: self.meta_end,
        })?;
        Ok(self.cache.read_ahead(start, n, want, scratch)?)
    }

    /// `f` on this thread's copy of block `blkno` (`buf/copies.rs`), copied now if the thread
    /// keeps none in the block's current state: the state `f` saw and its answer. For
    /// interior tree nodes, which every descent passes: stepping through a copy takes no lock.
    /// The block keeps its LSN stamp at `stamp_at`: a copy is made only of a block that
    /// passed its read check (`verify_read`).
    pub fn read_copy<R>(
        &self,
        blkno: u64,
        stamp_at: u16,
        f: impl Fn(&[u8]) -> R,
    ) -> Result<(BufState, R), JournalError> {
        self.check_metadata_block(blkno)?;
        if let Some(r) = self.cache.with_copy(blkno, &f) {
            return Ok(r);
        }
        self.cache.copy_and(
            blkno,
            &self.buf_waits,
            |b, g| self.verify_read(b, g, stamp_at),
            f,
        )
    }

    /// Registers `check` as the structure check of blocks that keep their LSN stamp at
    /// `stamp_at` (the filesystem's tree nodes and header): run by `verify_read` and before
    /// every write back of such a block. A later registration for the offset replaces it.
    pub fn register_block_check(&self, stamp_at: u16, check: BlockCheck) {
        let mut c = self.block_checks.write();
        c.retain(|(o, _)| *o != stamp_at);
        c.push((stamp_at, check));
    }

    /// The read verifier of a block that keeps its LSN stamp at `stamp_at`, held as `g`: on
    /// the first use after a read from the device (`Buf::verify_once`), the stamp must carry
    /// this filesystem's UUID and the CRC of the whole block, its LSN must not be past the
    /// log's head (no write back stamps one that is), and the structure check registered
    /// for the offset must pass. A failure is logged once per block, marks the superblock as
    /// needing a check, and is `BadBlock` for this and every later use of the buffer.
    pub fn verify_read(&self, buf: &Buf, g: &BufData, stamp_at: u16) -> Result<(), JournalError> {
        let blkno = buf.blkno();
        buf.verify_once(g, |data| {
            let lsn = crate::log::stamp::check_lsn_stamp(data, stamp_at, &self.geo.sb.uuid)?;
            let head = self.space().head;
            if lsn > head {
                return Err(format!("stamp LSN {lsn} is past the log head {head}"));
            }
            let check = self
                .block_checks
                .read()
                .iter()
                .find(|(o, _)| *o == stamp_at)
                .map(|&(_, c)| c);
            match check {
                Some(c) => c(data, blkno),
                None => Ok(()),
            }
        })
        .map_err(|what| {
            self.report_bad_block(blkno, &what);
            JournalError::BadBlock { blkno, what }
        })
    }

    /// Logs a block that failed its read check (once) and marks the superblock as needing a
    /// check; a frozen (read-only) journal writes nothing.
    fn report_bad_block(&self, blkno: u64, what: &str) {
        {
            let mut bad = self.bad_blocks.lock();
            if bad.contains(&blkno) || bad.len() >= BAD_BLOCKS_LOGGED {
                return;
            }
            bad.insert(blkno);
        }
        tracing::error!("metadata block {blkno} failed its read check: {what}");
        if self.is_frozen() {
            return;
        }
        if let Err(e) = self.mark_needs_check() {
            tracing::error!("cannot record in the superblock that a check is needed: {e}");
        }
    }

    /// The state of metadata block `blkno` now, and whether a commit holds it locked (None if
    /// it is not in memory): what a commit checks of a block it stepped through as a copy.
    /// Never reads the device.
    pub fn buf_state(&self, blkno: u64) -> Option<(BufState, bool)> {
        self.is_metadata_block(blkno)
            .then(|| self.cache.state_and_locked(blkno))
            .flatten()
    }

    /// `buf` for a block about to be written whole (a newly allocated node): not read from the
    /// device when it is not in memory.
    pub fn buf_fresh(&self, blkno: u64) -> Result<Arc<Buf>, JournalError> {
        self.check_metadata_block(blkno)?;
        Ok(self.cache.get_fresh(blkno))
    }

    /// Whether write back may put `n` more blocks of file data on the logged path now
    /// (`LOGGED_BLOCKS_MAX`).
    pub fn may_log_data(&self, n: usize) -> bool {
        self.logged_data_len.load(Ordering::Relaxed) + n <= LOGGED_BLOCKS_MAX
    }

    /// Notes `blocks`, whose data a commit just logged whole: from now until the log is
    /// covered each is written only through the log, read from its buffer, cancelled when
    /// freed (`logged_data.rs`). Called after the commit, so the sequence open now is at least
    /// the one it went into.
    pub fn note_logged_data(&self, ino: u64, blocks: impl IntoIterator<Item = u64>) {
        let seq = self.current_seq();
        let mut d = self.logged_data.lock();
        for b in blocks {
            d.note(b, seq, ino);
        }
        self.logged_data_len.store(d.len(), Ordering::Relaxed);
    }

    /// The blocks of `[from, to)` on the logged path.
    pub fn logged_data_in(&self, from: u64, to: u64) -> Vec<u64> {
        if self.logged_data_len.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        self.logged_data.lock().in_range(from, to)
    }

    /// Takes the blocks of `[from, to)` off the logged path: they are being allocated, so they
    /// were freed (each cancelled) by a checkpoint that is stable.
    pub fn forget_logged_data(&self, from: u64, to: u64) {
        if self.logged_data_len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut d = self.logged_data.lock();
        d.forget(from, to);
        self.logged_data_len.store(d.len(), Ordering::Relaxed);
    }

    /// How many blocks logged for inode `ino` are on the logged path.
    pub fn logged_data_of(&self, ino: u64) -> usize {
        if self.logged_data_len.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.logged_data.lock().of_inode(ino)
    }

    /// Whether block `blkno` is on the logged path.
    pub fn is_logged_data(&self, blkno: u64) -> bool {
        self.logged_data_len.load(Ordering::Relaxed) != 0 && self.logged_data.lock().contains(blkno)
    }

    /// The buffers of blocks of `[from, to)` on the logged path, taken before a device read of
    /// them: held, they cannot be evicted, so after the read `overlay_logged_data` puts their
    /// newest bytes over what the device gave (which the AIL may not have written yet).
    pub fn logged_data_buffers(&self, from: u64, to: u64) -> Vec<Arc<Buf>> {
        self.logged_data_in(from, to)
            .into_iter()
            .filter_map(|b| self.cached_buf(b))
            .collect()
    }

    /// Copies the newest bytes of `bufs` (from `logged_data_buffers`) over `out`, which holds
    /// blocks from `first` on as the device gave them. A cancelled buffer (the block was freed
    /// since) means nothing.
    pub fn overlay_logged_data(&self, bufs: &[Arc<Buf>], first: u64, out: &mut [u8]) {
        let bs = self.block_size() as usize;
        for b in bufs {
            let Some(k) = b.blkno().checked_sub(first) else {
                continue;
            };
            let at = k as usize * bs;
            if at + bs > out.len() {
                continue;
            }
            let g = b.read();
            if !g.cancelled {
                out[at..at + bs].copy_from_slice(&g.data[..bs]);
            }
        }
    }

    /// Whether `blkno` is in the metadata area.
    fn is_metadata_block(&self, blkno: u64) -> bool {
        (self.meta_first..self.meta_end).contains(&blkno)
    }

    /// Refuses a block outside the metadata area.
    fn check_metadata_block(&self, blkno: u64) -> Result<(), JournalError> {
        if !self.is_metadata_block(blkno) {
            return Err(JournalError::BlockOutOfRange {
                blkno,
                first: self.meta_first,
                end: self.meta_end,
            });
        }
        Ok(())
    }

    /// Waits until no write back of a block of `[from, to)` is in flight: file data written
    /// straight to the device there lands after any older image of a block freed since
    /// (`WritingBack`).
    pub(crate) fn wait_write_back(&self, from: u64, to: u64) {
        self.writing_back.wait(from, to);
    }

    pub(crate) fn check_alive(&self) -> Result<(), JournalError> {
        if self.shut_down.load(Ordering::Acquire) {
            Err(JournalError::Shutdown)
        } else {
            Ok(())
        }
    }

    /// Shuts the journal down on request (the shutdown ioctl): as after an IO error, nothing
    /// more is written, and the next mount recovers from the log.
    pub fn shut_down_on_request(&self) {
        tracing::warn!("shut down on request: nothing more is written");
        // Down already after an error: that stays the cause.
        if !self.is_shut_down() {
            self.shut_down_requested.store(true, Ordering::Release);
        }
        let _ = self.shut_down::<()>(JournalError::Shutdown);
    }

    /// Whether the journal was shut down on request (and by no error before it).
    pub fn is_shut_down_on_request(&self) -> bool {
        self.shut_down_requested.load(Ordering::Acquire)
    }

    /// Whether the journal is shut down (after an IO error, or on request).
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// Marks the journal dead after an IO error: nothing more is written, so nothing written
    /// after the error can contradict what recovery will find.
    pub(crate) fn shut_down<T>(&self, e: impl Into<JournalError>) -> Result<T, JournalError> {
        let e = e.into();
        // Once: every later operation fails with `Shutdown`, which says nothing of the cause.
        // A bare `Shutdown` comes from a caller that logged its cause itself.
        if !self.shut_down.swap(true, Ordering::AcqRel) {
            match &e {
                JournalError::Shutdown => {
                    tracing::error!("journal shut down: nothing more is written")
                }
                e => tracing::error!("journal shut down, nothing more is written: {e}"),
            }
        }
        self.stop_commits();
        Err(e)
    }

    /// Sets the flag that fails every later commit and wakes every thread that waits for the
    /// journal (for room in the CIL, for log space, for a checkpoint), so that none waits for
    /// a worker that will not run again: after an error, or once an unmount is done.
    pub(crate) fn stop_commits(&self) {
        self.shut_down.store(true, Ordering::Release);
        self.grant.shut_down();
        {
            let _room = self.cil_room.lock();
            self.cil_switched.notify_all();
        }
        self.checkpoint_done.notify_all();
    }

    /// Records in the superblock that a corrupt metadata block was met, so that unmount, `info`
    /// and later mounts say a check is owed (ext4's error state; cleared only by a check that
    /// found the filesystem consistent). Written at once, FUA: a crash after it keeps it.
    /// Written even after a shutdown, since it changes nothing recovery reads. Returns whether
    /// this call set it.
    pub fn mark_needs_check(&self) -> Result<bool, JournalError> {
        let mut sb = self.sb.lock();
        if sb.needs_check {
            return Ok(false);
        }
        sb.needs_check = true;
        write_superblock(&*self.data, &sb, WriteFlags::FUA)?;
        Ok(true)
    }

    /// Sets the filesystem label: every copy of the superblock rewritten, backups first and
    /// the primary last, each FUA, so a crash leaves the old label or the new one, and the
    /// label is durable when this returns.
    pub fn set_label(&self, label: &[u8]) -> Result<(), JournalError> {
        self.check_alive()?;
        if self.frozen.load(Ordering::Acquire) {
            return Err(JournalError::ReadOnly);
        }
        let mut sb = self.sb.lock();
        let mut new = sb.clone();
        new.label = label.to_vec();
        write_superblock(&*self.data, &new, WriteFlags::FUA)?;
        *sb = new;
        Ok(())
    }

    /// Clean unmount: force the log, write every item back, write the unmount record, and mark the
    /// superblock clean. Afterwards mount replays nothing. Already clean (frozen, or unmounted
    /// before), it writes nothing.
    pub fn unmount(&self) -> Result<(), JournalError> {
        self.stop_worker();
        if self.sb.lock().clean {
            return Ok(());
        }
        self.check_alive()?;
        self.force_all()?;
        let r = self.write_back_ail(Lsn::from_raw(u64::MAX))?;
        assert!(
            self.ail.lock().is_empty(),
            "AIL not empty after a full push at unmount: {r:?}"
        );
        let mut w = self.writer.lock();
        let r = self.unmount_locked(&mut w);
        self.release_writer(w);
        r
    }

    fn unmount_locked(&self, w: &mut LogWriter) -> Result<(), JournalError> {
        let lsn = match w.write_unmount() {
            Ok(l) => l,
            Err(e) => return self.shut_down(e),
        };
        {
            let mut sp = self.space();
            sp.head = w.head();
            sp.safe_tail = lsn;
            self.publish_space(&sp);
        }
        self.mark_clean(true)?;
        self.stop_commits();
        Ok(())
    }

    /// Writes the superblock (FUA) saying the log is clean or in use; shuts the journal down
    /// if that fails. The superblock's lock (rank 19) is let go before a shutdown's wakeups
    /// take the grant head's and the CIL room's.
    fn mark_clean(&self, clean: bool) -> Result<(), JournalError> {
        let written = {
            let mut sb = self.sb.lock();
            sb.clean = clean;
            write_superblock(&*self.data, &sb, WriteFlags::FUA)
        };
        match written {
            Ok(()) => Ok(()),
            Err(e) => self.shut_down(e),
        }
    }

    /// Whether a remount read-only froze the journal (`freeze`).
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Remount read-only: admits no new transaction (`JournalError::ReadOnly`), waits for the
    /// open ones to commit, forces the log, writes every item back and writes an unmount
    /// record and a clean superblock, as a clean unmount does, but keeps the journal for
    /// `thaw`. Nothing is written until then: a crash replays nothing.
    pub fn freeze(&self) -> Result<(), JournalError> {
        /// Open transactions get this long to commit (they hold no lock a freeze waits for).
        const DRAIN: std::time::Duration = std::time::Duration::from_secs(30);
        self.check_alive()?;
        if self.frozen.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let r = (|| {
            // `reserve` looks at `frozen` after taking its space (under the grant lock, as this
            // read is): either it sees the freeze and gives the space back, or it is counted here.
            let mut waited = std::time::Duration::ZERO;
            while self.grant.read(|g| g.reserved) > 0 {
                if waited >= DRAIN {
                    return Err(JournalError::FreezeTimedOut(DRAIN));
                }
                let step = std::time::Duration::from_millis(1);
                cilfs_sync::thread::sleep(step);
                waited += step;
            }
            self.force_all()?;
            self.write_back_ail(Lsn::from_raw(u64::MAX))?;
            let mut w = self.writer.lock();
            let r = self.freeze_locked(&mut w);
            self.release_writer(w);
            r
        })();
        if r.is_err() {
            self.frozen.store(false, Ordering::SeqCst);
        }
        r
    }

    fn freeze_locked(&self, w: &mut LogWriter) -> Result<(), JournalError> {
        let lsn = match w.write_unmount() {
            Ok(l) => l,
            Err(e) => return self.shut_down(e),
        };
        // Covered now: the push worker's idle round writes no other record.
        self.extra
            .covered_head
            .store(w.head().raw(), Ordering::Relaxed);
        {
            let mut sp = self.space();
            sp.head = w.head();
            sp.safe_tail = sp.safe_tail.max(lsn);
            self.publish_space(&sp);
        }
        self.mark_clean(true)
    }

    /// Remount read-write after `freeze`: the superblock says the log is in use again (FUA,
    /// before any record can follow the unmount record), and transactions are admitted.
    pub fn thaw(&self) -> Result<(), JournalError> {
        self.check_alive()?;
        if !self.is_frozen() {
            return Ok(());
        }
        self.mark_clean(false)?;
        self.frozen.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Covers the log when idle: forces it, writes every item back and, if nothing was committed
    /// meanwhile, writes a record whose tail is itself, so that a crash now replays nothing.
    /// Returns whether it wrote one (nothing to do if the log is already covered).
    pub fn cover(&self) -> Result<bool, JournalError> {
        self.check_alive()?;
        self.force_all()?;
        self.write_back_ail(Lsn::from_raw(u64::MAX))?;
        // Checkpoints complete only under the writer lock: holding it, the AIL and CIL state
        // below cannot change under us.
        let mut w = self.writer.lock();
        let r = self.cover_locked(&mut w);
        self.release_writer(w);
        r
    }

    fn cover_locked(&self, w: &mut LogWriter) -> Result<bool, JournalError> {
        let covered_at = self.extra.covered_head.load(Ordering::Relaxed);
        if !self.ail.lock().is_empty() || !self.cil.is_empty() || covered_at == w.head().raw() {
            return Ok(false);
        }
        let lsn = match w.write_unmount() {
            Ok(l) => l,
            Err(e) => return self.shut_down(e),
        };
        self.extra
            .covered_head
            .store(w.head().raw(), Ordering::Relaxed);
        self.extra.covers.fetch_add(1, Ordering::Relaxed);
        // Everything committed is written back and the record's tail is itself: no image of
        // file data logged so far can be replayed, and its blocks may be written in place.
        let mut d = self.logged_data.lock();
        d.covered(self.completed_seq());
        self.logged_data_len.store(d.len(), Ordering::Relaxed);
        drop(d);
        let mut sp = self.space();
        sp.head = w.head();
        sp.safe_tail = sp.safe_tail.max(lsn);
        self.publish_space(&sp);
        Ok(true)
    }

    /// Turns writing the AIL back ahead of need off or on (on by default). Off, the log runs
    /// full and every byte of space comes from reservation relief, which the crash explorers
    /// must crash; nothing else should turn it off.
    pub fn set_ail_push_ahead(&self, on: bool) {
        self.ahead_paused.store(!on, Ordering::Relaxed);
    }

    /// (bytes reserved by open transactions, bytes charged by unwritten CIL contexts).
    pub fn space_in_use(&self) -> (u64, u64) {
        let charged = self.space().cil_charged;
        (self.grant.read(|g| g.reserved), charged)
    }

    pub fn stats(&self) -> JournalStats {
        self.collect_stats()
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

/// What a transaction asks of the journal: the journal's own operations.
impl TransJournal for Journal {
    type Error = JournalError;

    fn buf(&self, blkno: u64) -> Result<Arc<Buf>, JournalError> {
        Journal::buf(self, blkno)
    }

    fn buf_fresh(&self, blkno: u64) -> Result<Arc<Buf>, JournalError> {
        Journal::buf_fresh(self, blkno)
    }

    fn verify_read(&self, buf: &Buf, g: &BufData, stamp_at: u16) -> Result<(), JournalError> {
        Journal::verify_read(self, buf, g, stamp_at)
    }

    fn block_size(&self) -> u32 {
        Journal::block_size(self)
    }

    fn buf_waits(&self) -> &LockWaits {
        &self.buf_waits
    }

    fn reserve(&self, unit: u64) -> Result<(), JournalError> {
        Journal::reserve(self, unit)
    }

    fn try_reserve(&self, unit: u64) -> Result<bool, JournalError> {
        Journal::try_reserve(self, unit)
    }

    fn release_reservation(&self, unit: u64) {
        Journal::release_reservation(self, unit)
    }

    fn shut_down(&self, why: JournalError) -> JournalError {
        match Journal::shut_down::<()>(self, why) {
            Err(e) => e,
            Ok(()) => JournalError::Shutdown,
        }
    }

    fn conflict(blkno: u64) -> JournalError {
        JournalError::Conflict { blkno }
    }

    fn commit_images(
        &self,
        unit: u64,
        bufs: &[(&Arc<Buf>, &BufData)],
        late: Option<(&Arc<Buf>, &LateWrite)>,
        throttled: bool,
        images: Option<&mut [Vec<u8>]>,
    ) -> Result<u64, JournalError> {
        Journal::commit_images(self, unit, bufs, late, throttled, images)
    }
}

#[cfg(test)]
mod flush_order_tests;
#[cfg(test)]
mod tests;
