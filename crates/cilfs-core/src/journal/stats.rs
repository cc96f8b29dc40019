use super::Journal;
use crate::log::writer::LogStats;
use cilfs_device::IoStats;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub(crate) struct ExtraCounters {
    /// Bumped by every commit: spread over cache lines, as is the maximum below by being
    /// written only when it rises (`crate::util::counter`).
    pub commits: crate::util::counter::Counter,
    pub cil_bytes_max: crate::util::counter::Padded,
    pub cil_blocked_commits: AtomicU64,
    pub ail_writeback_bytes: AtomicU64,
    pub ail_flushes: AtomicU64,
    pub items_logged: AtomicU64,
    pub tail_records: AtomicU64,
    pub relief_passes: AtomicU64,
    pub overlapped_checkpoints: AtomicU64,
    /// Microseconds committers spent waiting for log space, and blocked at 2S.
    pub reservation_wait_us: AtomicU64,
    pub cil_blocked_us: AtomicU64,
    pub covers: AtomicU64,
    /// Raw LSN of the log head right after the last cover record.
    pub covered_head: AtomicU64,
}

/// Everything the journal counts.
#[derive(Debug, Clone, Default)]
pub struct JournalStats {
    pub log: LogStats,
    pub data_dev: IoStats,
    /// External log device, if any.
    pub log_dev: Option<IoStats>,
    pub commits: u64,
    pub cil_space_limit: u64,
    pub cil_bytes_max: u64,
    pub cil_blocked_commits: u64,
    pub ail_writeback_bytes: u64,
    /// Data-device flushes the AIL issued itself before letting the tail pass its write back
    /// (ail policy): the rest of the device's flushes are the commit path's (and fsync's).
    pub ail_flushes: u64,
    pub ail_len: u64,
    /// Item images written in checkpoints (a relogged item counts once per checkpoint).
    pub items_logged: u64,
    /// Empty checkpoints written only to carry a tail that moved for waiting reservations.
    pub tail_records: u64,
    /// Passes the AIL thread made to free log space for a waiting reservation.
    pub relief_passes: u64,
    /// Checkpoints written while the commit iclog of the one before was still in flight.
    pub overlapped_checkpoints: u64,
    /// Microseconds transactions spent waiting for log space (summed over threads).
    pub reservation_wait_us: u64,
    /// Microseconds committers spent blocked at twice the CIL space limit (summed over threads).
    pub cil_blocked_us: u64,
    /// Cover records written because the log was idle.
    pub covers: u64,
    pub cache_buffers: u64,
    pub cache_evicted: u64,
}

impl Journal {
    pub(crate) fn collect_stats(&self) -> JournalStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        JournalStats {
            log: self.counters.snapshot(),
            data_dev: self.data.stats(),
            log_dev: self.logdev.as_ref().map(|d| d.stats()),
            commits: self.extra.commits.get(),
            cil_space_limit: self.limits.space_limit,
            cil_bytes_max: l(&self.extra.cil_bytes_max.0),
            cil_blocked_commits: l(&self.extra.cil_blocked_commits),
            ail_writeback_bytes: l(&self.extra.ail_writeback_bytes),
            ail_flushes: l(&self.extra.ail_flushes),
            ail_len: self.ail.lock().len() as u64,
            items_logged: l(&self.extra.items_logged),
            tail_records: l(&self.extra.tail_records),
            relief_passes: l(&self.extra.relief_passes),
            overlapped_checkpoints: l(&self.extra.overlapped_checkpoints),
            reservation_wait_us: l(&self.extra.reservation_wait_us),
            cil_blocked_us: l(&self.extra.cil_blocked_us),
            covers: l(&self.extra.covers),
            cache_buffers: self.cache.len() as u64,
            cache_evicted: self.cache.evicted(),
        }
    }
}
