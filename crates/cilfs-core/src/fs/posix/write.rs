//! The write path, in three steps so that no data IO happens under the filesystem lock
//! (docs/concurrency.md, invariant 1): the inode's IO lock (`cache/iolock.rs`) is held exclusively
//! through all three, and
//! only operations on the same inode wait for it.
//!
//! 1. Plan, under the filesystem lock: the range's mapping, the space check (so ENOSPC is
//!    a write's error, not its write back's), blocks promised to a buffered write's holes
//!    (delayed allocation, `space/delalloc.rs`) or, for a direct write or `nodelalloc`, free
//!    blocks reserved for its holes and for speculative preallocation
//!    (`BusyExtents::reserve`: free on disk, given to no one else), and which partial blocks
//!    at its edges the page cache holds.
//! 2. IO, under no lock but the inode's: partial blocks the cache lacks read (an unwritten
//!    block's are zeros, not read), the old last block zeroed past EOF when the file grows
//!    past it.
//! 3. Commit, under the filesystem lock: the write's pages put in the page cache dirty, those
//!    in holes marked for delayed allocation; reserved blocks mapped unwritten in one
//!    transaction with the inode. Write back writes them in place later, outside every lock
//!    but the inode's, and then maps or marks their blocks written (`sync.rs`): no data IO
//!    in the request, and a crash before that shows a hole or zeros there, never a block's
//!    old contents. If a partial block the cache held in
//!    step 1 has been dropped since (clean pages go when the cache is full), step 2 is run for
//!    it and step 3 again.
//!
//! A crash between the steps leaves nothing to undo: the reserved blocks are still free.
//! The mapping is stable between the steps: everything that changes or frees this inode's
//! blocks (write, truncate, fallocate, punch, reclaim) holds its IO lock exclusively.

use crate::fs::cache::iolock::IoMode;
use crate::fs::cache::pagecache::InodePages;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::extent::{max_file_size, Extent};
use crate::fs::items::inode::{Timespec, INODE_SYNC};
use crate::fs::posix::xattr::drop_caps;
use crate::fs::rules::iflags;
use crate::fs::rules::setid::CAPS_XATTR;
use crate::fs::space::map::{extents_in, holes};
use crate::fs::stats::{bump, bump_bytes};
use crate::fs::txn::shared_tx::FilePages;
use crate::fs::types::{Cred, Reserve};
use crate::fs::{log_inode, DataMode, Fs, FsState, InodeMem, IversionMode};
use cilfs_device::AlignedBuf;

/// A partial block at an edge of the write that the file owns below its old size: its old
/// contents are needed.
#[derive(Debug, Clone, Copy)]
struct Edge {
    fb: u64,
    disk: u64,
    /// In the page cache when planned; otherwise step 2 reads it.
    cached: bool,
    /// Unwritten: its old contents are zeros, whatever the disk holds.
    unwritten: bool,
}

/// The old last block of a file the write grows past, to zero from the old EOF on.
#[derive(Debug, Clone, Copy)]
struct EofTail {
    fb: u64,
    disk: u64,
    from: usize,
    cached: bool,
    /// Unwritten: zeros already on every read, nothing to zero on disk.
    unwritten: bool,
}

#[derive(Debug)]
struct Plan {
    ino: u64,
    /// The project its data IO is charged to.
    project: u32,
    off: u64,
    old_size: u64,
    first: u64,
    last: u64,
    /// The file's extents over `[first, last]`.
    exts: Vec<Extent>,
    /// Reserved for the holes of `[first, last]` and the preallocation past it.
    fresh: Vec<Extent>,
    /// File-block ranges of `fresh` past the write (speculative preallocation).
    spec: Vec<(u64, u64)>,
    edges: Vec<Edge>,
    eof: Option<EofTail>,
    /// An O_DIRECT write: the data of its new blocks is written in place before the
    /// transaction that maps them written, and never cached; no speculative preallocation.
    direct: bool,
    /// Blocks of `[first, last]` in holes, whose pages wait for blocks (delayed allocation,
    /// `space/delalloc.rs`); the write marks them.
    delalloc: Vec<u64>,
    /// Blocks promised for those of them not yet marked: given back if the write fails.
    promised: u64,
}

/// What step 2 read or did: the old contents of uncached edge blocks.
#[derive(Debug, Default)]
struct Staged {
    edges: Vec<(u64, AlignedBuf)>,
    eof_zeroed: bool,
}

