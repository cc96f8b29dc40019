//! Opening a journal: the geometry read, the log recovered (its committed checkpoints
//! replayed and made stable, or salvaged up to damage, or skipped), the superblock's mount
//! generation raised, and the log writer readied at the recovered head; and a read-only scan of
//! the log for the tools.

use super::{
    default_cache_bytes, push, Journal, JournalConfig, JournalError, PushMode, SpaceState,
    AIL_QUEUE_DEPTH, BAD_BLOCKS_LOGGED,
};
use crate::ail::{Ail, AilWorker, WritebackIo};
use crate::buf::BufCache;
use crate::cil::{Cil, CilLimits};
use crate::format::geometry::{write_superblock, Geometry, LogLocation};
use crate::format::superblock::Superblock;
use crate::format::FormatError;
use crate::log::recover::{
    replay, scan_log, LogEnd, LogRegion, LogScan, ReplayStats, ReplayTarget,
};
use crate::log::writer::LogPlacement;
use crate::log::{LogConfig, LogCounters, LogSpace, LogWriter, Lsn};
use crate::trans::grant::GrantHead;
use crate::util::lockstat::LockWaits;
use crate::util::sync::RankedMutex;
use cilfs_device::{Device, WriteFlags};
use cilfs_sync::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

/// What `Journal::open_with` does with the log it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recovery {
    /// Replays every committed checkpoint; refuses a damaged log.
    Replay,
    /// Replays nothing (`norecovery`).
    Skip,
    /// Replays the checkpoints before damage and discards the log past it (repair).
    Salvage,
}

/// What mounting found and did.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub was_clean: bool,
    pub checkpoints_replayed: u64,
    /// Checkpoints in the log left unreplayed (`open_norecovery`).
    pub checkpoints_skipped: u64,
    pub replay: ReplayStats,
    pub head: Lsn,
    pub tail: Lsn,
    /// What recovery discarded past the end of the valid log, if anything (a torn write, or
    /// in salvage mode the damage and the checkpoints past it).
    pub torn: Option<String>,
    /// Salvage mode discarded committed checkpoints past damage in the log.
    pub damaged: bool,
    /// Salvage mode found the log generation or the unclean-mount epoch at its largest
    /// value: after replay it zeroed the log and started the counters again.
    pub counters_reset: bool,
}

/// Whether a mount of this log would have to raise the log generation or the unclean-mount
/// epoch past its largest value: only damage gets there (no image mounts 2^32 times).
pub fn counters_exhausted(sb: &Superblock, s: &LogScan) -> bool {
    sb.log_generation.max(s.generation) == u32::MAX || (!sb.clean && sb.unclean_epoch == u64::MAX)
}

/// Zeroes the whole log, as mkfs leaves it, and makes it stable: what a log generation
/// started again needs (no record of an older generation may be left to chain after).
fn zero_log(region: &LogRegion<'_>) -> Result<(), JournalError> {
    cilfs_device::write_zeros(region.dev, region.offset, region.space.bytes(), &mut |_| {})?;
    region.dev.flush()?;
    Ok(())
}

fn log_region<'a>(
    geo: &Geometry,
    data: &'a dyn Device,
    logdev: Option<&'a dyn Device>,
) -> LogRegion<'a> {
    LogRegion {
        dev: match geo.log {
            LogLocation::Internal => data,
            LogLocation::External { .. } => logdev.unwrap_or(data),
        },
        offset: geo.log_offset,
        space: LogSpace::new(geo.log_bytes),
    }
}

/// Reads a filesystem's log without writing anything (logprint, check).
pub fn scan(
    data: &dyn Device,
    logdev: Option<&dyn Device>,
) -> Result<(Geometry, LogScan), JournalError> {
    let geo = Geometry::read(data, logdev)?;
    let region = log_region(&geo, data, logdev);
    let s = scan_log(&region, geo.sb.block_size)?;
    Ok((geo, s))
}

impl Journal {
    /// Mounts: reads the geometry, recovers the log (replaying committed checkpoints and making
    /// them stable), raises the mount generation (and the unclean epoch if the log was dirty) in
    /// the superblock, and readies the log for writing at the recovered head.
    pub fn open(
        data: Arc<dyn Device>,
        logdev: Option<Arc<dyn Device>>,
        cfg: JournalConfig,
    ) -> Result<Arc<Self>, JournalError> {
        Self::open_with(data, logdev, cfg, Recovery::Replay)
    }

    /// Mounts a filesystem whose log may be damaged (repair, and check in memory): replays
    /// the committed checkpoints before the damage and starts the log again there, discarding
    /// what lies past it (as `xfs_repair -L` zeroes a log); the report says what was lost.
    pub fn open_salvage(
        data: Arc<dyn Device>,
        logdev: Option<Arc<dyn Device>>,
        cfg: JournalConfig,
    ) -> Result<Arc<Self>, JournalError> {
        Self::open_with(data, logdev, cfg, Recovery::Salvage)
    }

