//! Inode lifetime: open counts, and orphans (unlinked inodes still open, or left by a crash)
//! freed at the last release or at the next mount.

use crate::fs::cache::inode_cache::InodeMap;
use crate::fs::cache::iolock::IoMode;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::TREE_FS;
use crate::fs::items::inode::{Attr, INODE_PREALLOC};
use crate::fs::stats::bump;
use crate::fs::tree::keys::{
    key, kind_of, offset_of, KIND_INODE, KIND_ORPHAN, OFFSET_MAX, ORPHAN_OWNER,
};
use crate::fs::txn::TreeRead;
use crate::fs::txn::Trees;
use crate::fs::{log_inode, Fs, FsState};

/// Tests: hooks for one filesystem's next open of one inode that reads it from the tree, each
/// run once after that read (`set_open_after_read_hook`). Tests running side by side each add
/// their own.
#[cfg(test)]
#[allow(clippy::type_complexity)]
static OPEN_AFTER_READ: std::sync::Mutex<Vec<(usize, u64, Box<dyn FnOnce() + Send>)>> =
    std::sync::Mutex::new(Vec::new());

#[cfg(test)]
pub(crate) fn set_open_after_read_hook(fs: &Fs, ino: u64, f: impl FnOnce() + Send + 'static) {
    let key = std::ptr::from_ref(fs) as usize;
    let mut hooks = OPEN_AFTER_READ.lock().unwrap_or_else(|e| e.into_inner());
    hooks.retain(|(k, i, _)| (*k, *i) != (key, ino));
    hooks.push((key, ino, Box::new(f)));
}

#[cfg(test)]
fn run_open_after_read_hook(fs: &Fs, ino: u64) {
    let key = std::ptr::from_ref(fs) as usize;
    let hook = {
        let mut hooks = OPEN_AFTER_READ.lock().unwrap_or_else(|e| e.into_inner());
        let at = hooks.iter().position(|(k, i, _)| (*k, *i) == (key, ino));
        at.map(|at| hooks.swap_remove(at).2)
    };
    if let Some(f) = hook {
        f();
    }
}

/// How long an operation out of space waits for an open orphan's release
/// (`Fs::once_more_after_releases`).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(if cfg!(test) {
    // Tests release when the waiter has come (no race with a loaded machine's scheduler).
    30_000
} else {
    500
});

/// Operations that came to wait for an orphan's release (tests release it then).
#[cfg(test)]
pub(crate) static RELEASE_WAITERS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

impl Fs {
    /// Frees `ino` if no name and no handle is left, under its IO lock (exclusive: a read or
    /// write back still in flight finishes before its blocks are freed) and outside any
    /// filesystem lock the caller held. An inode in that state cannot be opened again
    /// (`open_inode`), so it stays unused while its batches run.
    pub(crate) fn reclaim_unused(&self, ino: u64) -> FsResult<()> {
        let unused = |st: &FsState| {
            st.inodes
                .lock(ino)
                .get(&ino)
                .is_some_and(|m| m.inode.nlink == 0 && m.open == 0)
        };
        if self.is_read_only() || !unused(&self.read_state()) {
            return Ok(());
        }
        let _io = self.io.lock(ino, IoMode::Exclusive);
        if !unused(&self.read_state()) {
            return Ok(()); // Reclaimed meanwhile by the thread we waited for.
        }
        let r = self.reclaim(ino);
        let (n, freed) = &self.orphans_reclaimed;
        *n.lock() += 1;
        freed.notify_all();
        r
    }

    /// Runs `op` (which changes nothing when it fails with ENOSPC, or, for a write or a
    /// fallocate, keeps what it did, which a second run completes) once more if it runs out
    /// of space while an unlinked file is still open, once that file's blocks are freed:
    /// writes, fallocate, creates and xattr values. A
    /// file closed and then removed is often such a file for a moment: Linux sends FUSE's
    /// RELEASE after close(2) returns, asynchronously, so `rm big; write small` on a full
    /// filesystem would fail where a kernel filesystem frees the blocks at once. Waits at most
    /// `RELEASE_WAIT` (a file that stays open keeps its blocks, and the error stands).
    pub(crate) fn once_more_after_releases<R>(
        &self,
        mut op: impl FnMut() -> FsResult<R>,
    ) -> FsResult<R> {
        match op() {
            Err(FsError::NoSpace) if self.wait_for_orphan_release() => op(),
            r => r,
        }
    }

