//! The kernel's structures (`<linux/fuse.h>`, protocol 7.45), declared field by field in the
//! header's order. Each has `SIZE`, `decode` (bounds-checked) and `encode`. Field names follow
//! the header, so that the header can be read beside this file.

use crate::codec::wire_struct;

/// Major protocol version this crate speaks.
pub const KERNEL_VERSION: u32 = 7;
/// Minor version this crate knows every structure of (Linux 6.18 announces 7.45).
pub const KERNEL_MINOR_VERSION: u32 = 45;
/// Oldest minor version accepted: from 7.23 on every reply this crate encodes has its present
/// size (time_gran and the reserved space of fuse_init_out, FATTR_CTIME, RENAME2), so no
/// compat-size encoders are needed.
pub const MIN_MINOR_VERSION: u32 = 23;

/// The node ID of the root inode.
pub const ROOT_ID: u64 = 1;
/// Set in `unique` when the kernel resends a request it had queued (FUSE_HAS_RESEND).
pub const UNIQUE_RESEND: u64 = 1 << 63;
/// uid/gid in the in header when an idmapped mount cannot map the caller (FUSE_ALLOW_IDMAP).
pub const INVALID_UIDGID: u32 = u32::MAX;
/// The kernel refuses a read buffer smaller than this.
pub const MIN_READ_BUFFER: usize = 8192;
/// Longest name the kernel accepts in a directory entry or a notification.
pub const NAME_MAX: usize = 1024;
/// `FUSE_COMPAT_SETXATTR_IN_SIZE`: fuse_setxattr_in without FUSE_SETXATTR_EXT.
pub const COMPAT_SETXATTR_IN_SIZE: usize = 8;
/// `FUSE_COMPAT_INIT_IN_SIZE`-like: fuse_init_in as kernels before 7.36 send it.
pub const COMPAT_INIT_IN_SIZE: usize = 16;
/// Extension types (`enum fuse_ext_type`): 0..=31 are security contexts (the value is their count).
pub const MAX_NR_SECCTX: u32 = 31;
pub const EXT_GROUPS: u32 = 32;
/// `_IOR(229, 0, uint32_t)`: clones a /dev/fuse fd onto an existing session (one per thread).
pub const DEV_IOC_CLONE: u32 = (2 << 30) | (4 << 16) | (229 << 8);

wire_struct! {
    /// `struct fuse_in_header`: 40 bytes before every request.
    pub struct InHeader ("fuse_in_header") {
        pub len: u32,
        pub opcode: u32,
        pub unique: u64,
        pub nodeid: u64,
        pub uid: u32,
        pub gid: u32,
        pub pid: u32,
        /// Length of the request extensions at the end of the message, in 8-byte units.
        pub total_extlen: u16,
        pub padding: u16,
    }
}

wire_struct! {
    /// `struct fuse_out_header`: 16 bytes before every reply and notification.
    pub struct OutHeader ("fuse_out_header") {
        pub len: u32,
        /// 0, or a negated errno in a reply; the notify code in a notification.
        pub error: i32,
        /// The request's unique; 0 in a notification.
        pub unique: u64,
    }
}

wire_struct! {
    /// `struct fuse_attr`.
    pub struct Attr ("fuse_attr") {
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub rdev: u32,
        pub blksize: u32,
        pub flags: u32,
    }
}

wire_struct! {
    /// `struct fuse_sx_time` (statx(2)'s timestamp).
    pub struct SxTime ("fuse_sx_time") {
        pub tv_sec: i64,
        pub tv_nsec: u32,
        pub reserved: i32,
    }
}

wire_struct! {
    /// `struct fuse_statx`, bit for bit statx(2)'s `struct statx`.
    pub struct Statx ("fuse_statx") {
        pub mask: u32,
        pub blksize: u32,
        pub attributes: u64,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub mode: u16,
        pub spare0: [u16; 1],
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub attributes_mask: u64,
        pub atime: SxTime,
        pub btime: SxTime,
        pub ctime: SxTime,
        pub mtime: SxTime,
        pub rdev_major: u32,
        pub rdev_minor: u32,
        pub dev_major: u32,
        pub dev_minor: u32,
        pub spare2: [u64; 14],
    }
}

wire_struct! {
    /// `struct fuse_kstatfs`, the whole of `fuse_statfs_out`.
    pub struct Kstatfs ("fuse_kstatfs") {
        pub blocks: u64,
        pub bfree: u64,
        pub bavail: u64,
        pub files: u64,
        pub ffree: u64,
        pub bsize: u32,
        pub namelen: u32,
        pub frsize: u32,
        pub padding: u32,
        pub spare: [u32; 6],
    }
}

