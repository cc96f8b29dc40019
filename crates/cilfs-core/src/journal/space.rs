//! Log space: FIFO reservations, and making space by writing the AIL back and moving the tail.
//!
//! Rule 1 of journal.md: log space is reused only behind `safe_tail`, a tail sampled before a
//! completed data-device flush, so metadata written back from that space is stable first.

use super::{Journal, JournalError, SpaceState};
use crate::log::Lsn;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Journal {
    /// Bytes of log that reservations may use: the log less room for an unmount record and the
    /// rounding of the last iclog of each checkpoint.
    pub(crate) fn capacity(&self) -> u64 {
        self.space_math.bytes() - 2 * u64::from(self.cfg.log.logbsize)
    }

    fn available(&self, sp: &SpaceState) -> u64 {
        let used = self.space_math.distance(sp.safe_tail, sp.head) * 512;
        self.capacity()
            .saturating_sub(used + sp.cil_charged + sp.reserved)
    }

    /// Takes `unit` bytes of log space, waiting in FIFO order while the log is short.
    pub(crate) fn reserve(&self, unit: u64) -> Result<(), JournalError> {
        let max = self.capacity() / 4;
        if unit > max {
            return Err(JournalError::ReservationTooLarge { need: unit, max });
        }
        let mut sp = self.space.lock();
        let ticket = sp.next_ticket;
        sp.next_ticket += 1;
        sp.waiters.push_back(ticket);
        let mut waited = false;
        loop {
            if let Err(e) = self.check_alive() {
                sp.waiters.retain(|&t| t != ticket);
                return Err(e);
            }
            let first = sp.waiters.front() == Some(&ticket);
            if first && self.available(&sp) >= unit {
                sp.waiters.pop_front();
                sp.reserved += unit;
                drop(sp);
                self.space_changed.notify_all();
                return Ok(());
            }
            if !waited {
                waited = true;
                self.counters
                    .reservation_waits
                    .fetch_add(1, Ordering::Relaxed);
            }
            if first {
                drop(sp);
                let progress = self.make_space();
                sp = self.space.lock();
                match progress {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => {
                        sp.waiters.retain(|&t| t != ticket);
                        return Err(e);
                    }
                }
            }
            // Space comes back when another transaction commits or a push completes.
            self.space_changed
                .wait_for(&mut sp, Duration::from_millis(50));
        }
    }

    pub(crate) fn release_reservation(&self, unit: u64) {
        self.space.lock().reserved -= unit;
        self.space_changed.notify_all();
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
            drop(sp);
            self.space_changed.notify_all();
            return Ok(true);
        }
        Ok(false)
    }

    /// After a checkpoint: if less than a quarter of the log is free, write back AIL items so the
    /// next checkpoint's flush can move the tail (no flush of its own here).
    pub(crate) fn ail_push_ahead(&self) -> Result<(), JournalError> {
        let (free, head) = {
            let sp = self.space.lock();
            (self.available(&sp), sp.head)
        };
        if free >= self.capacity() / 4 {
            return Ok(());
        }
        let keep = self.space_math.sectors / 2;
        let target = self.space_math.back(head, keep);
        let mut ail = self.ail.lock();
        match ail.push(target, &*self.data, &self.geo.sb.uuid) {
            Ok(r) => {
                self.extra
                    .ail_writeback_bytes
                    .fetch_add(r.written_bytes, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                drop(ail);
                self.shut_down(e)
            }
        }
    }
}
