//! Optimistic operations (docs/concurrency.md, the publish protocol): built with no filesystem lock held, published under the
//! state lock taken shared, side by side with other publishes (docs/ARCHITECTURE.md,
//! "Optimistic operations").
//!
//! An operation runs its checks and builds its transaction without holding `Fs::state` (it
//! takes it shared for a moment to copy an inode or look at the free space), so operations on
//! different inodes build theirs side by side, and beside lookups and reads. It changes nothing
//! anyone else sees while it does: tree blocks are its transaction's private copies
//! (trans/mod.rs), the header is the transaction's copy, and the inodes it changes are copies
//! in a [`Scratch`]. Tree blocks it reads are whole published versions (a commit publishes
//! under the buffers' locks), but two of them may come from two states: that is what the
//! check at commit is for. It then locks the blocks it changes and publishes (`publish_shared`),
//! if nothing it read changed meanwhile:
//! - every block it changes still has the version it first saw, and every block it only read
//!   is not being published by another commit and still leads where it led;
//! - every inode it copied is in memory as it was copied (or still not in memory);
//! - the header's roots, free list and data range it changed are as it found them (its
//!   counters are applied as deltas, `FsTx::merge_header`).
//!
//! If something changed, the operation runs again from the start; after `CONFLICTS_MAX` runs
//! in a row it runs under the exclusive lock, where nothing can change under it. An error met
//! while building counts only if what the operation read was one state (`FsTx::saw_one_state`):
//! otherwise the error may come from a half-seen change, and it runs again.
//!
//! Everything else (operations not yet written this way) still runs under the exclusive lock,
//! and changes the tree through transactions that publish at commit like any other: an
//! optimistic build that read what such an operation changed finds it at its own commit.

use crate::fs::cache::inode_cache::InodeMap;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::Header;
use crate::fs::items::inode::Inode;
use crate::fs::txn::publish::{self, Publish};
use crate::fs::txn::FsTx;
use crate::fs::types::Reserve;
use crate::fs::{Fs, FsState, InodeMem, InodeTable};
use crate::trans::PublishLocks;
use crate::util::sync::{rank, Ranked};

/// Runs in a row that found their view changed before one runs under the exclusive lock.
const CONFLICTS_MAX: u32 = 8;

/// The inodes an optimistic operation reads and changes: copies, published at commit.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// The working copies (what `with_tx` bodies take as `inodes`).
    pub inodes: InodeTable,
    /// For each copy of an inode that existed: the inode and change value it was copied from,
    /// and whether it was copied from memory (else read from the tree).
    before: crate::util::numhash::NumberMap<(Inode, u64, bool)>,
    /// Inodes the operation deletes outright: gone from memory at publish, and refused if
    /// anyone opened them meanwhile.
    pub freed: Vec<u64>,
    /// Inodes that must still be open when it publishes: an orphan it names again (a
    /// linkat of an O_TMPFILE), which its last release would free otherwise.
    pub held: Vec<u64>,
    /// The free space it needs (`Fs::space_check`), checked again at publish.
    space: Option<(u64, Reserve)>,
    /// File pages put at publish, under the same hold of the inodes' shards as the inodes
    /// (a write that logs its inode): a query sees the new contents and the bumped counter
    /// together or neither.
    pages: Vec<PagesAtPublish>,
    /// Inodes of which it logs the item alone, for new timestamps and a bumped counter (an
    /// overwrite's tick): fdatasync need not force it (`InodeMem::committed`).
    times_only: Vec<u64>,
}

/// File pages: (file block, contents).
pub(crate) type FilePages = Vec<(u64, Vec<u8>)>;

/// A write's pages put at publish: the inode, its pages, those of them in holes (marked for
/// delayed allocation), and how many of those the write promised blocks for.
#[derive(Debug)]
struct PagesAtPublish {
    ino: u64,
    blocks: FilePages,
    delalloc: Vec<u64>,
    promised: u64,
}

