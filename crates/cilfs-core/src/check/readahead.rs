//! Read-ahead for the checker's walk: the children of an interior node are read by a few
//! threads, in runs of nearby blocks (one IO each), while the walk checks what it has.
//!
//! Read one 4 KiB block at a time from a cold cache, the tree's nodes were most of
//! `cilfs check`'s time: 48,000 nodes of a 1M-inode tree, some 85 us each (O_DIRECT on a
//! virtio disk). A leaf's siblings were mostly allocated together, so the 84-168 children of
//! a node lie in 5-10 runs with gaps of a few blocks.

use crate::journal::Journal;
use crate::util::numhash::NumberMap;
use cilfs_device::AlignedBuf;
use cilfs_sync::{Condvar, Mutex};
use std::collections::VecDeque;

/// Threads reading: IOs in flight at once (the walk itself is one more reader).
pub(super) const THREADS: usize = 4;
/// Blocks between two wanted ones read through rather than split into two IOs: a 4 KiB block
/// more costs some 3 us of transfer against some 85 us for another IO.
const GAP: u64 = 16;
/// The most blocks one IO reads.
const RUN_MAX: u64 = 256;

#[derive(Default)]
struct State {
    /// Runs to read: (first block, count).
    queue: VecDeque<(u64, u64)>,
    /// Blocks queued or being read: the walk waits for these rather than read them twice.
    /// The value is unused.
    pending: NumberMap<()>,
    done: bool,
}

#[derive(Default)]
pub(super) struct ReadAhead {
    state: Mutex<State>,
    /// Signalled when runs are queued, when a run was read, and at the end.
    cv: Condvar,
}

impl ReadAhead {
    /// Queues `blocks` (sorted here) to be read, except those cached already.
    pub fn want(&self, journal: &Journal, blocks: &mut [u64]) {
        blocks.sort_unstable();
        let mut st = self.state.lock();
        if st.done {
            return;
        }
        let mut run: Option<(u64, u64)> = None;
        for &b in blocks.iter() {
            if st.pending.contains_key(&b) || journal.cached_buf(b).is_some() {
                continue;
            }
            st.pending.insert(b, ());
            run = match run {
                Some((s, n)) if b < s + n + GAP && b + 1 - s <= RUN_MAX => Some((s, b + 1 - s)),
                Some(r) => {
                    st.queue.push_back(r);
                    Some((b, 1))
                }
                None => Some((b, 1)),
            };
        }
        if let Some(r) = run {
            st.queue.push_back(r);
        }
        self.cv.notify_all();
    }

    /// Waits while `blk` is queued or being read.
    pub fn wait(&self, blk: u64) {
        let mut st = self.state.lock();
        while st.pending.contains_key(&blk) && !st.done {
            self.cv.wait(&mut st);
        }
    }

    /// A reading thread: runs until `finish`.
    pub fn worker(&self, journal: &Journal) {
        let mut scratch = AlignedBuf::zeroed(RUN_MAX as usize * journal.block_size() as usize);
        loop {
            let (start, n) = {
                let mut st = self.state.lock();
                loop {
                    if st.done {
                        return;
                    }
                    if let Some(r) = st.queue.pop_front() {
                        break r;
                    }
                    self.cv.wait(&mut st);
                }
            };
            let want = |b: u64| self.state.lock().pending.contains_key(&b);
            // An error is left to the walk's own read of the block, which reports it.
            let _ = journal.read_ahead(start, n, &want, &mut scratch);
            let mut st = self.state.lock();
            for b in start..start + n {
                st.pending.remove(&b);
            }
            self.cv.notify_all();
        }
    }

    /// Ends the workers (queued runs are dropped) and releases any waiter.
    pub fn finish(&self) {
        let mut st = self.state.lock();
        st.done = true;
        st.queue.clear();
        st.pending.clear();
        self.cv.notify_all();
    }
}

/// Finishes the read-ahead when the walk ends, by an error too: the threads would wait forever.
pub(super) struct FinishOnDrop<'a>(pub &'a ReadAhead);

impl Drop for FinishOnDrop<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}
