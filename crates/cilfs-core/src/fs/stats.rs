//! Filesystem counters (what `cilfs stat` and `cilfs bench fs` report).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct FsCounters {
    pub operations: AtomicU64,
    pub transactions: AtomicU64,
    /// Inode items logged (each logs the inode's leaf).
    pub inode_logs: AtomicU64,
    pub change_bumps: AtomicU64,
    /// Changes that did not bump the counter because nobody had queried it.
    pub change_bumps_skipped: AtomicU64,
    pub change_queries: AtomicU64,
    pub data_read_bytes: AtomicU64,
    pub data_write_bytes: AtomicU64,
    pub fsyncs: AtomicU64,
    pub orphans_reclaimed: AtomicU64,
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsStats {
    pub operations: u64,
    pub transactions: u64,
    pub inode_logs: u64,
    pub change_bumps: u64,
    pub change_bumps_skipped: u64,
    pub change_queries: u64,
    pub data_read_bytes: u64,
    pub data_write_bytes: u64,
    pub fsyncs: u64,
    pub orphans_reclaimed: u64,
    pub inodes_cached: u64,
    pub free_blocks: u64,
    pub busy_blocks: u64,
}

impl FsCounters {
    pub fn snapshot(&self) -> FsStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FsStats {
            operations: g(&self.operations),
            transactions: g(&self.transactions),
            inode_logs: g(&self.inode_logs),
            change_bumps: g(&self.change_bumps),
            change_bumps_skipped: g(&self.change_bumps_skipped),
            change_queries: g(&self.change_queries),
            data_read_bytes: g(&self.data_read_bytes),
            data_write_bytes: g(&self.data_write_bytes),
            fsyncs: g(&self.fsyncs),
            orphans_reclaimed: g(&self.orphans_reclaimed),
            ..FsStats::default()
        }
    }
}

pub(crate) fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}