/// How an optimistic operation reaches the filesystem state: by taking the lock shared for a
/// moment, or (run under the exclusive lock after too many conflicts) the state it holds.
pub(crate) enum StateRef<'a> {
    Unlocked(&'a Fs),
    Held(&'a FsState),
}

impl StateRef<'_> {
    pub(crate) fn with<R>(&self, f: impl FnOnce(&FsState) -> R) -> R {
        match self {
            StateRef::Unlocked(fs) => f(&fs.read_state()),
            StateRef::Held(st) => f(st),
        }
    }
}

impl Scratch {
    /// Checks that the operation's `blocks` are free in `hdr` (`Fs::space_check`), and keeps
    /// the need so that the check runs again at publish, against the header as it is then.
    pub(crate) fn need_space(
        &mut self,
        fs: &Fs,
        hdr: &Header,
        blocks: u64,
        reserve: Reserve,
    ) -> FsResult<()> {
        self.space = Some((blocks, reserve));
        fs.space_check(hdr, blocks, reserve)
    }

    /// The working copy of `ino`: from the inode cache, or read through the transaction.
    /// Every inode the operation changes is loaded this way before it is changed.
    pub(crate) fn load<'s>(
        &'s mut self,
        st: &StateRef<'_>,
        t: &mut FsTx<'_>,
        ino: u64,
    ) -> FsResult<&'s mut InodeMem> {
        if !self.inodes.contains_key(&ino) {
            self.load_and(st, t, ino, |_| ())?;
        }
        match self.inodes.get_mut(&ino) {
            Some(m) => Ok(m),
            None => unreachable!("loaded above"),
        }
    }

    /// `load`, and `f` on the state in the same hold of its lock (each hold is a cache line
    /// the cores pass between them, and a wait behind a publish).
    pub(crate) fn load_and<'s, R>(
        &'s mut self,
        st: &StateRef<'_>,
        t: &mut FsTx<'_>,
        ino: u64,
        f: impl FnOnce(&FsState) -> R,
    ) -> FsResult<(&'s mut InodeMem, R)> {
        let r = if self.inodes.contains_key(&ino) {
            st.with(f)
        } else {
            let (copy, r) = st.with(|st| {
                let copy = cached_copy(&*st.inodes.lock(ino), ino);
                (copy, f(st))
            });
            let (m, from_memory) = match copy {
                Some(m) => (m, true),
                None => (InodeMem::loaded(crate::fs::read_inode(t, ino)?), false),
            };
            self.before
                .insert(ino, (m.inode.clone(), m.change.peek(), from_memory));
            self.inodes.insert(ino, Box::new(m));
            r
        };
        match self.inodes.get_mut(&ino) {
            Some(m) => Ok((m, r)),
            None => unreachable!("inserted above"),
        }
    }

    /// Whether one of the inodes it `touched` (what a `dirsync` mount forces for) is a
    /// directory.
    fn changes_a_dir(&self, touched: &[u64]) -> bool {
        touched
            .iter()
            .any(|i| self.inodes.get(i).is_some_and(|m| m.inode.is_dir()))
    }

    /// Copies `ino` if it is in memory (its shard locked by the caller).
    fn preload(&mut self, inodes: &dyn InodeMap, ino: u64) {
        if let Some(m) = cached_copy(inodes, ino) {
            self.before
                .insert(ino, (m.inode.clone(), m.change.peek(), true));
            self.inodes.insert(ino, Box::new(m));
        }
    }

    /// Declares that of `ino` it logs the inode item alone, and changes nothing there but
    /// timestamps and the change counter: nothing fdatasync needs, if the item it logs bears
    /// that out at publish.
    pub(crate) fn logs_only_times_of(&mut self, ino: u64) {
        self.times_only.push(ino);
    }

    /// Pages of `ino` (file block, contents) to put in the page cache when it publishes,
    /// those in holes (`delalloc`) marked for delayed allocation, `promised` of them new.
    pub(crate) fn put_pages_at_publish(
        &mut self,
        ino: u64,
        blocks: FilePages,
        delalloc: Vec<u64>,
        promised: u64,
    ) {
        self.pages.push(PagesAtPublish {
            ino,
            blocks,
            delalloc,
            promised,
        });
    }

    /// Every inode it copied, created or frees: the inode cache's shards to lock for its
    /// check and its publish.
    fn inos(&self) -> impl Iterator<Item = u64> + '_ {
        self.inodes.keys().chain(&self.freed).copied()
    }

    /// Whether every copied inode is in memory as it was copied (their shards locked, or the
    /// exclusive state lock held).
    fn still_valid(
        &self,
        inodes: &dyn InodeMap,
        cache: &crate::fs::cache::pagecache::PageCache,
        fs: &Fs,
    ) -> bool {
        // A copy from memory needs the inode still there as it was: gone, it may have been
        // freed, or changed and dropped from the cache, with nothing in the tree this
        // transaction read to show it. A copy read from the tree is checked with the tree.
        let copies_hold = self.before.iter().all(
            |(ino, (inode, change, from_memory))| match inodes.get(ino) {
                Some(m) => m.inode == *inode && m.change.peek() == *change,
                None => !from_memory,
            },
        );
        // A new inode's number is its own: nothing can have it in memory.
        let new_ones_free = self
            .inodes
            .keys()
            .filter(|i| !self.before.contains_key(i))
            .all(|i| !inodes.contains_key(i));
        // Not marked by another commit freeing it either: one that gave up after its CIL
        // insert takes its marks back after its buffer locks, and would clear this one's.
        let freed_unused = self.freed.iter().all(|i| {
            inodes.get(i).is_none_or(|m| m.open == 0 && !m.freeing)
                && !cache.has_pages(*i)
                && fs.io.idle(*i)
        });
        let held_open = self
            .held
            .iter()
            .all(|i| inodes.get(i).is_some_and(|m| m.open > 0));
        copies_hold && new_ones_free && freed_unused && held_open
    }

    /// Marks the inodes it frees `freeing`, its check just passed under their shards (held
    /// as `inodes`): from here to its publish no one opens them, since the check found them
    /// unopened. An inode not in memory gets an entry to carry the mark, made from the copy
    /// it read. Returns the inodes given one.
    fn mark_freeing(&self, inodes: &mut dyn InodeMap) -> Vec<u64> {
        let mut placed = Vec::new();
        for &ino in &self.freed {
            if let Some(m) = inodes.get_mut(&ino) {
                m.freeing = true;
                continue;
            }
            let Some((inode, _, _)) = self.before.get(&ino) else {
                debug_assert!(false, "inode {ino} freed without a copy");
                continue;
            };
            let mut m = InodeMem::loaded(inode.clone());
            m.freeing = true;
            inodes.insert(ino, Box::new(m));
            placed.push(ino);
        }
        placed
    }

    /// Makes the copies the inodes in memory, after the commit (their shards locked, or
    /// reached under the exclusive state lock). Published under the shared lock (`side_by_side`),
    /// only the copies it changed, created or freed: a copy it did not change may have been
    /// changed since its check by a commit ordered after it.
    fn publish(
        self,
        inodes: &mut dyn InodeMap,
        cache: &crate::fs::cache::pagecache::PageCache,
        seq: u64,
        side_by_side: bool,
    ) {
        // Under the inodes' shards (held by the caller), as the inodes below.
        for p in self.pages {
            #[cfg(test)]
            crate::fs::posix::write::run_before_puts_hook(p.ino);
            let mut pages = cache.lock(p.ino);
            let marked = pages.put_blocks(p.blocks, &p.delalloc);
            debug_assert_eq!(marked, p.promised, "pages marked as promised");
        }
        for (ino, mut m) in self.inodes {
            if self.freed.contains(&ino) {
                continue;
            }
            let before = self.before.get(&ino);
            let unchanged = before
                .is_some_and(|(inode, change, _)| m.inode == *inode && m.change.peek() == *change);
            if side_by_side && unchanged {
                // Logged as it was copied (the write back of a size kept in memory): what is in
                // memory is what the log now holds, once this checkpoint is stable.
                if !m.unlogged {
                    if let Some(cur) = inodes.get_mut(&ino).filter(|c| c.inode == m.inode) {
                        cur.unlogged = false;
                        cur.committed(seq, true);
                    }
                }
                continue;
            }
            match inodes.get_mut(&ino) {
                Some(cur) => {
                    // Only timestamps and the counter moved, over a copy of what the log
                    // held, and nothing else of the inode was logged (an overwrite's tick):
                    // nothing fdatasync needs.
                    let data = !(self.times_only.contains(&ino)
                        && matches!(before, Some((inode, _, true))
                            if !cur.unlogged && only_times_differ(inode, &m.inode)));
                    // Its inode item's block was locked from the check to here: no other
                    // commit can have changed it meanwhile. An overwrite that logs nothing
                    // can (it holds the inode's IO lock and shard, not its leaf): it may have
                    // grown the size and moved the times. It came after this commit, so what
                    // it did stays, on top of the copy, and stays unlogged.
                    let written = match before {
                        Some((inode, change, _)) if side_by_side => {
                            assert!(
                                only_an_unlogged_write_changed(inode, &cur.inode)
                                    && cur.change.peek() == *change,
                                "inode {ino} changed under a commit that changes it"
                            );
                            (cur.inode != *inode).then(|| (inode.clone(), cur.inode.clone()))
                        }
                        _ => None,
                    };
                    cur.inode = m.inode;
                    cur.change.adopt(&m.change);
                    cur.unlogged = m.unlogged;
                    if let Some((was, now)) = written {
                        keep_unlogged_write(&mut cur.inode, &was, &now);
                        cur.unlogged = true;
                    }
                    cur.committed(m.last_seq, false);
                    cur.committed(m.last_data_seq, true);
                    cur.committed(seq, data);
                }
                // Not in memory, or dropped from it since the check: its copy is the newest.
                // A copy's open count may be stale; a new inode's is its creator's (an
                // O_TMPFILE is open from the commit that makes it).
                None => {
                    m.committed(seq, true);
                    if before.is_some() {
                        m.open = 0;
                    }
                    inodes.insert(ino, m);
                }
            }
        }
        for ino in self.freed {
            inodes.remove(&ino);
        }
    }
}

