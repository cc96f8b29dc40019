//! Delayed allocation: a buffered write into a hole puts its pages in the cache marked
//! `delalloc` and only promises their blocks (a count, `BusyExtents::reserve_delalloc`), so
//! running out of space is still the write's ENOSPC. Write back chooses the blocks, contiguous
//! for the pages it takes together, writes the data there and maps it written in one
//! transaction (`posix/sync.rs`): the write request runs no transaction to map anything, and
//! the blocks of many small writes are chosen at once.
//!
//! Until then the file has a hole there on disk, so a crash shows zeros or the old size, never
//! a block's old contents; the size the log holds stays below the first such page in ordered
//! mode (`Inode::note_dirty`), as for any dirty page. Operations that change the block map
//! under pages (fallocate, zero range, collapse and insert range, direct IO) write the file
//! back first (`flush_delalloc`); truncate and punch drop the pages they cut off and give
//! their promise back (`drop_pages`).

use crate::fs::error::{FsError, FsResult};
use crate::fs::types::{Reserve, RESERVE_BLOCKS};
use crate::fs::{Fs, FsState};

/// Tree blocks a mapping may take (leaf splits), asked for besides a write's blocks.
const MAP_BLOCKS: u64 = 8;

impl Fs {
    /// Promises `n` more blocks to pages about to be written into holes, if the free blocks
    /// (`free_blocks` in the trees, less everything busy, reserved or promised) leave the
    /// reserve: checked and taken under one hold of the busy extents' lock, so two writers
    /// never promise the same blocks.
    pub(crate) fn reserve_delalloc(&self, free_blocks: u64, n: u64) -> FsResult<()> {
        if n == 0 {
            return Ok(());
        }
        // As a write that maps its blocks at once asks: room for the tree blocks its mapping
        // may take besides. Blocks freed by checkpoints not yet stable made usable first.
        let need = n + MAP_BLOCKS;
        self.space_check_free(free_blocks, need, Reserve::Keep)?;
        let mut b = self.lock_busy();
        let taken = b.blocks() + b.reserved_blocks();
        if free_blocks.saturating_sub(taken) < need + RESERVE_BLOCKS {
            return Err(FsError::NoSpace);
        }
        b.reserve_delalloc(n);
        Ok(())
    }

    /// Gives back the promise of `n` blocks (pages dropped or mapped, a write that failed).
    pub(crate) fn release_delalloc(&self, n: u64) {
        if n > 0 {
            self.lock_busy().release_delalloc(n);
        }
    }

    /// Takes the delayed allocation mark off `ino`'s pages `fbs`, whose blocks are mapped
    /// now, and gives their promise back.
    pub(crate) fn unmark_mapped(&self, ino: u64, fbs: &[u64]) {
        let n = self.read_state().cache.mapped(ino, fbs);
        self.release_delalloc(n);
    }

    /// Drops `ino`'s pages of file blocks `[from, to)`, giving back what was promised to
    /// those written into holes.
    pub(crate) fn drop_pages(&self, st: &FsState, ino: u64, from: u64, to: u64) {
        let n = st.cache.drop_range(ino, from, to);
        self.release_delalloc(n);
    }

    /// Writes `ino` back if it has pages waiting for blocks, so that the block map under its
    /// pages is the file's whole map. The caller holds `ino`'s IO lock exclusively.
    pub(crate) fn flush_delalloc(&self, ino: u64) -> FsResult<()> {
        if self.read_state().cache.delalloc_of(ino) == 0 {
            return Ok(());
        }
        self.writeback_locked(ino)
    }
}
