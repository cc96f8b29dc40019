//! The write queue back end: iclogs submitted to the log device's own queue (io_uring), held
//! back to merge adjacent ones into one write, a record wrapping past the end of the log as
//! two writes.

use super::{Job, Returned};
use cilfs_device::{AlignedBuf, QueuedBuf, WriteQueue};

/// The tag of a copy made for the second piece of a record wrapping past the end of the log:
/// its buffer is dropped on completion (the original returns with the first piece).
pub(super) const COPY_TAG: u64 = u64::MAX;

/// Adjacent iclogs merged into one queued write at most.
pub(super) const PLUG_MAX_ICLOGS: usize = 2;

/// The buffers of `parts` that are ring slots (not copies), for handing back after a failure.
fn ring_buffers(parts: Vec<QueuedBuf>) -> Vec<(usize, AlignedBuf)> {
    parts
        .into_iter()
        .filter(|p| p.tag != COPY_TAG)
        .map(|p| (p.tag as usize, p.buf))
        .collect()
}

/// Submits `group`, adjacent one-piece iclogs (see `merges`), to the queue as one write.
pub(super) fn submit_group(queue: &mut dyn WriteQueue, group: Vec<Job>) -> Result<(), Returned> {
    let Some(offset) = group.first().map(|j| j.ios[0].0) else {
        return Ok(());
    };
    let parts = group
        .into_iter()
        .map(|j| {
            debug_assert_eq!(j.ios.len(), 1);
            QueuedBuf {
                tag: j.slot as u64,
                range: j.ios[0].1.clone(),
                buf: j.buf,
            }
        })
        .collect();
    queue
        .submit(offset, parts)
        .map_err(|(p, e)| (ring_buffers(p), e))
}

/// Submits a record that wraps past the end of the log as two writes, the second from a copy
/// (the ring buffer comes back once, with the first).
pub(super) fn submit_wrapped(queue: &mut dyn WriteQueue, job: Job) -> Result<(), Returned> {
    let mut pieces = job.ios.into_iter();
    let (Some((off0, r0)), Some((off1, r1)), None) = (pieces.next(), pieces.next(), pieces.next())
    else {
        unreachable!("a wrapped record has two pieces")
    };
    let second = QueuedBuf {
        tag: COPY_TAG,
        range: 0..r1.len(),
        buf: AlignedBuf::from_slice(&job.buf[r1]),
    };
    let first = QueuedBuf {
        tag: job.slot as u64,
        range: r0,
        buf: job.buf,
    };
    if let Err((_, e)) = queue.submit(off1, vec![second]) {
        return Err((vec![(job.slot, first.buf)], e));
    }
    queue
        .submit(off0, vec![first])
        .map_err(|(p, e)| (ring_buffers(p), e))
}
