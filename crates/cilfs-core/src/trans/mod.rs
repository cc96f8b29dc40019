//! Transactions: reserve log space up front, lock and modify buffers, commit into the CIL
//! without waiting for IO. A transaction reaches the journal it runs in through
//! `TransJournal`, so that it sits below the journal; `crate::journal::Transaction` is one in
//! the journal.

pub mod grant;
pub mod publish;

use crate::buf::{Buf, BufData, BufGuard, BufReadGuard, LateWrite, RangeSet};
use crate::log::record::OP_HEADER_BYTES;
use crate::util::lockstat::LockWaits;
use std::sync::Arc;

/// What a transaction asks of the journal it runs in (`crate::journal::Journal`, which begins
/// every transaction): its buffers and their read checks, log space, shutdown, and the commit
/// of the published buffers into the CIL. A trait so that transactions sit below the journal.
pub trait TransJournal {
    /// The journal's error.
    type Error;
    /// The buffer of metadata block `blkno`, read from the device if it is not cached.
    fn buf(&self, blkno: u64) -> Result<Arc<Buf>, Self::Error>;
    /// The buffer of `blkno` for a block about to be written whole: never read.
    fn buf_fresh(&self, blkno: u64) -> Result<Arc<Buf>, Self::Error>;
    /// The read check of a block stamped at `stamp_at`, once after a device read.
    fn verify_read(&self, buf: &Buf, g: &BufData, stamp_at: u16) -> Result<(), Self::Error>;
    fn block_size(&self) -> u32;
    /// Where waits for buffer locks are counted.
    fn buf_waits(&self) -> &LockWaits;
    /// Reserves `unit` bytes of log space, waiting for them.
    fn reserve(&self, unit: u64) -> Result<(), Self::Error>;
    /// Reserves `unit` bytes of log space if they are there now.
    fn try_reserve(&self, unit: u64) -> Result<bool, Self::Error>;
    fn release_reservation(&self, unit: u64);
    /// Shuts the journal down for `why`; returns the error to report.
    fn shut_down(&self, why: Self::Error) -> Self::Error;
    /// The error of a commit that found block `blkno` changed since it copied it.
    fn conflict(blkno: u64) -> Self::Error;
    /// Formats locked, published buffers into the CIL (`Journal::commit_images`).
    fn commit_images(
        &self,
        unit: u64,
        bufs: &[(&Arc<Buf>, &BufData)],
        late: Option<(&Arc<Buf>, &LateWrite)>,
        throttled: bool,
        images: Option<&mut [Vec<u8>]>,
    ) -> Result<u64, Self::Error>;
}

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

/// A block as one transaction sees it: read in place (under the buffer's lock, for a moment)
/// until the transaction first changes it, then its own copy, published at commit.
struct Held {
    buf: Arc<Buf>,
    /// The transaction's copy, once it changes the block.
    data: Option<Vec<u8>>,
    /// The buffer's version when first touched: commit publishes only over that version.
    version: u64,
    /// Ranges this transaction changed.
    dirty: RangeSet,
    lsn_offset: Option<u16>,
    cancelled: bool,
    /// `BufData::unlogged` of the transaction's image.
    unlogged: Option<(u32, u32)>,
    /// Cancelled at some point: the ranges logged before for the block are dropped.
    was_cancelled: bool,
    logged: bool,
    /// The LSN stamp offset was declared (published even with no bytes changed).
    stamp_declared: bool,
}

impl Held {
    /// Whether a commit publishes this block (what `lock_changed` locks).
    fn publishes(&self) -> bool {
        self.logged || self.stamp_declared
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("blkno", &self.buf.blkno())
            .field("version", &self.version)
            .field("logged", &self.logged)
            .finish()
    }
}

