//! A filesystem transaction: a journal transaction plus the header it may change, the extents it
//! frees (busy until the checkpoint that frees them is stable), and tree access that logs every
//! node it writes.

use crate::buf::BufState;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::{Header, Roots, TREE_FREE_BY_BLOCK, TREE_FREE_BY_SIZE, TREE_FS};
use crate::fs::tree::btree::{self, NodeStore, Root};
use crate::fs::tree::node::{Key, KeyRange, Node, RawStep, Seek, NODE_LSN_OFFSET};
use crate::fs::txn::busy::Busy;
use crate::fs::txn::diff::write_diff;
use crate::fs::txn::late::{counters_late, write_header_late};
use crate::fs::txn::view::{ReadView, Trees};
use crate::journal::{Journal, JournalError, Transaction};
use crate::trans::{PublishLocks, Reservation};
use crate::util::sync::{rank, RankedMutex};
use std::sync::atomic::{AtomicU64, Ordering};

/// Blocks one filesystem transaction may log. Each operation is built to stay under it: work
/// that could touch more (truncating a fragmented file, removing many xattrs) runs as several
/// transactions, each leaving a consistent state.
pub const TX_MAX_BUFFERS: u64 = 96;

#[derive(Debug)]
pub struct FsTx<'a> {
    pub(crate) tx: Transaction<'a>,
    pub(crate) hdr: Header,
    hdr_before: Header,
    hdr_blk: u64,
    pub(crate) bs: usize,
    /// Extents freed by this transaction: not reusable until it is stable.
    pub(crate) freed: Vec<(u64, u64)>,
    /// Extents allocated by this transaction (`alloc_extent`): an optimistic one checks at
    /// commit that no one made them busy or reserved them since it chose them.
    pub(crate) allocated: Vec<(u64, u64)>,
    /// Blocks allocated as nodes by this transaction: logged whole on first write, since their
    /// on-disk contents are unrelated to what the node will hold.
    fresh: Vec<u64>,
    pub(crate) busy: &'a Busy,
    force_header: bool,
    reserved_buffers: u64,
    /// The log space it reserves (at begin, or at commit for an optimistic one).
    reservation: Reservation,
    /// Built under the shared filesystem lock (`shared_tx.rs`): a block not in the buffer
    /// cache makes it give up and read the block outside the lock, and its header is merged
    /// into the newest one at commit.
    optimistic: bool,
    /// What an optimistic transaction read, for `still_current`.
    opt: Reads,
    /// Built under the filesystem lock: a block not in the buffer cache is read outside it.
    under_lock: bool,
    /// Trees it read, a bit per tree id: only their roots matter to `still_current`.
    trees_read: u8,
    /// It wrote an interior node: the tree's shape may change, which readers under the shared
    /// lock must never see half done.
    interior_written: bool,
}

/// The reads of an optimistic transaction that its commit checks.
#[derive(Debug, Default)]
struct Reads {
    /// Descents to a leaf then decoded whole: (tree, key, leaf).
    descents: Vec<(u8, Key, u64)>,
    /// Point lookups: (tree, key, leaf, the value found or None).
    point_reads: Vec<(u8, Key, u64, Option<Vec<u8>>)>,
    /// Leaves decoded whole (not just looked a key up in).
    strong_leaves: Vec<u64>,
    /// Interior nodes read.
    interior: Vec<u64>,
    /// Interior nodes stepped through as this thread's copy (`buf/copies.rs`), not held:
    /// (block, the state the copy was taken in).
    interior_copies: Vec<(u64, BufState)>,
    /// A traversal went from one leaf to the next through interior nodes.
    sideways: bool,
}

impl<'a> FsTx<'a> {
    pub(crate) fn begin(
        journal: &'a Journal,
        hdr: &Header,
        hdr_blk: u64,
        busy: &'a Busy,
    ) -> FsResult<Self> {
        Self::begin_copying(journal, || hdr, hdr_blk, busy)
    }

    /// `begin`, the header copied from `hdr` once the transaction has its log space and the
    /// busy extents are pruned: a caller that locks the header in `hdr` holds it (rank 9 of
    /// docs/concurrency.md) only for the copy, not through the log-space wait or the busy
    /// extents' lock (rank 6).
    pub(crate) fn begin_copying<H: std::ops::Deref<Target = Header>>(
        journal: &'a Journal,
        hdr: impl FnOnce() -> H,
        hdr_blk: u64,
        busy: &'a Busy,
    ) -> FsResult<Self> {
        let t = Self::begin_with(journal, hdr, hdr_blk, busy, false)?;
        crate::fs::txn::retry::changing();
        Ok(t)
    }