/// The marks `Scratch::mark_freeing` made, taken back if the commit does not publish (a
/// conflict after its check, an error): its inodes can be opened again, and an entry made
/// only to carry a mark goes.
struct FreeingMarks<'a> {
    cache: &'a crate::fs::cache::inode_cache::InodeCache,
    freed: Vec<u64>,
    placed: Vec<u64>,
}

impl Drop for FreeingMarks<'_> {
    fn drop(&mut self) {
        if self.freed.is_empty() {
            return;
        }
        let mut inodes = self.cache.lock_many(self.freed.iter().copied());
        for ino in &self.freed {
            let Some(m) = inodes.get_mut(ino) else {
                continue;
            };
            // A commit that failed after its CIL insert gave up let go of its buffer locks
            // first: a commit changing the inode may have published into the entry since
            // (its last checkpoint is then set), and the entry is its copy now.
            if self.placed.contains(ino) && m.last_seq == 0 {
                inodes.remove(ino);
                self.cache.removed(*ino);
            } else {
                m.freeing = false;
            }
        }
    }
}

/// Whether the item `now` logs differs from the one `was` would in its timestamps and
/// change counter alone (the size the log holds included: `Inode::encode`).
fn only_times_differ(was: &Inode, now: &Inode) -> bool {
    let mut w = was.clone();
    (w.atime, w.mtime, w.ctime, w.change) = (now.atime, now.mtime, now.ctime, now.change);
    *w.encode() == *now.encode()
}

