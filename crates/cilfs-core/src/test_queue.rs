//! Test doubles for the asynchronous write path: a write queue over the simulated device whose
//! writes reach it only when completed, late and out of order, so that a crash snapshot taken
//! meanwhile has lost them (the log writer's body iclogs and the AIL's write back both use it).

use cilfs_device::{
    Device, DeviceError, IoStats, QueuedBuf, QueuedWrite, SimDevice, WriteFlags, WriteQueue,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A write queue over a simulated device whose writes complete only when the writer waits, all
/// at once and newest first: as late and as out of order as a real queue may complete them.
#[derive(Debug)]
struct LateQueue {
    dev: Arc<SimDevice>,
    in_flight: Arc<AtomicUsize>,
    merged: Arc<AtomicUsize>,
    queued: Vec<(u64, Vec<QueuedBuf>)>,
    /// Without waiting, completes every write but the oldest (which stays in flight until the
    /// writer waits): a free iclog exists although the next one in ring order is busy.
    oldest_last: bool,
}

impl LateQueue {
    /// Completes the queued writes from index `from` of `queued` on, newest first.
    fn complete_range(&mut self, from: usize) -> cilfs_device::Result<Vec<QueuedWrite>> {
        let mut out = Vec::new();
        while self.queued.len() > from {
            let Some((offset, parts)) = self.queued.pop() else {
                break;
            };
            let mut at = offset;
            for p in parts {
                self.dev
                    .write(at, &p.buf[p.range.clone()], WriteFlags::NONE)?;
                at += p.range.len() as u64;
                out.push(QueuedWrite {
                    tag: p.tag,
                    buf: p.buf,
                    result: Ok(()),
                });
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(out)
    }
}

impl WriteQueue for LateQueue {
    fn submit(
        &mut self,
        offset: u64,
        parts: Vec<QueuedBuf>,
    ) -> Result<(), (Vec<QueuedBuf>, DeviceError)> {
        if parts.len() > 1 {
            self.merged.fetch_add(1, Ordering::SeqCst);
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.queued.push((offset, parts));
        Ok(())
    }

    fn complete(&mut self, wait: bool) -> cilfs_device::Result<Vec<QueuedWrite>> {
        match (wait, self.oldest_last) {
            (true, _) => self.complete_range(0),
            (false, true) => self.complete_range(1),
            (false, false) => Ok(Vec::new()),
        }
    }

    fn in_flight(&self) -> usize {
        self.queued.len()
    }
}

/// The simulated device, with a [`LateQueue`]; counts flagged writes issued while a queued
/// write had not completed (their PREFLUSH would not cover it).
#[derive(Debug)]
pub(crate) struct Queued {
    inner: Arc<SimDevice>,
    pub(crate) in_flight: Arc<AtomicUsize>,
    pub(crate) merged: Arc<AtomicUsize>,
    pub(crate) early_flagged: AtomicUsize,
    oldest_last: bool,
}

impl Queued {
    pub(crate) fn new(inner: Arc<SimDevice>, oldest_last: bool) -> Self {
        Self {
            inner,
            in_flight: Arc::default(),
            merged: Arc::default(),
            early_flagged: AtomicUsize::new(0),
            oldest_last,
        }
    }
}

impl Device for Queued {
    fn read(&self, offset: u64, buf: &mut [u8]) -> cilfs_device::Result<()> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> cilfs_device::Result<()> {
        if flags != WriteFlags::NONE && self.in_flight.load(Ordering::SeqCst) != 0 {
            self.early_flagged.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.write(offset, buf, flags)
    }
    fn flush(&self) -> cilfs_device::Result<()> {
        self.inner.flush()
    }
    fn write_queue(&self, _depth: usize) -> Option<Box<dyn WriteQueue>> {
        Some(Box::new(LateQueue {
            dev: Arc::clone(&self.inner),
            in_flight: Arc::clone(&self.in_flight),
            merged: Arc::clone(&self.merged),
            queued: Vec::new(),
            oldest_last: self.oldest_last,
        }))
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}
