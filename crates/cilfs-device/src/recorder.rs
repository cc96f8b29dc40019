use crate::cache_model::{CacheModel, Survival};
use crate::counters::IoStats;
use crate::image::SparseImage;
use crate::{Device, Result, WriteFlags};
use cilfs_sync::Mutex;
use std::sync::Arc;

/// One recorded device operation, in completion order.
///
/// `issued_at` is the number of operations that had completed when this one was issued: a flush
/// (or a write's PREFLUSH half) makes stable exactly the writes recorded before that position.
#[derive(Debug, Clone)]
pub enum RecordedOp {
    Write {
        offset: u64,
        data: Arc<[u8]>,
        flags: WriteFlags,
        issued_at: usize,
    },
    Flush {
        issued_at: usize,
    },
}

impl RecordedOp {
    /// Whether completing this operation made something stable (a flush/FUA point).
    pub fn is_durability_point(&self) -> bool {
        match self {
            RecordedOp::Flush { .. } => true,
            RecordedOp::Write { flags, .. } => flags.preflush() || flags.fua(),
        }
    }
}

/// Wraps a device and records every write and flush with its flags, so that the image a crash
/// would leave after any prefix of the operations, with any choice of lost volatile writes, can
/// be rebuilt afterwards (what dm-log-writes gives kernel filesystem tests).
#[derive(Debug)]
pub struct RecordingDevice<D> {
    inner: D,
    base: SparseImage,
    ops: Mutex<Vec<RecordedOp>>,
}

impl<D: Device> RecordingDevice<D> {
    /// `base` must be the stable contents of `inner` when recording starts.
    pub fn new(inner: D, base: SparseImage) -> Self {
        Self {
            inner,
            base,
            ops: Mutex::new(Vec::new()),
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn op_count(&self) -> usize {
        self.ops.lock().len()
    }

    pub fn ops(&self) -> Vec<RecordedOp> {
        self.ops.lock().clone()
    }

    /// The crash image after the first `n` operations, the fate of each write still volatile at
    /// that point chosen by `choose(i, sector_count)` (oldest first).
    pub fn crash_image(
        &self,
        n: usize,
        choose: &mut dyn FnMut(usize, usize) -> Survival,
    ) -> SparseImage {
        let ops = self.ops.lock();
        assert!(
            n <= ops.len(),
            "crash point {n} past the {} recorded operations",
            ops.len()
        );
        replay(&self.base, &ops[..n]).crash_image(choose)
    }

    /// The image after the first `n` operations with no write lost: what a reader saw then.
    pub fn image_at(&self, n: usize) -> SparseImage {
        self.crash_image(n, &mut |_, _| Survival::Kept)
    }

    /// Sector counts of the writes still volatile after the first `n` operations, oldest first.
    pub fn volatile_at(&self, n: usize) -> Vec<usize> {
        let ops = self.ops.lock();
        replay(&self.base, &ops[..n.min(ops.len())]).volatile_sector_counts()
    }

    fn record(&self, op: RecordedOp) {
        self.ops.lock().push(op);
    }

    /// A write issued when `issued_at` operations had completed, completing now: for a caller
    /// that holds an operation between its issue and its completion (latency).
    pub fn write_issued(
        &self,
        issued_at: usize,
        offset: u64,
        buf: &[u8],
        flags: WriteFlags,
    ) -> Result<()> {
        self.inner.write(offset, buf, flags)?;
        self.record(RecordedOp::Write {
            offset,
            data: Arc::from(buf),
            flags,
            issued_at,
        });
        Ok(())
    }

    /// A flush issued when `issued_at` operations had completed, completing now.
    pub fn flush_issued(&self, issued_at: usize) -> Result<()> {
        self.inner.flush()?;
        self.record(RecordedOp::Flush { issued_at });
        Ok(())
    }
}

fn replay(base: &SparseImage, ops: &[RecordedOp]) -> CacheModel {
    let mut cache = CacheModel::new(base.clone());
    for (i, op) in ops.iter().enumerate() {
        match op {
            RecordedOp::Write {
                offset,
                data,
                flags,
                issued_at,
            } => {
                if flags.preflush() {
                    cache.stabilize_before(*issued_at as u64);
                }
                if flags.fua() {
                    cache.write_stable(*offset, data);
                } else {
                    cache.write_volatile(i as u64, *offset, data);
                }
            }
            RecordedOp::Flush { issued_at } => cache.stabilize_before(*issued_at as u64),
        }
    }
    cache
}

impl<D: Device> Device for RecordingDevice<D> {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read(offset, buf)
    }

    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()> {
        self.write_issued(self.op_count(), offset, buf, flags)
    }

    fn flush(&self) -> Result<()> {
        self.flush_issued(self.op_count())
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}
