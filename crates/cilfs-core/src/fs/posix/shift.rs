//! COLLAPSE_RANGE and INSERT_RANGE: a block-aligned range taken out of a file, or a hole put
//! in, by moving every extent after it, as XFS does (`xfs_collapse_file_space`,
//! `xfs_insert_file_space`). The extents move `SHIFT_BATCH` to a transaction, so a file of any
//! number of extents never needs an unbounded one; the shift point between batches is kept in
//! memory under the inode's IO lock, as XFS keeps it.
//!
//! Each batch leaves a consistent file (no two extents overlap, no block is mapped twice), so a
//! crash mid-way shows (docs/SEMANTICS.md):
//! - collapse: the range already a hole, the extents after it moved down up to the shift point
//!   and the rest still in place, the size not yet smaller (the last `len` bytes read as zeros
//!   once everything moved);
//! - insert: the size already larger, the extents from the shift point on moved up and those
//!   between the offset and it still in place (a hole after them).

use crate::fs::cache::iolock::IoMode;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::extent::{max_file_size, Extent};
use crate::fs::items::header::TREE_FS;
use crate::fs::tree::keys::{key, kind_of, offset_of, KIND_EXTENT, OFFSET_MAX};
use crate::fs::tree::node::Key;
use crate::fs::txn::{FsTx, Trees};
use crate::fs::types::{Cred, Reserve};
use crate::fs::Fs;

/// Extents moved per transaction: few, so the crash explorer's small files cross batches
/// (XFS moves one); each costs two key changes.
const SHIFT_BATCH: usize = 4;

/// Which way extents move, and by how many blocks.
#[derive(Clone, Copy)]
enum Shift {
    Down(u64),
    Up(u64),
}

impl Fs {
    /// FALLOC_FL_COLLAPSE_RANGE: removes `[off, off + len)` (both multiples of the block size)
    /// and moves everything after it down; the file shrinks by `len`. The range must end
    /// before the end of the file (Linux: EINVAL, a truncate does the rest).
    pub fn collapse_range(&self, cred: Cred, ino: u64, off: u64, len: u64) -> FsResult<()> {
        let (first, n) = self.shift_args(off, len)?;
        let _io = self.io.lock(ino, IoMode::Exclusive);
        self.may_fallocate(ino, false)?;
        let size = self.shift_size(ino)?;
        if off + len >= size {
            return Err(FsError::Invalid(
                "collapse range reaches the end of the file",
            ));
        }
        self.shift_prepare(ino, first)?;
        // Times first: a crash after any block moved shows the change counter moved.
        self.stamp_change(cred, ino)?;
        self.free_range(ino, first, first + n)?;
        let mut at = first + n;
        while let Some(next) = self.retrying(|| self.shift_batch(ino, at, first, Shift::Down(n)))? {
            at = next;
        }
        self.shift_finish(cred, ino, first, Shift::Down(n))
    }

    /// FALLOC_FL_INSERT_RANGE: opens a hole of `len` bytes at `off` (both multiples of the
    /// block size) by moving everything at and after it up; the file grows by `len`. The
    /// offset must lie inside the file (Linux: EINVAL).
    pub fn insert_range(&self, cred: Cred, ino: u64, off: u64, len: u64) -> FsResult<()> {
        let (first, n) = self.shift_args(off, len)?;
        let _io = self.io.lock(ino, IoMode::Exclusive);
        self.may_fallocate(ino, false)?;
        let size = self.shift_size(ino)?;
        if off >= size {
            return Err(FsError::Invalid(
                "insert range at or past the end of the file",
            ));
        }
        let bs = u64::from(self.bs);
        let last_end = self.retrying(|| {
            let st = self.read_state();
            let mut v = self.view(&st);
            last_extent_end(&mut v, ino)
        })?;
        let max = max_file_size(self.bs);
        if size.checked_add(len).is_none_or(|s| s > max)
            || (last_end + n).checked_mul(bs).is_none_or(|b| b > max)
        {
            return Err(FsError::TooBig);
        }
        self.shift_prepare(ino, first)?;
        // The bytes past the old end in its last block become part of the file while the
        // extents move: zeros, as for any growth.
        self.zero_eof_tail(ino, size, size + len)?;
        // The size first, so nothing moved past the end looks like preallocation to trim.
        self.shift_finish(cred, ino, first, Shift::Up(n))?;
        self.retrying(|| self.split_at(ino, first))?;
        let mut top = OFFSET_MAX;
        while let Some(next) = self.retrying(|| self.shift_batch(ino, top, first, Shift::Up(n)))? {
            top = next;
        }
        Ok(())
    }

