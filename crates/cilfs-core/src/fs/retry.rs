//! Waits outside the filesystem lock (issue 17): an operation whose first transaction finds no
//! log space, or whose space check needs the log forced, gives up with `FsError::Retry` before
//! it has committed anything; `Fs::retrying` drops back out of the lock, waits or forces, and
//! runs the operation again from the start, so its checks see the state it then commits.
//!
//! Only operations run through `retrying` give up this way, and only before their first commit
//! in this thread (`may_retry`): a later transaction of the same operation (truncate's batches,
//! the reclaim after an unlink) still waits where it is, as before, since the part already
//! committed could not be run again.

use super::error::{FsError, FsResult};
use super::Fs;
use crate::trans::Reservation;
use std::cell::Cell;

/// What an operation gave up for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Its transaction's log space was not free: wait for it, then run again.
    LogSpace(u64),
    /// Space is short but busy extents would free some: force the log, then run again.
    ForceLog,
}

#[derive(Debug, Clone, Copy, Default)]
struct OpState {
    /// Inside `Fs::retrying`.
    retrying: bool,
    /// The operation has committed a transaction in this attempt.
    committed: bool,
}

thread_local! {
    static OP: Cell<OpState> = const { Cell::new(OpState { retrying: false, committed: false }) };
}

/// Whether the running operation may still give up and be run again.
pub(crate) fn may_retry() -> bool {
    OP.with(|o| {
        let s = o.get();
        s.retrying && !s.committed
    })
}

/// A transaction of the running operation committed: from now on it waits where it is.
pub(crate) fn committed() {
    OP.with(|o| {
        let mut s = o.get();
        s.committed = true;
        o.set(s);
    });
}

impl Fs {
    /// Runs `op`, and again after waiting for log space or forcing the log outside any lock
    /// whenever it gives up before its first commit. A second force in a row means the space
    /// is not there: ENOSPC, as before.
    pub(crate) fn retrying<R>(&self, mut op: impl FnMut() -> FsResult<R>) -> FsResult<R> {
        let outer = OP.with(Cell::get);
        let mut forced = false;
        let r = loop {
            OP.with(|o| {
                o.set(OpState {
                    retrying: true,
                    committed: false,
                })
            });
            let r = op();
            match r {
                Err(FsError::Retry(Retry::LogSpace(unit))) => {
                    super::stats::bump(&self.stats.retries_log_space);
                    if let Err(e) = self
                        .journal
                        .wait_for_space(Reservation { unit_bytes: unit })
                    {
                        break Err(e.into());
                    }
                }
                Err(FsError::Retry(Retry::ForceLog)) if !forced => {
                    super::stats::bump(&self.stats.retries_force);
                    forced = true;
                    if let Err(e) = self.journal.force_all() {
                        break Err(e.into());
                    }
                }
                Err(FsError::Retry(Retry::ForceLog)) => break Err(FsError::NoSpace),
                r => break r,
            }
        };
        // A nested operation's commits count for the one around it.
        let inner = OP.with(Cell::get);
        OP.with(|o| {
            o.set(OpState {
                retrying: outer.retrying,
                committed: outer.committed || inner.committed,
            })
        });
        r
    }
}
