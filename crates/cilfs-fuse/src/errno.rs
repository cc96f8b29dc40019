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
        FsError::Corrupt { .. } => libc::EUCLEAN,
        FsError::NotFormatted(_) => libc::EINVAL,
        FsError::Journal(JournalError::Shutdown) => libc::EIO,
        FsError::Journal(_) | FsError::Device(_) => libc::EIO,
    };
    Errno::from_i32(code)
}
