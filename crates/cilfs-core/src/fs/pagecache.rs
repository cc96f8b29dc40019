//! File data pages in memory, keyed by (inode, file block), like a kernel page cache.
//!
//! Overwrites of blocks a file already owns land here and return without IO; `fsync`, `sync`,
//! unmount, the periodic flush and memory pressure write them back in place. Newly allocated
//! blocks do not go through here: their data is written before the transaction that maps them
//! commits (ordered mode), so they never wait in memory behind a committed mapping. Pages of
//! blocks a file gives up (truncate, punch, unlink) are dropped before the blocks are freed, so
//! nothing is ever written into a block after it changed hands.

use std::collections::BTreeMap;

#[derive(Debug)]
struct Page {
    data: Box<[u8]>,
    dirty: bool,
}

#[derive(Debug)]
pub struct PageCache {
    pages: BTreeMap<(u64, u64), Page>,
    dirty: usize,
    /// Clean pages beyond this are dropped.
    max_pages: usize,
    /// Dirty pages beyond this make the writer write everything back.
    pub dirty_limit: usize,
}

impl PageCache {
    pub fn new(max_bytes: u64, block_size: u32) -> Self {
        let max_pages = (max_bytes / u64::from(block_size)).max(64) as usize;
        PageCache {
            pages: BTreeMap::new(),
            dirty: 0,
            max_pages,
            dirty_limit: max_pages / 2,
        }
    }

    /// Copies the cached page of (ino, fb) into `out`; false if it is not cached.
    pub fn read(&self, ino: u64, fb: u64, out: &mut [u8]) -> bool {
        match self.pages.get(&(ino, fb)) {
            Some(p) => {
                out.copy_from_slice(&p.data);
                true
            }
            None => false,
        }
    }

    pub fn contains(&self, ino: u64, fb: u64) -> bool {
        self.pages.contains_key(&(ino, fb))
    }

    /// Whether any page of `ino` is cached.
    pub fn has_pages(&self, ino: u64) -> bool {
        self.pages
            .range((ino, 0)..=(ino, u64::MAX))
            .next()
            .is_some()
    }

    /// Stores a whole block as the newest contents of (ino, fb), dirty.
    pub fn put_dirty(&mut self, ino: u64, fb: u64, block: &[u8]) {
        match self.pages.get_mut(&(ino, fb)) {
            Some(p) => {
                p.data.copy_from_slice(block);
                if !p.dirty {
                    p.dirty = true;
                    self.dirty += 1;
                }
            }
            None => {
                self.pages.insert(
                    (ino, fb),
                    Page {
                        data: block.into(),
                        dirty: true,
                    },
                );
                self.dirty += 1;
                self.trim();
            }
        }
    }

    /// Zeroes (ino, fb) from byte `from` on, if cached (marking it dirty).
    pub fn zero_from(&mut self, ino: u64, fb: u64, from: usize) -> bool {
        let Some(p) = self.pages.get_mut(&(ino, fb)) else {
            return false;
        };
        p.data[from..].fill(0);
        if !p.dirty {
            p.dirty = true;
            self.dirty += 1;
        }
        true
    }

    /// Dirty pages of `ino` (or of every inode), marked clean: the caller writes them back.
    pub fn take_dirty(&mut self, ino: Option<u64>) -> Vec<(u64, u64, Box<[u8]>)> {
        let range = match ino {
            Some(i) => (i, 0)..=(i, u64::MAX),
            None => (0, 0)..=(u64::MAX, u64::MAX),
        };
        let mut out = Vec::new();
        for (&(i, fb), p) in self.pages.range_mut(range) {
            if p.dirty {
                p.dirty = false;
                out.push((i, fb, p.data.clone()));
            }
        }
        self.dirty -= out.len();
        out
    }

    /// Inodes with dirty pages, in order.
    pub fn dirty_inodes(&self) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        for (&(i, _), p) in &self.pages {
            if p.dirty && out.last() != Some(&i) {
                out.push(i);
            }
        }
        out
    }

    /// Forgets the pages of `ino` for file blocks `[from, to)`, dirty or not.
    pub fn drop_range(&mut self, ino: u64, from: u64, to: u64) {
        if from >= to {
            return;
        }
        let keys: Vec<(u64, u64)> = self
            .pages
            .range((ino, from)..(ino, to))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(p) = self.pages.remove(&k) {
                if p.dirty {
                    self.dirty -= 1;
                }
            }
        }
    }

    pub fn dirty_pages(&self) -> usize {
        self.dirty
    }

    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// Drops clean pages while over the limit.
    fn trim(&mut self) {
        if self.pages.len() <= self.max_pages {
            return;
        }
        let excess = self.pages.len() - self.max_pages / 8 * 7;
        let victims: Vec<(u64, u64)> = self
            .pages
            .iter()
            .filter(|(_, p)| !p.dirty)
            .map(|(k, _)| *k)
            .take(excess)
            .collect();
        for k in victims {
            self.pages.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_tracking_and_ranges() {
        let mut c = PageCache::new(1 << 20, 4096);
        c.put_dirty(1, 0, &[1u8; 4096]);
        c.put_dirty(1, 5, &[2u8; 4096]);
        c.put_dirty(2, 0, &[3u8; 4096]);
        assert_eq!(c.dirty_pages(), 3);
        let mut b = [0u8; 4096];
        assert!(c.read(1, 5, &mut b) && b[0] == 2);
        let d = c.take_dirty(Some(1));
        assert_eq!(d.len(), 2);
        assert_eq!(c.dirty_pages(), 1);
        c.drop_range(1, 0, 10);
        assert!(!c.contains(1, 5));
        assert!(c.zero_from(2, 0, 10));
        assert_eq!(c.take_dirty(None).len(), 1);
        assert_eq!(c.dirty_pages(), 0);
    }
}
