//! Free space: two B+trees of free extents, by block (key start, len) and by size (key len,
//! start), both value-less, and a free list in the header feeding those trees' own nodes (so
//! they never allocate from themselves mid-change). Allocation never takes a busy extent
//! (`fs/txn/busy.rs`).

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::{freelist_capacity, TREE_FREE_BY_BLOCK, TREE_FREE_BY_SIZE};
use crate::fs::tree::node::Key;
use crate::fs::txn::busy::{merge_ascending, BusyExtents};
use crate::fs::txn::{freelist_band, FsTx, Trees};

/// The first part of `[start, start+len)` outside every range of `busy` (`(start, end)`,
/// ascending by start, overlapping one another or not) of at least `want` blocks, else the
/// longest part of at least `min`: (start, len). Reads `busy` only as far as it must.
fn usable_part(
    start: u64,
    len: u64,
    busy: impl Iterator<Item = (u64, u64)>,
    want: u64,
    min: u64,
) -> Option<(u64, u64)> {
    let end = start + len;
    let mut at = start;
    let mut best: Option<(u64, u64)> = None;
    let mut consider = |s: u64, e: u64| -> bool {
        if e <= s {
            return false;
        }
        let l = e - s;
        if l >= want {
            best = Some((s, want));
            return true;
        }
        if l >= min && best.is_none_or(|b| b.1 < l) {
            best = Some((s, l));
        }
        false
    };
    let mut last_start = 0;
    for (bs, be) in busy {
        debug_assert!(bs >= last_start, "busy ranges out of order");
        last_start = bs;
        if be <= at {
            continue;
        }
        if bs >= end {
            break;
        }
        if consider(at, bs.min(end)) {
            return best;
        }
        at = at.max(be);
    }
    consider(at, end);
    best
}

/// How many candidates an allocation examines before settling for what it found.
const SEARCH_LIMIT: usize = 64;
/// Free extents read at once by the last, exhaustive search.
const EXHAUSTIVE_BATCH: usize = 1024;

/// A free extent an allocation chose: the free extent `[free, free+free_len)` of the trees
/// and the part of it `[start, start+len)` to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choice {
    pub free: u64,
    pub free_len: u64,
    pub start: u64,
    pub len: u64,
}

/// The part of a free extent an allocation may use (outside busy and reserved extents), as
/// `usable_part` answers.
type Usable<'u> = dyn FnMut(u64, u64, u64, u64) -> Option<(u64, u64)> + 'u;

/// Chooses up to `want` contiguous free blocks (at least `min`) in the free-space trees of
/// `t`, using only what `usable` allows: a read of the trees that changes nothing, so a
/// transaction and a read view under the filesystem lock choose the same way.
pub(crate) fn choose_extent<T: Trees>(
    t: &mut T,
    want: u64,
    min: u64,
    usable: &mut Usable<'_>,
) -> FsResult<Option<Choice>> {
    assert!(want >= min && min >= 1);
    let choice = |free, free_len, (start, len)| Choice {
        free,
        free_len,
        start,
        len,
    };
    let mut best: Option<Choice> = None;
    // Extents at least `want` long, smallest first.
    let mut at = Key::new(want, 0);
    for _ in 0..SEARCH_LIMIT {
        let Some((k, _)) = t.seek_ge(TREE_FREE_BY_SIZE, at)? else {
            break;
        };
        let (len, start) = (k.a, k.b);
        if let Some(part) = usable(start, len, want, min) {
            if part.1 == want {
                return Ok(Some(choice(start, len, part)));
            }
            if best.is_none_or(|b| b.len < part.1) {
                best = Some(choice(start, len, part));
            }
        }
        match k.succ() {
            Some(n) => at = n,
            None => break,
        }
    }
    // Then the largest shorter ones.
    if best.is_none() && want > 1 {
        let mut at = Key::new(want - 1, u64::MAX);
        for _ in 0..SEARCH_LIMIT {
            let Some((k, _)) = t.seek_le(TREE_FREE_BY_SIZE, at)? else {
                break;
            };
            let (len, start) = (k.a, k.b);
            if len < min {
                break;
            }
            if let Some(part) = usable(start, len, want, min) {
                if best.is_none_or(|b| b.len < part.1) {
                    best = Some(choice(start, len, part));
                }
                if part.1 == len {
                    break;
                }
            }
            match k.pred() {
                Some(p) => at = p,
                None => break,
            }
        }
    }
    // Last, before giving up: the largest extent, then every extent. Both searches above
    // look at a bounded number of candidates, and after many small frees (unlinking many
    // one-block files) those can all be busy while a large extent beyond them is free: the
    // device then reported ENOSPC with most of it free, until a checkpoint came. The largest
    // extent is the least likely to be covered by busy ones, so this usually ends there; if
    // not, the whole tree is read in batches, one pass over its leaves.
    let mut consider = |k: Key, best: &mut Option<Choice>| -> Option<Choice> {
        let (len, start) = (k.a, k.b);
        if len < min {
            return None;
        }
        match usable(start, len, want, min) {
            Some(part) if part.1 == want => Some(choice(start, len, part)),
            Some(part) => {
                if best.is_none_or(|b| b.len < part.1) {
                    *best = Some(choice(start, len, part));
                }
                None
            }
            None => None,
        }
    };
    if best.is_none() {
        if let Some((k, _)) = t.seek_le(TREE_FREE_BY_SIZE, Key::MAX)? {
            if let Some(found) = consider(k, &mut best) {
                return Ok(Some(found));
            }
        }
    }
    if best.is_none() {
        let mut from = Key::new(min, 0);
        loop {
            let batch = t.scan(TREE_FREE_BY_SIZE, from, Key::MAX, EXHAUSTIVE_BATCH)?;
            for &(k, _) in &batch {
                if let Some(found) = consider(k, &mut best) {
                    return Ok(Some(found));
                }
            }
            match batch.last().and_then(|(k, _)| k.succ()) {
                Some(next) if batch.len() == EXHAUSTIVE_BATCH => from = next,
                _ => break,
            }
        }
    }
    Ok(best)
}

