//! What the journal needs from a logged object.

use super::Lsn;
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
    /// Failed its write check (`BlockCheck`): never written, and the journal shuts down,
    /// since the block in memory is no longer one the format allows.
    Invalid { what: String },
}

/// Checks the structure of a metadata block (`data`, block `blkno`): Err says what is wrong.
/// The layer that knows the block's format registers one per stamp offset
/// (`Journal::register_block_check`); the journal runs it on a block's first use after a
/// device read and before every write back.
pub type BlockCheck = fn(data: &[u8], blkno: u64) -> Result<(), String>;

/// What write back stamps into blocks, and the checks it runs first.
#[derive(Debug, Clone, Default)]
pub struct WriteBackCtx {
    pub uuid: [u8; 16],
    /// (stamp offset, check) for blocks that keep an LSN stamp there.
    pub checks: Vec<(u16, BlockCheck)>,
    /// The journal's shutdown flag: once it is set, write back stops before its next batch.
    /// Nothing is written after a shutdown: a buffer may then hold changes of a transaction
    /// that failed, which the log does not have.
    pub down: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Where the blocks whose write back is in flight are listed.
    pub writing: Option<std::sync::Arc<WritingBack>>,
}

/// The blocks whose write back is in flight. A block freed meanwhile may be given to a file
/// whose data is written straight to the device, not through the AIL: that write waits until
/// the older image landed, or the image would land on the new owner's data. (XFS keeps a
/// buffer locked through its IO, and the free's lookup of it waits.) Writes of the AIL itself
/// need no wait: one push at a time, each batch complete before the next.
#[derive(Debug, Default)]
pub struct WritingBack {
    blocks: cilfs_sync::Mutex<std::collections::HashMap<u64, u32>>,
    landed: cilfs_sync::Condvar,
    /// How many `wait`s found a block in flight.
    waits: std::sync::atomic::AtomicU64,
}

impl WritingBack {
    /// Lists `blocks` until the guard drops (after their writes completed or failed).
    pub fn begin<'a>(&'a self, blocks: &'a [u64]) -> WritingGuard<'a> {
        let mut m = self.blocks.lock();
        for &b in blocks {
            *m.entry(b).or_default() += 1;
        }
        WritingGuard { of: self, blocks }
    }

    /// Waits until no block of `[from, to)` is being written back.
    pub fn wait(&self, from: u64, to: u64) {
        let mut m = self.blocks.lock();
        let mut counted = false;
        while m.keys().any(|b| (from..to).contains(b)) {
            if !std::mem::replace(&mut counted, true) {
                self.waits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            self.landed.wait(&mut m);
        }
    }

    /// How many waits found a block in flight.
    pub fn waits(&self) -> u64 {
        self.waits.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Blocks listed by `WritingBack::begin`.
#[derive(Debug)]
pub struct WritingGuard<'a> {
    of: &'a WritingBack,
    blocks: &'a [u64],
}

impl Drop for WritingGuard<'_> {
    fn drop(&mut self) {
        let mut m = self.of.blocks.lock();
        for b in self.blocks {
            if let Some(n) = m.get_mut(b) {
                *n -= 1;
                if *n == 0 {
                    m.remove(b);
                }
            }
        }
        self.of.landed.notify_all();
    }
}

impl WriteBackCtx {
    /// Whether the journal has shut down.
    pub fn is_down(&self) -> bool {
        self.down
            .as_ref()
            .is_some_and(|d| d.load(std::sync::atomic::Ordering::Acquire))
    }

    /// The check of blocks stamped at `lsn_offset`, if one is registered.
    pub fn check_at(&self, lsn_offset: u16) -> Option<BlockCheck> {
        self.checks
            .iter()
            .find(|(o, _)| *o == lsn_offset)
            .map(|&(_, c)| c)
    }
}

/// A logged object. Its formatted images reach the CIL through a transaction, which holds the
/// object locked; the journal pins it while a checkpoint that logged it is not stable, and the AIL
/// writes it back once it is.
pub trait LogItem: Send + Sync + std::fmt::Debug {
    fn key(&self) -> ItemKey;
    /// How many CIL contexts hold this item and have not completed.
    fn pins(&self) -> &AtomicU32;
    /// The write that puts the item in place, unless it is locked or pinned. `lsn` is the
    /// checkpoint that last logged it (stamped into blocks that carry an LSN, with `ctx.uuid`,
    /// after `ctx`'s check of such blocks passed). Clears its dirty state: the caller must
    /// issue the write (or shut the journal down) before the item leaves the AIL.
    fn prepare_write_back(&self, lsn: Lsn, ctx: &WriteBackCtx) -> WriteBack;
}
