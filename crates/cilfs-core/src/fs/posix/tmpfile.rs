//! O_TMPFILE: a regular file made with no name, open, and an orphan from the transaction that
//! makes it, so that its last release, or the next mount after a crash, frees it
//! (`open.rs`); a link (`Fs::link`) names it and takes it off the orphan list in one
//! transaction.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::TREE_FS;
use crate::fs::items::inode::{Attr, S_IFMT, S_IFREG};
use crate::fs::log_inode;
use crate::fs::tree::keys::{key, KIND_ORPHAN, ORPHAN_OWNER};
use crate::fs::txn::shared_tx::{Scratch, StateRef};
use crate::fs::txn::FsTx;
use crate::fs::types::{Cred, Reserve};
use crate::fs::Fs;

impl Fs {
    /// A new unnamed regular file in directory `parent`, opened once (released with
    /// `release_inode`). Mode, umask, owner, set-group-ID directory and default ACL as for a
    /// create in `parent`; `mode` carries the type bits, which must say regular file.
    pub fn tmpfile(&self, cred: Cred, parent: u64, mode: u32) -> FsResult<Attr> {
        self.op();
        if mode & S_IFMT != S_IFREG {
            return Err(FsError::Invalid(
                "O_TMPFILE of another type than a regular file",
            ));
        }
        self.check_writable()?;
        // No name changes in `parent`: its names lock is not needed, and the optimistic
        // check covers the directory and the default ACL it read.
        self.retrying(|| {
            self.with_shared_tx(&[parent], |st, t, sc| {
                self.tmpfile_in(st, t, sc, cred, parent, mode)
            })
        })
    }

    /// The body of `tmpfile`, built optimistically (`shared_tx.rs`).
    fn tmpfile_in(
        &self,
        st: &StateRef<'_>,
        t: &mut FsTx<'_>,
        sc: &mut Scratch,
        cred: Cred,
        parent: u64,
        mode: u32,
    ) -> FsResult<(Attr, Vec<u64>)> {
        let p = sc.load(st, t, parent)?.inode.clone();
        if !p.is_dir() {
            return Err(FsError::NotDir);
        }
        if p.nlink == 0 {
            return Err(FsError::NotFound);
        }
        let (mode, acls) = self.inherited_mode(t, cred, parent, mode, false, None)?;
        let acl_blocks = super::namei::acl_blocks(self.bs, &acls);
        // The inode's leaf and the orphan item's may each split.
        sc.need_space(self, &t.hdr, 4 + acl_blocks, Reserve::Keep)?;
        let now = self.now();
        let mut m = self.new_inode(t, cred, &p, mode, 0, 0, acls, now)?;
        m.inode.nlink = 0;
        // Open from the commit that makes it: nobody can reclaim it before its opener has it.
        m.open = 1;
        // Logged again, unlinked (the same item, in the same transaction).
        log_inode(t, &mut m, &self.stats)?;
        let ino = m.inode.ino;
        t.insert(TREE_FS, key(ORPHAN_OWNER, KIND_ORPHAN, ino), &[])?;
        let attr = m.inode.attr(self.bs);
        sc.inodes.insert(ino, Box::new(m));
        Ok((attr, vec![ino]))
    }
}
