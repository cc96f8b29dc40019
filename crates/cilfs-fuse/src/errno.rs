//! The one place filesystem errors become errno values: the FUSE protocol's [`Errno`], which
//! holds only what the kernel accepts in a reply.

use cilfs_core::fs::FsError;
use cilfs_core::journal::JournalError;
use cilfs_fuse_proto::Errno;

pub fn errno(e: &FsError) -> Errno {
    match e {
        FsError::NotFound => Errno::ENOENT,
        FsError::Exists => Errno::EEXIST,
        FsError::NotDir => Errno::ENOTDIR,
        FsError::IsDir => Errno::EISDIR,
        FsError::NotEmpty => Errno::ENOTEMPTY,
        FsError::NameTooLong => Errno::ENAMETOOLONG,
        FsError::NoSpace => Errno::ENOSPC,
        FsError::TooBig => Errno::EFBIG,
        FsError::Invalid(_) => Errno::EINVAL,
        FsError::NotPermitted => Errno::EPERM,
        FsError::Access => Errno::EACCES,
        FsError::TooManyLinks => Errno::EMLINK,
        FsError::NoAttr => Errno::ENODATA,
        FsError::AttrTooBig => Errno::E2BIG,
        FsError::ReadOnly => Errno::EROFS,
        FsError::NoData => Errno::ENXIO,
        FsError::NotSupported(_) => Errno::EOPNOTSUPP,
        FsError::CrossProject => Errno::EXDEV,
        FsError::NoOwner => Errno::EOVERFLOW,
        FsError::Corrupt { .. } => Errno::EUCLEAN,
        // Consumed inside the core (an operation run again); EIO if one ever got out.
        FsError::Retry(_) => Errno::EIO,
        FsError::NotFormatted(_) => Errno::EINVAL,
        FsError::Journal(JournalError::Shutdown) => Errno::EIO,
        // Frozen by a remount read-only.
        FsError::Journal(JournalError::ReadOnly) => Errno::EROFS,
        FsError::Journal(_) | FsError::Device(_) => Errno::EIO,
    }
}

/// Told of every error a request ends with, before it becomes an errno: the mount daemon logs
/// corruption and IO errors and marks the superblock as needing a check.
pub type ErrorObserver = Box<dyn Fn(&FsError) + Send + Sync>;

/// One per process: the daemon serves one mount, and the answers that reply with an error
/// have no session state at hand to find a per-mount observer in.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_errno() {
        for (e, code) in [
            (FsError::NotFound, libc::ENOENT),
            (FsError::Exists, libc::EEXIST),
            (FsError::NotDir, libc::ENOTDIR),
            (FsError::NotEmpty, libc::ENOTEMPTY),
            (FsError::NoSpace, libc::ENOSPC),
            (FsError::NoAttr, libc::ENODATA),
            (FsError::AttrTooBig, libc::E2BIG),
            (FsError::NoData, libc::ENXIO),
            (FsError::CrossProject, libc::EXDEV),
            (FsError::NoOwner, libc::EOVERFLOW),
            (FsError::Journal(JournalError::Shutdown), libc::EIO),
        ] {
            assert_eq!(errno(&e).get(), code, "{e:?}");
        }
    }
}