    /// A transaction of an optimistic operation (`shared_tx.rs`): until it commits it has
    /// changed nothing anyone else sees, so it may always give up and run again.
    pub(crate) fn begin_optimistic(
        journal: &'a Journal,
        hdr: &Header,
        hdr_blk: u64,
        busy: &'a Busy,
    ) -> FsResult<Self> {
        Self::begin_with(journal, || hdr, hdr_blk, busy, true)
    }

    fn begin_with<H: std::ops::Deref<Target = Header>>(
        journal: &'a Journal,
        hdr: impl FnOnce() -> H,
        hdr_blk: u64,
        busy: &'a Busy,
        optimistic: bool,
    ) -> FsResult<Self> {
        let bs = journal.block_size();
        // Whole blocks for every buffer it may log, but never more than the log accepts: with
        // large blocks on a small log 96 whole blocks would not fit, and a transaction really
        // logs a few changed ranges of a few blocks.
        let max = journal.max_reservation_bytes();
        let mut n = TX_MAX_BUFFERS;
        while n > 1 && Reservation::for_buffers(n, bs).unit_bytes > max {
            n -= 1;
        }
        let res = Reservation::for_buffers(n, bs);
        let tx = if optimistic {
            // Reserved at commit (`reserve_to_commit`).
            journal.begin_unreserved()?
        } else {
            // Never wait for log space under the filesystem lock when the operation can still
            // give up and wait outside it (fs/retry.rs).
            match journal.try_begin(res)? {
                Some(tx) => tx,
                None if crate::fs::txn::retry::may_retry() => {
                    return Err(FsError::Retry(crate::fs::txn::retry::Retry::LogSpace(
                        res.unit_bytes,
                    )))
                }
                None => journal.begin(res)?,
            }
        };
        let completed_seq = journal.completed_seq();
        busy.prune(completed_seq);
        let hdr = hdr();
        Ok(FsTx {
            tx,
            hdr: hdr.clone(),
            hdr_before: hdr.clone(),
            hdr_blk,
            bs: bs as usize,
            freed: Vec::new(),
            allocated: Vec::new(),
            fresh: Vec::new(),
            busy,

            force_header: false,
            reserved_buffers: n,
            reservation: res,
            optimistic,
            opt: Reads::default(),
            under_lock: !optimistic,
            trees_read: 0,
            interior_written: false,
        })
    }

    /// An optimistic transaction takes its log space under the lock, just before it commits:
    /// if it is not there, the operation gives up to wait for it outside the lock
    /// (`Retry::LogSpace`) when it can, and waits here when it cannot.
    pub(crate) fn reserve_to_commit(&mut self) -> FsResult<()> {
        let wait = !crate::fs::txn::retry::may_retry();
        let r = self.needed_reservation();
        if self.tx.reserve(r, wait)? {
            self.reservation = r;
            return Ok(());
        }
        Err(FsError::Retry(crate::fs::txn::retry::Retry::LogSpace(
            r.unit_bytes,
        )))
    }

    /// `reserve_to_commit` for a caller that holds no lock: waits for the space and keeps it.
    /// Giving up to wait and then trying again, as `retrying` does, made committers in a
    /// crowd queue for space, give it back and find the queue never empty when they tried
    /// again (eight threads stalled for seconds).
    pub(crate) fn reserve_waiting(&mut self) -> FsResult<()> {
        let r = self.needed_reservation();
        self.tx.reserve(r, true)?;
        self.reservation = r;
        Ok(())
    }

    /// The log space for what this transaction logged and `more` buffers besides: its
    /// buffers and the header it writes late, each in full.
    fn logged_reservation(&self, more: u64) -> Reservation {
        let n = self.tx.logged_buffers() as u64 + 1 + more;
        Reservation::for_buffers(n, self.bs as u32)
    }

