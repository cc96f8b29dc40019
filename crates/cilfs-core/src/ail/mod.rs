//! The active item list: items whose checkpoint is stable, ordered by the LSN of the checkpoint
//! that last logged them. Its lowest LSN is the log tail; writing items back in place moves it.
//!
//! A write back holds the tail at its item's LSN from when it is prepared until it is safe to
//! let go (`Publish`): once completed (the push that stamps the tail then flushes), or once a
//! flush covered it (the ail policy). Held, not kept as an entry: an item relogged meanwhile
//! moves on, but the log space of the checkpoint it was written back from is still needed
//! until that write is, since the newer checkpoint logs only what changed since.

mod worker;

pub(crate) use worker::AilWorker;

use crate::log::item::{ItemKey, LogItem, WriteBack, WriteBackCtx};
use crate::log::{FlushClock, Lsn};
use crate::util::sync::{rank, RankedMutex};
use cilfs_device::{AlignedBuf, Device, DeviceError, QueuedBuf, WriteFlags, WriteQueue};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Items, grouped by the checkpoint that last logged them.
///
/// A checkpoint's items enter as one batch (XFS splices a checkpoint's log items onto the
/// AIL's tail in one list operation, `xfs_trans_ail_update_bulk`), so entering costs a push
/// onto a vector per item instead of an insert into an ordered map, and an item that a newer
/// checkpoint relogged leaves an empty slot behind. Every batch in `batches` holds at least one
/// item, so the first one's LSN is the tail.
#[derive(Debug, Default)]
pub struct Ail {
    batches: BTreeMap<Lsn, Batch>,
    /// Where each item is: its batch and its slot there. Block numbers, hashed without
    /// SipHash (`numhash`): every item of every checkpoint is looked up here when it enters.
    place: crate::util::numhash::NumberMap<(Lsn, u32)>,
    /// Write backs not yet safe to let the tail pass, by the LSN they were written back at
    /// (how many at each): the tail is at most the first.
    held: BTreeMap<Lsn, u32>,
    /// Completed write backs waiting for a flush (ail policy, `Publish::Deferred`): their
    /// `FlushClock` mark and the LSNs they hold (how many at each), oldest first.
    awaiting: VecDeque<(u64, Vec<(Lsn, u32)>)>,
}

/// The items of one checkpoint still in the AIL at its LSN.
#[derive(Debug, Default)]
struct Batch {
    slots: Vec<Slot>,
    /// Slots holding an item.
    live: usize,
}

#[derive(Debug)]
struct Slot {
    key: ItemKey,
    /// None once the item moved to a newer checkpoint or was written back.
    item: Option<Arc<dyn LogItem>>,
}

/// A batch of at least this many slots is compacted once fewer than a quarter of them hold
/// items, so that a checkpoint whose items were nearly all relogged holds little memory.
const COMPACT_MIN_SLOTS: usize = 64;

/// What one AIL push did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AilPush {
    pub written: u64,
    pub written_bytes: u64,
    pub stale: u64,
    pub pinned: u64,
    pub busy: u64,
    /// Data-device flushes the push issued itself (`Publish::Flushed`; an elided one is not
    /// counted).
    pub flushes: u64,
}

/// When a push lets the tail pass what it wrote back (rule 1 of docs/journal.md).
#[derive(Debug, Clone, Copy)]
pub enum Publish<'a> {
    /// Once the writes completed: whoever stamps the tail flushes first (reduced and legacy
    /// policies: the push's flush, or the commit iclog's PREFLUSH over the data device).
    Completed,
    /// After one data-device flush at the end of the push (ail policy, when space is needed
    /// now): the tail is safe to stamp without a flush. Write backs still awaiting a flush
    /// from deferred pushes are published by it too.
    Flushed,
    /// Once a flush that started after the writes completed has completed (ail policy, ahead
    /// of need): the commit path's next PREFLUSH of the data device usually does, so the AIL
    /// costs no flush of its own (`Ail::publish_stable`).
    Deferred(&'a FlushClock),
}

impl Ail {
    pub fn len(&self) -> usize {
        self.place.len()
    }

    /// No item, and no write back holding the tail.
    pub fn is_empty(&self) -> bool {
        self.place.is_empty() && self.held.is_empty()
    }

