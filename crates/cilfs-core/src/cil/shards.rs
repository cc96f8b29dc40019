//! The CIL in shards: every commit passes the CIL, and with one lock over it eight threads on
//! two vCPUs waited for that lock a tenth of their time, most of it behind a holder the
//! scheduler had preempted. A commit takes one shard (its thread's), and the push, which holds
//! every shard to move the open context's sequence, merges what they held into one checkpoint.
//!
//! - The sequence changes only with every shard locked, so a commit that reads it under its
//!   shard's lock puts all of its items in the context of that sequence.
//! - Two commits that log one block hold its buffer's lock through their inserts, so the later
//!   one's image has the higher buffer version: the merge keeps the highest, and gives back the
//!   pin of each image it drops (the one it keeps pins the item until the checkpoint is stable).
//! - Late bytes (`LateWrite::bytes`) must reach the context in the order their commits made
//!   them; their commits (which hold the publish turn or the exclusive state lock) all use
//!   shard 0, so their order is that shard's. Counter changes go in any shard: the merge sums
//!   them.

use super::{merge_late, CilCtx, CilEntry, CHECKPOINT_FIXED_STREAM};
use crate::util::lockstat::LockWaits;
use crate::util::sync::{rank, RankedMutex, RankedMutexGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Shards: as many as the per-thread counters' (`counter::SHARDS`), whose thread numbering
/// picks them.
pub const SHARDS: usize = crate::util::counter::SHARDS;

/// The shard that late bytes go to.
pub const BYTES_SHARD: usize = 0;

/// One shard on cache lines of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Shard(RankedMutex<CilCtx, { rank::CIL }>);

#[derive(Debug)]
pub struct Cil {
    shards: Vec<Shard>,
    /// The open context's sequence (see the module comment).
    seq: AtomicU64,
    /// Op-stream bytes of the items in every shard, kept by the commits under their shard's
    /// lock: what the space limit, the hard limit and emptiness are checked against.
    items_bytes: AtomicU64,
    /// The open context passed the hard limit (2S): set by a commit under its shard's lock,
    /// cleared by the switch with every shard held (so a commit into the next context cannot
    /// have its mark cleared). Lets `wait_below_hard_limit` skip the CIL.
    over_hard_limit: AtomicBool,
}

impl Cil {
    pub fn new(seq: u64) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard(RankedMutex::new(CilCtx::new(seq))))
                .collect(),
            seq: AtomicU64::new(seq),
            items_bytes: AtomicU64::new(0),
            over_hard_limit: AtomicBool::new(false),
        }
    }

    /// The open context's sequence: what a commit now would join.
    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Op-stream bytes the open context would write (its items, in every shard, and the
    /// checkpoint's own ops).
    pub fn stream_bytes(&self) -> u64 {
        CHECKPOINT_FIXED_STREAM + self.items_bytes.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.items_bytes.load(Ordering::Acquire) == 0
    }

    /// Whether a commit found the open context past the hard limit.
    pub fn over_hard_limit(&self) -> bool {
        self.over_hard_limit.load(Ordering::Acquire)
    }

    /// Shard `i` (of `SHARDS`) locked, its waits counted in `waits`. Its context's sequence is
    /// the open one's for as long as it is held.
    pub fn lock(&self, i: usize, waits: &LockWaits) -> ShardGuard<'_> {
        let m = &self.shards[i % SHARDS].0;
        let ctx = m.lock_short(waits);
        debug_assert_eq!(ctx.seq, self.seq());
        let before = ctx.stream_bytes;
        ShardGuard {
            ctx,
            before,
            items_bytes: &self.items_bytes,
            over_hard_limit: &self.over_hard_limit,
        }
    }

    /// Closes the open context and opens the next: every shard locked, in order, while the
    /// sequence moves. Returns the closed context, its shards merged (blocks of `block_size`
    /// bytes).
    pub fn switch(&self, block_size: usize) -> CilCtx {
        let mut guards: Vec<RankedMutexGuard<'_, CilCtx, { rank::CIL }>> =
            self.shards.iter().map(|s| s.0.lock()).collect();
        let seq = self.seq();
        let next = seq + 1;
        let taken: Vec<CilCtx> = guards
            .iter_mut()
            .map(|g| std::mem::replace(&mut **g, CilCtx::new(next)))
            .collect();
        self.items_bytes.store(0, Ordering::Release);
        self.over_hard_limit.store(false, Ordering::Release);
        self.seq.store(next, Ordering::Release);
        drop(guards);
        merge(seq, taken, block_size)
    }
}

/// A locked shard. When it is let go, the shard's change of op-stream bytes is added to the
/// CIL's total, still under its lock (so `switch`, holding every shard, sees a total that
/// matches them).
#[derive(Debug)]
pub struct ShardGuard<'a> {
    ctx: RankedMutexGuard<'a, CilCtx, { rank::CIL }>,
    before: u64,
    items_bytes: &'a AtomicU64,
    over_hard_limit: &'a AtomicBool,
}

