//! The active item list: items whose checkpoint is stable, ordered by the LSN of the checkpoint
//! that last logged them. Its lowest LSN is the log tail; writing items back in place moves it.

use crate::log::Lsn;
use crate::trans::item::{ItemKey, LogItem, WriteBack};
use cilfs_device::{Device, DeviceError};
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
    /// Pinned or locked items stay (and are counted).
    pub fn push(
        &mut self,
        target: Lsn,
        dev: &dyn Device,
        uuid: &[u8; 16],
    ) -> Result<AilPush, DeviceError> {
        let mut r = AilPush::default();
        let keys: Vec<(Lsn, ItemKey)> = self.by_lsn.range(..(target, 0)).map(|(k, _)| *k).collect();
        for k in keys {
            let Some(item) = self.by_lsn.get(&k) else {
                continue;
            };
            match item.write_back(dev, k.0, uuid)? {
                WriteBack::Written { bytes } => {
                    r.written += 1;
                    r.written_bytes += bytes;
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
            self.by_lsn.remove(&k);
            self.lsn_of.remove(&k.1);
        }
        Ok(r)
    }
}
