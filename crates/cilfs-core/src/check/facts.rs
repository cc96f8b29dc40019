//! What the fs tree's walk learns of each inode, kept compact: a million inodes made this a
//! hash map of some 200 bytes an entry, whose growth (rehashing into fresh, zeroed pages) was
//! half of `cilfs check`'s CPU time (perf, 1M empty files).

use crate::fs::items::inode::{FileType, Inode, S_IFDIR, S_IFMT};
use std::collections::BTreeMap;

/// The fields of an inode item the checks read.
#[derive(Debug, Clone, Copy)]
pub(super) struct InodeSummary {
    pub mode: u32,
    pub nlink: u32,
    pub flags: u32,
    pub parent: u64,
    pub size: u64,
    pub blocks: u64,
}

impl InodeSummary {
    pub fn of(i: &Inode) -> Self {
        InodeSummary {
            mode: i.mode,
            nlink: i.nlink,
            flags: i.flags,
            parent: i.parent,
            size: i.size,
            blocks: i.blocks,
        }
    }

    pub fn kind(&self) -> Option<FileType> {
        FileType::from_mode(self.mode)
    }

    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
}

/// What an inode's own items say (names pointing at it and orphan items are kept apart).
#[derive(Debug, Default)]
pub(super) struct InodeFacts {
    pub inode: Option<InodeSummary>,
    pub entries: u64,
    pub subdirs: u64,
    pub ext_blocks: u64,
    pub last_ext_end: u64,
    pub symlink_bytes: u64,
}

/// Facts by inode number. The fs tree is walked in key order, whose first part is the inode
/// number, so entries arrive in ascending order and are appended; a tree whose keys are out of
/// order (reported as such) puts the ones that come late in a map, and each inode still has
/// one entry, as a hash map would keep it.
#[derive(Default)]
pub(super) struct FactTable {
    sorted: Vec<(u64, InodeFacts)>,
    late: BTreeMap<u64, InodeFacts>,
}

impl FactTable {
    /// Room for `n` inodes if memory allows (only what is used is touched): grown by
    /// doubling, a million entries were copied and faulted in twice over.
    pub fn reserve(&mut self, n: usize) {
        let _ = self.sorted.try_reserve_exact(n);
    }

    /// The entry of `ino`, made empty if it has none.
    pub fn entry(&mut self, ino: u64) -> &mut InodeFacts {
        let at = match self.sorted.last() {
            Some(&(last, _)) if last == ino => self.sorted.len() - 1,
            Some(&(last, _)) if last > ino => {
                match self.sorted.binary_search_by_key(&ino, |e| e.0) {
                    Ok(i) => i,
                    Err(_) => return self.late.entry(ino).or_default(),
                }
            }
            _ => {
                self.sorted.push((ino, InodeFacts::default()));
                self.sorted.len() - 1
            }
        };
        &mut self.sorted[at].1
    }

    /// All entries in inode order.
    pub fn finish(self) -> Facts {
        let mut v = self.sorted;
        if !self.late.is_empty() {
            // None of `late` is in `sorted`: every key went to one place only.
            v.extend(self.late);
            v.sort_by_key(|e| e.0);
        }
        Facts(v)
    }
}

/// Facts in inode order, looked up by binary search.
pub(super) struct Facts(pub Vec<(u64, InodeFacts)>);

impl Facts {
    pub fn get(&self, ino: u64) -> Option<&InodeFacts> {
        self.0
            .binary_search_by_key(&ino, |e| e.0)
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub fn inode(&self, ino: u64) -> Option<&InodeSummary> {
        self.get(ino).and_then(|f| f.inode.as_ref())
    }
}

/// A name found in a directory: (the inode it names, the directory, the kind it says).
pub(super) type Ref = (u64, u64, FileType);

/// One inode number's facts joined from the three lists (each sorted by inode): its own
/// items' facts, the names pointing at it (in the order the walk found them), and whether an
/// orphan item names it. Every number in any of the lists comes once, in ascending order.
pub(super) fn join<'a>(
    facts: &'a Facts,
    refs: &'a [Ref],
    orphans: &'a [u64],
) -> impl Iterator<Item = (u64, Option<&'a InodeFacts>, &'a [Ref], bool)> + 'a {
    let (mut f, mut r, mut o) = (0, 0, 0);
    std::iter::from_fn(move || {
        let next = [
            facts.0.get(f).map(|e| e.0),
            refs.get(r).map(|e| e.0),
            orphans.get(o).copied(),
        ]
        .into_iter()
        .flatten()
        .min()?;
        let own = match facts.0.get(f) {
            Some(e) if e.0 == next => {
                f += 1;
                Some(&e.1)
            }
            _ => None,
        };
        let from = r;
        while refs.get(r).is_some_and(|e| e.0 == next) {
            r += 1;
        }
        let orphan = orphans.get(o) == Some(&next);
        if orphan {
            o += 1;
        }
        Some((next, own, &refs[from..r], orphan))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn entries_out_of_order_keep_one_entry_each() {
        let mut t = FactTable::default();
        for ino in [2, 5, 5, 9, 5, 3, 3, 9, 12, 1] {
            t.entry(ino).entries += 1;
        }
        let f = t.finish();
        let got: Vec<(u64, u64)> = f.0.iter().map(|(i, e)| (*i, e.entries)).collect();
        assert_eq!(got, [(1, 1), (2, 1), (3, 2), (5, 3), (9, 2), (12, 1)]);
        assert_eq!(f.get(5).unwrap().entries, 3);
        assert!(f.get(4).is_none());
    }

    #[test]
    fn join_visits_every_number_once_in_order() {
        let mut t = FactTable::default();
        t.entry(2).entries = 1;
        t.entry(7).entries = 2;
        let f = t.finish();
        let refs = [
            (2, 1, FileType::Regular),
            (4, 1, FileType::Regular),
            (4, 9, FileType::Directory),
        ];
        let got: Vec<_> = join(&f, &refs, &[3, 7])
            .map(|(ino, own, r, o)| (ino, own.map(|e| e.entries), r.len(), o))
            .collect();
        assert_eq!(
            got,
            [
                (2, Some(1), 1, false),
                (3, None, 0, true),
                (4, None, 2, false),
                (7, Some(2), 0, true)
            ]
        );
    }
}
