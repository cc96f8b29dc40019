//! Which data-device flushes have completed since a point in time: tickets for flushes as they
//! start, and marks for writes as they complete (docs/journal.md section 2, the "ail" policy).
//!
//! The AIL's write back is stable once any flush that started after it completed has: the
//! commit iclog's PREFLUSH on an internal log, a data flush before an external log's commit
//! record, or the AIL's own. So the AIL can let the tail pass what it wrote back without a
//! flush of its own whenever the commit path flushed since.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct FlushClock {
    /// Tickets handed out: flushes started (or about to).
    started: AtomicU64,
    /// The highest ticket of a flush known to have completed.
    done: AtomicU64,
}

impl FlushClock {
    /// A ticket for a flush of the data device about to be issued. Taken before the flush
    /// starts (early is safe: it only makes later marks wait for a later flush).
    pub fn ticket(&self) -> u64 {
        self.started.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The flush holding `ticket` completed (elided counts: nothing was volatile).
    pub fn completed(&self, ticket: u64) {
        self.done.fetch_max(ticket, Ordering::SeqCst);
    }

    /// A mark for writes that have completed: any flush whose ticket is at least this one
    /// started after them.
    pub fn mark(&self) -> u64 {
        self.started.load(Ordering::SeqCst) + 1
    }

    /// Whether a flush that covers the writes behind `mark` has completed.
    pub fn is_stable(&self, mark: u64) -> bool {
        self.completed_upto() >= mark
    }

    /// The highest ticket of a completed flush: it covers every mark up to it.
    pub fn completed_upto(&self) -> u64 {
        self.done.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_flush_started_after_the_mark_makes_it_stable() {
        let c = FlushClock::default();
        let early = c.ticket();
        let m = c.mark();
        // A flush that started before the writes completed does not cover them.
        c.completed(early);
        assert!(!c.is_stable(m));
        let late = c.ticket();
        let later = c.ticket();
        // Either later flush does, whichever completes first.
        c.completed(later);
        assert!(c.is_stable(m));
        c.completed(late);
        assert!(c.is_stable(m));
        assert!(!c.is_stable(c.mark()));
    }
}
