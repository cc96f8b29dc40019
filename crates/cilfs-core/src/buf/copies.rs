//! Each thread's copies of the interior tree nodes it descends through (docs/concurrency.md).
//!
//! Every descent of every thread passes the root and the upper nodes. Read under their locks,
//! each step took and dropped a shared hold, two atomic writes to the lock's cache line, and
//! with two threads that line went from core to core on every step (about 1.2 us a create of
//! the 1.6 us two threads' creates cost more than one thread's: perf, `cilfs bench fs`).
//! A thread keeps a copy of such a node with the version it copied, and steps through the
//! copy while the buffer's version (`Buf::version`, published after the data) is still that
//! one: a load of a line that only a change of the node writes, which the cores share.
//!
//! A copy is the node as some commit left it, whole, never half-changed: it is taken under
//! the buffer's read lock. A commit may be changing the node at that moment (it holds the
//! lock and has not yet bumped the version); the copy is then the state before that commit,
//! as a read just before it took the lock would have seen. Whoever steps through a copy
//! records the version it used, and an optimistic commit checks it as it checks a block it
//! read (`FsTx::still_current`). A copy holds its buffer (`Arc<Buf>`), so the cache never
//! evicts the buffer and reads the block again into another: the copy's buffer is the
//! block's for as long as the copy lasts.

use super::{spread, Buf, BufCache};
use std::cell::RefCell;
use std::sync::Arc;

/// Copies a thread keeps, direct-mapped by block number: the upper nodes of the trees it works
/// in are a handful.
const SLOTS: usize = 32;

struct NodeCopy {
    cache: u64,
    buf: Arc<Buf>,
    version: u64,
    data: Box<[u8]>,
}

cilfs_sync::thread_local! {
    static COPIES: RefCell<[Option<NodeCopy>; SLOTS]> =
        const { RefCell::new([const { None }; SLOTS]) };
}

fn slot(blkno: u64) -> usize {
    (spread(blkno) >> 40) as usize % SLOTS
}

/// A state of a block: the buffer it was read in (`Buf::uid`) and its version there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufState {
    pub uid: u64,
    pub version: u64,
}

impl BufCache {
    /// `f` on this thread's copy of block `blkno` from this cache, if it keeps one.
    fn in_copy<R>(&self, blkno: u64, f: impl FnOnce(&NodeCopy) -> Option<R>) -> Option<R> {
        COPIES.with(|c| match &c.borrow()[slot(blkno)] {
            Some(n) if n.cache == self.id && n.buf.blkno() == blkno => f(n),
            _ => None,
        })
    }

    /// `f` on this thread's copy of block `blkno`, if it keeps one and the block is still in
    /// the copy's state: that state and `f`'s answer. No lock is taken.
    pub fn with_copy<R>(&self, blkno: u64, f: impl FnOnce(&[u8]) -> R) -> Option<(BufState, R)> {
        self.in_copy(blkno, |n| {
            (n.buf.version() == n.version).then(|| (n.state(), f(&n.data)))
        })
    }

