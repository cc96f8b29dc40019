//! File data pages in memory, keyed by (inode, file block), like a kernel page cache.
//!
//! Buffered writes land here and return without data IO; `fsync`, `sync`, unmount, the
//! periodic flush and memory pressure write them back in place. A page written into a hole is
//! marked for delayed allocation: its block is chosen, written and mapped at write back
//! (`fs/space/delalloc.rs`); with `nodelalloc` the write maps its blocks unwritten first (they
//! read as zeros until write back has written them and marked them written:
//! `fs/posix/sync.rs`). Either way a crash never shows a block's old contents. Pages of blocks
//! a file gives up (truncate, punch, unlink) are dropped before the blocks are freed, so
//! nothing is ever written into a block after it changed hands.
//!
//! A page's contents are shared, not copied, with the write back that takes it: a write to a
//! page under write back gives the page new contents and leaves the taken ones to the IO.
//! Pages dropped from the cache are kept (a few per shard, a thirty-second of the cache in all)
//! for the next new page, so a stream of writes through a full cache reuses memory instead of
//! faulting in fresh memory that the kernel must zero.
//!
//! The pages are in shards by inode, each behind a lock of its own: writers of
//! different files put their pages side by side under the state lock taken shared. One inode's
//! pages are all in one shard, so a write sees and changes its pages under one hold of one
//! lock (`PageCache::lock`). The shard lock is a leaf: nothing else is taken under it, and
//! no IO happens under it.

use crate::util::lockstat::LockWaits;
use crate::util::sync::{rank, RankedMutex, RankedMutexGuard};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

// Sharded as the inode cache is: an inode's pages and its inode hash to the same shard number.
use crate::fs::cache::inode_cache::{shard_of, SHARDS};

/// The contents of one page (a block), shared with a write back that took it.
pub type PageData = Arc<[u8]>;

/// Dropped pages a shard keeps for new ones.
const SPARES_PER_SHARD: usize = 32;

/// The keys of all of `ino`'s pages.
fn inode_keys(ino: u64) -> RangeInclusive<(u64, u64)> {
    (ino, 0)..=(ino, u64::MAX)
}

#[derive(Debug)]
struct Page {
    data: PageData,
    /// Written into a hole: its block is chosen at write back (delayed allocation), one
    /// promised by the write (`BusyExtents::reserve_delalloc`). Never dropped to trim the
    /// cache, even while its write back has it (clean) and has not mapped it yet.
    delalloc: bool,
}

#[derive(Debug, Default)]
struct Shard {
    pages: BTreeMap<(u64, u64), Page>,
    /// The dirty ones among `pages`: an fsync of a large file with a few dirty pages (a
    /// database's log) finds them without walking the clean ones.
    dirty: BTreeSet<(u64, u64)>,
    /// Pages marked `delalloc`, by inode.
    delalloc: std::collections::HashMap<u64, u64>,
    /// Contents of dropped pages, held by nothing else, for new pages.
    spares: Vec<PageData>,
}

impl Shard {
    /// Contents for a new page: `block`, in a dropped page's memory where there is one.
    fn new_data(&mut self, spares: &AtomicUsize, block: &[u8]) -> PageData {
        while let Some(mut d) = self.spares.pop() {
            spares.fetch_sub(1, Ordering::Relaxed);
            if let Some(m) = Arc::get_mut(&mut d).filter(|m| m.len() == block.len()) {
                m.copy_from_slice(block);
                return d;
            }
        }
        block.into()
    }
}

#[derive(Debug)]
pub struct PageCache {
    shards: Box<[RankedMutex<Shard, { rank::PAGES }>]>,
    /// Dirty pages in all shards (changed under the shard's lock).
    dirty: AtomicUsize,
    /// Pages in all shards (changed under the shard's lock).
    pages: AtomicUsize,
    /// Clean pages beyond this are dropped.
    max_pages: usize,
    /// Dirty pages beyond this make the writer write everything back.
    pub dirty_limit: usize,
    /// Pages marked for delayed allocation in all shards.
    delalloc: AtomicUsize,
    /// Dropped pages kept for new ones, in all shards, and the most kept: a bounded share of
    /// the cache, beyond `max_pages`.
    spares: AtomicUsize,
    spares_max: usize,
    pub(crate) waits: LockWaits,
}

