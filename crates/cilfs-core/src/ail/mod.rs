//! The active item list: items whose checkpoint is stable, ordered by the LSN of the checkpoint
//! that last logged them. Its lowest LSN is the log tail; writing items back in place moves it.

use crate::log::Lsn;
use crate::trans::item::{ItemKey, LogItem, WriteBack};
use cilfs_device::{AlignedBuf, Device, DeviceError, WriteFlags};
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

    /// Writes back items with LSN below `target`, oldest first, removing those written.
    /// Pinned or locked items stay (and are counted). Writes go out in batches sorted by
    /// offset, adjacent blocks merged into one IO.
    pub fn push(
        &mut self,
        target: Lsn,
        dev: &dyn Device,
        uuid: &[u8; 16],
    ) -> Result<AilPush, DeviceError> {
        let mut r = AilPush::default();
        let keys: Vec<(Lsn, ItemKey)> = self.by_lsn.range(..(target, 0)).map(|(k, _)| *k).collect();
        for batch in keys.chunks(WRITEBACK_BATCH) {
            let mut writes: Vec<(u64, AlignedBuf)> = Vec::with_capacity(batch.len());
            let mut done: Vec<(Lsn, ItemKey)> = Vec::with_capacity(batch.len());
            for k in batch {
                let Some(item) = self.by_lsn.get(k) else {
                    continue;
                };
                match item.prepare_write_back(k.0, uuid) {
                    WriteBack::Write { offset, data } => {
                        r.written += 1;
                        r.written_bytes += data.len() as u64;
                        writes.push((offset, data));
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
                done.push(*k);
            }
            write_merged(dev, &mut writes)?;
            // Only now, with the writes issued, may the items leave the AIL and the tail move.
            for k in done {
                self.by_lsn.remove(&k);
                self.lsn_of.remove(&k.1);
            }
        }
        Ok(r)
    }
}

/// Items prepared and written per batch (also the most block copies held at once).
const WRITEBACK_BATCH: usize = 256;
/// The largest merged writeback IO.
const MERGED_IO_MAX: usize = 1 << 20;

/// Writes `(offset, data)` pairs sorted by offset, merging runs of adjacent ones.
fn write_merged(dev: &dyn Device, writes: &mut [(u64, AlignedBuf)]) -> Result<(), DeviceError> {
    writes.sort_unstable_by_key(|w| w.0);
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
        if j == i + 1 {
            dev.write(writes[i].0, &writes[i].1, WriteFlags::NONE)?;
        } else {
            let mut run = AlignedBuf::zeroed(len);
            let mut at = 0;
            for (_, d) in &writes[i..j] {
                run[at..at + d.len()].copy_from_slice(d);
                at += d.len();
            }
            dev.write(writes[i].0, &run, WriteFlags::NONE)?;
        }
        i = j;
    }
    Ok(())
}