impl Fs {
    /// Writes `data` at `off`. Returns the bytes written (all of them, or an error).
    pub fn write(&self, cred: Cred, ino: u64, off: u64, data: &[u8]) -> FsResult<usize> {
        self.once_more_after_releases(|| self.write_through(cred, ino, off, data, false))
    }

    /// `write` for a file opened O_DIRECT: its data is on the device when this returns, as a
    /// kernel filesystem's direct write leaves it. New blocks get the data before the
    /// transaction that maps them written; blocks the file owns are written back with the
    /// file's other dirty pages and marked written. Durable only after an fsync, which
    /// O_DIRECT alone never promises either.
    pub fn write_direct(&self, cred: Cred, ino: u64, off: u64, data: &[u8]) -> FsResult<usize> {
        self.once_more_after_releases(|| self.write_through(cred, ino, off, data, true))
    }

    fn write_through(
        &self,
        cred: Cred,
        ino: u64,
        off: u64,
        data: &[u8],
        direct: bool,
    ) -> FsResult<usize> {
        bump(&self.stats.operations);
        self.check_writable()?;
        if data.is_empty() {
            return Ok(0);
        }
        let n = {
            let _io = self.io.lock(ino, IoMode::Exclusive);
            if direct {
                // Its new blocks are mapped under no page: pages waiting for blocks go first.
                self.flush_delalloc(ino)?;
            }
            let n = self.write_locked_as(cred, ino, off, data, direct)?;
            if direct {
                self.writeback_locked(ino)?;
            }
            n
        };
        // The sync flag (chattr +S): durable before the reply, as an O_SYNC write.
        if self.has_flag(ino, INODE_SYNC) {
            self.fsync(ino)?;
        }
        Ok(n)
    }

    /// Whether `ino`, in memory (any inode just written is), carries `flag`.
    pub(crate) fn has_flag(&self, ino: u64, flag: u32) -> bool {
        let st = self.read_state();
        let has = st
            .inodes
            .lock(ino)
            .get(&ino)
            .is_some_and(|m| m.inode.flags & flag != 0);
        has
    }

    /// `write`, with `ino`'s IO lock held exclusively by the caller.
    pub(crate) fn write_locked(
        &self,
        cred: Cred,
        ino: u64,
        off: u64,
        data: &[u8],
    ) -> FsResult<usize> {
        self.write_locked_as(cred, ino, off, data, false)
    }