/// One inode's pages, its shard locked: what a write reads and changes in one hold.
#[derive(Debug)]
pub struct InodePages<'a> {
    cache: &'a PageCache,
    /// Held until the hold ends (taken in `drop`, which lets it go before it trims others).
    shard: Option<RankedMutexGuard<'a, Shard, { rank::PAGES }>>,
    ino: u64,
    /// Pages this hold added: the cache may be over its limit once the lock is let go.
    added: bool,
}

impl InodePages<'_> {
    fn pages(&self) -> &BTreeMap<(u64, u64), Page> {
        match &self.shard {
            Some(s) => &s.pages,
            None => unreachable!("held until dropped"),
        }
    }

    fn shard_mut(&mut self) -> &mut Shard {
        match &mut self.shard {
            Some(s) => s,
            None => unreachable!("held until dropped"),
        }
    }

    /// Copies the cached page `fb` into `out`; false if it is not cached.
    pub fn read(&self, fb: u64, out: &mut [u8]) -> bool {
        match self.pages().get(&(self.ino, fb)) {
            Some(p) => {
                out.copy_from_slice(&p.data);
                true
            }
            None => false,
        }
    }

    pub fn contains(&self, fb: u64) -> bool {
        self.pages().contains_key(&(self.ino, fb))
    }

    /// Stores a whole block as the newest contents of page `fb`, dirty.
    pub fn put_dirty(&mut self, fb: u64, block: &[u8]) {
        let (ino, cache) = (self.ino, self.cache);
        let shard = self.shard_mut();
        match shard.pages.get_mut(&(ino, fb)) {
            Some(p) => {
                match Arc::get_mut(&mut p.data) {
                    Some(d) => d.copy_from_slice(block),
                    // A write back holds the older contents: it writes those.
                    None => p.data = block.into(),
                }
                if shard.dirty.insert((ino, fb)) {
                    cache.dirty.fetch_add(1, Ordering::Relaxed);
                }
            }
            None => {
                let data = shard.new_data(&cache.spares, block);
                shard.pages.insert(
                    (ino, fb),
                    Page {
                        data,
                        delalloc: false,
                    },
                );
                shard.dirty.insert((ino, fb));
                cache.dirty.fetch_add(1, Ordering::Relaxed);
                cache.pages.fetch_add(1, Ordering::Relaxed);
                self.added = true;
            }
        }
    }

    /// Puts a write's pages (file block, contents), dirty, those in holes (`delalloc`)
    /// marked for delayed allocation; how many of those were not marked before.
    pub fn put_blocks(&mut self, blocks: Vec<(u64, Vec<u8>)>, delalloc: &[u64]) -> u64 {
        for (fb, block) in blocks {
            self.put_dirty(fb, &block);
        }
        delalloc
            .iter()
            .map(|&fb| u64::from(self.set_delalloc(fb)))
            .sum()
    }

    /// Marks the cached page `fb`, written into a hole, for delayed allocation; whether it
    /// was not marked before (one more block promised).
    pub fn set_delalloc(&mut self, fb: u64) -> bool {
        let ino = self.ino;
        let cache = self.cache;
        let shard = self.shard_mut();
        let Some(p) = shard.pages.get_mut(&(ino, fb)) else {
            return false;
        };
        if p.delalloc {
            return false;
        }
        p.delalloc = true;
        *shard.delalloc.entry(ino).or_default() += 1;
        cache.delalloc.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Zeroes bytes `[from, to)` of page `fb`, if cached (marking it dirty).
    pub fn zero_range(&mut self, fb: u64, from: usize, to: usize) -> bool {
        let ino = self.ino;
        let cache = self.cache;
        let shard = self.shard_mut();
        let Some(p) = shard.pages.get_mut(&(ino, fb)) else {
            return false;
        };
        Arc::make_mut(&mut p.data)[from..to].fill(0);
        if shard.dirty.insert((ino, fb)) {
            cache.dirty.fetch_add(1, Ordering::Relaxed);
        }
        true
    }
}

