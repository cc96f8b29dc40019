//! Packing of READDIR and READDIRPLUS replies: entries back to back, each padded to 8 bytes,
//! never past the size the kernel asked for.

use crate::abi::{Dirent, EntryOut, NAME_MAX};
use crate::ProtoError;

/// Rounds up to the 8-byte boundary every entry starts on (`FUSE_DIRENT_ALIGN`).
fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// The kernel refuses a whole READDIR reply (EIO) if one name is empty, too long or holds a
/// '/'; a NUL would cut the name short. So such names are refused here, one at a time.
fn check_name(name: &[u8]) -> Result<(), ProtoError> {
    if name.len() > NAME_MAX {
        return Err(ProtoError::NameTooLong {
            what: "fuse_dirent",
            len: name.len(),
            max: NAME_MAX,
        });
    }
    if name.is_empty() || name.iter().any(|&b| b == 0 || b == b'/') {
        return Err(ProtoError::BadName {
            what: "fuse_dirent",
        });
    }
    Ok(())
}

/// Appends one entry (its fixed part written by `head`, then the name, then zeros to the
/// 8-byte boundary) if it fits in `limit`; nothing is written if it does not.
fn push(
    buf: &mut Vec<u8>,
    limit: usize,
    head_size: usize,
    head: impl FnOnce(&mut Vec<u8>),
    name: &[u8],
) -> bool {
    let end = buf.len() + align8(head_size + name.len());
    if end > limit {
        return false;
    }
    head(buf);
    buf.extend_from_slice(name);
    buf.resize(end, 0);
    true
}

fn dirent(ino: u64, off: u64, typ: u32, name: &[u8]) -> Dirent {
    Dirent {
        ino,
        off,
        // check_name bounds the length by NAME_MAX.
        namelen: name.len() as u32,
        typ,
    }
}

/// A READDIR reply being filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirents {
    buf: Vec<u8>,
    limit: usize,
}

impl Dirents {
    /// `limit`: the request's `fuse_read_in.size`.
    pub fn new(limit: u32) -> Dirents {
        Dirents {
            buf: Vec::new(),
            limit: limit as usize,
        }
    }

    /// Adds an entry; `Ok(false)` when it does not fit (the reply is full: send it, and the
    /// next READDIR starts at the last entry's `off`). `typ` is [`crate::dirent_type`] of the mode.
    pub fn push(&mut self, ino: u64, off: u64, typ: u32, name: &[u8]) -> Result<bool, ProtoError> {
        check_name(name)?;
        let head = |buf: &mut Vec<u8>| dirent(ino, off, typ, name).encode(buf);
        Ok(push(&mut self.buf, self.limit, Dirent::SIZE, head, name))
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// A READDIRPLUS reply being filled: each entry carries the lookup's result too (and, unless
/// its nodeid is 0, counts as a lookup the kernel will FORGET).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirentsPlus {
    buf: Vec<u8>,
    limit: usize,
}

impl DirentsPlus {
    /// `limit`: the request's `fuse_read_in.size`.
    pub fn new(limit: u32) -> DirentsPlus {
        DirentsPlus {
            buf: Vec::new(),
            limit: limit as usize,
        }
    }

    /// As [`Dirents::push`], with the `fuse_entry_out` the kernel would get from LOOKUP (nodeid
    /// 0: no lookup was done, the entry is listed only).
    pub fn push(
        &mut self,
        entry: &EntryOut,
        ino: u64,
        off: u64,
        typ: u32,
        name: &[u8],
    ) -> Result<bool, ProtoError> {
        check_name(name)?;
        let head = |buf: &mut Vec<u8>| {
            entry.encode(buf);
            dirent(ino, off, typ, name).encode(buf);
        };
        let head_size = EntryOut::SIZE + Dirent::SIZE;
        Ok(push(&mut self.buf, self.limit, head_size, head, name))
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}
