//! The lock facade. The locks of code that is model-checked with loom: `std` normally, loom's
//! under `--cfg loom`, shuttle's under `--cfg shuttle` (the deterministic explorers, through
//! `cilfs_sync`). And the lock order of docs/concurrency.md, checked: every lock of its lock
//! table is a ranked lock of this module, and debug builds assert that ranks rise.

#[cfg(not(loom))]
pub(crate) use cilfs_sync::thread::JoinHandle;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(loom)]
pub(crate) use loom::sync::{mpsc, Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread::JoinHandle;
#[cfg(shuttle)]
pub(crate) use shuttle::sync::{mpsc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::AtomicU64;
#[cfg(not(any(loom, shuttle)))]
pub(crate) use std::sync::{mpsc, Condvar, Mutex, MutexGuard};

/// A full fence (loom's under `--cfg loom`, so that the model sees it).
pub(crate) fn fence_seq_cst() {
    #[cfg(loom)]
    loom::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(not(loom))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

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
        cilfs_sync::thread::spawn_named(&name, f).ok()
    }
}

/// Raises the calling thread's scheduling priority (nice -10), as XFS runs log IO completion on
/// a high-priority workqueue: an iclog whose write finished should hand its buffer back to the
/// push before committers, which only fill the CIL, get the CPU again. Best effort: without
/// CAP_SYS_NICE the thread keeps its priority. Linux keeps nice values per thread.
pub(crate) fn raise_priority() {
    #[cfg(not(any(loom, shuttle)))]
    {
        let _ = rustix::process::setpriority_process(None, -10);
    }
}

/// Locks, ignoring poisoning: a panicking holder already failed the operation it was doing.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits for a notification. Outside loom and shuttle a timeout bounds the wait as a safety net.
pub(crate) fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    #[cfg(any(loom, shuttle))]
    {
        cv.wait(g)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(not(any(loom, shuttle)))]
    {
        cv.wait_timeout(g, std::time::Duration::from_millis(50))
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0)
    }
}

// The lock order, checked: every lock of the lock table in docs/concurrency.md is one of the
// ranked types below, of its rank. In debug builds (tests included) each thread keeps the
// ranks it holds, and an acquisition that may wait asserts that none of them is higher than
// its own: a lockdep of our own. A try (`try_lock`, `try_read`, `try_write`) never waits, so it
// is not checked, but what it took counts as held. Release builds keep nothing: the wrappers
// are the parking_lot calls.

/// The ranks of docs/concurrency.md's lock table, lowest first: a thread waits for a lock only
/// while holding locks of lower (or, for locks of one class taken in their class's order:
/// buffers in block order, shards in shard order, the same) rank.
pub mod rank {
    /// An inode's IO lock (`fs/cache/iolock.rs`).
    pub const IO: u8 = 1;
    /// The filesystem state (`Fs.state`).
    pub const STATE: u8 = 2;
    /// Inode numbers (`Fs.inos`).
    pub const INOS: u8 = 3;
    /// A metadata buffer (`buf/`).
    pub const BUF: u8 = 4;
    /// The publish turn (`Fs.publishing`).
    pub const TURN: u8 = 5;
    /// Busy extents (`Fs.busy`).
    pub const BUSY: u8 = 6;
    /// An inode cache shard.
    pub const INODES: u8 = 7;
    /// A page cache shard.
    pub const PAGES: u8 = 8;
    /// The header in memory (`FsState.hdr`).
    pub const HDR: u8 = 9;
    /// The log writer (`Journal.writer`).
    pub const WRITER: u8 = 10;
    /// A metadata buffer locked by the push's late write (`Buf::lock_late`), under the log
    /// writer: the one buffer lock taken above rank 4. Only the push waits for a block written
    /// late (the filesystem header): commits hand it late writes and never lock it, write back
    /// only tries it, and nothing is taken under this hold.
    pub const LATE_BUF: u8 = 11;
    /// The AIL writeback (`Journal.ail_writeback`).
    pub const AIL_WRITEBACK: u8 = 12;
    /// The AIL (`Journal.ail`).
    pub const AIL: u8 = 13;
    /// A buffer cache map shard (`BufCache.bufs`).
    pub const BUF_MAP: u8 = 14;
    /// A CIL shard (`Journal.cil`).
    pub const CIL: u8 = 15;
    /// The CIL room (`Journal.cil_room`).
    pub const CIL_ROOM: u8 = 16;
    /// Log space (`Journal.space`).
    pub const SPACE: u8 = 17;
    /// A grant head (`trans/grant.rs`).
    pub const GRANT: u8 = 18;
    /// The superblock copy (`Journal.sb`).
    pub const SB: u8 = 19;
    /// The image pool's spare list (`cil/image_pool.rs`).
    pub const IMAGE_POOL: u8 = 20;
    /// The device flush (`cilfs-device`, outside this crate: not checked here; nothing of
    /// this crate is taken under it).
    #[allow(dead_code)]
    pub const DEVICE_FLUSH: u8 = 21;

