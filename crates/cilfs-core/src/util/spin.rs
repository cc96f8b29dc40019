//! Waiting for a lock by polling it a few microseconds before blocking: for locks held only
//! for moments, where a waiter that blocked at once gave its CPU away and came back only when
//! the scheduler got round to it. Used by the lock statistics' short acquisitions and by the
//! adaptive mutex, which decides how long to poll from its holder's age.

use std::sync::OnceLock;
use std::time::Instant;

/// Nanoseconds on a monotonic clock shared by every lock.
pub(crate) fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(cilfs_sync::time::now);
    cilfs_sync::time::now()
        .saturating_duration_since(base)
        .as_nanos() as u64
}

/// Most a waiter for a lock held only for moments spins before it blocks (`spin_then_block`).
const SHORT_SPIN_MAX_NS: u64 = 5_000;

/// Takes a lock through `try_lock` polled for a few microseconds, then through `lock`: for
/// locks held only for moments (`LockWaits::acquire_short`), such as the buffers', whose holds
/// are mostly a microsecond or two (the AIL copying a block to write it back, a commit
/// publishing its leaves). Blocking at once, a waiter among eight threads on two vCPUs gave its
/// CPU away and came back only when the scheduler got round to it, milliseconds later.
pub fn spin_then_block<G>(try_lock: impl Fn() -> Option<G>, lock: impl FnOnce() -> G) -> G {
    poll_then_block(
        try_lock,
        |now, start| now.saturating_sub(start) <= SHORT_SPIN_MAX_NS,
        lock,
    )
}

/// Polls `try_lock` between short spins while `keeps_polling(now, start)` holds (`now_ns`
/// times; `start`: when the wait began), then takes the lock through `lock`.
pub(crate) fn poll_then_block<G>(
    try_lock: impl Fn() -> Option<G>,
    keeps_polling: impl Fn(u64, u64) -> bool,
    lock: impl FnOnce() -> G,
) -> G {
    // Under the deterministic scheduler the clock stands still while a task spins: wait.
    if cilfs_sync::SCHEDULED {
        let _ = (try_lock, keeps_polling);
        return lock();
    }
    let start = now_ns();
    loop {
        for _ in 0..32 {
            std::hint::spin_loop();
        }
        if let Some(g) = try_lock() {
            return g;
        }
        if !keeps_polling(now_ns(), start) {
            return lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    /// A waiter for a short lock, behind a hold longer than its spin, blocks in `lock` (the
    /// holder here lets go only once the waiter is there) rather than spinning on; a free lock
    /// it takes by its first poll.
    #[test]
    fn a_short_lock_waiter_polls_then_blocks() {
        use cilfs_sync::Mutex;
        let m = Arc::new(Mutex::new(0u32));
        let blocked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let held = m.lock();
        let waiter = {
            let (m, blocked) = (Arc::clone(&m), Arc::clone(&blocked));
            std::thread::spawn(move || {
                let mut g = spin_then_block(
                    || m.try_lock(),
                    || {
                        blocked.store(true, Ordering::SeqCst);
                        m.lock()
                    },
                );
                *g += 1;
            })
        };
        while !blocked.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        drop(held);
        waiter.join().unwrap();
        assert_eq!(*m.lock(), 1);
        // Free: taken by the first poll, never blocking.
        let g = spin_then_block(|| m.try_lock(), || panic!("blocked on a free lock"));
        assert_eq!(*g, 1);
    }
}