    /// Checks a collapse or insert's arguments: file block and block count.
    fn shift_args(&self, off: u64, len: u64) -> FsResult<(u64, u64)> {
        self.fallocate_range(off, len)?;
        let bs = u64::from(self.bs);
        if off % bs != 0 || len % bs != 0 {
            return Err(FsError::Invalid("range not aligned to the block size"));
        }
        Ok((off / bs, len / bs))
    }

    /// The size of regular file `ino`.
    fn shift_size(&self, ino: u64) -> FsResult<u64> {
        let mut st = self.write_state();
        let m = self.load(&mut st, ino)?;
        if m.inode.is_dir() {
            return Err(FsError::IsDir);
        }
        Ok(m.inode.size)
    }

    /// Before extents move: every dirty page on disk and the size in the log (so the size the
    /// log holds is the one the moves start from), and no page cached from `first` on (the
    /// cache is keyed by file block).
    fn shift_prepare(&self, ino: u64, first: u64) -> FsResult<()> {
        self.writeback_locked(ino)?;
        self.drop_pages(&self.write_state(), ino, first, OFFSET_MAX);
        Ok(())
    }

    /// Moves up to `SHIFT_BATCH` extents in one transaction. Down: those starting at or after
    /// `at`, lowest first. Up: those starting in `[first, at)`, highest first. Returns the
    /// shift point for the next batch, or `None` when none are left.
    fn shift_batch(&self, ino: u64, at: u64, first: u64, s: Shift) -> FsResult<Option<u64>> {
        let mut st = self.write_state();
        // Moving a key may split a leaf.
        self.space_check(st.hdr.get_mut(), 4, Reserve::Use)?;
        let (next, _) = self.with_tx(&mut st, |t, _| {
            let mut at = at;
            for _ in 0..SHIFT_BATCH {
                let e = match s {
                    Shift::Down(_) => next_extent(t, ino, at)?,
                    Shift::Up(_) => prev_extent(t, ino, at)?.filter(|e| e.file >= first),
                };
                let Some(e) = e else {
                    return Ok((None, vec![ino]));
                };
                t.remove(TREE_FS, key(ino, KIND_EXTENT, e.file))?;
                match s {
                    Shift::Down(n) => {
                        self.insert_extent(
                            t,
                            ino,
                            Extent {
                                file: e.file - n,
                                ..e
                            },
                        )?;
                        at = e.end();
                    }
                    Shift::Up(n) => {
                        let moved = Extent {
                            file: e.file + n,
                            ..e
                        };
                        t.insert(TREE_FS, key(ino, KIND_EXTENT, moved.file), &moved.encode())?;
                        at = e.file;
                    }
                }
            }
            Ok((Some(at), vec![ino]))
        })?;
        Ok(next)
    }

    /// Splits the extent that covers file block `first` from before it, so the shift up moves
    /// exactly the blocks from `first` on.
    fn split_at(&self, ino: u64, first: u64) -> FsResult<()> {
        let mut st = self.write_state();
        self.space_check(st.hdr.get_mut(), 4, Reserve::Use)?;
        self.with_tx(&mut st, |t, _| {
            if let Some(e) = prev_extent(t, ino, first + 1)? {
                if e.file < first && first < e.end() {
                    let head = Extent {
                        len: first - e.file,
                        ..e
                    };
                    let tail = e.slice(first, e.end());
                    t.insert(TREE_FS, key(ino, KIND_EXTENT, e.file), &head.encode())?;
                    t.insert(TREE_FS, key(ino, KIND_EXTENT, first), &tail.encode())?;
                }
            }
            Ok(((), vec![ino]))
        })?;
        Ok(())
    }

