//! The committed item list: the items of the current checkpoint context, each with the formatted
//! image of its latest state. Relogging an item replaces its image, so an object changed many
//! times between checkpoints is written to the log once, in its newest state. Commits insert
//! into shards of it (`shards.rs`), merged when the context is pushed.

pub mod image_pool;
mod limits;
mod shards;

pub use limits::{commit_bytes, CilLimits};
pub use shards::{Cil, ShardGuard, BYTES_SHARD, SHARDS};

#[cfg(all(test, not(loom)))]
use crate::buf::CounterChange;
use crate::buf::{Buf, LateWrite};
use crate::log::item::{ItemKey, LogItem};
use crate::log::item_format::buf_item_len;
use crate::log::record::OP_HEADER_BYTES;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Op-stream bytes every checkpoint has besides its items: start and commit ops.
pub const CHECKPOINT_FIXED_STREAM: u64 = 2 * OP_HEADER_BYTES as u64 + 16;

#[derive(Debug)]
pub struct CilEntry {
    pub item: Arc<dyn LogItem>,
    pub image: Vec<u8>,
    /// A block written late (`LateWrite`): its image is made when the context is pushed.
    pub late: Option<(Arc<Buf>, LateWrite)>,
    /// The buffer's version the image was formatted at: of two shards' images of a block,
    /// the newer (`shards::merge`).
    pub version: u64,
}

impl CilEntry {
    /// Op-stream bytes it adds to its context (blocks of `block_size` bytes).
    fn stream_bytes(&self, block_size: usize) -> u64 {
        match &self.late {
            Some(_) => late_bound(block_size),
            None => (OP_HEADER_BYTES + self.image.len()) as u64,
        }
    }
}

/// One checkpoint context: the sequence it will be written as, and its items.
#[derive(Debug)]
pub struct CilCtx {
    pub seq: u64,
    pub items: BTreeMap<ItemKey, CilEntry>,
    /// Op-stream bytes this context will write.
    pub stream_bytes: u64,
    /// Log bytes charged for it against the log space (an upper bound of what it will occupy).
    pub charge: u64,
}

