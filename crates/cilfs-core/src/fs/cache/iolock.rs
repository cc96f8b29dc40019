//! Per-inode IO locks (XFS's IOLOCK): what an operation holds on one inode while its data IO is
//! in flight, so that the filesystem state lock never is. A write holds its inode's lock
//! exclusively from planning (blocks reserved, not yet mapped) through the data IO to the
//! transaction that maps the blocks; truncate, punch, fallocate and reclaim hold it
//! exclusively too, since they change or free the blocks that IO goes to; reads and write back
//! hold it shared. A directory's, which no data IO uses, holds its names: creates, links and
//! unlinks in it take it exclusively for their whole run (`Fs::lock_names`). Only operations
//! on the same inode ever wait for it.
//!
//! Lock order: an inode's IO lock comes before the filesystem state lock, and an operation
//! holds at most one IO lock it waited for. Any further one is only tried (`try_shared`), so
//! no cycle can form, and a slow or throttled inode never holds up another inode's writer.
//!
//! The table keeps an entry only while some thread holds or waits for it.

use crate::util::lockstat::LockWaits;
use crate::util::sync::{check_order, lock, rank, wait, Condvar, Held, Mutex};

#[derive(Debug, Default)]
struct Entry {
    /// Shared holders.
    readers: u32,
    writer: bool,
    /// Threads waiting for this inode.
    waiting: u32,
}

/// Shards of the table, by a hash of the inode number, so that threads working on unrelated
/// inodes do not pass one mutex's cache line between them (every create and unlink takes its
/// directory's lock, every write, read and fsync its file's). Two under loom, whose models
/// would otherwise track 64 of each.
const SHARDS: usize = if cfg!(loom) { 2 } else { 64 };

/// One shard: the entries of its inodes and the condition their waiters sleep on, on a cache
/// line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    table: Mutex<crate::util::numhash::NumberMap<Entry>>,
    released: Condvar,
}

#[derive(Debug)]
pub(crate) struct IoLocks {
    shards: Vec<Shard>,
    pub(crate) waits: LockWaits,
}

/// How an IO lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IoMode {
    Shared,
    Exclusive,
}

/// An IO lock held on one inode; released on drop.
#[derive(Debug)]
#[must_use = "the IO lock is released when the guard is dropped"]
pub(crate) struct IoGuard<'a> {
    locks: &'a IoLocks,
    ino: u64,
    mode: IoMode,
    /// The rank held (the order is checked before any wait: `lock`, `lock_unless`).
    _held: Held<{ rank::IO }>,
}

fn grantable(e: &Entry, mode: IoMode) -> bool {
    match mode {
        IoMode::Shared => !e.writer,
        IoMode::Exclusive => !e.writer && e.readers == 0,
    }
}

fn grant(e: &mut Entry, mode: IoMode) {
    match mode {
        IoMode::Shared => e.readers += 1,
        IoMode::Exclusive => e.writer = true,
    }
}

impl IoLocks {
    pub(crate) fn new() -> Self {
        IoLocks {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            waits: LockWaits::new("inode IO locks"),
        }
    }

    fn shard(&self, ino: u64) -> &Shard {
        &self.shards[crate::fs::cache::inode_cache::shard_of(ino) % SHARDS]
    }