    /// The size change, times and privileges of a collapse (after its moves) or an insert
    /// (before them), and the speculative ranges in memory moved as their extents move.
    fn shift_finish(&self, cred: Cred, ino: u64, first: u64, s: Shift) -> FsResult<()> {
        let bs = u64::from(self.bs);
        self.stamp_change_sized(cred, ino, |size| match s {
            Shift::Down(n) => size.saturating_sub(n * bs),
            Shift::Up(n) => size + n * bs,
        })?;
        if let Some(m) = self.write_state().inodes.get_mut(&ino) {
            shift_ranges(&mut m.spec_prealloc, first, s);
        }
        Ok(())
    }
}

/// The first extent of `ino` starting at or after file block `at`.
fn next_extent(t: &mut FsTx<'_>, ino: u64, at: u64) -> FsResult<Option<Extent>> {
    let found = t.seek_ge(TREE_FS, key(ino, KIND_EXTENT, at))?;
    extent_of(t, ino, found)
}

/// The last extent of `ino` starting before file block `at`.
fn prev_extent(t: &mut FsTx<'_>, ino: u64, at: u64) -> FsResult<Option<Extent>> {
    if at == 0 {
        return Ok(None);
    }
    let found = t.seek_le(TREE_FS, key(ino, KIND_EXTENT, at - 1))?;
    extent_of(t, ino, found)
}

/// The extent a seek `found`, if it is one of `ino`'s.
fn extent_of(t: &FsTx<'_>, ino: u64, found: Option<(Key, Vec<u8>)>) -> FsResult<Option<Extent>> {
    match found {
        Some((k, v)) if k.a == ino && kind_of(k) == KIND_EXTENT => Ok(Some(Extent::decode_in(
            offset_of(k),
            &v,
            ino,
            Trees::data_area(t),
        )?)),
        _ => Ok(None),
    }
}

/// The end of the last extent of `ino` (0 for none).
fn last_extent_end(t: &mut dyn crate::fs::txn::TreeRead, ino: u64) -> FsResult<u64> {
    match t.t_seek_le(TREE_FS, key(ino, KIND_EXTENT, OFFSET_MAX))? {
        Some((k, v)) if k.a == ino && kind_of(k) == KIND_EXTENT => {
            Ok(Extent::decode_in(offset_of(k), &v, ino, t.t_data_area())?.end())
        }
        _ => Ok(0),
    }
}

/// Moves file-block ranges as their extents move: down, those in the collapsed range
/// forgotten and those after it moved; up, those from `first` on moved (one across it split).
fn shift_ranges(ranges: &mut Vec<(u64, u64)>, first: u64, s: Shift) {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for &(a, b) in ranges.iter() {
        match s {
            Shift::Down(n) => {
                let end = first + n;
                if a < first {
                    out.push((a, b.min(first)));
                }
                if b > end {
                    out.push((a.max(end) - n, b - n));
                }
            }
            Shift::Up(n) => {
                if a < first {
                    out.push((a, b.min(first)));
                }
                if b > first {
                    out.push((a.max(first) + n, b + n));
                }
            }
        }
    }
    out.retain(|r| r.0 < r.1);
    *ranges = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speculative_ranges_move_with_their_extents() {
        let mut r = vec![(0, 4), (10, 20), (30, 40)];
        shift_ranges(&mut r, 2, Shift::Down(10));
        assert_eq!(r, vec![(0, 2), (2, 10), (20, 30)]);
        let mut r = vec![(0, 4), (10, 20)];
        shift_ranges(&mut r, 2, Shift::Up(5));
        assert_eq!(r, vec![(0, 2), (7, 9), (15, 25)]);
    }
}
