//! Types the operations share: who calls (`Cred`), what a setattr or rename asks for, what
//! statfs answers, and the limits every operation keeps to.

use super::items::inode::Timespec;

/// Who the caller of an operation is, as far as its request says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The filesystem uid and gid the request names.
    Ids { uid: u32, gid: u32 },
    /// A request that names no ids: once cilfs takes FUSE_ALLOW_IDMAP (idmapped mounts),
    /// Linux sends ids only with the requests that create an inode, on every mount of the
    /// filesystem, having checked permission and ownership itself (default_permissions).
    /// Rules the kernel already applied are trusted; what it leaves to cilfs is decided by
    /// the caller's process (`FsOptions::capable`, `FsOptions::groups_of`) or by what the
    /// request says (`kill_setid`).
    KernelChecked {
        /// Whether the kernel asked for set-user-ID and set-group-ID to go, for the
        /// requests that carry that flag (a write's FUSE_WRITE_KILL_SUIDGID, a truncate's
        /// FATTR_KILL_SUIDGID): `Some(true)` means the caller lacks CAP_FSETID. `None` when
        /// the request says nothing of it.
        kill_setid: Option<bool>,
    },
}

/// The caller of an operation (from the FUSE request). `pid` lets the core ask the caller's
/// process for its groups and capabilities (`FsOptions::groups_of`, `FsOptions::capable`)
/// in the rare cases a rule needs them; `umask` is applied by creates in a directory without
/// a default ACL (the kernel leaves it to us: FUSE_DONT_MASK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cred {
    pub caller: Caller,
    pub pid: u32,
    pub umask: u32,
}

impl Cred {
    pub const ROOT: Cred = Cred::user(0, 0);

    /// A caller with no process to ask for supplementary groups and no umask (tests, tools).
    pub const fn user(uid: u32, gid: u32) -> Cred {
        Cred {
            caller: Caller::Ids { uid, gid },
            pid: 0,
            umask: 0,
        }
    }

    /// A caller the request does not name (`Caller::KernelChecked`), of process `pid`.
    pub const fn kernel_checked(pid: u32) -> Cred {
        Cred {
            caller: Caller::KernelChecked { kill_setid: None },
            pid,
            umask: 0,
        }
    }

    /// The caller's uid and gid, if the request names them.
    pub const fn ids(&self) -> Option<(u32, u32)> {
        match self.caller {
            Caller::Ids { uid, gid } => Some((uid, gid)),
            Caller::KernelChecked { .. } => None,
        }
    }

    /// Whether the request names uid `uid` as its caller.
    pub fn is_uid(&self, uid: u32) -> bool {
        self.ids().is_some_and(|(u, _)| u == uid)
    }
}

/// A capability Linux asks of a caller for what the kernel passes to cilfs unchecked (the
/// Linux ioctls, cilfs's own xattrs), or for a rule cilfs applies itself (set-ID clearing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Keeps set-user-ID and set-group-ID through a change of the data (CAP_FSETID).
    Fsetid,
    /// Sets or clears immutable and append-only (CAP_LINUX_IMMUTABLE).
    LinuxImmutable,
    /// Administers the filesystem: shutdown, FITRIM, the label, projects and tenants,
    /// `trusted.*` names (CAP_SYS_ADMIN).
    SysAdmin,
}

impl Capability {
    /// Linux's number for it (`<linux/capability.h>`), its bit in /proc's `CapEff`.
    pub const fn number(self) -> u32 {
        match self {
            Capability::Fsetid => 4,
            Capability::LinuxImmutable => 9,
            Capability::SysAdmin => 21,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Timespec),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
    /// RENAME_WHITEOUT: a whiteout (character device 0:0, mode 0) takes the source's name.
    pub whiteout: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

/// Longest symlink target (PATH_MAX less the terminating NUL).
pub const SYMLINK_MAX: usize = 4095;
pub(crate) const SYMLINK_CHUNK: usize = 256;
/// Link count limit.
pub const LINK_MAX: u32 = 65_000;
/// Blocks kept back for operations that free space (unlink, rmdir, truncate) on a full device.
pub const RESERVE_BLOCKS: u64 = 256;

/// How much of the reserve an operation may use (`Fs::space_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reserve {
    /// Operations that take space (create, write, xattrs) leave the whole reserve.
    Keep,
    /// Rename may need a node for the new name: it leaves a quarter of the reserve.
    Quarter,
    /// Operations that give space back (unlink, rmdir, truncate, punch) may use all of it.
    Use,
}

/// How setxattr treats an attribute that exists, or does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XattrFlags {
    /// Fail with Exists if the attribute exists (XATTR_CREATE).
    pub create: bool,
    /// Fail with NoAttr if it does not (XATTR_REPLACE).
    pub replace: bool,
}

/// What lsattr, `xfs_io lsproj` and `xfs_io extsize` read (FS_IOC_GETFLAGS,
/// FS_IOC_FSGETXATTR): the flags users set (`items::inode::INODE_USER_FLAGS`, and the two hint
/// flags below), the project ID and the extent size hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileAttr {
    pub flags: u32,
    pub project: u32,
    /// The extent size hint in bytes (fsx_extsize), a multiple of the block size; 0: none.
    pub extsize: u32,
}

/// `FileAttr::flags`: the regular file has an extent size hint of its own (FS_XFLAG_EXTSIZE).
/// Never an inode flag: reported exactly when the hint is not 0, as XFS keeps it; a hint set
/// without it is refused, and it set with a hint of 0 says no hint.
pub const ATTR_EXTSIZE: u32 = 1 << 30;
/// `FileAttr::flags`: the directory has a hint that the files and directories made in it take
/// (FS_XFLAG_EXTSZINHERIT); as `ATTR_EXTSIZE`, for directories.
pub const ATTR_EXTSZINHERIT: u32 = 1 << 31;
/// Both hint flags.
pub const ATTR_HINT_FLAGS: u32 = ATTR_EXTSIZE | ATTR_EXTSZINHERIT;

/// What a shutdown (XFS_IOC_GOINGDOWN) makes stable first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Dirty data written back and the log forced (XFS_FSOP_GOING_FLAGS_DEFAULT).
    Default,
    /// The log forced, dirty data dropped (LOGFLUSH).
    LogFlush,
    /// Nothing: as a crash, from what is stable now (NOLOGFLUSH).
    NoLogFlush,
}