impl Drop for InodePages<'_> {
    fn drop(&mut self) {
        let Some(mut shard) = self.shard.take() else {
            return;
        };
        if !self.added || self.cache.pages.load(Ordering::Relaxed) <= self.cache.max_pages {
            return;
        }
        // This shard first, at the end of the hold, so no page the hold still needed (an edge
        // of the write) was dropped under it; then, its lock let go, the others, each only
        // tried (a shard in use is left for its own writer's next trim).
        self.cache.trim_shard(&mut shard);
        drop(shard);
        for s in self.cache.shards.iter() {
            if self.cache.pages.load(Ordering::Relaxed) <= self.cache.max_pages / 8 * 7 {
                break;
            }
            if let Some(mut other) = s.try_lock() {
                self.cache.trim_shard(&mut other);
            }
        }
    }
}

impl PageCache {
    pub fn new(max_bytes: u64, block_size: u32) -> Self {
        let max_pages = (max_bytes / u64::from(block_size)).max(64) as usize;
        PageCache {
            shards: (0..SHARDS)
                .map(|_| RankedMutex::new(Shard::default()))
                .collect(),
            dirty: AtomicUsize::new(0),
            pages: AtomicUsize::new(0),
            max_pages,
            dirty_limit: max_pages / 2,
            delalloc: AtomicUsize::new(0),
            spares: AtomicUsize::new(0),
            spares_max: max_pages / 32,
            waits: LockWaits::new("page cache"),
        }
    }