    /// Whether an open orphan with blocks let them go within `RELEASE_WAIT`.
    fn wait_for_orphan_release(&self) -> bool {
        let (n, freed) = &self.orphans_reclaimed;
        // Read before the look for open orphans: a reclaim between the two moves it.
        let before = *n.lock();
        let open_orphans = {
            let st = self.read_state();
            let mut any = false;
            // Blocks of its own, or promised to its pages that wait for blocks.
            st.inodes.for_each_shard(|t| {
                any |= t.iter().any(|(&i, m)| {
                    m.inode.nlink == 0
                        && m.open > 0
                        && (m.inode.blocks > 0 || st.cache.delalloc_of(i) > 0)
                });
            });
            any
        };
        if !open_orphans {
            return false;
        }
        let deadline = cilfs_sync::time::now() + RELEASE_WAIT;
        let mut g = n.lock();
        #[cfg(test)]
        RELEASE_WAITERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        while *g == before {
            if freed.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        *g != before
    }

    /// Frees an orphan: its extents, xattrs and symlink chunks (in transactions of bounded size,
    /// each consistent on its own and each under the filesystem lock on its own, run again from
    /// its start outside the lock when it finds no log space), then the inode and its orphan
    /// item.
    pub(crate) fn reclaim(&self, ino: u64) -> FsResult<()> {
        {
            let st = self.write_state();
            // Named again since the caller looked: a link of an O_TMPFILE that passed its check
            // while the file was still open has published. A publish holds the state lock
            // from its check on, so none is half done now, and none can pass its check from
            // here on (the file is no longer open).
            let named = st
                .inodes
                .lock(ino)
                .get(&ino)
                .is_some_and(|m| m.inode.nlink > 0);
            if named {
                return Ok(());
            }
            self.drop_pages(&st, ino, 0, u64::MAX);
        }
        // Everything keyed under the inode except the inode item itself.
        while !self.retrying(|| self.reclaim_batch(ino))? {}
        self.retrying(|| {
            let mut st = self.write_state();
            self.with_tx(&mut st, |t, inodes| {
                t.remove(TREE_FS, key(ino, KIND_INODE, 0))?;
                t.remove(TREE_FS, key(ORPHAN_OWNER, KIND_ORPHAN, ino))?;
                t.hdr.inode_count = t.hdr.inode_count.saturating_sub(1);
                inodes.remove(&ino);
                Ok(((), vec![]))
            })
        })?;
        bump(&self.stats.orphans_reclaimed);
        Ok(())
    }

    /// One bounded transaction of `reclaim`; true once nothing but the inode item is left.
    pub(crate) fn reclaim_batch(&self, ino: u64) -> FsResult<bool> {
        let mut st = self.write_state();
        let (done, _) = self.with_tx(&mut st, |t, inodes| {
            let mut n = 0;
            let mut freed = 0;
            let mut at = key(ino, KIND_INODE + 1, 0);
            // Bounded by items and by the buffers its reservation covers (remote xattr values
            // cancel their blocks); the item that passes them is covered at commit
            // (`FsTx::cover_logged`).
            let room = |t: &crate::fs::txn::FsTx<'_>| {
                (t.tx.logged_buffers() as u64) < t.reserved_buffers() / 3
            };
            while n < 16 && room(t) {
                let Some((k, v)) = t.seek_ge(TREE_FS, at)? else {
                    break;
                };
                if k.a != ino {
                    break;
                }
                if kind_of(k) == crate::fs::tree::keys::KIND_XATTR {
                    crate::fs::posix::xattr::free_bucket(t, &v, ino)?;
                }
                if kind_of(k) == crate::fs::tree::keys::KIND_EXTENT {
                    let area = crate::fs::txn::Trees::data_area(t);
                    let ext =
                        crate::fs::items::extent::Extent::decode_in(offset_of(k), &v, ino, area)?;
                    t.free_extent(ext.disk, ext.len)?;
                    freed += ext.len;
                }
                t.remove(TREE_FS, k)?;
                n += 1;
                at = k;
            }
            // The inode's block count goes down with the extents in the same transaction, so
            // that each batch leaves a consistent image (a crash between two batches, a check
            // beside them).
            if freed > 0 {
                let m = Fs::inode_mut(t, inodes, ino)?;
                m.inode.blocks = m.inode.blocks.saturating_sub(freed);
                log_inode(t, m, &self.stats)?;
            }
            Ok((n < 16 && room(t), vec![]))
        })?;
        Ok(done)
    }

