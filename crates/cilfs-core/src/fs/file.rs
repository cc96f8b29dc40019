//! The data path: reads and writes through the page cache and in place, truncate, fallocate and
//! SEEK_DATA/SEEK_HOLE (the extent map is in `extent.rs`, write back and fsync in
//! `writeback.rs`).
//!
//! Ordering (journal.md section 7): data for newly allocated blocks is written, and the write
//! completed, before the transaction that maps them commits; the checkpoint's data-device flush
//! then makes it stable before the commit record. Bytes past EOF in the last block are zeroed
//! whenever the file grows over them, so a hole or a grown file never shows stale bytes.

use super::error::{FsError, FsResult};
use super::extent::{extents_in, holes, max_file_size, Extent};
use super::pagecache::PageCache;
use super::setid::drop_caps;
use super::stats::bump;
use super::tree::keys::OFFSET_MAX;
use super::types::{Cred, Reserve};
use super::{log_inode, Fs, FsState, IversionMode};
use cilfs_device::{AlignedBuf, WriteFlags};
use std::sync::atomic::Ordering;

impl Fs {
    fn read_blocks(&self, disk: u64, buf: &mut [u8]) -> FsResult<()> {
        self.journal
            .data
            .read(disk * u64::from(self.bs), buf)
            .map_err(FsError::from)
    }

    pub(crate) fn write_blocks(&self, disk: u64, buf: &[u8]) -> FsResult<()> {
        self.journal
            .data
            .write(disk * u64::from(self.bs), buf, WriteFlags::NONE)
            .map_err(FsError::from)
    }

