//! Making the filesystem inside a freshly made journal: the header, the three empty trees, the
//! free space and the root directory, in one transaction.

use super::error::{FsError, FsResult};
use super::items::header::{
    freelist_capacity, Header, MIN_FS_BLOCK_SIZE, TREE_FREE_BY_BLOCK, TREE_FREE_BY_SIZE, TREE_FS,
};
use super::items::inode::{Inode, Timespec, ROOT_INO};
use super::tree::btree::Root;
use super::tree::keys::{key, KIND_INODE};
use super::txn::busy::Busy;
use super::txn::FsTx;
use crate::journal::Journal;

/// Blocks the smallest filesystem needs beyond the header, trees and free list.
const MIN_FREE_BLOCKS: u64 = 64;

/// Writes an empty filesystem with a root directory owned by `uid`:`gid`, then forces it.
pub fn format(journal: &Journal, uid: u32, gid: u32) -> FsResult<()> {
    let bs = journal.block_size();
    if bs < MIN_FS_BLOCK_SIZE {
        return Err(FsError::NotSupported(
            "block sizes below 2048 bytes (a 255-byte name must fit a quarter of a tree leaf)",
        ));
    }
    let (first, end) = journal.metadata_area();
    super::register_block_checks(journal);
    let data_start = first + 1;
    let fl = (freelist_capacity(bs as usize) / 2) as u64;
    let used = 3 + fl;
    if end < data_start + used + MIN_FREE_BLOCKS {
        return Err(FsError::NoSpace);
    }
    let root = |b: u64| Root { blkno: b, level: 0 };
    let hdr = Header {
        fs_root: root(data_start),
        bno_root: root(data_start + 1),
        size_root: root(data_start + 2),
        next_ino: ROOT_INO + 1,
        free_blocks: 0,
        inode_count: 1,
        data_start,
        data_end: end,
        freelist: (data_start + 3..data_start + 3 + fl).collect(),
    };
    let busy = Busy::default();
    let mut t = FsTx::begin(journal, &hdr, first, &busy)?;
    t.force_header_write();
    let r = (|| -> FsResult<()> {
        t.new_root(TREE_FS, data_start)?;
        t.new_root(TREE_FREE_BY_BLOCK, data_start + 1)?;
        t.new_root(TREE_FREE_BY_SIZE, data_start + 2)?;
        let free_start = data_start + used;
        t.free_extent(free_start, end - free_start)?;
        // mkfs frees space nobody used: nothing is busy.
        t.freed.clear();
        let now = Timespec::now();
        let root = Inode::empty_dir(ROOT_INO, 0o755, uid, gid, ROOT_INO, now);
        t.insert(TREE_FS, key(ROOT_INO, KIND_INODE, 0), &root.encode())?;
        Ok(())
    })();
    if let Err(e) = r {
        return Err(t.abort(e));
    }
    let (seq, _) = t.commit()?;
    journal.force(seq)?;
    Ok(())
}
