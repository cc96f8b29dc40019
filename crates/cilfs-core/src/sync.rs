//! The locks of code that is model-checked with loom: `std` normally, loom's under `--cfg loom`.

#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Locks, ignoring poisoning: a panicking holder already failed the operation it was doing.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits for a notification. Outside loom a timeout bounds the wait as a safety net.
pub(crate) fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    #[cfg(loom)]
    {
        cv.wait(g)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(not(loom))]
    {
        cv.wait_timeout(g, std::time::Duration::from_millis(50))
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0)
    }
}
