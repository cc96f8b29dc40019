//! `--cfg shuttle`: parking_lot's API over shuttle's locks, and shuttle's threads, yields and
//! thread-locals, with a virtual clock (see the crate comment).

use shuttle::rand::RngCore;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, PoisonError, TryLockError};
use std::time::Duration;

pub use shuttle::thread_local;

/// Whether this build runs under the deterministic scheduler.
pub const SCHEDULED: bool = true;

/// A mutex (parking_lot's API).
#[derive(Debug, Default)]
pub struct Mutex<T>(shuttle::sync::Mutex<T>);

/// A held `Mutex`. The inner guard is absent only inside a condition variable's wait.
pub struct MutexGuard<'a, T> {
    lock: &'a shuttle::sync::Mutex<T>,
    inner: Option<shuttle::sync::MutexGuard<'a, T>>,
}

impl<T: std::fmt::Debug> std::fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.deref().fmt(f)
    }
}

impl<T> Mutex<T> {
    pub const fn new(v: T) -> Self {
        Mutex(shuttle::sync::Mutex::new(v))
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard {
            lock: &self.0,
            inner: Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)),
        }
    }

    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(MutexGuard {
                lock: &self.0,
                inner: Some(g),
            }),
            Err(TryLockError::Poisoned(p)) => Some(MutexGuard {
                lock: &self.0,
                inner: Some(p.into_inner()),
            }),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Whether some thread holds it (a try that lets go at once).
    pub fn is_locked(&self) -> bool {
        self.try_lock().is_none()
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> From<T> for Mutex<T> {
    fn from(v: T) -> Self {
        Mutex::new(v)
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.inner
            .as_ref()
            .expect("a mutex guard outside a wait holds its lock")
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.inner
            .as_mut()
            .expect("a mutex guard outside a wait holds its lock")
    }
}

/// The outcome of a timed wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

/// A condition variable (parking_lot's API: waits take the guard by reference).
#[derive(Default)]
pub struct Condvar(shuttle::sync::Condvar);

impl std::fmt::Debug for Condvar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Condvar")
    }
}

impl Condvar {
    pub const fn new() -> Self {
        Condvar(shuttle::sync::Condvar::new())
    }

    pub fn wait<T>(&self, g: &mut MutexGuard<'_, T>) {
        let inner = g.inner.take().expect("a guard waits once");
        g.inner = Some(self.0.wait(inner).unwrap_or_else(PoisonError::into_inner));
    }

    /// A timed wait: the lock let go for one yield, then a timeout (the clock moved on by
    /// `d`) one time in 32, else a spurious wake. Rarer, the timed loops of the mount (the push
    /// worker's idle pushes and covers) took most of the steps and wrote most of the log.
    pub fn wait_for<T>(&self, g: &mut MutexGuard<'_, T>, d: Duration) -> WaitTimeoutResult {
        let inner = g.inner.take().expect("a guard waits once");
        drop(inner);
        shuttle::thread::yield_now();
        let timed_out = shuttle::rand::thread_rng().next_u64() % 32 == 0;
        if timed_out {
            time::advance(d);
        }
        g.inner = Some(g.lock.lock().unwrap_or_else(PoisonError::into_inner));
        WaitTimeoutResult(timed_out)
    }

    /// `wait_for` up to `deadline` on the virtual clock.
    pub fn wait_until<T>(
        &self,
        g: &mut MutexGuard<'_, T>,
        deadline: std::time::Instant,
    ) -> WaitTimeoutResult {
        let d = deadline.saturating_duration_since(time::now());
        self.wait_for(g, d)
    }

    pub fn notify_one(&self) -> bool {
        self.0.notify_one();
        true
    }

    pub fn notify_all(&self) -> usize {
        self.0.notify_all();
        0
    }
}

/// A reader-writer lock (parking_lot's API).
#[derive(Debug, Default)]
pub struct RwLock<T>(shuttle::sync::RwLock<T>);

pub type RwLockReadGuard<'a, T> = shuttle::sync::RwLockReadGuard<'a, T>;
pub type RwLockWriteGuard<'a, T> = shuttle::sync::RwLockWriteGuard<'a, T>;

impl<T> RwLock<T> {
    pub const fn new(v: T) -> Self {
        RwLock(shuttle::sync::RwLock::new(v))
    }

    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        match self.0.try_read() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        match self.0.try_write() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// A read that never waits, even for a queued writer.
    pub fn try_read_recursive(&self) -> Option<RwLockReadGuard<'_, T>> {
        self.try_read()
    }

    /// Whether a writer holds it (a try that lets go at once).
    pub fn is_locked_exclusive(&self) -> bool {
        self.try_read().is_none()
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: 'static> RwLock<T> {
    pub fn write_arc(self: &Arc<Self>) -> ArcRwLockWriteGuard<T> {
        let g = self.write();
        ArcRwLockWriteGuard::new(g, self)
    }

    pub fn try_write_arc(self: &Arc<Self>) -> Option<ArcRwLockWriteGuard<T>> {
        let g = self.try_write()?;
        Some(ArcRwLockWriteGuard::new(g, self))
    }
}

