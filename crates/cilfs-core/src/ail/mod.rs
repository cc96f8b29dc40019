//! The active item list: items whose checkpoint is stable, ordered by the LSN of the checkpoint
//! that last logged them. Its lowest LSN is the log tail; writing items back in place moves it.

use crate::log::Lsn;
use crate::trans::item::{ItemKey, LogItem, WriteBack};
use cilfs_device::{AlignedBuf, Device, DeviceError, QueuedBuf, WriteFlags, WriteQueue};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct Ail {
    by_lsn: BTreeMap<(Lsn, ItemKey), Arc<dyn LogItem>>,
    /// Block numbers, hashed without SipHash (`numhash`): every item of every checkpoint is
    /// looked up here when it enters the AIL, on the push thread.
    lsn_of: crate::numhash::NumberMap<Lsn>,
}

/// What one AIL push did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AilPush {
    pub written: u64,
    pub written_bytes: u64,
    pub stale: u64,
    pub pinned: u64,
    pub busy: u64,
}

impl Ail {
    pub fn len(&self) -> usize {
        self.by_lsn.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_lsn.is_empty()
    }

    /// The tail: the lowest LSN in the AIL.
    pub fn min_lsn(&self) -> Option<Lsn> {
        self.by_lsn.keys().next().map(|k| k.0)
    }

    /// Inserts an item at `lsn`, or moves it there; an item only moves forward.
    pub fn insert(&mut self, item: Arc<dyn LogItem>, lsn: Lsn) {
        let key = item.key();
        if let Some(old) = self.lsn_of.insert(key, lsn) {
            assert!(old <= lsn, "AIL item {key} moving back from {old} to {lsn}");
            self.by_lsn.remove(&(old, key));
        }
        self.by_lsn.insert((lsn, key), item);
    }

    /// The entries below `target`, in block order (the order write back goes out in).
    pub fn below(&self, target: Lsn) -> Vec<(Lsn, ItemKey)> {
        let mut v: Vec<(Lsn, ItemKey)> =
            self.by_lsn.range(..(target, 0)).map(|(k, _)| *k).collect();
        v.sort_unstable_by_key(|&(_, key)| key);
        v
    }

