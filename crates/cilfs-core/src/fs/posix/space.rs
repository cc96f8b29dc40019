//! A file's space: truncate, fallocate (with punched holes and zeroed ranges) and the zeroing
//! of blocks they and writes share (reads are in `read.rs`, writes in `write.rs`, the extent
//! map in `space/map.rs`, write back and fsync in `sync.rs`).
//!
//! Ordering (docs/journal.md section 7): data for newly allocated blocks is written, and the write
//! completed, before the transaction that maps them commits; the checkpoint's data-device flush
//! then makes it stable before the commit record. Bytes past EOF in the last block are zeroed
//! whenever the file grows over them, so a hole or a grown file never shows stale bytes; only
//! those the file grows over: the rest may be data a truncate cut off that is not logged yet,
//! and zeroing it would show zeros the file never held in a crash that keeps the old size.

use crate::fs::cache::iolock::IoMode;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::extent::{max_file_size, Extent};
use crate::fs::items::inode::Inode;
use crate::fs::posix::xattr::drop_caps;
use crate::fs::space::map::extents_in;
use crate::fs::stats::bump;
use crate::fs::tree::keys::OFFSET_MAX;
use crate::fs::types::{Cred, Reserve};
use crate::fs::{log_inode, Fs};
use cilfs_device::AlignedBuf;

impl Fs {
    /// When a truncate or fallocate grows a file from `old_size` to `new_size`, zero the old
    /// last block from EOF up to `new_size` (or its end), so the grown part reads as zeros: in
    /// the page cache if it is there, else on disk, outside the filesystem lock. The caller
    /// holds `ino`'s IO lock exclusively (nothing else puts its pages in the cache or moves its
    /// blocks).
    pub(super) fn zero_eof_tail(&self, ino: u64, old_size: u64, new_size: u64) -> FsResult<()> {
        let bs = u64::from(self.bs);
        if old_size % bs == 0 || new_size <= old_size {
            return Ok(());
        }
        let fb = old_size / bs;
        let from = (old_size % bs) as usize;
        // Not past `new_size`: see the module comment.
        let to = (new_size - fb * bs).min(bs) as usize;
        let (project, disk) = {
            let mut st = self.write_state();
            if st.cache.zero_range(ino, fb, from, to) {
                if let Some(m) = st.inodes.get_mut(&ino) {
                    self.note_dirty(&mut m.inode, Some(fb));
                }
                return Ok(());
            }
            let project = st.inodes.get_mut(&ino).map_or(0, |m| m.inode.project);
            let mut v = self.view(&st);
            match extents_in(&mut v, ino, fb, fb + 1)?.first() {
                // An unwritten block reads as zeros already.
                Some(e) if !e.unwritten => (project, e.disk + (fb - e.file)),
                _ => return Ok(()),
            }
        };
        self.zero_block_range(ino, project, disk, from, to)
    }

    /// Zeroes bytes `[from, to)` of disk block `disk` of inode `ino` (read, zero, write),
    /// charged to `project`: in place, or through the log for a block the log holds (which
    /// is never written in place, `journal/logged_data.rs`).
    pub(crate) fn zero_block_range(
        &self,
        ino: u64,
        project: u32,
        disk: u64,
        from: usize,
        to: usize,
    ) -> FsResult<()> {
        let mut buf = AlignedBuf::zeroed(self.bs as usize);
        self.data_read(project, disk, &mut buf)?;
        buf[from..to].fill(0);
        if self.journal.is_logged_data(disk) {
            return self.log_blocks(ino, &[(disk, &buf[..])]);
        }
        self.unflushed.lock().insert(ino);
        self.data_write(project, disk, &buf)
    }

    /// Sets the size. Shrinking frees the blocks past the new end (in bounded transactions, the
    /// first of which sets the size and clears the privileges `cred` may not keep); growing
    /// leaves a hole. Returns the mode bits it cleared.
    pub(crate) fn truncate(&self, cred: Cred, ino: u64, size: u64) -> FsResult<u32> {
        if size > max_file_size(self.bs) {
            return Err(FsError::TooBig);
        }
        let _io = self.io.lock(ino, IoMode::Exclusive);
        let old = {
            let mut st = self.write_state();
            let m = self.load(&mut st, ino)?;
            if m.inode.is_dir() {
                return Err(FsError::IsDir);
            }
            crate::fs::rules::iflags::may_change(&m.inode)?;
            m.inode.size
        };
        self.zero_eof_tail(ino, old, size)?;
        let mut st = self.write_state();
        let now = self.now();
        let (killed, _) = self.with_tx(&mut st, |t, inodes| {
            drop_caps(t, ino)?;
            let m = Fs::inode_mut(t, inodes, ino)?;
            m.inode.size = size;
            m.inode.mtime = now;
            let kill = self.privileges_to_kill(cred, &m.inode);
            m.inode.mode &= !kill;
            self.touch_ctime(m, now);
            log_inode(t, m, &self.stats)?;
            Ok((kill, vec![ino]))
        })?;
        drop(st);
        if size < old {
            let bs = u64::from(self.bs);
            let keep = size.div_ceil(bs);
            self.free_range(ino, keep, OFFSET_MAX)?;
        }
        Ok(killed)
    }

