//! Extended attributes: get, list, set and remove, and the transactional steps under them
//! (a bucket's update, its value blocks' allocation and freeing). `user.cilfs.change` is the
//! change attribute: read only, not listed.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::TREE_FS;
use crate::fs::items::xattr::{
    decode, encode, remote_in_area, Entry, Value, CHANGE_XATTR, XATTR_NAME_MAX, XATTR_VALUE_MAX,
};
use crate::fs::rules::acl;
use crate::fs::rules::setid::CAPS_XATTR;
use crate::fs::tree::keys::{key, kind_of, name_hash, KIND_XATTR};
use crate::fs::tree::node::max_value_bytes;
use crate::fs::txn::TreeRead;
use crate::fs::txn::{FsTx, Trees};
use crate::fs::types::XattrFlags;
use crate::fs::types::{Cred, Reserve};
use crate::fs::{log_inode, Fs, FsState};

/// The namespaces xattrs live in on Linux. FUSE passes any name through; ext4, XFS and tmpfs
/// refuse one outside these with EOPNOTSUPP, and so does cilfs.
const NAMESPACES: [&[u8]; 4] = [b"user.", b"trusted.", b"security.", b"system."];

fn check_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() {
        return Err(FsError::Invalid("empty xattr name"));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    let Some(ns) = NAMESPACES.iter().find(|p| name.starts_with(p)) else {
        return Err(FsError::NotSupported("xattr namespace"));
    };
    if name.len() == ns.len() {
        return Err(FsError::Invalid(
            "xattr name with nothing after its namespace",
        ));
    }
    // system.* names are the kernel's own: cilfs keeps the POSIX ACLs of them.
    if *ns == b"system."
        && name != crate::fs::rules::acl::ACCESS
        && name != crate::fs::rules::acl::DEFAULT
    {
        return Err(FsError::NotSupported("xattr of the system namespace"));
    }
    Ok(())
}