    /// Prepares the write backs of `entries` still in the AIL at the same LSN (an entry that
    /// moved was relogged by a newer checkpoint and stays). Pinned or locked items are skipped
    /// (and counted); they stay in the AIL.
    pub fn prepare_batch(
        &self,
        entries: &[(Lsn, ItemKey)],
        uuid: &[u8; 16],
        r: &mut AilPush,
    ) -> WritebackBatch {
        let mut b = WritebackBatch::default();
        for &k in entries {
            let Some(item) = self.by_lsn.get(&k) else {
                continue;
            };
            match item.prepare_write_back(k.0, uuid) {
                WriteBack::Write { offset, data } => {
                    r.written += 1;
                    r.written_bytes += data.len() as u64;
                    b.writes.push((offset, data));
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
            }
            b.done.push(k);
        }
        b
    }

    /// Lets go of entries whose write back completed. An entry that moved meanwhile (its item
    /// was relogged and a newer checkpoint completed) stays: the write did not carry that
    /// checkpoint's changes.
    pub fn remove_written(&mut self, done: &[(Lsn, ItemKey)]) {
        for &(lsn, key) in done {
            if self.lsn_of.get(&key) == Some(&lsn) {
                self.lsn_of.remove(&key);
                self.by_lsn.remove(&(lsn, key));
            }
        }
    }
}

/// One batch of AIL write back, prepared under the AIL lock and written without it.
#[derive(Debug, Default)]
pub struct WritebackBatch {
    pub writes: Vec<(u64, AlignedBuf)>,
    /// Entries to remove once the writes completed.
    pub done: Vec<(Lsn, ItemKey)>,
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
/// blocks merge into one IO. An entry leaves the AIL (and the tail may move) only after its
/// write completed.
pub fn push(
    ail: &Mutex<Ail>,
    io: &Mutex<WritebackIo>,
    target: Lsn,
    dev: &dyn Device,
    uuid: &[u8; 16],
) -> Result<AilPush, DeviceError> {
    let mut io = io.lock();
    let mut r = AilPush::default();
    // Block order, not LSN order: every entry below the target must go before the tail can
    // pass it, and neighbouring blocks then merge into one IO.
    let entries = ail.lock().below(target);
    for chunk in entries.chunks(WRITEBACK_BATCH) {
        let b = ail.lock().prepare_batch(chunk, uuid, &mut r);
        let runs = merge_runs(b.writes);
        match &mut *io {
            WritebackIo::Sync => write_runs(dev, &runs)?,
            WritebackIo::Threads(n) => write_threaded(dev, &runs, *n)?,
            WritebackIo::Queue { queue, depth } => write_queued(&mut **queue, *depth, runs)?,
        }
        ail.lock().remove_written(&b.done);
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
    if threads <= 1 || runs.len() < 2 * threads {
        return write_runs(dev, runs);
    }
    let per = runs.len().div_ceil(threads);
    std::thread::scope(|s| {
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
        fn prepare_write_back(&self, _lsn: Lsn, _uuid: &[u8; 16]) -> WriteBack {
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

    #[test]
    fn push_writes_below_the_target_in_block_order_and_merges_neighbours() {
        let dev = SimDevice::new(64 * BS as u64, 1);
        let ail = Mutex::new(Ail::default());
        // Blocks 10..20 logged in reverse order, so LSN order is the opposite of block order.
        for (i, b) in (10..20u64).rev().enumerate() {
            ail.lock().insert(block(b, b as u8, 0), lsn(8 * i as u32));
        }
        // A pinned item below the target stays, and so does everything at or past the target.
        ail.lock().insert(block(30, 30, 1), lsn(1));
        let before = dev.stats().writes;
        let r = push(
            &ail,
            &Mutex::new(WritebackIo::Sync),
            lsn(40),
            &dev,
            &[0; 16],
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

    #[test]
    fn an_entry_that_moved_during_its_write_back_stays() {
        let mut ail = Ail::default();
        let item = block(5, 1, 0);
        ail.insert(Arc::clone(&item), lsn(8));
        let snapshot = ail.below(Lsn::from_raw(u64::MAX));
        let mut r = AilPush::default();
        let batch = ail.prepare_batch(&snapshot, &[0; 16], &mut r);
        assert_eq!(batch.done, vec![(lsn(8), 5)]);
        // A newer checkpoint relogged the item and completed while the old image was written.
        ail.insert(item, lsn(24));
        ail.remove_written(&batch.done);
        assert_eq!(ail.len(), 1);
        assert_eq!(ail.min_lsn(), Some(lsn(24)));
        // Once its new image is written back, it goes.
        let snapshot = ail.below(Lsn::from_raw(u64::MAX));
        let batch = ail.prepare_batch(&snapshot, &[0; 16], &mut r);
        ail.remove_written(&batch.done);
        assert!(ail.is_empty());
    }

    /// Through a queue whose writes land only when completed, newest first: every block is
    /// written, adjacent ones as one merged IO, nothing is left in flight when `push` returns,
    /// and only then do the entries leave the AIL.
    #[test]
    fn queued_write_back_writes_every_block_before_entries_leave() {
        use crate::test_queue::Queued;
        let sim = Arc::new(SimDevice::new(4096 * BS as u64, 3));
        let dev = Queued::new(Arc::clone(&sim), false);
        let ail = Mutex::new(Ail::default());
        // Every other block (no merging), then a run of 20 adjacent ones (one IO).
        let blocks: Vec<u64> = (0..600u64).map(|i| 2 * i).chain(2000..2020).collect();
        for (i, &b) in blocks.iter().enumerate() {
            ail.lock()
                .insert(block(b, (b % 251) as u8 + 1, 0), lsn(i as u32));
        }
        let io = Mutex::new(WritebackIo::for_device(&dev, 4));
        assert!(matches!(*io.lock(), WritebackIo::Queue { .. }));
        let writes_before = sim.stats().writes;
        let r = push(&ail, &io, Lsn::from_raw(u64::MAX), &dev, &[0; 16]).unwrap();
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

    #[test]
    fn parallel_write_back_writes_every_block() {
        let dev = SimDevice::new(4096 * BS as u64, 2);
        let ail = Mutex::new(Ail::default());
        // Every other block, so that no two merge: many runs for the threads to share.
        for i in 0..1500u64 {
            ail.lock()
                .insert(block(2 * i, (i % 251) as u8 + 1, 0), lsn(i as u32));
        }
        let r = push(
            &ail,
            &Mutex::new(WritebackIo::Threads(4)),
            Lsn::from_raw(u64::MAX),
            &dev,
            &[0; 16],
        )
        .unwrap();
        assert_eq!(r.written, 1500);
        assert!(ail.lock().is_empty());
        for i in 0..1500u64 {
            assert_eq!(read(&dev, 2 * i), (i % 251) as u8 + 1);
        }
    }
}