    /// The names of the ranks, for the assertion's message.
    #[cfg_attr(not(all(debug_assertions, not(loom), not(shuttle))), allow(dead_code))]
    pub(crate) const NAMES: [&str; 22] = [
        "-",
        "inode IO lock",
        "fs state",
        "inode numbers",
        "metadata buffer",
        "publish turn",
        "busy extents",
        "inode cache shard",
        "page cache shard",
        "header",
        "log writer",
        "metadata buffer, late write",
        "AIL writeback",
        "AIL",
        "buffer cache map",
        "CIL shard",
        "CIL room",
        "log space",
        "grant head",
        "superblock copy",
        "image pool",
        "device flush",
    ];
}

#[cfg(all(debug_assertions, not(loom), not(shuttle)))]
mod order {
    use std::cell::Cell;

    /// A thread's held ranks.
    #[derive(Clone, Copy)]
    struct Held {
        /// How many locks of each rank.
        counts: [u16; 22],
        /// Bit `r` set while `counts[r]` is not 0, so the highest rank is a count of leading
        /// zeros: the scan of the counts it replaces, at every lock taken, was a tenth of the
        /// image fuzz target's instructions (coverage-instrumented, debug assertions on).
        ranks: u32,
    }

    std::thread_local! {
        /// What this thread holds.
        static HELD: Cell<Held> = const { Cell::new(Held { counts: [0; 22], ranks: 0 }) };
    }

    /// The highest rank this thread holds, 0 for none.
    pub(super) fn highest() -> u8 {
        HELD.with(|h| (u32::BITS - 1).saturating_sub(h.get().ranks.leading_zeros()) as u8)
    }

    /// Asserts that a lock of rank `r` may be waited for now.
    pub(super) fn check(r: u8) {
        let top = highest();
        assert!(
            top <= r,
            "lock order: {} (rank {r}) waited for while holding {} (rank {top})",
            super::rank::NAMES[usize::from(r)],
            super::rank::NAMES[usize::from(top)],
        );
    }

    pub(super) fn push(r: u8) {
        HELD.with(|h| {
            let mut a = h.get();
            a.counts[usize::from(r)] += 1;
            a.ranks |= 1 << r;
            h.set(a);
        });
    }

    pub(super) fn pop(r: u8) {
        // At thread exit the counts may be gone before the last guard: nothing to keep then.
        let _ = HELD.try_with(|h| {
            let mut a = h.get();
            let n = a.counts[usize::from(r)].saturating_sub(1);
            a.counts[usize::from(r)] = n;
            if n == 0 {
                a.ranks &= !(1 << r);
            }
            h.set(a);
        });
    }
}

/// A lock of rank `R` this thread holds: in debug builds, its place in the thread's held
/// ranks, given back when dropped. Nothing in release builds.
#[derive(Debug)]
pub struct Held<const R: u8> {
    /// Held ranks are the thread's: the guard stays on it.
    _thread: std::marker::PhantomData<*const ()>,
}

impl<const R: u8> Held<R> {
    /// For an acquisition that may wait: asserts the order (debug builds), then counts it held.
    /// Call it before waiting.
    #[inline]
    pub fn waiting() -> Self {
        #[cfg(all(debug_assertions, not(loom), not(shuttle)))]
        {
            order::check(R);
            order::push(R);
        }
        Held {
            _thread: std::marker::PhantomData,
        }
    }

    /// For a lock taken by a try, which never waits: counted held, not checked.
    #[inline]
    pub fn tried() -> Self {
        #[cfg(all(debug_assertions, not(loom), not(shuttle)))]
        order::push(R);
        Held {
            _thread: std::marker::PhantomData,
        }
    }
}

