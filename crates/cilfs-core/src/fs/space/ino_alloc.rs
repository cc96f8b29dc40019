//! Inode numbers, handed out in runs per directory, the runs taken from lanes (docs/concurrency.md).
//!
//! Creates in different directories then put their new inode items in different leaves of the
//! fs tree (items are keyed by inode number), so optimistic creates running side by side do not
//! meet in one leaf and run again, nor wait for one another's buffer locks. A new directory
//! takes the next of `LANES` lanes in turn (XFS's rotor over allocation groups for new
//! directories): its own inode is the first number of a run in that lane, and the runs its
//! entries' inodes take come from the same lane. Sibling directories made one after the other
//! so sit far apart in the tree, each with what it holds: from one single cursor, eight
//! directories' inode items shared a leaf that every create in any of them changed, and each
//! directory's new run began at the tree's right edge beside the run another was filling
//! (a third of 8 creating threads' time went to waiting for those leaves' locks). Runs grow
//! (`RUN_MIN` doubling to `RUN_MAX`) with the creates a directory sees, so a directory of a few
//! files takes few numbers.
//!
//! The header's `next_ino` is the on-disk mark: every transaction that uses a number raises it
//! past the end of that number's run. The lanes of a mount start at that mark, so after a crash
//! or an unmount no number in the tree is ever handed out again. Numbers of a run or a lane not
//! used before then are skipped, never reused: each mount may pass over up to
//! `LANES * LANE_WIDTH` numbers (2^20), and a lane a directory used up the rest of it (none if
//! it was used up). Numbers pass 2^32, which 32-bit programs built without large file support
//! cannot stat, after some four thousand mounts that each made sixteen directories or more.

use crate::fs::items::inode::INO_LIMIT;
use crate::util::sync::{rank, RankedMutex};

/// Numbers in a directory's first run, and the most in one: tens of leaves of inode items at
/// 4 KiB blocks.
pub(crate) const RUN_MIN: u64 = 16;
pub(crate) const RUN_MAX: u64 = 2048;
/// Lanes new directories take in turn, and the numbers in each; a lane used up is replaced by
/// a fresh one past every other.
pub(crate) const LANES: usize = 16;
pub(crate) const LANE_WIDTH: u64 = 1 << 16;
/// Directories with a run open at once; past it the runs are dropped (their rest is skipped).
const OPEN_RUNS_MAX: usize = 4096;

const _: () = assert!(RUN_MAX <= LANE_WIDTH);

#[derive(Debug)]
pub(crate) struct InoAlloc {
    inner: RankedMutex<Runs, { rank::INOS }>,
}

#[derive(Debug)]
struct Runs {
    /// Per lane: the first number no run has taken and the lane's end.
    lanes: [(u64, u64); LANES],
    /// Where the next fresh lane starts: past every lane.
    fresh: u64,
    /// The lane the next new directory takes.
    rotor: usize,
    /// Per directory: the next number of its run, the run's end, its length and its lane.
    open: crate::util::numhash::NumberMap<Run>,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    next: u64,
    end: u64,
    len: u64,
    lane: usize,
}

impl InoAlloc {
    /// Lanes from `next_ino`, the header's mark, up (a corrupt mark near 2^64 gives lanes
    /// past `INO_LIMIT`, from which nothing is handed out).
    pub(crate) fn new(next_ino: u64) -> Self {
        let lanes = std::array::from_fn(|i| {
            let start = next_ino.saturating_add(i as u64 * LANE_WIDTH);
            (start, start.saturating_add(LANE_WIDTH))
        });
        InoAlloc {
            inner: RankedMutex::new(Runs {
                lanes,
                fresh: next_ino.saturating_add(LANES as u64 * LANE_WIDTH),
                rotor: 0,
                open: Default::default(),
            }),
        }
    }

    /// A number for a new directory: the first of a run of its own in the next lane, whose rest
    /// its own entries' inodes take (`alloc` with its number), and the end of that run. A
    /// directory and what it holds then sit together in the tree, away from its siblings.
    /// None past `INO_LIMIT`.
    pub(crate) fn alloc_dir(&self) -> Option<(u64, u64)> {
        let mut r = self.inner.lock();
        let lane = r.next_lane();
        r.start_run(None, RUN_MIN, lane)
    }

