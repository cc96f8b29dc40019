//! Allocation: free space (two trees, by block and by size, and the extents freed but busy
//! until their checkpoint is stable) and inode numbers.

pub mod alloc;
pub(crate) mod ino_alloc;
