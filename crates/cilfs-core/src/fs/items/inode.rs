//! Inodes: the item format (docs/on-disk-format.md "Inode item") and the POSIX attributes.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::{arr4, arr8};

pub const S_IFMT: u32 = 0o170_000;
pub const S_IFSOCK: u32 = 0o140_000;
pub const S_IFLNK: u32 = 0o120_000;
pub const S_IFREG: u32 = 0o100_000;
pub const S_IFBLK: u32 = 0o060_000;
pub const S_IFDIR: u32 = 0o040_000;
pub const S_IFCHR: u32 = 0o020_000;
pub const S_IFIFO: u32 = 0o010_000;
pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISVTX: u32 = 0o1000;

pub const ROOT_INO: u64 = 1;
/// An inode item without an extent size hint: every inode of images made before hints, and
/// every inode since that has none.
pub const INODE_ITEM_BYTES: usize = 112;
/// An inode item with an extent size hint (`Inode::extsize`): the short item and the hint.
pub const INODE_ITEM_HINT_BYTES: usize = INODE_ITEM_BYTES + 4;
/// The largest extent size hint in blocks: XFS's (XFS_MAX_BMBT_EXTLEN, the longest extent its
/// block map holds).
pub const EXTSIZE_MAX_BLOCKS: u32 = (1 << 21) - 1;
/// No inode number reaches this: a header whose next number is past it is corrupt (no
/// filesystem hands out 2^62 numbers), and no number handed out ever wraps round onto a live
/// inode such as the root.
pub const INO_LIMIT: u64 = 1 << 62;

/// Seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    pub fn now() -> Self {
        match cilfs_sync::time::wall_now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timespec {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(_) => Timespec::default(),
        }
    }

    /// Rounded down to a multiple of `gran_ns` (at most one second).
    pub fn truncated(self, gran_ns: u32) -> Self {
        let g = gran_ns.clamp(1, 1_000_000_000);
        Timespec {
            sec: self.sec,
            nsec: self.nsec - self.nsec % g,
        }
    }
}

/// File types, as readdir reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileType {
    pub fn from_mode(mode: u32) -> Option<Self> {
        Some(match mode & S_IFMT {
            S_IFREG => FileType::Regular,
            S_IFDIR => FileType::Directory,
            S_IFLNK => FileType::Symlink,
            S_IFIFO => FileType::Fifo,
            S_IFSOCK => FileType::Socket,
            S_IFCHR => FileType::CharDevice,
            S_IFBLK => FileType::BlockDevice,
            _ => return None,
        })
    }

    pub fn code(self) -> u8 {
        match self {
            FileType::Regular => 1,
            FileType::Directory => 2,
            FileType::Symlink => 3,
            FileType::Fifo => 4,
            FileType::Socket => 5,
            FileType::CharDevice => 6,
            FileType::BlockDevice => 7,
        }
    }

    pub fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => FileType::Regular,
            2 => FileType::Directory,
            3 => FileType::Symlink,
            4 => FileType::Fifo,
            5 => FileType::Socket,
            6 => FileType::CharDevice,
            7 => FileType::BlockDevice,
            _ => return None,
        })
    }
}

/// `Inode::flags`: fallocate mapped blocks past the end of the file, which are the caller's
/// (XFS's XFS_DIFLAG_PREALLOC). Without it, blocks past the end can only be speculative
/// preallocation that a crash left behind, which the next last release frees.
pub const INODE_PREALLOC: u32 = 1;
/// `Inode::flags` users set (chattr, `fs/rules/iflags.rs`): no change at all.
pub const INODE_IMMUTABLE: u32 = 1 << 1;
/// Data written only at the end; the file never shrinks, loses a name or changes otherwise.
pub const INODE_APPEND: u32 = 1 << 2;
/// Writes to the file are durable before they return.
pub const INODE_SYNC: u32 = 1 << 3;
/// Reads never move atime.
pub const INODE_NOATIME: u32 = 1 << 4;
/// Kept for backup tools (dump skips the file); cilfs does nothing with it.
pub const INODE_NODUMP: u32 = 1 << 5;
/// The flags users see and set.
pub const INODE_USER_FLAGS: u32 =
    INODE_IMMUTABLE | INODE_APPEND | INODE_SYNC | INODE_NOATIME | INODE_NODUMP;
/// Every flag an inode item may carry; `cilfs check` reports others.
pub const INODE_KNOWN_FLAGS: u32 = INODE_PREALLOC | INODE_USER_FLAGS;

