//! Log space: FIFO reservations, and making space by writing the AIL back and moving the tail.
//!
//! Rule 1 of docs/journal.md: log space is reused only behind `safe_tail`, a tail sampled before a
//! completed data-device flush (reduced, legacy) or published by the AIL only once a flush
//! covered its write back (ail), so metadata written back from that space is stable first.

use super::{Journal, JournalError, SpaceState};
use crate::ail::{self, AilPush, Publish};
use crate::log::item::WriteBackCtx;
use crate::log::FlushPolicy;
use crate::log::Lsn;
use crate::trans::grant::ReserveError;
use std::sync::atomic::Ordering;

/// Sectors a tail moved by relief must gain before an empty checkpoint is written to carry it
/// (that record is two sectors: a header and one of ops).
const TAIL_RECORD_MIN_SECTORS: u32 = 8;
/// How long relief waits before trying again when only locked items hold the tail.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_millis(1);

impl Journal {
    /// Bytes of log that reservations may use: the log less room for an unmount record and the
    /// rounding of the last iclog of each checkpoint.
    pub(crate) fn capacity(&self) -> u64 {
        self.space_math.bytes() - 2 * u64::from(self.cfg.log.logbsize)
    }

    /// Log bytes taken: between the safe tail and the head, plus unwritten CIL charges.
    pub(crate) fn space_in_use_bytes(&self, sp: &SpaceState) -> u64 {
        self.space_math.distance(sp.safe_tail, sp.head) * 512 + sp.cil_charged
    }

    /// Tells the grant head what is in use after `space` changed (called with `space` locked,
    /// so updates reach the grant head in order).
    pub(crate) fn publish_space(&self, sp: &SpaceState) {
        let in_use = self.space_in_use_bytes(sp);
        self.grant.update(|g| g.in_use = in_use);
    }

    fn available(&self) -> u64 {
        self.grant.read(|g| g.available())
    }

