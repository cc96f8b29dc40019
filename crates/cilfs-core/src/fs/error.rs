//! Filesystem errors: typed at library level, mapped to errno only in the FUSE adapter.

use crate::journal::JournalError;
use cilfs_device::DeviceError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name longer than 255 bytes")]
    NameTooLong,
    #[error("no space left on the filesystem")]
    NoSpace,
    #[error("file too large")]
    TooBig,
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("operation not permitted")]
    NotPermitted,
    #[error("permission denied")]
    Access,
    #[error("too many links")]
    TooManyLinks,
    #[error("no such extended attribute")]
    NoAttr,
    #[error("extended attribute too large")]
    AttrTooBig,
    #[error("read-only filesystem")]
    ReadOnly,
    #[error("no data or hole past the offset")]
    NoData,
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// A rename or hard link into a directory of another project (tenant): as XFS answers for
    /// a directory with an inherited project ID, the data must be copied instead.
    #[error("crosses into another project's directory")]
    CrossProject,
    /// An inode to create for a caller its request does not name (`Caller::KernelChecked`):
    /// there is no owner to give it. Linux sends ids with every creating request, so only a
    /// kernel that did not would meet this; EOVERFLOW, as Linux answers a create by a caller
    /// whose ids have no mapping.
    #[error("no owner for a new inode: the request names no caller")]
    NoOwner,
    /// Internal: the operation gave up before its first commit and is run again outside the
    /// filesystem lock (`fs/txn/retry.rs`); never returned by a public operation.
    #[error("operation to be run again ({0:?})")]
    Retry(Retry),
    #[error("metadata block {blkno} is corrupt: {what}")]
    Corrupt { blkno: u64, what: String },
    #[error("not a cilfs filesystem: {0}")]
    NotFormatted(String),
    #[error("journal: {0}")]
    Journal(JournalError),
    #[error("device: {0}")]
    Device(#[from] DeviceError),
}

/// What an operation gave up for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Its transaction's log space was not free: wait for it, then run again.
    LogSpace(u64),
    /// Space is short but busy extents would free some: force the log, then run again.
    ForceLog,
    /// This metadata block is not in the buffer cache: read it, then run again.
    Read(u64),
    /// A reader under the shared lock found the tree's shape changed under it by a commit
    /// beside it (`ReadView`): it runs again.
    Reshaped,
    /// An open found its inode marked by a commit that frees it and is about to publish
    /// (`InodeMem::freeing`): it lets that commit run, then runs again.
    Freeing,
}

impl FsError {
    pub(crate) fn corrupt(blkno: u64, what: impl Into<String>) -> Self {
        FsError::Corrupt {
            blkno,
            what: what.into(),
        }
    }
}

/// A block that failed its read check in the journal is the filesystem's corrupt block
/// (EUCLEAN), like one its decoders refuse.
impl From<JournalError> for FsError {
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::BadBlock { blkno, what } => FsError::Corrupt { blkno, what },
            // The filesystem asks only for blocks a decoded pointer names (a child, the
            // header's roots, the free list): one outside the metadata area is damage in the
            // block that held the pointer (EUCLEAN), not an error of the journal.
            e @ JournalError::BlockOutOfRange { blkno, .. } => FsError::Corrupt {
                blkno,
                what: format!("a pointer to {e}"),
            },
            e => FsError::Journal(e),
        }
    }
}

pub type FsResult<T> = Result<T, FsError>;