    /// The tail: the lowest LSN in the AIL, or of a write back not yet safe to pass.
    pub fn min_lsn(&self) -> Option<Lsn> {
        let first = self.batches.first_key_value().map(|(&lsn, b)| {
            debug_assert!(b.live > 0, "an empty batch at {lsn}");
            lsn
        });
        let held = self.held.first_key_value().map(|(&lsn, _)| lsn);
        match (first, held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Holds the tail at `lsn` for one more write back.
    fn hold(&mut self, lsn: Lsn) {
        *self.held.entry(lsn).or_default() += 1;
    }

    /// Lets the tail pass write backs made at `lsns` (one hold each).
    pub fn release(&mut self, lsns: &[Lsn]) {
        for &lsn in lsns {
            self.release_n(lsn, 1);
        }
    }

    fn release_n(&mut self, lsn: Lsn, k: u32) {
        match self.held.get_mut(&lsn) {
            Some(n) if *n > k => *n -= k,
            Some(n) => {
                debug_assert_eq!(*n, k, "releasing more write backs at {lsn} than held");
                self.held.remove(&lsn);
            }
            None => debug_assert!(false, "releasing a write back at {lsn} never held"),
        }
    }

    /// Completed write backs at `lsns` wait for a flush covering `mark` (`FlushClock::mark`).
    pub fn defer(&mut self, mark: u64, mut lsns: Vec<Lsn>) {
        if lsns.is_empty() {
            return;
        }
        lsns.sort_unstable();
        let mut counted: Vec<(Lsn, u32)> = Vec::new();
        for lsn in lsns {
            match counted.last_mut() {
                Some((l, n)) if *l == lsn => *n += 1,
                _ => counted.push((lsn, 1)),
            }
        }
        self.awaiting.push_back((mark, counted));
    }

    /// The tail once a flush with ticket `upto` has completed: deferred write backs it covers
    /// (marked at most `upto`) no longer hold it. For a record ordered after that flush.
    pub fn min_lsn_after_flush(&self, upto: u64) -> Option<Lsn> {
        let mut covered: BTreeMap<Lsn, u32> = BTreeMap::new();
        for (_, lsns) in self.awaiting.iter().take_while(|(mark, _)| *mark <= upto) {
            for &(lsn, n) in lsns {
                *covered.entry(lsn).or_default() += n;
            }
        }
        let held = self
            .held
            .iter()
            .find(|&(lsn, &n)| covered.get(lsn).copied().unwrap_or(0) < n)
            .map(|(&lsn, _)| lsn);
        let first = self.batches.first_key_value().map(|(&lsn, _)| lsn);
        match (first, held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether write backs wait for a flush.
    pub fn has_awaiting(&self) -> bool {
        !self.awaiting.is_empty()
    }

    /// Releases the deferred write backs a completed flush covered; returns whether any.
    pub fn publish_stable(&mut self, clock: &FlushClock) -> bool {
        let mut any = false;
        // Marks only grow (pushers are serialised, each marks after its writes).
        while let Some((mark, _)) = self.awaiting.front() {
            if !clock.is_stable(*mark) {
                break;
            }
            if let Some((_, lsns)) = self.awaiting.pop_front() {
                for (lsn, n) in lsns {
                    self.release_n(lsn, n);
                }
                any = true;
            }
        }
        any
    }

    /// Releases every deferred write back: a flush that started after them all completed.
    fn publish_all(&mut self) {
        while let Some((_, lsns)) = self.awaiting.pop_front() {
            for (lsn, n) in lsns {
                self.release_n(lsn, n);
            }
        }
    }

    /// Inserts an item at `lsn`, or moves it there; an item only moves forward (tests: the
    /// journal inserts whole checkpoints, `insert_all`).
    #[cfg(test)]
    pub fn insert(&mut self, item: Arc<dyn LogItem>, lsn: Lsn) {
        self.insert_all(lsn, vec![item]);
    }

    /// Inserts a checkpoint's items at its LSN, or moves them there from the older checkpoints
    /// that logged them before: one batch. An item already at this LSN is replaced in its slot.
    pub fn insert_all(&mut self, lsn: Lsn, items: Vec<Arc<dyn LogItem>>) {
        // Checked before anything changes: past here nothing panics, so a failed check leaves
        // the AIL as it was instead of items out of one batch and not yet in the other.
        for item in &items {
            let key = item.key();
            if let Some(&(old, _)) = self.place.get(&key) {
                assert!(old <= lsn, "AIL item {key} moving back from {old} to {lsn}");
            }
        }
        let Self { batches, place, .. } = self;
        for item in &items {
            let key = item.key();
            if let Some(&(old, slot)) = place.get(&key) {
                if old < lsn {
                    vacate(batches, place, old, slot);
                }
            }
        }
        if items.is_empty() {
            return;
        }
        let batch = batches.entry(lsn).or_default();
        for item in items {
            let key = item.key();
            if let Some(&(_, slot)) = place.get(&key) {
                let s = &mut batch.slots[slot as usize];
                debug_assert_eq!(s.key, key);
                debug_assert!(s.item.is_some());
                s.item = Some(item);
                continue;
            }
            let slot = u32::try_from(batch.slots.len()).expect("AIL batch of 2^32 items");
            batch.slots.push(Slot {
                key,
                item: Some(item),
            });
            batch.live += 1;
            place.insert(key, (lsn, slot));
        }
    }

    /// The item at `(lsn, key)`, if it is still there.
    fn get(&self, lsn: Lsn, key: ItemKey) -> Option<&Arc<dyn LogItem>> {
        let &(at, slot) = self.place.get(&key)?;
        if at != lsn {
            return None;
        }
        self.batches.get(&at)?.slots[slot as usize].item.as_ref()
    }

    /// The entries below `target`, in block order (the order write back goes out in).
    pub fn below(&self, target: Lsn) -> Vec<(Lsn, ItemKey)> {
        let mut v: Vec<(Lsn, ItemKey)> = self
            .batches
            .range(..target)
            .flat_map(|(&lsn, b)| {
                b.slots
                    .iter()
                    .filter(|s| s.item.is_some())
                    .map(move |s| (lsn, s.key))
            })
            .collect();
        v.sort_unstable_by_key(|&(_, key)| key);
        v
    }

    /// Prepares the write backs of `entries` still in the AIL at the same LSN (an entry that
    /// moved was relogged by a newer checkpoint and stays). Pinned or locked items are skipped
    /// (and counted); they stay in the AIL. Each write holds the tail at its LSN until
    /// `release` (`WritebackBatch::held`).
    pub fn prepare_batch(
        &mut self,
        entries: &[(Lsn, ItemKey)],
        ctx: &WriteBackCtx,
        r: &mut AilPush,
    ) -> WritebackBatch {
        let mut b = WritebackBatch::default();
        for &k in entries {
            let Some(item) = self.get(k.0, k.1) else {
                continue;
            };
            match item.prepare_write_back(k.0, ctx) {
                WriteBack::Write { offset, data } => {
                    r.written += 1;
                    r.written_bytes += data.len() as u64;
                    b.writes.push((offset, data));
                    b.held.push(k.0);
                    b.blocks.push(k.1);
                }
                WriteBack::Stale => r.stale += 1,
                WriteBack::Pinned => {
                    r.pinned += 1;
                    continue;
                }
                WriteBack::Busy => {
                    r.busy += 1;
                    continue;
                }
                WriteBack::Invalid { what } => {
                    // Nothing of this batch goes out: the journal shuts down.
                    b.invalid = Some((k.1, what));
                    break;
                }
            }
            b.done.push(k);
        }
        for &lsn in &b.held {
            self.hold(lsn);
        }
        b
    }

    /// Lets go of entries whose write back completed. An entry that moved meanwhile (its item
    /// was relogged and a newer checkpoint completed) stays: the write did not carry that
    /// checkpoint's changes.
    pub fn remove_written(&mut self, done: &[(Lsn, ItemKey)]) {
        for &(lsn, key) in done {
            if let Some(&(at, slot)) = self.place.get(&key) {
                if at == lsn {
                    vacate(&mut self.batches, &mut self.place, lsn, slot);
                }
            }
        }
    }
}

/// Empties slot `slot` of the batch at `lsn` and forgets its item's place (the item moved on or
/// left); a batch left empty goes, one left mostly empty is compacted.
fn vacate(
    batches: &mut BTreeMap<Lsn, Batch>,
    place: &mut crate::util::numhash::NumberMap<(Lsn, u32)>,
    lsn: Lsn,
    slot: u32,
) {
    let b = batches
        .get_mut(&lsn)
        .unwrap_or_else(|| panic!("AIL has no batch at {lsn}"));
    let s = &mut b.slots[slot as usize];
    assert!(
        s.item.take().is_some(),
        "AIL slot {slot} at {lsn} already empty"
    );
    place.remove(&s.key);
    b.live -= 1;
    if b.live == 0 {
        batches.remove(&lsn);
    } else if b.slots.len() >= COMPACT_MIN_SLOTS && b.live * 4 < b.slots.len() {
        b.slots.retain(|s| s.item.is_some());
        for (i, s) in b.slots.iter().enumerate() {
            place.insert(s.key, (lsn, i as u32));
        }
    }
}

/// One batch of AIL write back, prepared under the AIL lock and written without it.
#[derive(Debug, Default)]
pub struct WritebackBatch {
    pub writes: Vec<(u64, AlignedBuf)>,
    /// Entries to remove once the writes completed.
    pub done: Vec<(Lsn, ItemKey)>,
    /// The LSN of each write: held until `Ail::release`.
    pub held: Vec<Lsn>,
    /// The block of each write.
    pub blocks: Vec<ItemKey>,
    /// An item that failed its write check, and what failed: the batch is not written.
    pub invalid: Option<(ItemKey, String)>,
}

/// Why an AIL push stopped.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{0}")]
    Device(#[from] DeviceError),
    /// A block failed its check before write back (`WriteBack::Invalid`).
    #[error("metadata block {blkno} failed its check before write back: {what}")]
    Invalid { blkno: u64, what: String },
    /// The journal shut down: nothing more is written.
    #[error("the journal is shut down")]
    Down,
}

/// How AIL write back IO goes out. Serialised by the mutex that holds it, so two images of
/// one block are never in flight at once.
#[derive(Debug)]
pub enum WritebackIo {
    /// One IO at a time, in order (inline mode: the crash explorers replay runs exactly).
    Sync,
    /// Up to this many synchronous IOs at once from scoped threads (devices without a queue).
    Threads(usize),
    /// Up to `depth` IOs in flight through the data device's io_uring queue, with no thread
    /// per IO: random 4 KiB write back at one latency per IO cannot keep the tail moving.
    Queue {
        queue: Box<dyn WriteQueue>,
        depth: usize,
    },
}

impl WritebackIo {
    /// A queue of `depth` on `dev` if it has one, else [`WRITEBACK_THREADS`] threads.
    pub fn for_device(dev: &dyn Device, depth: usize) -> Self {
        match dev.write_queue(depth) {
            Some(queue) => Self::Queue { queue, depth },
            None => Self::Threads(WRITEBACK_THREADS),
        }
    }
}

/// Writes back items with LSN below `target`, in block order, removing those written. The AIL
/// lock is held only to prepare each batch and to remove its entries, so checkpoints can insert
/// items and sample the tail while the batch is written; `io` serialises pushers. Adjacent
/// blocks merge into one IO. An entry leaves the AIL only after its write completed; the tail
/// passes it as `publish` says.
pub fn push(
    ail: &RankedMutex<Ail, { rank::AIL }>,
    io: &RankedMutex<WritebackIo, { rank::AIL_WRITEBACK }>,
    target: Lsn,
    dev: &dyn Device,
    ctx: &WriteBackCtx,
    publish: Publish<'_>,
) -> Result<AilPush, PushError> {
    let mut io = io.lock();
    let mut r = AilPush::default();
    // Block order, not LSN order: every entry below the target must go before the tail can
    // pass it, and neighbouring blocks then merge into one IO.
    let entries = ail.lock().below(target);
    let mut written: Vec<Lsn> = Vec::new();
    for chunk in entries.chunks(WRITEBACK_BATCH) {
        if ctx.is_down() {
            return Err(PushError::Down);
        }
        let b = ail.lock().prepare_batch(chunk, ctx, &mut r);
        if let Some((blkno, what)) = b.invalid {
            // Nothing of the batch went out; the journal shuts down.
            ail.lock().release(&b.held);
            return Err(PushError::Invalid { blkno, what });
        }
        // Down while the batch was copied: a copy may hold a failed transaction's changes.
        if ctx.is_down() {
            ail.lock().release(&b.held);
            return Err(PushError::Down);
        }
        let runs = merge_runs(b.writes);
        let _writing = ctx.writing.as_ref().map(|w| w.begin(&b.blocks));
        match &mut *io {
            WritebackIo::Sync => write_runs(dev, &runs)?,
            WritebackIo::Threads(n) => write_threaded(dev, &runs, *n)?,
            WritebackIo::Queue { queue, depth } => write_queued(&mut **queue, *depth, runs)?,
        }
        let mut a = ail.lock();
        a.remove_written(&b.done);
        match publish {
            Publish::Completed => a.release(&b.held),
            Publish::Flushed | Publish::Deferred(_) => written.extend(b.held),
        }
    }
    match publish {
        Publish::Completed => {}
        Publish::Flushed => {
            if !written.is_empty() || ail.lock().has_awaiting() {
                // Every write back released here completed before this flush started.
                if dev.flush_reporting()? {
                    r.flushes += 1;
                }
                let mut a = ail.lock();
                a.publish_all();
                a.release(&written);
            }
        }
        Publish::Deferred(clock) => {
            // Marked after the writes completed: a flush ticketed from here on covers them.
            let mark = clock.mark();
            ail.lock().defer(mark, written);
        }
    }
    Ok(r)
}

/// Write back threads where the device has no queue.
pub const WRITEBACK_THREADS: usize = 4;
/// Items prepared and written per batch (also the most block copies held at once).
const WRITEBACK_BATCH: usize = 1024;
/// The largest merged writeback IO, in bytes and in buffers (below IOV_MAX).
const MERGED_IO_MAX: usize = 1 << 20;
const MERGED_IO_PARTS: usize = 256;

/// Groups `(offset, data)` writes into runs of adjacent blocks, each run one IO.
fn merge_runs(mut writes: Vec<(u64, AlignedBuf)>) -> Vec<Vec<(u64, AlignedBuf)>> {
    writes.sort_unstable_by_key(|w| w.0);
    let mut runs: Vec<Vec<(u64, AlignedBuf)>> = Vec::new();
    let mut run_len = 0;
    for (offset, data) in writes {
        let extends = |run: &&mut Vec<(u64, AlignedBuf)>| {
            let (o, d) = &run[run.len() - 1];
            o + d.len() as u64 == offset
                && run_len + data.len() <= MERGED_IO_MAX
                && run.len() < MERGED_IO_PARTS
        };
        let len = data.len();
        match runs.last_mut().filter(extends) {
            Some(run) => {
                run.push((offset, data));
                run_len += len;
            }
            None => {
                runs.push(vec![(offset, data)]);
                run_len = len;
            }
        }
    }
    runs
}

/// Writes runs one synchronous IO each, in order (a run of several blocks through one copy, so
/// that it is one IO on any device).
fn write_runs(dev: &dyn Device, runs: &[Vec<(u64, AlignedBuf)>]) -> Result<(), DeviceError> {
    for run in runs {
        if let [(offset, data)] = &run[..] {
            dev.write(*offset, data, WriteFlags::NONE)?;
            continue;
        }
        let mut buf = AlignedBuf::zeroed(run.iter().map(|w| w.1.len()).sum());
        let mut at = 0;
        for (_, d) in run {
            buf[at..at + d.len()].copy_from_slice(d);
            at += d.len();
        }
        dev.write(run[0].0, &buf, WriteFlags::NONE)?;
    }
    Ok(())
}

/// Writes runs from up to `threads` threads at once. Write back needs no order among its
/// writes (each is a different block; all complete before any entry leaves the AIL).
fn write_threaded(
    dev: &dyn Device,
    runs: &[Vec<(u64, AlignedBuf)>],
    threads: usize,
) -> Result<(), DeviceError> {
    // Under the deterministic scheduler one task writes: every task spawned lives until the
    // end of its run there.
    if threads <= 1 || runs.len() < 2 * threads || cilfs_sync::SCHEDULED {
        return write_runs(dev, runs);
    }
    let per = runs.len().div_ceil(threads);
    cilfs_sync::thread::scope(|s| {
        let others: Vec<_> = runs[per..]
            .chunks(per)
            .map(|c| s.spawn(move || write_runs(dev, c)))
            .collect();
        let mut r = write_runs(dev, &runs[..per]);
        for h in others {
            let x = h.join().unwrap_or_else(|_| {
                Err(DeviceError::Io {
                    kind: cilfs_device::IoKind::Write,
                    offset: 0,
                    source: std::io::Error::other("AIL write back thread panicked"),
                })
            });
            if r.is_ok() {
                r = x;
            }
        }
        r
    })
}

/// Writes runs through `queue`, up to `depth` in flight, and returns once all completed (the
/// first error, if any, after every submitted write came back).
fn write_queued(
    queue: &mut dyn WriteQueue,
    depth: usize,
    runs: Vec<Vec<(u64, AlignedBuf)>>,
) -> Result<(), DeviceError> {
    let mut first_err = None;
    let mut reap = |queue: &mut dyn WriteQueue| -> Result<(), DeviceError> {
        for done in queue.complete(true)? {
            if let Err(e) = done.result {
                first_err.get_or_insert(e);
            }
        }
        Ok(())
    };
    let mut refused = None;
    for run in runs {
        while queue.in_flight() >= depth.max(1) {
            reap(queue)?;
        }
        let offset = run[0].0;
        let parts = run
            .into_iter()
            .map(|(_, buf)| {
                let range = 0..buf.len();
                QueuedBuf { tag: 0, buf, range }
            })
            .collect();
        if let Err((_, e)) = queue.submit(offset, parts) {
            refused = Some(e);
            break;
        }
    }
    while queue.in_flight() > 0 {
        reap(queue)?;
    }
    match refused.or(first_err) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use cilfs_device::SimDevice;
    use std::sync::atomic::{AtomicU32, Ordering};

    const BS: usize = 4096;

    /// A block-sized item filled with one byte value.
    #[derive(Debug)]
    struct Block {
        blkno: u64,
        fill: u8,
        pins: AtomicU32,
    }

    impl LogItem for Block {
        fn key(&self) -> ItemKey {
            self.blkno
        }
        fn pins(&self) -> &AtomicU32 {
            &self.pins
        }
        fn prepare_write_back(&self, _lsn: Lsn, _ctx: &WriteBackCtx) -> WriteBack {
            if self.pins.load(Ordering::Acquire) > 0 {
                return WriteBack::Pinned;
            }
            WriteBack::Write {
                offset: self.blkno * BS as u64,
                data: AlignedBuf::from_slice(&[self.fill; BS]),
            }
        }
    }

    fn block(blkno: u64, fill: u8, pins: u32) -> Arc<dyn LogItem> {
        Arc::new(Block {
            blkno,
            fill,
            pins: AtomicU32::new(pins),
        })
    }

    fn lsn(b: u32) -> Lsn {
        Lsn::new(1, b)
    }

    fn read(dev: &SimDevice, blkno: u64) -> u8 {
        let mut b = AlignedBuf::zeroed(BS);
        dev.read(blkno * BS as u64, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == b[0]), "block {blkno} torn");
        b[0]
    }

    /// After a shutdown write back writes nothing and keeps every item: a buffer may hold a
    /// failed transaction's changes, which the log does not have.
    #[test]
    fn a_shut_down_journal_writes_nothing_back() {
        let dev = SimDevice::new(64 * BS as u64, 1);
        let ail = RankedMutex::new(Ail::default());
        for b in 10..14u64 {
            ail.lock().insert(block(b, b as u8, 0), lsn(b as u32));
        }
        let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let ctx = WriteBackCtx {
            down: Some(Arc::clone(&down)),
            ..WriteBackCtx::default()
        };
        let io = RankedMutex::new(WritebackIo::Sync);
        let r = push(&ail, &io, lsn(40), &dev, &ctx, Publish::Completed);
        assert!(matches!(r, Err(PushError::Down)), "{r:?}");
        assert_eq!(dev.stats().writes, 0);
        assert_eq!(ail.lock().below(lsn(40)).len(), 4);
        // Alive, the same push writes them.
        down.store(false, std::sync::atomic::Ordering::Release);
        let r = push(&ail, &io, lsn(40), &dev, &ctx, Publish::Completed).unwrap();
        assert_eq!(r.written, 4);
        assert!(ail.lock().below(lsn(40)).is_empty());
    }

    #[test]
    fn push_writes_below_the_target_in_block_order_and_merges_neighbours() {
        let dev = SimDevice::new(64 * BS as u64, 1);
        let ail = RankedMutex::new(Ail::default());
        // Blocks 10..20 logged in reverse order, so LSN order is the opposite of block order.
        for (i, b) in (10..20u64).rev().enumerate() {
            ail.lock().insert(block(b, b as u8, 0), lsn(8 * i as u32));
        }
        // A pinned item below the target stays, and so does everything at or past the target.
        ail.lock().insert(block(30, 30, 1), lsn(1));
        let before = dev.stats().writes;
        let r = push(
            &ail,
            &RankedMutex::new(WritebackIo::Sync),
            lsn(40),
            &dev,
            &WriteBackCtx::default(),
            Publish::Completed,
        )
        .unwrap();
        assert_eq!((r.written, r.pinned), (5, 1));
        // Blocks 15..20 (LSNs 0..32) are adjacent: one IO.
        assert_eq!(dev.stats().writes - before, 1);
        for b in 15..20 {
            assert_eq!(read(&dev, b), b as u8);
        }
        for b in 10..15 {
            assert_eq!(read(&dev, b), 0, "block {b} is past the target");
        }
        let ail = ail.lock();
        assert_eq!(ail.len(), 6);
        assert_eq!(ail.min_lsn(), Some(lsn(1)));
    }

    /// Deferred write back leaves the AIL but holds the tail where it was until a flush that
    /// started after it completed; a flush that started before does not count, and a record
    /// ordered after a later flush may carry the tail past it.
    #[test]
    fn deferred_write_back_holds_the_tail_until_a_later_flush_completes() {
        let dev = SimDevice::new(64 * BS as u64, 1);
        let ail = RankedMutex::new(Ail::default());
        ail.lock().insert(block(3, 3, 0), lsn(8));
        ail.lock().insert(block(4, 4, 0), lsn(16));
        let io = RankedMutex::new(WritebackIo::Sync);
        let clock = FlushClock::default();
        let early = clock.ticket();
        let ctx = WriteBackCtx::default();
        let r = push(&ail, &io, lsn(12), &dev, &ctx, Publish::Deferred(&clock)).unwrap();
        assert_eq!((r.written, r.flushes), (1, 0));
        assert_eq!(dev.volatile_writes(), 1);
        assert_eq!(ail.lock().len(), 1);
        assert_eq!(
            ail.lock().min_lsn(),
            Some(lsn(8)),
            "the tail moved unflushed"
        );
        // Not written twice while it waits.
        let r = push(&ail, &io, lsn(12), &dev, &ctx, Publish::Deferred(&clock)).unwrap();
        assert_eq!(r.written, 0);
        clock.completed(early);
        assert!(!ail.lock().publish_stable(&clock));
        assert_eq!(ail.lock().min_lsn(), Some(lsn(8)));
        let t = clock.ticket();
        assert_eq!(ail.lock().min_lsn_after_flush(t), Some(lsn(16)));
        assert_eq!(ail.lock().min_lsn_after_flush(early), Some(lsn(8)));
        dev.flush().unwrap();
        clock.completed(t);
        assert!(ail.lock().publish_stable(&clock));
        assert_eq!(ail.lock().min_lsn(), Some(lsn(16)));
    }

    /// Sees, at every flush, the tail the AIL then reports.
    #[derive(Debug)]
    struct TailAtFlush {
        inner: SimDevice,
        ail: Arc<RankedMutex<Ail, { rank::AIL }>>,
        seen: cilfs_sync::Mutex<Vec<(Option<Lsn>, usize)>>,
    }

    impl Device for TailAtFlush {
        fn read(&self, offset: u64, buf: &mut [u8]) -> cilfs_device::Result<()> {
            self.inner.read(offset, buf)
        }
        fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> cilfs_device::Result<()> {
            self.inner.write(offset, buf, flags)
        }
        fn flush(&self) -> cilfs_device::Result<()> {
            self.flush_reporting().map(drop)
        }
        fn flush_reporting(&self) -> cilfs_device::Result<bool> {
            let tail = self.ail.lock().min_lsn();
            self.seen.lock().push((tail, self.inner.volatile_writes()));
            self.inner.flush_reporting()
        }
        fn len(&self) -> u64 {
            self.inner.len()
        }
        fn stats(&self) -> cilfs_device::IoStats {
            self.inner.stats()
        }
    }

    /// A push that publishes after its own flush: when the flush is issued the tail is still
    /// held below the write back it covers (and that of an earlier deferred push); once the push
    /// returns the tail has moved and nothing is volatile.
    #[test]
    fn flushed_write_back_moves_the_tail_only_after_its_flush() {
        let ail = Arc::new(RankedMutex::new(Ail::default()));
        let dev = TailAtFlush {
            inner: SimDevice::new(64 * BS as u64, 1),
            ail: Arc::clone(&ail),
            seen: cilfs_sync::Mutex::new(Vec::new()),
        };
        for (b, l) in [(3, 8), (4, 16), (5, 24)] {
            ail.lock().insert(block(b, b as u8, 0), lsn(l));
        }
        let io = RankedMutex::new(WritebackIo::Sync);
        let clock = FlushClock::default();
        let ctx = WriteBackCtx::default();
        push(&ail, &io, lsn(12), &dev, &ctx, Publish::Deferred(&clock)).unwrap();
        let r = push(&ail, &io, lsn(20), &dev, &ctx, Publish::Flushed).unwrap();
        assert_eq!((r.written, r.flushes), (1, 1));
        assert_eq!(*dev.seen.lock(), vec![(Some(lsn(8)), 2)]);
        assert_eq!(dev.inner.volatile_writes(), 0);
        assert_eq!(ail.lock().min_lsn(), Some(lsn(24)));
    }

    #[test]
    fn an_entry_that_moved_during_its_write_back_stays() {
        let mut ail = Ail::default();
        let item = block(5, 1, 0);
        ail.insert(Arc::clone(&item), lsn(8));
        let snapshot = ail.below(Lsn::from_raw(u64::MAX));
        let mut r = AilPush::default();
        let batch = ail.prepare_batch(&snapshot, &WriteBackCtx::default(), &mut r);
        assert_eq!(batch.done, vec![(lsn(8), 5)]);
        // A newer checkpoint relogged the item and completed while the old image was written.
        ail.insert(item, lsn(24));
        ail.remove_written(&batch.done);
        // The write back holds the tail at its LSN until let go.
        assert_eq!(ail.min_lsn(), Some(lsn(8)));
        ail.release(&batch.held);
        assert_eq!(ail.len(), 1);
        assert_eq!(ail.min_lsn(), Some(lsn(24)));
        // Once its new image is written back, it goes.
        let snapshot = ail.below(Lsn::from_raw(u64::MAX));
        let batch = ail.prepare_batch(&snapshot, &WriteBackCtx::default(), &mut r);
        ail.remove_written(&batch.done);
        assert!(!ail.is_empty(), "held by its write back");
        ail.release(&batch.held);
        assert!(ail.is_empty());
    }

    /// Through a queue whose writes land only when completed, newest first: every block is
    /// written, adjacent ones as one merged IO, nothing is left in flight when `push` returns,
    /// and only then do the entries leave the AIL.
    #[test]
    fn queued_write_back_writes_every_block_before_entries_leave() {
        use crate::util::test_queue::Queued;
        let sim = Arc::new(SimDevice::new(4096 * BS as u64, 3));
        let dev = Queued::new(Arc::clone(&sim), false);
        let ail = RankedMutex::new(Ail::default());
        // Every other block (no merging), then a run of 20 adjacent ones (one IO).
        let blocks: Vec<u64> = (0..600u64).map(|i| 2 * i).chain(2000..2020).collect();
        for (i, &b) in blocks.iter().enumerate() {
            ail.lock()
                .insert(block(b, (b % 251) as u8 + 1, 0), lsn(i as u32));
        }
        let io = RankedMutex::new(WritebackIo::for_device(&dev, 4));
        assert!(matches!(*io.lock(), WritebackIo::Queue { .. }));
        let writes_before = sim.stats().writes;
        let r = push(
            &ail,
            &io,
            Lsn::from_raw(u64::MAX),
            &dev,
            &WriteBackCtx::default(),
            Publish::Completed,
        )
        .unwrap();
        assert_eq!(r.written, blocks.len() as u64);
        assert_eq!(
            dev.in_flight.load(Ordering::SeqCst),
            0,
            "writes left in flight"
        );
        assert_eq!(
            dev.merged.load(Ordering::SeqCst),
            1,
            "the adjacent run is one IO"
        );
        assert_eq!(sim.stats().writes - writes_before, 600 + 20);
        assert!(ail.lock().is_empty());
        for &b in &blocks {
            assert_eq!(read(&sim, b), (b % 251) as u8 + 1, "block {b}");
        }
    }

    /// What the AIL must answer, kept the plain way: each item's LSN.
    fn model_below(model: &BTreeMap<ItemKey, Lsn>, target: Lsn) -> Vec<(Lsn, ItemKey)> {
        let mut v: Vec<_> = model
            .iter()
            .filter(|(_, &l)| l < target)
            .map(|(&k, &l)| (l, k))
            .collect();
        v.sort_unstable_by_key(|&(_, k)| k);
        v
    }

    fn assert_matches(ail: &Ail, model: &BTreeMap<ItemKey, Lsn>) {
        assert_eq!(ail.len(), model.len());
        assert_eq!(ail.min_lsn(), model.values().min().copied());
        let all = Lsn::from_raw(u64::MAX);
        assert_eq!(ail.below(all), model_below(model, all));
        for (&lsn, b) in &ail.batches {
            assert!(b.live > 0, "empty batch at {lsn}");
            assert_eq!(b.live, b.slots.iter().filter(|s| s.item.is_some()).count());
        }
        for (&key, &(lsn, slot)) in &ail.place {
            let s = &ail.batches[&lsn].slots[slot as usize];
            assert_eq!(s.key, key, "slot {slot} at {lsn}");
            assert!(s.item.is_some(), "{key} placed in an empty slot");
        }
    }

    #[test]
    fn relogged_items_leave_their_checkpoint_and_the_tail_follows() {
        let mut ail = Ail::default();
        ail.insert_all(lsn(8), vec![block(1, 1, 0), block(2, 2, 0), block(3, 3, 0)]);
        ail.insert_all(lsn(16), vec![block(4, 4, 0)]);
        ail.insert_all(lsn(24), vec![block(1, 1, 0), block(2, 2, 0)]);
        // Block 3 still holds the tail at the first checkpoint.
        assert_eq!(ail.min_lsn(), Some(lsn(8)));
        assert_eq!(ail.below(lsn(16)), vec![(lsn(8), 3)]);
        assert_eq!(ail.len(), 4);
        // An entry a push saw before its item moved on finds nothing to write.
        let mut r = AilPush::default();
        let stale = ail.prepare_batch(&[(lsn(8), 1)], &WriteBackCtx::default(), &mut r);
        assert_eq!((r.written, stale.done.len()), (0, 0));
        ail.insert_all(lsn(24), vec![block(3, 3, 0)]);
        assert_eq!(ail.min_lsn(), Some(lsn(16)));
        assert!(
            !ail.batches.contains_key(&lsn(8)),
            "an empty checkpoint stays"
        );
        ail.remove_written(&[(lsn(16), 4)]);
        assert_eq!(ail.min_lsn(), Some(lsn(24)));
        assert_eq!(
            ail.below(lsn(32)),
            vec![(lsn(24), 1), (lsn(24), 2), (lsn(24), 3)]
        );
    }

    #[test]
    fn a_mostly_relogged_checkpoint_is_compacted_and_its_items_stay_reachable() {
        let mut ail = Ail::default();
        ail.insert_all(lsn(8), (0..1000u64).map(|b| block(b, 1, 0)).collect());
        ail.insert_all(
            lsn(16),
            (0..1000u64)
                .filter(|b| b % 5 != 0)
                .map(|b| block(b, 2, 0))
                .collect(),
        );
        // Compacted once a quarter of its 1000 slots held items (249), not since.
        let old = &ail.batches[&lsn(8)];
        assert_eq!((old.live, old.slots.len()), (200, 249));
        let left = ail.below(lsn(16));
        assert_eq!(
            left,
            (0..1000u64)
                .step_by(5)
                .map(|b| (lsn(8), b))
                .collect::<Vec<_>>()
        );
        // Every one of them is still found through its new slot, and written back.
        let mut r = AilPush::default();
        let batch = ail.prepare_batch(&left, &WriteBackCtx::default(), &mut r);
        assert_eq!(r.written, 200);
        ail.remove_written(&batch.done);
        ail.release(&batch.held);
        assert_eq!(ail.min_lsn(), Some(lsn(16)));
        assert_eq!(ail.len(), 800);
    }

    #[test]
    fn an_item_logged_again_at_its_lsn_is_replaced_in_its_slot() {
        let mut ail = Ail::default();
        ail.insert(block(7, 1, 0), lsn(8));
        ail.insert_all(lsn(8), vec![block(7, 9, 0), block(8, 8, 0)]);
        assert_eq!(ail.len(), 2);
        let mut r = AilPush::default();
        let b = ail.prepare_batch(&ail.below(lsn(16)), &WriteBackCtx::default(), &mut r);
        assert_eq!(b.done, vec![(lsn(8), 7), (lsn(8), 8)]);
        assert_eq!(b.writes[0].1[0], 9, "the older image was written");
    }

    proptest::proptest! {
        /// Checkpoints of random items at rising LSNs (some at the same LSN twice), write backs
        /// of random entries (some already moved on): the AIL answers as the plain model does.
        #[test]
        fn batches_answer_as_a_map_of_lsns(
            ops in proptest::collection::vec(
                (0u8..3, proptest::collection::vec(0u64..300, 0..80), 0u32..6),
                1..60,
            )
        ) {
            let mut ail = Ail::default();
            let mut model: BTreeMap<ItemKey, Lsn> = BTreeMap::new();
            let mut at = 8u32;
            for (kind, keys, step) in ops {
                match kind {
                    0 => {
                        at += 8 * step;
                        let l = lsn(at);
                        ail.insert_all(l, keys.iter().map(|&k| block(k, 1, 0)).collect());
                        for &k in &keys {
                            model.insert(k, l);
                        }
                    }
                    1 => {
                        // A low LSN, maybe between or below the batches there are: only
                        // items not past it may go there.
                        let l = lsn(8 + 4 * step);
                        at = at.max(8 + 4 * step);
                        let keys: Vec<u64> = keys
                            .into_iter()
                            .filter(|k| model.get(k).is_none_or(|&m| m <= l))
                            .collect();
                        ail.insert_all(l, keys.iter().map(|&k| block(k, 1, 0)).collect());
                        for &k in &keys {
                            model.insert(k, l);
                        }
                    }
                    _ => {
                        // Entries as a push saw them, some since moved: only those still at
                        // that LSN leave.
                        let target = lsn(at.saturating_sub(8 * step));
                        let seen = ail.below(target);
                        let done: Vec<_> = seen
                            .iter()
                            .copied()
                            .filter(|&(_, k)| keys.contains(&k) || k % 3 == 0)
                            .collect();
                        let again: Vec<u64> = keys
                            .iter()
                            .copied()
                            .filter(|&k| k % 2 == 0 && model.get(&k).is_none_or(|&m| m <= lsn(at)))
                            .collect();
                        ail.insert_all(lsn(at), again.iter().map(|&k| block(k, 1, 0)).collect());
                        for &k in &again {
                            model.insert(k, lsn(at));
                        }
                        ail.remove_written(&done);
                        for (l, k) in done {
                            if model.get(&k) == Some(&l) {
                                model.remove(&k);
                            }
                        }
                    }
                }
                assert_matches(&ail, &model);
            }
        }
    }

    #[test]
    fn parallel_write_back_writes_every_block() {
        let dev = SimDevice::new(4096 * BS as u64, 2);
        let ail = RankedMutex::new(Ail::default());
        // Every other block, so that no two merge: many runs for the threads to share.
        for i in 0..1500u64 {
            ail.lock()
                .insert(block(2 * i, (i % 251) as u8 + 1, 0), lsn(i as u32));
        }
        let r = push(
            &ail,
            &RankedMutex::new(WritebackIo::Threads(4)),
            Lsn::from_raw(u64::MAX),
            &dev,
            &WriteBackCtx::default(),
            Publish::Completed,
        )
        .unwrap();
        assert_eq!(r.written, 1500);
        assert!(ail.lock().is_empty());
        for i in 0..1500u64 {
            assert_eq!(read(&dev, 2 * i), (i % 251) as u8 + 1);
        }
    }
}