/// Whether `now` differs from `was` only in what an overwrite that logs nothing changes (the
/// size, grown, the times and its first dirty page), or a write back of its pages (that
/// first dirty page forgotten).
fn only_an_unlogged_write_changed(was: &Inode, now: &Inode) -> bool {
    let mut w = was.clone();
    w.size = now.size;
    w.mtime = now.mtime;
    w.ctime = now.ctime;
    w.dirty_from = now.dirty_from;
    w == *now && now.size >= was.size
}

/// Puts on `copy` (what a commit publishes) what an overwrite that logs nothing, or a write
/// back, changed from `was` to `now` meanwhile. Both hold the inode's IO lock, so the commit
/// itself wrote no pages of it: their first dirty page is the one to keep.
fn keep_unlogged_write(copy: &mut Inode, was: &Inode, now: &Inode) {
    if now.size != was.size {
        copy.size = copy.size.max(now.size);
    }
    if now.dirty_from != was.dirty_from {
        copy.dirty_from = now.dirty_from;
    }
    if now.mtime != was.mtime {
        copy.mtime = now.mtime;
    }
    if now.ctime != was.ctime {
        copy.ctime = copy.ctime.max(now.ctime);
    }
}

/// A working copy of `ino` as it is in memory, if it is.
fn cached_copy(inodes: &dyn InodeMap, ino: u64) -> Option<InodeMem> {
    inodes.get(&ino).map(|m| InodeMem {
        inode: m.inode.clone(),
        change: m.change.copy(),
        open: m.open,
        last_seq: m.last_seq,
        last_data_seq: m.last_data_seq,
        unlogged: m.unlogged,
        spec_prealloc: m.spec_prealloc.clone(),
        stale_prealloc: m.stale_prealloc,
        freeing: false,
    })
}