    /// Frees every orphan an earlier mount left (files unlinked while open, then a crash).
    pub(crate) fn reclaim_orphans(&self) -> FsResult<()> {
        loop {
            let next = {
                let st = self.read_state();
                let mut v = self.view(&st);
                v.t_seek_ge(TREE_FS, key(ORPHAN_OWNER, KIND_ORPHAN, 0))?
            };
            let Some((k, _)) = next else { break };
            if k.a != ORPHAN_OWNER || kind_of(k) != KIND_ORPHAN {
                break;
            }
            let ino = offset_of(k);
            let links = {
                let st = self.read_state();
                self.peek_inode(&st, ino).map(|i| i.nlink)
            };
            if let Ok(n @ 1..) = links {
                // A name still reaches it: the orphan item is damage, and freeing the inode
                // would leave its names pointing nowhere. The item goes, the inode stays.
                tracing::warn!(
                    "orphan item of inode {ino}, which has {n} links: removed, the inode kept"
                );
                if let Err(e) = self.journal.mark_needs_check() {
                    tracing::error!("cannot record in the superblock that a check is needed: {e}");
                }
            }
            if links.is_err() || links.is_ok_and(|n| n > 0) {
                // The inode went away (or is still linked) but the orphan item stayed: drop
                // the item.
                let mut st = self.write_state();
                self.with_tx(&mut st, |t, _| {
                    t.remove(TREE_FS, k)?;
                    Ok(((), vec![]))
                })?;
                continue;
            }
            self.reclaim(ino)?;
        }
        Ok(())
    }

    /// Counts a handle on `ino`, loading it if it is not in memory. Under the shared state
    /// lock (every open and create through FUSE comes here), through `retrying`: an inode item
    /// not in the buffer cache is read with no lock held.
    ///
    /// Against an unlink freeing the inode side by side: that commit checks, under the
    /// inode's shard, that nobody holds it open, and marks it until it publishes
    /// (`InodeMem::freeing`); an open that finds the mark waits for it, and one counted
    /// before the check makes the check fail (the unlink then leaves an orphan).
    pub fn open_inode(&self, ino: u64) -> FsResult<Attr> {
        self.op();
        self.retrying(|| {
            let st = self.read_state();
            let removals = {
                let mut inodes = st.inodes.lock(ino);
                if let Some(r) = self.open_in_memory(&mut inodes, ino) {
                    return r;
                }
                st.inodes.removals(ino)
            };
            // Read with no shard held (a read may give up). A commit that changes the inode
            // meanwhile holds its leaf until its copy is in memory, so what is read is either
            // what is in memory below, or older than something that left the shard since: a
            // commit's copy trimmed, or an inode freed. Then it runs again.
            let inode = crate::fs::read_inode(&mut self.view(&st), ino)?;
            #[cfg(test)]
            run_open_after_read_hook(self, ino);
            if inode.nlink == 0 {
                // An orphan nobody holds (one held is in memory): never alive again, and not
                // put in memory, where trims keep orphans for a reclaim that is not coming.
                return Err(FsError::NotFound);
            }
            let mut inodes = st.inodes.lock(ino);
            if !inodes.contains_key(&ino) && st.inodes.removals(ino) != removals {
                return Err(FsError::Retry(crate::fs::txn::retry::Retry::Reshaped));
            }
            inodes
                .entry(ino)
                .or_insert_with(|| Box::new(crate::fs::InodeMem::loaded(inode)));
            self.open_in_memory(&mut inodes, ino)
                .unwrap_or_else(|| unreachable!("inserted above"))
        })
    }

