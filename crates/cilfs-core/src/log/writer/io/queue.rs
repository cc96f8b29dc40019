//! The write queue back end: iclogs submitted to the log device's own queue (io_uring), held
//! back to merge adjacent ones into one write. A record wrapping past the end of the log
//! never comes here (`LogWriter::write_iclog` writes it).

use super::{Job, Returned};
use cilfs_device::{AlignedBuf, QueuedBuf, WriteQueue};

/// Adjacent iclogs merged into one queued write at most.
pub(super) const PLUG_MAX_ICLOGS: usize = 2;

/// The ring buffers of `parts`, for handing back after a failure.
fn ring_buffers(parts: Vec<QueuedBuf>) -> Vec<(usize, AlignedBuf)> {
    parts.into_iter().map(|p| (p.tag as usize, p.buf)).collect()
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
