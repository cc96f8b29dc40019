//! Extent size hints (FS_IOC_FSSETXATTR's fsx_extsize, `xfs_io extsize`): which hint an inode
//! may be given, as XFS checks it (`xfs_ioctl_setattr_check_extsize` and its inode verifier),
//! and which one a new inode takes from its directory. Every refusal is EINVAL there, an
//! `FsError::Invalid` here.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::inode::{Inode, EXTSIZE_MAX_BLOCKS, S_IFDIR, S_IFMT, S_IFREG};
use crate::fs::types::{ATTR_EXTSIZE, ATTR_EXTSZINHERIT, ATTR_HINT_FLAGS};

/// The hint flag `i` reports for a hint of its own: FS_XFLAG_EXTSIZE for a regular file,
/// FS_XFLAG_EXTSZINHERIT for a directory, none without a hint.
pub(crate) fn flags_of(i: &Inode) -> u32 {
    match (i.extsize, i.mode & S_IFMT) {
        (0, _) => 0,
        (_, S_IFREG) => ATTR_EXTSIZE,
        (_, S_IFDIR) => ATTR_EXTSZINHERIT,
        _ => 0,
    }
}

/// The hint, in blocks of `bs` bytes, that `i` takes for a request of `bytes` with the hint
/// flags in `flags`, on a filesystem whose allocator manages `fs_blocks` blocks:
///
/// - FS_XFLAG_EXTSIZE is for regular files, FS_XFLAG_EXTSZINHERIT for directories;
/// - a regular file with data blocks keeps the hint it has (XFS: once it has extents or
///   delayed allocations; the caller counts pages waiting for blocks in `i.blocks`);
/// - 0 is no hint, whatever the flags (the VFS clears them);
/// - otherwise the hint is a multiple of the block size, comes with its flag, and is at most
///   `EXTSIZE_MAX_BLOCKS` blocks and half the filesystem (XFS: half an allocation group,
///   and cilfs has one).
pub(crate) fn hint_for(
    i: &Inode,
    flags: u32,
    bytes: u32,
    bs: u32,
    fs_blocks: u64,
) -> FsResult<u32> {
    let kind = i.mode & S_IFMT;
    if flags & ATTR_EXTSIZE != 0 && kind != S_IFREG {
        return Err(FsError::Invalid(
            "FS_XFLAG_EXTSIZE on other than a regular file",
        ));
    }
    if flags & ATTR_EXTSZINHERIT != 0 && kind != S_IFDIR {
        return Err(FsError::Invalid(
            "FS_XFLAG_EXTSZINHERIT on other than a directory",
        ));
    }
    if kind == S_IFREG && i.blocks > 0 && u64::from(i.extsize) * u64::from(bs) != u64::from(bytes) {
        return Err(FsError::Invalid(
            "a new extent size hint for a file that has data blocks",
        ));
    }
    if bytes == 0 {
        return Ok(0);
    }
    if bytes % bs != 0 {
        return Err(FsError::Invalid(
            "an extent size hint that is no multiple of the block size",
        ));
    }
    if flags & ATTR_HINT_FLAGS == 0 {
        return Err(FsError::Invalid(
            "an extent size hint without FS_XFLAG_EXTSIZE or FS_XFLAG_EXTSZINHERIT",
        ));
    }
    let blocks = bytes / bs;
    if blocks > EXTSIZE_MAX_BLOCKS || u64::from(blocks) > fs_blocks / 2 {
        return Err(FsError::Invalid(
            "an extent size hint longer than the longest extent or half the filesystem",
        ));
    }
    Ok(blocks)
}

