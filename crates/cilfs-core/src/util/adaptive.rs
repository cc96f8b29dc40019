//! A mutex whose waiters spin while its holder is likely still running, and sleep otherwise:
//! what Linux's mutexes do by watching whether the owner is on a CPU, approximated by how long
//! ago the holder took the lock, since userspace cannot see the owner's CPU.
//!
//! For a lock every commit takes for a moment (the publish turn, about a microsecond). With
//! eight threads on two vCPUs, a waiter that went to sleep at once was woken only after the
//! scheduler got round to it (half a millisecond a wait on this VM, where a wake alone is a
//! 46 us round trip), and the lock then passed from sleeper to sleeper: a convoy that held the
//! turn's row at 38-41% of thread time whatever its hold. A holder preempted inside it shows
//! as an old hold, and its waiters sleep rather than spin against it.

use crate::util::lockstat::LockWaits;
use crate::util::spin::{now_ns, poll_then_block};
use cilfs_sync::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, Ordering};

/// A hold younger than this is taken to be running: its waiters spin.
const HOLD_YOUNG_NS: u64 = 4_000;
/// Most a waiter spins before it sleeps, however young the holds it sees.
const SPIN_MAX_NS: u64 = 20_000;

#[derive(Debug, Default)]
pub struct AdaptiveMutex {
    inner: Mutex<()>,
    /// When the holder took it (`now_ns`), stored just after it did.
    since: AtomicU64,
}

impl AdaptiveMutex {
    pub const fn new() -> Self {
        Self {
            inner: Mutex::new(()),
            since: AtomicU64::new(0),
        }
    }

    /// Takes the lock; its waits (spun or slept) are counted in `waits`.
    pub fn lock(&self, waits: &LockWaits) -> MutexGuard<'_, ()> {
        let g = waits.acquire(|| self.inner.try_lock(), || self.lock_contended());
        self.since.store(now_ns(), Ordering::Relaxed);
        g
    }

    fn lock_contended(&self) -> MutexGuard<'_, ()> {
        poll_then_block(
            || self.inner.try_lock(),
            |now, start| keeps_spinning(now, self.since.load(Ordering::Relaxed), start),
            || self.inner.lock(),
        )
    }
}

/// Whether a waiter that began at `start` spins on at `now`, the holder having taken the lock
/// at `since`.
fn keeps_spinning(now: u64, since: u64, start: u64) -> bool {
    now.saturating_sub(since) <= HOLD_YOUNG_NS && now.saturating_sub(start) <= SPIN_MAX_NS
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Mutual exclusion: increments made under the lock as separate loads and stores, by four
    /// threads at once, are all counted.
    #[test]
    fn holders_exclude_one_another() {
        let m = Arc::new(AdaptiveMutex::new());
        let waits = Arc::new(LockWaits::new("test"));
        let n = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (m, waits, n) = (Arc::clone(&m), Arc::clone(&waits), Arc::clone(&n));
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let _g = m.lock(&waits);
                        let v = n.load(Ordering::Relaxed);
                        std::hint::spin_loop();
                        n.store(v + 1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(n.load(Ordering::Relaxed), 80_000);
        assert_eq!(waits.snapshot().acquired, 80_000);
    }

    /// A waiter spins behind a young hold, and sleeps behind an old one or once it has spun
    /// long enough.
    #[test]
    fn a_waiter_spins_only_behind_a_young_hold() {
        assert!(keeps_spinning(10_000, 9_000, 9_500));
        assert!(!keeps_spinning(10_000, 5_000, 9_500), "an old hold");
        assert!(!keeps_spinning(40_000, 39_000, 10_000), "spun too long");
        // A hold taken after the waiter read the clock.
        assert!(keeps_spinning(10_000, 10_500, 9_000));
    }
}
