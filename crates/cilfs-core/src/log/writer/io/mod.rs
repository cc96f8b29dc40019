//! How body iclogs are written while the pusher fills the next: through the log device's
//! write queue (`queue`, io_uring on file devices) or from IO threads (`threads`), and what
//! both hand back. An iclog write (`Job`) carries its ring buffer, which comes back with its
//! completion (`Done`) or, from a failed submission, with the error (`Returned`).

mod queue;
mod threads;

pub(crate) use threads::{IoPool, Msg, IO_THREADS};

use cilfs_device::{AlignedBuf, DeviceError, WriteFlags, WriteQueue};
use queue::{submit_group, PLUG_MAX_ICLOGS};

/// How body iclogs are written while the pusher fills the next.
#[derive(Debug)]
pub(crate) enum AsyncIo {
    /// The device's own queue (io_uring). An iclog waits in `plugged` until the next one
    /// arrives so that adjacent iclogs go out as one IO (as a block plug merges adjacent bios);
    /// it is submitted at the latest when the pusher is about to wait for anything.
    Queue {
        queue: Box<dyn WriteQueue>,
        plugged: Vec<Job>,
    },
    /// IO threads, for devices without a queue; they merge what queued behind a busy thread.
    Threads(IoPool),
}

/// Buffers handed back by a failed submission, with the error.
pub(crate) type Returned = (Vec<(usize, AlignedBuf)>, DeviceError);

/// An iclog is held back for merging only while at least this many others are free: holding it
/// when the ring is nearly drained makes the pusher wait for it (at 32 KiB iclogs, holding with
/// one free left waited on 5-6% of iclogs, two on 4-5%, never holding lost the merges' speed).
pub(crate) const HOLD_MIN_FREE_ICLOGS: usize = 2;

impl AsyncIo {
    /// Hands one iclog write over; on failure its buffers (and any plugged) come back. An
    /// iclog is held back for merging only if `may_hold`: the pusher can go on filling the
    /// next iclog without waiting, so the hold costs it nothing.
    pub(crate) fn submit(&mut self, job: Job, may_hold: bool) -> Result<(), Returned> {
        match self {
            Self::Queue { queue, plugged } => {
                // The writer writes a wrapped record itself (`write_iclog`).
                debug_assert_eq!(job.ios.len(), 1, "a wrapped record through the queue");
                if !plugged.is_empty() && !merges(plugged, &job) {
                    submit_group(&mut **queue, std::mem::take(plugged))?;
                }
                plugged.push(job);
                if may_hold && plugged.len() < PLUG_MAX_ICLOGS {
                    return Ok(());
                }
                submit_group(&mut **queue, std::mem::take(plugged))
            }
            Self::Threads(p) => {
                let offset = job.ios.first().map_or(0, |io| io.0);
                p.jobs.send(Msg::Write(job)).map_err(|e| match e.0 {
                    Msg::Write(job) => (vec![(job.slot, job.buf)], threads_gone(offset)),
                    Msg::Stop => unreachable!("sent a write"),
                })
            }
        }
    }

    /// Submits the plugged iclogs, if any.
    pub(crate) fn unplug(&mut self) -> Result<(), Returned> {
        match self {
            Self::Queue { queue, plugged } => submit_group(&mut **queue, std::mem::take(plugged)),
            Self::Threads(_) => Ok(()),
        }
    }

    /// Completed iclog writes; if `wait`, at least one (waiting for it).
    pub(crate) fn completions(&mut self, wait: bool) -> Result<Vec<Done>, DeviceError> {
        match self {
            Self::Queue { queue, .. } => Ok(queue
                .complete(wait)?
                .into_iter()
                .map(|c| Done {
                    slot: c.tag as usize,
                    buf: c.buf,
                    result: c.result,
                })
                .collect()),
            Self::Threads(p) => {
                let mut out = Vec::new();
                if wait {
                    out.push(p.done.recv().map_err(|_| threads_gone(0))?);
                }
                while let Ok(d) = p.done.try_recv() {
                    out.push(d);
                }
                Ok(out)
            }
        }
    }
}

pub(crate) fn threads_gone(offset: u64) -> DeviceError {
    DeviceError::Io {
        kind: cilfs_device::IoKind::Write,
        offset,
        source: std::io::Error::other("iclog IO threads are gone"),
    }
}

/// Returns the buffers of a failed submission to the ring, and its error.
pub(crate) fn put_back(
    ring: &mut [Option<AlignedBuf>],
    submitted: Result<(), Returned>,
) -> Result<(), DeviceError> {
    submitted.map_err(|(bufs, e)| {
        for (slot, buf) in bufs {
            ring[slot] = Some(buf);
        }
        e
    })
}

/// One iclog write handed to the IO pool: its buffer travels with it and comes back on completion.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) slot: usize,
    pub(crate) buf: AlignedBuf,
    /// (device offset, byte range of `buf`): two when the record wraps past the end of the log.
    pub(crate) ios: Vec<(u64, std::ops::Range<usize>)>,
    pub(crate) flags: WriteFlags,
}

pub(crate) struct Done {
    pub(crate) slot: usize,
    pub(crate) buf: AlignedBuf,
    pub(crate) result: Result<(), DeviceError>,
}

/// Whether `next` can join `group` in one IO: both unflagged body iclogs (flagged ones carry
/// their own PREFLUSH/FUA and stay alone, as the block layer never merges flush requests), in
/// one piece each, and `next` starts where the group ends.
pub(crate) fn merges(group: &[Job], next: &Job) -> bool {
    let Some(last) = group.last() else {
        return false;
    };
    let end = |j: &Job| j.ios.first().map(|(off, r)| off + r.len() as u64);
    next.flags == WriteFlags::NONE
        && last.flags == WriteFlags::NONE
        && next.ios.len() == 1
        && last.ios.len() == 1
        && end(last) == next.ios.first().map(|(off, _)| *off)
}
