//! Request opcodes (`enum fuse_opcode`) and notification codes (`enum fuse_notify_code`).

macro_rules! numbered {
    ($(#[$meta:meta])* pub enum $name:ident { $($variant:ident = $value:expr => $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum $name { $($variant = $value,)* }

        impl $name {
            /// Every value, in the header's order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The header's name for it.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            pub fn from_u32(v: u32) -> Option<Self> {
                match v {
                    $($value => Some($name::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

numbered! {
    /// What a request asks. Opcode 7 was never assigned.
    pub enum Opcode {
        Lookup = 1 => "FUSE_LOOKUP",
        Forget = 2 => "FUSE_FORGET",
        Getattr = 3 => "FUSE_GETATTR",
        Setattr = 4 => "FUSE_SETATTR",
        Readlink = 5 => "FUSE_READLINK",
        Symlink = 6 => "FUSE_SYMLINK",
        Mknod = 8 => "FUSE_MKNOD",
        Mkdir = 9 => "FUSE_MKDIR",
        Unlink = 10 => "FUSE_UNLINK",
        Rmdir = 11 => "FUSE_RMDIR",
        Rename = 12 => "FUSE_RENAME",
        Link = 13 => "FUSE_LINK",
        Open = 14 => "FUSE_OPEN",
        Read = 15 => "FUSE_READ",
        Write = 16 => "FUSE_WRITE",
        Statfs = 17 => "FUSE_STATFS",
        Release = 18 => "FUSE_RELEASE",
        Fsync = 20 => "FUSE_FSYNC",
        Setxattr = 21 => "FUSE_SETXATTR",
        Getxattr = 22 => "FUSE_GETXATTR",
        Listxattr = 23 => "FUSE_LISTXATTR",
        Removexattr = 24 => "FUSE_REMOVEXATTR",
        Flush = 25 => "FUSE_FLUSH",
        Init = 26 => "FUSE_INIT",
        Opendir = 27 => "FUSE_OPENDIR",
        Readdir = 28 => "FUSE_READDIR",
        Releasedir = 29 => "FUSE_RELEASEDIR",
        Fsyncdir = 30 => "FUSE_FSYNCDIR",
        Getlk = 31 => "FUSE_GETLK",
        Setlk = 32 => "FUSE_SETLK",
        Setlkw = 33 => "FUSE_SETLKW",
        Access = 34 => "FUSE_ACCESS",
        Create = 35 => "FUSE_CREATE",
        Interrupt = 36 => "FUSE_INTERRUPT",
        Bmap = 37 => "FUSE_BMAP",
        Destroy = 38 => "FUSE_DESTROY",
        Ioctl = 39 => "FUSE_IOCTL",
        Poll = 40 => "FUSE_POLL",
        NotifyReply = 41 => "FUSE_NOTIFY_REPLY",
        BatchForget = 42 => "FUSE_BATCH_FORGET",
        Fallocate = 43 => "FUSE_FALLOCATE",
        Readdirplus = 44 => "FUSE_READDIRPLUS",
        Rename2 = 45 => "FUSE_RENAME2",
        Lseek = 46 => "FUSE_LSEEK",
        CopyFileRange = 47 => "FUSE_COPY_FILE_RANGE",
        SetupMapping = 48 => "FUSE_SETUPMAPPING",
        RemoveMapping = 49 => "FUSE_REMOVEMAPPING",
        Syncfs = 50 => "FUSE_SYNCFS",
        Tmpfile = 51 => "FUSE_TMPFILE",
        Statx = 52 => "FUSE_STATX",
        CopyFileRange64 = 53 => "FUSE_COPY_FILE_RANGE_64",
        CuseInit = 4096 => "CUSE_INIT",
    }
}

numbered! {
    /// The code a notification carries in the out header's `error` field (its `unique` is 0).
    pub enum NotifyCode {
        Poll = 1 => "FUSE_NOTIFY_POLL",
        InvalInode = 2 => "FUSE_NOTIFY_INVAL_INODE",
        InvalEntry = 3 => "FUSE_NOTIFY_INVAL_ENTRY",
        Store = 4 => "FUSE_NOTIFY_STORE",
        Retrieve = 5 => "FUSE_NOTIFY_RETRIEVE",
        Delete = 6 => "FUSE_NOTIFY_DELETE",
        Resend = 7 => "FUSE_NOTIFY_RESEND",
        IncEpoch = 8 => "FUSE_NOTIFY_INC_EPOCH",
        Prune = 9 => "FUSE_NOTIFY_PRUNE",
    }
}