#[cfg(all(debug_assertions, not(loom), not(shuttle)))]
impl<const R: u8> Drop for Held<R> {
    fn drop(&mut self) {
        order::pop(R);
    }
}

/// Asserts that a lock of rank `r` may be waited for now (debug builds; nothing in release).
#[inline]
pub fn check_order(r: u8) {
    #[cfg(all(debug_assertions, not(loom), not(shuttle)))]
    order::check(r);
    #[cfg(not(all(debug_assertions, not(loom), not(shuttle))))]
    let _ = r;
}

/// A guard of a lock of rank `R`: the lock's own guard `G` and the thread's hold of the rank.
#[derive(Debug)]
pub struct Ranked<G, const R: u8> {
    guard: G,
    _held: Held<R>,
}

impl<G, const R: u8> Ranked<G, R> {
    /// Takes a lock through `lock`, which may wait: the order is asserted first.
    #[inline]
    pub fn acquire(lock: impl FnOnce() -> G) -> Self {
        let held = Held::waiting();
        Ranked {
            guard: lock(),
            _held: held,
        }
    }

    /// A guard a try took.
    #[inline]
    pub fn tried(guard: G) -> Self {
        Ranked {
            guard,
            _held: Held::tried(),
        }
    }

    /// The lock's own guard, for a condition variable's wait.
    #[inline]
    pub fn guard_mut(&mut self) -> &mut G {
        &mut self.guard
    }

    /// Gives the lock's own guard to `f` (a wait that takes the guard by value) and keeps what
    /// it returns, still held at this rank.
    #[inline]
    pub fn map_guard(self, f: impl FnOnce(G) -> G) -> Self {
        Ranked {
            guard: f(self.guard),
            _held: self._held,
        }
    }
}

impl<G: std::ops::Deref, const R: u8> std::ops::Deref for Ranked<G, R> {
    type Target = G::Target;
    #[inline]
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: std::ops::DerefMut, const R: u8> std::ops::DerefMut for Ranked<G, R> {
    #[inline]
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

pub type RankedMutexGuard<'a, T, const R: u8> = Ranked<cilfs_sync::MutexGuard<'a, T>, R>;
pub type RankedReadGuard<'a, T, const R: u8> = Ranked<cilfs_sync::RwLockReadGuard<'a, T>, R>;
pub type RankedWriteGuard<'a, T, const R: u8> = Ranked<cilfs_sync::RwLockWriteGuard<'a, T>, R>;

/// A parking_lot mutex of rank `R`.
#[derive(Debug, Default)]
pub struct RankedMutex<T, const R: u8>(cilfs_sync::Mutex<T>);

impl<T, const R: u8> RankedMutex<T, R> {
    pub const fn new(v: T) -> Self {
        RankedMutex(cilfs_sync::Mutex::new(v))
    }

    #[inline]
    pub fn lock(&self) -> RankedMutexGuard<'_, T, R> {
        Ranked::acquire(|| self.0.lock())
    }

    #[inline]
    pub fn try_lock(&self) -> Option<RankedMutexGuard<'_, T, R>> {
        self.0.try_lock().map(Ranked::tried)
    }

    /// `lock`, its acquisition counted in `waits` (`LockWaits::acquire`).
    #[inline]
    pub fn lock_counted(
        &self,
        waits: &crate::util::lockstat::LockWaits,
    ) -> RankedMutexGuard<'_, T, R> {
        Ranked::acquire(|| waits.acquire(|| self.0.try_lock(), || self.0.lock()))
    }

    /// `lock` for a lock held only for moments, counted in `waits` (`LockWaits::acquire_short`).
    #[inline]
    pub fn lock_short(
        &self,
        waits: &crate::util::lockstat::LockWaits,
    ) -> RankedMutexGuard<'_, T, R> {
        Ranked::acquire(|| waits.acquire_short(|| self.0.try_lock(), || self.0.lock()))
    }

    /// `try_lock`, counted in `waits` if it took the lock (`LockWaits::try_acquire`).
    #[inline]
    pub fn try_lock_counted(
        &self,
        waits: &crate::util::lockstat::LockWaits,
    ) -> Option<RankedMutexGuard<'_, T, R>> {
        waits.try_acquire(|| self.0.try_lock()).map(Ranked::tried)
    }

    pub fn is_locked(&self) -> bool {
        self.0.is_locked()
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut()
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner()
    }
}

impl<T, const R: u8> From<T> for RankedMutex<T, R> {
    fn from(v: T) -> Self {
        RankedMutex::new(v)
    }
}

