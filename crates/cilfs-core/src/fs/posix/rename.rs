//! rename(2) with RENAME_NOREPLACE, RENAME_EXCHANGE and RENAME_WHITEOUT: one transaction that
//! moves a name, replaces or swaps the target, leaves a whiteout if asked, and fixes parents
//! and link counts.

use crate::fs::cache::inode_cache::InodeMap;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::dir::{self, check_name, DirEntry};
use crate::fs::items::header::TREE_FS;
use crate::fs::items::inode::{FileType, Inode, Timespec, S_IFCHR};
use crate::fs::posix::namei::{dir_add, dir_is_empty, dir_lookup, dir_remove};
use crate::fs::rules::iflags;
use crate::fs::txn::FsTx;
use crate::fs::types::{Cred, RenameFlags, Reserve, LINK_MAX};
use crate::fs::{log_inode, Fs, FsState};

impl Fs {
    /// `rename_as` by root.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        self.rename_as(Cred::ROOT, parent, name, newparent, newname, flags)
    }

    /// rename(2) for `cred`, who owns the whiteout RENAME_WHITEOUT leaves (as XFS makes it:
    /// the caller's, with the directory's group if that is set-group-ID, and no ACL).
    pub fn rename_as(
        &self,
        cred: Cred,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        let replaced = self.retrying(|| {
            self.op();
            if name.len() > dir::NAME_MAX || newname.len() > dir::NAME_MAX {
                return Err(FsError::NameTooLong);
            }
            check_name(name)?;
            check_name(newname)?;
            if flags.noreplace && flags.exchange {
                return Err(FsError::Invalid("RENAME_NOREPLACE with RENAME_EXCHANGE"));
            }
            if flags.whiteout && flags.exchange {
                return Err(FsError::Invalid("RENAME_WHITEOUT with RENAME_EXCHANGE"));
            }
            self.check_writable()?;
            let mut st = self.write_state();
            for p in [parent, newparent] {
                if !self.load(&mut st, p)?.inode.is_dir() {
                    return Err(FsError::NotDir);
                }
            }
            let (src, dst) = {
                let mut v = self.view(&st);
                (
                    dir_lookup(&mut v, TREE_FS, parent, name)?.ok_or(FsError::NotFound)?,
                    dir_lookup(&mut v, TREE_FS, newparent, newname)?,
                )
            };
            let src_dir = src.kind == FileType::Directory;
            self.rename_flags_allow(&st, parent, src.ino, newparent, dst.as_ref().map(|d| d.ino))?;
            {
                let np = self.peek_inode(&st, newparent)?;
                crate::fs::tenant::may_enter(&self.peek_inode(&st, src.ino)?, &np)?;
                if let (true, Some(d)) = (flags.exchange, &dst) {
                    let op = self.peek_inode(&st, parent)?;
                    crate::fs::tenant::may_enter(&self.peek_inode(&st, d.ino)?, &op)?;
                }
            }
            if flags.exchange {
                let Some(dst) = dst else {
                    return Err(FsError::NotFound);
                };
                return self
                    .exchange(&mut st, parent, &src, newparent, &dst)
                    .map(|()| None);
            }
            if let Some(d) = &dst {
                if flags.noreplace {
                    return Err(FsError::Exists);
                }
                if d.ino == src.ino {
                    return Ok(None); // Two names of one inode: POSIX says do nothing.
                }
                let dst_dir = d.kind == FileType::Directory;
                if src_dir && !dst_dir {
                    return Err(FsError::NotDir);
                }
                if !src_dir && dst_dir {
                    return Err(FsError::IsDir);
                }
                if dst_dir {
                    let mut v = self.view(&st);
                    if !dir_is_empty(&mut v, TREE_FS, d.ino)? {
                        return Err(FsError::NotEmpty);
                    }
                }
            }
            if src_dir && parent != newparent {
                // A directory cannot move below itself.
                let mut at = newparent;
                loop {
                    if at == src.ino {
                        return Err(FsError::Invalid("rename of a directory into itself"));
                    }
                    let i = self.load(&mut st, at)?.inode.clone();
                    if i.parent == at || i.parent == 0 {
                        break;
                    }
                    at = i.parent;
                }
                if self.load(&mut st, newparent)?.inode.nlink >= LINK_MAX {
                    return Err(FsError::TooManyLinks);
                }
            }
            let replaced = dst.as_ref().map(|d| d.ino);
            let names = [(parent, name), (newparent, newname)];
            self.move_entry(&mut st, cred, names, &src, dst.as_ref(), flags.whiteout)?;
            Ok(replaced)
        })?;
        match replaced {
            Some(ino) => self.reclaim_unused(ino),
            None => Ok(()),
        }
    }

    /// The transaction of a rename that is no exchange: `src`, found in the first of `names`
    /// (directory, name), moves to the second, replacing `dst` if any, and leaves a whiteout if
    /// asked.
    fn move_entry(
        &self,
        st: &mut FsState,
        cred: Cred,
        names: [(u64, &[u8]); 2],
        src: &DirEntry,
        dst: Option<&DirEntry>,
        whiteout: bool,
    ) -> FsResult<()> {
        let [(parent, name), (newparent, newname)] = names;
        let src_dir = src.kind == FileType::Directory;
        // The new name may split a directory leaf, a replaced inode adds an orphan entry,
        // a whiteout its inode.
        let need = if whiteout { 6 } else { 4 };
        self.space_check(st.hdr.get_mut(), need, Reserve::Quarter)?;
        let now = self.now();
        let pdir = self.load(st, parent)?.inode.clone();
        self.with_tx(st, |t, inodes| {
            dir_remove(t, parent, name)?;
            let whiteout = match whiteout {
                true => Some(self.add_whiteout(t, inodes, cred, &pdir, name, now)?),
                false => None,
            };
            if dst.is_some() {
                dir_remove(t, newparent, newname)?;
            }
            dir_add(
                t,
                newparent,
                &DirEntry {
                    ino: src.ino,
                    kind: src.kind,
                    name: newname.to_vec(),
                },
            )?;
            let mut touched = vec![parent, newparent, src.ino];
            touched.extend(whiteout);
            if let Some(d) = dst {
                self.drop_link(t, inodes, d.ino, now)?;
                touched.push(d.ino);
            }
            self.entry_removed(t, inodes, parent, src_dir, now)?;
            if whiteout.is_some() {
                // The source's name stays, held by the whiteout.
                let pm = Fs::inode_mut(t, inodes, parent)?;
                pm.inode.size += 1;
                log_inode(t, pm, &self.stats)?;
            }
            {
                let np = Fs::inode_mut(t, inodes, newparent)?;
                np.inode.mtime = now;
                if dst.is_none() {
                    np.inode.size += 1;
                }
                // A directory moved in adds a link (its ".."); one replaced takes its own away.
                if src_dir {
                    np.inode.nlink += 1;
                    if dst.is_some() {
                        np.inode.nlink = np.inode.nlink.saturating_sub(1);
                    }
                }
                self.touch_ctime(np, now);
                log_inode(t, np, &self.stats)?;
            }
            let sm = Fs::inode_mut(t, inodes, src.ino)?;
            if src_dir {
                sm.inode.parent = newparent;
            }
            self.touch_ctime(sm, now);
            log_inode(t, sm, &self.stats)?;
            Ok(((), touched))
        })?;
        Ok(())
    }

    /// Makes a whiteout named `name` in directory `dir` (the source's name a rename just
    /// took away) in transaction `t`: overlayfs's mark of a name deleted above a lower layer.
    fn add_whiteout(
        &self,
        t: &mut FsTx<'_>,
        inodes: &mut dyn InodeMap,
        cred: Cred,
        dir: &Inode,
        name: &[u8],
        now: Timespec,
    ) -> FsResult<u64> {
        let w = self.new_inode(t, cred, dir, S_IFCHR, 0, 0, [None, None], now)?;
        let ino = w.inode.ino;
        dir_add(
            t,
            dir.ino,
            &DirEntry {
                ino,
                kind: FileType::CharDevice,
                name: name.to_vec(),
            },
        )?;
        inodes.insert(ino, Box::new(w));
        Ok(ino)
    }

    /// Linux's `may_delete` and `may_create` for the inode flags: the names leave `parent`
    /// (and `newparent`, for a replaced or exchanged target) and come into `newparent` (and
    /// `parent`); the inodes moved or replaced are neither immutable nor append-only.
    fn rename_flags_allow(
        &self,
        st: &FsState,
        parent: u64,
        src: u64,
        newparent: u64,
        dst: Option<u64>,
    ) -> FsResult<()> {
        iflags::may_remove_entry(&self.peek_inode(st, parent)?)?;
        iflags::may_change(&self.peek_inode(st, src)?)?;
        let np = self.peek_inode(st, newparent)?;
        match dst {
            Some(d) => {
                iflags::may_remove_entry(&np)?;
                iflags::may_change(&self.peek_inode(st, d)?)
            }
            None => iflags::may_add_entry(&np),
        }
    }

    fn exchange(
        &self,
        st: &mut FsState,
        p1: u64,
        a: &DirEntry,
        p2: u64,
        b: &DirEntry,
    ) -> FsResult<()> {
        if a.ino == b.ino {
            return Ok(());
        }
        let a_dir = a.kind == FileType::Directory;
        let b_dir = b.kind == FileType::Directory;
        if p1 != p2 {
            // Neither directory may end up below itself.
            for (moving, into) in [(a, p2), (b, p1)] {
                if moving.kind != FileType::Directory {
                    continue;
                }
                let mut at = into;
                loop {
                    if at == moving.ino {
                        return Err(FsError::Invalid(
                            "exchange would move a directory into itself",
                        ));
                    }
                    let i = self.load(st, at)?.inode.clone();
                    if i.parent == at || i.parent == 0 {
                        break;
                    }
                    at = i.parent;
                }
            }
        }
        let now = self.now();
        self.with_tx(st, |t, inodes| {
            dir_remove(t, p1, &a.name)?;
            dir_remove(t, p2, &b.name)?;
            dir_add(
                t,
                p1,
                &DirEntry {
                    ino: b.ino,
                    kind: b.kind,
                    name: a.name.clone(),
                },
            )?;
            dir_add(
                t,
                p2,
                &DirEntry {
                    ino: a.ino,
                    kind: a.kind,
                    name: b.name.clone(),
                },
            )?;
            let links = |dir: bool| i64::from(dir);
            let d1 = links(b_dir) - links(a_dir);
            for (p, d) in [(p1, d1), (p2, -d1)] {
                let pm = Fs::inode_mut(t, inodes, p)?;
                pm.inode.mtime = now;
                if p1 != p2 {
                    pm.inode.nlink = (i64::from(pm.inode.nlink) + d).max(0) as u32;
                }
                self.touch_ctime(pm, now);
                log_inode(t, pm, &self.stats)?;
                if p1 == p2 {
                    break;
                }
            }
            for (ino, newp) in [(a.ino, p2), (b.ino, p1)] {
                let m = Fs::inode_mut(t, inodes, ino)?;
                if m.inode.is_dir() {
                    m.inode.parent = newp;
                }
                self.touch_ctime(m, now);
                log_inode(t, m, &self.stats)?;
            }
            Ok(((), vec![p1, p2, a.ino, b.ino]))
        })?;
        Ok(())
    }
}
