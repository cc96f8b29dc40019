//! The ioctls cilfs answers through FUSE_IOCTL, in Linux's encodings: the inode flags
//! (FS_IOC_GETFLAGS/SETFLAGS, which chattr and lsattr use, and FS_IOC_FSGETXATTR/FSSETXATTR,
//! which xfs_io uses, with the project ID and the extent size hint; the kernel's
//! `fuse_fileattr_get/set` turns both into these) and the shutdown (XFS_IOC_GOINGDOWN), the
//! filesystem label (FS_IOC_GETFSLABEL/SETFSLABEL) and FITRIM (`fstrim`). Each returns the
//! bytes the caller reads back; errors become errno values in `errno.rs`.

use crate::errno::errno;
use cilfs_core::fs::items::inode::{
    INODE_APPEND, INODE_IMMUTABLE, INODE_NOATIME, INODE_NODUMP, INODE_SYNC,
};
use cilfs_core::fs::types::{
    Capability, Cred, FileAttr, ShutdownMode, ATTR_EXTSIZE, ATTR_EXTSZINHERIT, ATTR_HINT_FLAGS,
};
use cilfs_core::fs::Fs;
use cilfs_fuse_proto::{Errno, IoctlIn};

/// `_IOR('f', 1, long)` and `_IOW('f', 2, long)`; the kernel sends these with four bytes.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// The 32-bit encodings (`_IOR('f', 1, int)`), as a compat caller sends them.
pub const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
pub const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
/// `_IOR('X', 31, struct fsxattr)` and `_IOW('X', 32, struct fsxattr)`.
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// `_IOR('X', 125, __u32)`, ext4's EXT4_IOC_SHUTDOWN too.
pub const XFS_IOC_GOINGDOWN: u32 = 0x8004_587d;
/// Its argument: what to make stable first.
const GOING_FLAGS_DEFAULT: u32 = 0;
const GOING_FLAGS_LOGFLUSH: u32 = 1;
const GOING_FLAGS_NOLOGFLUSH: u32 = 2;

/// `_IOR(0x94, 49, char[FSLABEL_MAX])` and `_IOW(0x94, 50, char[FSLABEL_MAX])`.
pub const FS_IOC_GETFSLABEL: u32 = 0x8100_9431;
pub const FS_IOC_SETFSLABEL: u32 = 0x4100_9432;
const FSLABEL_MAX: usize = 256;

/// `_IOWR('X', 121, struct fstrim_range)`: three u64s, start, len and minlen (bytes).
pub const FITRIM: u32 = 0xc018_5879;
const FSTRIM_RANGE_BYTES: usize = 24;

/// `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize, 8 bytes of padding.
const FSXATTR_BYTES: usize = 28;

/// The inode flags and their FS_*_FL and FS_XFLAG_* values.
const FLAG_MAP: [(u32, u32, u32); 5] = [
    (INODE_SYNC, 0x8, 0x20),
    (INODE_IMMUTABLE, 0x10, 0x8),
    (INODE_APPEND, 0x20, 0x10),
    (INODE_NODUMP, 0x40, 0x80),
    (INODE_NOATIME, 0x80, 0x40),
];

/// The extent size hint flags and their FS_XFLAG_* values (FS_XFLAG_EXTSIZE,
/// FS_XFLAG_EXTSZINHERIT), which have no FS_*_FL: FSGETXATTR/FSSETXATTR only.
const HINT_XFLAG_MAP: [(u32, u32); 2] = [(ATTR_EXTSIZE, 0x800), (ATTR_EXTSZINHERIT, 0x1000)];

/// The (`FileAttr` flag, Linux flag) pairs: FS_XFLAG_* (`xflags`) or FS_*_FL.
fn flag_map(xflags: bool) -> impl Iterator<Item = (u32, u32)> {
    let hints = if xflags { &HINT_XFLAG_MAP[..] } else { &[] };
    FLAG_MAP
        .iter()
        .map(move |&(inode, fl, xfl)| (inode, if xflags { xfl } else { fl }))
        .chain(hints.iter().copied())
}

