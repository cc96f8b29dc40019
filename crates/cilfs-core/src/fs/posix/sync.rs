//! Write back: dirty pages of the daemon's page cache to their blocks, sizes grown in memory to
//! the log, fsync, sync and the clean unmount. Each inode is written back under its own IO lock
//! (exclusive), with the data IO outside the filesystem lock.

use crate::fs::cache::iolock::IoMode;
use crate::fs::cache::pagecache::PageData;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::extent::Extent;
use crate::fs::items::inode::NOT_DIRTY;
use crate::fs::space::map::extents_in;
use crate::fs::stats::{bump, bump_bytes};
use crate::fs::types::ShutdownMode;
use crate::fs::{log_inode, AllShards, Fs, FsTx};
use cilfs_device::AlignedBuf;
use std::cell::RefCell;

/// Blocks of file data one transaction of `Fs::log_runs` logs.
const LOG_BLOCKS_PER_TX: usize = 16;
/// `Fs::logged_blocks_per_inode` on a large log.
const LOGGED_PER_INODE_MAX: u64 = 256;

/// The most bytes of adjacent blocks `Fs::write_runs` gathers into one IO.
const GATHER_BYTES: usize = 1 << 20;

cilfs_sync::thread_local! {
    /// `Fs::write_runs`'s gather buffer, kept between calls: allocated afresh for every IO it
    /// reached memory that the kernel faults in and zeroes.
    static GATHER: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// A dirty page to write back.
struct Run {
    disk: u64,
    fb: u64,
    data: PageData,
    /// In an unwritten extent: marked written once on disk.
    unwritten: bool,
    /// A page written into a hole (delayed allocation; `unwritten` too): its block was
    /// chosen by this write back, and is mapped written once on disk.
    fresh: bool,
}

impl Fs {
    /// Writes `ino`'s dirty pages back in place (the IO outside the filesystem lock), then
    /// logs its in-memory size. The caller holds `ino`'s IO lock exclusively, so no write adds
    /// pages or grows the size between the two, and an fsync of it waits for write back
    /// already in flight instead of finding the pages taken and returning early.
    pub(crate) fn writeback_locked(&self, ino: u64) -> FsResult<()> {
        self.writeback_inode(ino, true, None)
    }

    /// `writeback_locked`; with `wait` false only as many pages as the inode's project has the
    /// budget for now are written (the rest stay dirty, and its size unlogged), so the thread
    /// writing back for everyone never waits for a throttled tenant. `fsync`: for an fsync
    /// (`Some(datasync)`), whose few pages may go into the log (`split_logged`).
    fn writeback_inode(&self, ino: u64, wait: bool, fsync: Option<bool>) -> FsResult<()> {
        // After a shutdown no data is written either: the pages are lost with the mount.
        if self.journal.is_shut_down() {
            return Err(FsError::Journal(crate::journal::JournalError::Shutdown));
        }
        let (project, taken, fresh) = self.take_runs(ino)?;
        let r = self.write_back_runs(ino, project, taken, wait, fsync);
        // Chosen blocks now mapped are the file's; the others are free again.
        self.unreserve(&fresh);
        r
    }

    /// `writeback_inode` for the pages taken.
    fn write_back_runs(
        &self,
        ino: u64,
        project: u32,
        taken: Vec<Run>,
        wait: bool,
        fsync: Option<bool>,
    ) -> FsResult<()> {
        let (mut logged, mut runs) = self.split_logged(ino, taken, fsync);
        // Data into the log is charged to its tenant as data in place would be.
        if !logged.is_empty() {
            self.admit_write(project, logged.len() * self.bs as usize);
        }
        let (done, written) = self.write_runs(project, &runs, wait);
        if done > 0 || written.is_err() {
            self.unflushed.lock().insert(ino);
        }
        let mut left = runs.split_off(done);
        // `runs` from here: pages on disk or in the log.
        let logged = match self.log_runs(ino, &mut logged) {
            Ok(()) => {
                runs.extend(logged);
                Ok(())
            }
            Err(e) => {
                left.extend(logged);
                Err(e)
            }
        };
        // Blocks of unwritten extents now on disk: marked written, or their pages stay dirty
        // (on disk they still read as zeros).
        let settled = left.is_empty() && written.is_ok() && logged.is_ok();
        if let Err(e) = self.convert_runs(ino, &runs, settled) {
            left.extend(runs.into_iter().filter(|r| r.unwritten));
            self.redirty(ino, left);
            return Err(e);
        }
        let all_written = left.is_empty();
        if !all_written {
            self.redirty(ino, left);
        }
        written?;
        logged?;
        if !all_written {
            return Ok(());
        }
        // Every page is on disk now (the caller's IO lock keeps writes out): the size the log
        // holds may cover all of the file.
        if let Some(m) = self.read_state().inodes.lock(ino).get_mut(&ino) {
            m.inode.dirty_from = NOT_DIRTY;
        }
        self.log_unlogged(ino)
    }

    /// Splits pages taken for write back into those that go into the log (first) and those
    /// written in place. A block the log holds already goes through it again
    /// (`journal/logged_data.rs`); an fsync's pages go there all when they are few
    /// (`FsOptions::log_data_max`), the fsync writes a log record anyway (new blocks to mark
    /// written, or a change it must force: an overwrite that fdatasync need not force is
    /// cheaper in place, one write and one flush), and the inode's share of the logged path
    /// has room.
    fn split_logged(&self, ino: u64, runs: Vec<Run>, fsync: Option<bool>) -> (Vec<Run>, Vec<Run>) {
        let (Some(lo), Some(hi)) = (runs.first(), runs.last()) else {
            return (Vec::new(), runs);
        };
        let n = runs.len();
        if let Some(datasync) =
            fsync.filter(|_| n as u64 * u64::from(self.bs) <= self.opts.log_data_max)
        {
            if (runs.iter().any(|r| r.unwritten) || self.fsync_forces_log(ino, datasync))
                && self.journal.logged_data_of(ino) + n <= self.logged_blocks_per_inode()
                && self.journal.may_log_data(n)
            {
                return (runs, Vec::new());
            }
        }
        // `runs` are in disk order.
        let held = self.journal.logged_data_in(lo.disk, hi.disk + 1);
        if held.is_empty() {
            return (Vec::new(), runs);
        }
        runs.into_iter()
            .partition(|r| held.binary_search(&r.disk).is_ok())
    }

    /// Whether an fsync (`datasync`: an fdatasync) of `ino` forces a checkpoint whatever its
    /// pages: its size is ahead of the log, or its last change is not stable.
    fn fsync_forces_log(&self, ino: u64, datasync: bool) -> bool {
        let done = self.journal.completed_seq();
        self.read_state()
            .inodes
            .lock(ino)
            .get(&ino)
            .is_some_and(|m| {
                m.unlogged
                    || if datasync {
                        m.last_data_seq
                    } else {
                        m.last_seq
                    } > done
            })
    }

    /// The most blocks logged for one inode the logged path holds: freeing the inode's
    /// blocks cancels each in one transaction (`FsTx::free_extent`), which must stay well
    /// inside the largest reservation the log grants.
    pub(crate) fn logged_blocks_per_inode(&self) -> usize {
        let per_block = u64::from(self.bs) + 64;
        (self.journal.max_reservation_bytes() / 4 / per_block).min(LOGGED_PER_INODE_MAX) as usize
    }

    /// Puts the pages of `runs` into the log as images of their whole blocks, up to
    /// `LOG_BLOCKS_PER_TX` a transaction, and raises the inode's checkpoint to theirs, so
    /// that its fsync and fdatasync force them. The blocks are on the logged path from then
    /// on (`Journal::note_logged_data`): the AIL writes them in place.
    /// Pages written into holes are mapped in the transactions that log them (and are no
    /// longer `fresh` once they are): mapped after, the allocation would take their blocks
    /// off the logged path (`forget_logged_data`) with their images still to land.
    fn log_runs(&self, ino: u64, runs: &mut [Run]) -> FsResult<()> {
        let blocks: Vec<(u64, &[u8])> = runs
            .iter()
            .filter(|r| !r.fresh)
            .map(|r| (r.disk, &r.data[..]))
            .collect();
        self.log_blocks(ino, &blocks)?;
        let mut fresh: Vec<&mut Run> = runs.iter_mut().filter(|r| r.fresh).collect();
        for chunk in fresh.chunks_mut(LOG_BLOCKS_PER_TX) {
            self.log_fresh(ino, chunk)?;
        }
        Ok(())
    }

    /// Logs the pages of `chunk`, written into holes, as images of their blocks in one
    /// transaction with the mapping of those blocks, written.
    fn log_fresh(&self, ino: u64, chunk: &mut [&mut Run]) -> FsResult<()> {
        let exts = fresh_extents(chunk.iter().map(|r| &**r));
        self.retrying(|| {
            let mut st = self.write_state();
            self.with_tx(&mut st, |t, inodes| {
                self.map_fresh_in(t, inodes, ino, &exts, false)?;
                for r in chunk.iter() {
                    log_image(t, ino, r.disk, &r.data)?;
                }
                Ok(((), vec![ino]))
            })
        })?;
        self.logged(ino, chunk.iter().map(|r| r.disk));
        let fbs: Vec<u64> = chunk.iter().map(|r| r.fb).collect();
        self.unmark_mapped(ino, &fbs);
        for r in chunk.iter_mut() {
            r.fresh = false;
            r.unwritten = false;
        }
        Ok(())
    }

    /// `log_runs` for blocks `(disk block, contents)` of inode `ino`.
    pub(crate) fn log_blocks(&self, ino: u64, blocks: &[(u64, &[u8])]) -> FsResult<()> {
        for chunk in blocks.chunks(LOG_BLOCKS_PER_TX) {
            self.retrying(|| {
                self.with_writeback_tx(&[ino], |_, t, _| {
                    for &(disk, data) in chunk {
                        log_image(t, ino, disk, data)?;
                    }
                    Ok(((), Vec::new()))
                })
            })?;
            self.logged(ino, chunk.iter().map(|&(d, _)| d));
        }
        Ok(())
    }

    /// After the commit that logged images of `disks` for `ino`: they are on the logged path,
    /// and the inode's checkpoint is raised to theirs (the sequence open now is at least the
    /// one the commit went into).
    fn logged(&self, ino: u64, disks: impl ExactSizeIterator<Item = u64>) {
        let n = disks.len();
        self.journal.note_logged_data(ino, disks);
        let seq = self.journal.current_seq();
        if let Some(m) = self.read_state().inodes.lock(ino).get_mut(&ino) {
            m.committed(seq, true);
        }
        bump_bytes(&self.stats.data_logged_bytes, n * self.bs as usize);
    }

    /// Puts pages taken for write back in the cache dirty again: what the budget leaves for
    /// later, or what a failed write or conversion did not finish (taken pages are marked
    /// clean; dropped, a later fsync would find nothing to write and succeed). Under the
    /// inode's IO lock (held by the caller), so no write put newer pages.
    /// A page written into a hole keeps its delayed allocation mark (its block, chosen by
    /// this write back, is free again).
    fn redirty(&self, ino: u64, runs: Vec<Run>) {
        let st = self.read_state();
        let mut pages = st.cache.lock(ino);
        for r in runs {
            pages.put_dirty(r.fb, &r.data);
        }
    }

    /// Marks the blocks of written `runs` that were unwritten written, in runs of adjacent
    /// file blocks, and maps those written into holes; `settled`: they were the file's last
    /// dirty pages (`convert_written`).
    fn convert_runs(&self, ino: u64, runs: &[Run], settled: bool) -> FsResult<()> {
        let fresh: Vec<&Run> = runs.iter().filter(|r| r.fresh).collect();
        let unwritten = runs.iter().any(|r| r.unwritten && !r.fresh);
        if !fresh.is_empty() {
            self.map_written_fresh(ino, &fresh, settled && !unwritten)?;
        }
        let mut fbs: Vec<u64> = runs
            .iter()
            .filter(|r| r.unwritten && !r.fresh)
            .map(|r| r.fb)
            .collect();
        fbs.sort_unstable();
        let ranges = adjacent_ranges(&fbs);
        for (i, &(from, to)) in ranges.iter().enumerate() {
            self.convert_written(ino, from, to, settled && i + 1 == ranges.len())?;
        }
        Ok(())
    }

    /// Writes back every inode with dirty pages or a size ahead of the log, one at a time.
    /// With `wait` false an inode whose IO lock is held (a write or a read in flight) is left
    /// for the next round, so a slow inode never holds up the others.
    fn writeback_inodes(&self, wait: bool, except: Option<u64>) -> FsResult<()> {
        let inos = {
            let st = self.read_state();
            let mut v = st.cache.dirty_inodes();
            st.inodes.for_each_shard(|t| {
                v.extend(t.iter().filter(|(_, m)| m.unlogged).map(|(&i, _)| i));
            });
            v.sort_unstable();
            v.dedup();
            v
        };
        for ino in inos.into_iter().filter(|&i| Some(i) != except) {
            let guard = if wait {
                Some(self.io.lock(ino, IoMode::Exclusive))
            } else {
                self.io.try_lock(ino, IoMode::Exclusive)
            };
            if guard.is_some() {
                self.writeback_inode(ino, wait, None)?;
            }
        }
        Ok(())
    }

    /// Whether the page cache holds more dirty pages than it should.
    pub(crate) fn over_dirty_limit(&self) -> bool {
        let st = self.read_state();
        st.cache.dirty_pages() > st.cache.dirty_limit
    }

    /// Memory pressure met by a writer of `ino` (whose IO lock it holds): its own pages, and
    /// those of inodes no one else is using.
    pub(crate) fn writeback_pressure(&self, ino: u64) -> FsResult<()> {
        self.writeback_locked(ino)?;
        self.writeback_inodes(false, Some(ino))
    }

    /// Logs `ino`'s inode if its in-memory copy ran ahead of the log (after its pages were
    /// written: in ordered mode a logged size never covers data that is only in memory,
    /// `Inode::ordered_size`). Built and published
    /// optimistically (`shared_tx.rs`): an fsync takes no lock another inode needs.
    fn log_unlogged(&self, ino: u64) -> FsResult<()> {
        let unlogged = |fs: &Fs| {
            fs.read_state()
                .inodes
                .lock(ino)
                .get(&ino)
                .is_some_and(|m| m.unlogged)
        };
        if !unlogged(self) {
            return Ok(());
        }
        self.retrying(|| {
            self.with_writeback_tx(&[ino], |st, t, sc| {
                let m = sc.load(st, t, ino)?;
                if m.unlogged {
                    log_inode(t, m, &self.stats)?;
                }
                Ok(((), vec![ino]))
            })
        })?;
        debug_assert!(
            !unlogged(self),
            "inode {ino} still unlogged after its write back"
        );
        Ok(())
    }

    /// Takes `ino`'s dirty pages from the cache with the blocks they go to, in disk order,
    /// and the project their IO is charged to: under the state lock taken shared (the
    /// caller's exclusive IO lock keeps the pages and the mapping still), the mapping looked
    /// up before any page is taken, since after that the run can no longer give up.
    /// Also the blocks chosen for its pages written into holes (`choose_fresh`), which the
    /// caller gives back with `unreserve` once their mapping committed or failed.
    fn take_runs(&self, ino: u64) -> FsResult<(u32, Vec<Run>, Vec<Extent>)> {
        let fresh = self.retrying(|| self.choose_fresh(ino))?;
        let r = self.retrying(|| {
            let st = self.read_state();
            let project = st.inodes.lock(ino).get(&ino).map_or(0, |m| m.inode.project);
            let fbs = st.cache.dirty_blocks(ino);
            let (Some(&lo), Some(&hi)) = (fbs.first(), fbs.last()) else {
                return Ok((project, Vec::new()));
            };
            let exts = extents_in(&mut self.view(&st), ino, lo, hi + 1)?;
            // Pages taken must be written: no giving up after this.
            crate::fs::txn::retry::changed_memory();
            let pages = st.cache.take_dirty(ino);
            let mut runs: Vec<Run> = Vec::with_capacity(pages.len());
            // Both in ascending file order, as the pages are: one pass over each.
            let (mut e, mut f) = (exts.iter().peekable(), fresh.iter().peekable());
            for (i, fb, data) in pages {
                let (x, fresh) = match covering(&mut e, fb) {
                    Some(x) => (x, false),
                    None => match covering(&mut f, fb) {
                        Some(x) => (x, true),
                        // Pages over holes are marked, and every marked one got a block.
                        None => {
                            debug_assert!(false, "dirty page of inode {i} block {fb} has no block");
                            continue;
                        }
                    },
                };
                runs.push(Run {
                    disk: x.disk + (fb - x.file),
                    fb,
                    data,
                    unwritten: x.unwritten || fresh,
                    fresh,
                });
            }
            runs.sort_by_key(|r| r.disk);
            Ok((project, runs))
        });
        match r {
            Ok((project, runs)) => Ok((project, runs, fresh)),
            Err(e) => {
                self.unreserve(&fresh);
                Err(e)
            }
        }
    }

    /// Chooses blocks for `ino`'s pages written into holes, contiguous for adjacent pages,
    /// and reserves them (`reserve_holes`). Under the exclusive lock, as a write that maps its
    /// holes plans them: no commit beside it allocates from the trees the choice reads.
    fn choose_fresh(&self, ino: u64) -> FsResult<Vec<Extent>> {
        let fbs = self.read_state().cache.delalloc_blocks(ino);
        if fbs.is_empty() {
            return Ok(Vec::new());
        }
        let st = self.write_state();
        let mut out = Vec::new();
        for (from, to) in adjacent_ranges(&fbs) {
            match self.reserve_holes(&st, &[], from, to) {
                Ok(v) => out.extend(v),
                Err(e) => {
                    self.unreserve(&out);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Maps the blocks chosen for pages written into holes (`fresh` runs, on disk now)
    /// written, at most 16 extents a transaction, each with the inode logged and its block
    /// count raised, and takes their delayed allocation off the pages.
    fn map_written_fresh(&self, ino: u64, runs: &[&Run], settled: bool) -> FsResult<()> {
        let exts = fresh_extents(runs.iter().copied());
        let batches: Vec<&[Extent]> = exts.chunks(16).collect();
        for (i, batch) in batches.iter().enumerate() {
            let last = i + 1 == batches.len();
            self.retrying(|| {
                let mut st = self.write_state();
                self.with_tx(&mut st, |t, inodes| {
                    self.map_fresh_in(t, inodes, ino, batch, settled && last)?;
                    Ok(((), vec![ino]))
                })
            })?;
            let fbs: Vec<u64> = batch.iter().flat_map(|e| e.file..e.end()).collect();
            self.unmark_mapped(ino, &fbs);
        }
        Ok(())
    }

    /// In `t`: maps `exts`, blocks chosen for `ino`'s pages written into holes, written, with
    /// the inode's block count raised and the inode logged; `settled`: those were its last
    /// dirty pages.
    fn map_fresh_in(
        &self,
        t: &mut FsTx<'_>,
        inodes: &mut AllShards<'_>,
        ino: u64,
        exts: &[Extent],
        settled: bool,
    ) -> FsResult<()> {
        let n = self.map_reserved(t, ino, exts, u64::MAX)?;
        let m = Fs::inode_mut(t, inodes, ino)?;
        m.inode.blocks += n;
        if settled {
            m.inode.dirty_from = NOT_DIRTY;
        }
        log_inode(t, m, &self.stats)?;
        Ok(())
    }

    /// Writes pages to their blocks, adjacent blocks in one IO, charged to `project`. With
    /// `wait` false it stops at the first IO the project has no budget for now. Returns how
    /// many of `runs` were written (those before the first IO not made or failed on) and
    /// whether an IO failed.
    fn write_runs(&self, project: u32, runs: &[Run], wait: bool) -> (usize, FsResult<()>) {
        let bsz = self.bs as usize;
        let per_io = (GATHER_BYTES / bsz).max(1);
        let mut buf = GATHER
            .with(|g| g.borrow_mut().take())
            .filter(|b| b.len() >= per_io * bsz)
            .unwrap_or_else(|| AlignedBuf::zeroed(per_io * bsz));
        let mut at = 0;
        let mut result = Ok(());
        while at < runs.len() {
            let mut end = at + 1;
            while end < runs.len() && runs[end].disk == runs[end - 1].disk + 1 && end - at < per_io
            {
                end += 1;
            }
            for (k, r) in runs[at..end].iter().enumerate() {
                buf[k * bsz..(k + 1) * bsz].copy_from_slice(&r.data);
            }
            let io = &buf[..(end - at) * bsz];
            let made = match wait {
                true => self.data_write(project, runs[at].disk, io).map(|()| true),
                false => self.data_try_write(project, runs[at].disk, io),
            };
            match made {
                Ok(true) => at = end,
                Ok(false) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        GATHER.with(|g| *g.borrow_mut() = Some(buf));
        (at, result)
    }

    /// Writes every dirty page back, waiting for inodes in use (sync and unmount).
    pub fn writeback_all(&self) -> FsResult<()> {
        self.writeback_inodes(true, None)
    }

    /// The periodic flush: every dirty page of inodes not in use right now (a write, read or
    /// write back in flight); those are written by their own fsync or the next round.
    pub fn writeback_idle(&self) -> FsResult<()> {
        self.writeback_inodes(false, None)
    }

    /// Clean unmount: dirty pages written back, then the journal's unmount (log forced, items
    /// written back, unmount record).
    pub fn unmount(&self) -> FsResult<()> {
        self.writeback_all()?;
        self.journal.unmount()?;
        Ok(())
    }
    /// A remount: `true` refuses every change from now on (EROFS), writes every dirty page
    /// back and leaves the journal clean (log forced, items written back, unmount record),
    /// after which nothing is written; a crash then replays nothing. `false` opens the journal
    /// for writes again and lets changes in. A mount made read-only (`FsOptions::read_only`)
    /// was opened over devices that write nothing and stays read-only.
    pub fn set_read_only(&self, ro: bool) -> FsResult<()> {
        use std::sync::atomic::Ordering;
        if self.opts.read_only && !ro {
            return Err(FsError::ReadOnly);
        }
        if !ro {
            self.journal.thaw()?;
            self.read_only.store(false, Ordering::Release);
            return Ok(());
        }
        if self.read_only.swap(true, Ordering::AcqRel) && self.journal.is_frozen() {
            return Ok(());
        }
        // Changes check the flag under the state lock: once we have held it, every change
        // that got past the check has committed. (A write into the page cache that checked
        // before the flag could still add pages after the write back below; the kernel's own
        // read-only remount refuses while a file is open for writing, so none is under way.)
        drop(self.write_state());
        let r = self
            .writeback_all()
            .and_then(|()| self.journal.freeze().map_err(FsError::from));
        if r.is_err() && !self.opts.read_only {
            self.read_only.store(false, Ordering::Release);
        }
        r
    }

    /// fsync: the inode's last checkpoint is made stable (its data-device flush comes
    /// first), then the data device is flushed for overwrites done since (elided when nothing
    /// is volatile).
    pub fn fsync(&self, ino: u64) -> FsResult<()> {
        self.sync_inode(ino, false)
    }

    /// fdatasync: `fsync`, but a checkpoint that changed only the inode's timestamps and
    /// change counter need not be stable (`InodeMem::last_data_seq`), as on XFS and ext4: an
    /// overwrite that moved the mtime costs a data write and one flush, no log write.
    pub fn fdatasync(&self, ino: u64) -> FsResult<()> {
        self.sync_inode(ino, true)
    }

    fn sync_inode(&self, ino: u64, datasync: bool) -> FsResult<()> {
        bump(&self.stats.operations);
        bump(&self.stats.fsyncs);
        let (seq, in_place) = {
            let _io = self.io.lock(ino, IoMode::Exclusive);
            self.writeback_inode(ino, true, Some(datasync))?;
            let st = self.read_state();
            let seq = st.inodes.lock(ino).get(&ino).map_or(0, |m| {
                if datasync {
                    m.last_data_seq
                } else {
                    m.last_seq
                }
            });
            // Taken under the IO lock: a write in place after it marks the inode again.
            (seq, self.unflushed.lock().remove(&ino))
        };
        let forced = match seq > self.journal.completed_seq() {
            true => self.journal.force(seq).map_err(FsError::from),
            false => Ok(()),
        };
        // Data written in place since the last flush for this inode (overwrites, which no
        // checkpoint orders): one flush of the data device. Data in the log needs none.
        let r = forced.and_then(|()| match in_place {
            true => self.journal.data.flush().map_err(FsError::from),
            false => Ok(()),
        });
        if r.is_err() && in_place {
            // Not known flushed: the next fsync flushes again.
            self.unflushed.lock().insert(ino);
        }
        r
    }

    /// Shuts the filesystem down (XFS_IOC_GOINGDOWN): after `mode`'s flushes nothing more is
    /// written, every operation fails (EIO), and the next mount recovers from the log.
    pub fn shutdown(&self, mode: ShutdownMode) -> FsResult<()> {
        bump(&self.stats.operations);
        let flushed = match mode {
            ShutdownMode::Default => self.sync(),
            ShutdownMode::LogFlush => self.journal.force_all().map_err(FsError::from),
            ShutdownMode::NoLogFlush => Ok(()),
        };
        // Down whatever the flush did: a failed flush shut the journal down already.
        self.journal.shut_down_on_request();
        flushed
    }

    /// syncfs: everything committed becomes stable.
    pub fn sync(&self) -> FsResult<()> {
        bump(&self.stats.operations);
        self.writeback_all()?;
        // Writes in place that completed before the flush below: covered by it.
        let covered = std::mem::take(&mut *self.unflushed.lock());
        let r = self
            .journal
            .force_all()
            .map_err(FsError::from)
            .and_then(|()| self.journal.data.flush().map_err(FsError::from));
        if r.is_err() {
            self.unflushed.lock().extend(covered);
        }
        r
    }
}

/// The extents (written) that map `runs` to their blocks, adjacent ones merged.
fn fresh_extents<'a>(runs: impl Iterator<Item = &'a Run>) -> Vec<Extent> {
    let mut sorted: Vec<&Run> = runs.collect();
    sorted.sort_by_key(|r| r.fb);
    let mut exts: Vec<Extent> = Vec::new();
    for r in sorted {
        match exts.last_mut() {
            Some(e) if e.end() == r.fb && e.disk + e.len == r.disk => e.len += 1,
            _ => exts.push(Extent {
                file: r.fb,
                disk: r.disk,
                len: 1,
                unwritten: false,
            }),
        }
    }
    exts
}

/// The extent of `exts` (ascending, not overlapping) that maps file block `fb`, skipping those
/// that end before it: called with ascending blocks, one pass over `exts` serves them all.
fn covering<'a>(
    exts: &mut std::iter::Peekable<std::slice::Iter<'a, Extent>>,
    fb: u64,
) -> Option<&'a Extent> {
    while exts.peek().is_some_and(|x| x.end() <= fb) {
        exts.next();
    }
    exts.peek().copied().filter(|x| x.file <= fb)
}

/// Sorted file blocks as ranges `[from, to)` of adjacent ones.
fn adjacent_ranges(fbs: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &fb in fbs {
        match out.last_mut() {
            Some(r) if r.1 == fb => r.1 = fb + 1,
            _ => out.push((fb, fb + 1)),
        }
    }
    out
}

/// Logs `data` as the whole image of file data block `disk` of `ino` in `t`.
fn log_image(t: &mut FsTx<'_>, ino: u64, disk: u64, data: &[u8]) -> FsResult<()> {
    let b = t.tx.buf_fresh(disk)?;
    // A block of the file's own: a stamp offset left from a tree node means it is mapped twice.
    if t.tx.lsn_offset(b).is_some() {
        return Err(FsError::corrupt(
            disk,
            format!("block {disk} of inode {ino} keeps an LSN stamp offset"),
        ));
    }
    t.tx.write(b, 0, data);
    Ok(())
}
