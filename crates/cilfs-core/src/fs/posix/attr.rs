//! Attributes: getattr, setattr (mode, owner, size, times), statfs and the change attribute.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::dir::{self};
use crate::fs::items::inode::{Attr, S_IFMT};
use crate::fs::posix::xattr;
use crate::fs::posix::xattr::drop_caps;
use crate::fs::rules::{acl, iflags};
use crate::fs::stats::bump;
use crate::fs::types::XattrFlags;
use crate::fs::types::{Capability, Cred, SetAttr, SetTime, StatFs, RESERVE_BLOCKS};
use crate::fs::{log_inode, Fs, FsState};

impl Fs {
    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        self.op();
        self.retrying(|| {
            let st = self.read_state();
            Ok(self.with_delalloc(&st, self.peek_inode(&st, ino)?.attr(self.bs)))
        })
    }

    /// `a` with the blocks promised to its pages that wait for blocks counted in, as stat
    /// shows them on XFS: `du` right after a write sees the file's space.
    pub(crate) fn with_delalloc(&self, st: &FsState, mut a: Attr) -> Attr {
        let n = st.cache.delalloc_of(a.ino);
        a.blocks_512 = a
            .blocks_512
            .saturating_add(n.saturating_mul(u64::from(self.bs / 512)));
        a
    }

    pub fn setattr(&self, cred: Cred, ino: u64, sa: SetAttr) -> FsResult<Attr> {
        self.retrying(|| {
            self.op();
            self.check_writable()?;
            // A mode that comes with a size is the kernel's own clearing of set-user-ID, by an
            // older rule and from the mode before the truncate: what the truncate cleared stays so.
            // Nanoseconds past a second are no time at all (utimensat's EINVAL); every second
            // an i64 holds is kept as given, since the inode item stores all of them and the
            // FUSE kernel clamps none (its superblock keeps the full time64 range).
            for t in [sa.atime, sa.mtime].into_iter().flatten() {
                if let SetTime::At(t) = t {
                    if t.nsec >= 1_000_000_000 {
                        return Err(FsError::Invalid("nanoseconds of a time past 999999999"));
                    }
                }
            }
            let truncate_killed = match sa.size {
                Some(size) => self.truncate(cred, ino, size)?,
                None => 0,
            };
            if sa.mode.is_none()
                && sa.uid.is_none()
                && sa.gid.is_none()
                && sa.atime.is_none()
                && sa.mtime.is_none()
            {
                let mut st = self.write_state();
                let a = self.load(&mut st, ino)?.inode.attr(self.bs);
                return Ok(self.with_delalloc(&st, a));
            }
            let now = self.now();
            let bs = self.bs;
            // Built optimistically (`shared_tx.rs`), as creates are: a chmod, chown or utimes
            // of one inode no longer stops every other operation (untar sets all three on
            // every file it makes).
            self.with_shared_tx(&[ino], |st, t, sc| {
                // chmod rewrites the access ACL's owner, mask and other entries.
                let acl = match sa.mode {
                    Some(_) if self.opts.acl => match self.xattr_lookup_in(t, ino, acl::ACCESS)? {
                        Some(v) => acl::Acl::parse(&v).map_err(|_| {
                            FsError::corrupt(0, format!("inode {ino}: malformed access ACL"))
                        })?,
                        None => None,
                    },
                    _ => None,
                };
                let m = sc.load(st, t, ino)?;
                // Times set to now need only write access, which append-only leaves.
                let explicit_time = [sa.atime, sa.mtime]
                    .iter()
                    .any(|s| matches!(s, Some(SetTime::At(_))));
                if sa.mode.is_some() || sa.uid.is_some() || sa.gid.is_some() || explicit_time {
                    iflags::may_change(&m.inode)?;
                } else {
                    iflags::may_touch(&m.inode)?;
                }
                if let Some(mode) = sa.mode {
                    m.inode.mode = (m.inode.mode & S_IFMT) | (mode & 0o7777 & !truncate_killed);
                    if let Some(mut a) = acl {
                        a.chmod(mode);
                        xattr::put(
                            t,
                            ino,
                            acl::ACCESS,
                            Some(&a.encode()),
                            XattrFlags::default(),
                        )?;
                    }
                }
                let chown = sa.uid.is_some() || sa.gid.is_some();
                if chown && !m.inode.is_dir() {
                    drop_caps(t, ino)?;
                }
                // Any chown, to the same owner too, as on Linux. A kernel without
                // FUSE_HANDLE_KILLPRIV_V2 sends the mode it computed with a chown, by an older rule
                // (no set-group-ID without group execute): the bits are cleared on top of it.
                let kill = match chown {
                    true => self.chown_kills(cred, &m.inode),
                    false => 0,
                };
                if let Some(uid) = sa.uid {
                    m.inode.uid = uid;
                }
                if let Some(gid) = sa.gid {
                    m.inode.gid = gid;
                }
                m.inode.mode &= !kill;
                let resolve = |s: SetTime| match s {
                    SetTime::Now => now,
                    SetTime::At(t) => t,
                };
                if let Some(a) = sa.atime {
                    m.inode.atime = resolve(a);
                }
                if let Some(mt) = sa.mtime {
                    m.inode.mtime = resolve(mt);
                }
                self.touch_ctime(m, now);
                log_inode(t, m, &self.stats)?;
                Ok((m.inode.attr(bs), vec![ino]))
            })
        })
    }

    /// Busy extents count as free and available, as XFS counts them: they belong to no file,
    /// only their reuse waits until the checkpoint that freed them is stable, and any operation
    /// that needs them forces the log first (`space_check`). Counting them as taken kept df
    /// 200 MiB short after deleting a 200 MiB file until some later transaction came after a
    /// checkpoint: `sync(1)` does not reach cilfs (no FUSE_SYNCFS), so nothing a user does
    /// brought it back. The free list's blocks are free but kept for the free-space trees'
    /// own nodes, and the reserve for operations that give space back, so neither is available.
    pub fn statfs(&self) -> StatFs {
        self.op();
        let st = self.read_state();
        // Blocks promised to pages that wait for them are as good as used.
        let promised = self.lock_busy().delalloc_blocks();
        let h = self.hdr(&st);
        let free = (h.free_blocks + h.freelist.len() as u64).saturating_sub(promised);
        let avail = h
            .free_blocks
            .saturating_sub(RESERVE_BLOCKS)
            .saturating_sub(promised);
        StatFs {
            blocks: h.data_end - h.data_start,
            bfree: free,
            bavail: avail,
            files: h.inode_count + avail,
            ffree: avail,
            bsize: self.bs,
            namelen: dir::NAME_MAX as u32,
        }
    }

    /// The filesystem label (FS_IOC_GETFSLABEL).
    pub fn label(&self) -> Vec<u8> {
        self.journal.superblock().label
    }

    /// Sets the label (FS_IOC_SETFSLABEL): root only (CAP_SYS_ADMIN), at most 255 bytes and
    /// no NUL; durable when it returns (`Journal::set_label`).
    pub fn set_label(&self, cred: Cred, label: &[u8]) -> FsResult<()> {
        self.op();
        if !self.capable(cred, Capability::SysAdmin) {
            return Err(FsError::NotPermitted);
        }
        if label.len() > crate::format::superblock::LABEL_MAX || label.contains(&0) {
            return Err(FsError::Invalid(
                "a label is at most 255 bytes, with no NUL",
            ));
        }
        self.check_writable()?;
        Ok(self.journal.set_label(label)?)
    }

    /// The change attribute (marks it queried): what `user.cilfs.change` and `cilfs stat
    /// --change` report.
    pub fn change_attr(&self, ino: u64) -> FsResult<u64> {
        self.op();
        bump(&self.stats.change_queries);
        // The counter is atomic: a cached inode is queried under the shared lock, so a querier
        // never waits for writers (nor they for it).
        self.retrying(|| {
            let st = self.read_state();
            if let Some(m) = st.inodes.lock(ino).get(&ino) {
                return Ok(crate::fs::visible_change(self.epoch, m.change.query()));
            }
            // Not in memory: the item's value, read (with no lock held if its block is not in
            // the buffer cache: `retrying`) and not cached. An inode loaded later starts
            // queried (`ChangeCounter::loaded`), so its next change moves the value past this.
            let inode = crate::fs::read_inode(&mut self.view(&st), ino)?;
            Ok(crate::fs::visible_change(self.epoch, inode.change))
        })
    }
}
