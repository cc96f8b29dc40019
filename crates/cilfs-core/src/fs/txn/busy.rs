//! Busy extents: extents freed by a transaction whose checkpoint is not yet stable, which must
//! not be reused: if the free were lost in a crash, new data written in place would land in a
//! block the recovered filesystem still uses. A transaction records what it frees here at
//! commit (`FsTx::insert_shared`, `commit`); allocation (`fs/space/`) looks here first.

use crate::util::lockstat::LockWaits;
use crate::util::sync::{rank, RankedMutex, RankedMutexGuard};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Extents freed by checkpoints that may not be stable yet: start -> (len, checkpoint seq).
/// Pruned at the start of every transaction with the same stable sequence the transaction's
/// allocations use, so the extents kept never overlap: a block is reallocated only once its
/// entry is stale, and a stale entry is gone before the transaction that could free it again.
#[derive(Debug, Default)]
pub struct BusyExtents {
    map: BTreeMap<u64, (u64, u64)>,
    by_seq: BTreeMap<u64, Vec<u64>>,
    blocks: u64,
    /// Extents a write chose for its data and writes outside the filesystem lock before the
    /// transaction that maps them (start -> len): free on disk until then, but never given to
    /// anyone else (`Fs::reserve_blocks`).
    reserved: BTreeMap<u64, u64>,
    reserved_blocks: u64,
    /// Blocks promised to delayed allocation: pages written into holes that get their blocks
    /// at write back (`cache/pagecache.rs`), counted but not chosen yet.
    delalloc: u64,
}

/// `BusyExtents` behind their lock, with the two figures every transaction asks of them
/// readable without it: whether a prune would drop anything, and how many blocks are taken.
/// A create asked twice under the lock, and its cache line went between the cores for
/// nothing, since creates free nothing. Both are stored when a holder lets go
/// (`BusyGuard`), so a reader sees them as the last holder left them.
#[derive(Debug, Default)]
pub struct Busy {
    extents: RankedMutex<BusyExtents, { rank::BUSY }>,
    /// The oldest checkpoint sequence any busy extent waits for, plus one (0: none).
    oldest_seq_plus_one: AtomicU64,
    /// Busy and reserved blocks together.
    taken: AtomicU64,
}

/// A hold of `Busy`'s lock; publishes its lock-free figures when dropped.
#[derive(Debug)]
pub struct BusyGuard<'a> {
    g: RankedMutexGuard<'a, BusyExtents, { rank::BUSY }>,
    busy: &'a Busy,
}

impl Busy {
    pub fn lock(&self) -> BusyGuard<'_> {
        BusyGuard {
            g: self.extents.lock(),
            busy: self,
        }
    }

    /// `lock`, its waits counted in `waits` (polled a moment before blocking).
    pub fn lock_counted(&self, waits: &LockWaits) -> BusyGuard<'_> {
        BusyGuard {
            g: self.extents.lock_short(waits),
            busy: self,
        }
    }

    /// Whether `prune(completed_seq)` could drop anything. False is safe to act on even if
    /// stale: an extent added since is for a checkpoint newer than the caller's
    /// `completed_seq`, or else is only kept busy a little longer (it never is reused
    /// while its entry stays).
    pub fn prune_due(&self, completed_seq: u64) -> bool {
        match self.oldest_seq_plus_one.load(Ordering::Acquire) {
            0 => false,
            s => s - 1 <= completed_seq,
        }
    }

    /// Prunes, taking the lock only if there is anything to drop.
    pub fn prune(&self, completed_seq: u64) {
        if self.prune_due(completed_seq) {
            self.lock().prune(completed_seq);
        }
    }

    /// Busy and reserved blocks as the last holder of the lock left them; busy ones are
    /// counted until pruned, so this is never below what a prune would leave.
    pub fn taken_blocks(&self) -> u64 {
        self.taken.load(Ordering::Acquire)
    }
}

impl std::ops::Deref for BusyGuard<'_> {
    type Target = BusyExtents;
    fn deref(&self) -> &BusyExtents {
        &self.g
    }
}

impl std::ops::DerefMut for BusyGuard<'_> {
    fn deref_mut(&mut self) -> &mut BusyExtents {
        &mut self.g
    }
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let oldest = self.g.by_seq.keys().next().map_or(0, |&s| s + 1);
        self.busy
            .oldest_seq_plus_one
            .store(oldest, Ordering::Release);
        self.busy
            .taken
            .store(self.g.blocks + self.g.reserved_blocks(), Ordering::Release);
    }
}

impl BusyExtents {
    pub fn insert(&mut self, start: u64, len: u64, seq: u64) {
        let old = self.map.insert(start, (len, seq));
        debug_assert!(
            old.is_none(),
            "busy extent {start}+{len} overlaps a live one"
        );
        self.blocks += len;
        self.by_seq.entry(seq).or_default().push(start);
    }

