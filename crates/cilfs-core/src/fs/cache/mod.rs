//! What the filesystem keeps in memory besides the journal's buffers: inodes, file data pages,
//! and the per-inode IO locks held across data IO.

pub(crate) mod inode_cache;
pub(crate) mod iolock;
pub mod pagecache;