impl Fs {
    /// Runs `body` optimistically (module comment) and commits its transaction. `body` gets
    /// its way to the state, the transaction and the scratch inodes, and returns its result
    /// and the inodes whose change a `dirsync` mount must force (`with_tx`'s `touched`).
    /// `preload`: inodes copied along with the header, in the same moment under the lock.
    pub(crate) fn with_shared_tx<R>(
        &self,
        preload: &[u64],
        body: impl FnMut(&StateRef<'_>, &mut FsTx<'_>, &mut Scratch) -> FsResult<(R, Vec<u64>)>,
    ) -> FsResult<R> {
        self.check_writable()?;
        self.run_shared_tx(preload, body)
    }

    /// `with_shared_tx` for write back (its pages' blocks marked written, its size logged),
    /// which a switch to read-only runs after it has begun to refuse changes
    /// (`Fs::set_read_only`): refused only on a read-only mount or after a shutdown.
    pub(crate) fn with_writeback_tx<R>(
        &self,
        preload: &[u64],
        body: impl FnMut(&StateRef<'_>, &mut FsTx<'_>, &mut Scratch) -> FsResult<(R, Vec<u64>)>,
    ) -> FsResult<R> {
        if self.opts.read_only {
            return Err(FsError::ReadOnly);
        }
        if self.journal.is_shut_down() {
            return Err(FsError::Journal(crate::journal::JournalError::Shutdown));
        }
        self.run_shared_tx(preload, body)
    }

    fn run_shared_tx<R>(
        &self,
        preload: &[u64],
        mut body: impl FnMut(&StateRef<'_>, &mut FsTx<'_>, &mut Scratch) -> FsResult<(R, Vec<u64>)>,
    ) -> FsResult<R> {
        let conflicted = || crate::fs::stats::bump(&self.stats.conflicts);
        publish::retry(
            CONFLICTS_MAX,
            |exclusive| match exclusive {
                true => self.with_exclusive_scratch(&mut body),
                false => self.with_optimistic_scratch(preload, &mut body),
            },
            conflicted,
        )
    }

