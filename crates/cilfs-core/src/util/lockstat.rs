//! Lock contention, per lock of the lock table in docs/ARCHITECTURE.md: how many acquisitions,
//! how many found the lock taken, and how long those waited. Only an acquisition whose try
//! failed is timed, so an uncontended one costs a try and a counter more than a plain lock.
//! `cilfs bench fs` reports each lock's waiting against the threads' time (the target in docs/concurrency.md:
//! no lock holds more than a tenth of it), `cilfs stat` the raw counts.
//!
//! Acquisitions are counted in one of several cache lines, chosen per thread: one shared
//! counter passed its line between the cores on every acquisition, and a create takes some
//! fifty buffer locks (5-7% of a two-thread create run went to that counter alone).

use crate::util::counter::{shard, Padded, SHARDS};
use std::sync::atomic::{AtomicU64, Ordering};

/// The counters of one lock.
#[derive(Debug)]
pub struct LockWaits {
    name: &'static str,
    acquired: [Padded; SHARDS],
    contended: AtomicU64,
    wait_ns: AtomicU64,
}

/// A snapshot of one lock's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockWaitStats {
    pub name: &'static str,
    pub acquired: u64,
    pub contended: u64,
    pub wait_ns: u64,
}

impl LockWaits {
    pub const fn new(name: &'static str) -> Self {
        LockWaits {
            name,
            acquired: [const { Padded(AtomicU64::new(0)) }; SHARDS],
            contended: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        }
    }

    /// Takes the lock through `try_lock`, or, when it is taken, through `lock`, timing the wait.
    pub fn acquire<G>(&self, try_lock: impl FnOnce() -> Option<G>, lock: impl FnOnce() -> G) -> G {
        self.acquired[shard()].0.fetch_add(1, Ordering::Relaxed);
        if let Some(g) = try_lock() {
            return g;
        }
        let t = cilfs_sync::time::now();
        let g = lock();
        self.contended.fetch_add(1, Ordering::Relaxed);
        self.wait_ns.fetch_add(
            cilfs_sync::time::now()
                .saturating_duration_since(t)
                .as_nanos() as u64,
            Ordering::Relaxed,
        );
        g
    }

    /// The lock through `try_lock` alone: counted as taken if it was, else not at all (the
    /// caller then waits for it through `acquire_short`, which counts the wait).
    pub fn try_acquire<G>(&self, try_lock: impl FnOnce() -> Option<G>) -> Option<G> {
        let g = try_lock()?;
        self.acquired[shard()].0.fetch_add(1, Ordering::Relaxed);
        Some(g)
    }

    /// `acquire` for a lock held only for moments (a buffer, an inode cache or page cache
    /// shard, the header): a waiter polls it for a few microseconds before it blocks
    /// (`spin::spin_then_block`).
    pub fn acquire_short<G>(
        &self,
        try_lock: impl Fn() -> Option<G>,
        lock: impl FnOnce() -> G,
    ) -> G {
        self.acquire(&try_lock, || {
            crate::util::spin::spin_then_block(&try_lock, lock)
        })
    }

    pub fn snapshot(&self) -> LockWaitStats {
        LockWaitStats {
            name: self.name,
            acquired: self
                .acquired
                .iter()
                .map(|c| c.0.load(Ordering::Relaxed))
                .sum(),
            contended: self.contended.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
        }
    }
}

impl LockWaitStats {
    /// The counts since `base` (an earlier snapshot of the same lock).
    pub fn since(&self, base: &LockWaitStats) -> LockWaitStats {
        LockWaitStats {
            name: self.name,
            acquired: self.acquired.saturating_sub(base.acquired),
            contended: self.contended.saturating_sub(base.contended),
            wait_ns: self.wait_ns.saturating_sub(base.wait_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::{Arc, Barrier, Mutex};

    #[test]
    fn counts_every_acquisition_and_only_contended_ones_as_waits() {
        let w = LockWaits::new("m");
        let m = Mutex::new(0);
        for _ in 0..3 {
            let _g = w.acquire(|| m.try_lock().ok(), || m.lock().unwrap());
        }
        assert_eq!((w.snapshot().acquired, w.snapshot().contended), (3, 0));
        // Held by another thread until this one has found it taken.
        let w = Arc::new(LockWaits::new("m"));
        let m = Arc::new(Mutex::new(0));
        let b = Arc::new(Barrier::new(2));
        let held = m.lock().unwrap();
        let t = {
            let (w, m, b) = (Arc::clone(&w), Arc::clone(&m), Arc::clone(&b));
            std::thread::spawn(move || {
                let mut g = w.acquire(
                    || {
                        let r = m.try_lock().ok();
                        b.wait();
                        r
                    },
                    || m.lock().unwrap(),
                );
                *g += 1;
            })
        };
        b.wait();
        drop(held);
        t.join().unwrap();
        let s = w.snapshot();
        assert_eq!((s.acquired, s.contended), (1, 1));
        assert_eq!(*m.lock().unwrap(), 1);
        assert_eq!(s.since(&s).acquired, 0);
    }
}
