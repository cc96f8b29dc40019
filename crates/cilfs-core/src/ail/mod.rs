//! The active item list: items whose checkpoint is stable, ordered by the LSN of the checkpoint
//! that last logged them. Its lowest LSN is the log tail; writing items back in place moves it.

use crate::log::Lsn;
use crate::trans::item::{ItemKey, LogItem, WriteBack};
use cilfs_device::{AlignedBuf, Device, DeviceError, WriteFlags};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct Ail {
    by_lsn: BTreeMap<(Lsn, ItemKey), Arc<dyn LogItem>>,
    lsn_of: HashMap<ItemKey, Lsn>,
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

/// Writes back items with LSN below `target`, in block order, removing those written. The AIL
/// lock is held only to prepare each batch and to remove its entries, so checkpoints can insert
/// items and sample the tail while the batch is written; `writeback` serialises pushers, so two
/// images of one block are never in flight at once. Adjacent blocks merge into one IO. An entry leaves the AIL (and the tail may move) only after its
/// write completed.
pub fn push(
    ail: &Mutex<Ail>,
    writeback: &Mutex<()>,
    target: Lsn,
    dev: &dyn Device,
    uuid: &[u8; 16],
    queue_depth: usize,
) -> Result<AilPush, DeviceError> {
    let _serial = writeback.lock();
    let mut r = AilPush::default();
    // Block order, not LSN order: every entry below the target must go before the tail can
    // pass it, and neighbouring blocks then merge into one IO.
    let entries = ail.lock().below(target);
    for chunk in entries.chunks(WRITEBACK_BATCH) {
        let mut b = ail.lock().prepare_batch(chunk, uuid, &mut r);
        write_merged(dev, &mut b.writes, queue_depth)?;
        ail.lock().remove_written(&b.done);
    }
    Ok(r)
}

/// Items prepared and written per batch (also the most block copies held at once).
const WRITEBACK_BATCH: usize = 1024;
/// The largest merged writeback IO.
const MERGED_IO_MAX: usize = 1 << 20;

/// Writes `(offset, data)` pairs sorted by offset, merging runs of adjacent ones, from up to
/// `queue_depth` threads at once. Write back needs no order among its writes (each is a
/// different block; all complete before any entry leaves the AIL), and random 4 KiB writes one
/// at a time would cap the tail's speed at one IO latency per block.
fn write_merged(
    dev: &dyn Device,
    writes: &mut [(u64, AlignedBuf)],
    queue_depth: usize,
) -> Result<(), DeviceError> {
    writes.sort_unstable_by_key(|w| w.0);
    let mut runs = Vec::new();
    let mut i = 0;
    while i < writes.len() {
        let mut j = i + 1;
        let mut end = writes[i].0 + writes[i].1.len() as u64;
        let mut len = writes[i].1.len();
        while j < writes.len() && writes[j].0 == end && len + writes[j].1.len() <= MERGED_IO_MAX {
            end += writes[j].1.len() as u64;
            len += writes[j].1.len();
            j += 1;
        }
        runs.push(&writes[i..j]);
        i = j;
    }
    let write_runs = |runs: &[&[(u64, AlignedBuf)]]| -> Result<(), DeviceError> {
        for run in runs {
            if let [(offset, data)] = run {
                dev.write(*offset, data, WriteFlags::NONE)?;
                continue;
            }
            let mut buf = AlignedBuf::zeroed(run.iter().map(|w| w.1.len()).sum());
            let mut at = 0;
            for (_, d) in *run {
                buf[at..at + d.len()].copy_from_slice(d);
                at += d.len();
            }
            dev.write(run[0].0, &buf, WriteFlags::NONE)?;
        }
        Ok(())
    };
    if queue_depth <= 1 || runs.len() < 2 * queue_depth {
        return write_runs(&runs);
    }
    let per = runs.len().div_ceil(queue_depth);
    std::thread::scope(|s| {
        let others: Vec<_> = runs[per..]
            .chunks(per)
            .map(|c| s.spawn(move || write_runs(c)))
            .collect();
        let mut r = write_runs(&runs[..per]);
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
        let r = push(&ail, &Mutex::new(()), lsn(40), &dev, &[0; 16], 1).unwrap();
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
            &Mutex::new(()),
            Lsn::from_raw(u64::MAX),
            &dev,
            &[0; 16],
            4,
        )
        .unwrap();
        assert_eq!(r.written, 1500);
        assert!(ail.lock().is_empty());
        for i in 0..1500u64 {
            assert_eq!(read(&dev, 2 * i), (i % 251) as u8 + 1);
        }
    }
}