/// Frees a remote value's blocks (their buffers cancelled: never replayed, never written back).
fn free_remote(t: &mut FsTx<'_>, v: &Value) -> FsResult<()> {
    if let Value::Remote { start, blocks, len } = *v {
        let area = crate::fs::txn::Trees::data_area(t);
        remote_in_area(start, blocks, len, t.bs as u64, area)?;
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

/// Buffers an xattr change logs besides its value's blocks: the bucket's leaf, the two
/// free-space trees' leaves, the inode. A split on the way logs more: the commit reserves
/// that (`FsTx::cover_logged`), and the smallest log mkfs makes has room for it
/// (`largest_change_buffers`).
const XATTR_TX_OTHER_BUFFERS: u64 = 4;

/// The most buffers one transaction may need to log on `bs`-byte blocks: an xattr replace of
/// a value of the largest size (its blocks and the old value's, cancelled, each whole, and
/// ten more for the rest and splits), or 32, more than any other operation logs.
pub(crate) fn largest_change_buffers(bs: u32) -> u64 {
    let value = XATTR_VALUE_MAX.div_ceil(bs as usize) as u64;
    (2 * value + 10).max(32)
}

/// Where a value of `len` bytes goes: in the bucket (0 blocks), or in blocks of its own.
pub(crate) fn value_blocks(bs: usize, name: &[u8], len: usize) -> (bool, u64) {
    let inline = 6 + name.len() + len <= max_value_bytes(bs) / 4;
    (inline, if inline { 0 } else { len.div_ceil(bs) as u64 })
}

/// Sets (`Some`) or removes (`None`) xattr `name` of `ino` in transaction `t`: the bucket item
/// and the value's blocks, nothing of the inode. Everything that can fail is checked before
/// anything is logged, so an error leaves `t` as it was.
pub(crate) fn put(
    t: &mut FsTx<'_>,
    ino: u64,
    name: &[u8],
    value: Option<&[u8]>,
    flags: XattrFlags,
) -> FsResult<()> {
    let bs = t.bs;
    let max = max_value_bytes(bs);
    let k = key(ino, KIND_XATTR, name_hash(name));
    let mut entries = match t.get(TREE_FS, k)? {
        Some(b) => decode(&b, ino)?,
        None => Vec::new(),
    };
    let pos = entries.iter().position(|e| e.name == name);
    let Some(value) = value else {
        let Some(i) = pos else {
            return Err(FsError::NoAttr);
        };
        let e = entries.remove(i);
        free_remote(t, &e.value)?;
        if entries.is_empty() {
            t.remove(TREE_FS, k)?;
        } else {
            t.insert(TREE_FS, k, &encode(&entries))?;
        }
        return Ok(());
    };
    match (pos, flags.create, flags.replace) {
        (Some(_), true, _) => return Err(FsError::Exists),
        (None, _, true) => return Err(FsError::NoAttr),
        _ => {}
    }
    let (inline, blocks) = value_blocks(bs, name, value.len());
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
    // The new value's blocks and the old one's (cancelled), each logged whole, and what else
    // the change may log (the bucket's leaf and its splits, the free-space trees, the inode):
    // a value no reservation of this log could hold is refused, never logged past one.
    let old_blocks = pos.map_or(0, |i| match entries[i].value {
        Value::Remote { blocks, .. } => blocks,
        Value::Inline(_) => 0,
    });
    if !t.could_log(blocks + old_blocks + XATTR_TX_OTHER_BUFFERS) {
        return Err(FsError::AttrTooBig);
    }
    let new_value = if inline {
        Value::Inline(value.to_vec())
    } else {
        let Some((start, got)) = t.alloc_extent(blocks, blocks)? else {
            return Err(FsError::NoSpace);
        };
        debug_assert_eq!(got, blocks);
        #[cfg(test)]
        AFTER_ALLOC.with(|h| {
            if let Some(f) = h.borrow_mut().as_mut() {
                f(start, got);
            }
        });
        for (i, chunk) in value.chunks(bs).enumerate() {
            let blk = start + i as u64;
            let r = t.tx.buf(blk)?;
            // Freed blocks lose their role (Transaction::cancel); a stamp here would overwrite
            // part of the value at write-back. An optimistic build (a create inheriting a large
            // default ACL) may have allocated from free-space leaves older than this block,
            // which another commit took as a tree node meanwhile: the error then runs it
            // again, and counts only if what it read was one state (`FsTx::saw_one_state`).
            if t.tx.lsn_offset(r).is_some() {
                return Err(FsError::corrupt(
                    blk,
                    format!("block {blk} of a new xattr value keeps an LSN stamp offset"),
                ));
            }
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
    Ok(())
}

/// Drops `ino`'s file capabilities in `t`, if it has any: a change of a file's data (write,
/// truncate, fallocate) or of its owner drops them whoever makes it, root included, as Linux
/// does. Cilfs negotiates FUSE_HANDLE_KILLPRIV_V2, which leaves this to the filesystem. Returns
/// whether there were any; nothing is logged when there were none.
pub(crate) fn drop_caps(t: &mut FsTx<'_>, ino: u64) -> FsResult<bool> {
    match put(t, ino, CAPS_XATTR, None, XattrFlags::default()) {
        Ok(()) => Ok(true),
        Err(FsError::NoAttr) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: run by `put` of this thread right after it allocated a value's blocks (start,
    /// count), before it reads them.
    #[allow(clippy::type_complexity)]
    pub(crate) static AFTER_ALLOC: std::cell::RefCell<Option<Box<dyn FnMut(u64, u64)>>> =
        const { std::cell::RefCell::new(None) };
}

impl Fs {
    /// The value of an entry, reading remote blocks through the metadata cache.
    pub(crate) fn value_of(&self, v: &Value) -> FsResult<Vec<u8>> {
        match v {
            Value::Inline(x) => Ok(x.clone()),
            Value::Remote { start, blocks, len } => {
                let (first, end) = self.journal.metadata_area();
                remote_in_area(*start, *blocks, *len, u64::from(self.bs), (first + 1, end))?;
                let mut out = Vec::with_capacity(*len as usize);
                for b in *start..start + blocks {
                    let buf = self.journal.buf(b)?;
                    let g = buf.read();
                    let need = (*len as usize - out.len()).min(g.data.len());
                    out.extend_from_slice(&g.data[..need]);
                }
                Ok(out)
            }
        }
    }

    /// Xattr `name` of `ino`, if it is set (outside a transaction, the filesystem lock held).
    pub(crate) fn xattr_lookup(
        &self,
        st: &FsState,
        ino: u64,
        name: &[u8],
    ) -> FsResult<Option<Vec<u8>>> {
        self.xattr_lookup_in(&mut self.view(st), ino, name)
    }

    /// Xattr `name` of `ino`, read through `t` (a transaction, or a read view).
    pub(crate) fn xattr_lookup_in(
        &self,
        t: &mut dyn crate::fs::txn::TreeRead,
        ino: u64,
        name: &[u8],
    ) -> FsResult<Option<Vec<u8>>> {
        let Some(b) = t.t_get(TREE_FS, key(ino, KIND_XATTR, name_hash(name)))? else {
            return Ok(None);
        };
        match decode(&b, ino)?.into_iter().find(|e| e.name == name) {
            Some(e) => self.value_of(&e.value).map(Some),
            None => Ok(None),
        }
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        check_name(name)?;
        if name == CHANGE_XATTR {
            return Ok(self.change_attr(ino)?.to_string().into_bytes());
        }
        if let Some(r) = self.tenant_xattr_get(ino, name) {
            return r;
        }
        crate::fs::stats::bump(&self.stats.operations);
        if acl::kind_of(name).is_some() && !self.opts.acl {
            return Err(FsError::NotSupported("POSIX ACLs: mounted with noacl"));
        }
        self.retrying(|| {
            let st = self.read_state();
            self.peek_inode(&st, ino)?;
            self.xattr_lookup(&st, ino, name)?.ok_or(FsError::NoAttr)
        })
    }

    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        crate::fs::stats::bump(&self.stats.operations);
        self.retrying(|| self.listxattr_shared(ino))
    }

    fn listxattr_shared(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        let st = self.read_state();
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

    /// Sets an xattr as root would. The ACL names go through [`Fs::set_acl`] (validated, the
    /// mode kept in step).
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: XattrFlags) -> FsResult<()> {
        self.set_xattr_as(Cred::ROOT, ino, name, Some(value), flags)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.set_xattr_as(Cred::ROOT, ino, name, None, XattrFlags::default())
    }

    /// Sets or removes an xattr for `cred`: for an ACL, `cred` decides whether set-group-ID
    /// survives the mode change (Linux clears it for a caller outside the file's group).
    pub fn set_xattr_as(
        &self,
        cred: Cred,
        ino: u64,
        name: &[u8],
        value: Option<&[u8]>,
        flags: XattrFlags,
    ) -> FsResult<()> {
        if let Some(r) = self.tenant_xattr_set(cred, ino, name, value) {
            return r;
        }
        // Where tenant limits are kept: changed through their own names only.
        if name.starts_with(crate::fs::tenant::STORED_PREFIX) {
            return Err(FsError::NotPermitted);
        }
        self.once_more_after_releases(|| self.set_xattr_inner(cred, ino, name, value, flags))
    }

    /// `set_xattr_as` without the names kept for cilfs itself.
    pub(crate) fn set_xattr_inner(
        &self,
        cred: Cred,
        ino: u64,
        name: &[u8],
        value: Option<&[u8]>,
        flags: XattrFlags,
    ) -> FsResult<()> {
        self.retrying(|| {
            crate::fs::stats::bump(&self.stats.operations);
            check_name(name)?;
            self.check_writable()?;
            if name == CHANGE_XATTR {
                return Err(FsError::NotPermitted);
            }
            let acl_kind = acl::kind_of(name);
            if acl_kind.is_some() && !self.opts.acl {
                return Err(FsError::NotSupported("POSIX ACLs: mounted with noacl"));
            }
            if value.is_some_and(|v| v.len() > XATTR_VALUE_MAX) {
                return Err(FsError::AttrTooBig);
            }
            // An ACL is validated, and one the mode says all of is not stored.
            let mut value = value.map(<[u8]>::to_vec);
            let mut acl_mode = None;
            if let (Some(kind), Some(v)) = (acl_kind, value.as_deref()) {
                match acl::Acl::parse(v)? {
                    None => value = None,
                    Some(a) => {
                        if kind == acl::Kind::Access {
                            acl_mode = Some(a.mode_bits());
                        }
                        value = (kind == acl::Kind::Default || !a.is_minimal()).then(|| a.encode());
                    }
                }
            }
            let blocks = value
                .as_deref()
                .map_or(0, |v| value_blocks(self.bs as usize, name, v.len()).1);
            let mut st = self.write_state();
            let inode = self.load(&mut st, ino)?.inode.clone();
            crate::fs::rules::iflags::may_change(&inode)?;
            if acl_kind == Some(acl::Kind::Default) && !inode.is_dir() && value.is_some() {
                return Err(FsError::Access);
            }
            // Removing an ACL that is not there is no error for the ACL names (setfacl -b on a file
            // with none; an ACL equal to the mode replaces whatever was there).
            let exists = acl_kind.is_some() && self.xattr_lookup(&st, ino, name)?.is_some();
            if acl_kind.is_some() && value.is_none() && !exists && acl_mode.is_none() {
                return Ok(());
            }
            self.space_check(st.hdr.get_mut(), 2 + blocks, Reserve::Keep)?;
            let mut forced = false;
            loop {
                let now = self.now();
                let r = self.with_tx(&mut st, |t, inodes| {
                    match (&value, acl_kind) {
                        (None, Some(_)) if !exists => {}
                        _ => put(t, ino, name, value.as_deref(), flags)?,
                    }
                    let m = Fs::inode_mut(t, inodes, ino)?;
                    if let Some(bits) = acl_mode {
                        m.inode.mode = (m.inode.mode & !0o777) | bits;
                        if !self.in_group_or_root(cred, m.inode.gid) {
                            m.inode.mode &= !crate::fs::items::inode::S_ISGID;
                        }
                    }
                    self.touch_ctime(m, now);
                    log_inode(t, m, &self.stats)?;
                    Ok(((), vec![ino]))
                });
                match r {
                    // A value in blocks needs them contiguous, which the count above does not
                    // promise: if only busy extents would fit, make them usable and try once more
                    // (nothing was logged: the allocation comes before any change).
                    Err(FsError::NoSpace)
                        if blocks > 0 && !forced && !self.lock_busy().is_empty() =>
                    {
                        if crate::fs::txn::retry::may_retry() {
                            return Err(FsError::Retry(crate::fs::txn::retry::Retry::ForceLog));
                        }
                        self.journal.force_all()?;
                        forced = true;
                    }
                    r => return r.map(drop),
                }
            }
        })
    }
}
