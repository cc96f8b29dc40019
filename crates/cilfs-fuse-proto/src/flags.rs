//! The kernel's flag bits, by the field that carries them (`<linux/fuse.h>`, protocol 7.45).

/// `fuse_init_in.flags` / `fuse_init_out.flags`, with bits 32..63 travelling in `flags2` when
/// [`init::INIT_EXT`] is set. Kept as one `u64` here; [`crate::InitIn::flags`] and
/// [`crate::InitOut::set_flags`] do the split.
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const FILE_OPS: u64 = 1 << 2;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const SPLICE_WRITE: u64 = 1 << 7;
    pub const SPLICE_MOVE: u64 = 1 << 8;
    pub const SPLICE_READ: u64 = 1 << 9;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const INIT_RESERVED: u64 = 1 << 31;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const HAS_INODE_DAX: u64 = 1 << 33;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const ALLOW_IDMAP: u64 = 1 << 40;
    pub const OVER_IO_URING: u64 = 1 << 41;
    pub const REQUEST_TIMEOUT: u64 = 1 << 42;
}

/// `fuse_setattr_in.valid`: which fields to set.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    /// With HANDLE_KILLPRIV_V2: clear set-user-ID and set-group-ID as the VFS would.
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_open_out.open_flags`, set by the server.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
    pub const PASSTHROUGH: u32 = 1 << 7;
}

/// `fuse_open_in.open_flags` and `fuse_create_in.open_flags`, set by the kernel.
pub mod open_in {
    /// With HANDLE_KILLPRIV_V2: an open with O_TRUNC must clear set-user-ID/set-group-ID.
    pub const KILL_SUIDGID: u32 = 1 << 0;
}

/// `fuse_write_in.write_flags`.
pub mod write {
    /// A write-back of cached pages; the file handle is a guess.
    pub const CACHE: u32 = 1 << 0;
    pub const LOCKOWNER: u32 = 1 << 1;
    /// With HANDLE_KILLPRIV_V2: clear set-user-ID/set-group-ID (the kernel no longer does).
    pub const KILL_SUIDGID: u32 = 1 << 2;
}

/// `fuse_read_in.read_flags`.
pub mod read {
    pub const LOCKOWNER: u32 = 1 << 1;
}

/// `fuse_release_in.release_flags`.
pub mod release {
    pub const FLUSH: u32 = 1 << 0;
    pub const FLOCK_UNLOCK: u32 = 1 << 1;
}

/// `fuse_getattr_in.getattr_flags`.
pub mod getattr {
    /// `fh` is valid: the attributes of an open file are asked.
    pub const FH: u32 = 1 << 0;
}

/// `fuse_lk_in.lk_flags`.
pub mod lk {
    pub const FLOCK: u32 = 1 << 0;
}

/// `fuse_fsync_in.fsync_flags`.
pub mod fsync {
    pub const FDATASYNC: u32 = 1 << 0;
}

/// `fuse_setxattr_in.setxattr_flags` (present only with SETXATTR_EXT).
pub mod setxattr {
    /// Setting `system.posix_acl_access` must clear set-group-ID.
    pub const ACL_KILL_SGID: u32 = 1 << 0;
}

/// `fuse_attr.flags`.
pub mod attr {
    pub const SUBMOUNT: u32 = 1 << 0;
    pub const DAX: u32 = 1 << 1;
}

/// `fuse_ioctl_in.flags`.
pub mod ioctl {
    pub const COMPAT: u32 = 1 << 0;
    pub const UNRESTRICTED: u32 = 1 << 1;
    pub const RETRY: u32 = 1 << 2;
    pub const BIT32: u32 = 1 << 3;
    pub const DIR: u32 = 1 << 4;
    pub const COMPAT_X32: u32 = 1 << 5;
}

/// `fuse_poll_in.flags`.
pub mod poll {
    pub const SCHEDULE_NOTIFY: u32 = 1 << 0;
}

/// `fuse_notify_inval_entry_out.flags`.
pub mod inval_entry {
    /// Only expire the entry's lifetime (kernel offers HAS_EXPIRE_ONLY), keep it cached.
    pub const EXPIRE_ONLY: u32 = 1 << 0;
}
