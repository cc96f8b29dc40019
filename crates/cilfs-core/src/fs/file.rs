//! The data path: reads and writes through the page cache and in place, truncate, fallocate and
//! SEEK_DATA/SEEK_HOLE (the extent map is in `extent.rs`, write back and fsync in
//! `writeback.rs`).
//!
//! Ordering (journal.md section 7): data for newly allocated blocks is written, and the write
//! completed, before the transaction that maps them commits; the checkpoint's data-device flush
//! then makes it stable before the commit record. Bytes past EOF in the last block are zeroed
//! whenever the file grows over them, so a hole or a grown file never shows stale bytes; only
//! those the file grows over: the rest may be data a truncate cut off that is not logged yet,
//! and zeroing it would show zeros the file never held in a crash that keeps the old size.

use super::cache::iolock::IoMode;
use super::error::{FsError, FsResult};
use super::items::extent::{max_file_size, Extent};
use super::items::inode::Inode;
use super::rules::setid::drop_caps;
use super::space::map::{extents_in, holes};
use super::stats::{bump, bump_bytes};
use super::tree::keys::OFFSET_MAX;
use super::types::{Cred, Reserve};
use super::{log_inode, Fs, FsState};
use cilfs_device::AlignedBuf;

impl Fs {
    /// The extents over file blocks `[first, last]`, and how many of those blocks are holes.
    pub(crate) fn mapping(
        &self,
        st: &FsState,
        ino: u64,
        first: u64,
        last: u64,
    ) -> FsResult<(Vec<Extent>, u64)> {
        let exts = extents_in(&mut self.view(st), ino, first, last + 1)?;
        let hole_blocks = holes(&exts, first, last + 1)
            .iter()
            .map(|(a, b)| b - a)
            .sum();
        Ok((exts, hole_blocks))
    }

    /// Writes `n` zero blocks at disk block `disk`, at most 1 MiB per IO.
    pub(crate) fn write_zeros(&self, project: u32, disk: u64, n: u64) -> FsResult<()> {
        let bs = u64::from(self.bs);
        let chunk = ((1u64 << 20) / bs).max(1);
        let zeros = AlignedBuf::zeroed((chunk.min(n) * bs) as usize);
        let mut at = 0;
        while at < n {
            let k = (n - at).min(chunk);
            self.data_write(project, disk + at, &zeros[..(k * bs) as usize])?;
            at += k;
        }
        Ok(())
    }