    /// The log space what this transaction logged needs (`logged_reservation`), or what it
    /// reserved at begin, if that is more.
    fn needed_reservation(&self) -> Reservation {
        let need = self.logged_reservation(0);
        if need.unit_bytes > self.reservation.unit_bytes {
            need
        } else {
            self.reservation
        }
    }

    /// Whether this transaction, after logging `more` buffers besides its own, still fits
    /// the largest reservation the log grants (`Journal::max_reservation_bytes`). An
    /// operation whose size depends on its input (an xattr value's blocks) asks before it
    /// logs them, and refuses what could never fit a small log.
    pub(crate) fn could_log(&self, more: u64) -> bool {
        self.logged_reservation(more).unit_bytes <= self.tx.journal.max_reservation_bytes()
    }

    /// The buffers its reservation at begin covers: a loop that logs as it goes (freeing an
    /// inode's items) stops a batch there.
    pub(crate) fn reserved_buffers(&self) -> u64 {
        self.reserved_buffers
    }

    /// A transaction may log more than it reserved at begin: a large xattr value, or the
    /// remote values of an inode it frees, are whole blocks each. Before its commit goes into
    /// the CIL it reserves the rest, waiting if it must (what it changed cannot be given back),
    /// so the log's space accounting never runs behind what the log will hold, and a log
    /// write never lands on the tail.
    fn cover_logged(&mut self) -> FsResult<()> {
        let need = self.needed_reservation();
        let have = self.tx.unit;
        if need.unit_bytes <= have {
            return Ok(());
        }
        let max = self.tx.journal.max_reservation_bytes();
        if need.unit_bytes > max {
            return Err(FsError::Journal(JournalError::ReservationTooLarge {
                need: need.unit_bytes,
                max,
            }));
        }
        self.tx.reserve_more(need.unit_bytes - have, true)?;
        self.reservation = need;
        Ok(())
    }

    /// Whether the log space it holds covers what it logged (checked before it reaches the CIL).
    fn covered(&self) -> bool {
        self.logged_reservation(0).unit_bytes <= self.tx.unit
    }

    /// Whether what this optimistic transaction read was one state, as `cur` (the newest
    /// header) shows: no block it read changed since, and no root, free list or data range
    /// of the header it copied. Only an error met in one state is the operation's; one met in
    /// a view of two (the free list as it was beside a free-space leaf as it is now, which
    /// holds a block the list also holds) means it must run again.
    pub(crate) fn saw_one_state(&self, cur: &Header) -> bool {
        let b = &self.hdr_before;
        self.tx.stale().is_none()
            && self.copies_current()
            && !self.roots_moved(cur.roots())
            && b.freelist == cur.freelist
            && (b.data_start, b.data_end) == (cur.data_start, cur.data_end)
    }

    /// Whether the root of a tree differs in `cur` from the header this transaction began with.
    pub(crate) fn roots_moved(&self, cur: Roots) -> bool {
        [TREE_FS, TREE_FREE_BY_BLOCK, TREE_FREE_BY_SIZE]
            .into_iter()
            .any(|t| self.trees_read & (1 << t) != 0 && self.hdr_before.root(t) != cur.root(t))
    }

    /// Whether this transaction changes leaves only (`shared_tx.rs`): of the header only the
    /// counters commits merge as deltas (no root, no free list, no data range, no free block
    /// count), it allocates and frees nothing, and it writes no interior node. Such a commit
    /// can never fail to merge its header, so it publishes its buffers as soon as it has
    /// checked them, and takes no turn; and a reader sees each leaf whole, before or after
    /// it, with no change of shape to check.
    /// A free list the commit would refill or drain counts as a change.
    pub(crate) fn leaves_only(&self) -> bool {
        let (b, m) = (&self.hdr_before, &self.hdr);
        let cap = crate::fs::items::header::freelist_capacity(self.bs);
        self.allocated.is_empty()
            && self.freed.is_empty()
            && !self.interior_written
            && self.fresh.is_empty()
            && !self.force_header
            && m.fs_root == b.fs_root
            && m.bno_root == b.bno_root
            && m.size_root == b.size_root
            && m.freelist == b.freelist
            && m.data_start == b.data_start
            && m.data_end == b.data_end
            && m.free_blocks == b.free_blocks
            && {
                let (low, high) = freelist_band(cap);
                (low + 1..=high).contains(&m.freelist.len())
            }
    }