    /// Copies block `blkno` as it is now (under its read lock, its waits counted in `waits`)
    /// into this thread's copies, and runs `f` on the copy: the state copied and `f`'s answer.
    /// Reads the block if it is not in memory. `verify` runs first under that lock (the read
    /// check, `Buf::verify_once`): a block that fails it is not copied, so a copy is always
    /// of a checked block and stepping through it needs no check.
    pub fn copy_and<R, E: From<cilfs_device::DeviceError>>(
        &self,
        blkno: u64,
        waits: &crate::util::lockstat::LockWaits,
        verify: impl FnOnce(&Buf, &super::BufData) -> Result<(), E>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<(BufState, R), E> {
        let buf = self.get(blkno)?;
        COPIES.with(|c| {
            let mut c = c.borrow_mut();
            let s = &mut c[slot(blkno)];
            let reuse = s
                .take()
                .map(|n| n.data)
                .filter(|d| d.len() == self.block_size as usize);
            let (version, data) = {
                let g = buf.read_counted(waits);
                verify(&buf, &g)?;
                let data = match reuse {
                    Some(mut d) => {
                        d.copy_from_slice(&g.data);
                        d
                    }
                    None => Box::from(&g.data[..]),
                };
                (g.version, data)
            };
            let n = s.insert(NodeCopy {
                cache: self.id,
                buf,
                version,
                data,
            });
            Ok((n.state(), f(&n.data)))
        })
    }

    /// The state of block `blkno` now and whether a commit holds it locked, seen through this
    /// thread's copy of the block when it keeps one (no count taken on the buffer), else
    /// through the cache's maps; None if the block is not in memory. Never reads the device:
    /// a commit checks this under its locks.
    pub fn state_and_locked(&self, blkno: u64) -> Option<(BufState, bool)> {
        let of = |b: &Buf| (b.state_now(), b.locked_exclusive());
        self.in_copy(blkno, |n| Some(of(&n.buf)))
            .or_else(|| self.cached(blkno).map(|b| of(&b)))
    }
}

impl Buf {
    /// The state the buffer is in now: its identity and its version.
    fn state_now(&self) -> BufState {
        BufState {
            uid: self.uid(),
            version: self.version(),
        }
    }
}

impl NodeCopy {
    fn state(&self) -> BufState {
        BufState {
            uid: self.buf.uid(),
            version: self.version,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::util::lockstat::LockWaits;
    use cilfs_device::{Device, SimDevice, WriteFlags};

    static W: LockWaits = LockWaits::new("buffer");

    fn ok(_: &Buf, _: &crate::buf::BufData) -> Result<(), cilfs_device::DeviceError> {
        Ok(())
    }

    fn cache_with(block: u64, byte: u8) -> BufCache {
        let dev = Arc::new(SimDevice::new(4096 * 64, 7));
        dev.write(block * 4096, &[byte; 4096], WriteFlags::NONE)
            .unwrap();
        BufCache::new(dev, 4096, 16 * 4096)
    }

    /// A change published to the block (a new version) ends its copy: the next read copies
    /// the block again and sees the change.
    #[test]
    fn a_copy_serves_until_its_block_changes() {
        let cache = cache_with(3, 1);
        assert_eq!(cache.with_copy(3, |d| d[0]), None, "no copy yet");
        let (s0, first) = cache.copy_and(3, &W, ok, |d| d[0]).unwrap();
        assert_eq!(first, 1);
        assert_eq!(cache.with_copy(3, |d| d[0]), Some((s0, 1)));
        let buf = cache.get(3).unwrap();
        {
            let mut g = buf.lock();
            g.data[0] = 2;
            // Locked by a commit: seen as such through the copy.
            assert_eq!(cache.state_and_locked(3), Some((s0, true)));
            buf.bump_version(&mut g);
        }
        assert_eq!(cache.with_copy(3, |d| d[0]), None, "a stale copy served");
        let s1 = BufState {
            version: s0.version + 1,
            ..s0
        };
        assert_eq!(cache.state_and_locked(3), Some((s1, false)));
        assert_eq!(cache.copy_and(3, &W, ok, |d| d[0]).unwrap(), (s1, 2));
        assert_eq!(cache.with_copy(3, |d| d[0]), Some((s1, 2)));
    }

    /// Copies are the calling thread's own, and of their own cache: two filesystems in one
    /// process share the threads.
    #[test]
    fn copies_serve_only_their_thread_and_their_cache() {
        let (a, b) = (cache_with(3, 1), cache_with(3, 2));
        assert_eq!(a.copy_and(3, &W, ok, |d| d[0]).unwrap().1, 1);
        assert_eq!(b.with_copy(3, |d| d[0]), None);
        assert_eq!(b.copy_and(3, &W, ok, |d| d[0]).unwrap().1, 2);
        // One slot per block number: b's copy replaced a's.
        assert_eq!(a.with_copy(3, |d| d[0]), None);
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(b.with_copy(3, |d| d[0]), None));
        });
    }

    /// A kept copy holds its buffer: eviction passes leave it in the cache, so the copy and
    /// the cache never disagree on the block's buffer (and so on its version). The reads
    /// after the copy also take the block's hot slot from it.
    #[test]
    fn a_kept_copy_keeps_its_buffer_in_the_cache() {
        let dev = Arc::new(SimDevice::new(4096 * 1024, 7));
        let cache = BufCache::new(dev, 4096, 16 * 4096);
        cache.copy_and(5, &W, ok, |_| ()).unwrap();
        for b in 100..600 {
            cache.get(b).unwrap();
        }
        assert!(cache.evicted() > 400);
        assert!(cache.cached(5).is_some(), "the copied block was evicted");
        assert!(cache.with_copy(5, |_| ()).is_some());
    }

    /// A block evicted and read again gets a new buffer whose versions start over: the state
    /// a copy was taken in must not match the new buffer's however often it changed since
    /// (a commit would take a node changed under it for the one it stepped through). The
    /// state of a block not in memory is not read from the device.
    #[test]
    fn a_state_of_an_evicted_buffer_never_matches_its_successor() {
        let dev = Arc::new(SimDevice::new(4096 * 1024, 7));
        let cache = BufCache::new(dev, 4096, 16 * 4096);
        let bump = |n: u64| {
            let b = cache.get(5).unwrap();
            for _ in 0..n {
                let mut g = b.lock();
                g.data[0] = g.data[0].wrapping_add(1);
                b.bump_version(&mut g);
                g.dirty.clear();
            }
        };
        bump(3);
        let (seen, _) = cache.copy_and(5, &W, ok, |_| ()).unwrap();
        assert_eq!(seen.version, 3);
        // The copy's slot taken by another block (same slot), then the hot slot and the
        // map's hold let go through eviction.
        let other = (6..300).find(|&b| slot(b) == slot(5)).unwrap();
        cache.copy_and(other, &W, ok, |_| ()).unwrap();
        for b in 300..1000 {
            cache.get(b).unwrap();
        }
        assert!(cache.cached(5).is_none(), "block 5 stayed in memory");
        assert_eq!(
            cache.state_and_locked(5),
            None,
            "the state of a block not in memory"
        );
        bump(3);
        let (now, _) = cache.state_and_locked(5).unwrap();
        assert_eq!(now.version, seen.version);
        assert_ne!(now, seen, "a new buffer's state matched an evicted one's");
    }
}