    /// Takes `unit` bytes of log space, waiting in FIFO order while the log is short.
    pub(crate) fn reserve(&self, unit: u64) -> Result<(), JournalError> {
        self.check_alive()?;
        match self.grant.reserve(unit, || self.make_space()) {
            Ok(_) if self.is_frozen() => {
                self.release_reservation(unit);
                Err(JournalError::ReadOnly)
            }
            Ok(waited) => {
                if let Some(waited) = waited {
                    self.counters
                        .reservation_waits
                        .fetch_add(1, Ordering::Relaxed);
                    self.extra
                        .reservation_wait_us
                        .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(ReserveError::TooLarge { need, max }) => {
                Err(JournalError::ReservationTooLarge { need, max })
            }
            Err(ReserveError::ShutDown) => Err(JournalError::Shutdown),
            Err(ReserveError::MakeSpace(e)) => Err(e),
        }
    }

    /// `reserve` without waiting: `Ok(false)` when it does not fit now.
    pub(crate) fn try_reserve(&self, unit: u64) -> Result<bool, JournalError> {
        self.check_alive()?;
        match self.grant.try_reserve(unit) {
            Ok(true) if self.is_frozen() => {
                self.release_reservation(unit);
                Err(JournalError::ReadOnly)
            }
            Ok(got) => Ok(got),
            Err(ReserveError::TooLarge { need, max }) => {
                Err(JournalError::ReservationTooLarge { need, max })
            }
            Err(ReserveError::ShutDown) => Err(JournalError::Shutdown),
            Err(ReserveError::MakeSpace(never)) => match never {},
        }
    }

    pub(crate) fn release_reservation(&self, unit: u64) {
        self.grant.release(unit);
    }

    /// Called by the reservation at the head of the queue while the log is short. In
    /// background mode it only asks the AIL thread to free space and returns `false`, so the
    /// waiter sleeps until space is published (as XFS's grant waiters push xfsaild and sleep):
    /// a waiter doing the write back itself kept writing for hundreds of milliseconds after the
    /// checkpoint it was waiting for had freed the space. In inline mode it frees space itself,
    /// as the AIL thread would (a quarter of the log first, so the crash explorers, which run
    /// inline, crash relief that leaves items in the AIL), and everything if that did not help.
    pub(crate) fn make_space(&self) -> Result<bool, JournalError> {
        if let Some(a) = self.ail_worker.lock().as_ref() {
            a.kick_urgent();
            return Ok(false);
        }
        if self.free_space(self.relief_target())? {
            return Ok(true);
        }
        self.free_space(Lsn::from_raw(u64::MAX))
    }

    /// How far relief writes back: a quarter of the log past the safe tail (XFS's free
    /// threshold).
    fn relief_target(&self) -> Lsn {
        let safe_tail = self.space().safe_tail;
        self.space_math
            .advance(safe_tail, self.space_math.sectors / 4)
    }

    /// Frees log space now: writes back the unpinned items below `target`, then pushes the CIL
    /// if pinned items or uncheckpointed changes hold the tail, or else writes an empty
    /// checkpoint to carry a tail that moved. Returns whether a checkpoint was pushed, or
    /// (after a short pause) whether items locked at the moment may free space once unlocked.
    pub(crate) fn free_space(&self, target: Lsn) -> Result<bool, JournalError> {
        let before = self.space().safe_tail;
        let r = self.write_back_ail(target)?;
        let cil_has_items = !self.cil.is_empty();
        if r.pinned > 0 || cil_has_items {
            // A push samples the tail and flushes the data device before it writes (or, under
            // the ail policy, finds the tail already flushed).
            let seq = self.current_seq();
            self.push(seq)?;
            return Ok(true);
        }
        let tail = {
            let writer = self.writer.lock();
            let tail = self.ail.lock().min_lsn().unwrap_or(writer.head());
            self.release_writer(writer);
            tail
        };
        // Only for more space than the record itself takes: with the AIL empty the tail is the
        // head, which each empty checkpoint moves on, and a waiter that other reservations keep
        // short would otherwise write one after another.
        if tail > before
            && self.space_math.distance(before, tail) > u64::from(TAIL_RECORD_MIN_SECTORS)
        {
            // The tail moved with nothing to checkpoint. Space behind it is reused only once a
            // stable record carries it: a crash that keeps part of the next checkpoint, written
            // over the old tail, would otherwise leave recovery starting from that old tail
            // (the last valid record's) and stopping at the overwritten sectors, short of
            // checkpoints whose items are not written back. So write an empty checkpoint: it
            // samples the tail, flushes the data device first and commits with FUA.
            self.push_carrying_tail()?;
            return Ok(true);
        }
        if r.busy > 0 {
            // Only items locked right now (by a transaction not yet committed, or a reader)
            // hold the tail: no push frees them, so pushing an empty CIL again and again only
            // spins. The holder's commit wakes the waiter, a reader's unlock wakes nobody: try
            // again shortly.
            cilfs_sync::thread::sleep(BUSY_RETRY);
            return Ok(true);
        }
        Ok(false)
    }

    /// The AIL thread's answer to a waiting reservation: free up to the relief target, and wake
    /// the waiters if that made progress (or failed, so they see the shutdown). With no
    /// progress the waiter sleeps on: waking it only made it ask again at once, and the two
    /// threads spun until another transaction let go of its space. Nothing is lost by not
    /// waking it: every change of log space or reservations (`GrantHead::update`) wakes it,
    /// and its wait has a timeout as a net.
    pub(crate) fn relieve_waiters(&self) -> Result<(), JournalError> {
        self.extra.relief_passes.fetch_add(1, Ordering::Relaxed);
        let r = self.free_space(self.relief_target());
        if !matches!(r, Ok(false)) {
            self.grant.update(|_| ());
        }
        r.map(|_| ())
    }

    /// After each checkpoint: once less than half the log is free, write back the AIL items
    /// logged more than a quarter of the log ago, so the tail that later checkpoints stamp stays
    /// close behind the head and more than a quarter of the log stays free (docs/journal.md section 4).
    ///
    /// Early and deep, rather than at a quarter free: the tail becomes safe only when a
    /// checkpoint sampled after the write back completes (log space is reused only behind a
    /// tail that a stable record carries), and the contexts charged at once (one whose commit
    /// is in flight, one being written, one filling) may hold up to 6S. A pass started later
    /// is overtaken by the head, and reservations that then run dry stall every committer. Pinned items below the target push the CIL,
    /// as xfsaild forces the log when it meets pinned items: only their checkpoint can move
    /// them. Under memory pressure everything unpinned is written back.
    pub(crate) fn ail_push_ahead(&self) -> Result<(), JournalError> {
        // Write back that a commit's flush has covered since lets the tail go first.
        self.ail.lock().publish_stable(&self.flush_clock);
        if self.ahead_paused.load(Ordering::Relaxed) {
            return Ok(());
        }
        let head = self.space().head;
        let target = if self.cache.over_limit() {
            Lsn::from_raw(u64::MAX)
        } else if self.available() < self.capacity() / 2 {
            self.space_math.back(head, self.space_math.sectors / 4)
        } else {
            return Ok(());
        };
        // Ahead of need the ail policy waits for the commit path's next flush to cover this
        // write back (the tail lags a checkpoint behind), rather than flush for it now.
        let publish = match self.cfg.log.policy {
            FlushPolicy::AilFlush => Publish::Deferred(&self.flush_clock),
            FlushPolicy::Reduced | FlushPolicy::Legacy => Publish::Completed,
        };
        let r = self.write_back_ail_publishing(target, publish)?;
        self.cache.trim();
        if r.pinned > 0 {
            self.request_push(self.current_seq());
        }
        Ok(())
    }

    /// Writes back AIL items below `target` (see `ail::push`) and counts the bytes; an IO error
    /// shuts the journal down. The tail may pass what it wrote back when it returns: under the
    /// ail policy after a data-device flush (which also publishes deferred write back), as the
    /// callers need space (relief) or an empty AIL (cover, unmount, freeze) now.
    pub(crate) fn write_back_ail(&self, target: Lsn) -> Result<AilPush, JournalError> {
        let publish = match self.cfg.log.policy {
            FlushPolicy::AilFlush => Publish::Flushed,
            FlushPolicy::Reduced | FlushPolicy::Legacy => Publish::Completed,
        };
        self.write_back_ail_publishing(target, publish)
    }

    fn write_back_ail_publishing(
        &self,
        target: Lsn,
        publish: Publish<'_>,
    ) -> Result<AilPush, JournalError> {
        let ctx = WriteBackCtx {
            uuid: self.geo.sb.uuid,
            checks: self.block_checks.read().clone(),
            down: Some(std::sync::Arc::clone(&self.shut_down)),
            writing: Some(std::sync::Arc::clone(&self.writing_back)),
        };
        match ail::push(
            &self.ail,
            &self.ail_writeback,
            target,
            &*self.data,
            &ctx,
            publish,
        ) {
            Ok(r) => {
                self.extra
                    .ail_writeback_bytes
                    .fetch_add(r.written_bytes, Ordering::Relaxed);
                self.extra
                    .ail_flushes
                    .fetch_add(r.flushes, Ordering::Relaxed);
                Ok(r)
            }
            Err(ail::PushError::Device(e)) => self.shut_down(e),
            Err(ail::PushError::Invalid { blkno, what }) => {
                self.shut_down(JournalError::BadWrite { blkno, what })
            }
            Err(ail::PushError::Down) => Err(JournalError::Shutdown),
        }
    }
}