    /// The end of a publish under the shared state lock, its buffers locked (`locks`) and,
    /// when it changes leaves only (`leaves_only`), published already, with `images`, what
    /// its buffers log, formatted; else the caller's turn (`Fs::publishing`) held. Merges its
    /// header into the filesystem's (`hdr`), publishes the buffers if it had not, and inserts
    /// into the CIL. Its counters go to the log as changes (`LateWrite::counters`), which
    /// each checkpoint sums, so each checkpoint's header counts exactly the commits in it
    /// whatever order they came in; the rest of the header only commits holding the turn
    /// change, in the order of their turns. None: a root, the free list or the data range it
    /// changed was changed by a commit since it copied the header; nothing is published and
    /// the operation runs again. A root that moves bumps `roots_moved` (what readers check,
    /// `ReadView`) before the header shows it.
    pub(crate) fn insert_shared(
        mut self,
        mut locks: PublishLocks,
        images: Option<Vec<Vec<u8>>>,
        hdr: &RankedMutex<Header, { rank::HDR }>,
        roots_moved: &AtomicU64,
    ) -> FsResult<Option<(u64, PublishLocks)>> {
        assert!(!self.force_header);
        let leaves_only = self.leaves_only();
        debug_assert!(images.is_none() || leaves_only);
        if leaves_only {
            // Only counters moved: the filesystem's move by as much, in place (a merge
            // clones the header, free list and all), and the log's by the same changes, summed
            // by the push (`LateWrite::counters`), in whatever order commits reach the CIL.
            let changes = self.hdr.counter_changes(&self.hdr_before);
            if !changes.iter().all(|(_, c)| c.is_nothing()) {
                hdr.lock().apply_counter_changes(&changes);
                self.tx
                    .write_late(self.hdr_blk, counters_late(changes.to_vec()))?;
            }
        } else {
            let mut cur = hdr.lock();
            if !self.merge_header(&cur) {
                return Ok(None);
            }
            if self.hdr != self.hdr_before {
                if self.hdr.roots() != cur.roots() {
                    roots_moved.fetch_add(1, Ordering::AcqRel);
                }
                write_header_late(&mut self.tx, self.hdr_blk, false, &self.hdr, &cur)?;
                *cur = self.hdr.clone();
            }
        }
        #[cfg(test)]
        crate::fs::txn::shared_tx::run_commit_hook(&AFTER_HEADER_MERGE, leaves_only);
        if !leaves_only {
            self.tx.publish_locked(&mut locks);
        }
        debug_assert!(
            self.covered(),
            "an optimistic commit reserved less than it logs"
        );
        let (seq, locks) = self.tx.insert_locked(locks, true, images)?;
        if !self.freed.is_empty() {
            let mut b = self.busy.lock();
            for &(s, l) in &self.freed {
                b.insert(s, l, seq);
            }
        }
        Ok(Some((seq, locks)))
    }

    /// Brings an optimistic transaction's header up to `cur`, the newest: counters it changed
    /// move by the same amounts from there; a root, the free list or the data range it changed
    /// must be as it found them (false: another commit changed them too, run again).
    pub(crate) fn merge_header(&mut self, cur: &Header) -> bool {
        let (b, m) = (&self.hdr_before, &mut self.hdr);
        macro_rules! structural {
            ($($f:ident),*) => {$(
                if m.$f != b.$f {
                    if cur.$f != b.$f {
                        return false;
                    }
                } else {
                    m.$f = cur.$f.clone();
                }
            )*};
        }
        structural!(fs_root, bno_root, size_root, freelist, data_start, data_end);
        // Counters move by as much from the newest (the next inode number only ever raised:
        // numbers come from `Fs::alloc_ino`, and a transaction raises the mark past those it
        // used).
        let changes = m.counter_changes(b);
        (m.next_ino, m.free_blocks, m.inode_count) =
            (cur.next_ino, cur.free_blocks, cur.inode_count);
        m.apply_counter_changes(&changes);
        self.hdr_before = cur.clone();
        true
    }