    /// `write_locked`, or for O_DIRECT (`direct`) a write whose new blocks get their data
    /// before the transaction that maps them written, as XFS's direct IO into a hole does:
    /// one transaction a request, no copy into the page cache. Blocks the file owns go
    /// through the page cache, and the caller writes them back before it returns.
    fn write_locked_as(
        &self,
        cred: Cred,
        ino: u64,
        off: u64,
        data: &[u8],
        direct: bool,
    ) -> FsResult<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let end = off.checked_add(data.len() as u64).ok_or(FsError::TooBig)?;
        if end > max_file_size(self.bs) {
            return Err(FsError::TooBig);
        }
        // Memory pressure: write dirty pages back first (this inode's, and others' that are
        // not busy), outside the filesystem lock.
        if self.over_dirty_limit() {
            self.writeback_pressure(ino)?;
        }
        let mut plan = self.retrying(|| {
            if let Some(p) = self.plan_overwrite(ino, off, end, direct)? {
                return Ok(p);
            }
            if !direct && self.opts.delalloc {
                // Not in memory: loaded and planned as above, since a hole's page may wait for
                // a block that `plan_write` would map under it.
                self.load(&mut self.write_state(), ino)?;
                if let Some(p) = self.plan_overwrite(ino, off, end, direct)? {
                    return Ok(p);
                }
            }
            self.plan_write(ino, off, end, direct)
        })?;
        let r = self.stage_and_commit(cred, &mut plan, data);
        self.unreserve(&plan.fresh);
        if r.is_err() {
            self.release_delalloc(plan.promised);
        }
        if r.is_ok() && !plan.spec.is_empty() {
            // Mapped now: the last release frees what of them is still past the end.
            if let Some(m) = self.write_state().inodes.get_mut(&ino) {
                for &(a, b) in &plan.spec {
                    note_spec_range(&mut m.spec_prealloc, a, b);
                }
            }
        }
        r
    }

    fn stage_and_commit(&self, cred: Cred, plan: &mut Plan, data: &[u8]) -> FsResult<usize> {
        let mut staged = Staged::default();
        if plan.direct {
            self.write_fresh(plan, data)?;
        }
        loop {
            self.stage_edges(plan, &mut staged)?;
            match self.retrying(|| self.commit_write(cred, plan, &staged, data))? {
                Ok(n) => return Ok(n),
                Err(dropped) => {
                    // Pages dropped from the cache since step 1: read them from disk now.
                    for fb in dropped {
                        for e in plan.edges.iter_mut().filter(|e| e.fb == fb) {
                            e.cached = false;
                        }
                        if let Some(t) = plan.eof.as_mut().filter(|t| t.fb == fb) {
                            t.cached = false;
                        }
                    }
                }
            }
        }
    }

    /// Step 1 for an overwrite of blocks the file owns, or a buffered write whose holes wait
    /// for blocks (delayed allocation: their blocks promised here), under the state lock taken
    /// shared (the inode's IO lock, held exclusively, keeps its mapping still). None: the
    /// range has holes to map now (a direct write, `nodelalloc`), or the inode is not in
    /// memory; `plan_write` plans it.
    fn plan_overwrite(&self, ino: u64, off: u64, end: u64, direct: bool) -> FsResult<Option<Plan>> {
        let bs = u64::from(self.bs);
        let st = self.read_state();
        let (old_size, project) = match st.inodes.lock(ino).get(&ino) {
            Some(m) if m.inode.is_dir() => return Err(FsError::IsDir),
            Some(m) => {
                iflags::may_write(&m.inode, off)?;
                (m.inode.size, m.inode.project)
            }
            None => return Ok(None),
        };
        let first = off / bs;
        let last = (end - 1) / bs;
        let (exts, hole_blocks) = self.mapping(&st, ino, first, last)?;
        if hole_blocks > 0 && (direct || !self.opts.delalloc) {
            return Ok(None);
        }
        let delalloc: Vec<u64> = if hole_blocks == 0 {
            Vec::new()
        } else {
            holes(&exts, first, last + 1)
                .into_iter()
                .flat_map(|(a, b)| a..b)
                .collect()
        };
        let (edges, eof) = self.edges_of(&st, ino, off, end, old_size, &exts)?;
        // Before anything can fail after it: the promise is given back only by a failed commit.
        let promised = if delalloc.is_empty() {
            0
        } else {
            let marked = st.cache.delalloc_in(ino, first, last + 1);
            let promised = delalloc.len() as u64 - marked;
            let free = self.hdr(&st).free_blocks;
            self.reserve_delalloc(free, promised)?;
            promised
        };
        Ok(Some(Plan {
            ino,
            project,
            off,
            old_size,
            first,
            last,
            exts,
            fresh: Vec::new(),
            spec: Vec::new(),
            edges,
            eof,
            // A direct overwrite of blocks the file owns goes through the cache, written back
            // before it returns.
            direct: false,
            delalloc,
            promised,
        }))
    }

    /// The partial blocks at the edges of a write of `[off, end)` that the file owns below its
    /// old size, and its old last block when the write starts past it.
    fn edges_of(
        &self,
        st: &FsState,
        ino: u64,
        off: u64,
        end: u64,
        old_size: u64,
        exts: &[Extent],
    ) -> FsResult<(Vec<Edge>, Option<EofTail>)> {
        let bs = u64::from(self.bs);
        let (first, last) = (off / bs, (end - 1) / bs);
        let mut edges = Vec::new();
        for fb in [first, last] {
            let partial = (fb == first && off % bs != 0) || (fb == last && end % bs != 0);
            if !partial || fb * bs >= old_size || edges.iter().any(|e: &Edge| e.fb == fb) {
                continue;
            }
            if let Some(e) = exts.iter().find(|e| fb >= e.file && fb < e.end()) {
                edges.push(Edge {
                    fb,
                    disk: e.disk + (fb - e.file),
                    cached: st.cache.contains(ino, fb),
                    unwritten: e.unwritten,
                });
            } else if st.cache.contains(ino, fb) {
                // A hole whose page waits for a block (delayed allocation): its contents
                // are the page's.
                edges.push(Edge {
                    fb,
                    disk: 0,
                    cached: true,
                    unwritten: true,
                });
            }
        }
        // The old last block, when the write starts past it: zeroed from EOF (a write starting
        // inside it zeroes that part itself, as an edge).
        let eof = if old_size % bs != 0 && off > old_size && off / bs != old_size / bs {
            let fb = old_size / bs;
            let mut v = self.view(st);
            let cached = st.cache.contains(ino, fb);
            match extents_in(&mut v, ino, fb, fb + 1)?.first() {
                Some(e) => Some(EofTail {
                    fb,
                    disk: e.disk + (fb - e.file),
                    from: (old_size % bs) as usize,
                    cached,
                    unwritten: e.unwritten,
                }),
                // A hole: zeros on disk, but its page may wait for a block.
                None => cached.then_some(EofTail {
                    fb,
                    disk: 0,
                    from: (old_size % bs) as usize,
                    cached: true,
                    unwritten: true,
                }),
            }
        } else {
            None
        };
        Ok((edges, eof))
    }

    /// Step 1.
    fn plan_write(&self, ino: u64, off: u64, end: u64, direct: bool) -> FsResult<Plan> {
        let bs = u64::from(self.bs);
        let mut st = self.write_state();
        let m = self.load(&mut st, ino)?;
        if m.inode.is_dir() {
            return Err(FsError::IsDir);
        }
        iflags::may_write(&m.inode, off)?;
        let (old_size, project, owned) = (m.inode.size, m.inode.project, m.inode.blocks);
        let first = off / bs;
        let last = (end - 1) / bs;
        let (exts, hole_blocks) = self.mapping(&st, ino, first, last)?;
        if hole_blocks > 0 {
            self.space_check(st.hdr.get_mut(), hole_blocks + 8, Reserve::Keep)?;
        }
        // Speculative preallocation (as XFS does): a write that appends to the file also maps
        // a run of blocks past its end, unwritten (no IO), so the appends that follow land in
        // blocks the file owns (the page cache) instead of allocating and writing each block
        // synchronously. Only for appends (a write far past the end leaves a hole, and
        // says nothing of what follows it) to files that own 16 blocks or more (small files
        // stay exact); as many blocks as the file owns, up to 256. The last release frees
        // what is still past the end (`Fs::trim_prealloc`).
        let prealloc =
            if !direct && hole_blocks > 0 && end > old_size && off <= old_size && owned >= 16 {
                let want = owned.min(256);
                let fits = (last + 1 + want) * bs <= max_file_size(self.bs)
                    && self
                        .space_check(st.hdr.get_mut(), hole_blocks + want + 8, Reserve::Keep)
                        .is_ok();
                if fits {
                    want
                } else {
                    0
                }
            } else {
                0
            };
        let (edges, eof) = self.edges_of(&st, ino, off, end, old_size, &exts)?;
        let fresh = if hole_blocks > 0 {
            let end_fb = last + 1 + prealloc;
            let all = if prealloc > 0 {
                extents_in(&mut self.view(&st), ino, first, end_fb)?
            } else {
                exts.clone()
            };
            self.reserve_holes(&st, &all, first, end_fb)?
        } else {
            Vec::new()
        };
        // The blocks this write reserves past itself, and only those.
        let spec = fresh
            .iter()
            .filter(|e| prealloc > 0 && e.end() > last + 1)
            .map(|e| (e.file.max(last + 1), e.end()))
            .collect();
        Ok(Plan {
            ino,
            project,
            off,
            old_size,
            first,
            last,
            exts,
            fresh,
            spec,
            edges,
            eof,
            direct,
            delalloc: Vec::new(),
            promised: 0,
        })
    }

    /// Step 2 of a direct write for its new blocks: their data, zeros around it, in place.
    /// Nothing maps them yet: a crash before the transaction that does leaves them free.
    fn write_fresh(&self, plan: &Plan, data: &[u8]) -> FsResult<()> {
        let bs = u64::from(self.bs);
        for e in &plan.fresh {
            let s = e.file.max(plan.first);
            let en = e.end().min(plan.last + 1);
            if s < en {
                let mut buf = AlignedBuf::zeroed(((en - s) * bs) as usize);
                copy_overlap(&mut buf, s * bs, plan.off, data);
                self.unflushed.lock().insert(plan.ino);
                self.data_write(plan.project, e.disk + (s - e.file), &buf)?;
            }
        }
        Ok(())
    }

    /// Step 2 for the edges and the old last block the cache does not hold.
    fn stage_edges(&self, plan: &Plan, staged: &mut Staged) -> FsResult<()> {
        let bsz = self.bs as usize;
        for e in plan.edges.iter().filter(|e| !e.cached) {
            if staged.edges.iter().any(|(fb, _)| *fb == e.fb) {
                continue;
            }
            let mut buf = AlignedBuf::zeroed(bsz);
            if !e.unwritten {
                self.data_read(plan.project, e.disk, &mut buf)?;
            }
            staged.edges.push((e.fb, buf));
        }
        if let Some(t) = plan.eof.filter(|t| !t.cached && !t.unwritten) {
            if !staged.eof_zeroed {
                // The write starts past this block: all of its tail is in the file now.
                self.zero_block_range(plan.ino, plan.project, t.disk, t.from, self.bs as usize)?;
                staged.eof_zeroed = true;
            }
        }
        Ok(())
    }

    /// Step 3. `Ok(Err(blocks))`: pages step 1 found in the cache are gone; nothing changed.
    fn commit_write(
        &self,
        cred: Cred,
        plan: &Plan,
        staged: &Staged,
        data: &[u8],
    ) -> FsResult<Result<usize, Vec<u64>>> {
        if plan.fresh.is_empty() {
            if let Some(r) = self.commit_overwrite(cred, plan, staged, data)? {
                return Ok(r);
            }
            return self.commit_overwrite_logged(cred, plan, staged, data);
        }
        self.commit_write_exclusive(cred, plan, staged, data)
    }

    /// Step 3 for an overwrite that logs its inode (a timestamp tick, a queried counter,
    /// set-ID bits to clear, a capability to drop): built optimistically and published under
    /// the shared state lock (`shared_tx.rs`), its pages put at the publish, under the same
    /// hold of the inode's shard as the inode. It always bumps the counter: it logs the inode
    /// anyway, and a query between its copy of the inode and its publish must not see the
    /// new contents under the value it returned.
    fn commit_overwrite_logged(
        &self,
        cred: Cred,
        plan: &Plan,
        staged: &Staged,
        data: &[u8],
    ) -> FsResult<Result<usize, Vec<u64>>> {
        let ino = plan.ino;
        let end = plan.off + data.len() as u64;
        // The new pages, built now: nothing but this write changes them while it holds the
        // inode's IO lock, and a trim of the cache only drops clean copies of what is on disk.
        let blocks = {
            let st = self.read_state();
            let pages = st.cache.lock(ino);
            let dropped = dropped_pages(plan, &pages);
            if !dropped.is_empty() {
                return Ok(Err(dropped));
            }
            self.write_blocks(plan, staged, data, &pages)?
        };
        let now = self.now();
        let kill = self.with_shared_tx(&[ino], |st, t, sc| {
            let caps = self.xattr_lookup_in(t, ino, CAPS_XATTR)?.is_some();
            let m = sc.load(st, t, ino)?;
            if m.inode.is_dir() {
                return Err(FsError::IsDir);
            }
            let d = self.write_logging(cred, m, plan, data, caps, now);
            m.change.maybe_increment(true);
            m.inode.mtime = now;
            m.inode.ctime = now;
            m.inode.size = m.inode.size.max(end);
            self.note_dirty(&mut m.inode, first_block(&blocks));
            m.inode.mode &= !d.kill;
            log_inode(t, m, &self.stats)?;
            if caps {
                drop_caps(t, ino)?;
            } else {
                sc.logs_only_times_of(ino);
            }
            sc.put_pages_at_publish(ino, blocks.clone(), plan.delalloc.clone(), plan.promised);
            Ok((d.kill, vec![ino]))
        })?;
        bump(&self.stats.change_bumps);
        bump_bytes(&self.stats.data_write_bytes, data.len());
        if kill != 0 {
            self.attrs_changed(ino);
        }
        Ok(Ok(data.len()))
    }

    /// Step 3 for an overwrite that logs nothing (most writes: the counter not queried, the
    /// timestamps within their granularity or lazytime): pages and the inode in memory change
    /// under the state lock taken shared, with the inode's cache shard and its page cache shard
    /// held, so writers of different files run side by side. None: the write must log (or its
    /// inode is not in memory), and takes `commit_overwrite_logged`; nothing changed.
    ///
    /// A query of the change counter takes the inode's shard lock, held here from the look at
    /// the counter to the last page put: a query sees the write whole or not at all, so a value
    /// it returns is never paired with contents the counter does not cover.
    fn commit_overwrite(
        &self,
        cred: Cred,
        plan: &Plan,
        staged: &Staged,
        data: &[u8],
    ) -> FsResult<Option<Result<usize, Vec<u64>>>> {
        let ino = plan.ino;
        let st = self.read_state();
        // Looked up before any shard is locked: it may read tree blocks. A capability is only
        // set under the exclusive lock, which this shared hold keeps out.
        let caps = self.has_caps(&st, ino)?;
        let mut inodes = st.inodes.lock(ino);
        let Some(m) = inodes.get_mut(&ino) else {
            return Ok(None);
        };
        let mut pages = st.cache.lock(ino);
        let dropped = dropped_pages(plan, &pages);
        if !dropped.is_empty() {
            return Ok(Some(Err(dropped)));
        }
        let now = self.now();
        let d = self.write_logging(cred, m, plan, data, caps, now);
        if d.log {
            return Ok(None);
        }
        let blocks = self.write_blocks(plan, staged, data, &pages)?;
        #[cfg(test)]
        run_before_puts_hook(ino);
        crate::fs::txn::retry::changed_memory();
        self.note_dirty(&mut m.inode, first_block(&blocks));
        let marked = pages.put_blocks(blocks, &plan.delalloc);
        debug_assert_eq!(marked, plan.promised, "pages marked as promised");
        drop(pages);
        bump_bytes(&self.stats.data_write_bytes, data.len());
        self.defer_inode_update(m, &d, plan.off + data.len() as u64, now);
        Ok(Some(Ok(data.len())))
    }

    /// Step 3 under the exclusive state lock: a write that maps new blocks, and so logs.
    fn commit_write_exclusive(
        &self,
        cred: Cred,
        plan: &Plan,
        staged: &Staged,
        data: &[u8],
    ) -> FsResult<Result<usize, Vec<u64>>> {
        debug_assert!(!plan.fresh.is_empty(), "an overwrite on the exclusive path");
        let ino = plan.ino;
        let end = plan.off + data.len() as u64;
        let mut st = self.write_state();
        self.load(&mut st, ino)?;
        {
            let pages = st.cache.lock(ino);
            let dropped = dropped_pages(plan, &pages);
            if !dropped.is_empty() {
                return Ok(Err(dropped));
            }
        }
        let caps = self.has_caps(&st, ino)?;
        let now = self.now();
        let Some(m) = st.inodes.get_mut(&ino) else {
            return Err(FsError::NotFound);
        };
        let d = self.write_logging(cred, m, plan, data, caps, now);
        debug_assert!(d.must_log, "new blocks are logged");
        // The transaction begins before anything changes: beginning may give up to wait for
        // log space outside the lock (fs/retry.rs), and an attempt that gave up after it had
        // changed the pages, the inode and its counter would run again, find nothing left to
        // log, and return with that change never logged (seen as a change counter that went
        // back across a clean unmount).
        let mut t = self.begin(&st)?;
        // A direct write's new blocks hold their data already (`write_fresh`).
        let written_end = if plan.direct { plan.last + 1 } else { 0 };
        let allocated = match self.map_reserved(&mut t, ino, &plan.fresh, written_end) {
            Ok(n) => n,
            Err(e) => return Err(t.fail(e)),
        };
        let first_dirty = {
            let mut pages = st.cache.lock(ino);
            let blocks = match self.write_blocks(plan, staged, data, &pages) {
                Ok(b) => b,
                Err(e) => {
                    drop(pages);
                    return Err(t.fail(e));
                }
            };
            crate::fs::txn::retry::changed_memory();
            let first = first_block(&blocks);
            pages.put_blocks(blocks, &[]);
            first
        };
        bump_bytes(&self.stats.data_write_bytes, data.len());
        let Some(m) = st.inodes.get_mut(&ino) else {
            return Err(FsError::NotFound);
        };
        self.note_dirty(&mut m.inode, first_dirty);
        m.change.maybe_increment(true);
        bump(&self.stats.change_bumps);
        m.inode.mtime = now;
        m.inode.ctime = now;
        m.inode.size = m.inode.size.max(end);
        m.inode.blocks += allocated;
        m.inode.mode &= !d.kill;
        if caps {
            if let Err(e) = drop_caps(&mut t, ino) {
                return Err(t.abort(e));
            }
        }
        let Some(m) = st.inodes.get_mut(&ino) else {
            return Err(FsError::NotFound);
        };
        if let Err(e) = log_inode(&mut t, m, &self.stats) {
            return Err(t.abort(e));
        }
        let seq = self.commit(&mut st, t)?;
        if let Some(m) = st.inodes.get_mut(&ino) {
            m.committed(seq, true);
        }
        drop(st);
        if d.kill != 0 {
            self.attrs_changed(ino);
        }
        Ok(Ok(data.len()))
    }

    /// In ordered mode, notes that pages from file block `first` on go into the page cache dirty, so the size the log
    /// holds does not pass the first of them until they are written back.
    pub(crate) fn note_dirty(
        &self,
        inode: &mut crate::fs::items::inode::Inode,
        first: Option<u64>,
    ) {
        if let (DataMode::Ordered, Some(fb)) = (self.opts.data, first) {
            inode.note_dirty(fb * u64::from(self.bs));
        }
    }

    /// Whether a write of `data` by `cred` to `m` logs its inode now, and why.
    fn write_logging(
        &self,
        cred: Cred,
        m: &InodeMem,
        plan: &Plan,
        data: &[u8],
        caps: bool,
        now: Timespec,
    ) -> Logging {
        let end = plan.off + data.len() as u64;
        let ts_changed = m.inode.mtime != now || m.inode.ctime != now;
        let kill = self.privileges_to_kill(cred, &m.inode);
        // A size change alone is not logged now: like a kernel's i_size it is logged with the
        // next transaction of the inode, at fsync, at write back or at unmount (the data it
        // covers is in the page cache anyway). It still counts as a change for the counter.
        // With lazytime new timestamps wait the same way.
        let must_log = self.opts.iversion == IversionMode::Eager
            || (ts_changed && !self.opts.lazytime)
            || !plan.fresh.is_empty()
            || kill != 0
            || caps;
        // Queries take the inode's shard lock, which the caller holds (or the exclusive
        // state lock): none comes between this look and the bump.
        Logging {
            log: must_log || m.change.is_queried(),
            must_log,
            ts_changed,
            size_changed: end > m.inode.size,
            kill,
        }
    }

    /// A write that logs nothing: its new size and times wait in memory for the inode's next
    /// transaction (`unlogged`), as a kernel's i_size does.
    fn defer_inode_update(&self, m: &mut InodeMem, d: &Logging, end: u64, now: Timespec) {
        debug_assert!(!d.log && !m.change.is_queried(), "a logged write deferred");
        bump(&self.stats.change_bumps_skipped);
        if d.size_changed {
            m.inode.size = end;
            m.unlogged = true;
            bump(&self.stats.deferred_size_updates);
        }
        if d.ts_changed {
            m.inode.mtime = now;
            m.inode.ctime = now;
            m.unlogged = true;
        }
    }

    /// The new contents of every page the write puts: the old last block, cached, zeroed from
    /// the old end on (step 2 zeroed it on disk if not cached), and every block the write
    /// covers that the file owned, built from the old contents of its edge blocks (the
    /// cache's, or what step 2 read). All are read before any page is put: a put may trim
    /// the cache, and a page must be read while it is surely there.
    fn write_blocks(
        &self,
        plan: &Plan,
        staged: &Staged,
        data: &[u8],
        pages: &InodePages<'_>,
    ) -> FsResult<FilePages> {
        let bs = u64::from(self.bs);
        let bsz = self.bs as usize;
        let mut out = Vec::new();
        if let Some(tail) = plan.eof.filter(|t| t.cached) {
            let mut block = vec![0u8; bsz];
            if !pages.read(tail.fb, &mut block) {
                // Planned as cached and checked under this hold of the shard.
                return Err(FsError::corrupt(
                    tail.disk,
                    format!("inode {}: block {} not cached", plan.ino, tail.fb),
                ));
            }
            block[tail.from..].fill(0);
            out.push((tail.fb, block));
        }
        // The file's blocks, and the ones this write maps (holes: zeros but for its data),
        // unless a direct write put those on disk.
        let fresh = if plan.direct {
            &[][..]
        } else {
            &plan.fresh[..]
        };
        // And the holes whose pages wait for blocks (delayed allocation).
        let fbs = plan
            .exts
            .iter()
            .chain(fresh)
            .flat_map(|e| e.file.max(plan.first)..e.end().min(plan.last + 1))
            .chain(plan.delalloc.iter().copied());
        for fb in fbs {
            let mut block = vec![0u8; bsz];
            if let Some(edge) = plan.edges.iter().find(|x| x.fb == fb) {
                if !pages.read(fb, &mut block) {
                    let Some((_, b)) = staged.edges.iter().find(|(f, _)| *f == edge.fb) else {
                        // Planned as cached and checked under this hold of the shard.
                        return Err(FsError::corrupt(
                            edge.disk,
                            format!("inode {}: block {fb} neither cached nor read", plan.ino),
                        ));
                    };
                    block.copy_from_slice(b);
                }
                // Past EOF must read as zeros even if an old write left bytes there, up to
                // the write's end: past it may be data a truncate cut off that is not
                // logged yet (the module comment of `space.rs`).
                let eof_in_block = plan.old_size.saturating_sub(fb * bs);
                let end_in_block = (plan.off + data.len() as u64 - fb * bs).min(bs);
                if eof_in_block < end_in_block {
                    block[eof_in_block as usize..end_in_block as usize].fill(0);
                }
            }
            copy_overlap(&mut block, fb * bs, plan.off, data);
            out.push((fb, block));
        }
        Ok(out)
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: run by an overwrite on the shared path of this thread before it puts its
    /// pages (after it decided not to log, or at the publish of one that logs), given the
    /// inode.
    #[allow(clippy::type_complexity)]
    pub(crate) static BEFORE_PUTS: std::cell::RefCell<Option<Box<dyn FnMut(u64)>>> =
        const { std::cell::RefCell::new(None) };
}

