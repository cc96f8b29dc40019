//! The iclog ring: buffers taken back from completed writes, a free one claimed for the next
//! iclog (a noiclog wait when every one is in flight), and the commit iclog left in flight by
//! `write_checkpoint_async`, waited for or reaped.

use super::io::{put_back, threads_gone};
use super::LogWriter;
use cilfs_device::{AlignedBuf, DeviceError};
use std::sync::atomic::Ordering;

impl LogWriter {
    /// Puts completed iclogs back in the ring; returns the first error among them.
    pub(super) fn take_back(&mut self, wait: bool) -> Result<(), DeviceError> {
        let Some(io) = self.io.as_mut() else {
            unreachable!("iclog in flight without asynchronous IO")
        };
        if wait {
            put_back(&mut self.ring, io.unplug())?;
        }
        let mut first_err = Ok(());
        for d in io.completions(wait)? {
            self.ring[d.slot] = Some(d.buf);
            if first_err.is_ok() {
                first_err = d.result;
            }
        }
        first_err
    }

    /// Takes completions until ring slot `slot` has its buffer back.
    pub(super) fn wait_slot(&mut self, slot: usize) -> Result<(), DeviceError> {
        let mut first_err = Ok(());
        while self.ring[slot].is_none() {
            let r = self.take_back(true);
            if first_err.is_ok() {
                first_err = r;
            }
        }
        first_err
    }

    /// Waits until no iclog is in flight, commit iclogs included, whatever their outcome:
    /// what a dying daemon's log IO does before the next mount may read the log (its writes
    /// in flight land or fail, none lands later).
    pub fn settle(&mut self) -> Result<(), DeviceError> {
        self.wait_all()
    }

    /// Waits until no iclog is in flight, commit iclogs included.
    pub(super) fn wait_all(&mut self) -> Result<(), DeviceError> {
        let mut r = Ok(());
        for slot in 0..self.ring.len() {
            let x = self.wait_slot(slot);
            if r.is_ok() {
                r = x;
            }
        }
        let x = self.wait_commit();
        if r.is_ok() {
            r = x;
        }
        r
    }

    /// Whether a commit iclog left in flight by `write_checkpoint_async` may not have completed.
    pub fn commit_in_flight(&self) -> bool {
        self.commit_in_flight
    }

    /// Whether the commit iclog left in flight is still being written. Takes its completion if
    /// it has arrived, so `wait_commit` then returns at once.
    pub fn commit_pending(&mut self) -> bool {
        if !self.commit_in_flight || self.commit_reaped.is_some() {
            return false;
        }
        let Some(pool) = self.commit_io.as_ref() else {
            return false;
        };
        match pool.done.try_recv() {
            Ok(d) => {
                self.commit_reaped = Some(d.result);
                self.commit_spare = Some(d.buf);
                false
            }
            Err(_) => true,
        }
    }

    /// Forgets the commit iclog left in flight if it has completed without error, and says so.
    /// A failed one stays, for `wait_commit` to report.
    pub(super) fn take_completed_commit(&mut self) -> bool {
        if self.commit_pending() || !matches!(self.commit_reaped, Some(Ok(()))) {
            return false;
        }
        self.commit_reaped = None;
        self.commit_in_flight = false;
        true
    }

    /// Waits for the commit iclog left in flight by `write_checkpoint_async`, if any: once it
    /// returns Ok, that checkpoint is stable.
    pub fn wait_commit(&mut self) -> Result<(), DeviceError> {
        if !self.commit_in_flight {
            return Ok(());
        }
        if let Some(r) = self.commit_reaped.take() {
            self.commit_in_flight = false;
            return r;
        }
        let Some(pool) = self.commit_io.as_ref() else {
            unreachable!("a commit iclog in flight without the commit thread")
        };
        let done = pool.done.recv().map_err(|_| threads_gone(0));
        self.commit_in_flight = false;
        let done = done?;
        self.commit_spare = Some(done.buf);
        done.result
    }

    /// Takes the completions that have already arrived, without waiting.
    pub(super) fn reap(&mut self) -> Result<(), DeviceError> {
        if self.io.is_none() {
            return Ok(());
        }
        self.take_back(false)
    }

    /// Makes `next_iclog` a free ring slot, waiting for one (a noiclog event) if every iclog is
    /// in flight. Completions already delivered are taken first: an iclog whose IO finished is
    /// free (as XFS's completion handler makes it ACTIVE again), so finding it is no wait. Any
    /// free slot will do, the next in ring order first: writes may complete out of order, and
    /// nothing but the commit iclog (which waits for all) depends on the order they finish in.
    pub(super) fn claim(&mut self) -> Result<(), DeviceError> {
        let n = self.ring.len();
        let start = self.next_iclog;
        let free = |ring: &[Option<AlignedBuf>]| {
            (0..n).map(|k| (start + k) % n).find(|&s| ring[s].is_some())
        };
        if free(&self.ring).is_none() {
            self.reap()?;
        }
        let mut first_err = Ok(());
        let mut counted = false;
        loop {
            if let Some(slot) = free(&self.ring) {
                self.next_iclog = slot;
                return first_err;
            }
            if !counted {
                self.counters.noiclog_waits.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            if let Err(e) = self.take_back(true) {
                if free(&self.ring).is_none() {
                    return Err(e);
                }
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
    }
}