/// Linux flags (`xflags` picks FS_XFLAG_* over FS_*_FL) to `FileAttr` flags; None if one is
/// not kept.
fn from_linux(v: u32, xflags: bool) -> Option<u32> {
    let mut rest = v;
    let mut out = 0;
    for (inode, bit) in flag_map(xflags) {
        if v & bit != 0 {
            out |= inode;
            rest &= !bit;
        }
    }
    (rest == 0).then_some(out)
}

fn to_linux(flags: u32, xflags: bool) -> u32 {
    flag_map(xflags)
        .filter(|(inode, _)| flags & inode != 0)
        .fold(0, |a, (_, bit)| a | bit)
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    let b = data.get(at..at + 4)?;
    Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// The flags word a SETFLAGS carries (an int, or a long whose low half is the int).
fn flags_in(data: &[u8]) -> Result<u32, Errno> {
    match data.len() {
        4 | 8 => u32_at(data, 0).ok_or(Errno::EINVAL),
        _ => Err(Errno::EINVAL),
    }
}

/// Whether `cmd` is one of the inode-flag ioctls answered here.
pub fn is_fileattr(cmd: u32) -> bool {
    matches!(
        cmd,
        FS_IOC_GETFLAGS
            | FS_IOC_SETFLAGS
            | FS_IOC32_GETFLAGS
            | FS_IOC32_SETFLAGS
            | FS_IOC_FSGETXATTR
            | FS_IOC_FSSETXATTR
    )
}

/// Answers an inode-flag ioctl on `ino` for `cred`: the bytes read back (`out_size` of them).
pub fn fileattr(
    fs: &Fs,
    cred: Cred,
    ino: u64,
    arg: &IoctlIn,
    data: &[u8],
) -> Result<Vec<u8>, Errno> {
    let cur = fs.file_attr(ino).map_err(|e| errno(&e))?;
    let set = |want: FileAttr| fs.set_file_attr(cred, ino, want).map_err(|e| errno(&e));
    let mut out = match arg.cmd {
        FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => to_linux(cur.flags, false).to_ne_bytes().to_vec(),
        FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => {
            let flags = from_linux(flags_in(data)?, false).ok_or(Errno::EOPNOTSUPP)?;
            // The hint flags have no FS_*_FL: they stay as they are (as the VFS keeps them).
            let flags = flags | (cur.flags & ATTR_HINT_FLAGS);
            set(FileAttr { flags, ..cur })?;
            Vec::new()
        }
        FS_IOC_FSGETXATTR => {
            let mut b = vec![0u8; FSXATTR_BYTES];
            b[0..4].copy_from_slice(&to_linux(cur.flags, true).to_ne_bytes());
            b[4..8].copy_from_slice(&cur.extsize.to_ne_bytes());
            b[12..16].copy_from_slice(&cur.project.to_ne_bytes());
            b
        }
        FS_IOC_FSSETXATTR => {
            let field = |at| u32_at(data, at).ok_or(Errno::EINVAL);
            let flags = from_linux(field(0)?, true).ok_or(Errno::EOPNOTSUPP)?;
            // Copy-on-write extent size hints are not kept (cilfs has no reflink): only 0,
            // what FSGETXATTR reports, is accepted.
            if field(16)? != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            set(FileAttr {
                flags,
                project: field(12)?,
                extsize: field(4)?,
            })?;
            Vec::new()
        }
        _ => return Err(Errno::ENOTTY),
    };
    out.resize(arg.out_size as usize, 0);
    Ok(out)
}

/// XFS_IOC_GOINGDOWN, by root only (CAP_SYS_ADMIN). The argument is an input the encoding calls output
/// (`_IOR`), so a FUSE kernel, which passes a restricted ioctl's bytes by its encoding, sends
/// none (`in_size` 0): then the log is flushed and not the data (`xfs_io shutdown -f`, the
/// middle course). Given four bytes, their mode is taken.
pub fn shutdown(fs: &Fs, cred: Cred, data: &[u8]) -> Result<Vec<u8>, Errno> {
    if !fs.capable(cred, Capability::SysAdmin) {
        return Err(Errno::EPERM);
    }
    let mode = match u32_at(data, 0) {
        None => ShutdownMode::LogFlush,
        Some(GOING_FLAGS_DEFAULT) => ShutdownMode::Default,
        Some(GOING_FLAGS_LOGFLUSH) => ShutdownMode::LogFlush,
        Some(GOING_FLAGS_NOLOGFLUSH) => ShutdownMode::NoLogFlush,
        Some(_) => return Err(Errno::EINVAL),
    };
    // Said once in the log, whatever the flush did: the filesystem is down either way.
    if let Err(e) = fs.shutdown(mode) {
        tracing::error!("shutdown ({mode:?}): the flush before it failed: {e}");
    }
    tracing::warn!("shut down ({mode:?}): every request fails with EIO until the unmount");
    Ok(Vec::new())
}

/// FS_IOC_GETFSLABEL (the label, NUL-padded to FSLABEL_MAX) and FS_IOC_SETFSLABEL (a
/// NUL-terminated label, root only).
pub fn label(fs: &Fs, cred: Cred, cmd: u32, data: &[u8]) -> Result<Vec<u8>, Errno> {
    if cmd == FS_IOC_GETFSLABEL {
        let mut out = fs.label();
        out.resize(FSLABEL_MAX, 0);
        return Ok(out);
    }
    // No NUL in FSLABEL_MAX bytes: EINVAL, as XFS and ext4 answer.
    let end = data.iter().position(|&b| b == 0).ok_or(Errno::EINVAL)?;
    fs.set_label(cred, &data[..end]).map_err(|e| errno(&e))?;
    Ok(Vec::new())
}

/// FITRIM, by root only (CAP_SYS_ADMIN on Linux): the range back with `len` set to the
/// bytes discarded, as XFS and ext4 answer.
pub fn trim(fs: &Fs, cred: Cred, data: &[u8]) -> Result<Vec<u8>, Errno> {
    if !fs.capable(cred, Capability::SysAdmin) {
        return Err(Errno::EPERM);
    }
    if data.len() != FSTRIM_RANGE_BYTES {
        return Err(Errno::EINVAL);
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[at..at + 8]);
        u64::from_ne_bytes(b)
    };
    let (start, len, minlen) = (u64_at(0), u64_at(8), u64_at(16));
    let trimmed = fs.trim(start, len, minlen).map_err(|e| errno(&e))?;
    let mut out = data.to_vec();
    out[8..16].copy_from_slice(&trimmed.to_ne_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_map_both_ways_and_unknown_ones_are_refused() {
        let all = INODE_SYNC | INODE_IMMUTABLE | INODE_APPEND | INODE_NODUMP | INODE_NOATIME;
        for x in [false, true] {
            assert_eq!(from_linux(to_linux(all, x), x), Some(all));
            assert_eq!(from_linux(0, x), Some(0));
        }
        assert_eq!(to_linux(INODE_IMMUTABLE, false), 0x10);
        assert_eq!(to_linux(INODE_APPEND, true), 0x10);
        // FS_EXTENT_FL, FS_XFLAG_PROJINHERIT: not kept.
        assert_eq!(from_linux(0x80000 | 0x10, false), None);
        assert_eq!(from_linux(0x200, true), None);
        // The hint flags are FS_XFLAG_* only: no FS_*_FL reports or sets them.
        let hints = ATTR_EXTSIZE | ATTR_EXTSZINHERIT;
        assert_eq!(to_linux(hints, true), 0x1800);
        assert_eq!(
            from_linux(0x800 | 0x10, true),
            Some(ATTR_EXTSIZE | INODE_APPEND)
        );
        assert_eq!(to_linux(hints, false), 0);
        assert_eq!(from_linux(0x800, false), None);
    }
}
