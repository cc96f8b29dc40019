//! Allocation: free space (two trees, by block and by size, and the extents freed but busy
//! until their checkpoint is stable), inode numbers, and the block map of each file, which
//! takes blocks from the one and gives them back.

pub mod alloc;
pub(crate) mod delalloc;
pub(crate) mod ino_alloc;
pub(crate) mod map;
pub(crate) mod trim;