    /// Whether what this optimistic transaction read is still current (exclusive lock held).
    /// Blocks it changes, and leaves it decoded whole, must be as it first saw them. Interior
    /// nodes it only passed on the way down may have changed (splits of other leaves change
    /// their parents all the time; a leaf's own range changes only with the leaf) if every such
    /// descent still reaches the same leaf; a leaf it only looked a key up in may have changed
    /// if the key's value (or absence) is still what it saw. docs/ARCHITECTURE.md has the
    /// argument.
    ///
    /// `cur` is the newest header; `roots_moved`: the root of a tree it read changed since the
    /// transaction took its header (a root split or a tree's collapse). Its descents began at
    /// the old root, which may no longer cover every key even though no block it read changed
    /// after it read it: they are checked again from the new root.
    pub(crate) fn still_current(
        &self,
        cur: Roots,
        roots_moved: bool,
        locked: Option<&PublishLocks>,
    ) -> bool {
        let stale = self.tx.stale_blocks();
        // A node stepped through as a copy counts as an interior node read and changed since.
        let copies_moved = !self.copies_current();
        if stale.is_empty() && !roots_moved && !copies_moved {
            return true;
        }
        let o = &self.opt;
        let mut interior_moved = roots_moved || copies_moved;
        for &(b, changed_here) in &stale {
            if changed_here || o.strong_leaves.contains(&b) {
                return false;
            }
            if o.interior.contains(&b) {
                interior_moved = true;
            } else if !o.point_reads.iter().any(|r| r.2 == b) {
                return false;
            }
        }
        if interior_moved && o.sideways {
            return false;
        }
        // Look again in the published trees, from the newest roots: not through this
        // transaction, whose own changes would make its earlier reads look wrong.
        let mut v = ReadView {
            journal: self.tx.journal,
            roots: cur,
            locked,
            reshape: None,
        };
        let descents_hold = !interior_moved
            || o.descents.iter().all(|&(tree, key, leaf)| {
                btree::leaf_blkno(&mut v, cur.root(tree), tree, key).is_ok_and(|b| b == leaf)
            });
        descents_hold
            && o.point_reads
                .iter()
                .filter(|r| interior_moved || stale.iter().any(|&(b, _)| b == r.2))
                .all(|(tree, key, _, value)| {
                    btree::get(&mut v, cur.root(*tree), *tree, *key).is_ok_and(|g| g == *value)
                })
    }

    /// Whether every interior node this transaction stepped through as a copy is still in the
    /// copy's state: the same buffer at the same version (one no longer in memory counts as
    /// changed).
    pub(crate) fn copies_current(&self) -> bool {
        let j = self.tx.journal;
        self.opt
            .interior_copies
            .iter()
            .all(|&(b, seen)| j.buf_state(b).is_some_and(|(now, _)| now == seen))
    }

    /// Whether a block this optimistic transaction only read is locked by another commit now
    /// (`Transaction::read_set_locked`, whose fence comes first), the nodes it stepped through
    /// as copies included. One it holds itself is left to the transaction's own check: it
    /// locks what it changes.
    pub(crate) fn read_set_locked(&self) -> bool {
        let j = self.tx.journal;
        self.tx.read_set_locked()
            || self.opt.interior_copies.iter().any(|&(b, _)| {
                !self.tx.holds(b) && j.buf_state(b).is_some_and(|(_, locked)| locked)
            })
    }

    /// An optimistic transaction built under the exclusive lock after all (`shared_tx.rs`).
    pub(crate) fn hold_lock(&mut self) {
        self.under_lock = true;
    }

    /// `f` on block `blkno` as this transaction sees it, read in the same hold of the buffer's
    /// lock that notes its version when the block is new to the transaction. One built under
    /// the filesystem lock gives up for a block that is not in the buffer cache rather than
    /// read it there.
    fn node_read<R>(&mut self, blkno: u64, f: impl FnOnce(&[u8]) -> R) -> FsResult<R> {
        self.read_outside_if_uncached(blkno)?;
        Ok(self.tx.buf_read_verified(blkno, NODE_LSN_OFFSET, f)?.1)
    }

    /// Built under the filesystem lock: gives up (`Retry::Read`) for a block this transaction
    /// does not hold and the buffer cache does not have, to read it with no lock held.
    fn read_outside_if_uncached(&self, blkno: u64) -> FsResult<()> {
        if self.under_lock
            && !self.tx.holds(blkno)
            && self.tx.journal.cached_buf(blkno).is_none()
            && crate::fs::txn::retry::may_read_later()
        {
            return Err(FsError::Retry(crate::fs::txn::retry::Retry::Read(blkno)));
        }
        Ok(())
    }