    /// fallocate: mode 0 (allocate, extend size), keep_size, or punch_hole (with keep_size).
    /// Allocated blocks are mapped unwritten: they read as zeros and nothing is written to
    /// them. Every mode clears the privileges `cred` may not keep, as a write does (Linux's
    /// `file_modified`).
    pub fn fallocate(
        &self,
        cred: Cred,
        ino: u64,
        off: u64,
        len: u64,
        keep_size: bool,
        punch_hole: bool,
    ) -> FsResult<()> {
        self.once_more_after_releases(|| {
            self.fallocate_once(cred, ino, off, len, keep_size, punch_hole)
        })
    }

    fn fallocate_once(
        &self,
        cred: Cred,
        ino: u64,
        off: u64,
        len: u64,
        keep_size: bool,
        punch_hole: bool,
    ) -> FsResult<()> {
        if punch_hole && !keep_size {
            bump(&self.stats.operations);
            return Err(FsError::NotSupported("PUNCH_HOLE without KEEP_SIZE"));
        }
        let end = self.fallocate_range(off, len)?;
        let _io = self.io.lock(ino, IoMode::Exclusive);
        self.may_fallocate(ino, !punch_hole)?;
        if punch_hole {
            if self.getattr(ino)?.kind == crate::fs::FileType::Directory {
                return Err(FsError::IsDir);
            }
            // Times first: a crash after any block changed shows the change counter moved.
            self.stamp_change(cred, ino)?;
            return self.punch_hole(cred, ino, off, end);
        }
        self.allocate_locked(cred, ino, off, end, keep_size)
    }

    /// FALLOC_FL_ZERO_RANGE: `[off, off + len)` reads as zeros after it; the file grows to
    /// its end unless `keep_size`. The whole blocks inside it are unmapped and preallocated
    /// again (unwritten, as every preallocation is), the partial ones at its edges zeroed in
    /// place, or allocated unwritten where they were holes. A crash between the two steps
    /// leaves holes in the range, which read as zeros too.
    pub fn zero_range(
        &self,
        cred: Cred,
        ino: u64,
        off: u64,
        len: u64,
        keep_size: bool,
    ) -> FsResult<()> {
        let end = self.fallocate_range(off, len)?;
        let _io = self.io.lock(ino, IoMode::Exclusive);
        self.may_fallocate(ino, false)?;
        if self.getattr(ino)?.kind == crate::fs::FileType::Directory {
            return Err(FsError::IsDir);
        }
        // Times first: a crash after any block changed shows the change counter moved.
        self.stamp_change(cred, ino)?;
        self.punch_hole(cred, ino, off, end)?;
        self.allocate_locked(cred, ino, off, end, keep_size)
    }

    /// What every fallocate mode checks first (Linux's `vfs_fallocate`): a writable
    /// filesystem and a range of at least a byte that ends inside the largest file. Its end.
    pub(super) fn fallocate_range(&self, off: u64, len: u64) -> FsResult<u64> {
        bump(&self.stats.operations);
        self.check_writable()?;
        if len == 0 {
            return Err(FsError::Invalid("fallocate of length 0"));
        }
        let end = off.checked_add(len).ok_or(FsError::TooBig)?;
        if end > max_file_size(self.bs) {
            return Err(FsError::TooBig);
        }
        Ok(end)
    }

    /// Linux's `vfs_fallocate` for the inode flags, `ino`'s IO lock held: nothing into an
    /// immutable file, and into an append-only one only what adds blocks (`adds_only`:
    /// preallocation), never a punched, zeroed, collapsed or inserted range.
    pub(super) fn may_fallocate(&self, ino: u64, adds_only: bool) -> FsResult<()> {
        let i = self.retrying(|| self.peek_inode(&self.read_state(), ino))?;
        match adds_only {
            true => crate::fs::rules::iflags::may_touch(&i),
            false => crate::fs::rules::iflags::may_change(&i),
        }
    }

    /// A change of `ino`'s data by `cred` in a transaction of its own: mtime, ctime and the
    /// change counter, and the privileges the change clears.
    pub(super) fn stamp_change(&self, cred: Cred, ino: u64) -> FsResult<()> {
        self.stamp_change_sized(cred, ino, |size| size)
    }

    /// `stamp_change`, the size becoming `resize` of what it is (a collapse's or an
    /// insert's).
    pub(super) fn stamp_change_sized(
        &self,
        cred: Cred,
        ino: u64,
        resize: impl Fn(u64) -> u64,
    ) -> FsResult<()> {
        let kill = self.retrying(|| {
            let mut st = self.write_state();
            let now = self.now();
            let (kill, _) = self.with_tx(&mut st, |t, inodes| {
                drop_caps(t, ino)?;
                let m = Fs::inode_mut(t, inodes, ino)?;
                m.inode.size = resize(m.inode.size);
                m.inode.mtime = now;
                let kill = self.privileges_to_kill(cred, &m.inode);
                m.inode.mode &= !kill;
                self.touch_ctime(m, now);
                log_inode(t, m, &self.stats)?;
                Ok((kill, vec![ino]))
            })?;
            Ok(kill)
        })?;
        if kill != 0 {
            self.attrs_changed(ino);
        }
        Ok(())
    }