wire_struct! {
    /// `struct fuse_file_lock`.
    pub struct FileLock ("fuse_file_lock") {
        pub start: u64,
        pub end: u64,
        pub typ: u32,
        /// tgid of the holder.
        pub pid: u32,
    }
}

wire_struct! {
    /// `struct fuse_entry_out`: the reply to LOOKUP, MKNOD, MKDIR, SYMLINK, LINK (and the first
    /// half of CREATE's).
    pub struct EntryOut ("fuse_entry_out") {
        pub nodeid: u64,
        /// nodeid and generation together must be unique over the filesystem's lifetime.
        pub generation: u64,
        pub entry_valid: u64,
        pub attr_valid: u64,
        pub entry_valid_nsec: u32,
        pub attr_valid_nsec: u32,
        pub attr: Attr,
    }
}

wire_struct! {
    /// `struct fuse_forget_in`.
    pub struct ForgetIn ("fuse_forget_in") {
        pub nlookup: u64,
    }
}

wire_struct! {
    /// `struct fuse_forget_one`: one entry of BATCH_FORGET.
    pub struct ForgetOne ("fuse_forget_one") {
        pub nodeid: u64,
        pub nlookup: u64,
    }
}

wire_struct! {
    /// `struct fuse_batch_forget_in`, followed by `count` [`ForgetOne`].
    pub struct BatchForgetIn ("fuse_batch_forget_in") {
        pub count: u32,
        pub dummy: u32,
    }
}

wire_struct! {
    /// `struct fuse_getattr_in`.
    pub struct GetattrIn ("fuse_getattr_in") {
        pub getattr_flags: u32,
        pub dummy: u32,
        pub fh: u64,
    }
}

wire_struct! {
    /// `struct fuse_attr_out`: the reply to GETATTR and SETATTR.
    pub struct AttrOut ("fuse_attr_out") {
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub dummy: u32,
        pub attr: Attr,
    }
}

wire_struct! {
    /// `struct fuse_statx_in`.
    pub struct StatxIn ("fuse_statx_in") {
        pub getattr_flags: u32,
        pub reserved: u32,
        pub fh: u64,
        pub sx_flags: u32,
        pub sx_mask: u32,
    }
}

wire_struct! {
    /// `struct fuse_statx_out`.
    pub struct StatxOut ("fuse_statx_out") {
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub flags: u32,
        pub spare: [u64; 2],
        pub stat: Statx,
    }
}

