//! Inode lifetime: open counts, and orphans (unlinked inodes still open, or left by a crash)
//! freed at the last release or at the next mount.

use super::dir::TreeRead;
use super::error::FsResult;
use super::header::TREE_FS;
use super::inode::Attr;
use super::iolock::IoMode;
use super::stats::bump;
use super::tree::keys::{key, kind_of, offset_of, KIND_INODE, KIND_ORPHAN, ORPHAN_OWNER};
use super::tx::Trees;
use super::{Fs, FsState};

impl Fs {
    /// Frees `ino` if no name and no handle is left, under its IO lock (exclusive: a read or
    /// write back still in flight finishes before its blocks are freed) and outside any
    /// filesystem lock the caller held.
    pub(crate) fn reclaim_unused(&self, ino: u64) -> FsResult<()> {
        let unused = |st: &FsState| {
            st.inodes
                .get(&ino)
                .is_some_and(|m| m.inode.nlink == 0 && m.open == 0)
        };
        if self.opts.read_only || !unused(&self.read_state()) {
            return Ok(());
        }
        let _io = self.io.lock(ino, IoMode::Exclusive);
        self.retrying(|| {
            let mut st = self.write_state();
            self.reclaim_if_unused(&mut st, ino)
        })
    }

    pub(crate) fn reclaim_if_unused(&self, st: &mut FsState, ino: u64) -> FsResult<()> {
        let gone = st
            .inodes
            .get(&ino)
            .is_some_and(|m| m.inode.nlink == 0 && m.open == 0);
        if gone {
            self.reclaim(st, ino)?;
        }
        Ok(())
    }

    /// Frees an orphan: its extents, xattrs and symlink chunks (in transactions of bounded size,
    /// each consistent on its own), then the inode and its orphan item.
    pub(crate) fn reclaim(&self, st: &mut FsState, ino: u64) -> FsResult<()> {
        st.cache.drop_range(ino, 0, u64::MAX);
        // Everything keyed under the inode except the inode item itself, a bounded batch per
        // transaction.
        loop {
            let (done, _) = self.with_tx(st, |t, inodes| {
                let mut n = 0;
                let mut at = key(ino, KIND_INODE + 1, 0);
                // Bounded by items and by buffers (remote xattr values cancel their blocks).
                while n < 16 && t.tx.logged_buffers() < 32 {
                    let Some((k, v)) = t.seek_ge(TREE_FS, at)? else {
                        break;
                    };
                    if k.a != ino {
                        break;
                    }
                    if kind_of(k) == super::tree::keys::KIND_XATTR {
                        super::xattr::free_bucket(t, &v, ino)?;
                    }
                    if kind_of(k) == super::tree::keys::KIND_EXTENT {
                        let ext = super::extent::Extent::decode(offset_of(k), &v)?;
                        t.free_extent(ext.disk, ext.len)?;
                        if let Some(m) = inodes.get_mut(&ino) {
                            m.inode.blocks = m.inode.blocks.saturating_sub(ext.len);
                        }
                    }
                    t.remove(TREE_FS, k)?;
                    n += 1;
                    at = k;
                }
                Ok((n < 16 && t.tx.logged_buffers() < 32, vec![]))
            })?;
            if done {
                break;
            }
        }
        self.with_tx(st, |t, inodes| {
            t.remove(TREE_FS, key(ino, KIND_INODE, 0))?;
            t.remove(TREE_FS, key(ORPHAN_OWNER, KIND_ORPHAN, ino))?;
            t.hdr.inode_count = t.hdr.inode_count.saturating_sub(1);
            inodes.remove(&ino);
            Ok(((), vec![]))
        })?;
        bump(&self.stats.orphans_reclaimed);
        Ok(())
    }

    /// Frees every orphan an earlier mount left (files unlinked while open, then a crash).
    pub(crate) fn reclaim_orphans(&self) -> FsResult<()> {
        let mut st = self.write_state();
        loop {
            let next = {
                let mut v = self.view(&st);
                v.t_seek_ge(TREE_FS, key(ORPHAN_OWNER, KIND_ORPHAN, 0))?
            };
            let Some((k, _)) = next else { break };
            if k.a != ORPHAN_OWNER || kind_of(k) != KIND_ORPHAN {
                break;
            }
            let ino = offset_of(k);
            if self.peek_inode(&st, ino).is_err() {
                // The inode went away but the orphan item stayed: drop the item.
                self.with_tx(&mut st, |t, _| {
                    t.remove(TREE_FS, k)?;
                    Ok(((), vec![]))
                })?;
                continue;
            }
            self.reclaim(&mut st, ino)?;
        }
        Ok(())
    }

    pub fn open_inode(&self, ino: u64) -> FsResult<Attr> {
        self.op();
        let mut st = self.write_state();
        let m = self.load(&mut st, ino)?;
        m.open += 1;
        Ok(m.inode.attr(self.bs))
    }

    /// The last release of an unlinked inode frees it.
    pub fn release_inode(&self, ino: u64) -> FsResult<()> {
        self.op();
        let mut st = self.write_state();
        let Some(m) = st.inodes.get_mut(&ino) else {
            return Ok(());
        };
        m.open = m.open.saturating_sub(1);
        drop(st);
        self.reclaim_unused(ino)
    }
}
