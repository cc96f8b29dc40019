//! Log space: FIFO reservations, and making space by writing the AIL back and moving the tail.
//!
//! Rule 1 of journal.md: log space is reused only behind `safe_tail`, a tail sampled before a
//! completed data-device flush, so metadata written back from that space is stable first.

use super::{Journal, JournalError, SpaceState};
use crate::log::Lsn;
use crate::trans::grant::ReserveError;
use std::sync::atomic::Ordering;

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
            Ok(waited) => {
                if waited {
                    self.counters
                        .reservation_waits
                        .fetch_add(1, Ordering::Relaxed);
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

    pub(crate) fn release_reservation(&self, unit: u64) {
        self.grant.release(unit);
    }

    /// Frees log space now: writes back everything unpinned, pushes the CIL if pinned items hold
    /// the tail, and flushes the data device so the new tail becomes safe. Returns whether the
    /// safe tail moved or a checkpoint was written.
    pub(crate) fn make_space(&self) -> Result<bool, JournalError> {
        let before = self.space.lock().safe_tail;
        let pinned = {
            let mut ail = self.ail.lock();
            let r = match ail.push(Lsn::from_raw(u64::MAX), &*self.data, &self.geo.sb.uuid) {
                Ok(r) => r,
                Err(e) => return self.shut_down(e),
            };
            self.extra
                .ail_writeback_bytes
                .fetch_add(r.written_bytes, Ordering::Relaxed);
            r.pinned + r.busy
        };
        let cil_has_items = !self.cil.lock().is_empty();
        if pinned > 0 || cil_has_items {
            // A push samples the tail and flushes the data device before it writes.
            let seq = self.current_seq();
            self.push(seq)?;
            return Ok(true);
        }
        let writer = self.writer.lock();
        let tail = self.ail.lock().min_lsn().unwrap_or(writer.head());
        if tail > before {
            if let Err(e) = self.data.flush() {
                return self.shut_down(e);
            }
            self.extra.tail_flushes.fetch_add(1, Ordering::Relaxed);
            let mut sp = self.space.lock();
            sp.safe_tail = sp.safe_tail.max(tail);
            self.publish_space(&sp);
            return Ok(true);
        }
        Ok(false)
    }

    /// After a checkpoint: if less than a quarter of the log is free, write back AIL items so the
    /// next checkpoint's flush can move the tail (no flush of its own here).
    pub(crate) fn ail_push_ahead(&self) -> Result<(), JournalError> {
        let head = self.space.lock().head;
        let free = self.available();
        let target = if self.cache.over_limit() {
            // Memory pressure: write back everything unpinned so clean buffers can be evicted.
            Lsn::from_raw(u64::MAX)
        } else if free < self.capacity() / 4 {
            self.space_math.back(head, self.space_math.sectors / 2)
        } else {
            return Ok(());
        };
        let mut ail = self.ail.lock();
        match ail.push(target, &*self.data, &self.geo.sb.uuid) {
            Ok(r) => {
                drop(ail);
                self.extra
                    .ail_writeback_bytes
                    .fetch_add(r.written_bytes, Ordering::Relaxed);
                self.cache.trim();
                Ok(())
            }
            Err(e) => {
                drop(ail);
                self.shut_down(e)
            }
        }
    }
}
