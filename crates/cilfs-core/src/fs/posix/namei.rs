//! Names: lookup, create (mknod, mkdir, symlink), readlink, link, unlink and rmdir, and the
//! directory-entry steps they and rename share (find, add and remove an entry).

use crate::fs::cache::inode_cache::InodeMap;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::dir::{self, check_name, decode_bucket, DirEntry};
use crate::fs::items::header::TREE_FS;
use crate::fs::items::inode::{Attr, FileType, Inode, Timespec, S_IFDIR, S_IFLNK, S_IFMT, S_ISGID};
use crate::fs::posix::xattr;
use crate::fs::rules::change::ChangeCounter;
use crate::fs::rules::{acl, iflags};
use crate::fs::tree::keys::{
    key, kind_of, name_hash, KIND_DIRENT, KIND_INODE, KIND_ORPHAN, KIND_SYMLINK, ORPHAN_OWNER,
};
use crate::fs::txn::shared_tx::{Scratch, StateRef};
use crate::fs::txn::TreeRead;
use crate::fs::txn::{FsTx, Trees};
use crate::fs::types::XattrFlags;
use crate::fs::types::{Cred, Reserve, LINK_MAX, SYMLINK_CHUNK, SYMLINK_MAX};
use crate::fs::{log_inode, Fs, InodeMem};

/// Whether `ino` has no item in the fs tree but its inode item: no extents, xattrs or symlink
/// target.
fn only_inode_item(t: &mut FsTx<'_>, ino: u64) -> FsResult<bool> {
    Ok(t.seek_ge(TREE_FS, key(ino, KIND_INODE + 1, 0))?
        .is_none_or(|(k, _)| k.a != ino))
}

/// The blocks the ACLs a new inode inherits take outside the tree.
pub(crate) fn acl_blocks(bs: u32, acls: &[Option<Vec<u8>>; 2]) -> u64 {
    acls.iter()
        .flatten()
        .map(|v| xattr::value_blocks(bs as usize, acl::DEFAULT, v.len()).1)
        .sum()
}

/// One directory's entries changing inside a transaction.
pub(crate) fn dir_add(t: &mut FsTx<'_>, dir: u64, e: &DirEntry) -> FsResult<()> {
    let k = key(dir, KIND_DIRENT, crate::fs::tree::keys::name_hash(&e.name));
    let mut bucket = match t.get(TREE_FS, k)? {
        Some(v) => dir::decode_slotted(&v, dir)?,
        None => Vec::new(),
    };
    // Only when many names share one 56-bit hash (made on purpose): as ext4 when its index
    // cannot split a run of one hash.
    let slot = dir::free_slot(&bucket).ok_or(FsError::NoSpace)?;
    bucket.push((slot, e.clone()));
    let v = dir::encode_bucket(&bucket);
    if v.len() > crate::fs::tree::node::max_value_bytes(t.tx_block_size()) {
        return Err(FsError::NoSpace);
    }
    t.insert(TREE_FS, k, &v)?;
    Ok(())
}

pub(crate) fn dir_remove(t: &mut FsTx<'_>, dir: u64, name: &[u8]) -> FsResult<DirEntry> {
    let k = key(dir, KIND_DIRENT, crate::fs::tree::keys::name_hash(name));
    let Some(v) = t.get(TREE_FS, k)? else {
        return Err(FsError::NotFound);
    };
    // The others keep their slots: a reader's cookie names a slot, and a removal must not
    // move an entry it has not returned yet below it.
    let mut bucket = dir::decode_slotted(&v, dir)?;
    let Some(i) = bucket.iter().position(|(_, e)| e.name == name) else {
        return Err(FsError::NotFound);
    };
    let (_, e) = bucket.remove(i);
    if bucket.is_empty() {
        t.remove(TREE_FS, k)?;
    } else {
        t.insert(TREE_FS, k, &dir::encode_bucket(&bucket))?;
    }
    Ok(e)
}

