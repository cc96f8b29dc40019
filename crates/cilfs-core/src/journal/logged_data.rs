//! File data blocks the log holds whole (an fsync's small write back, `Fs::log_runs`). Such a
//! block has no LSN stamp, so recovery replays any image of it a walk of the log finds. Until
//! the log is covered (`Journal::cover`: every item written back and a record whose tail is
//! itself) the block is therefore written only through the log, never in place, so the
//! newest image is both what the AIL writes and what recovery replays last; its newest bytes
//! are its buffer's until the AIL wrote them (`Journal::logged_data_overlay` serves reads);
//! and freeing it cancels it (`Journal::logged_data_in`), so no older image is replayed over
//! whatever reuses it.
//!
//! A block stays here after a free (its buffer cancelled, which reads skip) until it is
//! allocated again, which happens only once the free, and so the cancel, is stable: from then
//! on no image of it can be replayed or written back, and it leaves (`forget`).

use std::collections::{BTreeMap, HashMap};

/// At most this many blocks are held on the logged path between covers: past it, write back
/// goes in place for blocks not logged yet (`Journal::may_log_data`), so the map stays
/// bounded (about 50 MB) on a mount that never idles long enough to be covered.
pub const LOGGED_BLOCKS_MAX: usize = 1 << 20;

/// Blocks whose data the log holds, each with the checkpoint sequence it was logged in (or a
/// later one) and the inode it was logged for: a cover that found everything through sequence
/// `s` written back drops those at or below `s`. Per inode, how many it holds: freeing an
/// inode's blocks cancels each of them in one transaction, which its log reservation bounds
/// (`Fs::log_runs` keeps to `Fs::logged_blocks_per_inode`).
#[derive(Debug, Default)]
pub(crate) struct LoggedData {
    blocks: BTreeMap<u64, (u64, u64)>,
    per_inode: HashMap<u64, usize>,
}

impl LoggedData {
    pub(crate) fn note(&mut self, blkno: u64, seq: u64, ino: u64) {
        let old = self.blocks.insert(blkno, (seq, ino));
        if let Some((s, i)) = old {
            debug_assert!(s <= seq, "block {blkno} noted at sequence {seq} after {s}");
            self.forget_one(i);
        }
        *self.per_inode.entry(ino).or_default() += 1;
    }

    fn forget_one(&mut self, ino: u64) {
        if let Some(n) = self.per_inode.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                self.per_inode.remove(&ino);
            }
        }
    }

    /// How many blocks logged for `ino` it holds.
    pub(crate) fn of_inode(&self, ino: u64) -> usize {
        self.per_inode.get(&ino).copied().unwrap_or(0)
    }

    pub(crate) fn contains(&self, blkno: u64) -> bool {
        self.blocks.contains_key(&blkno)
    }

    /// The blocks of `[from, to)` held on the logged path.
    pub(crate) fn in_range(&self, from: u64, to: u64) -> Vec<u64> {
        if from >= to {
            return Vec::new();
        }
        self.blocks.range(from..to).map(|(&b, _)| b).collect()
    }

    /// Drops the blocks of `[from, to)`.
    pub(crate) fn forget(&mut self, from: u64, to: u64) {
        for b in self.in_range(from, to) {
            if let Some((_, i)) = self.blocks.remove(&b) {
                self.forget_one(i);
            }
        }
    }

    /// A cover wrote back everything through sequence `seq`: no image logged there can be
    /// replayed any more.
    pub(crate) fn covered(&mut self, seq: u64) {
        let gone: Vec<(u64, u64)> = self
            .blocks
            .iter()
            .filter(|(_, &(s, _))| s <= seq)
            .map(|(&b, &(_, i))| (b, i))
            .collect();
        for (b, i) in gone {
            self.blocks.remove(&b);
            self.forget_one(i);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cover_drops_only_what_it_covered() {
        let mut d = LoggedData::default();
        d.note(10, 3, 7);
        d.note(11, 5, 7);
        d.note(10, 4, 8);
        d.note(12, 2, 7);
        assert_eq!(d.in_range(10, 13), vec![10, 11, 12]);
        assert_eq!(d.in_range(11, 11), Vec::<u64>::new());
        assert_eq!((d.of_inode(7), d.of_inode(8)), (2, 1));
        d.covered(4);
        assert!(!d.contains(10) && !d.contains(12));
        assert!(d.contains(11));
        assert_eq!(d.len(), 1);
        assert_eq!((d.of_inode(7), d.of_inode(8)), (1, 0));
        d.note(20, 9, 8);
        d.note(21, 9, 7);
        d.forget(11, 21);
        assert_eq!(d.in_range(0, 100), vec![21]);
        assert_eq!((d.of_inode(7), d.of_inode(8)), (1, 0));
    }
}
