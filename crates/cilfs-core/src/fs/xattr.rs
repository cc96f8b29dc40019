//! Extended attributes: fs-tree items keyed by (inode, name hash), each a bucket of entries.
//! A small value lives in the entry; a larger one (up to 64 KiB) in a run of blocks of its own,
//! written through the journal like all metadata. `user.cilfs.change` is the change attribute:
//! read only, not listed.

use super::dir::TreeRead;
use super::error::{FsError, FsResult};
use super::header::TREE_FS;
use super::keys::{key, kind_of, name_hash, KIND_XATTR};
use super::node::{arr4, arr8, max_value_bytes};
use super::ops::Reserve;
use super::tx::{FsTx, Trees};
use super::{log_inode, Fs};

pub const CHANGE_XATTR: &[u8] = b"user.cilfs.change";
pub const XATTR_NAME_MAX: usize = 255;
/// The largest value (Linux's XATTR_SIZE_MAX).
pub const XATTR_VALUE_MAX: usize = 65536;
const REMOTE: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XattrFlags {
    /// Fail with Exists if the attribute exists (XATTR_CREATE).
    pub create: bool,
    /// Fail with NoAttr if it does not (XATTR_REPLACE).
    pub replace: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Inline(Vec<u8>),
    /// `len` bytes in blocks `[start, start + blocks)`.
    Remote {
        start: u64,
        blocks: u64,
        len: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub value: Value,
}

/// Entry: name length u8, flags u8 (bit 0 remote), value length u32, name, then the value or
/// (start block u64, blocks u32).
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut v = Vec::new();
    for e in entries {
        v.push(e.name.len() as u8);
        match &e.value {
            Value::Inline(val) => {
                v.push(0);
                v.extend_from_slice(&(val.len() as u32).to_le_bytes());
                v.extend_from_slice(&e.name);
                v.extend_from_slice(val);
            }
            Value::Remote { start, blocks, len } => {
                v.push(REMOTE);
                v.extend_from_slice(&len.to_le_bytes());
                v.extend_from_slice(&e.name);
                v.extend_from_slice(&start.to_le_bytes());
                v.extend_from_slice(&(*blocks as u32).to_le_bytes());
            }
        }
    }
    v
}

pub fn decode(b: &[u8], ino: u64) -> FsResult<Vec<Entry>> {
    let bad = || FsError::corrupt(0, format!("inode {ino}: malformed xattr bucket"));
    let mut out = Vec::new();
    let mut p = 0;
    while p < b.len() {
        if p + 6 > b.len() {
            return Err(bad());
        }
        let n = usize::from(b[p]);
        let flags = b[p + 1];
        let len = u32::from_le_bytes(arr4(&b[p + 2..p + 6]));
        let body = if flags & REMOTE != 0 {
            12
        } else {
            len as usize
        };
        if n == 0
            || flags & !REMOTE != 0
            || len as usize > XATTR_VALUE_MAX
            || p + 6 + n + body > b.len()
        {
            return Err(bad());
        }
        let name = b[p + 6..p + 6 + n].to_vec();
        let at = p + 6 + n;
        let value = if flags & REMOTE != 0 {
            let blocks = u64::from(u32::from_le_bytes(arr4(&b[at + 8..at + 12])));
            if blocks == 0 {
                return Err(bad());
            }
            Value::Remote {
                start: u64::from_le_bytes(arr8(&b[at..at + 8])),
                blocks,
                len,
            }
        } else {
            Value::Inline(b[at..at + body].to_vec())
        };
        out.push(Entry { name, value });
        p = at + body;
    }
    Ok(out)
}

