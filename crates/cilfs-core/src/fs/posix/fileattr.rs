//! The inode flags users set, the project ID and the extent size hint, as chattr, lsattr,
//! `xfs_io chproj` and `xfs_io extsize` reach them (the rules in `fs/rules/iflags.rs` and
//! `fs/rules/extsize.rs`).

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::inode::INODE_USER_FLAGS;
use crate::fs::rules::{extsize, iflags};
use crate::fs::types::{Capability, Cred, FileAttr, Reserve, ATTR_HINT_FLAGS};
use crate::fs::{log_inode, Fs};

impl Fs {
    /// The flags, project and extent size hint of `ino`.
    pub fn file_attr(&self, ino: u64) -> FsResult<FileAttr> {
        self.op();
        self.retrying(|| {
            let st = self.read_state();
            let i = self.peek_inode(&st, ino)?;
            // The item bounds the hint in blocks; in bytes it must fit fsx_extsize, as every
            // hint set does.
            let extsize =
                u32::try_from(u64::from(i.extsize) * u64::from(self.bs)).map_err(|_| {
                    FsError::corrupt(
                        0,
                        format!(
                            "inode {ino} has an extent size hint of {} blocks, past 4 GiB",
                            i.extsize
                        ),
                    )
                })?;
            Ok(FileAttr {
                flags: (i.flags & INODE_USER_FLAGS) | extsize::flags_of(&i),
                project: i.project,
                extsize,
            })
        })
    }

    /// Sets `ino`'s flags to `want.flags`, its project to `want.project` and its extent size
    /// hint to `want.extsize`: flags and hint by the owner or root (immutable and append-only
    /// by root only), a project by root only (the project is the tenant its IO is charged to,
    /// `fs/tenant.rs`). The hint as XFS takes it (`fs/rules/extsize.rs`; `want.flags` carries
    /// its flag), else `FsError::Invalid`.
    pub fn set_file_attr(&self, cred: Cred, ino: u64, want: FileAttr) -> FsResult<FileAttr> {
        self.op();
        self.check_writable()?;
        let now = self.now();
        let r = self.retrying(|| {
            // Pages waiting for blocks count as the file's data blocks (XFS's delayed blocks).
            let delayed = self.read_state().cache.delalloc_of(ino);
            self.with_shared_tx(&[ino], |st, t, sc| {
                let fs_blocks = t.hdr.data_end.saturating_sub(t.hdr.data_start);
                let m = sc.load(st, t, ino)?;
                let flags = want.flags & !ATTR_HINT_FLAGS;
                iflags::may_set(cred, &m.inode, flags, |c| self.capable(cred, c))?;
                if want.project != m.inode.project && !self.capable(cred, Capability::SysAdmin) {
                    return Err(FsError::NotPermitted);
                }
                let with_delayed = crate::fs::items::inode::Inode {
                    blocks: m.inode.blocks + delayed,
                    ..m.inode.clone()
                };
                let hint =
                    extsize::hint_for(&with_delayed, want.flags, want.extsize, self.bs, fs_blocks)?;
                let grows = m.inode.extsize == 0 && hint != 0;
                m.inode.flags = (m.inode.flags & !INODE_USER_FLAGS) | flags;
                m.inode.project = want.project;
                m.inode.extsize = hint;
                self.touch_ctime(m, now);
                let set = FileAttr {
                    flags: flags | extsize::flags_of(&m.inode),
                    extsize: if hint == 0 { 0 } else { want.extsize },
                    ..want
                };
                log_inode(t, m, &self.stats)?;
                // A hint makes the inode's item longer, which may split its leaf.
                if grows {
                    sc.need_space(self, &t.hdr, 4, Reserve::Use)?;
                }
                Ok((set, vec![ino]))
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