/// Tests: runs `BEFORE_PUTS`, if set.
#[cfg(test)]
pub(crate) fn run_before_puts_hook(ino: u64) {
    BEFORE_PUTS.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f(ino);
        }
    });
}

/// Why a write logs its inode or not (`Fs::write_logging`).
#[derive(Debug)]
struct Logging {
    /// The inode is logged now (forced, or the counter was queried since its last bump).
    log: bool,
    /// Logged whatever the counter says (and the counter bumped regardless).
    must_log: bool,
    ts_changed: bool,
    size_changed: bool,
    /// Set-user-ID and set-group-ID bits the write clears.
    kill: u32,
}

/// Edge and old-last pages step 1 found cached that are gone now (trimmed meanwhile).
fn dropped_pages(plan: &Plan, pages: &InodePages<'_>) -> Vec<u64> {
    plan.edges
        .iter()
        .filter(|e| e.cached && !pages.contains(e.fb))
        .map(|e| e.fb)
        .chain(
            plan.eof
                .filter(|t| t.cached && !pages.contains(t.fb))
                .map(|t| t.fb),
        )
        .collect()
}

/// The lowest file block of `blocks`.
fn first_block(blocks: &FilePages) -> Option<u64> {
    blocks.iter().map(|(fb, _)| *fb).min()
}