fn check_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() {
        return Err(FsError::Invalid("empty xattr name"));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

/// Frees a remote value's blocks (their buffers cancelled: never replayed, never written back).
fn free_remote(t: &mut FsTx<'_>, v: &Value) -> FsResult<()> {
    if let Value::Remote { start, blocks, .. } = *v {
        for b in start..start + blocks {
            let r = t.tx.buf(b)?;
            t.tx.cancel(r);
        }
        t.free_extent(start, blocks)?;
    }
    Ok(())
}

/// Frees what the xattr bucket `v` holds outside the tree (when an inode goes away).
pub(crate) fn free_bucket(t: &mut FsTx<'_>, v: &[u8], ino: u64) -> FsResult<()> {
    for e in decode(v, ino)? {
        free_remote(t, &e.value)?;
    }
    Ok(())
}

impl Fs {
    /// The value of an entry, reading remote blocks through the metadata cache.
    fn value_of(&self, v: &Value) -> FsResult<Vec<u8>> {
        match v {
            Value::Inline(x) => Ok(x.clone()),
            Value::Remote { start, blocks, len } => {
                let mut out = Vec::with_capacity(*len as usize);
                for b in *start..start + blocks {
                    let buf = self.journal.buf(b)?;
                    let g = buf.lock();
                    let need = (*len as usize - out.len()).min(g.data.len());
                    out.extend_from_slice(&g.data[..need]);
                }
                Ok(out)
            }
        }
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        check_name(name)?;
        if name == CHANGE_XATTR {
            return Ok(self.change_attr(ino)?.to_string().into_bytes());
        }
        super::stats::bump(&self.stats.operations);
        let st = self.state.read();
        self.peek_inode(&st, ino)?;
        let mut v = self.view(&st);
        let Some(b) = v.t_get(TREE_FS, key(ino, KIND_XATTR, name_hash(name)))? else {
            return Err(FsError::NoAttr);
        };
        let e = decode(&b, ino)?
            .into_iter()
            .find(|e| e.name == name)
            .ok_or(FsError::NoAttr)?;
        self.value_of(&e.value)
    }

    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        super::stats::bump(&self.stats.operations);
        let st = self.state.read();
        self.peek_inode(&st, ino)?;
        let mut v = self.view(&st);
        let mut out = Vec::new();
        let mut at = key(ino, KIND_XATTR, 0);
        while let Some((k, b)) = v.t_seek_ge(TREE_FS, at)? {
            if k.a != ino || kind_of(k) != KIND_XATTR {
                break;
            }
            out.extend(decode(&b, ino)?.into_iter().map(|e| e.name));
            at = match k.succ() {
                Some(n) => n,
                None => break,
            };
        }
        Ok(out)
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: XattrFlags) -> FsResult<()> {
        super::stats::bump(&self.stats.operations);
        check_name(name)?;
        self.check_writable()?;
        if name == CHANGE_XATTR {
            return Err(FsError::NotPermitted);
        }
        if value.len() > XATTR_VALUE_MAX {
            return Err(FsError::AttrTooBig);
        }
        let bs = self.bs as usize;
        let max = max_value_bytes(bs);
        let inline = 6 + name.len() + value.len() <= max / 4;
        let blocks = if inline {
            0
        } else {
            value.len().div_ceil(bs) as u64
        };
        let mut st = self.state.write();
        self.load(&mut st, ino)?;
        self.space_check(&st, 2 + blocks, Reserve::Keep)?;
        let mut forced = false;
        loop {
            let now = self.now();
            let r = self.with_tx(&mut st, |t, inodes| {
                let k = key(ino, KIND_XATTR, name_hash(name));
                let mut entries = match t.get(TREE_FS, k)? {
                    Some(b) => decode(&b, ino)?,
                    None => Vec::new(),
                };
                let pos = entries.iter().position(|e| e.name == name);
                match (pos, flags.create, flags.replace) {
                    (Some(_), true, _) => return Err(FsError::Exists),
                    (None, _, true) => return Err(FsError::NoAttr),
                    _ => {}
                }
                // Everything that can fail is checked before anything is logged.
                let placeholder = if inline {
                    Value::Inline(value.to_vec())
                } else {
                    Value::Remote {
                        start: 0,
                        blocks,
                        len: value.len() as u32,
                    }
                };
                let mut next = entries.clone();
                match pos {
                    Some(i) => next[i].value = placeholder,
                    None => next.push(Entry {
                        name: name.to_vec(),
                        value: placeholder,
                    }),
                }
                if encode(&next).len() > max {
                    return Err(FsError::AttrTooBig);
                }
                let new_value = if inline {
                    Value::Inline(value.to_vec())
                } else {
                    let Some((start, got)) = t.alloc_extent(blocks, blocks)? else {
                        return Err(FsError::NoSpace);
                    };
                    debug_assert_eq!(got, blocks);
                    for (i, chunk) in value.chunks(bs).enumerate() {
                        let r = t.tx.buf(start + i as u64)?;
                        // Freed blocks lose their role (Transaction::cancel); a stamp here
                        // would overwrite part of the value at write-back.
                        assert!(
                            t.tx.lsn_offset(r).is_none(),
                            "block {} of a new xattr value keeps an LSN stamp offset",
                            start + i as u64
                        );
                        let mut block = vec![0u8; bs];
                        block[..chunk.len()].copy_from_slice(chunk);
                        t.tx.write(r, 0, &block);
                    }
                    Value::Remote {
                        start,
                        blocks,
                        len: value.len() as u32,
                    }
                };
                match pos {
                    Some(i) => {
                        let old = std::mem::replace(&mut entries[i].value, new_value);
                        free_remote(t, &old)?;
                    }
                    None => entries.push(Entry {
                        name: name.to_vec(),
                        value: new_value,
                    }),
                }
                t.insert(TREE_FS, k, &encode(&entries))?;
                let m = Fs::inode_mut(t, inodes, ino)?;
                self.touch_ctime(m, now);
                log_inode(t, m, &self.stats)?;
                Ok(((), vec![ino]))
            });
            match r {
                // A value in blocks needs them contiguous, which the count above does not
                // promise: if only busy extents would fit, make them usable and try once more
                // (nothing was logged: the allocation comes before any change).
                Err(FsError::NoSpace) if !inline && !forced && !self.busy.lock().is_empty() => {
                    self.journal.force_all()?;
                    forced = true;
                }
                r => return r.map(drop),
            }
        }
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        super::stats::bump(&self.stats.operations);
        check_name(name)?;
        self.check_writable()?;
        if name == CHANGE_XATTR {
            return Err(FsError::NotPermitted);
        }
        let mut st = self.state.write();
        self.load(&mut st, ino)?;
        let now = self.now();
        self.with_tx(&mut st, |t, inodes| {
            let k = key(ino, KIND_XATTR, name_hash(name));
            let Some(b) = t.get(TREE_FS, k)? else {
                return Err(FsError::NoAttr);
            };
            let mut entries = decode(&b, ino)?;
            let Some(i) = entries.iter().position(|e| e.name == name) else {
                return Err(FsError::NoAttr);
            };
            let e = entries.remove(i);
            free_remote(t, &e.value)?;
            if entries.is_empty() {
                t.remove(TREE_FS, k)?;
            } else {
                t.insert(TREE_FS, k, &encode(&entries))?;
            }
            let m = Fs::inode_mut(t, inodes, ino)?;
            self.touch_ctime(m, now);
            log_inode(t, m, &self.stats)?;
            Ok(((), vec![ino]))
        })?;
        Ok(())
    }
}
