//! Reading: file data (read, and lseek's SEEK_DATA and SEEK_HOLE) and directories (readdir).

use crate::fs::cache::iolock::IoMode;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::extent::Extent;
use crate::fs::space::map::{extents_in, holes};
use crate::fs::stats::{bump, bump_bytes};
use crate::fs::{Fs, FsState};
use cilfs_device::AlignedBuf;

use crate::fs::items::dir::{self, DirEntry};
use crate::fs::items::header::TREE_FS;
use crate::fs::items::inode::FileType;
use crate::fs::tree::keys::{key, offset_of, KIND_DIRENT};
use crate::fs::txn::Trees;

impl Fs {
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
        // An unwritten extent reads as zeros (the buffer's): its blocks hold no data of the file.
        for e in exts.iter().filter(|e| !e.unwritten) {
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

    /// SEEK_DATA (`data`) or SEEK_HOLE from `off`. Unwritten blocks are holes, as XFS
    /// reports them, except where a page holds data written into them and not yet written
    /// back.
    pub fn seek(&self, ino: u64, off: u64, data: bool) -> FsResult<u64> {
        bump(&self.stats.operations);
        let (i, runs) = self.retrying(|| {
            let st = self.read_state();
            let i = self.peek_inode(&st, ino)?;
            if off >= i.size {
                return Err(FsError::NoData);
            }
            let bs = u64::from(self.bs);
            let mut v = self.view(&st);
            let (from, to) = (off / bs, i.size.div_ceil(bs));
            let exts = extents_in(&mut v, ino, from, to)?;
            Ok((
                i,
                data_runs(&exts, from, to, |a, b| st.cache.cached_in(ino, a, b)),
            ))
        })?;
        let bs = u64::from(self.bs);
        let mut pos = off;
        for &(first, end) in &runs {
            let (s, en) = (first * bs, end * bs);
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

    /// Directory entries from `cookie` on, "." and ".." first; each with the cookie that
    /// resumes after it. At most `max` entries, whole hash buckets only (at least one). Moves
    /// the directory's atime as a read moves a file's, unless `nodiratime`.
    pub fn readdir(&self, ino: u64, cookie: u64, max: usize) -> FsResult<Vec<(DirEntry, u64)>> {
        self.op();
        let (out, touch) = self.retrying(|| self.readdir_shared(ino, cookie, max))?;
        if touch && self.opts.diratime {
            self.touch_atime(ino);
        }
        Ok(out)
    }

    fn readdir_shared(
        &self,
        ino: u64,
        cookie: u64,
        max: usize,
    ) -> FsResult<(Vec<(DirEntry, u64)>, bool)> {
        let st = self.read_state();
        let d = self.peek_inode(&st, ino)?;
        if !d.is_dir() {
            return Err(FsError::NotDir);
        }
        let touch = self.atime_needs_update(&d, self.now());
        let mut out = Vec::new();
        let mut c = cookie;
        if c == 0 {
            out.push((
                DirEntry {
                    ino,
                    kind: FileType::Directory,
                    name: b".".to_vec(),
                },
                1,
            ));
            c = 1;
        }
        if c == 1 && out.len() < max {
            out.push((
                DirEntry {
                    ino: d.parent,
                    kind: FileType::Directory,
                    name: b"..".to_vec(),
                },
                2,
            ));
            c = 2;
        }
        if c < 2 {
            return Ok((out, touch));
        }
        let (from, first_slot) = dir::resume_at(c.max(3));
        if from > crate::fs::tree::keys::OFFSET_MAX {
            return Ok((out, touch));
        }
        let mut v = self.view(&st);
        // Every bucket holds an entry: `max` buckets fill the reply, after the one the cookie
        // points into, whose entries may all have been returned.
        let items = v.scan(
            TREE_FS,
            key(ino, KIND_DIRENT, from),
            key(ino, KIND_DIRENT, crate::fs::tree::keys::OFFSET_MAX),
            max.max(1) + 1,
        )?;
        'buckets: for (k, val) in items {
            let hash = offset_of(k);
            for (slot, e) in dir::decode_slotted(&val, ino)? {
                if hash == from && usize::from(slot) < first_slot {
                    continue;
                }
                if out.len() >= max.max(1) {
                    break 'buckets;
                }
                out.push((e, dir::cookie_after(hash, slot)));
            }
        }
        Ok((out, touch))
    }
}

/// The file block runs `[first, end)` of `[from, to)` that hold data: written extents whole,
/// and of unwritten ones and of holes the blocks with a page cached (`cached(from, to)`, in
/// order: a hole's pages wait for blocks, delayed allocation).
fn data_runs(
    exts: &[Extent],
    from: u64,
    to: u64,
    cached: impl Fn(u64, u64) -> Vec<u64>,
) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut add = |a: u64, b: u64| match runs.last_mut() {
        Some(r) if r.1 == a => r.1 = b,
        _ => runs.push((a, b)),
    };
    let mut at = from;
    for e in exts {
        for fb in cached(at, e.file.max(at)) {
            add(fb, fb + 1);
        }
        at = at.max(e.end());
        if !e.unwritten {
            add(e.file, e.end());
            continue;
        }
        for fb in cached(e.file, e.end()) {
            add(fb, fb + 1);
        }
    }
    for fb in cached(at, to) {
        add(fb, fb + 1);
    }
    runs
}
