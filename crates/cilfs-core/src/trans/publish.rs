//! The two lock rules of a commit's publish, written once over any block lock so that the
//! loom model (`fs/tests/publish_model.rs`) runs this code with loom's locks and the
//! transactions run it with the buffers' (`Transaction::lock_changed`, `read_set_locked`):
//! - the blocks a commit changes are locked in block order, so two commits locking
//!   overlapping sets never wait for each other in a cycle, each at the version the commit
//!   first saw;
//! - a block it only read must not be locked by another commit, which would be publishing
//!   it: a look at the lock, never a wait, since a commit holding its own locks must never
//!   wait for another's.

use crate::util::sync::fence_seq_cst;

/// A block as a commit locks it to publish.
pub trait PublishBlock {
    /// A hold of the block's lock, as a writer.
    type Guard;
    fn blkno(&self) -> u64;
    /// Waits for the lock.
    fn lock(&self) -> Self::Guard;
    /// The lock if no one holds it now.
    fn try_lock(&self) -> Option<Self::Guard>;
    /// The block's version, its lock held.
    fn version(g: &Self::Guard) -> u64;
    /// Whether another commit holds the lock as a writer now, seen without taking it.
    fn locked_exclusive(&self) -> bool;
}

/// What a commit asks `lock_in_block_order` for: its own index for the block, the block, and
/// the version the commit saw.
#[derive(Debug)]
pub struct Wanted<B> {
    pub index: usize,
    pub block: B,
    pub version: u64,
}

/// The locks of `wanted`, taken in block order: (index, block number, guard) in that order.
/// `wait` false takes each only if free now: None, and nothing locked, if one is held (for a
/// commit that holds a lock others take under their block locks: the publish turn).
/// Err: the first block found at another version than the commit saw; nothing stays locked.
#[allow(clippy::type_complexity)]
pub fn lock_in_block_order<B: PublishBlock>(
    mut wanted: Vec<Wanted<B>>,
    wait: bool,
) -> Result<Option<Vec<(usize, u64, B::Guard)>>, u64> {
    wanted.sort_unstable_by_key(|w| w.block.blkno());
    debug_assert!(
        wanted
            .windows(2)
            .all(|w| w[0].block.blkno() < w[1].block.blkno()),
        "a block wanted twice"
    );
    let mut guards = Vec::with_capacity(wanted.len());
    for w in wanted {
        let g = if wait {
            w.block.lock()
        } else {
            match w.block.try_lock() {
                Some(g) => g,
                None => return Ok(None),
            }
        };
        #[cfg(shuttle)]
        let unchecked = crate::util::mutants::publish_check_off();
        #[cfg(not(shuttle))]
        let unchecked = false;
        if B::version(&g) != w.version && !unchecked {
            return Err(w.block.blkno());
        }
        guards.push((w.index, w.block.blkno(), g));
    }
    Ok(Some(guards))
}

/// Whether a block of `read_only` (blocks a commit read and does not change) is locked by
/// another commit now. The commit holds its own blocks' locks already.
pub fn read_set_locked<B: PublishBlock>(read_only: impl IntoIterator<Item = B>) -> bool {
    // Two commits each lock what they write and then look at the locks of what they only
    // read (a store, then a load of another place): without a full fence a weakly ordered CPU
    // may let both miss the other's lock (x86's locked instructions fence already).
    fence_seq_cst();
    read_only.into_iter().any(|b| b.locked_exclusive())
}