/// `Inode::dirty_from` when no page of the file is dirty.
pub const NOT_DIRTY: u64 = u64::MAX;

/// Change attributes stop below this: the counter in memory keeps the value in 63 bits beside
/// its queried flag and bumps it by one, so a stored value near 2^63 (damage: a bump a
/// nanosecond would take 146 years to reach 2^62) would wrap to zero, and a change attribute
/// must never go back.
pub const CHANGE_LIMIT: u64 = 1 << 62;

/// An inode as stored, with the change counter's value (without the queried flag), and two
/// sizes kept in memory beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// The size POSIX sees (XFS's i_size).
    pub size: u64,
    /// In memory only: the size the log holds, which is what `encode` writes (XFS's di_size).
    /// In ordered mode it never covers bytes that are only in the page cache
    /// (`Inode::ordered_size`), so a crash shows an appended file as a prefix of what was
    /// written, never a tail of zeros.
    pub disk_size: u64,
    /// In memory only: the lowest byte of a page written dirty since the file was last
    /// written back whole (`NOT_DIRTY` if none; lower than the truth is safe, only slower).
    /// Set in ordered mode only.
    pub dirty_from: u64,
    /// Blocks allocated to the file (data and, for symlinks/xattrs, nothing else).
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub rdev: u64,
    pub change: u64,
    /// `INODE_PREALLOC` and the flags users set (`INODE_USER_FLAGS`).
    pub flags: u32,
    /// For a directory, the directory holding it (what ".." names); 0 otherwise.
    pub parent: u64,
    /// The project (tenant) the inode's data IO is charged to, inherited from the directory it
    /// was created in (as XFS project IDs); 0 is no project, never limited.
    pub project: u32,
    /// The extent size hint in blocks (XFS's di_extsize), 0 for none: a regular file's own
    /// (FS_XFLAG_EXTSIZE), a directory's the one the files and directories made in it take
    /// (FS_XFLAG_EXTSZINHERIT). Only regular files and directories have one, at most
    /// `EXTSIZE_MAX_BLOCKS`.
    pub extsize: u32,
}

/// What getattr reports: the inode plus the block size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileType,
    pub perm: u16,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    /// 512-byte units, as stat reports them.
    pub blocks_512: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub rdev: u64,
    pub blksize: u32,
    /// What tells this inode from another that had its number (NFS file handles carry it):
    /// its creation time. Numbers are never reused while the filesystem runs, but a crash may
    /// take back creations that a handle was made for, and the number is then given again.
    pub generation: u64,
}

impl Inode {
    /// An empty directory `ino` in `parent`, made at `now` (mkfs's root, and the directories
    /// repair makes: the root when it is lost, lost+found).
    pub fn empty_dir(ino: u64, perm: u32, uid: u32, gid: u32, parent: u64, now: Timespec) -> Inode {
        Inode {
            parent,
            ..Inode::empty(ino, S_IFDIR | (perm & 0o7777), uid, gid, now)
        }
    }

    /// An inode of `mode` (type and permission bits) with nothing in it, made at `now`: one
    /// link, two for a directory (whose `parent` the caller sets).
    pub fn empty(ino: u64, mode: u32, uid: u32, gid: u32, now: Timespec) -> Inode {
        Inode {
            ino,
            mode,
            uid,
            gid,
            nlink: if mode & S_IFMT == S_IFDIR { 2 } else { 1 },
            size: 0,
            disk_size: 0,
            dirty_from: NOT_DIRTY,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            rdev: 0,
            change: 0,
            flags: 0,
            parent: 0,
            project: 0,
            extsize: 0,
        }
    }

    pub fn kind(&self) -> Option<FileType> {
        FileType::from_mode(self.mode)
    }

    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    /// Whether a file read from disk may hold blocks past its end that no fallocate asked
    /// for: speculative preallocation, mapped by a mount that never got to its last release
    /// (a crash, a killed daemon). The mount that loads it cannot tell from memory.
    pub fn may_hold_stale_prealloc(&self) -> bool {
        self.mode & S_IFMT == S_IFREG && self.flags & INODE_PREALLOC == 0 && self.blocks > 0
    }

