//! Each thread's copies of the interior tree nodes it descends through (issue 17).
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

thread_local! {
    static COPIES: RefCell<[Option<NodeCopy>; SLOTS]> =
        const { RefCell::new([const { None }; SLOTS]) };
}

fn slot(blkno: u64) -> usize {
    (spread(blkno) >> 40) as usize % SLOTS
}

impl BufCache {
    /// `f` on this thread's copy of block `blkno`, if it keeps one and the block is still at
    /// the copy's version: the version and `f`'s answer. No lock is taken.
    pub fn with_copy<R>(&self, blkno: u64, f: impl FnOnce(&[u8]) -> R) -> Option<(u64, R)> {
        COPIES.with(|c| match &c.borrow()[slot(blkno)] {
            Some(n) if n.cache == self.id && n.buf.blkno() == blkno => {
                (n.buf.version() == n.version).then(|| (n.version, f(&n.data)))
            }
            _ => None,
        })
    }

    /// Copies block `blkno` as it is now (under its read lock) into this thread's copies, and
    /// runs `f` on the copy: the version copied and `f`'s answer. Reads the block if it is
    /// not in memory.
    pub fn copy_and<R>(
        &self,
        blkno: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<(u64, R), cilfs_device::DeviceError> {
        let buf = self.get(blkno)?;
        COPIES.with(|c| {
            let mut c = c.borrow_mut();
            let s = &mut c[slot(blkno)];
            let reuse = s
                .take()
                .map(|n| n.data)
                .filter(|d| d.len() == self.block_size as usize);
            let (version, data) = {
                let g = buf.read();
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
            Ok((version, f(&n.data)))
        })
    }

    /// The version of block `blkno` now and whether a commit holds it locked, seen through
    /// this thread's copy of the block when it keeps one (no count taken on the buffer), else
    /// through the cache.
    pub fn version_and_locked(&self, blkno: u64) -> Result<(u64, bool), cilfs_device::DeviceError> {
        let state = |b: &Buf| (b.version(), b.locked_exclusive());
        let copied = COPIES.with(|c| match &c.borrow()[slot(blkno)] {
            Some(n) if n.cache == self.id && n.buf.blkno() == blkno => Some(state(&n.buf)),
            _ => None,
        });
        match copied {
            Some(s) => Ok(s),
            None => Ok(state(&*self.get(blkno)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use cilfs_device::{Device, SimDevice, WriteFlags};

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
        let (v0, first) = cache.copy_and(3, |d| d[0]).unwrap();
        assert_eq!(first, 1);
        assert_eq!(cache.with_copy(3, |d| d[0]), Some((v0, 1)));
        let buf = cache.get(3).unwrap();
        {
            let mut g = buf.lock();
            g.data[0] = 2;
            // Locked by a commit: seen as such through the copy.
            assert_eq!(cache.version_and_locked(3).unwrap(), (v0, true));
            buf.bump_version(&mut g);
        }
        assert_eq!(cache.with_copy(3, |d| d[0]), None, "a stale copy served");
        assert_eq!(cache.version_and_locked(3).unwrap(), (v0 + 1, false));
        assert_eq!(cache.copy_and(3, |d| d[0]).unwrap(), (v0 + 1, 2));
        assert_eq!(cache.with_copy(3, |d| d[0]), Some((v0 + 1, 2)));
    }

    /// Copies are the calling thread's own, and of their own cache: two filesystems in one
    /// process share the threads.
    #[test]
    fn copies_serve_only_their_thread_and_their_cache() {
        let (a, b) = (cache_with(3, 1), cache_with(3, 2));
        assert_eq!(a.copy_and(3, |d| d[0]).unwrap().1, 1);
        assert_eq!(b.with_copy(3, |d| d[0]), None);
        assert_eq!(b.copy_and(3, |d| d[0]).unwrap().1, 2);
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
        cache.copy_and(5, |_| ()).unwrap();
        for b in 100..600 {
            cache.get(b).unwrap();
        }
        assert!(cache.evicted() > 400);
        assert!(cache.cached(5).is_some(), "the copied block was evicted");
        assert!(cache.with_copy(5, |_| ()).is_some());
    }
}
