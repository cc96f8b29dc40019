//! Every build that runs: parking_lot's locks and std's threads and clock, re-exported.

pub use parking_lot::{
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult,
};
pub use std::thread_local;

/// A write guard that holds its lock's `Arc` (`RwLock::write_arc`).
pub type ArcRwLockWriteGuard<T> =
    parking_lot::lock_api::ArcRwLockWriteGuard<parking_lot::RawRwLock, T>;

/// Threads.
pub mod thread {
    pub use std::thread::{current, scope, sleep, yield_now, JoinHandle, Scope, ScopedJoinHandle};

    /// Starts a named thread.
    pub fn spawn_named<F, T>(name: &str, f: F) -> std::io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        std::thread::Builder::new().name(name.into()).spawn(f)
    }

    /// The index of the calling task under the deterministic scheduler; 0 here (unused).
    pub fn task_index() -> usize {
        0
    }

    /// A spin-wait hint (a yield point under shuttle).
    #[inline]
    pub fn spin_loop() {
        std::hint::spin_loop();
    }
}

/// The clock.
pub mod time {
    pub use std::time::{Duration, Instant};

    /// Now, on the wall clock (timestamps).
    #[inline]
    pub fn wall_now() -> std::time::SystemTime {
        std::time::SystemTime::now()
    }

    /// Now, on the monotonic clock.
    #[inline]
    pub fn now() -> Instant {
        Instant::now()
    }
}

/// Whether this build runs under the deterministic scheduler.
pub const SCHEDULED: bool = false;