    /// The generation handles carry: the creation time in nanoseconds (never 0, which the
    /// kernel treats as no generation).
    pub fn generation(&self) -> u64 {
        let ns = (self.crtime.sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(u64::from(self.crtime.nsec));
        ns.max(1)
    }

    pub fn attr(&self, block_size: u32) -> Attr {
        Attr {
            ino: self.ino,
            kind: self.kind().unwrap_or(FileType::Regular),
            perm: (self.mode & 0o7777) as u16,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            size: self.size,
            // Saturating: `blocks` is read from disk, and stat has no way to say more.
            blocks_512: self.blocks.saturating_mul(u64::from(block_size / 512)),
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.crtime,
            rdev: self.rdev,
            blksize: block_size,
            generation: self.generation(),
        }
    }

    /// The size the next log of this inode may record: the POSIX size, unless pages below it
    /// and past what the log holds are dirty, in which case the log's size grows only to the
    /// first of them (a truncate below the logged size is logged as it is).
    pub fn ordered_size(&self) -> u64 {
        if self.size <= self.disk_size {
            return self.size;
        }
        self.size.min(self.disk_size.max(self.dirty_from))
    }

    /// Notes pages from byte `from` on written dirty (ordered mode).
    pub fn note_dirty(&mut self, from: u64) {
        self.dirty_from = self.dirty_from.min(from);
    }

    /// Whether the inode may carry an extent size hint: a regular file or a directory.
    pub fn may_have_extsize(&self) -> bool {
        matches!(self.mode & S_IFMT, S_IFREG | S_IFDIR)
    }

    /// The item, with the size the log holds (`disk_size`): `INODE_ITEM_BYTES` long, or
    /// `INODE_ITEM_HINT_BYTES` with an extent size hint (so that images where no hint was
    /// ever set keep the item older binaries read).
    pub fn encode(&self) -> InodeBytes {
        let mut b = [0u8; INODE_ITEM_HINT_BYTES];
        b[0..4].copy_from_slice(&self.mode.to_le_bytes());
        b[4..8].copy_from_slice(&self.uid.to_le_bytes());
        b[8..12].copy_from_slice(&self.gid.to_le_bytes());
        b[12..16].copy_from_slice(&self.nlink.to_le_bytes());
        b[16..24].copy_from_slice(&self.disk_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.blocks.to_le_bytes());
        for (i, t) in [self.atime, self.mtime, self.ctime, self.crtime]
            .iter()
            .enumerate()
        {
            let p = 32 + 12 * i;
            b[p..p + 8].copy_from_slice(&t.sec.to_le_bytes());
            b[p + 8..p + 12].copy_from_slice(&t.nsec.to_le_bytes());
        }
        b[80..88].copy_from_slice(&self.rdev.to_le_bytes());
        b[88..96].copy_from_slice(&self.change.to_le_bytes());
        b[96..100].copy_from_slice(&self.flags.to_le_bytes());
        b[100..108].copy_from_slice(&self.parent.to_le_bytes());
        b[108..112].copy_from_slice(&self.project.to_le_bytes());
        let len = if self.extsize == 0 {
            INODE_ITEM_BYTES
        } else {
            b[112..116].copy_from_slice(&self.extsize.to_le_bytes());
            INODE_ITEM_HINT_BYTES
        };
        InodeBytes { b, len }
    }

    pub fn decode(ino: u64, b: &[u8], blkno: u64) -> FsResult<Inode> {
        if b.len() != INODE_ITEM_BYTES && b.len() != INODE_ITEM_HINT_BYTES {
            return Err(FsError::corrupt(
                blkno,
                format!("inode {ino} item of {} bytes", b.len()),
            ));
        }
        let ts = |p: usize| Timespec {
            sec: i64::from_le_bytes(arr8(&b[p..p + 8])),
            nsec: u32::from_le_bytes(arr4(&b[p + 8..p + 12])),
        };
        let size = u64::from_le_bytes(arr8(&b[16..24]));
        let i = Inode {
            ino,
            mode: u32::from_le_bytes(arr4(&b[0..4])),
            uid: u32::from_le_bytes(arr4(&b[4..8])),
            gid: u32::from_le_bytes(arr4(&b[8..12])),
            nlink: u32::from_le_bytes(arr4(&b[12..16])),
            size,
            disk_size: size,
            dirty_from: NOT_DIRTY,
            blocks: u64::from_le_bytes(arr8(&b[24..32])),
            atime: ts(32),
            mtime: ts(44),
            ctime: ts(56),
            crtime: ts(68),
            rdev: u64::from_le_bytes(arr8(&b[80..88])),
            change: u64::from_le_bytes(arr8(&b[88..96])),
            flags: u32::from_le_bytes(arr4(&b[96..100])),
            parent: u64::from_le_bytes(arr8(&b[100..108])),
            project: u32::from_le_bytes(arr4(&b[108..112])),
            extsize: match b.get(112..116) {
                Some(h) => u32::from_le_bytes(arr4(h)),
                None => 0,
            },
        };
        if i.kind().is_none() {
            return Err(FsError::corrupt(
                blkno,
                format!("inode {ino} has no valid file type (mode {:o})", i.mode),
            ));
        }
        // No file reaches 2^63 bytes (off_t is signed): such a size is damage, and would make
        // offsets computed from it overflow.
        if i.size > i64::MAX as u64 {
            return Err(FsError::corrupt(
                blkno,
                format!("inode {ino} has size {}, past the largest file", i.size),
            ));
        }
        // Every second an i64 holds is a time; nanoseconds are below one second.
        if let Some(t) = [i.atime, i.mtime, i.ctime, i.crtime]
            .iter()
            .find(|t| t.nsec >= 1_000_000_000)
        {
            return Err(FsError::corrupt(
                blkno,
                format!(
                    "inode {ino} has a time of {} nanoseconds past a second",
                    t.nsec
                ),
            ));
        }
        // The long item exists for the hint: one that says none is not what `encode` writes.
        if b.len() == INODE_ITEM_HINT_BYTES && i.extsize == 0 {
            return Err(FsError::corrupt(
                blkno,
                format!("inode {ino} item carries an extent size hint of 0"),
            ));
        }
        if i.extsize != 0 && !i.may_have_extsize() {
            return Err(FsError::corrupt(
                blkno,
                format!(
                    "inode {ino} has an extent size hint but is no regular file or directory \
                     (mode {:o})",
                    i.mode
                ),
            ));
        }
        if i.extsize > EXTSIZE_MAX_BLOCKS {
            return Err(FsError::corrupt(
                blkno,
                format!(
                    "inode {ino} has an extent size hint of {} blocks, past {EXTSIZE_MAX_BLOCKS}",
                    i.extsize
                ),
            ));
        }
        if i.change >= CHANGE_LIMIT {
            return Err(FsError::corrupt(
                blkno,
                format!(
                    "inode {ino} has change attribute {}, past its range",
                    i.change
                ),
            ));
        }
        Ok(i)
    }
}

/// An encoded inode item (`Inode::encode`): its bytes, as a slice.
#[derive(Debug, Clone, Copy)]
pub struct InodeBytes {
    b: [u8; INODE_ITEM_HINT_BYTES],
    len: usize,
}

impl std::ops::Deref for InodeBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.b[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Inode {
        Inode::empty(9, S_IFREG | 0o644, 1, 2, Timespec { sec: 5, nsec: 6 })
    }

    fn corrupt(b: &[u8]) {
        let r = Inode::decode(9, b, 4);
        assert!(matches!(r, Err(FsError::Corrupt { .. })), "{r:?}");
    }

    #[test]
    fn an_item_without_a_hint_is_the_short_one_older_images_hold() {
        let i = file();
        let b = i.encode();
        assert_eq!(b.len(), INODE_ITEM_BYTES);
        assert_eq!(Inode::decode(9, &b, 4).unwrap(), i);
    }

    #[test]
    fn a_hint_makes_the_item_long_and_comes_back() {
        for (mode, extsize) in [(S_IFREG | 0o600, 1), (S_IFDIR | 0o755, EXTSIZE_MAX_BLOCKS)] {
            let i = Inode {
                mode,
                extsize,
                ..file()
            };
            let b = i.encode();
            assert_eq!(b.len(), INODE_ITEM_HINT_BYTES);
            assert_eq!(Inode::decode(9, &b, 4).unwrap(), i);
        }
    }

    #[test]
    fn a_damaged_hint_is_corrupt() {
        let hinted = Inode {
            extsize: 16,
            ..file()
        };
        let good = hinted.encode().to_vec();
        // A long item saying no hint; one past the bound; a hint on a symlink or a device.
        let mut zero = good.clone();
        zero[112..116].copy_from_slice(&0u32.to_le_bytes());
        corrupt(&zero);
        let mut big = good.clone();
        big[112..116].copy_from_slice(&(EXTSIZE_MAX_BLOCKS + 1).to_le_bytes());
        corrupt(&big);
        for kind in [S_IFLNK, S_IFCHR, S_IFIFO] {
            let mut other = good.clone();
            other[0..4].copy_from_slice(&(kind | 0o644).to_le_bytes());
            corrupt(&other);
        }
        // Neither of the two lengths.
        corrupt(&good[..good.len() - 1]);
        let mut longer = good.clone();
        longer.push(0);
        corrupt(&longer);
    }
}
