//! The operations a request reaches, one file per family: names (namei), attributes (attr),
//! rename, reading (read), writing (write), a file's space (space: truncate, fallocate, punched
//! holes and zeroed ranges; shift: collapsed and inserted ranges), xattrs, open and release
//! (with the orphans they leave), unnamed files (tmpfile), and sync. Here: what they share
//! (counting an operation, space checks before a transaction, ctime and its change bump).

mod attr;
mod fileattr;
pub(crate) mod namei;
pub(crate) mod open;
mod read;
mod rename;
mod shift;
mod space;
mod sync;
mod tmpfile;
pub(crate) mod write;
pub(crate) mod xattr;

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::Header;
use crate::fs::items::inode::Timespec;
use crate::fs::stats::bump;
use crate::fs::types::{Reserve, RESERVE_BLOCKS};
use crate::fs::{Fs, InodeMem};

impl Fs {
    pub(crate) fn op(&self) {
        bump(&self.stats.operations);
    }

    /// Tells `FsOptions::attrs_changed` that `ino`'s attributes changed behind the reply of
    /// the operation; called without the filesystem lock.
    pub(crate) fn attrs_changed(&self, ino: u64) {
        if let Some(f) = &self.opts.attrs_changed {
            f(ino);
        }
    }

    /// A change that logs the inode anyway: bump the counter (forced) and set ctime.
    pub(crate) fn touch_ctime(&self, m: &mut InodeMem, now: Timespec) {
        m.inode.ctime = now;
        m.change.maybe_increment(true);
        bump(&self.stats.change_bumps);
    }

    /// Whether `blocks` blocks that are neither busy nor in the part of the reserve `reserve`
    /// keeps back are free; if not and some are busy, forces the log to make those usable and
    /// looks again. Called before a transaction starts, so that running out of space is a clean
    /// ENOSPC: an allocation that fails after the transaction logged changes shuts the journal
    /// down.
    pub(crate) fn space_check(&self, hdr: &Header, blocks: u64, reserve: Reserve) -> FsResult<()> {
        self.space_check_free(hdr.free_blocks, blocks, reserve)
    }

    /// `space_check` against `free_blocks` free in the trees.
    pub(crate) fn space_check_free(
        &self,
        free_blocks: u64,
        blocks: u64,
        reserve: Reserve,
    ) -> FsResult<()> {
        let keep = match reserve {
            Reserve::Keep => RESERVE_BLOCKS,
            Reserve::Quarter => RESERVE_BLOCKS / 4,
            Reserve::Use => 0,
        };
        // Enough even counting every busy extent not yet pruned: no lock needed.
        if free_blocks.saturating_sub(self.busy.taken_blocks()) >= blocks + keep {
            return Ok(());
        }
        // Blocks reserved by writes in flight are as good as taken; busy ones come back with a
        // force.
        let (busy, reserved) = {
            let mut b = self.lock_busy();
            b.prune(self.journal.completed_seq());
            (b.blocks(), b.reserved_blocks())
        };
        let avail = free_blocks.saturating_sub(busy + reserved);
        if avail >= blocks + keep {
            return Ok(());
        }
        if busy > 0 {
            // Space freed by checkpoints not yet stable: make it usable and look again, with
            // the force outside the filesystem lock when the operation can still start over.
            if crate::fs::txn::retry::may_retry() {
                return Err(FsError::Retry(crate::fs::txn::retry::Retry::ForceLog));
            }
            self.journal.force_all()?;
            let busy = {
                let mut b = self.lock_busy();
                b.prune(self.journal.completed_seq());
                b.blocks() + b.reserved_blocks()
            };
            if free_blocks.saturating_sub(busy) >= blocks + keep {
                return Ok(());
            }
        }
        Err(FsError::NoSpace)
    }
}
