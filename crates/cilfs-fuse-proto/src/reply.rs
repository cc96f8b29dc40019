//! Encoding of replies: the out header with the request's unique and an error or the
//! opcode's result structure.

use crate::abi::*;
use crate::dirent::{Dirents, DirentsPlus};
use crate::ProtoError;

/// An errno the kernel accepts in a reply: 1..=511 (it refuses anything else with EINVAL and
/// the request would then wait forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENXIO: Errno = Errno(libc::ENXIO);
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EFBIG: Errno = Errno(libc::EFBIG);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const EMLINK: Errno = Errno(libc::EMLINK);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const EPROTO: Errno = Errno(libc::EPROTO);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const EUCLEAN: Errno = Errno(libc::EUCLEAN);
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    pub const EOVERFLOW: Errno = Errno(libc::EOVERFLOW);

    pub fn new(errno: i32) -> Result<Errno, ProtoError> {
        if (1..=511).contains(&errno) {
            Ok(Errno(errno))
        } else {
            Err(ProtoError::BadErrno(errno))
        }
    }

    pub fn get(self) -> i32 {
        self.0
    }
}

/// The out header for a reply carrying `payload_len` bytes after it: lets a transport send
/// the header and the payload (READ data, say) as two pieces without copying.
pub fn reply_header(unique: u64, payload_len: usize) -> Result<OutHeader, ProtoError> {
    frame_header(unique, 0, payload_len)
}

pub(crate) fn frame_header(
    unique: u64,
    error: i32,
    payload_len: usize,
) -> Result<OutHeader, ProtoError> {
    let len = payload_len
        .checked_add(OutHeader::SIZE)
        .and_then(|len| u32::try_from(len).ok())
        .ok_or(ProtoError::TooLong {
            what: "fuse_out_header",
            len: payload_len,
        })?;
    Ok(OutHeader { len, error, unique })
}

/// One encoded reply, ready to be written to /dev/fuse as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    bytes: Vec<u8>,
}

impl Reply {
    /// A header and a payload that the caller assembled.
    fn frame(unique: u64, error: i32, payload: &[u8]) -> Result<Reply, ProtoError> {
        let header = frame_header(unique, error, payload.len())?;
        let mut bytes = Vec::with_capacity(OutHeader::SIZE + payload.len());
        header.encode(&mut bytes);
        bytes.extend_from_slice(payload);
        Ok(Reply { bytes })
    }

    /// A payload of at most a few hundred bytes: its length always fits the header.
    fn small(unique: u64, error: i32, encode: impl FnOnce(&mut Vec<u8>)) -> Reply {
        let mut bytes = Vec::with_capacity(OutHeader::SIZE + StatxOut::SIZE);
        bytes.resize(OutHeader::SIZE, 0);
        encode(&mut bytes);
        let header = OutHeader {
            len: bytes.len() as u32,
            error,
            unique,
        };
        let mut head = Vec::with_capacity(OutHeader::SIZE);
        header.encode(&mut head);
        bytes[..OutHeader::SIZE].copy_from_slice(&head);
        Reply { bytes }
    }

    /// A failed request: the header alone, with the errno negated.
    pub fn error(unique: u64, errno: Errno) -> Reply {
        Reply::small(unique, -errno.get(), |_| {})
    }

    /// Success with nothing to return (UNLINK, RELEASE, FSYNC, SETXATTR, SYNCFS, ...).
    pub fn empty(unique: u64) -> Reply {
        Reply::small(unique, 0, |_| {})
    }

    /// LOOKUP, MKNOD, MKDIR, SYMLINK, LINK. A negative lookup may answer nodeid 0 with an
    /// entry lifetime, which the kernel caches.
    pub fn entry(unique: u64, entry: &EntryOut) -> Reply {
        Reply::small(unique, 0, |p| entry.encode(p))
    }

    /// CREATE and TMPFILE: the entry, then the open file.
    pub fn create(unique: u64, entry: &EntryOut, open: &OpenOut) -> Reply {
        Reply::small(unique, 0, |p| {
            entry.encode(p);
            open.encode(p);
        })
    }

    /// IOCTL answered in full (no retry), with no data back.
    pub fn ioctl(unique: u64, out: &IoctlOut) -> Reply {
        Reply::small(unique, 0, |p| out.encode(p))
    }

    /// GETATTR, SETATTR.
    pub fn attr(unique: u64, attr: &AttrOut) -> Reply {
        Reply::small(unique, 0, |p| attr.encode(p))
    }

    /// STATX.
    pub fn statx(unique: u64, statx: &StatxOut) -> Reply {
        Reply::small(unique, 0, |p| statx.encode(p))
    }

    /// OPEN, OPENDIR.
    pub fn open(unique: u64, open: &OpenOut) -> Reply {
        Reply::small(unique, 0, |p| open.encode(p))
    }

    /// WRITE and COPY_FILE_RANGE: bytes written.
    pub fn write(unique: u64, size: u32) -> Reply {
        Reply::small(unique, 0, |p| WriteOut { size, padding: 0 }.encode(p))
    }

    /// COPY_FILE_RANGE_64: bytes copied.
    pub fn copy_file_range_64(unique: u64, bytes_copied: u64) -> Reply {
        Reply::small(unique, 0, |p| CopyFileRangeOut { bytes_copied }.encode(p))
    }

    /// STATFS.
    pub fn statfs(unique: u64, st: &Kstatfs) -> Reply {
        Reply::small(unique, 0, |p| st.encode(p))
    }

    /// GETXATTR or LISTXATTR asked with size 0: the size the value (or list) needs.
    pub fn xattr_size(unique: u64, size: u32) -> Reply {
        Reply::small(unique, 0, |p| GetxattrOut { size, padding: 0 }.encode(p))
    }

    /// Bytes as they are: READ, READLINK, a GETXATTR value, a LISTXATTR list.
    pub fn data(unique: u64, data: &[u8]) -> Result<Reply, ProtoError> {
        Reply::frame(unique, 0, data)
    }

    /// LSEEK: the resulting offset.
    pub fn lseek(unique: u64, offset: u64) -> Reply {
        Reply::small(unique, 0, |p| LseekOut { offset }.encode(p))
    }

    /// INIT.
    pub fn init(unique: u64, init: &InitOut) -> Reply {
        Reply::small(unique, 0, |p| init.encode(p))
    }

    /// GETLK.
    pub fn lock(unique: u64, lk: &FileLock) -> Reply {
        Reply::small(unique, 0, |p| LkOut { lk: *lk }.encode(p))
    }

    /// BMAP.
    pub fn bmap(unique: u64, block: u64) -> Reply {
        Reply::small(unique, 0, |p| BmapOut { block }.encode(p))
    }

    /// POLL.
    pub fn poll(unique: u64, revents: u32) -> Reply {
        Reply::small(unique, 0, |p| {
            PollOut {
                revents,
                padding: 0,
            }
            .encode(p)
        })
    }

    /// READDIR: the packed entries (possibly none, at the end of the directory).
    pub fn dirents(unique: u64, entries: &Dirents) -> Result<Reply, ProtoError> {
        Reply::frame(unique, 0, entries.as_bytes())
    }

    /// READDIRPLUS.
    pub fn dirents_plus(unique: u64, entries: &DirentsPlus) -> Result<Reply, ProtoError> {
        Reply::frame(unique, 0, entries.as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}
