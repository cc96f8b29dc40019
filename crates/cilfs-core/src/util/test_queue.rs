//! Test doubles for the asynchronous write path: a write queue over the simulated device whose
//! writes reach it only when completed, late and out of order, so that a crash snapshot taken
//! meanwhile has lost them (the log writer's body iclogs and the AIL's write back both use it),
//! and holds that stop a flush, a flagged write or a writer's wait for its queued writes until
//! the test lets it go.

use cilfs_device::{
    Device, DeviceError, IoStats, QueuedBuf, QueuedWrite, SimDevice, WriteFlags, WriteQueue,
};
use cilfs_sync::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long [`Hold::wait_caught`] waits before it reports that the operation never came: a
/// deadlock net for a journal that waits where it should not, never a measure of speed (the
/// awaited operation follows from the previous step with no other wait).
const HOLD_NET: Duration = Duration::from_secs(30);

/// A point in the device where the test stops one operation and lets it go when it chooses, so
/// that an interleaving that otherwise needs a slow disk (the pusher writing the next checkpoint
/// while a commit iclog is still being written) happens on every run, whatever the scheduler.
/// The held operation blocks the thread that issued it, as a synchronous write to a slow disk
/// does.
#[derive(Debug, Default)]
pub(crate) struct Hold {
    state: Mutex<HoldState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct HoldState {
    /// The next operation through this point is to be held.
    armed: bool,
    /// An operation is held now.
    holding: bool,
    /// Operations held so far.
    caught: u64,
}

impl Hold {
    /// Holds the next operation through this point (one only).
    pub(crate) fn arm(&self) {
        self.state.lock().armed = true;
    }

    /// Lets the held operation go, if any. Arming before releasing holds the operation after it.
    pub(crate) fn release(&self) {
        self.state.lock().holding = false;
        self.changed.notify_all();
    }

    /// Disarms and lets go: nothing is held any more (so a failing test does not leave the
    /// journal's threads blocked in the device while it unwinds).
    pub(crate) fn open(&self) {
        let mut st = self.state.lock();
        st.armed = false;
        st.holding = false;
        self.changed.notify_all();
    }

    /// Waits until `n` operations in all have been held here; false if they did not come
    /// within the deadlock net.
    pub(crate) fn wait_caught(&self, n: u64) -> bool {
        let deadline = Instant::now() + HOLD_NET;
        let mut st = self.state.lock();
        while st.caught < n {
            if self.changed.wait_until(&mut st, deadline).timed_out() {
                return st.caught >= n;
            }
        }
        true
    }

