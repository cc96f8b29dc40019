//! The inodes in memory, in shards by inode number, each behind a lock of its own.
//!
//! Optimistic commits (`shared_tx.rs`) copy, check and publish their inodes under the state
//! lock taken shared, side by side. With one lock over the whole cache, eight threads on two
//! cores waited for it 28% of their time in unlinks: a holder preempted inside it stopped
//! everyone. In shards, two operations meet only when their inodes hash to the same shard, and
//! a commit locks the few shards its inodes are in (in shard order, so no cycle forms) for as
//! long as one lock held them before: its checks and its publish still see and change all of
//! its inodes at once.
//!
//! Under the exclusive state lock, code reaches every shard at no cost (`InodeCache::all`).

use crate::fs::{InodeMem, InodeTable};
use crate::util::lockstat::LockWaits;
use crate::util::sync::{rank, RankedMutex, RankedMutexGuard};

/// One shard of the cache, locked.
pub(crate) type ShardGuard<'a> = RankedMutexGuard<'a, InodeTable, { rank::INODES }>;
use std::sync::atomic::{AtomicU64, Ordering};

/// Shards of the page cache and of the inode IO locks (`shard_of`).
pub(crate) const SHARDS: usize = 256;

/// `ino` hashed into `bits` bits: a multiplicative hash, so that the consecutive numbers of
/// one directory's run land in different shards.
fn hash_bits(ino: u64, bits: u32) -> usize {
    (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
}

/// The page cache's and the IO locks' shard of `ino` (of `SHARDS`).
pub(crate) fn shard_of(ino: u64) -> usize {
    hash_bits(ino, SHARDS.trailing_zeros())
}

/// Shards of an inode cache of about `max` inodes: a thousand inodes or more each, 16 to
/// 1,024. Every create locks its directory's shard and its new inode's, and with 8 threads a
/// new inode landing in another thread's directory shard made most of the cache's waits: 1,024
/// shards took the cache's row from 10-12% to 7-9% of 8 creating threads' time. Fewer for a
/// small cache, whose trims, each of the shards a commit locked, would otherwise find a shard
/// of one inode, its own, not yet stable, and never trim.
pub(crate) fn shard_count_for(max: usize) -> usize {
    (max / 1024).clamp(16, 1024).next_power_of_two()
}

/// A map of inodes in memory: a whole table (an operation's scratch copies), every shard of
/// the cache (exclusive state lock) or the shards an operation locked. Each says which table
/// holds an inode; the map's operations are that table's.
pub(crate) trait InodeMap {
    fn table(&self, ino: u64) -> &InodeTable;
    fn table_mut(&mut self, ino: u64) -> &mut InodeTable;

    fn get(&self, ino: &u64) -> Option<&InodeMem> {
        self.table(*ino).get(ino).map(|b| &**b)
    }
    fn get_mut(&mut self, ino: &u64) -> Option<&mut InodeMem> {
        self.table_mut(*ino).get_mut(ino).map(|b| &mut **b)
    }
    fn insert(&mut self, ino: u64, m: Box<InodeMem>) {
        self.table_mut(ino).insert(ino, m);
    }
    fn remove(&mut self, ino: &u64) -> Option<Box<InodeMem>> {
        self.table_mut(*ino).remove(ino)
    }
    fn contains_key(&self, ino: &u64) -> bool {
        self.table(*ino).contains_key(ino)
    }
}

impl InodeMap for InodeTable {
    fn table(&self, _ino: u64) -> &InodeTable {
        self
    }
    fn table_mut(&mut self, _ino: u64) -> &mut InodeTable {
        self
    }
}

/// Most inodes a shard keeps before it drops some (`Fs::trim_cache`), for a cache of about
/// `max`: its share, at least one.
pub(crate) fn shard_max(max: usize) -> usize {
    max.div_ceil(shard_count_for(max)).max(1)
}

#[derive(Debug)]
pub(crate) struct InodeCache {
    shards: Vec<RankedMutex<InodeTable, { rank::INODES }>>,
    /// log2 of the number of shards.
    bits: u32,
    /// Contention on the shards' locks, all counted as one row of the lock table.
    pub waits: LockWaits,
    /// Per shard, bumped under its lock whenever an entry leaves it under the shared state
    /// lock (a commit freeing an inode, a trim): an open that read an inode item while the
    /// inode was not in memory inserts what it read only if nothing left the shard meanwhile
    /// (`Fs::open_inode`), since what left may have been newer than what it read.
    removals: Vec<AtomicU64>,
}

impl InodeCache {
    /// A cache of about `max` inodes (`shard_count_for`).
    pub fn new(max: usize) -> Self {
        let n = shard_count_for(max);
        Self {
            shards: (0..n)
                .map(|_| RankedMutex::new(InodeTable::default()))
                .collect(),
            bits: n.trailing_zeros(),
            waits: LockWaits::new("inode cache"),
            removals: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The shard of `ino`.
    pub(crate) fn shard(&self, ino: u64) -> usize {
        hash_bits(ino, self.bits)
    }

    /// `ino` in memory, reached through the exclusive state lock.
    pub fn get_mut(&mut self, ino: &u64) -> Option<&mut InodeMem> {
        InodeMap::get_mut(self.shard_mut(*ino), ino)
    }

    /// The shard of `ino`, reached through the exclusive state lock.
    pub fn shard_mut(&mut self, ino: u64) -> &mut InodeTable {
        let i = self.shard(ino);
        self.shards[i].get_mut()
    }

    /// Every shard, reached through the exclusive state lock.
    pub fn all(&mut self) -> AllShards<'_> {
        AllShards {
            bits: self.bits,
            shards: self.shards.iter_mut().map(RankedMutex::get_mut).collect(),
        }
    }

    /// Entries that left `ino`'s shard so far (read under its lock).
    pub fn removals(&self, ino: u64) -> u64 {
        self.removals[self.shard(ino)].load(Ordering::Relaxed)
    }

    /// An entry left `ino`'s shard (its lock held, or the exclusive state lock).
    pub fn removed(&self, ino: u64) {
        self.removals[self.shard(ino)].fetch_add(1, Ordering::Relaxed);
    }

    /// The shard of `ino`, locked for a moment.
    pub fn lock(&self, ino: u64) -> ShardGuard<'_> {
        self.shards[self.shard(ino)].lock_short(&self.waits)
    }

    /// Tests: whether `ino`'s shard is held now (by anyone, this thread included).
    #[cfg(test)]
    pub fn is_locked(&self, ino: u64) -> bool {
        self.shards[self.shard(ino)].is_locked()
    }

    /// The shards of every inode in `inos`, locked. It never waits for one while it holds
    /// another: a shard found held, it lets go of the others, waits for that one alone, and
    /// then only tries the rest (so the order it takes them in makes no cycle). Waiting for a
    /// second shard with the first held, a thread whose holder the scheduler had preempted
    /// stopped everyone who needed the first too (eight threads on two vCPUs).
    pub fn lock_many(&self, inos: impl IntoIterator<Item = u64>) -> ShardGuards<'_> {
        let mut idx: Vec<usize> = inos.into_iter().map(|i| self.shard(i)).collect();
        idx.sort_unstable();
        idx.dedup();
        let lock = |i: usize| self.shards[i].lock_short(&self.waits);
        let mut held: Vec<Option<ShardGuard<'_>>> = idx.iter().map(|_| None).collect();
        loop {
            let mut busy = None;
            for (k, &i) in idx.iter().enumerate() {
                if held[k].is_some() {
                    continue;
                }
                if held.iter().all(Option::is_none) {
                    // Nothing held: it may wait.
                    held[k] = Some(lock(i));
                    continue;
                }
                match self.shards[i].try_lock_counted(&self.waits) {
                    Some(g) => held[k] = Some(g),
                    None => {
                        busy = Some(k);
                        break;
                    }
                }
            }
            let Some(k) = busy else {
                return ShardGuards {
                    bits: self.bits,
                    guards: idx.into_iter().zip(held.into_iter().flatten()).collect(),
                };
            };
            held.iter_mut().for_each(|h| *h = None);
            held[k] = Some(lock(idx[k]));
        }
    }

    /// `f` on each shard in turn, each locked only for its call.
    pub fn for_each_shard(&self, mut f: impl FnMut(&mut InodeTable)) {
        for m in &self.shards {
            f(&mut m.lock_short(&self.waits));
        }
    }

    /// Inodes in memory (each shard counted under its lock, so a moving total).
    pub fn len(&self) -> usize {
        let mut n = 0;
        self.for_each_shard(|t| n += t.len());
        n
    }
}