    /// When a truncate or fallocate grows a file from `old_size` to `new_size`, zero the old
    /// last block from EOF up to `new_size` (or its end), so the grown part reads as zeros: in
    /// the page cache if it is there, else on disk, outside the filesystem lock. The caller
    /// holds `ino`'s IO lock exclusively (nothing else puts its pages in the cache or moves its
    /// blocks).
    fn zero_eof_tail(&self, ino: u64, old_size: u64, new_size: u64) -> FsResult<()> {
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
                Some(e) => (project, e.disk + (fb - e.file)),
                None => return Ok(()),
            }
        };
        self.zero_block_range(project, disk, from, to)
    }

    /// Zeroes bytes `[from, to)` of disk block `disk` in place (read, zero, write), charged to
    /// `project`.
    pub(crate) fn zero_block_range(
        &self,
        project: u32,
        disk: u64,
        from: usize,
        to: usize,
    ) -> FsResult<()> {
        let mut buf = AlignedBuf::zeroed(self.bs as usize);
        self.data_read(project, disk, &mut buf)?;
        buf[from..to].fill(0);
        self.data_write(project, disk, &buf)
    }

    /// Reads up to `size` bytes at `off`, and moves atime as the mount's atime mode says.
    pub fn read(&self, ino: u64, off: u64, size: u32) -> FsResult<Vec<u8>> {
        self.read_opts(ino, off, size, true)
    }

    /// A read that leaves atime alone without `touch_atime` (a file opened with O_NOATIME).
    pub fn read_opts(&self, ino: u64, off: u64, size: u32, touch_atime: bool) -> FsResult<Vec<u8>> {
        bump(&self.stats.operations);
        let (out, touch) = self.retrying(|| self.read_shared(ino, off, size))?;
        if touch && touch_atime {
            self.touch_atime(ino);
        }
        Ok(out)
    }

    /// The read, and whether it should move atime (decided here, so that a read that leaves
    /// atime alone never takes the filesystem lock exclusively). The mapping and the cached
    /// pages are looked up under the shared filesystem lock, the disk read outside it, under
    /// the inode's IO lock (shared), which keeps its blocks from changing hands meanwhile.
    fn read_shared(&self, ino: u64, off: u64, size: u32) -> FsResult<(Vec<u8>, bool)> {
        let _io = self.io.lock(ino, IoMode::Shared);
        let bs = u64::from(self.bs);
        let bsz = self.bs as usize;
        let (project, exts, first, last, end, touch, mut buf, cached) = {
            let st = self.read_state();
            let i = self.peek_inode(&st, ino)?;
            if i.is_dir() {
                return Err(FsError::IsDir);
            }
            let touch = size > 0 && self.atime_needs_update(&i, self.now());
            if off >= i.size || size == 0 {
                return Ok((Vec::new(), touch));
            }
            let end = (off + u64::from(size)).min(i.size);
            let first = off / bs;
            let last = (end - 1) / bs;
            let exts = {
                let mut v = self.view(&st);
                extents_in(&mut v, ino, first, last + 1)?
            };
            let nblocks = (last - first + 1) as usize;
            let mut buf = AlignedBuf::zeroed(nblocks * bsz);
            // The page cache holds newer contents than the disk: the inode's pages in one hold.
            let mut cached = vec![false; nblocks];
            let pages = st.cache.lock(ino);
            for fb in first..=last {
                let a = (fb - first) as usize * bsz;
                cached[(fb - first) as usize] = pages.read(fb, &mut buf[a..a + bsz]);
            }
            drop(pages);
            (i.project, exts, first, last, end, touch, buf, cached)
        };
        for e in &exts {
            let s = e.file.max(first);
            let en = e.end().min(last + 1);
            // Runs of blocks the cache did not have.
            let mut fb = s;
            while fb < en {
                if cached[(fb - first) as usize] {
                    fb += 1;
                    continue;
                }
                let run = fb;
                while fb < en && !cached[(fb - first) as usize] {
                    fb += 1;
                }
                let a = (run - first) as usize * bsz;
                let b = (fb - first) as usize * bsz;
                self.data_read(project, e.disk + (run - e.file), &mut buf[a..b])?;
            }
        }
        let start = (off - first * bs) as usize;
        let out = buf[start..start + (end - off) as usize].to_vec();
        bump_bytes(&self.stats.data_read_bytes, out.len());
        Ok((out, touch))
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
    /// Allocated blocks are written with zeros: there are no unwritten extents yet. They are
    /// reserved under the filesystem lock, zeroed outside it and mapped after, as a write's
    /// (`write.rs`). Every mode clears the privileges `cred` may not keep, as a write does
    /// (Linux's `file_modified`).
    pub fn fallocate(
        &self,
        cred: Cred,
        ino: u64,
        off: u64,
        len: u64,
        keep_size: bool,
        punch_hole: bool,
    ) -> FsResult<()> {
        bump(&self.stats.operations);
        self.check_writable()?;
        if len == 0 {
            return Err(FsError::Invalid("fallocate of length 0"));
        }
        if punch_hole && !keep_size {
            return Err(FsError::NotSupported("PUNCH_HOLE without KEEP_SIZE"));
        }
        let end = off.checked_add(len).ok_or(FsError::TooBig)?;
        if end > max_file_size(self.bs) {
            return Err(FsError::TooBig);
        }
        let _io = self.io.lock(ino, IoMode::Exclusive);
        if punch_hole {
            return self.punch_hole(cred, ino, off, end);
        }
        let bs = u64::from(self.bs);
        let first = off / bs;
        let last = (end - 1) / bs;
        let (inode, fresh) = self.retrying(|| {
            let mut st = self.write_state();
            let m = self.load(&mut st, ino)?;
            if m.inode.is_dir() {
                return Err(FsError::IsDir);
            }
            // The range is the caller's now, blocks speculation mapped in it included.
            super::write::forget_spec_range(&mut m.spec_prealloc, first, last + 1);
            let inode = m.inode.clone();
            let (exts, hole_blocks) = self.mapping(&st, ino, first, last)?;
            self.space_check(st.hdr.get_mut(), hole_blocks + 8, Reserve::Keep)?;
            Ok((inode, self.reserve_holes(&st, &exts, first, last + 1)?))
        })?;
        let r = self.fallocate_reserved(cred, &inode, end, keep_size, &fresh);
        self.unreserve(&fresh);
        r
    }

    /// Zeroes the blocks reserved for fallocate of `inode` (as planned) up to `end`, then maps
    /// them.
    fn fallocate_reserved(
        &self,
        cred: Cred,
        inode: &Inode,
        end: u64,
        keep_size: bool,
        fresh: &[Extent],
    ) -> FsResult<()> {
        let (ino, old_size, project) = (inode.ino, inode.size, inode.project);
        for e in fresh {
            self.write_zeros(project, e.disk, e.len)?;
        }
        if !keep_size {
            self.zero_eof_tail(ino, old_size, end)?;
        }
        let now = self.now();
        let kill = self.retrying(|| {
            let mut st = self.write_state();
            let (kill, _) = self.with_tx(&mut st, |t, inodes| {
                let allocated = self.map_reserved(t, ino, fresh)?;
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
                    m.inode.flags |= super::items::inode::INODE_PREALLOC;
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
    /// ones unmapped. The caller holds `ino`'s IO lock exclusively.
    fn punch_hole(&self, cred: Cred, ino: u64, off: u64, end: u64) -> FsResult<()> {
        let bs = u64::from(self.bs);
        let size = self.getattr(ino)?.size;
        let end = end.min(size);
        if off < end {
            let first_full = off.div_ceil(bs);
            let end_full = end / bs;
            // Zeroes `[a, b)` in place, block by block, where the file has a block: a hole
            // reads as zeros already, and writing them would allocate it.
            let zero = |a: u64, b: u64| -> FsResult<()> {
                let mut at = a;
                while at < b {
                    let fb = at / bs;
                    let to = b.min((fb + 1) * bs);
                    let mapped = self.retrying(|| {
                        let st = self.read_state();
                        Ok(self.mapping(&st, ino, fb, fb)?.1 == 0)
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
        // The edge writes cleared the privileges if there were any; an aligned hole, or one
        // past the end, still counts as a change of the data.
        self.kill_privileges(cred, ino)
    }

    /// Clears the set-user-ID and set-group-ID bits a change of the data by `cred` clears, and
    /// drops file capabilities, in a transaction of its own when there are any.
    fn kill_privileges(&self, cred: Cred, ino: u64) -> FsResult<()> {
        let kill = self.retrying(|| {
            let mut st = self.write_state();
            let m = self.load(&mut st, ino)?;
            let kill = self.privileges_to_kill(cred, &m.inode);
            if kill == 0 && !self.has_caps(&st, ino)? {
                return Ok(0);
            }
            let now = self.now();
            self.with_tx(&mut st, |t, inodes| {
                drop_caps(t, ino)?;
                let m = Fs::inode_mut(t, inodes, ino)?;
                m.inode.mode &= !kill;
                self.touch_ctime(m, now);
                log_inode(t, m, &self.stats)?;
                Ok(((), vec![ino]))
            })?;
            Ok(kill)
        })?;
        if kill != 0 {
            self.attrs_changed(ino);
        }
        Ok(())
    }

    /// SEEK_DATA (`data`) or SEEK_HOLE from `off`.
    pub fn seek(&self, ino: u64, off: u64, data: bool) -> FsResult<u64> {
        bump(&self.stats.operations);
        let (i, exts) = self.retrying(|| {
            let st = self.read_state();
            let i = self.peek_inode(&st, ino)?;
            if off >= i.size {
                return Err(FsError::NoData);
            }
            let bs = u64::from(self.bs);
            let mut v = self.view(&st);
            let exts = extents_in(&mut v, ino, off / bs, i.size.div_ceil(bs))?;
            Ok((i, exts))
        })?;
        let bs = u64::from(self.bs);
        let mut pos = off;
        for e in &exts {
            let (s, en) = (e.file * bs, e.end() * bs);
            if data {
                if en > pos {
                    return Ok(pos.max(s).min(i.size));
                }
            } else if s > pos {
                return Ok(pos);
            } else {
                pos = pos.max(en);
            }
        }
        if data {
            Err(FsError::NoData)
        } else {
            Ok(pos.min(i.size))
        }
    }
}