    /// Mounts without replaying the log (XFS's `norecovery`): the metadata is what was written
    /// in place, possibly older than the log and inconsistent. Only for a read-only mount over
    /// devices that keep every write in memory: a later checkpoint written after the old head
    /// would make the skipped checkpoints unrecoverable.
    pub fn open_norecovery(
        data: Arc<dyn Device>,
        logdev: Option<Arc<dyn Device>>,
        cfg: JournalConfig,
    ) -> Result<Arc<Self>, JournalError> {
        Self::open_with(data, logdev, cfg, Recovery::Skip)
    }

    fn open_with(
        data: Arc<dyn Device>,
        logdev: Option<Arc<dyn Device>>,
        cfg: JournalConfig,
        mode: Recovery,
    ) -> Result<Arc<Self>, JournalError> {
        let recover = mode != Recovery::Skip;
        let geo = Geometry::read(&*data, logdev.as_deref())?;
        let mut cfg = cfg;
        if cfg.log == LogConfig::default() {
            // Defaults just work: on a small log they shrink to fit. Explicit settings must fit.
            cfg.log = cfg.log.fitted_to(geo.log_bytes);
        }
        cfg.log.validate(geo.log_bytes)?;
        let bs = geo.sb.block_size;
        let region = log_region(&geo, &*data, logdev.as_deref());
        let s = scan_log(&region, bs)?;
        let damaged = matches!(s.end, LogEnd::Damaged { .. });
        if damaged && mode == Recovery::Replay {
            return Err(JournalError::DamagedLog(
                s.end.describe().unwrap_or_default(),
            ));
        }
        let salvage = mode == Recovery::Salvage;
        let (sb, replayed, counters_reset) =
            Self::replay_and_mark(&geo, &*data, &region, &s, recover, salvage)?;
        // A zeroed log is read again: its head and generation are the writer's start.
        let s = match counters_reset {
            true => scan_log(&region, bs)?,
            false => s,
        };
        let (meta_first, meta_end) = geo.metadata_area();
        let counters = Arc::new(LogCounters::default());
        let space_math = LogSpace::new(geo.log_bytes);
        let writer = Self::log_writer(&geo, &data, logdev.as_ref(), &cfg, &s, &sb, &counters);
        let recovered = RecoveryReport {
            was_clean: geo.sb.clean,
            checkpoints_replayed: if recover {
                s.checkpoints.len() as u64
            } else {
                0
            },
            checkpoints_skipped: if recover {
                0
            } else {
                s.checkpoints.len() as u64
            },
            replay: replayed,
            head: s.head,
            tail: s.tail,
            torn: s.end.describe(),
            damaged,
            counters_reset,
        };
        let limits = CilLimits::new(geo.log_bytes, &cfg.log, cfg.cil_limit);
        // Inline mode (the crash explorers) keeps one IO at a time so runs replay exactly.
        let ail_io = match cfg.push_mode {
            PushMode::Inline => WritebackIo::Sync,
            PushMode::Background => WritebackIo::for_device(&*data, AIL_QUEUE_DEPTH),
        };
        let j = Arc::new(Self {
            cache: BufCache::new(
                Arc::clone(&data),
                bs,
                cfg.cache_bytes_max.unwrap_or_else(default_cache_bytes),
            ),
            data,
            logdev,
            limits,
            space_math,
            cil: Cil::new(1),
            cil_switched: Condvar::new(),
            cil_room: RankedMutex::new(()),
            cil_next_shard: std::sync::atomic::AtomicUsize::new(0),
            buf_waits: LockWaits::new("buffer"),
            cil_waits: LockWaits::new("cil"),
            space_waits: LockWaits::new("log space"),
            flush_clock: writer.flush_clock(),
            writer: RankedMutex::new(writer),
            space: RankedMutex::new(SpaceState {
                cil_charged: 0,
                head: s.head,
                // Everything before the head was replayed and flushed.
                safe_tail: s.head,
            }),
            checkpoint_done: Condvar::new(),
            force_target: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            grant: GrantHead::new(space_math.bytes() - 2 * u64::from(cfg.log.logbsize)),
            ail: RankedMutex::new(Ail::default()),
            ail_writeback: RankedMutex::new(ail_io),
            counters,
            extra: Default::default(),
            shut_down: Arc::new(AtomicBool::new(false)),
            writing_back: Arc::default(),
            shut_down_requested: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            worker: Mutex::new(None),
            ail_worker: Mutex::new(None),
            sb: RankedMutex::new(sb),
            geo,
            cfg,
            meta_first,
            meta_end,
            recovered,
            ahead_paused: AtomicBool::new(false),
            block_checks: cilfs_sync::RwLock::new(Vec::new()),
            bad_blocks: Mutex::new(std::collections::BTreeSet::new()),
            logged_data: Mutex::new(Default::default()),
            logged_data_len: std::sync::atomic::AtomicUsize::new(0),
        });
        if cfg.push_mode == PushMode::Background {
            *j.worker.lock() = Some(push::Worker::start(&j));
            *j.ail_worker.lock() = Some(AilWorker::start(&j, |j: &Journal, urgent| {
                let r = if urgent {
                    j.relieve_waiters()
                } else {
                    j.ail_push_ahead()
                };
                r.map_err(|e| j.worker_failed(e)).is_ok()
            }));
        }
        Ok(j)
    }

