//! Transactions: reserve log space up front, lock and modify buffers, commit into the CIL
//! without waiting for IO.

pub mod grant;
pub mod item;

use crate::buf::{Buf, BufGuard};
use crate::journal::{Journal, JournalError};
use crate::log::record::OP_HEADER_BYTES;
use std::sync::Arc;

/// Log space a transaction reserves: enough for every buffer it may log, in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub unit_bytes: u64,
}

impl Reservation {
    /// For a transaction that logs at most `buffers` blocks of `block_size` bytes each.
    pub fn for_buffers(buffers: u64, block_size: u32) -> Self {
        let per_buf = OP_HEADER_BYTES as u64 + 16 + 8 + u64::from(block_size);
        // Plus the checkpoint's fixed ops and record overhead, proportionally (1 in 32).
        let stream = buffers * per_buf;
        Self {
            unit_bytes: stream + stream / 32 + 4096,
        }
    }
}

/// A handle to a buffer held by a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufRef(usize);

struct Held {
    buf: Arc<Buf>,
    guard: BufGuard,
    logged: bool,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("blkno", &self.buf.blkno())
            .field("logged", &self.logged)
            .finish()
    }
}

/// A transaction. Buffers it touches stay locked until it commits or is dropped; dropping one that
/// logged changes is a bug (the changes could be neither undone nor committed) and panics.
#[derive(Debug)]
pub struct Transaction<'j> {
    pub(crate) journal: &'j Journal,
    pub(crate) unit: u64,
    held: Vec<Held>,
    finished: bool,
}

impl<'j> Transaction<'j> {
    pub(crate) fn new(journal: &'j Journal, unit: u64) -> Self {
        Self {
            journal,
            unit,
            held: Vec::new(),
            finished: false,
        }
    }

    /// Locks block `blkno` for this transaction (in the caller's lock order).
    pub fn buf(&mut self, blkno: u64) -> Result<BufRef, JournalError> {
        if let Some(i) = self.held.iter().position(|h| h.buf.blkno() == blkno) {
            return Ok(BufRef(i));
        }
        let buf = self.journal.buf(blkno)?;
        let guard = self
            .journal
            .buf_waits
            .acquire(|| buf.try_lock(), || buf.lock());
        self.held.push(Held {
            buf,
            guard,
            logged: false,
        });
        Ok(BufRef(self.held.len() - 1))
    }

    pub fn data(&self, b: BufRef) -> &[u8] {
        &self.held[b.0].guard.data
    }

    /// Writes `bytes` at `offset` of the block and logs the range.
    pub fn write(&mut self, b: BufRef, offset: usize, bytes: &[u8]) {
        let h = &mut self.held[b.0];
        h.guard.data[offset..offset + bytes.len()].copy_from_slice(bytes);
        h.guard.dirty.insert(offset as u32, bytes.len() as u32);
        h.guard.cancelled = false;
        h.logged = true;
    }

    /// Declares that the block keeps an LSN stamp at `offset` (28 bytes: LSN, fs UUID, block CRC).
    pub fn set_lsn_offset(&mut self, b: BufRef, offset: u16) {
        let h = &mut self.held[b.0];
        assert!(usize::from(offset) + crate::log::recover::LSN_STAMP_BYTES <= h.guard.data.len());
        h.guard.lsn_offset = Some(offset);
    }

    /// Whether the block keeps an LSN stamp, and where.
    pub fn lsn_offset(&self, b: BufRef) -> Option<u16> {
        self.held[b.0].guard.lsn_offset
    }

    /// The block is freed: earlier logged images must never be replayed over whatever reuses it,
    /// and it loses its role. Whatever reuses it declares its own: a stamp offset left from a
    /// tree node would have write-back and replay stamp an LSN into an xattr value.
    pub fn cancel(&mut self, b: BufRef) {
        let h = &mut self.held[b.0];
        h.guard.cancelled = true;
        h.guard.lsn_offset = None;
        h.guard.dirty.clear();
        h.logged = true;
    }

    /// Buffers this transaction has logged so far (to check it stays within its reservation).
    pub fn logged_buffers(&self) -> usize {
        self.held.iter().filter(|h| h.logged).count()
    }

    /// Gives up after an error part way through a change that cannot be undone: the journal
    /// shuts down, so nothing of the half-done change (or anything after it) reaches the disk,
    /// and recovery will find the state of the last checkpoint.
    pub fn abort_and_shut_down(mut self, why: JournalError) -> JournalError {
        self.finished = true;
        self.held.clear();
        self.journal.release_reservation(self.unit);
        match self.journal.shut_down::<()>(why) {
            Err(e) => e,
            Ok(()) => JournalError::Shutdown,
        }
    }

    /// Commits into the CIL and returns the checkpoint sequence that will hold it. Does not wait
    /// for IO; `Journal::force(seq)` does.
    pub fn commit(mut self) -> Result<u64, JournalError> {
        self.finished = true;
        let images: Vec<(Arc<Buf>, Vec<u8>)> = self
            .held
            .iter()
            .filter(|h| h.logged)
            .map(|h| (Arc::clone(&h.buf), h.buf.format(&h.guard)))
            .collect();
        // Insert while the buffers are still locked, so the CIL never holds a state that a
        // later transaction's half-done change could leak into.
        let r = self.journal.commit_images(self.unit, images);
        self.held.clear();
        r
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let logged = self.held.iter().any(|h| h.logged);
            self.held.clear();
            self.journal.release_reservation(self.unit);
            assert!(
                !logged || std::thread::panicking(),
                "a transaction with logged changes was dropped uncommitted"
            );
        }
    }
}
