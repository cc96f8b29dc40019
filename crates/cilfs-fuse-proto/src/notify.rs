//! Encoding of notifications: messages the server writes to /dev/fuse unasked, with unique 0
//! and the notify code where a reply has its error.

use crate::abi::*;
use crate::reply::frame_header;
use crate::{NotifyCode, ProtoError};

/// One encoded notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    bytes: Vec<u8>,
}

/// The kernel checks that a notified name is followed by a NUL and no longer than NAME_MAX;
/// a name with a NUL or '/' in it could never be a directory entry.
fn check_name(name: &[u8], what: &'static str) -> Result<u32, ProtoError> {
    if name.len() > NAME_MAX {
        return Err(ProtoError::NameTooLong {
            what,
            len: name.len(),
            max: NAME_MAX,
        });
    }
    if name.is_empty() || name.iter().any(|&b| b == 0 || b == b'/') {
        return Err(ProtoError::BadName { what });
    }
    Ok(name.len() as u32)
}

impl Notification {
    fn build(code: NotifyCode, payload: Vec<u8>) -> Result<Notification, ProtoError> {
        let header = frame_header(0, code as i32, payload.len())?;
        let mut bytes = Vec::with_capacity(OutHeader::SIZE + payload.len());
        header.encode(&mut bytes);
        bytes.extend_from_slice(&payload);
        Ok(Notification { bytes })
    }

    /// Fixed-size payloads always fit the header's length field.
    fn fixed(code: NotifyCode, payload: Vec<u8>) -> Notification {
        let len = (OutHeader::SIZE + payload.len()) as u32;
        let mut bytes = Vec::with_capacity(len as usize);
        OutHeader {
            len,
            error: code as i32,
            unique: 0,
        }
        .encode(&mut bytes);
        bytes.extend_from_slice(&payload);
        Notification { bytes }
    }

    /// Drop the kernel's cached attributes of `ino` and its cached data in [off, off + len)
    /// (`len` 0: to the end of the file; `off` negative: the attributes only).
    pub fn inval_inode(ino: u64, off: i64, len: i64) -> Notification {
        let mut p = Vec::with_capacity(NotifyInvalInodeOut::SIZE);
        NotifyInvalInodeOut { ino, off, len }.encode(&mut p);
        Notification::fixed(NotifyCode::InvalInode, p)
    }

    /// Drop (or with [`crate::flags::inval_entry::EXPIRE_ONLY`], only expire) the cached entry
    /// `name` in directory `parent`.
    pub fn inval_entry(parent: u64, name: &[u8], flags: u32) -> Result<Notification, ProtoError> {
        let namelen = check_name(name, "fuse_notify_inval_entry_out")?;
        let mut p = Vec::with_capacity(NotifyInvalEntryOut::SIZE + name.len() + 1);
        NotifyInvalEntryOut {
            parent,
            namelen,
            flags,
        }
        .encode(&mut p);
        p.extend_from_slice(name);
        p.push(0);
        Notification::build(NotifyCode::InvalEntry, p)
    }

    /// The entry `name` in `parent`, which was `child`, is gone: the kernel drops it and
    /// tells watchers (inotify) as for a local delete.
    pub fn delete(parent: u64, child: u64, name: &[u8]) -> Result<Notification, ProtoError> {
        let namelen = check_name(name, "fuse_notify_delete_out")?;
        let mut p = Vec::with_capacity(NotifyDeleteOut::SIZE + name.len() + 1);
        NotifyDeleteOut {
            parent,
            child,
            namelen,
            padding: 0,
        }
        .encode(&mut p);
        p.extend_from_slice(name);
        p.push(0);
        Notification::build(NotifyCode::Delete, p)
    }

    /// Put `data` into the kernel's page cache of `nodeid` at `offset`.
    pub fn store(nodeid: u64, offset: u64, data: &[u8]) -> Result<Notification, ProtoError> {
        let size = u32::try_from(data.len()).map_err(|_| ProtoError::TooLong {
            what: "fuse_notify_store_out",
            len: data.len(),
        })?;
        let mut p = Vec::with_capacity(NotifyStoreOut::SIZE + data.len());
        NotifyStoreOut {
            nodeid,
            offset,
            size,
            padding: 0,
        }
        .encode(&mut p);
        p.extend_from_slice(data);
        Notification::build(NotifyCode::Store, p)
    }

    /// Ask for the kernel's cached data of `nodeid`; it comes back as a NOTIFY_REPLY request
    /// whose unique is `notify_unique`.
    pub fn retrieve(notify_unique: u64, nodeid: u64, offset: u64, size: u32) -> Notification {
        let mut p = Vec::with_capacity(NotifyRetrieveOut::SIZE);
        NotifyRetrieveOut {
            notify_unique,
            nodeid,
            offset,
            size,
            padding: 0,
        }
        .encode(&mut p);
        Notification::fixed(NotifyCode::Retrieve, p)
    }

    /// Wake the poller that registered `kh`.
    pub fn poll_wakeup(kh: u64) -> Notification {
        let mut p = Vec::with_capacity(NotifyPollWakeupOut::SIZE);
        NotifyPollWakeupOut { kh }.encode(&mut p);
        Notification::fixed(NotifyCode::Poll, p)
    }

    /// Ask the kernel to resend every request it is waiting on (FUSE_HAS_RESEND).
    pub fn resend() -> Notification {
        Notification::fixed(NotifyCode::Resend, Vec::new())
    }

    /// Invalidate every cached entry at once by moving the connection's epoch (7.44).
    pub fn inc_epoch() -> Notification {
        Notification::fixed(NotifyCode::IncEpoch, Vec::new())
    }

    /// Ask the kernel to evict these inodes if nothing uses them (7.45).
    pub fn prune(nodeids: &[u64]) -> Result<Notification, ProtoError> {
        let count = u32::try_from(nodeids.len()).map_err(|_| ProtoError::TooLong {
            what: "fuse_notify_prune_out",
            len: nodeids.len(),
        })?;
        let mut p = Vec::with_capacity(NotifyPruneOut::SIZE + nodeids.len() * 8);
        NotifyPruneOut {
            count,
            padding: 0,
            spare: 0,
        }
        .encode(&mut p);
        for id in nodeids {
            p.extend_from_slice(&id.to_le_bytes());
        }
        Notification::build(NotifyCode::Prune, p)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}
