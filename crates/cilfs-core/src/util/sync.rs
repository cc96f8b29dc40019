//! The locks of code that is model-checked with loom: `std` normally, loom's under `--cfg loom`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(loom)]
pub(crate) use loom::sync::{mpsc, Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread::JoinHandle;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use std::sync::{mpsc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread::JoinHandle;

/// Starts a named thread (names are dropped under loom).
pub(crate) fn spawn<F>(name: String, f: F) -> Option<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    #[cfg(loom)]
    {
        let _ = name;
        Some(loom::thread::spawn(f))
    }
    #[cfg(not(loom))]
    {
        std::thread::Builder::new().name(name).spawn(f).ok()
    }
}

/// Raises the calling thread's scheduling priority (nice -10), as XFS runs log IO completion on
/// a high-priority workqueue: an iclog whose write finished should hand its buffer back to the
/// push before committers, which only fill the CIL, get the CPU again. Best effort: without
/// CAP_SYS_NICE the thread keeps its priority. Linux keeps nice values per thread.
pub(crate) fn raise_priority() {
    #[cfg(not(loom))]
    {
        let _ = rustix::process::setpriority_process(None, -10);
    }
}

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