    /// Replays the log's checkpoints (unless `recover` is off) and writes the superblock that
    /// says so: a mount generation past the log's, not clean, needing a check if a block was
    /// damaged. Returns that superblock, what replay did, and whether the counters were
    /// started again (only with `reset_exhausted`, salvage's: the log is then zeroed, and
    /// the caller reads it again).
    fn replay_and_mark(
        geo: &Geometry,
        data: &dyn Device,
        region: &LogRegion<'_>,
        s: &LogScan,
        recover: bool,
        reset_exhausted: bool,
    ) -> Result<(Superblock, ReplayStats, bool), JournalError> {
        let (meta_first, meta_end) = geo.metadata_area();
        let target = ReplayTarget {
            dev: data,
            block_size: geo.sb.block_size,
            first_block: meta_first,
            end_block: meta_end,
            uuid: geo.sb.uuid,
        };
        let replayed = if recover {
            replay(&s.checkpoints, &target)?
        } else {
            ReplayStats::default()
        };
        let mut sb = geo.sb.clone();
        for d in replayed.damaged.iter().take(BAD_BLOCKS_LOGGED) {
            tracing::warn!("recovery: {d}; run cilfs check");
        }
        if !replayed.damaged.is_empty() {
            sb.needs_check = true;
        }
        // Counters at their largest value are damage (no image mounts 2^32 times): refused,
        // not wrapped, since the change attribute and stale-record checks rely on them growing.
        let exhausted = |field: &'static str| FormatError::Invalid {
            what: "superblock",
            field,
            reason: "at its largest value: the image is damaged (cilfs repair starts it again)"
                .into(),
        };
        // Salvage starts them again, as a new filesystem's, once what the log held is in
        // place and stable: the log is zeroed (nothing of an older generation is left) and the
        // change attribute may repeat values clients saw before (repair says so).
        let reset = reset_exhausted && counters_exhausted(&sb, s);
        let mut log_generation = sb.log_generation.max(s.generation);
        if reset {
            data.flush()?;
            zero_log(region)?;
            log_generation = 0;
            if sb.unclean_epoch == u64::MAX {
                sb.unclean_epoch = 0;
            }
            tracing::warn!(
                "recovery: the log generation or the unclean-mount epoch was at its largest \
                 value; the log was replayed, zeroed and the counters started again"
            );
        }
        if !sb.clean {
            sb.unclean_epoch = (sb.unclean_epoch.checked_add(1))
                .ok_or_else(|| exhausted("unclean mount epoch"))?;
        }
        sb.clean = false;
        sb.log_generation =
            (log_generation.checked_add(1)).ok_or_else(|| exhausted("log generation"))?;
        // PREFLUSH: the replayed blocks are stable before the superblock says we moved on.
        write_superblock(data, &sb, WriteFlags::PREFLUSH | WriteFlags::FUA)?;
        Ok((sb, replayed, reset))
    }

    /// The log writer, at the recovered head with the mount's generation; its iclog IO
    /// concurrent in background mode.
    fn log_writer(
        geo: &Geometry,
        data: &Arc<dyn Device>,
        logdev: Option<&Arc<dyn Device>>,
        cfg: &JournalConfig,
        s: &LogScan,
        sb: &Superblock,
        counters: &Arc<LogCounters>,
    ) -> LogWriter {
        let place = LogPlacement {
            log_dev: match geo.log {
                LogLocation::Internal => Arc::clone(data),
                LogLocation::External { .. } => logdev.cloned().unwrap_or_else(|| Arc::clone(data)),
            },
            data_dev: Arc::clone(data),
            external: matches!(geo.log, LogLocation::External { .. }),
            offset: geo.log_offset,
            space: LogSpace::new(geo.log_bytes),
        };
        let writer = LogWriter::new(
            place,
            cfg.log,
            s.head,
            sb.log_generation,
            Arc::clone(counters),
        );
        // Concurrent iclog IO in service; inline pushes stay synchronous and deterministic.
        match cfg.push_mode {
            PushMode::Background => writer.with_async_io(),
            PushMode::Inline => writer,
        }
    }
}
