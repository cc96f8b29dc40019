//! rename(2) with RENAME_NOREPLACE and RENAME_EXCHANGE: one transaction that moves a name,
//! replaces or swaps the target, and fixes parents and link counts.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::dir::{self, check_name, DirEntry};
use crate::fs::items::header::TREE_FS;
use crate::fs::items::inode::FileType;
use crate::fs::posix::namei::{dir_add, dir_is_empty, dir_lookup, dir_remove};
use crate::fs::rules::iflags;
use crate::fs::types::{RenameFlags, Reserve, LINK_MAX};
use crate::fs::{log_inode, Fs, FsState};

impl Fs {
    pub fn rename(
        &self,
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
            // The new name may split a directory leaf, a replaced inode adds an orphan entry.
            self.space_check(st.hdr.get_mut(), 4, Reserve::Quarter)?;
            let now = self.now();
            let replaced = dst.as_ref().map(|d| d.ino);
            self.with_tx(&mut st, |t, inodes| {
                dir_remove(t, parent, name)?;
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
                if let Some(d) = &dst {
                    self.drop_link(t, inodes, d.ino, now)?;
                    touched.push(d.ino);
                }
                self.entry_removed(t, inodes, parent, src_dir, now)?;
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
            Ok(replaced)
        })?;
        match replaced {
            Some(ino) => self.reclaim_unused(ino),
            None => Ok(()),
        }
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
