//! The inode flags users set and the project ID, as chattr, lsattr and `xfs_io chproj` reach
//! them (the rules in `fs/rules/iflags.rs`).

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::inode::INODE_USER_FLAGS;
use crate::fs::rules::iflags;
use crate::fs::types::{Capability, Cred, FileAttr};
use crate::fs::{log_inode, Fs};

impl Fs {
    /// The flags and project of `ino`.
    pub fn file_attr(&self, ino: u64) -> FsResult<FileAttr> {
        self.op();
        self.retrying(|| {
            let st = self.read_state();
            let i = self.peek_inode(&st, ino)?;
            Ok(FileAttr {
                flags: i.flags & INODE_USER_FLAGS,
                project: i.project,
            })
        })
    }

    /// Sets `ino`'s flags to `want.flags` and its project to `want.project`: flags by the
    /// owner or root (immutable and append-only by root only), a project by root only (the
    /// project is the tenant its IO is charged to, `fs/tenant.rs`).
    pub fn set_file_attr(&self, cred: Cred, ino: u64, want: FileAttr) -> FsResult<FileAttr> {
        self.op();
        self.check_writable()?;
        let now = self.now();
        let r = self.retrying(|| {
            self.with_shared_tx(&[ino], |st, t, sc| {
                let m = sc.load(st, t, ino)?;
                iflags::may_set(cred, &m.inode, want.flags, |c| self.capable(cred, c))?;
                if want.project != m.inode.project && !self.capable(cred, Capability::SysAdmin) {
                    return Err(FsError::NotPermitted);
                }
                m.inode.flags = (m.inode.flags & !INODE_USER_FLAGS) | want.flags;
                m.inode.project = want.project;
                self.touch_ctime(m, now);
                log_inode(t, m, &self.stats)?;
                Ok((want, vec![ino]))
            })
        })?;
        // The kernel's copy of ctime is stale now (its reply carried no attributes).
        self.attrs_changed(ino);
        Ok(r)
    }
}

impl Fs {
    /// Opens `ino` (`open_inode`) for reading, or for writing (`write`) with O_APPEND or not
    /// (`append`): an immutable file opens for reading only, an append-only one for writing
    /// only with O_APPEND (Linux's `may_open`; the FUSE kernel does not know the flags).
    pub fn open_as(&self, ino: u64, write: bool, append: bool) -> FsResult<crate::fs::Attr> {
        if write {
            let i = self.retrying(|| self.peek_inode(&self.read_state(), ino))?;
            iflags::may_open(&i, write, append)?;
        }
        self.open_inode(ino)
    }
}