    /// Forgets extents whose checkpoint is stable.
    pub fn prune(&mut self, completed_seq: u64) {
        while let Some(entry) = self.by_seq.first_entry() {
            if *entry.key() > completed_seq {
                break;
            }
            let seq = *entry.key();
            for start in entry.remove() {
                if let Some(&(l, s)) = self.map.get(&start) {
                    if s == seq {
                        self.map.remove(&start);
                        self.blocks -= l;
                    }
                }
            }
        }
    }

    /// Blocks still busy (after `prune`).
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Keeps `[start, start+len)` from every allocation until `unreserve`.
    pub fn reserve(&mut self, start: u64, len: u64) {
        let clash: Vec<_> = self.overlapping(start, start + len).collect();
        assert!(
            clash.is_empty(),
            "reserving {start}+{len}, which overlaps busy or reserved {clash:?}"
        );
        self.reserved.insert(start, len);
        self.reserved_blocks += len;
    }

    pub fn unreserve(&mut self, start: u64, len: u64) {
        let old = self.reserved.remove(&start);
        assert_eq!(
            old,
            Some(len),
            "unreserving {start}+{len}, which was not reserved"
        );
        self.reserved_blocks -= len;
    }

    /// Whether any block of `[start, start+len)` is busy or reserved.
    pub fn overlaps(&self, start: u64, len: u64) -> bool {
        self.overlapping(start, start + len).next().is_some()
    }

    /// Blocks reserved by writes in flight, chosen or promised to delayed allocation.
    pub fn reserved_blocks(&self) -> u64 {
        self.reserved_blocks + self.delalloc
    }

    /// Promises `n` blocks to delayed allocation until `release_delalloc`.
    pub fn reserve_delalloc(&mut self, n: u64) {
        self.delalloc += n;
    }

    pub fn release_delalloc(&mut self, n: u64) {
        assert!(
            n <= self.delalloc,
            "releasing {n} delayed allocation blocks of {}",
            self.delalloc
        );
        self.delalloc -= n;
    }

    /// Blocks promised to delayed allocation.
    pub fn delalloc_blocks(&self) -> u64 {
        self.delalloc
    }

    /// Busy and reserved ranges overlapping `[start, end)` as `(start, end)`, in ascending
    /// order of start, produced as they are asked for: an allocation stops at the first gap
    /// long enough, and a free extent may hold thousands of busy ones (untar frees a
    /// preallocated tail at every close), which collecting and sorting in full made a tenth of
    /// its daemon's time. Extents of each map never overlap one another (`insert`,
    /// `reserve`), so only the last one starting before `start` can reach into the range.
    pub(crate) fn overlapping(
        &self,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u64, u64)> + '_ {
        let busy_from = last_start_before(&self.map, start).unwrap_or(start);
        let reserved_from = last_start_before(&self.reserved, start).unwrap_or(start);
        let busy = self
            .map
            .range(busy_from..end)
            .map(|(&s, &(l, _))| (s, s + l));
        let reserved = self
            .reserved
            .range(reserved_from..end)
            .map(|(&s, &l)| (s, s + l));
        merge_ascending(busy, reserved).filter(move |&(_, e)| e > start)
    }
}

fn last_start_before<V>(m: &BTreeMap<u64, V>, start: u64) -> Option<u64> {
    m.range(..start).next_back().map(|(&s, _)| s)
}

/// Two iterators of ranges, each ascending by start, as one ascending by start.
pub(crate) fn merge_ascending(
    a: impl Iterator<Item = (u64, u64)>,
    b: impl Iterator<Item = (u64, u64)>,
) -> impl Iterator<Item = (u64, u64)> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if y < x => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_figures_read_without_the_lock_follow_every_hold() {
        let busy = Busy::default();
        assert!(!busy.prune_due(u64::MAX), "nothing busy");
        assert_eq!(busy.taken_blocks(), 0);
        {
            let mut b = busy.lock();
            b.insert(100, 4, 7);
            b.insert(200, 2, 9);
            b.reserve(300, 5);
        }
        assert_eq!(busy.taken_blocks(), 11);
        assert!(!busy.prune_due(6), "the oldest waits for checkpoint 7");
        assert!(busy.prune_due(7));
        busy.prune(6);
        assert_eq!(busy.taken_blocks(), 11, "a prune before 7 drops nothing");
        busy.prune(8);
        assert_eq!(busy.taken_blocks(), 7, "the extent of checkpoint 7 is gone");
        assert!(!busy.prune_due(8) && busy.prune_due(9));
        busy.lock().unreserve(300, 5);
        assert_eq!(busy.taken_blocks(), 2);
        busy.prune(9);
        assert_eq!(busy.taken_blocks(), 0);
        assert!(!busy.prune_due(u64::MAX), "empty again");
        // A holder that only looks leaves the figures as they were.
        busy.lock().insert(50, 1, 3);
        drop(busy.lock());
        assert!(busy.prune_due(3));
        assert_eq!(busy.taken_blocks(), 1);
    }
}