/// A write guard that holds its lock's `Arc` (`RwLock::write_arc`).
pub struct ArcRwLockWriteGuard<T: 'static> {
    // Dropped before `_lock`, which keeps the lock it borrows alive.
    guard: Option<RwLockWriteGuard<'static, T>>,
    _lock: Arc<RwLock<T>>,
}

impl<T: 'static> ArcRwLockWriteGuard<T> {
    #[allow(unsafe_code)]
    fn new(g: RwLockWriteGuard<'_, T>, lock: &Arc<RwLock<T>>) -> Self {
        // SAFETY: the guard borrows the lock inside `lock`'s allocation, which the `Arc`
        // cloned into this struct keeps alive and in place for as long as the guard exists:
        // the guard is dropped first (field order, and explicitly in `drop`). Compiled only
        // under `--cfg shuttle`, for the deterministic explorers.
        let guard: RwLockWriteGuard<'static, T> = unsafe { std::mem::transmute(g) };
        ArcRwLockWriteGuard {
            guard: Some(guard),
            _lock: Arc::clone(lock),
        }
    }
}

impl<T: 'static> Drop for ArcRwLockWriteGuard<T> {
    fn drop(&mut self) {
        self.guard.take();
    }
}

impl<T: 'static> Deref for ArcRwLockWriteGuard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl<T: 'static> DerefMut for ArcRwLockWriteGuard<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl<T: std::fmt::Debug + 'static> std::fmt::Debug for ArcRwLockWriteGuard<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.deref().fmt(f)
    }
}

/// Threads: shuttle's tasks.
pub mod thread {
    pub use shuttle::thread::{current, scope, yield_now, JoinHandle, Scope, ScopedJoinHandle};

    /// Starts a named task.
    pub fn spawn_named<F, T>(name: &str, f: F) -> std::io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        shuttle::thread::Builder::new().name(name.into()).spawn(f)
    }

    /// The index of the calling task in its run (0 the main task, then in spawn order): the
    /// same on every replay, where a counter of threads kept by a static would not be.
    pub fn task_index() -> usize {
        usize::from(shuttle::thread::current().id())
    }

    /// A sleep: a yield, the virtual clock moved on by `d`.
    pub fn sleep(d: std::time::Duration) {
        super::time::advance(d);
        shuttle::thread::yield_now();
    }

    /// A spin-wait hint: a yield, so that the thread spun on runs.
    pub fn spin_loop() {
        shuttle::thread::yield_now();
    }
}

/// The virtual clock: it moves only by timeouts and sleeps. One per OS thread, which is one
/// scheduled run's (all its tasks run on it), so that runs on other threads (tests side by
/// side) do not move it.
pub mod time {
    use std::cell::Cell;
    pub use std::time::{Duration, Instant};

    std::thread_local! {
        static BASE: Cell<Option<Instant>> = const { Cell::new(None) };
        static OFFSET_NS: Cell<u64> = const { Cell::new(0) };
    }

    fn offset() -> Duration {
        Duration::from_nanos(OFFSET_NS.with(Cell::get))
    }

    /// Now, on the virtual clock.
    pub fn now() -> Instant {
        let base = BASE.with(|b| match b.get() {
            Some(t) => t,
            None => {
                let t = Instant::now();
                b.set(Some(t));
                t
            }
        });
        base + offset()
    }

    /// Now, on the wall clock (timestamps): a fixed date (2026-01-01) plus the virtual clock,
    /// so that the inodes a replay writes carry the same times.
    pub fn wall_now() -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600) + offset()
    }

    /// Moves the clock on by `d`.
    pub fn advance(d: Duration) {
        let ns = u64::try_from(d.as_nanos())
            .unwrap_or(u64::MAX / 4)
            .min(u64::MAX / 4);
        OFFSET_NS.with(|o| o.set(o.get().saturating_add(ns)));
    }

    /// Sets the clock back to its start: at the start of each scheduled run, so that a seed's
    /// run sees the same times whatever ran before it.
    pub fn reset() {
        OFFSET_NS.with(|o| o.set(0));
    }
}

/// Runs `f` once under shuttle's random scheduler seeded with `seed`: the same seed, the same
/// interleaving. A panic in any task fails the run and propagates.
pub fn run_scheduled<F>(seed: u64, f: F)
where
    F: Fn() + Send + Sync + 'static,
{
    let mut config = shuttle::Config::new();
    // The core's descents and recovery need more than shuttle's 32 KiB stacks.
    config.stack_size = 1 << 20;
    config.max_steps = shuttle::MaxSteps::None;
    config.failure_persistence = shuttle::FailurePersistence::None;
    config.silence_warnings = true;
    let scheduler = shuttle::scheduler::RandomScheduler::new_from_seed(seed, 1);
    let runner = shuttle::Runner::new(scheduler, config);
    runner.run(move || {
        time::reset();
        f();
    });
}