    /// Notes that what this transaction does rests on all of leaf `blkno` of `tree`, as if it
    /// had decoded it: an optimistic commit then checks that no one changed the leaf.
    fn read_whole_leaf(&mut self, tree: u8, blkno: u64) {
        self.trees_read |= 1 << tree;
        if self.optimistic && !self.opt.strong_leaves.contains(&blkno) {
            self.opt.strong_leaves.push(blkno);
        }
    }

    /// Runs `edit` (`node::leaf_put_raw` or `leaf_remove_raw`) on this transaction's copy of
    /// leaf `blkno` and logs what it changed, as `write_node` logs a decoded node: the leaf's
    /// encoded block changed in place, never decoded.
    fn edit_leaf_in_place(
        &mut self,
        blkno: u64,
        tree: u8,
        edit: impl FnOnce(&mut [u8]) -> FsResult<Option<crate::fs::tree::node::RawPut>>,
    ) -> FsResult<Option<Option<Vec<u8>>>> {
        // A node this transaction allocated is written whole, the decoding way.
        if self.fresh.contains(&blkno) {
            return Ok(None);
        }
        self.trees_read |= 1 << tree;
        let mut block = self.node_read(blkno, <[u8]>::to_vec)?;
        let Some(crate::fs::tree::node::RawPut { old, used }) = edit(&mut block)? else {
            return Ok(None);
        };
        // The change rests on the whole leaf, as if it had been decoded (`read_node`).
        self.read_whole_leaf(tree, blkno);
        let b = self.tx.buf(blkno)?;
        write_diff(&mut self.tx, b, block, used, false);
        self.tx.set_lsn_offset(b, NODE_LSN_OFFSET);
        Ok(Some(old))
    }

