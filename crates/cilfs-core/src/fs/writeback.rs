//! Write back: dirty pages of the daemon's page cache to their blocks, sizes grown in memory to
//! the log, fsync, sync and the clean unmount.

use super::error::FsResult;
use super::extent::extents_in;
use super::stats::bump;
use super::{log_inode, Fs, FsState};
use cilfs_device::AlignedBuf;

impl Fs {
    /// Writes dirty pages of `ino` (or all) back in place, in disk order, adjacent blocks in one
    /// IO.
    pub(crate) fn writeback(&self, st: &mut FsState, ino: Option<u64>) -> FsResult<()> {
        self.write_pages(st, ino)?;
        self.log_unlogged(st, ino)
    }

    /// Logs inodes whose in-memory size ran ahead of the log (after their pages were written:
    /// a logged size never covers data that is only in memory).
    fn log_unlogged(&self, st: &mut FsState, ino: Option<u64>) -> FsResult<()> {
        let mut todo: Vec<u64> = match ino {
            Some(i) => st
                .inodes
                .get(&i)
                .filter(|m| m.unlogged)
                .map(|_| i)
                .into_iter()
                .collect(),
            None => st
                .inodes
                .iter()
                .filter(|(_, m)| m.unlogged)
                .map(|(&i, _)| i)
                .collect(),
        };
        todo.sort_unstable();
        for batch in todo.chunks(16) {
            self.with_tx(st, |t, inodes| {
                for &i in batch {
                    if let Some(m) = inodes.get_mut(&i) {
                        log_inode(t, m, &self.stats)?;
                    }
                }
                Ok(((), batch.to_vec()))
            })?;
        }
        Ok(())
    }

    fn write_pages(&self, st: &mut FsState, ino: Option<u64>) -> FsResult<()> {
        let pages = st.cache.take_dirty(ino);
        if pages.is_empty() {
            return Ok(());
        }
        let mut runs: Vec<(u64, Box<[u8]>)> = Vec::with_capacity(pages.len());
        {
            let mut v = self.view(st);
            for (i, fb, data) in pages {
                let e = extents_in(&mut v, i, fb, fb + 1)?;
                match e.first() {
                    Some(e) if e.file <= fb && fb < e.end() => {
                        runs.push((e.disk + (fb - e.file), data))
                    }
                    // Unmapped meanwhile (its pages are dropped first, so this is a bug).
                    _ => debug_assert!(false, "dirty page of inode {i} block {fb} has no block"),
                }
            }
        }
        runs.sort_by_key(|(d, _)| *d);
        let bsz = self.bs as usize;
        let mut at = 0;
        while at < runs.len() {
            let mut end = at + 1;
            while end < runs.len() && runs[end].0 == runs[end - 1].0 + 1 && end - at < 256 {
                end += 1;
            }
            let mut buf = AlignedBuf::zeroed((end - at) * bsz);
            for (k, (_, d)) in runs[at..end].iter().enumerate() {
                buf[k * bsz..(k + 1) * bsz].copy_from_slice(d);
            }
            self.write_blocks(runs[at].0, &buf)?;
            at = end;
        }
        Ok(())
    }

    /// Writes every dirty page back (the periodic flush of the daemon, and unmount).
    pub fn writeback_all(&self) -> FsResult<()> {
        let mut st = self.write_state();
        self.writeback(&mut st, None)
    }

    /// Clean unmount: dirty pages written back, then the journal's unmount (log forced, items
    /// written back, unmount record).
    pub fn unmount(&self) -> FsResult<()> {
        self.writeback_all()?;
        self.journal.unmount()?;
        Ok(())
    }
    /// fsync/fdatasync: the inode's last checkpoint is made stable (its data-device flush comes
    /// first), then the data device is flushed for overwrites done since (elided when nothing
    /// is volatile).
    pub fn fsync(&self, ino: u64) -> FsResult<()> {
        bump(&self.stats.operations);
        bump(&self.stats.fsyncs);
        let seq = {
            let mut st = self.write_state();
            self.writeback(&mut st, Some(ino))?;
            st.inodes.get(&ino).map_or(0, |m| m.last_seq)
        };
        if seq > self.journal.completed_seq() {
            self.journal.force(seq)?;
        }
        self.journal.data.flush()?;
        Ok(())
    }

    /// syncfs: everything committed becomes stable.
    pub fn sync(&self) -> FsResult<()> {
        bump(&self.stats.operations);
        self.writeback_all()?;
        self.journal.force_all()?;
        self.journal.data.flush()?;
        Ok(())
    }
}