/// Every shard of the cache, under the exclusive state lock.
pub(crate) struct AllShards<'a> {
    bits: u32,
    shards: Vec<&'a mut InodeTable>,
}

impl AllShards<'_> {
    /// `f` on each shard's table.
    pub fn for_each_table(&mut self, mut f: impl FnMut(&mut InodeTable)) {
        for t in &mut self.shards {
            f(t);
        }
    }
}

impl InodeMap for AllShards<'_> {
    fn table(&self, ino: u64) -> &InodeTable {
        self.shards[hash_bits(ino, self.bits)]
    }
    fn table_mut(&mut self, ino: u64) -> &mut InodeTable {
        self.shards[hash_bits(ino, self.bits)]
    }
}

/// The shards an operation locked (`InodeCache::lock_many`): it may reach only inodes in
/// them.
pub(crate) struct ShardGuards<'a> {
    bits: u32,
    /// (shard, its lock), in shard order.
    guards: Vec<(usize, ShardGuard<'a>)>,
}

impl ShardGuards<'_> {
    /// `f` on each locked shard's table.
    pub fn for_each_table(&mut self, mut f: impl FnMut(&mut InodeTable)) {
        for (_, g) in &mut self.guards {
            f(g);
        }
    }
}

impl InodeMap for ShardGuards<'_> {
    fn table(&self, ino: u64) -> &InodeTable {
        let s = hash_bits(ino, self.bits);
        match self.guards.iter().find(|(i, _)| *i == s) {
            Some((_, g)) => g,
            None => panic!("inode {ino} reached without its shard locked"),
        }
    }

    fn table_mut(&mut self, ino: u64) -> &mut InodeTable {
        let s = hash_bits(ino, self.bits);
        match self.guards.iter_mut().find(|(i, _)| *i == s) {
            Some((_, g)) => g,
            None => panic!("inode {ino} reached without its shard locked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One directory's run of numbers spreads over many shards, so its creates and another
    /// directory's seldom meet in one.
    #[test]
    fn a_run_of_numbers_spreads_over_the_shards() {
        let used: std::collections::HashSet<usize> = (1000..1016).map(shard_of).collect();
        assert!(used.len() >= 12, "16 numbers in {} shards", used.len());
        assert!((0..10_000u64).all(|i| shard_of(i) < SHARDS));
        let c = InodeCache::new(1 << 21);
        assert_eq!(c.shards.len(), 1024);
        let used: std::collections::HashSet<usize> = (1000..1016).map(|i| c.shard(i)).collect();
        assert!(used.len() >= 14, "16 numbers in {} shards", used.len());
    }

    /// The default cache (1.5 million inodes on 24 GiB) has 1,024 shards; a small one fewer,
    /// each of a thousand inodes or more, and never fewer than 16.
    #[test]
    fn the_shard_count_follows_the_cache_size() {
        assert_eq!(shard_count_for(1_500_000), 1024);
        assert_eq!(shard_count_for(200_000), 256);
        assert_eq!(shard_count_for(64), 16);
        assert_eq!(shard_max(64), 4);
        assert_eq!(shard_max(1_500_000), 1465);
    }

    /// Locking the shards of several inodes takes each shard once, whatever the order given.
    #[test]
    fn lock_many_takes_each_shard_once_in_order() {
        let c = InodeCache::new(1 << 20);
        let g = c.lock_many([7, 3, 7, 1_000_003, 3]);
        let idx: Vec<usize> = g.guards.iter().map(|(i, _)| *i).collect();
        let mut sorted = idx.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(idx, sorted);
        assert!(c.shards[c.shard(7)].try_lock().is_none());
        drop(g);
        assert!(c.shards[c.shard(7)].try_lock().is_some());
    }

    /// A thread locking two shards that finds the second held waits for it holding neither:
    /// whoever needs the first goes on meanwhile.
    #[test]
    fn lock_many_waits_for_a_held_shard_holding_none() {
        let c = InodeCache::new(1 << 20);
        // Two inodes whose shards are in that order.
        let (a, b) = (1..)
            .map(|i| (i, i + 1))
            .find(|&(x, y)| c.shard(x) < c.shard(y))
            .unwrap();
        let held = c.lock(b);
        std::thread::scope(|s| {
            let t = s.spawn(|| drop(c.lock_many([a, b])));
            // Its wait for `b` has begun once it counted that acquisition (its first, of `a`,
            // counted before): `a` was let go by then.
            while c.waits.snapshot().acquired < 3 {
                std::thread::yield_now();
            }
            assert!(!c.is_locked(a), "it waits for one shard holding another");
            drop(held);
            t.join().unwrap();
        });
    }
}