impl ShardGuard<'_> {
    /// The open context is past the hard limit (`Cil::over_hard_limit`).
    pub fn set_over_hard_limit(&self) {
        self.over_hard_limit.store(true, Ordering::Release);
    }

    /// The CIL's op-stream bytes as of this shard's changes so far.
    pub fn cil_stream_bytes(&self) -> u64 {
        CHECKPOINT_FIXED_STREAM
            + self
                .items_bytes
                .load(Ordering::Acquire)
                .wrapping_add(self.ctx.stream_bytes)
                .wrapping_sub(self.before)
    }
}

impl std::ops::Deref for ShardGuard<'_> {
    type Target = CilCtx;
    fn deref(&self) -> &CilCtx {
        &self.ctx
    }
}

impl std::ops::DerefMut for ShardGuard<'_> {
    fn deref_mut(&mut self) -> &mut CilCtx {
        &mut self.ctx
    }
}

impl Drop for ShardGuard<'_> {
    fn drop(&mut self) {
        let delta = self.ctx.stream_bytes.wrapping_sub(self.before);
        if delta != 0 {
            self.items_bytes.fetch_add(delta, Ordering::AcqRel);
        }
    }
}

/// The shards of context `seq` as one context: each block's newest image (the highest buffer
/// version; the others' pins given back), each late-written block's bytes from shard 0 and
/// its counter changes summed over every shard, the charges summed.
fn merge(seq: u64, shards: Vec<CilCtx>, block_size: usize) -> CilCtx {
    let mut out = CilCtx::new(seq);
    out.charge = shards.iter().map(|s| s.charge).sum();
    // Shard 0 first: its late bytes are the base the others' counter changes go into.
    for (i, shard) in shards.into_iter().enumerate() {
        for (key, e) in shard.items {
            match out.items.entry(key) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(e);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    let kept = o.get_mut();
                    merge_entry(key, i, kept, e);
                }
            }
        }
    }
    out.stream_bytes = CHECKPOINT_FIXED_STREAM
        + out
            .items
            .values()
            .map(|e| e.stream_bytes(block_size))
            .sum::<u64>();
    out
}

