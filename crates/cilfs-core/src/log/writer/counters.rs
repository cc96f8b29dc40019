//! The log's counters (docs/journal.md section 2): shared with whoever reports them, and a
//! snapshot of them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Log counters (docs/journal.md section 2), shared with whoever reports them.
#[derive(Debug, Default)]
pub struct LogCounters {
    pub iclog_writes: AtomicU64,
    pub log_bytes: AtomicU64,
    pub checkpoints: AtomicU64,
    pub noiclog_waits: AtomicU64,
    pub log_forces: AtomicU64,
    pub reservation_waits: AtomicU64,
    pub unmount_records: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    pub iclog_writes: u64,
    pub log_bytes: u64,
    pub checkpoints: u64,
    pub noiclog_waits: u64,
    pub log_forces: u64,
    pub reservation_waits: u64,
    pub unmount_records: u64,
}

impl LogCounters {
    pub fn snapshot(&self) -> LogStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LogStats {
            iclog_writes: l(&self.iclog_writes),
            log_bytes: l(&self.log_bytes),
            checkpoints: l(&self.checkpoints),
            noiclog_waits: l(&self.noiclog_waits),
            log_forces: l(&self.log_forces),
            reservation_waits: l(&self.reservation_waits),
            unmount_records: l(&self.unmount_records),
        }
    }
}

impl LogStats {
    pub fn fields(&self) -> [(&'static str, u64); 7] {
        [
            ("iclog_writes", self.iclog_writes),
            ("log_bytes", self.log_bytes),
            ("checkpoints", self.checkpoints),
            ("noiclog_waits", self.noiclog_waits),
            ("log_forces", self.log_forces),
            ("reservation_waits", self.reservation_waits),
            ("unmount_records", self.unmount_records),
        ]
    }
}