    /// Preallocation of `[off, end)` (fallocate's mode 0 or KEEP_SIZE). The caller holds
    /// `ino`'s IO lock exclusively.
    fn allocate_locked(
        &self,
        cred: Cred,
        ino: u64,
        off: u64,
        end: u64,
        keep_size: bool,
    ) -> FsResult<()> {
        let bs = u64::from(self.bs);
        let first = off / bs;
        let last = (end - 1) / bs;
        // Blocks mapped now must not land under pages that wait for blocks of their own.
        self.flush_delalloc(ino)?;
        let (inode, fresh) = self.retrying(|| {
            let mut st = self.write_state();
            let m = self.load(&mut st, ino)?;
            if m.inode.is_dir() {
                return Err(FsError::IsDir);
            }
            // The range is the caller's now, blocks speculation mapped in it included.
            crate::fs::posix::write::forget_spec_range(&mut m.spec_prealloc, first, last + 1);
            let inode = m.inode.clone();
            let (exts, hole_blocks) = self.mapping(&st, ino, first, last)?;
            self.space_check(st.hdr.get_mut(), hole_blocks + 8, Reserve::Keep)?;
            Ok((inode, self.reserve_holes(&st, &exts, first, last + 1)?))
        })?;
        let r = self.fallocate_reserved(cred, &inode, end, keep_size, &fresh);
        self.unreserve(&fresh);
        r
    }

    /// Maps the blocks reserved for fallocate of `inode` (as planned), unwritten, with the file
    /// grown to `end` unless `keep_size`.
    fn fallocate_reserved(
        &self,
        cred: Cred,
        inode: &Inode,
        end: u64,
        keep_size: bool,
        fresh: &[Extent],
    ) -> FsResult<()> {
        let (ino, old_size) = (inode.ino, inode.size);
        if !keep_size {
            self.zero_eof_tail(ino, old_size, end)?;
        }
        let now = self.now();
        let kill = self.retrying(|| {
            let mut st = self.write_state();
            let (kill, _) = self.with_tx(&mut st, |t, inodes| {
                let allocated = self.map_reserved(t, ino, fresh, 0)?;
                drop_caps(t, ino)?;
                let m = Fs::inode_mut(t, inodes, ino)?;
                m.inode.blocks += allocated;
                let kill = self.privileges_to_kill(cred, &m.inode);
                m.inode.mode &= !kill;
                if !keep_size && end > m.inode.size {
                    m.inode.size = end;
                    m.inode.mtime = now;
                }
                if end > m.inode.size {
                    // Blocks past the end that the caller asked for: no release trims them.
                    m.inode.flags |= crate::fs::items::inode::INODE_PREALLOC;
                }
                self.touch_ctime(m, now);
                log_inode(t, m, &self.stats)?;
                Ok((kill, vec![ino]))
            })?;
            Ok(kill)
        })?;
        if kill != 0 {
            self.attrs_changed(ino);
        }
        Ok(())
    }

    /// PUNCH_HOLE (with KEEP_SIZE): the partial blocks at the edges zeroed in place, the whole
    /// ones unmapped. The caller holds `ino`'s IO lock exclusively and has stamped the change
    /// (`stamp_change`).
    fn punch_hole(&self, cred: Cred, ino: u64, off: u64, end: u64) -> FsResult<()> {
        let bs = u64::from(self.bs);
        let size = self.getattr(ino)?.size;
        let end = end.min(size);
        if off < end {
            let first_full = off.div_ceil(bs);
            let end_full = end / bs;
            // Zeroes `[a, b)` in place, block by block, where the file has a written block: a
            // hole or an unwritten block reads as zeros already, and writing them would
            // allocate the one and write the other.
            let zero = |a: u64, b: u64| -> FsResult<()> {
                let mut at = a;
                while at < b {
                    let fb = at / bs;
                    let to = b.min((fb + 1) * bs);
                    let mapped = self.retrying(|| {
                        let st = self.read_state();
                        let (exts, _) = self.mapping(&st, ino, fb, fb)?;
                        Ok(exts.iter().any(|e| !e.unwritten) || st.cache.contains(ino, fb))
                    })?;
                    if mapped {
                        self.write_locked(cred, ino, at, &vec![0u8; (to - at) as usize])?;
                    }
                    at = to;
                }
                Ok(())
            };
            if first_full >= end_full {
                zero(off, end)?;
            } else {
                zero(off, first_full * bs)?;
                zero(end_full * bs, end)?;
                self.free_range(ino, first_full, end_full)?;
            }
        }
        Ok(())
    }
}