    /// Takes `ino`'s IO lock, waiting for the holders of a conflicting mode. The caller holds
    /// no other IO lock it waited for, and no filesystem state lock.
    pub(crate) fn lock(&self, ino: u64, mode: IoMode) -> IoGuard<'_> {
        check_order(rank::IO);
        self.waits
            .acquire(|| self.try_lock(ino, mode), || self.wait_for(ino, mode))
    }

    /// Waits for `ino`'s IO lock (uncounted: `lock` counts).
    fn wait_for(&self, ino: u64, mode: IoMode) -> IoGuard<'_> {
        let shard = self.shard(ino);
        let mut t = lock(&shard.table);
        t.entry(ino).or_default().waiting += 1;
        loop {
            let e = t.entry(ino).or_default();
            if grantable(e, mode) {
                e.waiting -= 1;
                grant(e, mode);
                break;
            }
            t = wait(&shard.released, t);
        }
        IoGuard {
            locks: self,
            ino,
            mode,
            _held: Held::tried(),
        }
    }

    /// `lock`, unless the lock is taken and `give_up` says not to wait for it then: None.
    pub(crate) fn lock_unless(
        &self,
        ino: u64,
        mode: IoMode,
        give_up: impl FnOnce() -> bool,
    ) -> Option<IoGuard<'_>> {
        check_order(rank::IO);
        self.waits.acquire(
            || self.try_lock(ino, mode).map(Some),
            || (!give_up()).then(|| self.wait_for(ino, mode)),
        )
    }

    /// Takes `ino`'s IO lock if no one holds it in a conflicting mode.
    pub(crate) fn try_lock(&self, ino: u64, mode: IoMode) -> Option<IoGuard<'_>> {
        let mut t = lock(&self.shard(ino).table);
        let e = t.entry(ino).or_default();
        if !grantable(e, mode) {
            return None;
        }
        grant(e, mode);
        Some(IoGuard {
            locks: self,
            ino,
            mode,
            _held: Held::tried(),
        })
    }

    fn release(&self, ino: u64, mode: IoMode) {
        let shard = self.shard(ino);
        let mut t = lock(&shard.table);
        let Some(e) = t.get_mut(&ino) else {
            // A guard exists only for an entry in the table.
            debug_assert!(false, "IO lock of inode {ino} released but not held");
            return;
        };
        match mode {
            IoMode::Shared => {
                debug_assert!(e.readers > 0);
                e.readers -= 1;
            }
            IoMode::Exclusive => {
                debug_assert!(e.writer);
                e.writer = false;
            }
        }
        let waiting = e.waiting > 0;
        if e.readers == 0 && !e.writer && !waiting {
            t.remove(&ino);
        }
        drop(t);
        if waiting {
            shard.released.notify_all();
        }
    }

    /// Whether nobody holds or waits for `ino`'s IO lock (no data IO of it is in flight).
    pub(crate) fn idle(&self, ino: u64) -> bool {
        !lock(&self.shard(ino).table).contains_key(&ino)
    }

    /// Inodes whose IO lock is held or waited for (tests).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.shards.iter().map(|s| lock(&s.table).len()).sum()
    }
}

impl Drop for IoGuard<'_> {
    fn drop(&mut self) {
        self.locks.release(self.ino, self.mode);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn shared_holders_share_and_exclude_a_writer_of_that_inode_only() {
        let l = IoLocks::new();
        let a = l.lock(1, IoMode::Shared);
        let b = l.lock(1, IoMode::Shared);
        assert!(l.try_lock(1, IoMode::Exclusive).is_none());
        let other = l.try_lock(2, IoMode::Exclusive);
        assert!(other.is_some(), "another inode's lock is independent");
        drop(a);
        assert!(l.try_lock(1, IoMode::Exclusive).is_none());
        drop(b);
        let w = l.try_lock(1, IoMode::Exclusive);
        assert!(w.is_some());
        assert!(l.try_lock(1, IoMode::Shared).is_none());
        drop(w);
        drop(other);
        assert_eq!(l.entries(), 0, "entries of unheld inodes are dropped");
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::{AtomicU32, Ordering};
    use loom::sync::Arc;

    /// A writer and a reader of one inode never hold it together, a writer of another inode
    /// never waits for either, and the table is empty once all are done.
    #[test]
    fn loom_io_locks_exclude_per_inode() {
        loom::model(|| {
            let l = Arc::new(IoLocks::new());
            let inside = Arc::new(AtomicU32::new(0));
            let w = {
                let (l, inside) = (l.clone(), inside.clone());
                loom::thread::spawn(move || {
                    let _g = l.lock(1, IoMode::Exclusive);
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            };
            let r = {
                let (l, inside) = (l.clone(), inside.clone());
                loom::thread::spawn(move || {
                    let _g = l.lock(1, IoMode::Shared);
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            };
            // Another inode: granted at once whatever inode 1's holders do.
            let g = l.try_lock(2, IoMode::Exclusive);
            assert!(g.is_some());
            drop(g);
            w.join().unwrap();
            r.join().unwrap();
            assert_eq!(l.entries(), 0);
        });
    }
}