/// `e`, the entry shard `shard` holds for `key`, merged into `kept`, another shard's.
fn merge_entry(key: u64, shard: usize, kept: &mut CilEntry, e: CilEntry) {
    match (&mut kept.late, &e.late) {
        (Some((_, old)), Some((_, w))) => {
            assert!(
                w.bytes.is_empty() || shard == BYTES_SHARD,
                "block {key}: late bytes in shard {shard}"
            );
            merge_late(key, old, w);
            // Both pinned the buffer: one pin stays for the merged entry.
            e.item.pins().fetch_sub(1, Ordering::AcqRel);
        }
        (None, None) => {
            let dropped = if e.version > kept.version {
                std::mem::replace(kept, e)
            } else {
                e
            };
            let prev = dropped.item.pins().fetch_sub(1, Ordering::AcqRel);
            debug_assert!(prev > 1, "block {key}: its last pin given back in a merge");
        }
        _ => panic!("block {key} committed in place and written late"),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::buf::{CounterChange, LateWrite};
    use crate::log::item::{ItemKey, LogItem, WriteBack};
    use crate::log::Lsn;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    #[derive(Debug)]
    struct Item(ItemKey, AtomicU32);

    impl LogItem for Item {
        fn key(&self) -> ItemKey {
            self.0
        }
        fn pins(&self) -> &AtomicU32 {
            &self.1
        }
        fn prepare_write_back(&self, _: Lsn, _: &crate::log::item::WriteBackCtx) -> WriteBack {
            WriteBack::Stale
        }
    }

    /// One image of `item` at `version`, committed into shard `shard`.
    fn log(cil: &Cil, shard: usize, item: &Arc<Item>, version: u64, image: &[u8]) {
        let waits = LockWaits::new("test");
        let mut g = cil.lock(shard, &waits);
        let it = Arc::clone(item);
        g.insert_with(item.0, version, || it, |out| *out = image.to_vec());
    }

    /// The push's merge keeps each block's newest image whatever shard holds it, gives back
    /// the pins of the images it drops, and opens the next context in every shard.
    #[test]
    fn a_switch_merges_the_shards_newest_image_first() {
        let cil = Cil::new(7);
        let (a, b) = (
            Arc::new(Item(10, AtomicU32::new(0))),
            Arc::new(Item(11, AtomicU32::new(0))),
        );
        log(&cil, 3, &a, 5, b"a5");
        log(&cil, 1, &a, 9, b"a9");
        log(&cil, 2, &a, 6, b"a6");
        log(&cil, 2, &b, 4, b"b4");
        assert_eq!(a.1.load(Ordering::Relaxed), 3, "one pin per shard");
        assert!(!cil.is_empty());
        let ctx = cil.switch(4096);
        assert_eq!(ctx.seq, 7);
        assert_eq!(ctx.items[&10].image, b"a9");
        assert_eq!(ctx.items[&11].image, b"b4");
        assert_eq!(
            a.1.load(Ordering::Relaxed),
            1,
            "the merged entry's pin alone"
        );
        assert_eq!(b.1.load(Ordering::Relaxed), 1);
        assert_eq!(
            ctx.stream_bytes,
            CHECKPOINT_FIXED_STREAM + 2 * (crate::log::record::OP_HEADER_BYTES as u64 + 2)
        );
        assert!(cil.is_empty());
        assert_eq!(cil.seq(), 8);
        log(&cil, 5, &b, 12, b"b12");
        assert_eq!(cil.switch(4096).seq, 8);
    }

    /// A late-written block's bytes from shard 0 and its counter changes from every shard
    /// come out as one late write.
    #[test]
    fn a_switch_sums_late_counters_over_the_shards() {
        let dev: Arc<dyn cilfs_device::Device> =
            Arc::new(cilfs_device::SimDevice::new(64 * 4096, 1));
        let cache = crate::buf::BufCache::new(dev, 4096, 1 << 20);
        let hdr = cache.get(3).unwrap();
        let cil = Cil::new(1);
        let waits = LockWaits::new("test");
        let late = |bytes: Vec<u8>, add: u64| LateWrite {
            offset: 0,
            bytes,
            lsn_offset: 8,
            counters: vec![(96, CounterChange::Add(add))],
            counters_set: false,
        };
        cil.lock(4, &waits)
            .set_late(&hdr, &late(Vec::new(), 2), 4096);
        cil.lock(BYTES_SHARD, &waits)
            .set_late(&hdr, &late(vec![7; 200], 3), 4096);
        cil.lock(9, &waits)
            .set_late(&hdr, &late(Vec::new(), 5), 4096);
        let ctx = cil.switch(4096);
        let (_, w) = ctx.items[&3].late.as_ref().unwrap();
        assert_eq!((w.offset, w.bytes.clone()), (0, vec![7; 200]));
        assert_eq!(w.counters, vec![(96, CounterChange::Add(10))]);
        assert_eq!(hdr.pins().load(Ordering::Relaxed), 1);
    }
}

/// A loom model of the shards' protocol (`Cil::lock`, `Cil::switch`) on loom's locks: a commit
/// reads the sequence under its shard's lock and puts all of its items there; the push locks
/// every shard in order, moves the sequence and takes what they hold. Every commit must land
/// whole in one context, and in the context whose sequence it was told. The model that reads
/// the sequence before taking its shard must fail.
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::atomic::{AtomicU64, Ordering};
    use loom::sync::{Arc, Mutex};

    struct Model {
        seq: AtomicU64,
        /// Per shard: its context's sequence, and the (commit, part) items it holds.
        shards: [Mutex<(u64, Vec<(usize, u8)>)>; 2],
    }

    /// Commit `id` into `shard`, reading the sequence under its lock (or, when `early`,
    /// before it); returns the sequence it was told.
    fn commit(m: &Model, shard: usize, id: usize, early: bool) -> u64 {
        let told = m.seq.load(Ordering::Acquire);
        let mut g = m.shards[shard].lock().unwrap();
        let seq = if early {
            told
        } else {
            m.seq.load(Ordering::Acquire)
        };
        g.1.push((id, 0));
        g.1.push((id, 1));
        // The items go into the shard's context, whatever sequence the commit read.
        let _ = g.0;
        seq
    }

    /// The push's switch: returns the closed context's sequence and items.
    fn switch(m: &Model) -> (u64, Vec<(usize, u8)>) {
        let mut guards: Vec<_> = m.shards.iter().map(|s| s.lock().unwrap()).collect();
        let seq = m.seq.load(Ordering::Acquire);
        let mut items = Vec::new();
        for g in guards.iter_mut() {
            assert_eq!(g.0, seq);
            items.append(&mut g.1);
            g.0 = seq + 1;
        }
        m.seq.store(seq + 1, Ordering::Release);
        (seq, items)
    }

    fn check(early: bool) {
        loom::model(move || {
            let m = Arc::new(Model {
                seq: AtomicU64::new(1),
                shards: [Mutex::new((1, Vec::new())), Mutex::new((1, Vec::new()))],
            });
            let committers: Vec<_> = (0..2)
                .map(|id| {
                    let m = Arc::clone(&m);
                    loom::thread::spawn(move || commit(&m, id, id, early))
                })
                .collect();
            let first = switch(&m);
            let told: Vec<u64> = committers.into_iter().map(|t| t.join().unwrap()).collect();
            let second = switch(&m);
            for (id, seq) in told.into_iter().enumerate() {
                let ctx = if seq == first.0 { &first } else { &second };
                assert_eq!(seq, ctx.0);
                let parts = ctx.1.iter().filter(|(c, _)| *c == id).count();
                assert_eq!(parts, 2, "commit {id} not whole in context {seq}");
            }
        });
    }

    #[test]
    fn loom_a_commit_lands_whole_in_the_context_it_was_told() {
        check(false);
    }

    #[test]
    #[should_panic(expected = "not whole in context")]
    fn loom_a_sequence_read_before_the_shard_lock_can_be_wrong() {
        check(true);
    }
}
