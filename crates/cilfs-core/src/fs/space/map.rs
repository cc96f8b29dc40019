//! A file's block map: the extents of a range, the holes between them, and the transactional
//! steps that reserve blocks for holes, map them, and unmap ranges.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::extent::{Extent, EXTENT_LEN_MAX};
use crate::fs::items::header::TREE_FS;
use crate::fs::items::inode::NOT_DIRTY;
use crate::fs::space::alloc::{choose_extent, usable_given};
use crate::fs::tree::keys::{key, kind_of, offset_of, KIND_EXTENT, OFFSET_MAX};
use crate::fs::txn::TreeRead;
use crate::fs::txn::{FsTx, Trees};
use crate::fs::types::Reserve;
use crate::fs::{log_inode, Fs, FsState};

/// The extents of `ino` overlapping file blocks `[from, to)`, in order.
pub(crate) fn extents_in(
    t: &mut dyn TreeRead,
    ino: u64,
    from: u64,
    to: u64,
) -> FsResult<Vec<Extent>> {
    let mut out = Vec::new();
    let area = t.t_data_area();
    if let Some((k, v)) = t.t_seek_le(TREE_FS, key(ino, KIND_EXTENT, from))? {
        if k.a == ino && kind_of(k) == KIND_EXTENT {
            let e = Extent::decode_in(offset_of(k), &v, ino, area)?;
            if e.end() > from {
                out.push(e);
            }
        }
    }
    let mut at = key(ino, KIND_EXTENT, from);
    if let Some(e) = out.last() {
        at = key(ino, KIND_EXTENT, e.end().min(OFFSET_MAX));
    }
    while let Some((k, v)) = t.t_seek_ge(TREE_FS, at)? {
        // Each step moves past the key it found: a tree whose keys are out of order across
        // its nodes could hand back one before `at`, and the search would never end.
        if k < at {
            return Err(FsError::corrupt(
                0,
                format!("inode {ino}: an extent search for {at:?} found {k:?} before it"),
            ));
        }
        if k.a != ino || kind_of(k) != KIND_EXTENT || offset_of(k) >= to {
            break;
        }
        let e = Extent::decode_in(offset_of(k), &v, ino, area)?;
        out.push(e);
        match k.succ() {
            Some(n) => at = n,
            None => break,
        }
    }
    Ok(out)
}

/// Gaps of `[from, to)` not covered by `exts` (sorted).
pub(crate) fn holes(exts: &[Extent], from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = from;
    for e in exts {
        if e.file > at {
            out.push((at, e.file.min(to)));
        }
        at = at.max(e.end());
        if at >= to {
            break;
        }
    }
    if at < to {
        out.push((at, to));
    }
    out
}

impl Fs {
    /// Reserves free blocks for the holes of file blocks `[from, to)` (given the extents `exts`
    /// the file has there), for data written outside the filesystem lock before
    /// `map_reserved` maps them. What it returns must be given back with `unreserve`.
    pub(crate) fn reserve_holes(
        &self,
        st: &FsState,
        exts: &[Extent],
        from: u64,
        to: u64,
    ) -> FsResult<Vec<Extent>> {
        let mut out = Vec::new();
        let r = self.reserve_holes_into(st, exts, from, to, &mut out);
        if r.is_err() {
            self.unreserve(&out);
            out.clear();
        }
        r.map(|()| out)
    }

    fn reserve_holes_into(
        &self,
        st: &FsState,
        exts: &[Extent],
        from: u64,
        to: u64,
        out: &mut Vec<Extent>,
    ) -> FsResult<()> {
        self.lock_busy().prune(self.journal.completed_seq());
        let area = {
            let h = self.hdr(st);
            (h.data_start, h.data_end, h.bno_root.blkno)
        };
        let mut v = self.view(st);
        for (hs, he) in holes(exts, from, to) {
            let mut at = hs;
            while at < he {
                let want = (he - at).min(EXTENT_LEN_MAX);
                let mut usable = |s, l, w, m| usable_given(&self.lock_busy(), &[], s, l, w, m);
                let Some(c) = choose_extent(&mut v, want, 1, &mut usable)? else {
                    return Err(FsError::NoSpace);
                };
                // Written before any transaction maps it: never outside the data area.
                crate::fs::space::alloc::check_free_extent(area, c.free, c.free_len)?;
                self.lock_busy().reserve(c.start, c.len);
                out.push(Extent {
                    file: at,
                    disk: c.start,
                    len: c.len,
                    unwritten: false,
                });
                at += c.len;
            }
        }
        Ok(())
    }

    /// Maps extents reserved by `reserve_holes` into `ino`: written below file block
    /// `written_end` (their data IO completed), unwritten from it on (preallocation).
    pub(crate) fn map_reserved(
        &self,
        t: &mut FsTx<'_>,
        ino: u64,
        fresh: &[Extent],
        written_end: u64,
    ) -> FsResult<u64> {
        for e in fresh {
            t.alloc_reserved(e.disk, e.len)?;
            let split = written_end.clamp(e.file, e.end());
            if e.file < split {
                self.insert_extent(t, ino, e.slice(e.file, split))?;
            }
            if split < e.end() {
                let u = Extent {
                    unwritten: true,
                    ..e.slice(split, e.end())
                };
                self.insert_extent(t, ino, u)?;
            }
        }
        Ok(fresh.iter().map(|e| e.len).sum())
    }

    /// Marks file blocks `[from, to)` of `ino` written, their data IO completed: the
    /// unwritten extents over them split, at most 16 a transaction, each with the inode
    /// logged (so an fsync forces it). Before this commits a crash shows zeros there.
    /// `settled`: every dirty page of the file is on disk now, so the last transaction logs
    /// the whole size (`Inode::ordered_size`) and write back needs none of its own.
    pub(crate) fn convert_written(
        &self,
        ino: u64,
        from: u64,
        to: u64,
        settled: bool,
    ) -> FsResult<()> {
        while self.retrying(|| self.convert_batch(ino, from, to, settled))? {}
        Ok(())
    }