impl CilCtx {
    pub fn new(seq: u64) -> Self {
        Self {
            seq,
            items: BTreeMap::new(),
            stream_bytes: CHECKPOINT_FIXED_STREAM,
            charge: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Inserts or relogs the item of `key`, its image (of the buffer at `version`) written by
    /// `fill` into the vector of the image it replaces (empty for an item new to this context,
    /// which `item` then gives). Pins the item the first time this context holds it.
    pub fn insert_with(
        &mut self,
        key: ItemKey,
        version: u64,
        item: impl FnOnce() -> Arc<dyn LogItem>,
        fill: impl FnOnce(&mut Vec<u8>),
    ) {
        let e = match self.items.entry(key) {
            std::collections::btree_map::Entry::Occupied(o) => {
                let e = o.into_mut();
                // Its push would format the buffer as it is then, with this commit's change
                // and perhaps a later context's.
                assert!(
                    e.late.is_none(),
                    "block {key} committed in place and written late"
                );
                self.stream_bytes -= (OP_HEADER_BYTES + e.image.len()) as u64;
                debug_assert!(version >= e.version, "block {key} relogged older");
                e.version = version;
                e
            }
            std::collections::btree_map::Entry::Vacant(v) => {
                let item = item();
                debug_assert_eq!(item.key(), key);
                item.pins().fetch_add(1, Ordering::AcqRel);
                v.insert(CilEntry {
                    item,
                    image: Vec::new(),
                    late: None,
                    version,
                })
            }
        };
        fill(&mut e.image);
        self.stream_bytes += (OP_HEADER_BYTES + e.image.len()) as u64;
    }

    /// Makes `w` the late write of `buf` in this context, pinning the buffer the first time.
    /// An older one is merged with it (`merge_late`): bytes nest, counter changes add up.
    /// Counted as the whole block formatted: what the push logs is the buffer's dirty range,
    /// which late writes keep to one range of the block.
    pub fn set_late(&mut self, buf: &Arc<Buf>, w: &LateWrite, block_size: usize) {
        let key = buf.blkno();
        match self.items.entry(key) {
            std::collections::btree_map::Entry::Occupied(o) => {
                let e = o.into_mut();
                match &mut e.late {
                    Some((_, old)) => merge_late(key, old, w),
                    None => panic!("block {key} committed in place and written late"),
                }
            }
            std::collections::btree_map::Entry::Vacant(v) => {
                buf.pins().fetch_add(1, Ordering::AcqRel);
                v.insert(CilEntry {
                    item: Arc::clone(buf) as Arc<dyn LogItem>,
                    image: Vec::new(),
                    late: Some((Arc::clone(buf), w.clone())),
                    version: 0,
                });
                self.stream_bytes += late_bound(block_size);
            }
        }
    }
}

/// `w`, the newer, merged into `old`.
/// - Bytes: `w`'s are copied into `old`'s if `old`'s range holds them (the header's counters
///   alone inside the whole header another commit of the context wrote), else take their place
///   (their range must then hold `old`'s: otherwise the bytes between would be neither's).
/// - Counters: each one's changes add up (`CounterChange::then`): commits that change only
///   counters may come in any order.
fn merge_late(key: ItemKey, old: &mut LateWrite, w: &LateWrite) {
    assert_eq!(
        old.lsn_offset, w.lsn_offset,
        "block {key}: late writes disagree on its stamp"
    );
    // Bytes that set the counters start from nothing the context changed before them.
    assert!(
        !w.counters_set,
        "block {key}: a late write that sets its counters after other late writes"
    );
    let (o, n) = (
        old.offset..old.offset + old.bytes.len(),
        w.offset..w.offset + w.bytes.len(),
    );
    if n.is_empty() {
        // Counters alone.
    } else if !o.is_empty() && o.start <= n.start && n.end <= o.end {
        // Into bytes that set the counters, it would set them too.
        assert!(
            !old.counters_set,
            "block {key}: a late write into bytes that set its counters"
        );
        old.bytes[n.start - o.start..n.end - o.start].copy_from_slice(&w.bytes);
    } else {
        // No bytes yet, or fewer than these.
        assert!(
            o.is_empty() || (n.start <= o.start && o.end <= n.end),
            "block {key}: late write {n:?} neither holds nor is held by {o:?}"
        );
        // The counter values those bytes set would be lost with them.
        assert!(
            !old.counters_set,
            "block {key}: bytes that set its counters replaced by a late write"
        );
        old.offset = w.offset;
        old.bytes.clear();
        old.bytes.extend_from_slice(&w.bytes);
    }
    for &(at, change) in &w.counters {
        match old.counters.iter_mut().find(|(a, _)| *a == at) {
            Some((_, c)) => {
                *c = c
                    .then(change)
                    .unwrap_or_else(|| panic!("block {key}: counter at {at} changed in two ways"))
            }
            None => old.counters.push((at, change)),
        }
    }
}

/// The op-stream bytes a late-written block is counted at: its whole block as one range.
pub fn late_bound(block_size: usize) -> u64 {
    (OP_HEADER_BYTES + buf_item_len(std::iter::once(block_size))) as u64
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn late(offset: usize, bytes: &[u8]) -> LateWrite {
        LateWrite {
            offset,
            bytes: bytes.to_vec(),
            lsn_offset: 8,
            counters: Vec::new(),
            counters_set: false,
        }
    }

    fn counters(changes: &[(usize, CounterChange)]) -> LateWrite {
        LateWrite {
            counters: changes.to_vec(),
            ..late(0, &[])
        }
    }

    /// A late write inside the range of the context's one goes into it; one holding it takes
    /// its place; what the context keeps is the block as the newest writes left it.
    #[test]
    fn late_writes_nest_into_the_widest() {
        let mut old = late(88, &[1; 24]);
        // The whole header after the counters alone: replaces them.
        merge_late(7, &mut old, &late(0, &[2; 1160]));
        assert_eq!((old.offset, old.bytes.clone()), (0, vec![2; 1160]));
        // The counters after it: inside it, at their place.
        merge_late(7, &mut old, &late(88, &[3; 24]));
        assert_eq!(old.offset, 0);
        assert_eq!(old.bytes.len(), 1160);
        assert!(old.bytes[..88].iter().all(|&b| b == 2));
        assert!(old.bytes[88..112].iter().all(|&b| b == 3));
        assert!(old.bytes[112..].iter().all(|&b| b == 2));
        // The same range again: the newer bytes.
        merge_late(7, &mut old, &late(0, &[4; 1160]));
        assert_eq!(old.bytes, vec![4; 1160]);
    }

    #[test]
    #[should_panic(expected = "neither holds nor is held by")]
    fn late_writes_that_overlap_without_nesting_are_refused() {
        let mut old = late(88, &[1; 24]);
        merge_late(7, &mut old, &late(100, &[2; 24]));
    }

    /// Counter changes of one context add up whatever their order, beside bytes that come
    /// before or after them, which keep their own nesting.
    #[test]
    fn late_counter_changes_add_up_in_any_order() {
        use CounterChange::{Add, Max};
        let changes = [
            counters(&[(96, Add(5)), (88, Max(70))]),
            late(0, &[9; 200]),
            counters(&[(96, Add(3u64.wrapping_neg())), (104, Add(1))]),
            counters(&[(88, Max(60)), (104, Add(1))]),
        ];
        for order in [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]] {
            let mut old = changes[order[0]].clone();
            for &i in &order[1..] {
                merge_late(7, &mut old, &changes[i]);
            }
            let mut got = old.counters.clone();
            got.sort_by_key(|c| c.0);
            assert_eq!(got, vec![(88, Max(70)), (96, Add(2)), (104, Add(2))]);
            assert_eq!((old.offset, old.bytes.clone()), (0, vec![9; 200]));
        }
    }

    #[test]
    #[should_panic(expected = "sets its counters after other late writes")]
    fn bytes_that_set_the_counters_come_first_in_their_context() {
        let mut old = counters(&[(96, CounterChange::Add(1))]);
        let set = LateWrite {
            counters_set: true,
            ..late(0, &[1; 200])
        };
        merge_late(7, &mut old, &set);
    }
}