    /// Called by the operation on its way to the device: returns at once unless armed.
    fn pass(&self) {
        let mut st = self.state.lock();
        if !st.armed {
            return;
        }
        st.armed = false;
        st.holding = true;
        st.caught += 1;
        self.changed.notify_all();
        while st.holding {
            self.changed.wait(&mut st);
        }
    }
}

/// A write queue over a simulated device whose writes complete only when the writer waits, all
/// at once and newest first: as late and as out of order as a real queue may complete them.
#[derive(Debug)]
struct LateQueue {
    dev: Arc<SimDevice>,
    in_flight: Arc<AtomicUsize>,
    merged: Arc<AtomicUsize>,
    queued: Vec<(u64, Vec<QueuedBuf>)>,
    /// Without waiting, completes every write but the oldest (which stays in flight until the
    /// writer waits): a free iclog exists although the next one in ring order is busy. A wait
    /// completes only the newest write.
    oldest_last: bool,
    /// Passed by a writer that waited, once its writes have landed.
    waited: Arc<Hold>,
}

impl LateQueue {
    /// Completes the queued writes from index `from` of `queued` on, newest first.
    fn complete_range(&mut self, from: usize) -> cilfs_device::Result<Vec<QueuedWrite>> {
        let mut out = Vec::new();
        while self.queued.len() > from {
            let Some((offset, parts)) = self.queued.pop() else {
                break;
            };
            let mut at = offset;
            for p in parts {
                self.dev
                    .write(at, &p.buf[p.range.clone()], WriteFlags::NONE)?;
                at += p.range.len() as u64;
                out.push(QueuedWrite {
                    tag: p.tag,
                    buf: p.buf,
                    result: Ok(()),
                });
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(out)
    }
}

impl WriteQueue for LateQueue {
    fn submit(
        &mut self,
        offset: u64,
        parts: Vec<QueuedBuf>,
    ) -> Result<(), (Vec<QueuedBuf>, DeviceError)> {
        if parts.len() > 1 {
            self.merged.fetch_add(1, Ordering::SeqCst);
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.queued.push((offset, parts));
        Ok(())
    }

    fn complete(&mut self, wait: bool) -> cilfs_device::Result<Vec<QueuedWrite>> {
        match (wait, self.oldest_last) {
            (true, false) => {
                let done = self.complete_range(0);
                self.waited.pass();
                done
            }
            // Waiting, only the newest completes: a writer that needs an older write must
            // wait again.
            (true, true) => {
                let done = self.complete_range(self.queued.len().saturating_sub(1));
                self.waited.pass();
                done
            }
            (false, true) => self.complete_range(1),
            (false, false) => Ok(Vec::new()),
        }
    }

    fn in_flight(&self) -> usize {
        self.queued.len()
    }
}

/// The simulated device, with a [`LateQueue`]; counts flagged writes issued while a queued
/// write had not completed (their PREFLUSH would not cover it). Flushes and flagged writes
/// (commit iclogs, with the write queue written by the log writer's commit thread) pass
/// through a [`Hold`] each, and so does a writer that waited for its queued writes, once they
/// have landed (the log writer does so before a commit iclog).
#[derive(Debug)]
pub(crate) struct Queued {
    inner: Arc<SimDevice>,
    pub(crate) in_flight: Arc<AtomicUsize>,
    pub(crate) merged: Arc<AtomicUsize>,
    pub(crate) early_flagged: AtomicUsize,
    oldest_last: bool,
    pub(crate) flush_hold: Hold,
    pub(crate) flagged_hold: Hold,
    pub(crate) waited_hold: Arc<Hold>,
}

impl Queued {
    pub(crate) fn new(inner: Arc<SimDevice>, oldest_last: bool) -> Self {
        Self {
            inner,
            in_flight: Arc::default(),
            merged: Arc::default(),
            early_flagged: AtomicUsize::new(0),
            oldest_last,
            flush_hold: Hold::default(),
            flagged_hold: Hold::default(),
            waited_hold: Arc::default(),
        }
    }

    /// Lets every held operation go and holds nothing more.
    pub(crate) fn open_holds(&self) {
        self.flush_hold.open();
        self.flagged_hold.open();
        self.waited_hold.open();
    }
}

impl Device for Queued {
    fn read(&self, offset: u64, buf: &mut [u8]) -> cilfs_device::Result<()> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> cilfs_device::Result<()> {
        if flags != WriteFlags::NONE {
            // Counted as issued now: a held write is one the disk is slow to complete.
            if self.in_flight.load(Ordering::SeqCst) != 0 {
                self.early_flagged.fetch_add(1, Ordering::SeqCst);
            }
            self.flagged_hold.pass();
        }
        self.inner.write(offset, buf, flags)
    }
    fn flush(&self) -> cilfs_device::Result<()> {
        self.flush_hold.pass();
        self.inner.flush()
    }
    fn write_queue(&self, _depth: usize) -> Option<Box<dyn WriteQueue>> {
        Some(Box::new(LateQueue {
            dev: Arc::clone(&self.inner),
            in_flight: Arc::clone(&self.in_flight),
            merged: Arc::clone(&self.merged),
            queued: Vec::new(),
            oldest_last: self.oldest_last,
            waited: Arc::clone(&self.waited_hold),
        }))
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}
