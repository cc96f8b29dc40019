//! Event counters spread over cache lines, one picked per thread: a counter every operation
//! bumps (operations, bytes written) passed its line between the cores on each bump when it
//! was one word, and a word beside its neighbours in one struct passed theirs too. Two threads
//! overwriting a file each ran slower than one.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Cache lines a counter is spread over.
pub(crate) const SHARDS: usize = 16;

/// One counter on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded(pub(crate) AtomicU64);

/// The shard of the calling thread: threads take them in turn as they first count.
pub(crate) fn shard() -> usize {
    if cilfs_sync::SCHEDULED {
        return cilfs_sync::thread::task_index() % SHARDS;
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|s| *s)
}

/// A counter that threads add to without meeting: read by summing its shards.
#[derive(Debug, Default)]
pub struct Counter([Padded; SHARDS]);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0[shard()].0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.iter().map(|p| p.0.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn threads_adding_sum_up() {
        let c = Counter::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.add(2);
                    }
                });
            }
        });
        assert_eq!(c.get(), 8000);
    }
}