impl<'a, T, const R: u8> Ranked<cilfs_sync::MutexGuard<'a, T>, R> {
    /// Waits on `cv`, the lock let go meanwhile (parking_lot's `Condvar::wait`).
    #[inline]
    pub fn wait(&mut self, cv: &cilfs_sync::Condvar) {
        cv.wait(&mut self.guard);
    }

    /// `wait` for at most `d`.
    #[inline]
    pub fn wait_for(
        &mut self,
        cv: &cilfs_sync::Condvar,
        d: std::time::Duration,
    ) -> cilfs_sync::WaitTimeoutResult {
        cv.wait_for(&mut self.guard, d)
    }
}

/// A parking_lot reader-writer lock of rank `R`.
#[derive(Debug, Default)]
pub struct RankedRwLock<T, const R: u8>(cilfs_sync::RwLock<T>);

impl<T, const R: u8> RankedRwLock<T, R> {
    pub const fn new(v: T) -> Self {
        RankedRwLock(cilfs_sync::RwLock::new(v))
    }

    #[inline]
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn read(&self) -> RankedReadGuard<'_, T, R> {
        Ranked::acquire(|| self.0.read())
    }

    #[inline]
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn write(&self) -> RankedWriteGuard<'_, T, R> {
        Ranked::acquire(|| self.0.write())
    }

    /// `try_read` that succeeds even with a writer queued (parking_lot's `try_read_recursive`).
    #[inline]
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn try_read_recursive(&self) -> Option<RankedReadGuard<'_, T, R>> {
        self.0.try_read_recursive().map(Ranked::tried)
    }

    /// `read`, counted in `waits` (`LockWaits::acquire`).
    #[inline]
    pub fn read_counted(
        &self,
        waits: &crate::util::lockstat::LockWaits,
    ) -> RankedReadGuard<'_, T, R> {
        Ranked::acquire(|| waits.acquire(|| self.0.try_read(), || self.0.read()))
    }

    /// `write`, counted in `waits` (`LockWaits::acquire`).
    #[inline]
    pub fn write_counted(
        &self,
        waits: &crate::util::lockstat::LockWaits,
    ) -> RankedWriteGuard<'_, T, R> {
        Ranked::acquire(|| waits.acquire(|| self.0.try_write(), || self.0.write()))
    }
}

#[cfg(all(test, debug_assertions, not(loom), not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn rising_ranks_equal_ranks_and_tries_pass() {
        let low: RankedMutex<u32, { rank::STATE }> = RankedMutex::new(0);
        let high: RankedMutex<u32, { rank::SPACE }> = RankedMutex::new(0);
        let same: [RankedMutex<u32, { rank::CIL }>; 2] = [RankedMutex::new(0), RankedMutex::new(0)];
        {
            let _a = low.lock();
            let _b = same[0].lock();
            let _c = same[1].lock();
            let _d = high.lock();
        }
        // Let go out of order, and nothing stays held.
        let h = high.lock();
        let l = low.try_lock().unwrap();
        drop(h);
        drop(l);
        assert_eq!(order::highest(), 0);
        // A lock taken by a try counts as held.
        let _h = high.try_lock().unwrap();
        assert_eq!(order::highest(), rank::SPACE);
    }

    #[test]
    fn the_highest_rank_falls_back_as_locks_go() {
        let low: RankedMutex<u32, { rank::STATE }> = RankedMutex::new(0);
        let same: [RankedMutex<u32, { rank::CIL }>; 2] = [RankedMutex::new(0), RankedMutex::new(0)];
        let l = low.lock();
        let a = same[0].lock();
        let b = same[1].lock();
        drop(a);
        // One lock of the rank is still held.
        assert_eq!(order::highest(), rank::CIL);
        drop(b);
        assert_eq!(order::highest(), rank::STATE);
        drop(l);
        assert_eq!(order::highest(), 0);
    }

    #[test]
    #[should_panic(
        expected = "lock order: fs state (rank 2) waited for while holding log space (rank 17)"
    )]
    fn waiting_for_a_lower_rank_panics() {
        let low: RankedRwLock<u32, { rank::STATE }> = RankedRwLock::new(0);
        let high: RankedMutex<u32, { rank::SPACE }> = RankedMutex::new(0);
        let _h = high.lock();
        let _l = low.read();
    }
}