    /// A number for a new inode in directory `dir`, and the end of its run: what the
    /// transaction using it must raise the header's `next_ino` to (at least). None past
    /// `INO_LIMIT`.
    pub(crate) fn alloc(&self, dir: u64) -> Option<(u64, u64)> {
        let mut r = self.inner.lock();
        match r.open.get_mut(&dir) {
            Some(run) if run.next < run.end => {
                let ino = run.next;
                run.next += 1;
                Some((ino, run.end))
            }
            Some(run) => {
                let (len, lane) = ((run.len * 2).min(RUN_MAX), run.lane);
                r.start_run(Some(dir), len, lane)
            }
            // A directory made before this mount, or whose run was dropped: the next lane,
            // as a new directory takes (by its number, directories that are lanes apart
            // would all share one).
            None => {
                let lane = r.next_lane();
                r.start_run(Some(dir), RUN_MIN, lane)
            }
        }
    }
}

impl Runs {
    fn next_lane(&mut self) -> usize {
        let lane = self.rotor;
        self.rotor = (self.rotor + 1) % LANES;
        lane
    }

    /// A new run of `len` numbers in `lane` for directory `dir` (None: for the new directory
    /// whose number is the run's first): its first number (taken now) and its end. None if it
    /// would pass `INO_LIMIT`.
    fn start_run(&mut self, dir: Option<u64>, len: u64, lane: usize) -> Option<(u64, u64)> {
        if self.open.len() >= OPEN_RUNS_MAX {
            self.open.clear();
        }
        if self.lanes[lane].0.saturating_add(len) > self.lanes[lane].1 {
            if self.fresh.saturating_add(LANE_WIDTH) > INO_LIMIT {
                return None;
            }
            self.lanes[lane] = (self.fresh, self.fresh + LANE_WIDTH);
            self.fresh += LANE_WIDTH;
        }
        if self.lanes[lane].0.saturating_add(len) > INO_LIMIT {
            return None;
        }
        let start = self.lanes[lane].0;
        let end = start + len;
        self.lanes[lane].0 = end;
        self.open.insert(
            dir.unwrap_or(start),
            Run {
                next: start + 1,
                end,
                len,
                lane,
            },
        );
        Some((start, end))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A corrupt mark near the top (next_ino 2^64-1, as a flipped header could hold) hands
    /// out nothing, instead of wrapping round onto the root's number.
    #[test]
    fn numbers_never_pass_the_limit_or_wrap() {
        for mark in [u64::MAX, u64::MAX - 3, INO_LIMIT, INO_LIMIT - 1] {
            let a = InoAlloc::new(mark);
            assert_eq!(a.alloc(1), None, "mark {mark}");
            assert_eq!(a.alloc_dir(), None, "mark {mark}");
        }
        // Close below the limit: numbers until it, then none.
        let a = InoAlloc::new(INO_LIMIT - 20 * LANE_WIDTH);
        let mut last = 0;
        while let Some((ino, end)) = a.alloc(1) {
            assert!(ino < INO_LIMIT && end <= INO_LIMIT && ino > last);
            last = ino;
        }
        assert!(last > INO_LIMIT - 20 * LANE_WIDTH);
    }

    #[test]
    fn a_new_directory_starts_a_run_its_entries_continue() {
        let a = InoAlloc::new(100);
        let (f, _) = a.alloc(1).unwrap();
        let (d1, end1) = a.alloc_dir().unwrap();
        let (d2, _) = a.alloc_dir().unwrap();
        // Not next to its sibling or to the parent's run: a lane of its own each.
        assert!(
            d1 >= f + LANE_WIDTH && d2 >= d1 + LANE_WIDTH,
            "{f} {d1} {d2}"
        );
        let (c, end) = a.alloc(d1).unwrap();
        assert_eq!(
            (c, end),
            (d1 + 1, end1),
            "its entries take the rest of its run"
        );
    }

    #[test]
    fn runs_per_directory_never_overlap() {
        let a = InoAlloc::new(100);
        let mut seen = std::collections::HashSet::new();
        for i in 0..1000u64 {
            let dir = i % 3;
            let (ino, end) = a.alloc(dir).unwrap();
            assert!(
                ino >= 100 && ino < end,
                "{ino} not below its run's end {end}"
            );
            assert!(seen.insert(ino), "{ino} handed out twice");
        }
        // Within one directory the numbers of a run are consecutive.
        let (x, _) = a.alloc(7).unwrap();
        let (y, _) = a.alloc(7).unwrap();
        assert_eq!(y, x + 1);
        // A busy directory's runs grow, and follow one another in its lane.
        let first = a.alloc(9).unwrap().0;
        let mut last = first;
        for _ in 0..RUN_MIN + RUN_MIN * 2 {
            last = a.alloc(9).unwrap().0;
        }
        assert_eq!(last, first + RUN_MIN * 3);
    }

    /// A directory made when its lane has no numbers left starts a fresh lane, and its entries
    /// follow it there; the directory whose run ended that lane keeps its own. (The run was once
    /// recorded under the number the used-up lane would have given: another lane's first
    /// directory, whose entries then moved into the new directory's lane. Found by a review.)
    #[test]
    fn a_directory_made_when_its_lane_is_used_up_keeps_its_run() {
        let a = InoAlloc::new(5);
        // Directories of one run each until every lane is used up exactly.
        let per_lane = LANE_WIDTH / RUN_MIN;
        for i in 0..LANES as u64 * per_lane {
            let (d, _) = a.alloc_dir().unwrap();
            assert!(d < 5 + LANES as u64 * LANE_WIDTH, "directory {i} at {d}");
        }
        // The next takes lane 0 again, which has nothing left: a fresh lane, and its entries
        // follow it there.
        let (d, end) = a.alloc_dir().unwrap();
        assert_eq!(d, 5 + LANES as u64 * LANE_WIDTH);
        assert_eq!(a.alloc(d).unwrap(), (d + 1, end), "its entries follow it");
    }

    /// The directories made one after another each fill a lane of their own, and a lane used
    /// up gives way to a fresh one past every other: no number is handed out twice, and none
    /// below the mark the allocator started from.
    #[test]
    fn sibling_directories_fill_lanes_of_their_own_until_a_fresh_one() {
        let a = InoAlloc::new(5);
        let dirs: Vec<u64> = (0..LANES).map(|_| a.alloc_dir().unwrap().0).collect();
        for (i, &d) in dirs.iter().enumerate() {
            assert_eq!(
                d,
                5 + i as u64 * LANE_WIDTH,
                "directory {i} starts lane {i}"
            );
        }
        let mut seen = std::collections::HashSet::new();
        let mut past_lanes = 0;
        // More than a lane's worth in the first directory, a little in the second.
        for i in 0..LANE_WIDTH + 4 * RUN_MAX {
            let (ino, end) = a.alloc(dirs[0]).unwrap();
            assert!(ino >= 5 && ino < end, "{ino} outside its run (end {end})");
            assert!(seen.insert(ino), "{ino} handed out twice");
            if ino >= 5 + LANES as u64 * LANE_WIDTH {
                past_lanes += 1;
            } else {
                assert!(
                    ino < 5 + LANE_WIDTH,
                    "{ino} left the first directory's lane"
                );
            }
            if i % 1024 == 0 {
                let (o, _) = a.alloc(dirs[1]).unwrap();
                assert!(
                    (dirs[1]..dirs[1] + LANE_WIDTH).contains(&o),
                    "{o} left the second directory's lane"
                );
                assert!(seen.insert(o), "{o} handed out twice");
            }
        }
        assert!(past_lanes > 0, "the first lane was used up and replaced");
        // The 17th directory shares the first lane, at its current end.
        let (d, _) = a.alloc_dir().unwrap();
        assert!(d >= 5 + LANES as u64 * LANE_WIDTH, "{d}");
    }
}