    /// One transaction of `convert_written`; true if unwritten extents are left.
    fn convert_batch(&self, ino: u64, from: u64, to: u64, settled: bool) -> FsResult<bool> {
        self.with_writeback_tx(&[ino], |st, t, sc| {
            // A split may need a leaf; the blocks themselves are the file's already.
            sc.need_space(self, &t.hdr, 4, Reserve::Use)?;
            let exts: Vec<Extent> = extents_in(t, ino, from, to)?
                .into_iter()
                .filter(|e| e.unwritten)
                .collect();
            for e in exts.iter().take(16) {
                let (s, en) = (e.file.max(from), e.end().min(to));
                t.remove(TREE_FS, key(ino, KIND_EXTENT, e.file))?;
                if e.file < s {
                    let head = e.slice(e.file, s);
                    t.insert(TREE_FS, key(ino, KIND_EXTENT, head.file), &head.encode())?;
                }
                let done = Extent {
                    unwritten: false,
                    ..e.slice(s, en)
                };
                self.insert_extent(t, ino, done)?;
                if en < e.end() {
                    let tail = e.slice(en, e.end());
                    t.insert(TREE_FS, key(ino, KIND_EXTENT, tail.file), &tail.encode())?;
                }
            }
            let more = exts.len() > 16;
            let m = sc.load(st, t, ino)?;
            if settled && !more {
                m.inode.dirty_from = NOT_DIRTY;
            }
            log_inode(t, m, &self.stats)?;
            Ok((more, vec![ino]))
        })
    }

    /// Gives reserved extents back (mapped since, or given up).
    pub(crate) fn unreserve(&self, fresh: &[Extent]) {
        if fresh.is_empty() {
            return;
        }
        let mut b = self.lock_busy();
        for e in fresh {
            b.unreserve(e.disk, e.len);
        }
    }

    /// Inserts an extent item, merging it into the previous one when both runs continue.
    pub(crate) fn insert_extent(&self, t: &mut FsTx<'_>, ino: u64, e: Extent) -> FsResult<()> {
        if let Some((k, v)) = t.seek_le(TREE_FS, key(ino, KIND_EXTENT, e.file))? {
            if k.a == ino && kind_of(k) == KIND_EXTENT {
                let p = Extent::decode_in(offset_of(k), &v, ino, Trees::data_area(t))?;
                if p.end() == e.file
                    && p.disk + p.len == e.disk
                    && p.unwritten == e.unwritten
                    && p.len + e.len <= EXTENT_LEN_MAX
                {
                    let merged = Extent {
                        len: p.len + e.len,
                        ..p
                    };
                    t.insert(TREE_FS, k, &merged.encode())?;
                    return Ok(());
                }
            }
        }
        t.insert(TREE_FS, key(ino, KIND_EXTENT, e.file), &e.encode())?;
        Ok(())
    }
    /// Unmaps file blocks `[from, to)`, freeing their disk blocks, 16 extents per transaction,
    /// each under the filesystem lock on its own (and run again from its start, outside the
    /// lock, when it finds no log space). The caller holds `ino`'s IO lock exclusively.
    pub(crate) fn free_range(&self, ino: u64, from: u64, to: u64) -> FsResult<()> {
        // Pages of blocks about to change hands are never written back.
        self.drop_pages(&self.write_state(), ino, from, to);
        while self.retrying(|| self.free_range_batch(ino, from, to))? {}
        Ok(())
    }

    /// One transaction of `free_range`; true if extents are left.
    fn free_range_batch(&self, ino: u64, from: u64, to: u64) -> FsResult<bool> {
        let mut st = self.write_state();
        // Freeing may split an extent at the range's edge (a punched hole) first.
        self.space_check(st.hdr.get_mut(), 4, Reserve::Use)?;
        let (more, _) = self.with_tx(&mut st, |t, inodes| {
            let exts = extents_in(t, ino, from, to)?;
            let mut freed = 0;
            for e in exts.iter().take(16) {
                let s = e.file.max(from);
                let en = e.end().min(to);
                t.remove(TREE_FS, key(ino, KIND_EXTENT, e.file))?;
                if e.file < s {
                    t.insert(
                        TREE_FS,
                        key(ino, KIND_EXTENT, e.file),
                        &Extent {
                            len: s - e.file,
                            ..*e
                        }
                        .encode(),
                    )?;
                }
                if en < e.end() {
                    let tail = e.slice(en, e.end());
                    t.insert(TREE_FS, key(ino, KIND_EXTENT, en), &tail.encode())?;
                }
                t.free_extent(e.disk + (s - e.file), en - s)?;
                freed += en - s;
            }
            let m = Fs::inode_mut(t, inodes, ino)?;
            m.inode.blocks = m.inode.blocks.saturating_sub(freed);
            log_inode(t, m, &self.stats)?;
            Ok((exts.len() > 16, vec![ino]))
        })?;
        Ok(more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_between_extents() {
        let e = |file, len| Extent {
            file,
            disk: 100,
            len,
            unwritten: false,
        };
        assert_eq!(holes(&[], 0, 4), vec![(0, 4)]);
        assert_eq!(holes(&[e(1, 2)], 0, 4), vec![(0, 1), (3, 4)]);
        assert_eq!(holes(&[e(0, 10)], 2, 4), vec![]);
        assert_eq!(holes(&[e(0, 1), e(5, 1)], 0, 8), vec![(1, 5), (6, 8)]);
    }
}
