//! Filesystem counters (what `cilfs stat` and `cilfs bench fs` report).

use crate::util::counter::Counter;

#[derive(Debug, Default)]
pub struct FsCounters {
    pub operations: Counter,
    pub transactions: Counter,
    /// Inode items logged (each logs the inode's leaf).
    pub inode_logs: Counter,
    pub change_bumps: Counter,
    /// Changes that did not bump the counter because nobody had queried it.
    pub change_bumps_skipped: Counter,
    pub change_queries: Counter,
    pub data_read_bytes: Counter,
    pub data_write_bytes: Counter,
    /// File data an fsync's write back put into the log (`posix/sync.rs` `log_runs`).
    pub data_logged_bytes: Counter,
    pub fsyncs: Counter,
    pub orphans_reclaimed: Counter,
    /// Size changes kept in memory until the inode's next log (not logged by the write).
    pub deferred_size_updates: Counter,
    /// atimes moved by reads and readdir (logged, or kept in memory with lazytime).
    pub atime_updates: Counter,
    /// Operations run again after waiting for log space, or after a log force, outside the
    /// filesystem lock (fs/retry.rs).
    pub retries_log_space: Counter,
    pub retries_force: Counter,
    pub retries_read: Counter,
    /// Optimistic runs that found what they read changed and ran again (`shared_tx.rs`).
    pub conflicts: Counter,
    /// Optimistic commits published under the shared state lock (`shared_tx.rs`).
    pub shared_publishes: Counter,
    /// Readers run again after a commit beside them changed the tree's shape (`ReadView`).
    pub retries_reshaped: Counter,
    /// Runs that found an inode a commit is freeing, yielded and ran again (`Retry::Freeing`).
    pub retries_freeing: Counter,
    pub deferred_sync_forces: Counter,
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
    pub data_logged_bytes: u64,
    pub fsyncs: u64,
    pub orphans_reclaimed: u64,
    pub deferred_size_updates: u64,
    pub atime_updates: u64,
    pub retries_log_space: u64,
    pub retries_force: u64,
    pub retries_read: u64,
    pub conflicts: u64,
    pub shared_publishes: u64,
    pub retries_reshaped: u64,
    pub retries_freeing: u64,
    pub deferred_sync_forces: u64,
    pub inodes_cached: u64,
    pub free_blocks: u64,
    pub busy_blocks: u64,
}

impl FsCounters {
    pub fn snapshot(&self) -> FsStats {
        let g = Counter::get;
        FsStats {
            operations: g(&self.operations),
            transactions: g(&self.transactions),
            inode_logs: g(&self.inode_logs),
            change_bumps: g(&self.change_bumps),
            change_bumps_skipped: g(&self.change_bumps_skipped),
            change_queries: g(&self.change_queries),
            data_read_bytes: g(&self.data_read_bytes),
            data_write_bytes: g(&self.data_write_bytes),
            data_logged_bytes: g(&self.data_logged_bytes),
            fsyncs: g(&self.fsyncs),
            orphans_reclaimed: g(&self.orphans_reclaimed),
            deferred_size_updates: g(&self.deferred_size_updates),
            atime_updates: g(&self.atime_updates),
            retries_log_space: g(&self.retries_log_space),
            retries_force: g(&self.retries_force),
            retries_read: g(&self.retries_read),
            conflicts: g(&self.conflicts),
            shared_publishes: g(&self.shared_publishes),
            retries_reshaped: g(&self.retries_reshaped),
            retries_freeing: g(&self.retries_freeing),
            deferred_sync_forces: g(&self.deferred_sync_forces),
            ..FsStats::default()
        }
    }
}

pub(crate) fn bump(a: &Counter) {
    a.add(1);
}