    fn shard(&self, ino: u64) -> RankedMutexGuard<'_, Shard, { rank::PAGES }> {
        self.shards[shard_of(ino)].lock_short(&self.waits)
    }

    /// `ino`'s pages, its shard locked until the result is dropped.
    pub fn lock(&self, ino: u64) -> InodePages<'_> {
        InodePages {
            cache: self,
            shard: Some(self.shard(ino)),
            ino,
            added: false,
        }
    }

    pub fn contains(&self, ino: u64, fb: u64) -> bool {
        self.lock(ino).contains(fb)
    }

    /// The file blocks in `[from, to)` of `ino` with a page cached, in order.
    pub fn cached_in(&self, ino: u64, from: u64, to: u64) -> Vec<u64> {
        if from >= to {
            return Vec::new();
        }
        self.shard(ino)
            .pages
            .range((ino, from)..(ino, to))
            .map(|(&(_, fb), _)| fb)
            .collect()
    }

    /// Whether any page of `ino` is cached.
    pub fn has_pages(&self, ino: u64) -> bool {
        self.shard(ino)
            .pages
            .range(inode_keys(ino))
            .next()
            .is_some()
    }

    /// Zeroes bytes `[from, to)` of (ino, fb), if cached (marking it dirty).
    pub fn zero_range(&self, ino: u64, fb: u64, from: usize, to: usize) -> bool {
        self.lock(ino).zero_range(fb, from, to)
    }

    /// Dirty pages of `ino`, marked clean: the caller writes them back. Their contents are
    /// shared, not copied: a later write to one of them gives the page new contents.
    pub fn take_dirty(&self, ino: u64) -> Vec<(u64, u64, PageData)> {
        let mut shard = self.shard(ino);
        let shard = &mut *shard;
        let keys: Vec<(u64, u64)> = shard.dirty.range(inode_keys(ino)).copied().collect();
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            shard.dirty.remove(&k);
            let Some(p) = shard.pages.get(&k) else {
                panic!("dirty page {k:?} is not cached");
            };
            out.push((k.0, k.1, p.data.clone()));
        }
        self.dirty.fetch_sub(out.len(), Ordering::Relaxed);
        out
    }

    /// The file blocks of `ino`'s pages marked for delayed allocation, in order.
    pub fn delalloc_blocks(&self, ino: u64) -> Vec<u64> {
        let shard = self.shard(ino);
        if !shard.delalloc.contains_key(&ino) {
            return Vec::new();
        }
        shard
            .pages
            .range(inode_keys(ino))
            .filter(|(_, p)| p.delalloc)
            .map(|(&(_, fb), _)| fb)
            .collect()
    }

    /// Pages of `ino` in file blocks `[from, to)` marked for delayed allocation.
    pub fn delalloc_in(&self, ino: u64, from: u64, to: u64) -> u64 {
        if from >= to {
            return 0;
        }
        let shard = self.shard(ino);
        if !shard.delalloc.contains_key(&ino) {
            return 0;
        }
        shard
            .pages
            .range((ino, from)..(ino, to))
            .filter(|(_, p)| p.delalloc)
            .count() as u64
    }

    /// Pages of `ino` marked for delayed allocation.
    pub fn delalloc_of(&self, ino: u64) -> u64 {
        self.shard(ino).delalloc.get(&ino).copied().unwrap_or(0)
    }

    /// Pages marked for delayed allocation in the whole cache.
    pub fn delalloc_pages(&self) -> u64 {
        self.delalloc.load(Ordering::Relaxed) as u64
    }

    /// Clears the delayed allocation mark of `ino`'s pages `fbs`, now mapped; how many were
    /// marked (the blocks no longer promised).
    pub fn mapped(&self, ino: u64, fbs: &[u64]) -> u64 {
        let mut shard = self.shard(ino);
        let mut n = 0;
        for fb in fbs {
            if let Some(p) = shard.pages.get_mut(&(ino, *fb)).filter(|p| p.delalloc) {
                p.delalloc = false;
                n += 1;
            }
        }
        self.unmark(&mut shard, ino, n);
        n
    }

    /// Takes `n` pages of `ino` off the delayed allocation counts.
    fn unmark(&self, shard: &mut Shard, ino: u64, n: u64) {
        if n == 0 {
            return;
        }
        let c = shard.delalloc.get_mut(&ino).expect("marked pages counted");
        assert!(
            *c >= n,
            "inode {ino}: {n} of {c} delayed allocation pages unmarked"
        );
        *c -= n;
        if *c == 0 {
            shard.delalloc.remove(&ino);
        }
        self.delalloc.fetch_sub(n as usize, Ordering::Relaxed);
    }

    /// The file blocks of `ino`'s dirty pages, in order.
    pub fn dirty_blocks(&self, ino: u64) -> Vec<u64> {
        self.shard(ino)
            .dirty
            .range(inode_keys(ino))
            .map(|&(_, fb)| fb)
            .collect()
    }

    /// Inodes with dirty pages, in order.
    pub fn dirty_inodes(&self) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        for s in self.shards.iter() {
            let shard = s.lock_short(&self.waits);
            for &(i, _) in &shard.dirty {
                if out.last() != Some(&i) {
                    out.push(i);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Forgets the pages of `ino` for file blocks `[from, to)`, dirty or not. How many of
    /// them were marked for delayed allocation (blocks no longer promised).
    #[must_use = "the blocks promised to dropped delayed allocation pages must be released"]
    pub fn drop_range(&self, ino: u64, from: u64, to: u64) -> u64 {
        if from >= to {
            return 0;
        }
        let mut shard = self.shard(ino);
        let keys: Vec<(u64, u64)> = shard
            .pages
            .range((ino, from)..(ino, to))
            .map(|(k, _)| *k)
            .collect();
        let mut delalloc = 0;
        for k in keys {
            if let Some((dirty, marked)) = self.remove(&mut shard, &k) {
                self.pages.fetch_sub(1, Ordering::Relaxed);
                if dirty {
                    self.dirty.fetch_sub(1, Ordering::Relaxed);
                }
                delalloc += u64::from(marked);
            }
        }
        self.unmark(&mut shard, ino, delalloc);
        delalloc
    }

    pub fn dirty_pages(&self) -> usize {
        self.dirty.load(Ordering::Relaxed)
    }

    pub fn pages(&self) -> usize {
        self.pages.load(Ordering::Relaxed)
    }

    /// Drops the page at `k`, keeping its memory for a new page if nothing else holds it and
    /// the spares have room. Whether it was dirty and marked for delayed allocation; `None`
    /// if there was no page.
    fn remove(&self, shard: &mut Shard, k: &(u64, u64)) -> Option<(bool, bool)> {
        let p = shard.pages.remove(k)?;
        let dirty = shard.dirty.remove(k);
        if shard.spares.len() < SPARES_PER_SHARD
            && Arc::strong_count(&p.data) == 1
            && self.spares.load(Ordering::Relaxed) < self.spares_max
        {
            self.spares.fetch_add(1, Ordering::Relaxed);
            shard.spares.push(p.data);
        }
        Some((dirty, p.delalloc))
    }

    /// Drops clean pages of one shard, while the cache is over its limit, down to 7/8 of it
    /// (one file's pages all sit in one shard, so a shard has no share of its own). A shard
    /// of dirty pages drops nothing: write back (`over_dirty_limit`) makes them clean.
    fn trim_shard(&self, shard: &mut Shard) {
        let target = self.max_pages / 8 * 7;
        let excess = self.pages.load(Ordering::Relaxed).saturating_sub(target);
        if excess == 0 {
            return;
        }
        let victims: Vec<(u64, u64)> = shard
            .pages
            .iter()
            .filter(|(k, p)| !p.delalloc && !shard.dirty.contains(k))
            .map(|(k, _)| *k)
            .take(excess)
            .collect();
        for k in victims {
            self.remove(shard, &k);
            self.pages.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_tracking_and_ranges() {
        let c = PageCache::new(1 << 20, 4096);
        c.lock(1).put_dirty(0, &[1u8; 4096]);
        c.lock(1).put_dirty(5, &[2u8; 4096]);
        c.lock(2).put_dirty(0, &[3u8; 4096]);
        assert_eq!(c.dirty_pages(), 3);
        assert_eq!(c.dirty_inodes(), [1, 2]);
        let mut b = [0u8; 4096];
        assert!(c.lock(1).read(5, &mut b) && b[0] == 2);
        let d = c.take_dirty(1);
        assert_eq!(d.len(), 2);
        assert_eq!(c.dirty_pages(), 1);
        assert_eq!(c.dirty_inodes(), [2]);
        assert_eq!(c.drop_range(1, 0, 10), 0);
        assert!(!c.contains(1, 5));
        assert!(!c.has_pages(1));
        assert_eq!(c.pages(), 1);
        assert!(c.zero_range(2, 0, 10, 20));
        assert_eq!(c.take_dirty(2).len(), 1);
        assert_eq!(c.dirty_pages(), 0);
    }

    /// Among many clean pages of one file, the few made dirty again (by a write, a zeroed
    /// range) are the ones found and taken; a dropped dirty page is neither.
    #[test]
    fn a_few_dirty_pages_among_clean_ones_are_found_and_taken() {
        let c = PageCache::new(1 << 24, 4096);
        for fb in 0..512 {
            c.lock(9).put_dirty(fb, &[1u8; 4096]);
        }
        assert_eq!(c.take_dirty(9).len(), 512);
        assert_eq!(c.dirty_blocks(9), Vec::<u64>::new());
        c.lock(9).put_dirty(300, &[2u8; 4096]);
        c.lock(9).put_dirty(7, &[2u8; 4096]);
        c.lock(9).put_dirty(7, &[3u8; 4096]);
        assert!(c.zero_range(9, 100, 0, 8));
        assert!(
            c.zero_range(9, 100, 8, 16),
            "a dirty page zeroed again stays one page"
        );
        c.lock(9).put_dirty(400, &[2u8; 4096]);
        assert_eq!(c.dirty_blocks(9), [7, 100, 300, 400]);
        assert_eq!(c.dirty_pages(), 4);
        assert_eq!(c.drop_range(9, 400, 401), 0);
        assert_eq!(c.dirty_pages(), 3);
        let taken = c.take_dirty(9);
        let fbs: Vec<u64> = taken.iter().map(|&(_, fb, _)| fb).collect();
        assert_eq!(fbs, [7, 100, 300]);
        assert_eq!(taken[0].2[0], 3, "the newest contents");
        assert_eq!(&taken[1].2[..16], &[0u8; 16]);
        assert_eq!(c.dirty_pages(), 0);
        assert_eq!(c.dirty_inodes(), Vec::<u64>::new());
        assert_eq!(c.pages(), 511);
    }

    /// Over its limit the cache drops clean pages of the shard a write added to, never dirty
    /// ones, and never one the write's hold can still see.
    #[test]
    fn trimming_drops_clean_pages_only_and_waits_for_the_hold() {
        let c = PageCache::new(64 * 4096, 4096);
        for fb in 0..64 {
            c.lock(7).put_dirty(fb, &[1u8; 4096]);
        }
        assert_eq!(c.take_dirty(7).len(), 64);
        {
            let mut p = c.lock(7);
            for fb in 64..80 {
                p.put_dirty(fb, &[2u8; 4096]);
            }
            // Still under the hold: nothing dropped yet, the first page readable.
            let mut b = [0u8; 4096];
            assert!(p.read(0, &mut b) && b[0] == 1);
            assert_eq!(c.pages(), 80);
        }
        assert_eq!(c.pages(), 64 / 8 * 7);
        assert_eq!(c.dirty_pages(), 16);
        for fb in 64..80 {
            assert!(c.contains(7, fb), "dirty page {fb} dropped");
        }
    }

    /// Clean pages of shards no one writes to are dropped too: a write over the limit trims
    /// the others once it lets its own shard go.
    #[test]
    fn a_write_over_the_limit_trims_other_shards_too() {
        let c = PageCache::new(64 * 4096, 4096);
        for ino in 1..=64u64 {
            c.lock(ino).put_dirty(0, &[1u8; 4096]);
            assert_eq!(c.take_dirty(ino).len(), 1);
        }
        assert_eq!(c.pages(), 64);
        // Inode 1000's shard holds at most one of the clean pages above.
        for fb in 0..16 {
            c.lock(1000).put_dirty(fb, &[2u8; 4096]);
        }
        // Trimming only its own shard, it would keep some 79 pages.
        assert!(c.pages() <= 64, "{} pages kept", c.pages());
        assert_eq!(c.dirty_pages(), 16);
    }

    /// A taken page's contents are what write back writes: a write to the page meanwhile
    /// gives the page new contents and leaves the taken ones alone, and so does zeroing.
    #[test]
    fn a_write_during_write_back_leaves_the_taken_contents_alone() {
        let c = PageCache::new(1 << 20, 4096);
        c.lock(3).put_dirty(0, &[1u8; 4096]);
        c.lock(3).put_dirty(1, &[1u8; 4096]);
        let taken = c.take_dirty(3);
        c.lock(3).put_dirty(0, &[2u8; 4096]);
        assert!(c.zero_range(3, 1, 0, 4096));
        assert!(taken.iter().all(|(_, _, d)| d.iter().all(|&b| b == 1)));
        let mut b = [9u8; 4096];
        assert!(c.lock(3).read(0, &mut b) && b.iter().all(|&x| x == 2));
        assert!(c.lock(3).read(1, &mut b) && b.iter().all(|&x| x == 0));
        assert_eq!(c.dirty_pages(), 2);
        // Written back and no longer shared: the next write changes the page in place.
        drop(taken);
        let again = c.take_dirty(3);
        let at = Arc::as_ptr(&again[0].2);
        drop(again);
        c.lock(3).put_dirty(0, &[3u8; 4096]);
        assert_eq!(Arc::as_ptr(&c.take_dirty(3)[0].2), at);
    }

    /// A dropped page's memory holds the next new page of its shard; memory a write back
    /// still holds is not reused.
    #[test]
    fn dropped_pages_memory_is_used_again_unless_still_held() {
        let c = PageCache::new(1 << 20, 4096);
        c.lock(5).put_dirty(0, &[1u8; 4096]);
        c.lock(5).put_dirty(1, &[1u8; 4096]);
        let mut taken = c.take_dirty(5);
        let held = taken.pop().unwrap().2;
        let free = Arc::as_ptr(&taken.pop().unwrap().2);
        assert_eq!(c.drop_range(5, 0, 2), 0);
        c.lock(5).put_dirty(7, &[4u8; 4096]);
        let d = c.take_dirty(5);
        assert_eq!(Arc::as_ptr(&d[0].2), free);
        assert!(d[0].2.iter().all(|&b| b == 4));
        assert!(held.iter().all(|&b| b == 1));
    }

    /// The memory kept for new pages is a bounded share of the cache, whatever is dropped.
    #[test]
    fn the_kept_memory_is_bounded() {
        let c = PageCache::new(256 * 4096, 4096);
        for ino in 0..64u64 {
            for fb in 0..4 {
                c.lock(ino).put_dirty(fb, &[1u8; 4096]);
            }
            drop(c.take_dirty(ino));
            assert_eq!(c.drop_range(ino, 0, 4), 0);
        }
        let kept: usize = c.shards.iter().map(|s| s.lock().spares.len()).sum();
        assert_eq!(kept, 256 / 32);
        assert_eq!(c.spares.load(Ordering::Relaxed), kept);
        c.lock(1).put_dirty(0, &[2u8; 4096]);
        assert!(c.spares.load(Ordering::Relaxed) <= kept);
    }
}