/// The hint a new inode of `mode` takes in directory `p`: the directory's inherited hint, for
/// a regular file (as its own) or a directory (to pass on); none for other types.
pub(crate) fn inherited(p: &Inode, mode: u32) -> u32 {
    match mode & S_IFMT {
        S_IFREG | S_IFDIR if p.is_dir() => p.extsize,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::items::inode::{Timespec, S_IFLNK};

    const BS: u32 = 4096;
    const FS: u64 = 1 << 20;

    fn inode(mode: u32, blocks: u64, extsize: u32) -> Inode {
        let mut i = Inode::empty(5, mode | 0o644, 0, 0, Timespec::default());
        i.blocks = blocks;
        i.extsize = extsize;
        i
    }

    fn einval(r: FsResult<u32>) {
        assert!(matches!(r, Err(FsError::Invalid(_))), "{r:?}");
    }

    #[test]
    fn a_hint_is_a_multiple_of_the_block_size_with_its_flag_and_bounded() {
        let f = inode(S_IFREG, 0, 0);
        assert_eq!(hint_for(&f, ATTR_EXTSIZE, 2 * BS, BS, FS).unwrap(), 2);
        einval(hint_for(&f, ATTR_EXTSIZE, BS + 512, BS, FS));
        einval(hint_for(&f, 0, 2 * BS, BS, FS));
        // 0 is no hint, with its flag or without.
        assert_eq!(hint_for(&f, ATTR_EXTSIZE, 0, BS, FS).unwrap(), 0);
        assert_eq!(hint_for(&f, 0, 0, BS, FS).unwrap(), 0);
        // At most XFS's longest extent (the most 32 bits of bytes reach at the smallest block
        // size), and half the filesystem.
        let max = EXTSIZE_MAX_BLOCKS * 2048;
        assert_eq!(
            hint_for(&f, ATTR_EXTSIZE, max, 2048, 1 << 30).unwrap(),
            EXTSIZE_MAX_BLOCKS
        );
        assert_eq!(hint_for(&f, ATTR_EXTSIZE, 8 * BS, BS, 16).unwrap(), 8);
        einval(hint_for(&f, ATTR_EXTSIZE, 9 * BS, BS, 16));
    }

    #[test]
    fn each_flag_is_for_its_type_and_a_file_with_data_keeps_its_hint() {
        let f = inode(S_IFREG, 0, 0);
        let d = inode(S_IFDIR, 1, 0);
        let l = inode(S_IFLNK, 0, 0);
        einval(hint_for(&f, ATTR_EXTSZINHERIT, 2 * BS, BS, FS));
        einval(hint_for(&d, ATTR_EXTSIZE, 2 * BS, BS, FS));
        einval(hint_for(&l, ATTR_EXTSIZE, 2 * BS, BS, FS));
        einval(hint_for(&l, ATTR_EXTSZINHERIT, 0, BS, FS));
        // A directory's blocks are no data: its hint changes at any time.
        assert_eq!(hint_for(&d, ATTR_EXTSZINHERIT, 4 * BS, BS, FS).unwrap(), 4);
        let full = inode(S_IFREG, 3, 2);
        einval(hint_for(&full, ATTR_EXTSIZE, 4 * BS, BS, FS));
        einval(hint_for(&full, 0, 0, BS, FS));
        // The hint it has, given again (FSSETXATTR for another flag), is taken.
        assert_eq!(hint_for(&full, ATTR_EXTSIZE, 2 * BS, BS, FS).unwrap(), 2);
        let plain = inode(S_IFREG, 3, 0);
        assert_eq!(hint_for(&plain, 0, 0, BS, FS).unwrap(), 0);
        einval(hint_for(&plain, ATTR_EXTSIZE, 2 * BS, BS, FS));
    }

    #[test]
    fn new_files_and_directories_take_the_directory_hint_and_others_none() {
        let d = inode(S_IFDIR, 1, 4);
        assert_eq!(flags_of(&d), ATTR_EXTSZINHERIT);
        assert_eq!(inherited(&d, S_IFREG | 0o600), 4);
        assert_eq!(inherited(&d, S_IFDIR | 0o700), 4);
        assert_eq!(inherited(&d, S_IFLNK | 0o777), 0);
        assert_eq!(flags_of(&inode(S_IFREG, 0, 4)), ATTR_EXTSIZE);
        assert_eq!(flags_of(&inode(S_IFREG, 0, 0)), 0);
    }
}
