//! The items of the fs tree and the header block, as bytes: encode and decode only
//! (docs/on-disk-format.md "The filesystem"). What reads or changes them lives with the
//! operations.

pub mod dir;
pub mod extent;
pub mod header;
pub mod inode;
pub mod xattr;

/// The first 8 bytes of `b`, for `u64::from_le_bytes`.
pub(crate) fn arr8(b: &[u8]) -> [u8; 8] {
    let mut a = [0; 8];
    a.copy_from_slice(&b[..8]);
    a
}

/// The first 4 bytes of `b`, for `u32::from_le_bytes`.
pub(crate) fn arr4(b: &[u8]) -> [u8; 4] {
    let mut a = [0; 4];
    a.copy_from_slice(&b[..4]);
    a
}