/// The entry `name` of directory `dir`, if any.
pub(crate) fn dir_lookup(
    t: &mut dyn TreeRead,
    tree: u8,
    dir: u64,
    name: &[u8],
) -> FsResult<Option<DirEntry>> {
    let k = key(dir, KIND_DIRENT, name_hash(name));
    let Some(v) = t.t_get(tree, k)? else {
        return Ok(None);
    };
    Ok(decode_bucket(&v, dir)?.into_iter().find(|e| e.name == name))
}

/// Whether the directory has any entry.
pub(crate) fn dir_is_empty(t: &mut dyn TreeRead, tree: u8, dir: u64) -> FsResult<bool> {
    let first = t.t_seek_ge(tree, key(dir, KIND_DIRENT, 0))?;
    Ok(!first.is_some_and(|(k, _)| k.a == dir && kind_of(k) == KIND_DIRENT))
}

impl Fs {
    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        self.op();
        if name.len() > dir::NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        self.retrying(|| {
            let st = self.read_state();
            let p = self.peek_inode(&st, parent)?;
            // "." of any inode is itself: how the kernel finds an inode it forgot, by number,
            // from an NFS or open_by_handle_at file handle (FUSE_EXPORT_SUPPORT).
            if name == b"." {
                if p.nlink == 0 {
                    return Err(FsError::NotFound);
                }
                return Ok(self.with_delalloc(&st, p.attr(self.bs)));
            }
            if !p.is_dir() {
                return Err(FsError::NotDir);
            }
            let ino = match name {
                b"." => parent,
                b".." => p.parent,
                _ => {
                    let mut v = self.view(&st);
                    match dir_lookup(&mut v, TREE_FS, parent, name)? {
                        Some(e) => e.ino,
                        None => return Err(FsError::NotFound),
                    }
                }
            };
            Ok(self.with_delalloc(&st, self.peek_inode(&st, ino)?.attr(self.bs)))
        })
    }

    /// mknod for every non-directory type except symlinks: regular files, fifos, sockets and
    /// devices. `mode` carries the type bits.
    pub fn mknod(
        &self,
        cred: Cred,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> FsResult<Attr> {
        let kind = FileType::from_mode(mode).ok_or(FsError::Invalid("unknown file type"))?;
        if matches!(kind, FileType::Directory | FileType::Symlink) {
            return Err(FsError::Invalid("mknod of a directory or symlink"));
        }
        self.once_more_after_releases(|| self.create_node(cred, parent, name, mode, rdev, None))
    }

    pub fn mkdir(&self, cred: Cred, parent: u64, name: &[u8], mode: u32) -> FsResult<Attr> {
        let mode = S_IFDIR | (mode & 0o7777);
        self.once_more_after_releases(|| self.create_node(cred, parent, name, mode, 0, None))
    }

    pub fn symlink(&self, cred: Cred, parent: u64, name: &[u8], target: &[u8]) -> FsResult<Attr> {
        if target.is_empty() {
            return Err(FsError::NotFound);
        }
        if target.len() > SYMLINK_MAX {
            return Err(FsError::NameTooLong);
        }
        self.once_more_after_releases(|| {
            self.create_node(cred, parent, name, S_IFLNK | 0o777, 0, Some(target))
        })
    }

    fn create_node(
        &self,
        cred: Cred,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        target: Option<&[u8]>,
    ) -> FsResult<Attr> {
        self.op();
        check_name(name)?;
        self.check_writable()?;
        self.retrying(|| {
            let _names = self.lock_names(parent)?;
            self.with_shared_tx(&[parent], |st, t, sc| {
                self.create_in(st, t, sc, cred, parent, name, mode, rdev, target)
            })
        })
    }

    /// Holds directory `dir`'s names for a create, link or unlink in it (VFS's i_rwsem, on
    /// the directory's IO lock, which no data IO uses): each changes the directory's inode, so
    /// built side by side they conflicted at publish and ran again (two threads creating in
    /// one directory made 0.65x one thread's creates, and 130,789 conflicts in 3 s). Only
    /// operations in the same directory wait for it, as for any inode's IO lock. Taken in each
    /// run of the operation (`retrying`), so that the waits between runs and a `sync` mount's
    /// force after the last one happen without it (creates in one directory still share
    /// forces), and let go before an unlink's reclaim waits for its victim's.
    /// A "directory" that is a file in memory is refused when its lock is taken rather than
    /// after the wait: a file's IO lock is held across its data IO, which may be slow or
    /// throttled, and the operation would then only find it no directory.
    fn lock_names(&self, dir: u64) -> FsResult<crate::fs::cache::iolock::IoGuard<'_>> {
        self.io
            .lock_unless(dir, crate::fs::cache::iolock::IoMode::Exclusive, || {
                self.read_state()
                    .inodes
                    .lock(dir)
                    .get(&dir)
                    .is_some_and(|m| !m.inode.is_dir())
            })
            .ok_or(FsError::NotDir)
    }

    /// The body of `create_node`, built optimistically (`shared_tx.rs`).
    #[allow(clippy::too_many_arguments)]
    fn create_in(
        &self,
        st: &StateRef<'_>,
        t: &mut FsTx<'_>,
        sc: &mut Scratch,
        cred: Cred,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        target: Option<&[u8]>,
    ) -> FsResult<(Attr, Vec<u64>)> {
        let p = sc.load(st, t, parent)?.inode.clone();
        if !p.is_dir() {
            return Err(FsError::NotDir);
        }
        if p.nlink == 0 {
            return Err(FsError::NotFound);
        }
        iflags::may_add_entry(&p)?;
        let is_dir = mode & S_IFMT == S_IFDIR;
        if is_dir && p.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        if dir_lookup(t, TREE_FS, parent, name)?.is_some() {
            return Err(FsError::Exists);
        }
        let (mode, acls) = self.inherited_mode(t, cred, parent, mode, is_dir, target)?;
        let acl_blocks = acl_blocks(self.bs, &acls);
        sc.need_space(self, &t.hdr, 4 + acl_blocks, Reserve::Keep)?;
        let now = self.now();
        let bs = self.bs;
        let size = target.map_or(0, |t| t.len() as u64);
        let m = self.new_inode(t, cred, &p, mode, rdev, size, acls, now)?;
        let ino = m.inode.ino;
        let inodes = &mut sc.inodes;
        if let Some(target) = target {
            for (i, chunk) in target.chunks(SYMLINK_CHUNK).enumerate() {
                t.insert(TREE_FS, key(ino, KIND_SYMLINK, i as u64), chunk)?;
            }
        }
        let kind = m.inode.kind().unwrap_or(FileType::Regular);
        dir_add(
            t,
            parent,
            &DirEntry {
                ino,
                kind,
                name: name.to_vec(),
            },
        )?;
        let attr = m.inode.attr(bs);
        inodes.insert(ino, Box::new(m));
        let pm = Fs::inode_mut(t, inodes, parent)?;
        pm.inode.mtime = now;
        pm.inode.size += 1;
        if is_dir {
            pm.inode.nlink += 1;
        }
        self.touch_ctime(pm, now);
        log_inode(t, pm, &self.stats)?;
        Ok((attr, vec![ino, parent]))
    }

    /// A new inode in directory `p` (not yet named), logged: its number from `p`'s run, its
    /// ACLs put, owned by `cred` with `p`'s group if `p` is set-group-ID (and then
    /// set-group-ID itself if a directory), `p`'s project and inherited extent size hint
    /// (`rules/extsize.rs`), linked once (a directory twice).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_inode(
        &self,
        t: &mut FsTx<'_>,
        cred: Cred,
        p: &Inode,
        mut mode: u32,
        rdev: u64,
        size: u64,
        acls: [Option<Vec<u8>>; 2],
        now: Timespec,
    ) -> FsResult<InodeMem> {
        let is_dir = mode & S_IFMT == S_IFDIR;
        let (uid, cred_gid) = cred.ids().ok_or(FsError::NoOwner)?;
        let ino = self.new_ino(t, is_dir, p.ino)?;
        let gid = if p.mode & S_ISGID != 0 {
            if is_dir {
                mode |= S_ISGID;
            }
            p.gid
        } else {
            cred_gid
        };
        let inode = Inode {
            ino,
            mode,
            uid,
            gid,
            nlink: if is_dir { 2 } else { 1 },
            size,
            disk_size: 0,
            dirty_from: crate::fs::items::inode::NOT_DIRTY,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            rdev,
            change: 0,
            flags: 0,
            parent: if is_dir { p.ino } else { 0 },
            project: p.project,
            extsize: crate::fs::rules::extsize::inherited(p, mode),
        };
        let mut m = InodeMem {
            inode,
            change: ChangeCounter::created(0),
            open: 0,
            last_seq: 0,
            last_data_seq: 0,
            unlogged: false,
            spec_prealloc: Vec::new(),
            stale_prealloc: false,
            freeing: false,
        };
        // A header whose mark fell behind the numbers in use must not make a create write over
        // a live inode: the insert finds the key taken, and the transaction, dropped, writes
        // nothing.
        if log_inode(t, &mut m, &self.stats)? {
            return Err(FsError::corrupt(
                self.hdr_blk,
                format!(
                    "inode number {ino}, handed out from the header's next inode number {}, is \
                     in use",
                    t.hdr.next_ino
                ),
            ));
        }
        for (name, v) in [acl::ACCESS, acl::DEFAULT].into_iter().zip(&acls) {
            if let Some(v) = v {
                xattr::put(t, ino, name, Some(v), XattrFlags::default())?;
            }
        }
        Ok(m)
    }

    /// The mode of a new node and its ACLs (access, default): a parent's default ACL becomes
    /// the new node's access ACL (and a directory's default), masked by the mode asked for;
    /// without one the umask applies. Symlinks have neither.
    pub(crate) fn inherited_mode(
        &self,
        t: &mut FsTx<'_>,
        cred: Cred,
        parent: u64,
        mode: u32,
        is_dir: bool,
        target: Option<&[u8]>,
    ) -> FsResult<(u32, [Option<Vec<u8>>; 2])> {
        let inherited = match self.opts.acl && target.is_none() {
            true => match self.xattr_lookup_in(t, parent, acl::DEFAULT)? {
                Some(v) => acl::Acl::parse(&v).map_err(|_| {
                    FsError::corrupt(0, format!("directory {parent}: malformed default ACL"))
                })?,
                None => None,
            },
            false => None,
        };
        Ok(match inherited {
            Some(default) => {
                let mut access = default.clone();
                let mode = access.create_mask(mode);
                let access = (!access.is_minimal()).then(|| access.encode());
                (mode, [access, is_dir.then(|| default.encode())])
            }
            None if target.is_none() => (mode & !(cred.umask & 0o777), [None, None]),
            None => (mode, [None, None]),
        })
    }

    /// A number for a new inode in `parent` (a directory's starts a run of its own), counted
    /// in `t`'s header; never one in use.
    fn new_ino(&self, t: &mut FsTx<'_>, is_dir: bool, parent: u64) -> FsResult<u64> {
        let (ino, run_end) = if is_dir {
            self.inos.alloc_dir()
        } else {
            self.inos.alloc(parent)
        }
        .ok_or_else(|| {
            FsError::corrupt(
                self.hdr_blk,
                format!(
                    "the header's next inode number {} leaves none below the limit {}",
                    t.hdr.next_ino,
                    crate::fs::items::inode::INO_LIMIT
                ),
            )
        })?;
        t.hdr.next_ino = t.hdr.next_ino.max(run_end);
        t.hdr.inode_count += 1;
        Ok(ino)
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        self.op();
        self.retrying(|| self.readlink_shared(ino))
    }

    fn readlink_shared(&self, ino: u64) -> FsResult<Vec<u8>> {
        let st = self.read_state();
        let i = self.peek_inode(&st, ino)?;
        if i.mode & S_IFMT != S_IFLNK {
            return Err(FsError::Invalid("not a symlink"));
        }
        // The size sizes the buffer: one past the longest target is damage, not an allocation.
        if i.size > SYMLINK_MAX as u64 {
            return Err(FsError::corrupt(
                0,
                format!("symlink {ino} of {} bytes", i.size),
            ));
        }
        let mut v = self.view(&st);
        let mut out = Vec::with_capacity(i.size as usize);
        let mut at = key(ino, KIND_SYMLINK, 0);
        while let Some((k, val)) = v.t_seek_ge(TREE_FS, at)? {
            if k.a != ino || kind_of(k) != KIND_SYMLINK {
                break;
            }
            out.extend_from_slice(&val);
            at = match k.succ() {
                Some(n) => n,
                None => break,
            };
        }
        if out.len() as u64 != i.size {
            return Err(FsError::corrupt(
                0,
                format!("symlink {ino} target is {} of {} bytes", out.len(), i.size),
            ));
        }
        Ok(out)
    }

    /// Built optimistically (`shared_tx.rs`), as creates are.
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> FsResult<Attr> {
        self.op();
        check_name(newname)?;
        self.check_writable()?;
        self.retrying(|| {
            let _names = self.lock_names(newparent)?;
            self.with_shared_tx(&[ino, newparent], |st, t, sc| {
                self.link_in(st, t, sc, ino, newparent, newname)
            })
        })
    }

    /// The body of `link`, built optimistically.
    fn link_in(
        &self,
        st: &StateRef<'_>,
        t: &mut FsTx<'_>,
        sc: &mut Scratch,
        ino: u64,
        newparent: u64,
        newname: &[u8],
    ) -> FsResult<(Attr, Vec<u64>)> {
        let target = sc.load(st, t, ino)?.inode.clone();
        if target.is_dir() {
            return Err(FsError::NotPermitted);
        }
        if target.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        // An orphan is named again only while open (a linkat of an O_TMPFILE, which the
        // kernel allows only for one made without O_EXCL): its release would free it.
        let orphan = target.nlink == 0;
        if orphan {
            if sc.load(st, t, ino)?.open == 0 {
                return Err(FsError::NotFound);
            }
            sc.held.push(ino);
        }
        iflags::may_change(&target)?;
        let p = sc.load(st, t, newparent)?.inode.clone();
        if !p.is_dir() {
            return Err(FsError::NotDir);
        }
        iflags::may_add_entry(&p)?;
        crate::fs::tenant::may_enter(&target, &p)?;
        if p.nlink == 0 {
            return Err(FsError::NotFound);
        }
        if dir_lookup(t, TREE_FS, newparent, newname)?.is_some() {
            return Err(FsError::Exists);
        }
        sc.need_space(self, &t.hdr, 2, Reserve::Keep)?;
        let now = self.now();
        dir_add(
            t,
            newparent,
            &DirEntry {
                ino,
                kind: target.kind().unwrap_or(FileType::Regular),
                name: newname.to_vec(),
            },
        )?;
        let pm = sc.load(st, t, newparent)?;
        pm.inode.mtime = now;
        pm.inode.size += 1;
        self.touch_ctime(pm, now);
        log_inode(t, pm, &self.stats)?;
        if orphan {
            t.remove(TREE_FS, key(ORPHAN_OWNER, KIND_ORPHAN, ino))?;
        }
        let m = sc.load(st, t, ino)?;
        m.inode.nlink += 1;
        self.touch_ctime(m, now);
        log_inode(t, m, &self.stats)?;
        Ok((m.inode.attr(self.bs), vec![ino, newparent]))
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        self.remove_entry(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        self.remove_entry(parent, name, true)
    }

    fn remove_entry(&self, parent: u64, name: &[u8], want_dir: bool) -> FsResult<()> {
        self.op();
        if name.len() > dir::NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        if want_dir && name == b"." {
            return Err(FsError::Invalid("rmdir of ."));
        }
        if want_dir && name == b".." {
            return Err(FsError::NotEmpty);
        }
        self.check_writable()?;
        let (victim, freed) = self.retrying(|| {
            let _names = self.lock_names(parent)?;
            self.with_shared_tx(&[parent], |st, t, sc| {
                self.remove_in(st, t, sc, parent, name, want_dir)
            })
        })?;
        if freed {
            return Ok(());
        }
        self.reclaim_unused(victim)
    }

    /// The body of `remove_entry`, built optimistically (`shared_tx.rs`): the victim's number,
    /// and whether it was freed outright.
    fn remove_in(
        &self,
        st: &StateRef<'_>,
        t: &mut FsTx<'_>,
        sc: &mut Scratch,
        parent: u64,
        name: &[u8],
        want_dir: bool,
    ) -> FsResult<((u64, bool), Vec<u64>)> {
        let p = sc.load(st, t, parent)?.inode.clone();
        if !p.is_dir() {
            return Err(FsError::NotDir);
        }
        let e = dir_lookup(t, TREE_FS, parent, name)?.ok_or(FsError::NotFound)?;
        let is_dir = e.kind == FileType::Directory;
        if want_dir && !is_dir {
            return Err(FsError::NotDir);
        }
        if !want_dir && is_dir {
            return Err(FsError::IsDir);
        }
        iflags::may_remove_entry(&p)?;
        iflags::may_change(&sc.load(st, t, e.ino)?.inode)?;
        if is_dir && !dir_is_empty(t, TREE_FS, e.ino)? {
            return Err(FsError::NotEmpty);
        }
        // Unlinking gives space back, but may split a node for the orphan entry first.
        sc.need_space(self, &t.hdr, 4, Reserve::Use)?;
        let now = self.now();
        let (m, has_pages) = sc.load_and(st, t, e.ino, |st| st.cache.has_pages(e.ino))?;
        let last_link = m.inode.is_dir() || m.inode.nlink <= 1;
        let unused = last_link
            && m.open == 0
            && !has_pages
            && self.io.idle(e.ino)
            && only_inode_item(t, e.ino)?;
        dir_remove(t, parent, name)?;
        self.entry_removed(t, &mut sc.inodes, parent, is_dir, now)?;
        if unused {
            // Nothing but the inode item, nobody holding it: free it in this transaction
            // rather than through the orphan list and two more.
            t.remove(TREE_FS, key(e.ino, KIND_INODE, 0))?;
            t.hdr.inode_count = t.hdr.inode_count.saturating_sub(1);
            sc.freed.push(e.ino);
        } else {
            self.drop_link(t, &mut sc.inodes, e.ino, now)?;
        }
        Ok(((e.ino, unused), vec![parent, e.ino]))
    }

    /// Directory `dir` lost an entry (of a directory when `was_dir`, whose ".." linked to it):
    /// its size, link count, mtime and ctime, logged.
    pub(crate) fn entry_removed(
        &self,
        t: &mut FsTx<'_>,
        inodes: &mut dyn InodeMap,
        dir: u64,
        was_dir: bool,
        now: Timespec,
    ) -> FsResult<()> {
        let pm = Fs::inode_mut(t, inodes, dir)?;
        pm.inode.mtime = now;
        pm.inode.size = pm.inode.size.saturating_sub(1);
        if was_dir {
            pm.inode.nlink = pm.inode.nlink.saturating_sub(1);
        }
        self.touch_ctime(pm, now);
        log_inode(t, pm, &self.stats).map(|_| ())
    }

    /// One name of `ino` went away: lower its link count; at zero it becomes an orphan, freed
    /// when nobody holds it open (or at the next mount after a crash).
    pub(crate) fn drop_link(
        &self,
        t: &mut FsTx<'_>,
        inodes: &mut dyn InodeMap,
        ino: u64,
        now: Timespec,
    ) -> FsResult<()> {
        let m = Fs::inode_mut(t, inodes, ino)?;
        if m.inode.is_dir() {
            m.inode.nlink = 0;
        } else {
            m.inode.nlink = m.inode.nlink.saturating_sub(1);
        }
        self.touch_ctime(m, now);
        log_inode(t, m, &self.stats)?;
        if m.inode.nlink == 0 {
            t.insert(TREE_FS, key(ORPHAN_OWNER, KIND_ORPHAN, ino), &[])?;
        }
        Ok(())
    }
}
