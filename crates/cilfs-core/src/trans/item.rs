//! What the journal needs from a logged object.

use crate::log::Lsn;
use cilfs_device::AlignedBuf;
use std::sync::atomic::AtomicU32;

/// Identifies a log item; unique among live items (a buffer's key is its block number).
pub type ItemKey = u64;

/// Outcome of asking an item for its write back in place.
#[derive(Debug)]
pub enum WriteBack {
    /// Write `data` at byte `offset` of the data device; the item already counts as clean.
    Write { offset: u64, data: AlignedBuf },
    /// Locked by a transaction: try again later.
    Busy,
    /// In a checkpoint that is not yet stable (rule 2): push the CIL first.
    Pinned,
    /// Freed: nothing to write, just drop it from the AIL.
    Stale,
}

/// A logged object. Its formatted images reach the CIL through a transaction, which holds the
/// object locked; the journal pins it while a checkpoint that logged it is not stable, and the AIL
/// writes it back once it is.
pub trait LogItem: Send + Sync + std::fmt::Debug {
    fn key(&self) -> ItemKey;
    /// How many CIL contexts hold this item and have not completed.
    fn pins(&self) -> &AtomicU32;
    /// The write that puts the item in place, unless it is locked or pinned. `lsn` is the
    /// checkpoint that last logged it (stamped into blocks that carry an LSN). Clears its dirty
    /// state: the caller must issue the write (or shut the journal down) before the item leaves
    /// the AIL.
    fn prepare_write_back(&self, lsn: Lsn, uuid: &[u8; 16]) -> WriteBack;
}
