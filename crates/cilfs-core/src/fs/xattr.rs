//! Extended attributes: fs-tree items keyed by (inode, name hash), each a bucket of
//! (name, value) pairs. Values up to what a quarter leaf holds live in the item; larger ones
//! are refused with `AttrTooBig` for now. `user.cilfs.change` is the change attribute: read
//! only, not listed.

use super::dir::TreeRead;
use super::error::{FsError, FsResult};
use super::header::TREE_FS;
use super::keys::{key, kind_of, name_hash, KIND_XATTR};
use super::{log_inode, Fs};

pub const CHANGE_XATTR: &[u8] = b"user.cilfs.change";
pub const XATTR_NAME_MAX: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XattrFlags {
    /// Fail with Exists if the attribute exists (XATTR_CREATE).
    pub create: bool,
    /// Fail with NoAttr if it does not (XATTR_REPLACE).
    pub replace: bool,
}

fn encode(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut v = Vec::new();
    for (n, val) in pairs {
        v.push(n.len() as u8);
        v.extend_from_slice(&(val.len() as u16).to_le_bytes());
        v.extend_from_slice(n);
        v.extend_from_slice(val);
    }
    v
}

fn decode(b: &[u8], ino: u64) -> FsResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let bad = || FsError::corrupt(0, format!("inode {ino}: malformed xattr bucket"));
    let mut out = Vec::new();
    let mut p = 0;
    while p < b.len() {
        if p + 3 > b.len() {
            return Err(bad());
        }
        let n = usize::from(b[p]);
        let l = usize::from(u16::from_le_bytes([b[p + 1], b[p + 2]]));
        if n == 0 || p + 3 + n + l > b.len() {
            return Err(bad());
        }
        out.push((
            b[p + 3..p + 3 + n].to_vec(),
            b[p + 3 + n..p + 3 + n + l].to_vec(),
        ));
        p += 3 + n + l;
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

impl Fs {
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
        decode(&b, ino)?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .ok_or(FsError::NoAttr)
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
            out.extend(decode(&b, ino)?.into_iter().map(|(n, _)| n));
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
        let max = super::node::max_value_bytes(self.bs as usize);
        if 3 + name.len() + value.len() > max {
            return Err(FsError::AttrTooBig);
        }
        let mut st = self.state.write();
        self.load(&mut st, ino)?;
        self.space_check(&st, 2, true)?;
        let now = self.now();
        self.with_tx(&mut st, |t, inodes| {
            let k = key(ino, KIND_XATTR, name_hash(name));
            let mut pairs = match t.get(TREE_FS, k)? {
                Some(b) => decode(&b, ino)?,
                None => Vec::new(),
            };
            let pos = pairs.iter().position(|(n, _)| n == name);
            match (pos, flags.create, flags.replace) {
                (Some(_), true, _) => return Err(FsError::Exists),
                (None, _, true) => return Err(FsError::NoAttr),
                (Some(i), _, _) => pairs[i].1 = value.to_vec(),
                (None, _, _) => pairs.push((name.to_vec(), value.to_vec())),
            }
            let enc = encode(&pairs);
            if enc.len() > max {
                return Err(FsError::AttrTooBig);
            }
            t.insert(TREE_FS, k, &enc)?;
            let m = Fs::inode_mut(t, inodes, ino)?;
            self.touch_ctime(m, now);
            log_inode(t, m, &self.stats)?;
            Ok(((), vec![ino]))
        })?;
        Ok(())
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
            let mut pairs = decode(&b, ino)?;
            let Some(i) = pairs.iter().position(|(n, _)| n == name) else {
                return Err(FsError::NoAttr);
            };
            pairs.remove(i);
            if pairs.is_empty() {
                t.remove(TREE_FS, k)?;
            } else {
                t.insert(TREE_FS, k, &encode(&pairs))?;
            }
            let m = Fs::inode_mut(t, inodes, ino)?;
            self.touch_ctime(m, now);
            log_inode(t, m, &self.stats)?;
            Ok(((), vec![ino]))
        })?;
        Ok(())
    }
}
