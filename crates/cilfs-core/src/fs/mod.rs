//! The filesystem layer: inodes, directories, extents and xattrs in B+trees of journaled
//! metadata blocks; file data written in place.

pub mod btree;
pub mod error;
pub mod node;

pub use error::{FsError, FsResult};
