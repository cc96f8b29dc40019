//! Waits outside the filesystem lock (docs/concurrency.md, invariant 1): an operation whose first transaction finds no
//! log space, whose space check needs the log forced, or which needs a metadata block that is
//! not in the buffer cache, gives up with `FsError::Retry` before it has changed anything;
//! `Fs::retrying` drops back out of the lock, waits, forces or reads the block, and runs the
//! operation again from the start, so its checks see the state it then commits.
//!
//! The force a `sync` or `dirsync` mount owes for an operation's transactions is made there
//! too, after the operation has let go of its locks and before it returns (`owe_force`).
//!
//! Only operations run through `retrying` give up this way, and only before their first commit
//! in this thread (`may_retry`): a later transaction of the same operation (truncate's batches,
//! the reclaim after an unlink) still waits where it is, as before, since the part already
//! committed could not be run again.

pub use crate::fs::error::Retry;
use crate::fs::error::{FsError, FsResult};
use crate::fs::Fs;
use crate::trans::Reservation;
use std::cell::Cell;

/// Read retries one run of an operation may make; past them blocks are read where they are
/// needed (a buffer cache too small for one operation's blocks would otherwise never finish).
const READ_RETRIES_MAX: u32 = 64;

#[derive(Debug, Clone, Copy, Default)]
struct OpState {
    /// Inside `Fs::retrying`.
    retrying: bool,
    /// The operation has committed a transaction in this attempt.
    committed: bool,
    /// Out of read retries: read in place.
    read_in_place: bool,
    /// The attempt has begun a transaction or changed something in memory: a read it still
    /// needs happens in place, since giving up could not undo that.
    changing: bool,
    /// The attempt has changed what others see outside any transaction (pages, cached
    /// inodes): it can no longer give up at all, for a second run would find that change
    /// made and might log nothing.
    changed_memory: bool,
    /// The checkpoint a sync mount must force before the operation returns.
    force_to: u64,
}

cilfs_sync::thread_local! {
    static OP: Cell<OpState> = const {
        Cell::new(OpState {
            retrying: false,
            committed: false,
            read_in_place: false,
            changing: false,
            changed_memory: false,
            force_to: 0,
        })
    };
}

/// The running attempt is about to change state (a transaction begins, pages are taken or put):
/// from now on it no longer gives up to read a block.
pub(crate) fn changing() {
    OP.with(|o| {
        let mut s = o.get();
        s.changing = true;
        o.set(s);
    });
}

/// The running attempt changes pages or cached inodes outside a transaction: from now on it
/// waits for log space or a force where it is, as a later transaction of an operation does.
pub(crate) fn changed_memory() {
    OP.with(|o| {
        let mut s = o.get();
        s.changing = true;
        s.changed_memory = true;
        o.set(s);
    });
}

/// Whether a missing metadata block should make the operation give up and read it outside the
/// lock: it runs through `Fs::retrying` and has neither committed nor begun to change anything
/// in this attempt.
pub(crate) fn may_read_later() -> bool {
    OP.with(|o| {
        let s = o.get();
        s.retrying && !s.committed && !s.read_in_place && !s.changing
    })
}

/// Records that checkpoint `seq` must be stable before the running operation returns. False
/// when no operation is running through `Fs::retrying`: the caller forces itself.
pub(crate) fn owe_force(seq: u64) -> bool {
    OP.with(|o| {
        let mut s = o.get();
        if !s.retrying {
            return false;
        }
        s.force_to = s.force_to.max(seq);
        o.set(s);
        true
    })
}

/// Whether the running operation may still give up and be run again.
pub(crate) fn may_retry() -> bool {
    OP.with(|o| {
        let s = o.get();
        s.retrying && !s.committed && !s.changed_memory
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
        let mut reads = 0;
        let r = loop {
            OP.with(|o| {
                o.set(OpState {
                    retrying: true,
                    committed: false,
                    read_in_place: reads >= READ_RETRIES_MAX,
                    changing: false,
                    changed_memory: false,
                    force_to: o.get().force_to,
                })
            });
            let r = op();
            debug_assert!(
                !matches!(r, Err(FsError::Retry(_))) || !OP.with(Cell::get).changed_memory,
                "an operation gave up after changing memory outside its transaction"
            );
            match r {
                Err(FsError::Retry(Retry::Read(blkno))) => {
                    crate::fs::stats::bump(&self.stats.retries_read);
                    reads += 1;
                    if let Err(e) = self.journal.buf(blkno) {
                        break Err(e.into());
                    }
                }
                Err(FsError::Retry(Retry::LogSpace(unit))) => {
                    crate::fs::stats::bump(&self.stats.retries_log_space);
                    if let Err(e) = self
                        .journal
                        .wait_for_space(Reservation { unit_bytes: unit })
                    {
                        break Err(e.into());
                    }
                }
                Err(FsError::Retry(Retry::Reshaped)) => {
                    crate::fs::stats::bump(&self.stats.retries_reshaped);
                }
                Err(FsError::Retry(Retry::Freeing)) => {
                    crate::fs::stats::bump(&self.stats.retries_freeing);
                    cilfs_sync::thread::yield_now();
                }
                Err(FsError::Retry(Retry::ForceLog)) if !forced => {
                    crate::fs::stats::bump(&self.stats.retries_force);
                    forced = true;
                    if let Err(e) = self.journal.force_all() {
                        break Err(e.into());
                    }
                }
                Err(FsError::Retry(Retry::ForceLog)) => break Err(FsError::NoSpace),
                r => break r,
            }
        };
        // A nested operation's commits and owed forces count for the one around it.
        let inner = OP.with(Cell::get);
        OP.with(|o| {
            o.set(OpState {
                retrying: outer.retrying,
                committed: outer.committed || inner.committed,
                read_in_place: outer.read_in_place,
                changing: outer.changing || inner.changing || inner.committed,
                changed_memory: outer.changed_memory || inner.changed_memory,
                force_to: if outer.retrying { inner.force_to } else { 0 },
            })
        });
        // The outermost run: the operation's locks are gone; make what a sync mount asks for
        // stable before returning (even after an error, for what did commit).
        if !outer.retrying && inner.force_to > self.journal.completed_seq() {
            crate::fs::stats::bump(&self.stats.deferred_sync_forces);
            self.journal.force(inner.force_to)?;
        }
        r
    }
}