/// A transaction. It works on its own copies of the blocks it touches (no buffer lock is
/// held between its steps) and publishes them at commit: the changed buffers are locked in
/// block order, found unchanged since they were copied, updated with the changed ranges and
/// inserted into the CIL before they are unlocked. Dropping one uncommitted leaves the buffers
/// as they were.
#[derive(Debug)]
pub struct Transaction<'j, J: TransJournal> {
    pub(crate) journal: &'j J,
    pub(crate) unit: u64,
    held: Vec<Held>,
    /// A block written late (`LateWrite`), never held.
    late: Option<(Arc<Buf>, LateWrite)>,
    finished: bool,
}

impl<'j, J: TransJournal> Transaction<'j, J> {
    pub(crate) fn new(journal: &'j J, unit: u64) -> Self {
        Self {
            journal,
            unit,
            held: Vec::new(),
            late: None,
            finished: false,
        }
    }

    /// Block `blkno` as this transaction sees it (copied on first touch).
    pub fn buf(&mut self, blkno: u64) -> Result<BufRef, J::Error> {
        self.buf_read(blkno, |_| ()).map(|(b, ())| b)
    }

    /// `buf` and `read` in one: a block touched for the first time is read under the same
    /// hold of its lock that notes its version (a descent touches some twenty blocks per
    /// create, and each lock passes its cache line between the cores).
    pub fn buf_read<R>(
        &mut self,
        blkno: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<(BufRef, R), J::Error> {
        if let Some(b) = self.held_ref(blkno) {
            let r = self.read(b, f);
            return Ok((b, r));
        }
        let buf = self.journal.buf(blkno)?;
        self.hold(buf, None, f)
    }

    /// `buf_read` of a block that keeps its LSN stamp at `stamp_at` (a tree node): the
    /// block passes its read check (`Journal::verify_read`) before `f` sees it, unless it is
    /// this transaction's own copy (changed in memory, its stamp stale until write back).
    pub fn buf_read_verified<R>(
        &mut self,
        blkno: u64,
        stamp_at: u16,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<(BufRef, R), J::Error> {
        let journal = self.journal;
        if let Some(b) = self.held_ref(blkno) {
            let h = &self.held[b.0];
            if let Some(d) = &h.data {
                return Ok((b, f(d)));
            }
            let g = read_counted(journal, &h.buf);
            journal.verify_read(&h.buf, &g, stamp_at)?;
            return Ok((b, f(&g.data)));
        }
        let buf = journal.buf(blkno)?;
        self.hold(buf, Some(stamp_at), f)
    }

    /// `buf` for a block this transaction allocated and will write whole: what the device
    /// holds there is not read (XFS's `xfs_trans_get_buf`), a buffer not in memory starts
    /// zeroed.
    pub fn buf_fresh(&mut self, blkno: u64) -> Result<BufRef, J::Error> {
        if let Some(b) = self.held_ref(blkno) {
            return Ok(b);
        }
        let buf = self.journal.buf_fresh(blkno)?;
        Ok(self.hold(buf, None, |_| ())?.0)
    }

    /// Holds `buf`, noting its version and running `f` on it in one hold of its lock; first,
    /// for a block stamped at `stamp_at`, its read check (`Journal::verify_read`).
    fn hold<R>(
        &mut self,
        buf: Arc<Buf>,
        stamp_at: Option<u16>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<(BufRef, R), J::Error> {
        let (held, r) = {
            let (version, lsn_offset, cancelled, unlogged, r) = {
                let g = read_counted(self.journal, &buf);
                if let Some(at) = stamp_at {
                    self.journal.verify_read(&buf, &g, at)?;
                }
                (g.version, g.lsn_offset, g.cancelled, g.unlogged, f(&g.data))
            };
            let held = Held {
                data: None,
                version,
                dirty: RangeSet::default(),
                lsn_offset,
                cancelled,
                unlogged,
                was_cancelled: false,
                logged: false,
                stamp_declared: false,
                buf,
            };
            (held, r)
        };
        self.held.push(held);
        Ok((BufRef(self.held.len() - 1), r))
    }

    /// Runs `f` on the block as this transaction sees it.
    pub fn read<R>(&self, b: BufRef, f: impl FnOnce(&[u8]) -> R) -> R {
        let h = &self.held[b.0];
        match &h.data {
            Some(d) => f(d),
            None => {
                let g = read_counted(self.journal, &h.buf);
                f(&g.data)
            }
        }
    }

    /// The block as this transaction sees it, as its own copy from now on.
    pub fn data(&mut self, b: BufRef) -> &[u8] {
        self.own(b)
    }

    /// The transaction's own copy of the block, made on first use.
    fn own(&mut self, b: BufRef) -> &mut Vec<u8> {
        let journal = self.journal;
        let h = &mut self.held[b.0];
        if h.data.is_none() {
            let g = read_counted(journal, &h.buf);
            // If a commit changed the block since the first touch, `version` still says the
            // older one: this transaction's commit is then refused.
            h.data = Some(g.data.to_vec());
        }
        match h.data.as_mut() {
            Some(d) => d,
            None => unreachable!("copied above"),
        }
    }

    /// Makes `block` the transaction's copy of the block, logging `ranges` (each `[lo, hi)`):
    /// the caller built it from the block as this transaction sees it, and nothing outside
    /// them differs, except in `unlogged` (`BufData::unlogged`), whose bytes mean nothing.
    /// Saves copying the block twice when a whole new image is at hand (tree nodes, header).
    pub fn replace(
        &mut self,
        b: BufRef,
        block: Vec<u8>,
        ranges: &[(usize, usize)],
        unlogged: Option<(usize, usize)>,
    ) {
        let h = &mut self.held[b.0];
        assert_eq!(block.len(), self.journal.block_size() as usize);
        debug_assert!(unlogged.is_none_or(|(a, z)| a <= z && z <= block.len()));
        h.unlogged = unlogged.map(|(a, z)| (a as u32, z as u32));
        h.data = Some(block);
        for &(lo, hi) in ranges {
            h.dirty.insert(lo as u32, (hi - lo) as u32);
        }
        h.cancelled = false;
        h.logged = true;
    }

    /// Writes `bytes` at `offset` of the block and logs the range.
    pub fn write(&mut self, b: BufRef, offset: usize, bytes: &[u8]) {
        self.own(b)[offset..offset + bytes.len()].copy_from_slice(bytes);
        let h = &mut self.held[b.0];
        h.unlogged = None;
        h.dirty.insert(offset as u32, bytes.len() as u32);
        h.cancelled = false;
        h.logged = true;
    }

    /// Writes `w` into block `blkno` when the checkpoint that holds this commit is pushed,
    /// instead of at commit (`LateWrite`); a later call replaces it. The block must never be
    /// held by a transaction: the header is written only this way.
    pub fn write_late(&mut self, blkno: u64, w: LateWrite) -> Result<(), J::Error> {
        assert!(!self.holds(blkno), "block {blkno} is held and written late");
        let buf = self.journal.buf(blkno)?;
        self.late = Some((buf, w));
        Ok(())
    }

    /// Declares that the block keeps an LSN stamp at `offset` (28 bytes: LSN, fs UUID, block CRC).
    pub fn set_lsn_offset(&mut self, b: BufRef, offset: u16) {
        let h = &mut self.held[b.0];
        assert!(
            usize::from(offset) + crate::log::stamp::LSN_STAMP_BYTES
                <= self.journal.block_size() as usize
        );
        h.lsn_offset = Some(offset);
        h.stamp_declared = true;
    }

    /// Whether the block keeps an LSN stamp, and where.
    pub fn lsn_offset(&self, b: BufRef) -> Option<u16> {
        self.held[b.0].lsn_offset
    }

    /// The block is freed: earlier logged images must never be replayed over whatever reuses it,
    /// and it loses its role. Whatever reuses it declares its own: a stamp offset left from a
    /// tree node would have write-back and replay stamp an LSN into an xattr value.
    pub fn cancel(&mut self, b: BufRef) {
        let h = &mut self.held[b.0];
        h.cancelled = true;
        h.was_cancelled = true;
        h.lsn_offset = None;
        h.stamp_declared = true;
        h.dirty.clear();
        h.logged = true;
    }

    /// The first block this transaction touched that a commit has changed since (its view is
    /// no longer one state of the filesystem), or None. An optimistic operation checks this
    /// before it trusts what it read: what it decided, and any error it met, may come from
    /// blocks of two different states.
    pub fn stale(&self) -> Option<u64> {
        self.held
            .iter()
            .find_map(|h| (h.buf.version() != h.version).then(|| h.buf.blkno()))
    }

    /// Every block this transaction touched that a commit has changed since, with whether
    /// this transaction changes it too.
    pub fn stale_blocks(&self) -> Vec<(u64, bool)> {
        self.held
            .iter()
            .filter(|h| h.buf.version() != h.version)
            .map(|h| (h.buf.blkno(), h.publishes()))
            .collect()
    }

    /// Blocks this transaction changes (debug checks).
    pub fn changed_blocks(&self) -> Vec<u64> {
        self.held
            .iter()
            .filter(|h| h.logged && !h.cancelled)
            .map(|h| h.buf.blkno())
            .collect()
    }

    /// Whether this transaction already holds block `blkno`.
    pub fn holds(&self, blkno: u64) -> bool {
        self.held_ref(blkno).is_some()
    }

    /// The handle of block `blkno` if this transaction already holds it.
    fn held_ref(&self, blkno: u64) -> Option<BufRef> {
        self.held
            .iter()
            .position(|h| h.buf.blkno() == blkno)
            .map(BufRef)
    }

    /// Reserves `r` for a transaction begun without log space (`Journal::begin_unreserved`):
    /// now if it is there (false if not), or waiting for it when `wait`.
    pub fn reserve(&mut self, r: Reservation, wait: bool) -> Result<bool, J::Error> {
        assert_eq!(self.unit, 0, "a transaction reserves log space once");
        self.reserve_more(r.unit_bytes, wait)
    }

    /// Adds `extra` bytes to what this transaction reserved: now if they are there (false if
    /// not), or waiting for them when `wait`.
    pub fn reserve_more(&mut self, extra: u64, wait: bool) -> Result<bool, J::Error> {
        if wait {
            self.journal.reserve(extra)?;
        } else if !self.journal.try_reserve(extra)? {
            return Ok(false);
        }
        self.unit += extra;
        Ok(true)
    }

    /// Buffers this transaction has logged so far (to check it stays within its reservation).
    pub fn logged_buffers(&self) -> usize {
        self.held.iter().filter(|h| h.logged).count()
    }

    /// Gives up after an error part way through a change that cannot be undone: the journal
    /// shuts down, so nothing of the half-done change (or anything after it) reaches the disk,
    /// and recovery will find the state of the last checkpoint.
    pub fn abort_and_shut_down(mut self, why: J::Error) -> J::Error {
        self.finished = true;
        self.held.clear();
        self.journal.release_reservation(self.unit);
        self.journal.shut_down(why)
    }

    /// Publishes the changed blocks and commits them into the CIL; returns the checkpoint
    /// sequence that will hold them. Does not wait for IO; `Journal::force(seq)` does.
    pub fn commit(mut self) -> Result<u64, J::Error> {
        let mut locks = match self.lock_changed() {
            Ok(l) => l,
            // Another commit between this one's copy and its publish would be lost.
            Err(blkno) => {
                self.finished = true;
                self.held.clear();
                self.journal.release_reservation(self.unit);
                return Err(J::conflict(blkno));
            }
        };
        self.publish_locked(&mut locks);
        self.insert_locked(locks, false, None).map(|(seq, _)| seq)
    }

    /// The first step of a commit: locks the blocks this transaction changes, in block order
    /// (two commits locking overlapping sets never wait for each other in a cycle), each
    /// found at the version it first saw. Err: the first block another commit changed since;
    /// nothing stays locked and the transaction is as it was.
    pub fn lock_changed(&self) -> Result<PublishLocks, u64> {
        match self.lock_changed_if(true) {
            Ok(Some(locks)) => Ok(locks),
            Ok(None) => unreachable!("waited for every lock"),
            Err(b) => Err(b),
        }
    }

    /// `lock_changed` without waiting: None (and nothing locked) if another commit holds one
    /// of the blocks now. For a commit that holds a lock others take under their buffer
    /// locks (the publish turn), which must therefore never wait for a buffer's.
    pub fn try_lock_changed(&self) -> Result<Option<PublishLocks>, u64> {
        self.lock_changed_if(false)
    }

    fn lock_changed_if(&self, wait: bool) -> Result<Option<PublishLocks>, u64> {
        let waits = self.journal.buf_waits();
        let wanted = (self.held.iter().enumerate())
            .filter(|(_, h)| h.publishes())
            .map(|(index, h)| publish::Wanted {
                index,
                block: Locking { buf: &h.buf, waits },
                version: h.version,
            })
            .collect();
        Ok(
            publish::lock_in_block_order(wanted, wait)?.map(|guards| PublishLocks {
                guards,
                spent: Vec::new(),
                replaced: Vec::new(),
            }),
        )
    }

    /// Whether a block this transaction only read is locked by another commit now (which
    /// is publishing it): checked without waiting (`publish::read_set_locked`), its own
    /// locks (`lock_changed`'s) held.
    pub fn read_set_locked(&self) -> bool {
        let waits = self.journal.buf_waits();
        publish::read_set_locked(
            (self.held.iter())
                .filter(|h| !h.publishes())
                .map(|h| Locking { buf: &h.buf, waits }),
        )
    }

    /// The second step: copies the changes into the locked buffers, which take new versions.
    /// From here on the commit cannot be called off.
    pub fn publish_locked(&mut self, locks: &mut PublishLocks) {
        self.finished = true;
        for (i, _, g) in &mut locks.guards {
            publish(&self.held[*i], g);
        }
    }

    /// What each logged buffer, locked and published, logs now (`Buf::format_into`), in the
    /// order `insert_locked` inserts them: formatted before a commit's turn, so the turn only
    /// moves the images into the CIL.
    pub fn preformat(&self, locks: &PublishLocks) -> Vec<Vec<u8>> {
        locks
            .guards
            .iter()
            .filter(|(i, _, _)| self.held[*i].logged)
            .map(|(i, _, g)| {
                let mut out = crate::cil::image_pool::POOL.take();
                self.held[*i].buf.format_into(g, &mut out);
                out
            })
            .collect()
    }

    /// The last step: formats the published buffers into the CIL while they are still
    /// locked, so the CIL never holds a state that a later transaction's half-done change
    /// could leak into. Returns the checkpoint sequence and the locks, for the caller to let
    /// go when it has published what goes with the blocks.
    /// `throttled`: the caller waited below the CIL's hard limit before it locked anything
    /// (`Journal::commit_images`). `images`: what `preformat` made of the logged buffers,
    /// else they are formatted under the CIL's lock.
    pub fn insert_locked(
        mut self,
        mut locks: PublishLocks,
        throttled: bool,
        images: Option<Vec<Vec<u8>>>,
    ) -> Result<(u64, PublishLocks), J::Error> {
        assert!(self.finished, "inserted before it was published");
        let logged: Vec<(&Arc<Buf>, &BufData)> = locks
            .guards
            .iter()
            .filter(|(i, _, _)| self.held[*i].logged)
            .map(|(i, _, g)| (&self.held[*i].buf, &**g))
            .collect();
        let late = self.late.as_ref().map(|(b, w)| (b, w));
        let mut images = images;
        let r =
            self.journal
                .commit_images(self.unit, &logged, late, throttled, images.as_deref_mut());
        drop(logged);
        locks.spent = std::mem::take(&mut self.held);
        locks.replaced = images.unwrap_or_default();
        r.map(|seq| (seq, locks))
    }
}

/// The changed buffers of a transaction, locked from `lock_changed` until its publish is
/// over.
#[derive(Debug)]
pub struct PublishLocks {
    /// (index in `held`, block number, lock), in block order.
    guards: Vec<(usize, u64, BufGuard)>,
    /// The transaction's held blocks once it is in the CIL, dropped with the locks: their
    /// private copies and, above all, their references to every block the transaction read
    /// (the root and the nodes on its way down, which every thread holds too). Dropped in the
    /// insert, those reference counts passed between the cores inside the publish turn: half
    /// of a leaf commit's turn with two threads creating.
    spent: Vec<Held>,
    /// The images its preformatted ones replaced in the CIL, given back to this thread's stash
    /// (`cil/image_pool.rs`) as the locks are let go, after the turn: most were allocated by
    /// other threads, whose heaps a free reached across cores.
    replaced: Vec<Vec<u8>>,
}

impl Drop for PublishLocks {
    fn drop(&mut self) {
        crate::cil::image_pool::POOL.give(self.replaced.drain(..));
    }
}

impl PublishLocks {
    /// The images the commit's preformatted ones replaced in the CIL (tests).
    #[cfg(test)]
    pub(crate) fn replaced(&self) -> &[Vec<u8>] {
        &self.replaced
    }

    /// The block as it is published now, if it is one of these (locked by this commit).
    pub fn get(&self, blkno: u64) -> Option<&BufData> {
        self.guards
            .binary_search_by_key(&blkno, |(_, b, _)| *b)
            .ok()
            .map(|i| &*self.guards[i].2)
    }
}

/// `buf` held to read, its waits counted in the lock table (`buffer`).
fn read_counted<'b, J: TransJournal>(journal: &J, buf: &'b Buf) -> BufReadGuard<'b> {
    buf.read_counted(journal.buf_waits())
}

/// Copies one transaction's changes of a block into the buffer.
fn publish(h: &Held, g: &mut BufData) {
    if h.was_cancelled {
        g.dirty.clear();
    }
    if h.cancelled {
        g.cancelled = true;
        g.lsn_offset = None;
        g.unlogged = None;
    } else {
        // The changed ranges never carry the copy's stamp over the buffer's.
        let stamp_at = h.lsn_offset.filter(|_| g.lsn_offset == h.lsn_offset);
        g.keeping_stamp(stamp_at, |g| {
            if let Some(data) = &h.data {
                for &(off, len) in h.dirty.ranges() {
                    let (a, b) = (off as usize, (off + len) as usize);
                    g.data[a..b].copy_from_slice(&data[a..b]);
                    g.dirty.insert(off, len);
                }
            }
        });
        if h.logged {
            g.cancelled = false;
            g.unlogged = h.unlogged;
        }
        g.lsn_offset = h.lsn_offset;
    }
    h.buf.bump_version(g);
}

impl<J: TransJournal> Drop for Transaction<'_, J> {
    fn drop(&mut self) {
        if !self.finished {
            // Nothing of it was published: the buffers are as they were.
            self.held.clear();
            self.journal.release_reservation(self.unit);
        }
    }
}

/// A buffer as a commit locks it (`publish::PublishBlock`), its waits counted.
struct Locking<'a> {
    buf: &'a Buf,
    waits: &'a LockWaits,
}

impl publish::PublishBlock for Locking<'_> {
    type Guard = BufGuard;

    fn blkno(&self) -> u64 {
        self.buf.blkno()
    }

    fn lock(&self) -> BufGuard {
        self.buf.lock_counted(self.waits)
    }

    fn try_lock(&self) -> Option<BufGuard> {
        self.buf.try_lock()
    }

    fn version(g: &BufGuard) -> u64 {
        g.version
    }

    fn locked_exclusive(&self) -> bool {
        self.buf.locked_exclusive()
    }
}
