//! The items of the fs tree and the header block, as bytes: encode and decode only
//! (docs/on-disk-format.md "The filesystem"). What reads or changes them lives with the
//! operations.

pub mod dir;
pub mod extent;
pub mod header;
pub mod inode;
pub mod xattr;