    /// One optimistic run of `body` (`with_shared_tx`) and its publish. None: a conflict.
    fn with_optimistic_scratch<R>(
        &self,
        preload: &[u64],
        body: &mut impl FnMut(&StateRef<'_>, &mut FsTx<'_>, &mut Scratch) -> FsResult<(R, Vec<u64>)>,
    ) -> FsResult<Option<R>> {
        let mut sc = Scratch::default();
        let hdr = {
            let st = self.read_state();
            if !preload.is_empty() {
                let inodes = st.inodes.lock_many(preload.iter().copied());
                for &ino in preload {
                    sc.preload(&inodes, ino);
                }
            }
            let hdr = self.hdr(&st).clone();
            hdr
        };
        let mut t = FsTx::begin_optimistic(&self.journal, &hdr, self.hdr_blk, &self.busy)?;
        #[cfg(test)]
        run_once(&AFTER_COPY);
        match body(&StateRef::Unlocked(self), &mut t, &mut sc) {
            Ok((r, touched)) => Ok(self.publish_shared(t, sc, &touched)?.then_some(r)),
            // Giving up to wait or read outside the lock: `retrying` runs it again.
            Err(e @ FsError::Retry(_)) => Err(e),
            // The error may come from a view of two states (a block or a root that changed
            // while it read): only one met in one state counts.
            Err(e) if t.saw_one_state(&self.hdr(&self.read_state())) => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// The same as one optimistic run, under the exclusive lock: nothing in the trees or the
    /// inode cache can change under it.
    fn with_exclusive_scratch<R>(
        &self,
        body: &mut impl FnMut(&StateRef<'_>, &mut FsTx<'_>, &mut Scratch) -> FsResult<(R, Vec<u64>)>,
    ) -> FsResult<Option<R>> {
        let mut st = self.write_state();
        let mut t =
            FsTx::begin_optimistic(&self.journal, st.hdr.get_mut(), self.hdr_blk, &self.busy)?;
        t.hold_lock();
        let mut sc = Scratch::default();
        let (r, touched) = body(&StateRef::Held(&st), &mut t, &mut sc)?;
        // Only what takes no filesystem lock can still move: an inode it frees may have been
        // opened for IO (IO locks come before this one). None: run it again.
        Ok(self.publish_scratch(&mut st, t, sc, &touched)?.then_some(r))
    }

    /// Validates and commits (exclusive lock held); false if the operation must run again.
    fn publish_scratch(
        &self,
        st: &mut FsState,
        mut t: FsTx<'_>,
        sc: Scratch,
        touched: &[u64],
    ) -> FsResult<bool> {
        let roots_moved = t.roots_moved(st.hdr.get_mut().roots());
        let current = t.merge_header(st.hdr.get_mut())
            && t.still_current(st.hdr.get_mut().roots(), roots_moved, None);
        if !current
            || !self.blocks_still_free(&t)
            || !sc.still_valid(&st.inodes.all(), &st.cache, self)
        {
            return Ok(false);
        }
        // Free space as it is now: creates side by side each checked against their own copy.
        if let Some((blocks, reserve)) = sc.space {
            self.space_check(st.hdr.get_mut(), blocks, reserve)?;
        }
        t.reserve_to_commit()?;
        #[cfg(debug_assertions)]
        t.assert_keys_routed();
        let dir_changed = sc.changes_a_dir(touched);
        let seq = self.commit(st, t)?;
        let mut inodes = st.inodes.all();
        sc.publish(&mut inodes, &st.cache, seq, false);
        inodes.for_each_table(|t| {
            self.trim_cache(t);
        });
        self.force_if_sync(seq, || dir_changed)?;
        Ok(true)
    }

    /// Blocks it took from the free trees were free, not busy and not reserved when it
    /// looked; a commit since may have freed them (busy until stable) or a write reserved
    /// them (under the exclusive lock) without changing the trees.
    fn blocks_still_free(&self, t: &FsTx<'_>) -> bool {
        t.allocated.is_empty() || {
            let busy = self.lock_busy();
            !t.allocated.iter().any(|&(s, l)| busy.overlaps(s, l))
        }
    }

    /// Validates and commits an optimistic transaction under the shared state lock, side by
    /// side with others doing the same (Silo's commit, module comment); false if the operation
    /// must run again.
    fn publish_shared(&self, mut t: FsTx<'_>, sc: Scratch, touched: &[u64]) -> FsResult<bool> {
        // The free list topped up or drained first: that is part of what it changes.
        if let Err(e) = t.fix_freelist() {
            if matches!(e, FsError::Retry(_)) || t.saw_one_state(&self.hdr(&self.read_state())) {
                return Err(e);
            }
            return Ok(false);
        }
        // What may wait comes first, before any lock: log space, then the free space check
        // against the header as it is now.
        t.reserve_waiting()?;
        // Nor may it wait at the CIL's hard limit once it holds buffer locks, which the AIL
        // may need to move the tail for the push it would wait for.
        self.journal.wait_below_hard_limit();
        let st = self.read_state();
        if let Some((blocks, reserve)) = sc.space {
            let free = self.hdr(&st).free_blocks;
            self.space_check_free(free, blocks, reserve)?;
        }
        #[cfg(debug_assertions)]
        let changed = t.tx.changed_blocks();
        let dir_changed = sc.changes_a_dir(touched);
        let steps = SharedPublish {
            fs: self,
            st: &st,
            t,
            sc: &sc,
            images: None,
        };
        let Some((seq, locks, mut marks)) = publish::publish(steps)? else {
            return Ok(false);
        };
        #[cfg(debug_assertions)]
        crate::fs::txn::assert_published_keys_routed(
            &self.journal,
            self.hdr(&st).roots(),
            &locks,
            &changed,
        );
        crate::fs::txn::retry::committed();
        crate::fs::stats::count_transaction(&self.stats);
        crate::fs::stats::bump(&self.stats.shared_publishes);
        {
            let mut inodes = st.inodes.lock_many(sc.inos());
            sc.publish(&mut inodes, &st.cache, seq, true);
            // The inodes it froze are gone from memory with their marks.
            for ino in std::mem::take(&mut marks.freed) {
                st.inodes.removed(ino);
            }
            inodes.for_each_table(|t| {
                if let Some(gone) = self.trim_cache(t) {
                    st.inodes.removed(gone);
                }
            });
        }
        drop(marks);
        // Anyone who sees its blocks from now on finds its inodes in memory.
        drop(locks);
        drop(st);
        self.journal.push_if_due()?;
        self.force_if_sync(seq, || dir_changed)?;
        Ok(true)
    }

    /// Waits for the publish turn: a commit that changes interior nodes or the header's
    /// structure (roots, free list, data range), whose merge of the header must see the last
    /// such commit's.
    fn take_turn(&self) -> Ranked<cilfs_sync::MutexGuard<'_, ()>, { rank::TURN }> {
        before_turn_hook(false);
        Ranked::acquire(|| self.publishing.lock(&self.publish_waits))
    }
}

/// An optimistic commit's publish under the shared state lock (`st`), in the steps of
/// `publish::publish`.
struct SharedPublish<'a, 's, 'j> {
    fs: &'a Fs,
    st: &'a FsState,
    t: FsTx<'j>,
    sc: &'s Scratch,
    /// What a commit of leaves' buffers log, formatted before its insert.
    images: Option<Vec<Vec<u8>>>,
}