    /// `open_inode` on `ino` if it is in memory (its shard locked as `inodes`).
    fn open_in_memory(
        &self,
        inodes: &mut crate::fs::InodeTable,
        ino: u64,
    ) -> Option<FsResult<Attr>> {
        let m = inodes.get_mut(&ino)?;
        if m.freeing {
            return Some(Err(FsError::Retry(crate::fs::txn::retry::Retry::Freeing)));
        }
        if m.inode.nlink == 0 && m.open == 0 {
            // No name and no handle: being freed (or about to be); never alive again.
            return Some(Err(FsError::NotFound));
        }
        m.open += 1;
        crate::fs::txn::retry::changed_memory();
        Some(Ok(m.inode.attr(self.bs)))
    }

    /// The last release of an unlinked inode frees it; that of a linked one frees the
    /// blocks speculative preallocation left past its end.
    pub fn release_inode(&self, ino: u64) -> FsResult<()> {
        self.op();
        let trim = {
            let st = self.read_state();
            let mut inodes = st.inodes.lock(ino);
            let Some(m) = inodes.get_mut(&ino) else {
                return Ok(());
            };
            m.open = m.open.saturating_sub(1);
            m.open == 0 && m.inode.nlink > 0 && (!m.spec_prealloc.is_empty() || m.stale_prealloc)
        };
        let trimmed = if trim {
            self.trim_prealloc(ino)
        } else {
            Ok(false)
        };
        if trimmed.as_ref().is_ok_and(|&freed| freed) {
            // The kernel keeps attributes for an hour: its block count would go on showing
            // the preallocation (`du` right after a copy).
            self.attrs_changed(ino);
        }
        self.reclaim_unused(ino)?;
        trimmed.map(|_| ())
    }

    /// Frees the blocks past the end of `ino` that speculative preallocation mapped (and only
    /// those), unless it was opened again meanwhile (its writer would append into them). For
    /// an inode read from disk without `INODE_PREALLOC` that is every block past its end: no
    /// fallocate asked for them, so an earlier mount's speculation left them (XFS trims the
    /// same way at close unless the inode has its PREALLOC flag). Whether it freed any.
    fn trim_prealloc(&self, ino: u64) -> FsResult<bool> {
        let _io = self
            .io
            .lock(ino, crate::fs::cache::iolock::IoMode::Exclusive);
        // Through `retrying`: the extents past the end of a file read back from disk may not
        // be in the buffer cache, and their read must not happen under the filesystem lock.
        let (keep, ranges) = self.retrying(|| {
            let mut st = self.write_state();
            let FsState { hdr, inodes, .. } = &mut *st;
            let Some(m) = inodes.get_mut(&ino) else {
                return Ok((0, Vec::new()));
            };
            if m.open > 0 || m.inode.nlink == 0 {
                return Ok((0, Vec::new()));
            }
            let keep = m.inode.size.div_ceil(u64::from(self.bs));
            let past_end = if m.stale_prealloc && m.inode.flags & INODE_PREALLOC == 0 {
                let mut v = crate::fs::txn::ReadView::new(&self.journal, hdr.get_mut().roots());
                let past = crate::fs::space::map::extents_in(&mut v, ino, keep, OFFSET_MAX)?;
                past.last().map(|e| e.end())
            } else {
                None
            };
            // Only now, with nothing left that could give up, what memory recorded is taken.
            m.stale_prealloc = false;
            let spec = std::mem::take(&mut m.spec_prealloc);
            let ranges = match past_end {
                // Covers every speculative range as well.
                Some(end) => vec![(keep, end)],
                None => spec,
            };
            Ok((keep, ranges))
        })?;
        let mut freed = false;
        for (a, b) in ranges {
            if a.max(keep) < b {
                self.free_range(ino, a.max(keep), b)?;
                freed = true;
            }
        }
        Ok(freed)
    }
}
