use std::sync::atomic::{AtomicU64, Ordering};

/// Live IO counters of one device. Every device implementation owns one.
#[derive(Debug, Default)]
pub struct IoCounters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    flushes_issued: AtomicU64,
    flushes_elided: AtomicU64,
    preflush_writes: AtomicU64,
    fua_writes: AtomicU64,
    sync_syscalls: AtomicU64,
}

/// A snapshot of [`IoCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    /// Cache flushes actually performed: explicit flushes and the PREFLUSH half of writes.
    pub flushes_issued: u64,
    /// Flushes (explicit or PREFLUSH) skipped because nothing volatile was outstanding.
    pub flushes_elided: u64,
    pub preflush_writes: u64,
    pub fua_writes: u64,
    /// fdatasync calls and RWF_DSYNC writes made (file devices only).
    pub sync_syscalls: u64,
}

impl IoStats {
    /// Field names and values, in a fixed order, for printing.
    pub fn fields(&self) -> [(&'static str, u64); 9] {
        [
            ("reads", self.reads),
            ("read_bytes", self.read_bytes),
            ("writes", self.writes),
            ("write_bytes", self.write_bytes),
            ("flushes_issued", self.flushes_issued),
            ("flushes_elided", self.flushes_elided),
            ("preflush_writes", self.preflush_writes),
            ("fua_writes", self.fua_writes),
            ("sync_syscalls", self.sync_syscalls),
        ]
    }
}

fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

impl IoCounters {
    pub fn read(&self, bytes: usize) {
        bump(&self.reads, 1);
        bump(&self.read_bytes, bytes as u64);
    }

    /// Counts a write and its flags (the PREFLUSH half is counted by `flush_issued`/`flush_elided`).
    pub fn write(&self, bytes: usize, flags: crate::WriteFlags) {
        bump(&self.writes, 1);
        bump(&self.write_bytes, bytes as u64);
        if flags.preflush() {
            bump(&self.preflush_writes, 1);
        }
        if flags.fua() {
            bump(&self.fua_writes, 1);
        }
    }

    pub fn flush_issued(&self) {
        bump(&self.flushes_issued, 1);
    }

    pub fn flush_elided(&self) {
        bump(&self.flushes_elided, 1);
    }

    pub fn sync_syscall(&self) {
        bump(&self.sync_syscalls, 1);
    }

    pub fn snapshot(&self) -> IoStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        IoStats {
            reads: l(&self.reads),
            read_bytes: l(&self.read_bytes),
            writes: l(&self.writes),
            write_bytes: l(&self.write_bytes),
            flushes_issued: l(&self.flushes_issued),
            flushes_elided: l(&self.flushes_elided),
            preflush_writes: l(&self.preflush_writes),
            fua_writes: l(&self.fua_writes),
            sync_syscalls: l(&self.sync_syscalls),
        }
    }
}

/// Knows whether a device has completed writes that no flush has covered yet, so that a flush
/// with nothing to make stable can be skipped. Correct under concurrency: a flush covers only the
/// writes that had completed when it sampled the generation, never ones completing during it.
#[derive(Debug, Default)]
pub struct VolatileTracker {
    completed: AtomicU64,
    stable_upto: AtomicU64,
}

impl VolatileTracker {
    /// A write without FUA has completed and sits in the volatile cache.
    pub fn volatile_write_completed(&self) {
        self.completed.fetch_add(1, Ordering::AcqRel);
    }

    /// Returns the generation a flush issued now would cover, or `None` if nothing is volatile.
    pub fn flush_needed(&self) -> Option<u64> {
        let completed = self.completed.load(Ordering::Acquire);
        (completed != self.stable_upto.load(Ordering::Acquire)).then_some(completed)
    }

    /// The generation a flush issued now covers, volatile writes or not.
    pub fn current(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// A flush that sampled `generation` has completed.
    pub fn flush_done(&self, generation: u64) {
        self.stable_upto.fetch_max(generation, Ordering::AcqRel);
    }
}