wire_struct! {
    /// `struct fuse_mknod_in`, followed by the name.
    pub struct MknodIn ("fuse_mknod_in") {
        pub mode: u32,
        pub rdev: u32,
        pub umask: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_mkdir_in`, followed by the name.
    pub struct MkdirIn ("fuse_mkdir_in") {
        pub mode: u32,
        pub umask: u32,
    }
}

wire_struct! {
    /// `struct fuse_rename_in`, followed by the old and the new name.
    pub struct RenameIn ("fuse_rename_in") {
        pub newdir: u64,
    }
}

wire_struct! {
    /// `struct fuse_rename2_in`, followed by the old and the new name.
    pub struct Rename2In ("fuse_rename2_in") {
        pub newdir: u64,
        /// RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT.
        pub flags: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_link_in`, followed by the new name.
    pub struct LinkIn ("fuse_link_in") {
        pub oldnodeid: u64,
    }
}

wire_struct! {
    /// `struct fuse_setattr_in`: `valid` ([`crate::flags::fattr`]) says which fields count.
    pub struct SetattrIn ("fuse_setattr_in") {
        pub valid: u32,
        pub padding: u32,
        pub fh: u64,
        pub size: u64,
        pub lock_owner: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub unused4: u32,
        pub uid: u32,
        pub gid: u32,
        pub unused5: u32,
    }
}

wire_struct! {
    /// `struct fuse_open_in` (OPEN and OPENDIR).
    pub struct OpenIn ("fuse_open_in") {
        /// open(2) flags.
        pub flags: u32,
        /// [`crate::flags::open_in`].
        pub open_flags: u32,
    }
}

wire_struct! {
    /// `struct fuse_create_in` (CREATE and TMPFILE), followed by the name.
    pub struct CreateIn ("fuse_create_in") {
        pub flags: u32,
        pub mode: u32,
        pub umask: u32,
        /// [`crate::flags::open_in`].
        pub open_flags: u32,
    }
}

wire_struct! {
    /// `struct fuse_open_out`.
    pub struct OpenOut ("fuse_open_out") {
        pub fh: u64,
        /// [`crate::flags::fopen`].
        pub open_flags: u32,
        pub backing_id: i32,
    }
}

wire_struct! {
    /// `struct fuse_release_in` (RELEASE and RELEASEDIR).
    pub struct ReleaseIn ("fuse_release_in") {
        pub fh: u64,
        pub flags: u32,
        pub release_flags: u32,
        pub lock_owner: u64,
    }
}

wire_struct! {
    /// `struct fuse_flush_in`.
    pub struct FlushIn ("fuse_flush_in") {
        pub fh: u64,
        pub unused: u32,
        pub padding: u32,
        pub lock_owner: u64,
    }
}

wire_struct! {
    /// `struct fuse_read_in` (READ, READDIR, READDIRPLUS).
    pub struct ReadIn ("fuse_read_in") {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub read_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_write_in`, followed by `size` bytes of data.
    pub struct WriteIn ("fuse_write_in") {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        /// [`crate::flags::write`].
        pub write_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_write_out` (also COPY_FILE_RANGE's reply).
    pub struct WriteOut ("fuse_write_out") {
        pub size: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_fsync_in` (FSYNC and FSYNCDIR).
    pub struct FsyncIn ("fuse_fsync_in") {
        pub fh: u64,
        /// [`crate::flags::fsync`].
        pub fsync_flags: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_setxattr_in` as sent with FUSE_SETXATTR_EXT (16 bytes; without it the
    /// kernel sends only `size` and `flags`, 8 bytes). Followed by the name and the value.
    pub struct SetxattrIn ("fuse_setxattr_in") {
        pub size: u32,
        /// XATTR_CREATE, XATTR_REPLACE.
        pub flags: u32,
        /// [`crate::flags::setxattr`].
        pub setxattr_flags: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_getxattr_in` (GETXATTR, followed by the name; LISTXATTR).
    pub struct GetxattrIn ("fuse_getxattr_in") {
        pub size: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_getxattr_out`: the size asked for when the request's size was 0.
    pub struct GetxattrOut ("fuse_getxattr_out") {
        pub size: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_lk_in` (GETLK, SETLK, SETLKW).
    pub struct LkIn ("fuse_lk_in") {
        pub fh: u64,
        pub owner: u64,
        pub lk: FileLock,
        pub lk_flags: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_lk_out`.
    pub struct LkOut ("fuse_lk_out") {
        pub lk: FileLock,
    }
}

wire_struct! {
    /// `struct fuse_access_in`.
    pub struct AccessIn ("fuse_access_in") {
        pub mask: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_init_in` as sent since 7.36 (64 bytes; older kernels send the first 16).
    pub struct InitIn ("fuse_init_in") {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub flags2: u32,
        pub unused: [u32; 11],
    }
}

wire_struct! {
    /// `struct fuse_init_out`.
    pub struct InitOut ("fuse_init_out") {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub max_background: u16,
        pub congestion_threshold: u16,
        pub max_write: u32,
        /// Timestamp granularity in nanoseconds (1..=1e9, a power of ten).
        pub time_gran: u32,
        /// With FUSE_MAX_PAGES: the most pages one request may carry.
        pub max_pages: u16,
        pub map_alignment: u16,
        pub flags2: u32,
        pub max_stack_depth: u32,
        /// With FUSE_REQUEST_TIMEOUT: seconds before the kernel aborts an unanswered request.
        pub request_timeout: u16,
        pub unused: [u16; 11],
    }
}

wire_struct! {
    /// `struct fuse_interrupt_in`: the unique of the request to interrupt.
    pub struct InterruptIn ("fuse_interrupt_in") {
        pub unique: u64,
    }
}

wire_struct! {
    /// `struct fuse_bmap_in`.
    pub struct BmapIn ("fuse_bmap_in") {
        pub block: u64,
        pub blocksize: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_bmap_out`.
    pub struct BmapOut ("fuse_bmap_out") {
        pub block: u64,
    }
}

wire_struct! {
    /// `struct fuse_ioctl_in`, followed by `in_size` bytes.
    pub struct IoctlIn ("fuse_ioctl_in") {
        pub fh: u64,
        pub flags: u32,
        pub cmd: u32,
        pub arg: u64,
        pub in_size: u32,
        pub out_size: u32,
    }
}

wire_struct! {
    /// `struct fuse_ioctl_out`.
    pub struct IoctlOut ("fuse_ioctl_out") {
        pub result: i32,
        pub flags: u32,
        pub in_iovs: u32,
        pub out_iovs: u32,
    }
}

wire_struct! {
    /// `struct fuse_poll_in`.
    pub struct PollIn ("fuse_poll_in") {
        pub fh: u64,
        pub kh: u64,
        pub flags: u32,
        pub events: u32,
    }
}

wire_struct! {
    /// `struct fuse_poll_out`.
    pub struct PollOut ("fuse_poll_out") {
        pub revents: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_fallocate_in`.
    pub struct FallocateIn ("fuse_fallocate_in") {
        pub fh: u64,
        pub offset: u64,
        pub length: u64,
        pub mode: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_dirent` without its name: the fixed part of a READDIR entry.
    pub struct Dirent ("fuse_dirent") {
        pub ino: u64,
        /// Offset of the next entry (what the next READDIR passes back).
        pub off: u64,
        pub namelen: u32,
        /// d_type: the file type bits of the mode, shifted down by 12.
        pub typ: u32,
    }
}

wire_struct! {
    /// `struct fuse_notify_poll_wakeup_out`.
    pub struct NotifyPollWakeupOut ("fuse_notify_poll_wakeup_out") {
        pub kh: u64,
    }
}

wire_struct! {
    /// `struct fuse_notify_inval_inode_out`: drop cached data in [off, off + len) of an inode
    /// (len 0: to the end; off -1: only the attributes).
    pub struct NotifyInvalInodeOut ("fuse_notify_inval_inode_out") {
        pub ino: u64,
        pub off: i64,
        pub len: i64,
    }
}

wire_struct! {
    /// `struct fuse_notify_inval_entry_out`, followed by the name and a NUL.
    pub struct NotifyInvalEntryOut ("fuse_notify_inval_entry_out") {
        pub parent: u64,
        pub namelen: u32,
        /// [`crate::flags::inval_entry`].
        pub flags: u32,
    }
}

wire_struct! {
    /// `struct fuse_notify_delete_out`, followed by the name and a NUL.
    pub struct NotifyDeleteOut ("fuse_notify_delete_out") {
        pub parent: u64,
        pub child: u64,
        pub namelen: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_notify_store_out`, followed by `size` bytes.
    pub struct NotifyStoreOut ("fuse_notify_store_out") {
        pub nodeid: u64,
        pub offset: u64,
        pub size: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_notify_retrieve_out`.
    pub struct NotifyRetrieveOut ("fuse_notify_retrieve_out") {
        pub notify_unique: u64,
        pub nodeid: u64,
        pub offset: u64,
        pub size: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_notify_retrieve_in`: NOTIFY_REPLY's argument, followed by `size` bytes.
    pub struct NotifyRetrieveIn ("fuse_notify_retrieve_in") {
        pub dummy1: u64,
        pub offset: u64,
        pub size: u32,
        pub dummy2: u32,
        pub dummy3: u64,
        pub dummy4: u64,
    }
}

wire_struct! {
    /// `struct fuse_notify_prune_out`, followed by `count` node IDs.
    pub struct NotifyPruneOut ("fuse_notify_prune_out") {
        pub count: u32,
        pub padding: u32,
        pub spare: u64,
    }
}

wire_struct! {
    /// `struct fuse_lseek_in`.
    pub struct LseekIn ("fuse_lseek_in") {
        pub fh: u64,
        pub offset: u64,
        /// SEEK_SET .. SEEK_HOLE.
        pub whence: u32,
        pub padding: u32,
    }
}

wire_struct! {
    /// `struct fuse_lseek_out`.
    pub struct LseekOut ("fuse_lseek_out") {
        pub offset: u64,
    }
}

wire_struct! {
    /// `struct fuse_copy_file_range_in` (COPY_FILE_RANGE and COPY_FILE_RANGE_64).
    pub struct CopyFileRangeIn ("fuse_copy_file_range_in") {
        pub fh_in: u64,
        pub off_in: u64,
        pub nodeid_out: u64,
        pub fh_out: u64,
        pub off_out: u64,
        pub len: u64,
        pub flags: u64,
    }
}

wire_struct! {
    /// `struct fuse_copy_file_range_out`: COPY_FILE_RANGE_64's reply.
    pub struct CopyFileRangeOut ("fuse_copy_file_range_out") {
        pub bytes_copied: u64,
    }
}

wire_struct! {
    /// `struct fuse_syncfs_in`.
    pub struct SyncfsIn ("fuse_syncfs_in") {
        pub padding: u64,
    }
}

wire_struct! {
    /// `struct fuse_ext_header`: starts every request extension. `size` covers the header.
    pub struct ExtHeader ("fuse_ext_header") {
        pub size: u32,
        /// 0..=31: a security context header (the value is the number of contexts);
        /// [`EXT_GROUPS`]: supplementary groups.
        pub typ: u32,
    }
}

wire_struct! {
    /// `struct fuse_secctx`: one security context, followed by its name (NUL-terminated) and
    /// `size` bytes of context.
    pub struct Secctx ("fuse_secctx") {
        pub size: u32,
        pub padding: u32,
    }
}

/// File type bits of a mode as a dirent's `typ` (DT_REG, DT_DIR, ...).
pub fn dirent_type(mode: u32) -> u32 {
    (mode & 0o170000) >> 12
}