    /// The extents over file blocks `[first, last]`, and how many of those blocks are holes.
    fn mapping(
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

    /// Writes `data` at `off`. Returns the bytes written (all of them, or an error).
    pub fn write(&self, cred: Cred, ino: u64, off: u64, data: &[u8]) -> FsResult<usize> {
        self.retrying(|| {
            bump(&self.stats.operations);
            self.check_writable()?;
            if data.is_empty() {
                return Ok(0);
            }
            let bs = u64::from(self.bs);
            let end = off.checked_add(data.len() as u64).ok_or(FsError::TooBig)?;
            if end > max_file_size(self.bs) {
                return Err(FsError::TooBig);
            }
            let mut st = self.write_state();
            let m = self.load(&mut st, ino)?;
            if m.inode.is_dir() {
                return Err(FsError::IsDir);
            }
            let old_size = m.inode.size;
            let first = off / bs;
            let last = (end - 1) / bs;
            let (exts, hole_blocks) = self.mapping(&st, ino, first, last)?;
            if hole_blocks > 0 {
                self.space_check(&st, hole_blocks + 8, Reserve::Keep)?;
            }
            let caps = self.has_caps(&st, ino)?;
            // Speculative preallocation (as XFS does): a write that extends the file also maps a
            // run of blocks past its end, zeroed now in one IO, so the appends that follow land in
            // blocks the file owns (the page cache) instead of allocating and writing each block
            // synchronously. Only for files already 16 blocks long (small files stay exact); as
            // many blocks as the file has, up to 256.
            let prealloc = if hole_blocks > 0 && end > old_size && old_size >= 16 * bs {
                let want = (old_size / bs).min(256);
                let fits = (last + 1 + want) * bs <= max_file_size(self.bs)
                    && self
                        .space_check(&st, hole_blocks + want + 8, Reserve::Keep)
                        .is_ok();
                if fits {
                    want
                } else {
                    0
                }
            } else {
                0
            };
            // Memory pressure: write every dirty page back (before any transaction is open, whose
            // locked blocks the extent lookups of the write back would need).
            if st.cache.dirty_pages() > st.cache.dirty_limit {
                self.writeback(&mut st, None)?;
            }
            // Zero the tail of the old last block when the file grows past it.
            self.zero_eof_tail(&mut st, ino, old_size, off, true)?;
            let mut t = if hole_blocks > 0 {
                Some(self.begin(&st)?)
            } else {
                None
            };
            let result = (|| -> FsResult<u64> {
                let mut fresh = Vec::new();
                if let Some(t) = t.as_mut() {
                    fresh = self.allocate_range(t, ino, first, last + 1 + prealloc)?;
                }
                let mut all: Vec<Extent> =
                    exts.iter().copied().chain(fresh.iter().copied()).collect();
                all.sort_by_key(|e| e.file);
                self.write_data(&mut st.cache, ino, &all, &fresh, old_size, off, data)?;
                // Preallocated blocks past the write hold other files' old data: zero them before
                // the transaction that maps them commits.
                for e in &fresh {
                    if e.end() > last + 1 {
                        let from = e.file.max(last + 1);
                        self.write_zeros(e.disk + (from - e.file), e.end() - from)?;
                    }
                }
                Ok(fresh.iter().map(|e| e.len).sum())
            })();
            let now = self.now();
            let m = match st.inodes.get_mut(&ino) {
                Some(m) => m,
                None => return Err(FsError::NotFound),
            };
            let allocated = match result {
                Ok(n) => n,
                Err(e) => {
                    return match t {
                        Some(t) if t.tx.logged_buffers() > 0 => Err(t.abort(e)),
                        _ => Err(e),
                    };
                }
            };
            bump_bytes(&self.stats.data_write_bytes, data.len());
            let ts_changed = m.inode.mtime != now || m.inode.ctime != now;
            let size_changed = end > old_size;
            let kill = self.privileges_to_kill(cred, &m.inode);
            // A size change alone is not logged now: like a kernel's i_size it is logged with the
            // next transaction of the inode, at fsync, at write back or at unmount (the data it
            // covers is in the page cache anyway). It still counts as a change for the counter.
            // With lazytime new timestamps wait the same way.
            let must_log = self.opts.iversion == IversionMode::Eager
                || (ts_changed && !self.opts.lazytime)
                || hole_blocks > 0
                || kill != 0
                || caps;
            let log = if must_log {
                m.change.maybe_increment(true);
                bump(&self.stats.change_bumps);
                true
            } else if m.change.maybe_increment(false) {
                bump(&self.stats.change_bumps);
                true
            } else {
                bump(&self.stats.change_bumps_skipped);
                false
            };
            if !log {
                if size_changed {
                    m.inode.size = end;
                    m.unlogged = true;
                    bump(&self.stats.deferred_size_updates);
                }
                if ts_changed {
                    m.inode.mtime = now;
                    m.inode.ctime = now;
                    m.unlogged = true;
                }
                return Ok(data.len());
            }
            m.inode.mtime = now;
            m.inode.ctime = now;
            m.inode.size = m.inode.size.max(end);
            m.inode.blocks += allocated;
            m.inode.mode &= !kill;
            let mut t = match t {
                Some(t) => t,
                None => self.begin(&st)?,
            };
            if caps {
                if let Err(e) = drop_caps(&mut t, ino) {
                    return Err(t.abort(e));
                }
            }
            let m = match st.inodes.get_mut(&ino) {
                Some(m) => m,
                None => return Err(FsError::NotFound),
            };
            if let Err(e) = log_inode(&mut t, m, &self.stats) {
                return Err(t.abort(e));
            }
            let seq = self.commit(&mut st, t)?;
            if let Some(m) = st.inodes.get_mut(&ino) {
                m.last_seq = m.last_seq.max(seq);
            }
            drop(st);
            if kill != 0 {
                self.attrs_changed(ino);
            }
            Ok(data.len())
        })
    }

    /// Writes `data` at byte `off` through the block map `exts` (which covers the range).
    /// Partial blocks are read first unless freshly allocated; bytes at or past `old_size` read
    /// as zeros.
    #[allow(clippy::too_many_arguments)]
    fn write_data(
        &self,
        cache: &mut PageCache,
        ino: u64,
        exts: &[Extent],
        fresh: &[Extent],
        old_size: u64,
        off: u64,
        data: &[u8],
    ) -> FsResult<()> {
        let bs = u64::from(self.bs);
        let first = off / bs;
        let end = off + data.len() as u64;
        let last = (end - 1) / bs;
        let nblocks = (last - first + 1) as usize;
        let mut buf = AlignedBuf::zeroed(nblocks * self.bs as usize);
        let is_fresh = |fb: u64| fresh.iter().any(|e| fb >= e.file && fb < e.end());
        for fb in [first, last] {
            let partial = (fb == first && off % bs != 0) || (fb == last && end % bs != 0);
            if !partial || is_fresh(fb) || fb * bs >= old_size {
                continue;
            }
            let Some(e) = exts.iter().find(|e| fb >= e.file && fb < e.end()) else {
                continue;
            };
            let i = (fb - first) as usize * self.bs as usize;
            if !cache.read(ino, fb, &mut buf[i..i + self.bs as usize]) {
                self.read_blocks(e.disk + (fb - e.file), &mut buf[i..i + self.bs as usize])?;
            }
            // Past EOF must read as zeros even if an old write left bytes there.
            let eof_in_block = old_size.saturating_sub(fb * bs);
            if eof_in_block < bs {
                buf[i + eof_in_block as usize..i + self.bs as usize].fill(0);
            }
        }
        let start = (off - first * bs) as usize;
        buf[start..start + data.len()].copy_from_slice(data);
        // New blocks: one write per physically contiguous run, now (ordered: before the
        // mapping commits). Blocks the file already had: into the page cache.
        let bsz = self.bs as usize;
        for e in exts {
            let s = e.file.max(first);
            let en = e.end().min(last + 1);
            if s >= en {
                continue;
            }
            let i = (s - first) as usize * bsz;
            let j = (en - first) as usize * bsz;
            if fresh.contains(e) {
                self.write_blocks(e.disk + (s - e.file), &buf[i..j])?;
            } else {
                for fb in s..en {
                    let k = (fb - first) as usize * bsz;
                    cache.put_dirty(ino, fb, &buf[k..k + bsz]);
                }
            }
        }
        Ok(())
    }

    /// Writes `n` zero blocks at disk block `disk`, at most 1 MiB per IO.
    fn write_zeros(&self, disk: u64, n: u64) -> FsResult<()> {
        let bs = u64::from(self.bs);
        let chunk = ((1u64 << 20) / bs).max(1);
        let zeros = AlignedBuf::zeroed((chunk.min(n) * bs) as usize);
        let mut at = 0;
        while at < n {
            let k = (n - at).min(chunk);
            self.write_blocks(disk + at, &zeros[..(k * bs) as usize])?;
            at += k;
        }
        Ok(())
    }

    /// When a file grows from `old_size` to beyond it (a write at `new_from` or a truncate up),
    /// zero the old last block from EOF to its end, so the grown part reads as zeros.
    /// `by_write`: the growth is a write starting at `new_from`, which zeroes the block itself
    /// when it starts inside it.
    fn zero_eof_tail(
        &self,
        st: &mut FsState,
        ino: u64,
        old_size: u64,
        new_from: u64,
        by_write: bool,
    ) -> FsResult<()> {
        let bs = u64::from(self.bs);
        if old_size % bs == 0 || new_from <= old_size {
            return Ok(());
        }
        let fb = old_size / bs;
        if by_write && new_from / bs == fb {
            // The write itself covers this block; write_data zeroes it.
            return Ok(());
        }
        if st.cache.zero_from(ino, fb, (old_size % bs) as usize) {
            return Ok(());
        }
        let exts = {
            let mut v = self.view(st);
            extents_in(&mut v, ino, fb, fb + 1)?
        };
        let Some(e) = exts.first() else {
            return Ok(());
        };
        let disk = e.disk + (fb - e.file);
        let mut buf = AlignedBuf::zeroed(self.bs as usize);
        self.read_blocks(disk, &mut buf)?;
        buf[(old_size % bs) as usize..].fill(0);
        self.write_blocks(disk, &buf)
    }

    /// Reads up to `size` bytes at `off`, and moves atime as the mount's atime mode says.
    pub fn read(&self, ino: u64, off: u64, size: u32) -> FsResult<Vec<u8>> {
        self.read_opts(ino, off, size, true)
    }

    /// A read that leaves atime alone without `touch_atime` (a file opened with O_NOATIME).
    pub fn read_opts(&self, ino: u64, off: u64, size: u32, touch_atime: bool) -> FsResult<Vec<u8>> {
        bump(&self.stats.operations);
        let (out, touch) = self.read_shared(ino, off, size)?;
        if touch && touch_atime {
            self.touch_atime(ino);
        }
        Ok(out)
    }

    /// The read under the shared lock, and whether it should move atime (decided there, so
    /// that a read that leaves atime alone never takes the lock exclusively).
    fn read_shared(&self, ino: u64, off: u64, size: u32) -> FsResult<(Vec<u8>, bool)> {
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
        let bs = u64::from(self.bs);
        let first = off / bs;
        let last = (end - 1) / bs;
        let exts = {
            let mut v = self.view(&st);
            extents_in(&mut v, ino, first, last + 1)?
        };
        let nblocks = (last - first + 1) as usize;
        let mut buf = AlignedBuf::zeroed(nblocks * self.bs as usize);
        for e in &exts {
            let s = e.file.max(first);
            let en = e.end().min(last + 1);
            if s >= en {
                continue;
            }
            let a = (s - first) as usize * self.bs as usize;
            let b = (en - first) as usize * self.bs as usize;
            self.read_blocks(e.disk + (s - e.file), &mut buf[a..b])?;
        }
        // The page cache holds newer contents than the disk.
        let bsz = self.bs as usize;
        for fb in first..=last {
            let a = (fb - first) as usize * bsz;
            st.cache.read(ino, fb, &mut buf[a..a + bsz]);
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
        let mut st = self.write_state();
        let m = self.load(&mut st, ino)?;
        if m.inode.is_dir() {
            return Err(FsError::IsDir);
        }
        let old = m.inode.size;
        if size > old {
            self.zero_eof_tail(&mut st, ino, old, size, false)?;
        }
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
        if size < old {
            let bs = u64::from(self.bs);
            let keep = size.div_ceil(bs);
            self.free_range(&mut st, ino, keep, OFFSET_MAX)?;
        }
        Ok(killed)
    }

    /// fallocate: mode 0 (allocate, extend size), keep_size, or punch_hole (with keep_size).
    /// Allocated blocks are written with zeros: there are no unwritten extents yet. Every mode
    /// clears the privileges `cred` may not keep, as a write does (Linux's `file_modified`).
    pub fn fallocate(
        &self,
        cred: Cred,
        ino: u64,
        off: u64,
        len: u64,
        keep_size: bool,
        punch_hole: bool,
    ) -> FsResult<()> {
        self.retrying(|| {
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
            let bs = u64::from(self.bs);
            if punch_hole {
                let size = self.getattr(ino)?.size;
                let end = end.min(size);
                if off < end {
                    // Zero the partial blocks at the edges in place, unmap the whole ones.
                    let first_full = off.div_ceil(bs);
                    let end_full = end / bs;
                    let zero = |a: u64, b: u64| -> FsResult<()> {
                        if a < b {
                            self.write(cred, ino, a, &vec![0u8; (b - a) as usize])
                                .map(|_| ())
                        } else {
                            Ok(())
                        }
                    };
                    if first_full >= end_full {
                        zero(off, end)?;
                    } else {
                        zero(off, first_full * bs)?;
                        zero(end_full * bs, end)?;
                        let mut st = self.write_state();
                        self.free_range(&mut st, ino, first_full, end_full)?;
                    }
                }
                // The edge writes cleared the privileges if there were any; an aligned hole, or
                // one past the end, still counts as a change of the data.
                return self.kill_privileges(cred, ino);
            }
            let mut st = self.write_state();
            let m = self.load(&mut st, ino)?;
            if m.inode.is_dir() {
                return Err(FsError::IsDir);
            }
            let old_size = m.inode.size;
            let first = off / bs;
            let last = (end - 1) / bs;
            let (_, hole_blocks) = self.mapping(&st, ino, first, last)?;
            self.space_check(&st, hole_blocks + 8, Reserve::Keep)?;
            if !keep_size && end > old_size {
                self.zero_eof_tail(&mut st, ino, old_size, end, false)?;
            }
            let now = self.now();
            let (kill, _) = self.with_tx(&mut st, |t, inodes| {
                let fresh = self.allocate_range(t, ino, first, last + 1)?;
                for e in &fresh {
                    // Bounded zeroing writes of at most 1 MiB.
                    let chunk = (1 << 20) / bs;
                    let zeros = AlignedBuf::zeroed((chunk * bs) as usize);
                    let mut at = 0;
                    while at < e.len {
                        let n = (e.len - at).min(chunk);
                        self.write_blocks(e.disk + at, &zeros[..(n * bs) as usize])?;
                        at += n;
                    }
                }
                drop_caps(t, ino)?;
                let m = Fs::inode_mut(t, inodes, ino)?;
                m.inode.blocks += hole_blocks;
                let kill = self.privileges_to_kill(cred, &m.inode);
                m.inode.mode &= !kill;
                if !keep_size && end > m.inode.size {
                    m.inode.size = end;
                    m.inode.mtime = now;
                }
                self.touch_ctime(m, now);
                log_inode(t, m, &self.stats)?;
                Ok((kill, vec![ino]))
            })?;
            drop(st);
            if kill != 0 {
                self.attrs_changed(ino);
            }
            Ok(())
        })
    }

    /// Clears the set-user-ID and set-group-ID bits a change of the data by `cred` clears, and
    /// drops file capabilities, in a transaction of its own when there are any.
    fn kill_privileges(&self, cred: Cred, ino: u64) -> FsResult<()> {
        let mut st = self.write_state();
        let m = self.load(&mut st, ino)?;
        let kill = self.privileges_to_kill(cred, &m.inode);
        if kill == 0 && !self.has_caps(&st, ino)? {
            return Ok(());
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
        drop(st);
        if kill != 0 {
            self.attrs_changed(ino);
        }
        Ok(())
    }

    /// SEEK_DATA (`data`) or SEEK_HOLE from `off`.
    pub fn seek(&self, ino: u64, off: u64, data: bool) -> FsResult<u64> {
        bump(&self.stats.operations);
        let st = self.read_state();
        let i = self.peek_inode(&st, ino)?;
        if off >= i.size {
            return Err(FsError::NoData);
        }
        let bs = u64::from(self.bs);
        let mut v = self.view(&st);
        let exts = extents_in(&mut v, ino, off / bs, i.size.div_ceil(bs))?;
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

fn bump_bytes(a: &std::sync::atomic::AtomicU64, n: usize) {
    a.fetch_add(n as u64, Ordering::Relaxed);
}
