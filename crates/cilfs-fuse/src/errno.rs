//! The one place filesystem errors become errno values.

use cilfs_core::fs::FsError;
use cilfs_core::journal::JournalError;
use fuser::Errno;

pub fn errno(e: &FsError) -> Errno {
    let code = match e {
        FsError::NotFound => libc::ENOENT,
        FsError::Exists => libc::EEXIST,
        FsError::NotDir => libc::ENOTDIR,
        FsError::IsDir => libc::EISDIR,
        FsError::NotEmpty => libc::ENOTEMPTY,
        FsError::NameTooLong => libc::ENAMETOOLONG,
        FsError::NoSpace => libc::ENOSPC,
        FsError::TooBig => libc::EFBIG,
        FsError::Invalid(_) => libc::EINVAL,
        FsError::NotPermitted => libc::EPERM,
        FsError::Access => libc::EACCES,
        FsError::TooManyLinks => libc::EMLINK,
        FsError::NoAttr => libc::ENODATA,
        FsError::AttrTooBig => libc::E2BIG,
        FsError::ReadOnly => libc::EROFS,
        FsError::NoData => libc::ENXIO,
        FsError::NotSupported(_) => libc::EOPNOTSUPP,
        FsError::CrossProject => libc::EXDEV,
        FsError::Corrupt { .. } => libc::EUCLEAN,
        // Consumed inside the core (an operation run again); EIO if one ever got out.
        FsError::Retry(_) => libc::EIO,
        FsError::NotFormatted(_) => libc::EINVAL,
        FsError::Journal(JournalError::Shutdown) => libc::EIO,
        // Frozen by a remount read-only.
        FsError::Journal(JournalError::ReadOnly) => libc::EROFS,
        FsError::Journal(_) | FsError::Device(_) => libc::EIO,
    };
    Errno::from_i32(code)
}

/// Told of every error a request ends with, before it becomes an errno: the mount daemon logs
/// corruption and IO errors and marks the superblock as needing a check.
pub type ErrorObserver = Box<dyn Fn(&FsError) + Send + Sync>;

/// One per process: the daemon serves one mount, and the callbacks that reply with an error
/// (`err` in lib.rs) have no session state at hand to find a per-mount observer in.
static OBSERVER: std::sync::OnceLock<ErrorObserver> = std::sync::OnceLock::new();

/// Sets the observer of every error replied (at most once; false if one was set already).
pub fn observe_errors(f: ErrorObserver) -> bool {
    OBSERVER.set(f).is_ok()
}

/// The errno a request's error is replied with, after the observer has seen it.
pub(crate) fn replied(e: &FsError) -> Errno {
    if let Some(o) = OBSERVER.get() {
        o(e);
    }
    errno(e)
}