    /// Writes the header if it changed, commits, and marks freed extents busy until the
    /// checkpoint is stable. Returns the checkpoint sequence and the new header.
    pub(crate) fn commit(mut self) -> FsResult<(u64, Header)> {
        self.fix_freelist()?;
        if self.force_header || self.hdr != self.hdr_before {
            // Written when the checkpoint is pushed (`LateWrite`): nearly every commit changes
            // a counter, and locking, copying and formatting the block in each took a third of
            // what a create spent under the filesystem's exclusive lock. Commits that change
            // the header reach the CIL in the order of their headers: all of them commit under
            // that lock. mkfs writes the whole block, the rest the bytes an encoding sets.
            write_header_late(
                &mut self.tx,
                self.hdr_blk,
                self.force_header,
                &self.hdr,
                &self.hdr_before,
            )?;
        }
        if let Err(e) = self.cover_logged() {
            return Err(self.abort(e));
        }
        // Over its reservation the log-space accounting would run behind what the CIL holds.
        assert!(
            self.covered(),
            "a transaction logged {} buffers, more than the {} bytes it reserved",
            self.tx.logged_buffers(),
            self.tx.unit
        );
        let hdr = self.hdr;
        let freed = self.freed;
        let busy = self.busy;
        let journal = self.tx.journal;
        let seq = match self.tx.commit() {
            Ok(seq) => seq,
            // The in-memory state has moved past what could not be published: stop here.
            Err(e @ JournalError::Conflict { .. }) => {
                tracing::error!("shutting down the journal after: {e}");
                return Err(FsError::Journal(
                    journal
                        .shut_down::<()>(e)
                        .err()
                        .unwrap_or(JournalError::Shutdown),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        if !freed.is_empty() {
            let mut b = busy.lock();
            for (s, l) in freed {
                b.insert(s, l, seq);
            }
        }
        Ok((seq, hdr))
    }

    /// After an error: the transaction is dropped if it logged nothing yet, else `abort`.
    pub(crate) fn fail(self, e: FsError) -> FsError {
        if self.tx.logged_buffers() == 0 {
            drop(self);
            e
        } else {
            self.abort(e)
        }
    }

    /// After an error part way through: shut the journal down so nothing half-done is written.
    pub(crate) fn abort(self, e: FsError) -> FsError {
        let why = match e {
            FsError::Journal(j) => j,
            other => {
                tracing::error!("shutting down the journal after: {other}");
                // The change that met it is lost with the shutdown, and its caller sees only
                // EIO: the superblock must say a check is owed.
                if matches!(other, FsError::Corrupt { .. }) {
                    if let Err(e) = self.tx.journal.mark_needs_check() {
                        tracing::error!(
                            "cannot record in the superblock that a check is needed: {e}"
                        );
                    }
                }
                JournalError::Shutdown
            }
        };
        FsError::Journal(self.tx.abort_and_shut_down(why))
    }

    pub fn insert(&mut self, tree: u8, key: Key, val: &[u8]) -> FsResult<Option<Vec<u8>>> {
        let mut root = self.hdr.root(tree);
        let r = btree::insert(self, &mut root, tree, key, val);
        self.hdr.set_root(tree, root);
        r
    }

    pub fn remove(&mut self, tree: u8, key: Key) -> FsResult<Option<Vec<u8>>> {
        let mut root = self.hdr.root(tree);
        let r = btree::remove(self, &mut root, tree, key);
        self.hdr.set_root(tree, root);
        r
    }

    pub(crate) fn tx_block_size(&self) -> usize {
        self.bs
    }

    /// mkfs: the header block holds nothing yet; log all of it.
    pub(crate) fn force_header_write(&mut self) {
        self.force_header = true;
    }

    /// Makes a new empty tree root (used by mkfs).
    pub(crate) fn new_root(&mut self, tree: u8, blkno: u64) -> FsResult<Root> {
        self.fresh.push(blkno);
        self.write_node(blkno, &Node::leaf(tree))?;
        Ok(Root { blkno, level: 0 })
    }
}

impl NodeStore for FsTx<'_> {
    fn block_size(&self) -> usize {
        self.bs
    }

    fn read_node(&mut self, blkno: u64, tree: u8) -> FsResult<Node> {
        // Counted before any error met there: a root freed and reused since the transaction
        // copied the header fails to decode, and only a moved root tells that apart.
        self.trees_read |= 1 << tree;
        let n = self.node_read(blkno, |d| Node::decode(d, blkno, tree))??;
        if self.optimistic {
            let set = match n.level {
                0 => &mut self.opt.strong_leaves,
                _ => &mut self.opt.interior,
            };
            if !set.contains(&blkno) {
                set.push(blkno);
            }
        }
        Ok(n)
    }

    fn leaf_put_in_place(
        &mut self,
        blkno: u64,
        tree: u8,
        key: Key,
        val: &[u8],
        range: KeyRange,
    ) -> FsResult<Option<Option<Vec<u8>>>> {
        self.edit_leaf_in_place(blkno, tree, |block| {
            crate::fs::tree::node::leaf_put_raw(block, blkno, tree, key, val, range)
        })
    }

    fn leaf_remove_in_place(
        &mut self,
        blkno: u64,
        tree: u8,
        key: Key,
        range: KeyRange,
    ) -> FsResult<Option<Vec<u8>>> {
        let removed = self.edit_leaf_in_place(blkno, tree, |block| {
            crate::fs::tree::node::leaf_remove_raw(block, blkno, tree, key, range)
        })?;
        Ok(removed.flatten())
    }

    fn raw_seek(
        &mut self,
        blkno: u64,
        tree: u8,
        key: Key,
        seek: Seek,
    ) -> FsResult<Option<(Key, Vec<u8>)>> {
        self.trees_read |= 1 << tree;
        let found = self.node_read(blkno, |d| {
            crate::fs::tree::node::raw_seek(d, blkno, tree, key, seek)
        })??;
        // The answer rests on the whole leaf, as if it had been decoded.
        self.read_whole_leaf(tree, blkno);
        Ok(found)
    }

    fn descended(&mut self, tree: u8, key: Key, leaf: u64) {
        if self.optimistic {
            self.opt.descents.push((tree, key, leaf));
        }
    }

    fn sideways(&mut self) {
        self.opt.sideways = true;
    }

    fn raw_step(&mut self, blkno: u64, tree: u8, level: u8, key: Key) -> FsResult<RawStep> {
        let step_in = |d: &[u8]| crate::fs::tree::node::raw_step(d, blkno, tree, level, key);
        // An optimistic descent steps through an interior node it has not changed as its
        // thread's copy, taking no lock, and its commit checks the copy's state.
        // What it read counts before any error it met there: an error met in a state that
        // changed since (a root freed and reused) is not the operation's (`saw_one_state`).
        self.trees_read |= 1 << tree;
        if self.optimistic && level > 0 && !self.tx.holds(blkno) {
            self.read_outside_if_uncached(blkno)?;
            let (seen, step) = self.tx.journal.read_copy(blkno, NODE_LSN_OFFSET, step_in)?;
            if !self.opt.interior_copies.contains(&(blkno, seen)) {
                self.opt.interior_copies.push((blkno, seen));
            }
            return step;
        }
        let step = self.node_read(blkno, step_in)??;
        if self.optimistic {
            match &step {
                RawStep::Child(..) if !self.opt.interior.contains(&blkno) => {
                    self.opt.interior.push(blkno)
                }
                RawStep::Child(..) => {}
                RawStep::Found(v) => self
                    .opt
                    .point_reads
                    .push((tree, key, blkno, Some(v.clone()))),
                RawStep::Absent => self.opt.point_reads.push((tree, key, blkno, None)),
            }
        }
        Ok(step)
    }

    fn write_node(&mut self, blkno: u64, node: &Node) -> FsResult<()> {
        // A node this transaction allocated is written whole: what its block held before is
        // not read.
        let whole = if let Some(i) = self.fresh.iter().position(|&f| f == blkno) {
            self.fresh.swap_remove(i);
            true
        } else {
            false
        };
        let b = if whole {
            self.tx.buf_fresh(blkno)?
        } else {
            self.tx.buf(blkno)?
        };
        self.interior_written |= node.level > 0;
        let mut block = self.tx.read(b, <[u8]>::to_vec);
        node.encode_into(blkno, &mut block);
        let used = node.used_ranges(block.len());
        write_diff(&mut self.tx, b, block, used, whole);
        self.tx.set_lsn_offset(b, NODE_LSN_OFFSET);
        Ok(())
    }

    /// A block for a new node. The free-space trees' own come from the free list; so do the
    /// fs tree's while the list holds more than the quarter kept for the free-space trees'
    /// changes (`fix_freelist`), so that a split takes a block without changing the
    /// free-space trees. Allocated from them, every split locked and changed their two roots,
    /// which every other split's allocation then waited to read (half of what 8 creating
    /// threads waited for buffers).
    fn alloc_node(&mut self, tree: u8) -> FsResult<u64> {
        let (low, _) = freelist_band(crate::fs::items::header::freelist_capacity(self.bs));
        let spare = self.hdr.freelist.len() > low;
        let blkno = if tree == TREE_FS && !spare {
            match self.alloc_extent(1, 1)? {
                Some((s, _)) => s,
                None => return Err(FsError::NoSpace),
            }
        } else {
            self.freelist_pop()?
        };
        self.fresh.push(blkno);
        Ok(blkno)
    }

    /// A node's block given back: to the free list, whichever tree it was in (it is metadata
    /// again when it is next taken, so it needs no wait for the checkpoint that freed it); a
    /// full list, or `fix_freelist` draining it, returns blocks to the free-space trees,
    /// busy until that checkpoint is stable.
    fn free_node(&mut self, _tree: u8, blkno: u64) -> FsResult<()> {
        let b = self.tx.buf(blkno)?;
        self.tx.cancel(b);
        self.freelist_push(blkno)
    }
}

impl Trees for FsTx<'_> {
    fn root_of(&self, tree: u8) -> Root {
        self.hdr.root(tree)
    }

    fn data_area(&self) -> (u64, u64) {
        (self.hdr.data_start, self.hdr.data_end)
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: run by `insert_shared` of this thread after its header reached the filesystem's
    /// and before its CIL insert.
    pub(crate) static AFTER_HEADER_MERGE: crate::fs::txn::shared_tx::CommitHook =
        const { std::cell::RefCell::new(None) };
}

/// The free list's band, for a list of `cap` blocks: `fix_freelist` tops it up to half when it
/// holds `low` or fewer, and drains it to half above `high`. The `low` blocks are kept for the
/// free-space trees' own changes within one transaction; tree nodes of the fs tree come from
/// the list only above them (`FsTx::alloc_node`), and a list they took down to `low` is topped
/// up at commit.
pub(crate) fn freelist_band(cap: usize) -> (usize, usize) {
    (cap / 4, cap / 4 * 3)
}