impl<'a> Publish for SharedPublish<'a, '_, '_> {
    type Turn = Ranked<cilfs_sync::MutexGuard<'a, ()>, { rank::TURN }>;
    type Locks = PublishLocks;
    type Checked = FreeingMarks<'a>;
    type Done = (u64, PublishLocks, FreeingMarks<'a>);
    type Error = FsError;

    fn leaves_only(&self) -> bool {
        self.t.leaves_only()
    }

    fn take_turn(&self) -> Self::Turn {
        self.fs.take_turn()
    }

    fn lock_changed(&mut self, wait: bool) -> Result<Option<PublishLocks>, ()> {
        match wait {
            true => self.t.tx.lock_changed().map(Some),
            false => self.t.tx.try_lock_changed(),
        }
        .map_err(|_| ())
    }

    /// Every block it only read: not being published by another commit now, and as it saw it
    /// (or, for an interior node or a looked-up key, leading to the same place). Reads
    /// through its own locks; none waits. Then its inodes as it copied them: a copy it does
    /// not change may change after this (another commit ordered after it, which does not read
    /// what this one writes); one it changes cannot, since its inode item is in a block
    /// locked here.
    fn check(&mut self, locks: &PublishLocks) -> FsResult<Option<FreeingMarks<'a>>> {
        let (fs, st, t, sc) = (self.fs, self.st, &self.t, self.sc);
        let roots = fs.hdr(st).roots();
        #[cfg(shuttle)]
        let unchecked = crate::util::mutants::publish_check_off();
        #[cfg(not(shuttle))]
        let unchecked = false;
        if !unchecked
            && (t.read_set_locked() || !t.still_current(roots, t.roots_moved(roots), Some(locks)))
        {
            return Ok(None);
        }
        if !unchecked && !fs.blocks_still_free(t) {
            return Ok(None);
        }
        let mut held = st.inodes.lock_many(sc.inos());
        if !sc.still_valid(&held, &st.cache, fs) {
            return Ok(None);
        }
        let marks = FreeingMarks {
            cache: &st.inodes,
            placed: sc.mark_freeing(&mut held),
            freed: sc.freed.clone(),
        };
        drop(held);
        #[cfg(test)]
        run_once(&AFTER_CHECK);
        Ok(Some(marks))
    }

