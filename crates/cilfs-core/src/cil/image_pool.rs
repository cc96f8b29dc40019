//! Vectors for CIL images, used again (docs/concurrency.md: frees across cores).
//!
//! Every logged block of every commit is formatted into a vector of up to about a block
//! (`Transaction::preformat`), which replaces the block's older image in the CIL; the pusher
//! drops a context's images once it has copied them into iclogs. Allocated afresh each time,
//! the committers' allocations kept reaching fresh memory, which the kernel faults in and
//! zeroes, and the pusher's frees went across to the committers' heaps: freeing images was a
//! sixth of the pusher's samples with two threads creating (perf, `cilfs bench fs`).
//!
//! So a committer takes its vectors from a stash of its own and puts the images its commit
//! replaced back there, and the pusher hands a written checkpoint's images to a spare list
//! that stashes refill from, a batch at a time (one lock per batch, not per image). Vectors
//! come back cleared; what a stash or the spare list cannot hold is freed.

use crate::util::sync::{rank, RankedMutex};
use std::cell::RefCell;

/// Vectors a thread's stash keeps.
const STASH_MAX: usize = 64;
/// Vectors a stash takes from the spare list at once.
const BATCH: usize = 32;
/// Bytes the spare list keeps, counted by capacity: a checkpoint's worth at 4 KiB blocks.
const SPARE_MAX_BYTES: usize = 8 << 20;
/// A vector larger than this (an image of a block larger than 64 KiB) is not kept.
const KEEP_MAX_CAPACITY: usize = 72 << 10;

/// A spare list and the stashes that refill from it: `POOL`, shared by every journal of the
/// process (a vector is a vector); tests make their own.
pub struct Pool {
    spare: RankedMutex<Spare, { rank::IMAGE_POOL }>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.spare.lock();
        write!(f, "Pool({} spare vectors, {} bytes)", s.vecs.len(), s.bytes)
    }
}

struct Spare {
    vecs: Vec<Vec<u8>>,
    bytes: usize,
}

pub static POOL: Pool = Pool::new();

cilfs_sync::thread_local! {
    static STASH: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

fn worth_keeping(capacity: usize) -> bool {
    capacity > 0 && capacity <= KEEP_MAX_CAPACITY
}

impl Default for Pool {
    fn default() -> Self {
        Self::new()
    }
}

impl Pool {
    pub const fn new() -> Self {
        Pool {
            spare: RankedMutex::new(Spare {
                vecs: Vec::new(),
                bytes: 0,
            }),
        }
    }

    /// An empty vector for an image: one given back earlier if there is one.
    pub fn take(&self) -> Vec<u8> {
        STASH.with(|s| {
            let mut s = s.borrow_mut();
            // The spare list is a static: under the deterministic scheduler its lock would
            // outlive the run that made it. Each task's stash does without it there.
            if s.is_empty() && !cilfs_sync::SCHEDULED {
                let mut spare = self.spare.lock();
                let at = spare.vecs.len().saturating_sub(BATCH);
                let batch: Vec<Vec<u8>> = spare.vecs.drain(at..).collect();
                spare.bytes -= batch.iter().map(Vec::capacity).sum::<usize>();
                drop(spare);
                s.extend(batch);
            }
            s.pop().unwrap_or_default()
        })
    }

    /// Gives back images no longer needed (replaced in the CIL) to this thread's stash.
    pub fn give(&self, images: impl IntoIterator<Item = Vec<u8>>) {
        STASH.with(|s| {
            let mut s = s.borrow_mut();
            for mut v in images {
                if s.len() < STASH_MAX && worth_keeping(v.capacity()) {
                    v.clear();
                    s.push(v);
                }
            }
        });
    }

    /// Takes a written checkpoint's images into the spare list, as many as it keeps; the rest
    /// stay in `images`, for the caller to free with no lock held.
    pub fn give_spare(&self, images: &mut Vec<Vec<u8>>) {
        if cilfs_sync::SCHEDULED {
            return;
        }
        let mut spare = self.spare.lock();
        images.retain_mut(|v| {
            let c = v.capacity();
            if !worth_keeping(c) || spare.bytes + c > SPARE_MAX_BYTES {
                return true;
            }
            v.clear();
            spare.bytes += c;
            spare.vecs.push(std::mem::take(v));
            false
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A vector given back is the next one taken, empty, on the same thread; one a pusher gave
    /// back reaches another thread through the spare list.
    #[test]
    fn given_back_vectors_are_taken_again_empty() {
        static P: Pool = Pool::new();
        std::thread::spawn(|| {
            let mut v = P.take();
            v.extend_from_slice(&[7; 4000]);
            let at = v.as_ptr();
            P.give([v]);
            let again = P.take();
            assert_eq!(
                again.as_ptr(),
                at,
                "a fresh vector instead of the one given back"
            );
            assert!(again.is_empty() && again.capacity() >= 4000);
        })
        .join()
        .unwrap();
        let mut written = Vec::new();
        for _ in 0..3 {
            written.push(vec![9u8; 5000]);
        }
        let at: Vec<usize> = written.iter().map(|v| v.as_ptr() as usize).collect();
        P.give_spare(&mut written);
        assert!(written.is_empty());
        std::thread::spawn(move || {
            let taken: Vec<Vec<u8>> = (0..3).map(|_| P.take()).collect();
            for p in at {
                let v = taken.iter().find(|v| v.as_ptr() as usize == p);
                assert!(
                    v.is_some_and(|v| v.is_empty()),
                    "a written image not reused"
                );
            }
        })
        .join()
        .unwrap();
    }

    /// The spare list keeps at most `SPARE_MAX_BYTES` of capacity, and no vector too large.
    #[test]
    fn the_spare_list_is_bounded() {
        let p = Pool::new();
        let mut many: Vec<Vec<u8>> = (0..4000).map(|_| Vec::with_capacity(4096)).collect();
        p.give_spare(&mut many);
        assert!(!many.is_empty(), "the rest comes back to be freed");
        let mut large = vec![Vec::<u8>::with_capacity(KEEP_MAX_CAPACITY + 1)];
        p.give_spare(&mut large);
        assert_eq!(large.len(), 1);
        let spare = p.spare.lock();
        assert!(spare.bytes > SPARE_MAX_BYTES / 2);
        assert!(spare.bytes <= SPARE_MAX_BYTES);
        assert_eq!(
            spare.bytes,
            spare.vecs.iter().map(Vec::capacity).sum::<usize>()
        );
        assert!(spare.vecs.iter().all(|v| v.capacity() <= KEEP_MAX_CAPACITY));
    }
}