/// Copies the part of `data` (which starts at byte `data_off` of the file) that falls in `buf`
/// (which holds the file's bytes from `buf_off`).
fn copy_overlap(buf: &mut [u8], buf_off: u64, data_off: u64, data: &[u8]) {
    let s = buf_off.max(data_off);
    let e = (buf_off + buf.len() as u64).min(data_off + data.len() as u64);
    if s < e {
        let (bi, di, n) = (
            (s - buf_off) as usize,
            (s - data_off) as usize,
            (e - s) as usize,
        );
        buf[bi..bi + n].copy_from_slice(&data[di..di + n]);
    }
}

/// Adds `[a, b)` to the speculative ranges of an inode, merged with one it touches; at most
/// 16 are kept (an older one forgotten stays allocated until a truncate or unlink).
fn note_spec_range(ranges: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    if let Some(r) = ranges.iter_mut().find(|r| r.0 <= b && a <= r.1) {
        *r = (r.0.min(a), r.1.max(b));
        return;
    }
    if ranges.len() >= 16 {
        ranges.remove(0);
    }
    ranges.push((a, b));
}

/// Takes `[a, b)` out of the speculative ranges of an inode (fallocate asked for it).
pub(crate) fn forget_spec_range(ranges: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    let mut kept = Vec::with_capacity(ranges.len() + 1);
    for &(x, y) in ranges.iter() {
        if y <= a || b <= x {
            kept.push((x, y));
            continue;
        }
        if x < a {
            kept.push((x, a));
        }
        if b < y {
            kept.push((b, y));
        }
    }
    *ranges = kept;
}