    /// A commit of leaves alone cannot fail to merge its counters: it copies into its
    /// buffers, and formats what they log, side by side with others, and takes no turn: its
    /// counters go to the log as changes, which commits may add in any order
    /// (`LateWrite::counters`), and its blocks are its own until it lets go of them.
    fn publish_leaves(&mut self, locks: &mut PublishLocks) {
        self.t.tx.publish_locked(locks);
        self.images = Some(self.t.tx.preformat(locks));
    }

    fn insert(
        self,
        locks: PublishLocks,
        turn: Option<Self::Turn>,
        marks: FreeingMarks<'a>,
    ) -> FsResult<Option<Self::Done>> {
        if turn.is_none() {
            before_turn_hook(true);
        }
        let inserted =
            (self.t).insert_shared(locks, self.images, &self.st.hdr, &self.fs.roots_moved)?;
        drop(turn);
        Ok(inserted.map(|(seq, locks)| (seq, locks, marks)))
    }
}

/// Tests: runs this thread's `BEFORE_TURN` hook, if any.
fn before_turn_hook(leaves_only: bool) {
    #[cfg(test)]
    run_commit_hook(&BEFORE_TURN, leaves_only);
    #[cfg(not(test))]
    let _ = leaves_only;
}

/// Tests: a hook given whether the commit changes leaves only.
#[cfg(test)]
pub(crate) type CommitHook = std::cell::RefCell<Option<Box<dyn FnMut(bool)>>>;

/// Tests: runs this thread's `hook`, if set, given whether the commit changes leaves only.
#[cfg(test)]
pub(crate) fn run_commit_hook(hook: &'static std::thread::LocalKey<CommitHook>, leaves_only: bool) {
    hook.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f(leaves_only);
        }
    });
}

#[cfg(test)]
thread_local! {
    /// Tests: run by every optimistic commit of this thread just before it waits for its
    /// turn, or, for a commit of leaves, which takes none, at the same place: just before it
    /// inserts into the CIL.
    pub(crate) static BEFORE_TURN: CommitHook = const { std::cell::RefCell::new(None) };
}

/// Tests: a hook an optimistic operation of this thread runs once, at a point named below.
#[cfg(test)]
pub(crate) type OnceHook = std::cell::RefCell<Option<Box<dyn FnOnce()>>>;

#[cfg(test)]
thread_local! {
    /// After it copied the header and inodes and before it builds (where another operation
    /// can slip in).
    pub(crate) static AFTER_COPY: OnceHook = const { std::cell::RefCell::new(None) };
    /// A commit's, between its check and its publish (`publish_shared`), where its marks
    /// hold.
    pub(crate) static AFTER_CHECK: OnceHook = const { std::cell::RefCell::new(None) };
}

/// Tests: runs `hook` if set, once.
#[cfg(test)]
fn run_once(hook: &'static std::thread::LocalKey<OnceHook>) {
    if let Some(f) = hook.with(|h| h.borrow_mut().take()) {
        f();
    }
}
