//! FITRIM: discarding the free blocks of a range (`fstrim`), as XFS and ext4 do.
//!
//! Only blocks that are free in the published free-space trees and neither busy nor reserved
//! are discarded: a block freed by a transaction whose checkpoint is not stable yet is busy
//! (`fs/txn/busy.rs`), and a crash could still give it back to its file; a block freed by a
//! transaction not yet published is not free in the trees at all. The runs chosen are
//! reserved in the busy extents while they are discarded, outside the filesystem lock, so no
//! allocation can take one meanwhile (an optimistic transaction that chose one before is
//! refused at publish, `shared_tx.rs`), and given back after.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::TREE_FREE_BY_BLOCK;
use crate::fs::space::alloc::check_free_extent;
use crate::fs::tree::node::Key;
use crate::fs::txn::Trees;
use crate::fs::Fs;
use cilfs_device::{DeviceError, IoKind};

/// Free runs reserved and discarded at a time: the filesystem lock is held only to choose
/// them, and no more than this many blocks are kept from allocations at once.
const BATCH_RUNS: usize = 64;
const BATCH_BLOCKS: u64 = 1 << 18;

impl Fs {
    /// FITRIM: discards the free blocks of bytes `[start, start+len)` that lie in free runs of
    /// at least `minlen` bytes, and returns how many bytes it discarded. EINVAL (as XFS) for a
    /// start past the end of the filesystem or a length under one block; EOPNOTSUPP if the
    /// device cannot discard; EROFS on a read-only mount.
    pub fn trim(&self, start: u64, len: u64, minlen: u64) -> FsResult<u64> {
        self.op();
        self.check_writable()?;
        let dev = &self.journal.data;
        if !dev.can_discard() {
            return Err(FsError::NotSupported("discard on this device"));
        }
        let bs = u64::from(self.bs);
        let (data_start, data_end) = {
            let st = self.read_state();
            let h = self.hdr(&st);
            (h.data_start, h.data_end)
        };
        if start >= data_end.saturating_mul(bs) {
            return Err(FsError::Invalid(
                "trim start past the end of the filesystem",
            ));
        }
        if len < bs {
            return Err(FsError::Invalid("trim length under one block"));
        }
        // Whole blocks inside the range only.
        let first = start.div_ceil(bs).max(data_start);
        let end = (start.saturating_add(len) / bs).min(data_end);
        let min_blocks = minlen.div_ceil(bs).max(1);
        let mut at = first;
        let mut trimmed = 0u64;
        while at < end {
            let (runs, next) = self.retrying(|| self.reserve_for_trim(at, end, min_blocks))?;
            let mut result = Ok(());
            for &(s, l) in &runs {
                result = dev.discard(s * bs, l * bs);
                if result.is_err() {
                    break;
                }
                trimmed += l;
            }
            {
                let mut b = self.lock_busy();
                for &(s, l) in &runs {
                    b.unreserve(s, l);
                }
            }
            match result {
                Ok(()) => {}
                Err(DeviceError::Unsupported(_)) => {
                    return Err(FsError::NotSupported("discard on this device"))
                }
                Err(DeviceError::Io {
                    kind: IoKind::Discard,
                    ref source,
                    ..
                }) if source.raw_os_error() == Some(libc_eopnotsupp()) => {
                    return Err(FsError::NotSupported("discard on this device"))
                }
                Err(e) => return Err(e.into()),
            }
            at = next;
        }
        Ok(trimmed * bs)
    }

    /// Chooses and reserves up to a batch of free runs of at least `min_blocks` blocks in
    /// `[at, end)`, outside every busy or reserved extent: the runs, and where the next batch
    /// starts. Under the exclusive filesystem lock nothing else makes an extent busy or
    /// reserved (both happen under that lock, shared or exclusive), so what it reads of them
    /// one free extent at a time still holds when it reserves the runs at the end.
    fn reserve_for_trim(
        &self,
        at: u64,
        end: u64,
        min_blocks: u64,
    ) -> FsResult<(Vec<(u64, u64)>, u64)> {
        let st = self.write_state();
        self.lock_busy().prune(self.journal.completed_seq());
        let area = {
            let h = self.hdr(&st);
            (h.data_start, h.data_end, h.bno_root.blkno)
        };
        let mut v = self.view(&st);
        // The free extent holding `at`, if one does, else the first after it.
        let mut found = match v.seek_le(TREE_FREE_BY_BLOCK, Key::new(at, u64::MAX))? {
            Some((k, _)) if k.a.saturating_add(k.b) > at => Some(k),
            _ => v
                .seek_ge(TREE_FREE_BY_BLOCK, Key::new(at, 0))?
                .map(|(k, _)| k),
        };
        let mut runs = Vec::new();
        let mut next = end;
        while let Some(k) = found {
            let (fs, fl) = (k.a, k.b);
            if fs >= end {
                break;
            }
            check_free_extent(area, fs, fl)?;
            let (s, e) = (fs.max(at), (fs + fl).min(end));
            let mut from = s;
            {
                let busy = self.lock_busy();
                for (bs, be) in busy.overlapping(s, e) {
                    if bs > from && bs.min(e) - from >= min_blocks {
                        runs.push((from, bs.min(e) - from));
                    }
                    from = from.max(be);
                    if from >= e {
                        break;
                    }
                }
            }
            if from < e && e - from >= min_blocks {
                runs.push((from, e - from));
            }
            let blocks: u64 = runs.iter().map(|r| r.1).sum();
            if runs.len() >= BATCH_RUNS || blocks >= BATCH_BLOCKS {
                next = (fs + fl).min(end);
                break;
            }
            found = v
                .seek_ge(TREE_FREE_BY_BLOCK, Key::new(fs + fl, 0))?
                .map(|(k, _)| k);
        }
        let mut busy = self.lock_busy();
        for &(s, l) in &runs {
            busy.reserve(s, l);
        }
        Ok((runs, next))
    }
}

fn libc_eopnotsupp() -> i32 {
    rustix::io::Errno::OPNOTSUPP.raw_os_error()
}