/// Err(corrupt) unless the free extent `[s, s+l)`, as a free-space tree gives it, lies in the
/// data area `(start, end)` (`tree`: the block to name): a damaged tree must never send a
/// write outside it.
pub(crate) fn check_free_extent(area: (u64, u64, u64), s: u64, l: u64) -> FsResult<()> {
    let (data_start, data_end, tree) = area;
    if l == 0 || s < data_start || s.checked_add(l).is_none_or(|e| e > data_end) {
        return Err(FsError::corrupt(
            tree,
            format!("free extent {s}+{l} outside the data area"),
        ));
    }
    Ok(())
}

/// What of `[start, start+len)` an allocation may use, given the busy and reserved extents
/// and `also` (extents the transaction itself freed).
pub(crate) fn usable_given(
    busy: &BusyExtents,
    also: &[(u64, u64)],
    start: u64,
    len: u64,
    want: u64,
    min: u64,
) -> Option<(u64, u64)> {
    // A free extent from a damaged tree can run past the end of the numbers: never usable
    // (taking it is refused as corrupt, `take`).
    let end = start.checked_add(len)?;
    let mut own: Vec<(u64, u64)> = also
        .iter()
        .filter(|&&(s, l)| s < end && s + l > start)
        .map(|&(s, l)| (s, s + l))
        .collect();
    own.sort_unstable();
    let avoid = merge_ascending(busy.overlapping(start, end), own.into_iter());
    usable_part(start, len, avoid, want, min)
}

