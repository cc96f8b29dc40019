//! Inode numbers, handed out in runs per directory (issue 17).
//!
//! Creates in different directories then put their new inode items in different leaves of the
//! fs tree (items are keyed by inode number), so optimistic creates running side by side do not
//! meet in one leaf and run again. They still meet when one directory starts a run just past
//! another's, at the tree's right edge, until a split puts a separator between the two: runs
//! grow (`RUN_MIN` doubling to `RUN_MAX`) with the creates a directory sees, so a busy directory
//! starts a run rarely and a directory of a few files takes few numbers. The header's `next_ino` is the on-disk mark: every
//! transaction that uses a number raises it past the end of that number's run, so after a crash
//! no number in the tree is ever handed out again. Numbers of a run not used before a crash or
//! an unmount are skipped, never reused.

use parking_lot::Mutex;

/// Numbers in a directory's first run, and the most in one: tens of leaves of inode items at
/// 4 KiB blocks.
pub(crate) const RUN_MIN: u64 = 16;
pub(crate) const RUN_MAX: u64 = 2048;
/// Directories with a run open at once; past it the runs are dropped (their rest is skipped).
const OPEN_RUNS_MAX: usize = 4096;

#[derive(Debug)]
pub(crate) struct InoAlloc {
    inner: Mutex<Runs>,
}

#[derive(Debug)]
struct Runs {
    /// The first number no run has taken.
    cursor: u64,
    /// Per directory: the next number of its run, the run's end and its length.
    open: crate::numhash::NumberMap<(u64, u64, u64)>,
}

impl InoAlloc {
    /// Starts past `next_ino`, the header's mark.
    pub(crate) fn new(next_ino: u64) -> Self {
        InoAlloc {
            inner: Mutex::new(Runs {
                cursor: next_ino,
                open: Default::default(),
            }),
        }
    }

    /// A number for a new directory: the first of a run of its own, whose rest its own
    /// entries' inodes take (`alloc` with its number), and the end of that run. A directory
    /// and what it holds then sit together in the tree, away from its siblings: creates in
    /// sibling directories made side by side did not, and all changed the leaf holding the
    /// directories' inode items (XFS puts a new directory in an allocation group of its own
    /// for the same reason).
    pub(crate) fn alloc_dir(&self) -> (u64, u64) {
        let mut r = self.inner.lock();
        let start = r.cursor;
        r.start_run(start, RUN_MIN)
    }

    /// A number for a new inode in directory `dir`, and the end of its run: what the
    /// transaction using it must raise the header's `next_ino` to (at least).
    pub(crate) fn alloc(&self, dir: u64) -> (u64, u64) {
        let mut r = self.inner.lock();
        let mut len = RUN_MIN;
        if let Some((next, end, run)) = r.open.get_mut(&dir) {
            if *next < *end {
                let ino = *next;
                *next += 1;
                return (ino, *end);
            }
            len = (*run * 2).min(RUN_MAX);
        }
        r.start_run(dir, len)
    }
}

impl Runs {
    /// A new run of `len` numbers at the cursor for directory `dir`: its first number (taken
    /// now) and its end.
    fn start_run(&mut self, dir: u64, len: u64) -> (u64, u64) {
        if self.open.len() >= OPEN_RUNS_MAX {
            self.open.clear();
        }
        let start = self.cursor;
        let end = start + len;
        self.cursor = end;
        self.open.insert(dir, (start + 1, end, len));
        (start, end)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_new_directory_starts_a_run_its_entries_continue() {
        let a = InoAlloc::new(100);
        let (f, _) = a.alloc(1);
        let (d1, end1) = a.alloc_dir();
        let (d2, _) = a.alloc_dir();
        // Not next to its sibling or to the parent's run: a run of its own each.
        assert!(d1 >= f + RUN_MIN && d2 >= d1 + RUN_MIN, "{f} {d1} {d2}");
        let (c, end) = a.alloc(d1);
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
            let (ino, end) = a.alloc(dir);
            assert!(
                ino >= 100 && ino < end,
                "{ino} not below its run's end {end}"
            );
            assert!(seen.insert(ino), "{ino} handed out twice");
        }
        // Within one directory the numbers of a run are consecutive.
        let (x, _) = a.alloc(7);
        let (y, _) = a.alloc(7);
        assert_eq!(y, x + 1);
        let (z, _) = a.alloc(8);
        assert!(z > x, "a new run starts past every earlier one");
        // A busy directory's runs grow.
        let first = a.alloc(9).0;
        let mut last = first;
        for _ in 0..RUN_MIN + RUN_MIN * 2 {
            last = a.alloc(9).0;
        }
        assert!(last > first + RUN_MIN * 3 - 2);
    }
}