cilfs_sync::thread_local! {
    static BY_THIS_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A transaction committed: counted, and counted for the calling thread.
pub(crate) fn count_transaction(c: &FsCounters) {
    c.transactions.add(1);
    BY_THIS_THREAD.with(|n| n.set(n.get() + 1));
}

/// Transactions the calling thread has committed so far, on any filesystem: how a caller that
/// runs operations beside other threads (the flusher's write back, other callers) tells
/// whether an operation of its own committed.
pub fn transactions_by_this_thread() -> u64 {
    BY_THIS_THREAD.with(std::cell::Cell::get)
}

/// Adds a byte count to a counter.
pub(crate) fn bump_bytes(a: &Counter, n: usize) {
    a.add(n as u64);
}

impl super::Fs {
    pub fn stats(&self) -> FsStats {
        let mut s = self.stats.snapshot();
        let st = self.read_state();
        s.inodes_cached = st.inodes.len() as u64;
        s.free_blocks = {
            let h = self.hdr(&st);
            h.free_blocks + h.freelist.len() as u64
        };
        // Pruned here too: otherwise extents whose checkpoint is long stable still showed as
        // busy until the next transaction began.
        s.busy_blocks = {
            let mut b = self.lock_busy();
            b.prune(self.journal.completed_seq());
            b.blocks()
        };
        s
    }

    /// Every counter of the filesystem, its journal and its devices, as (name, value) pairs in
    /// a fixed order: what `cilfs stat` shows (through the root's `user.cilfs.stats` xattr).
    pub fn counters(&self) -> Vec<(String, u64)> {
        let f = self.stats();
        let j = self.journal.stats();
        let mut v: Vec<(String, u64)> = [
            ("operations", f.operations),
            ("transactions", f.transactions),
            ("inode_logs", f.inode_logs),
            ("change_bumps", f.change_bumps),
            ("change_bumps_skipped", f.change_bumps_skipped),
            ("change_queries", f.change_queries),
            ("file_read_bytes", f.data_read_bytes),
            ("file_write_bytes", f.data_write_bytes),
            ("file_logged_bytes", f.data_logged_bytes),
            ("fsyncs", f.fsyncs),
            ("orphans_reclaimed", f.orphans_reclaimed),
            ("deferred_size_updates", f.deferred_size_updates),
            ("atime_updates", f.atime_updates),
            ("retries_log_space", f.retries_log_space),
            ("retries_force", f.retries_force),
            ("retries_read", f.retries_read),
            ("conflicts", f.conflicts),
            ("shared_publishes", f.shared_publishes),
            ("retries_reshaped", f.retries_reshaped),
            ("retries_freeing", f.retries_freeing),
            ("deferred_sync_forces", f.deferred_sync_forces),
            ("inodes_cached", f.inodes_cached),
            ("free_blocks", f.free_blocks),
            ("busy_blocks", f.busy_blocks),
            ("commits", j.commits),
            ("checkpoints", j.log.checkpoints),
            ("iclog_writes", j.log.iclog_writes),
            ("log_bytes", j.log.log_bytes),
            ("noiclog_waits", j.log.noiclog_waits),
            ("log_forces", j.log.log_forces),
            ("reservation_waits", j.log.reservation_waits),
            ("cil_space_limit", j.cil_space_limit),
            ("cil_bytes_max", j.cil_bytes_max),
            ("cil_blocked_commits", j.cil_blocked_commits),
            ("ail_len", j.ail_len),
            ("ail_writeback_bytes", j.ail_writeback_bytes),
            // Of the data device's flushes, those the AIL issued (ail flush policy).
            ("ail_flushes", j.ail_flushes),
            ("items_logged", j.items_logged),
            ("covers", j.covers),
            ("cache_buffers", j.cache_buffers),
            // A setting, not a count: 1 ordered, 0 writeback (the summary of `cilfs stat`).
            (
                "data_ordered",
                u64::from(self.opts.data == super::DataMode::Ordered),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, x) in j.data_dev.fields() {
            v.push((format!("data_{k}"), x));
        }
        if let Some(l) = j.log_dev {
            for (k, x) in l.fields() {
                v.push((format!("log_{k}"), x));
            }
        }
        for l in self.lock_waits() {
            let name: String = l
                .name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect::<String>()
                .split('_')
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join("_");
            v.push((format!("lock_{name}_acquired"), l.acquired));
            v.push((format!("lock_{name}_contended"), l.contended));
            v.push((format!("lock_{name}_wait_us"), l.wait_ns / 1000));
        }
        // Each project with limits or data IO: what it did and how long it waited for its
        // budget.
        for (id, _, t) in self.tenants() {
            for (dir, d) in [("write", t.write), ("read", t.read)] {
                v.push((format!("tenant_{id}_{dir}_ios"), d.ios));
                v.push((format!("tenant_{id}_{dir}_bytes"), d.bytes));
                v.push((format!("tenant_{id}_{dir}_throttled_ios"), d.throttled_ios));
                v.push((
                    format!("tenant_{id}_{dir}_wait_us"),
                    d.throttle_wait.as_micros() as u64,
                ));
            }
        }
        v
    }
}