impl FsTx<'_> {
    /// Allocates up to `want` contiguous blocks (at least `min`), skipping busy and reserved
    /// extents. None when no such free extent exists.
    pub fn alloc_extent(&mut self, want: u64, min: u64) -> FsResult<Option<(u64, u64)>> {
        let busy = self.busy;
        let freed = self.freed.clone();
        let mut usable = |s, l, w, m| usable_given(&busy.lock(), &freed, s, l, w, m);
        match choose_extent(self, want, min, &mut usable)? {
            Some(c) => {
                let got = self.take(c.free, c.free_len, c.start, c.len)?;
                self.allocated.push(got);
                Ok(Some(got))
            }
            None => Ok(None),
        }
    }

    /// Allocates exactly `[s, s+l)`, which a write reserved while it was free
    /// (`BusyExtents::reserve`) and has since written.
    pub(crate) fn alloc_reserved(&mut self, s: u64, l: u64) -> FsResult<()> {
        let Some((k, _)) = self.seek_le(TREE_FREE_BY_BLOCK, Key::new(s, u64::MAX))? else {
            return Err(FsError::corrupt(
                self.hdr.bno_root.blkno,
                format!("reserved extent {s}+{l} is not free"),
            ));
        };
        let (fs, fl) = (k.a, k.b);
        if !(fs <= s && fs.checked_add(fl).is_some_and(|e| s + l <= e)) {
            return Err(FsError::corrupt(
                self.hdr.bno_root.blkno,
                format!("reserved extent {s}+{l} is not free (nearest free extent {fs}+{fl})"),
            ));
        }
        self.take(fs, fl, s, l).map(|_| ())
    }

    /// Takes `[s, s+l)` out of the free extent `[fs, fs+fl)`.
    fn take(&mut self, fs: u64, fl: u64, s: u64, l: u64) -> FsResult<(u64, u64)> {
        check_free_extent(
            (
                self.hdr.data_start,
                self.hdr.data_end,
                self.hdr.bno_root.blkno,
            ),
            fs,
            fl,
        )?;
        assert!(
            s >= fs && s + l <= fs + fl,
            "taking outside the free extent"
        );
        // Free blocks that were file data the log held were cancelled when freed, and are
        // handed out only once that is stable: no image of them can come back, and their next
        // owner writes them as it likes (`journal/logged_data.rs`). Forgotten even if this
        // transaction is dropped, which changes nothing of that.
        self.tx.journal.forget_logged_data(s, s + l);
        // The header's count is read from disk: one below what the free-space trees hold is
        // damage (check reports the disagreement), refused before anything is changed.
        let Some(left) = self.hdr.free_blocks.checked_sub(l) else {
            return Err(FsError::corrupt(
                self.hdr.bno_root.blkno,
                format!(
                    "taking {l} free blocks where the header counts {}",
                    self.hdr.free_blocks
                ),
            ));
        };
        self.remove_free(fs, fl)?;
        if s > fs {
            self.insert_free(fs, s - fs)?;
        }
        if s + l < fs + fl {
            self.insert_free(s + l, fs + fl - (s + l))?;
        }
        self.hdr.free_blocks = left;
        Ok((s, l))
    }

    fn remove_free(&mut self, s: u64, l: u64) -> FsResult<()> {
        let a = self.remove(TREE_FREE_BY_BLOCK, Key::new(s, l))?;
        let b = self.remove(TREE_FREE_BY_SIZE, Key::new(l, s))?;
        if a.is_none() || b.is_none() {
            return Err(FsError::corrupt(
                self.hdr.bno_root.blkno,
                format!("free extent {s}+{l} missing from a free-space tree"),
            ));
        }
        Ok(())
    }

    fn insert_free(&mut self, s: u64, l: u64) -> FsResult<()> {
        self.insert(TREE_FREE_BY_BLOCK, Key::new(s, l), &[])?;
        self.insert(TREE_FREE_BY_SIZE, Key::new(l, s), &[])?;
        Ok(())
    }

    /// Returns `[s, s+l)` to free space, merging with free neighbours. Busy until stable.
    pub fn free_extent(&mut self, s: u64, l: u64) -> FsResult<()> {
        assert!(l > 0);
        if s < self.hdr.data_start || s + l > self.hdr.data_end {
            return Err(FsError::corrupt(
                s,
                format!("freeing {s}+{l} outside the data area"),
            ));
        }
        // File data the log holds: cancelled, so that neither the AIL nor a recovery writes
        // an image of it over whatever reuses the block (`journal/logged_data.rs`).
        for b in self.tx.journal.logged_data_in(s, s + l) {
            let r = self.tx.buf_fresh(b)?;
            self.tx.cancel(r);
        }
        let mut start = s;
        let mut len = l;
        if let Some((k, _)) = self.seek_le(TREE_FREE_BY_BLOCK, Key::new(s + l - 1, u64::MAX))? {
            let (ps, pl) = (k.a, k.b);
            if ps.checked_add(pl).is_none_or(|e| e > s) {
                return Err(FsError::corrupt(
                    s,
                    format!("freeing {s}+{l}, which overlaps free extent {ps}+{pl}"),
                ));
            }
            if ps + pl == s {
                self.remove_free(ps, pl)?;
                start = ps;
                len += pl;
            }
        }
        if let Some((k, _)) = self.seek_ge(TREE_FREE_BY_BLOCK, Key::new(s + l, 0))? {
            let (ns, nl) = (k.a, k.b);
            if ns == s + l {
                if ns.checked_add(nl).is_none_or(|e| e > self.hdr.data_end) {
                    return Err(FsError::corrupt(
                        self.hdr.bno_root.blkno,
                        format!("free extent {ns}+{nl} outside the data area"),
                    ));
                }
                self.remove_free(ns, nl)?;
                len += nl;
            }
        }
        self.insert_free(start, len)?;
        self.hdr.free_blocks += l;
        self.freed.push((s, l));
        Ok(())
    }

    pub(crate) fn freelist_pop(&mut self) -> FsResult<u64> {
        self.hdr.freelist.pop().ok_or(FsError::NoSpace)
    }

    pub(crate) fn freelist_push(&mut self, blkno: u64) -> FsResult<()> {
        // In one state, corruption; in an optimistic build's view of two (a node read as it
        // is now, the list as it was before another commit took the block), a run again.
        if self.hdr.freelist.contains(&blkno) {
            return Err(FsError::corrupt(
                blkno,
                format!("freeing {blkno}, which the free list holds already"),
            ));
        }
        if self.hdr.freelist.len() < freelist_capacity(self.block_size_usize()) {
            self.hdr.freelist.push(blkno);
            Ok(())
        } else {
            self.free_extent(blkno, 1)
        }
    }

    fn block_size_usize(&self) -> usize {
        use crate::fs::tree::btree::NodeStore;
        self.block_size()
    }

    /// Keeps the free list above a quarter and at most three quarters full
    /// (`freelist_band`): enough for any change of the free-space trees in one transaction,
    /// and never overflowing.
    pub(crate) fn fix_freelist(&mut self) -> FsResult<()> {
        let cap = freelist_capacity(self.block_size_usize());
        let (low, high) = freelist_band(cap);
        let target = cap / 2;
        if self.hdr.freelist.len() <= low {
            while self.hdr.freelist.len() < target {
                let want = (target - self.hdr.freelist.len()) as u64;
                // Allocating may itself pop the list; loop until the target is reached.
                let Some((s, l)) = self.alloc_extent(want, 1)? else {
                    break; // A nearly full device: keep what we have.
                };
                self.hdr.freelist.extend(s..s + l);
            }
        } else if self.hdr.freelist.len() > high {
            while self.hdr.freelist.len() > target {
                let Some(b) = self.hdr.freelist.pop() else {
                    break;
                };
                self.free_extent(b, 1)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_part_skips_busy_ranges() {
        let at = |r: &[(u64, u64)], want, min| usable_part(10, 10, r.iter().copied(), want, min);
        assert_eq!(at(&[], 5, 1), Some((10, 5)));
        assert_eq!(at(&[(12, 14)], 5, 1), Some((14, 5)));
        assert_eq!(at(&[(12, 14), (17, 18)], 5, 1), Some((14, 3)));
        assert_eq!(at(&[(0, 30)], 5, 1), None);
        assert_eq!(at(&[(11, 19)], 5, 2), None);
        assert_eq!(at(&[(11, 19)], 5, 1), Some((10, 1)));
        assert_eq!(
            at(&[(0, 12), (5, 16)], 4, 1),
            Some((16, 4)),
            "overlapping ranges"
        );
    }

    /// Block by block: the first free run of `want` blocks in `[start, start+len)`, else the
    /// first of the longest runs of at least `min`.
    fn usable_oracle(
        taken: &dyn Fn(u64) -> bool,
        start: u64,
        len: u64,
        want: u64,
        min: u64,
    ) -> Option<(u64, u64)> {
        let mut best: Option<(u64, u64)> = None;
        let mut run_start = start;
        for b in start..=start + len {
            if b == start + len || taken(b) {
                let l = b - run_start;
                if l >= want {
                    return Some((run_start, want));
                }
                if l >= min && best.is_none_or(|x| x.1 < l) {
                    best = Some((run_start, l));
                }
                run_start = b + 1;
            }
        }
        best
    }

    proptest::proptest! {
        /// Busy, reserved and the transaction's own freed extents, read lazily in order,
        /// allow exactly the blocks a block-by-block reading allows.
        #[test]
        fn usable_given_matches_a_block_by_block_reading(
            extents in proptest::collection::vec((0u64..200, 1u64..12, 0u8..3), 0..40),
            start in 0u64..200,
            len in 1u64..100,
            want in 1u64..20,
            min_frac in 1u64..=4,
        ) {
            let min = (want / min_frac).max(1);
            let mut busy = BusyExtents::default();
            let mut also = Vec::new();
            let mut taken = std::collections::BTreeSet::new();
            let mut stored = std::collections::BTreeSet::new();
            for (s, l, kind) in extents {
                // Busy and reserved extents never overlap one another; the transaction's own
                // may overlap anything.
                if kind < 2 && (s..s + l).any(|b| stored.contains(&b)) {
                    continue;
                }
                match kind {
                    0 => busy.insert(s, l, 1),
                    1 => busy.reserve(s, l),
                    _ => also.push((s, l)),
                }
                if kind < 2 {
                    stored.extend(s..s + l);
                }
                taken.extend(s..s + l);
            }
            let got = usable_given(&busy, &also, start, len, want, min);
            let expect = usable_oracle(&|b| taken.contains(&b), start, len, want, min);
            proptest::prop_assert_eq!(got, expect);
            let stored_any = (start..start + len).any(|b| stored.contains(&b));
            proptest::prop_assert_eq!(busy.overlaps(start, len), stored_any);
        }
    }
}
