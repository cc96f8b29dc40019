//! Asynchronous unflagged writes, for the log's body iclogs: the writer hands buffers to the
//! kernel and goes on filling the next one, as XFS submits an iclog's bio and takes its
//! completion later, with no thread in between.
//!
//! [`UringQueue`] does it with io_uring. This is the one module of cilfs with unsafe code: the
//! kernel reads a submitted buffer until its completion is reaped, which the borrow checker
//! cannot see. The queue therefore owns every submitted buffer until then (the caller gets it
//! back with the completion) and, when dropped, waits for every write still in flight.
#![allow(unsafe_code)]

use crate::aligned::AlignedBuf;
use crate::counters::{IoCounters, VolatileTracker};
use crate::{check_io, DeviceError, IoKind, Result, WriteFlags};
use io_uring::{opcode, types, IoUring};
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// One buffer of a queued write: `buf[range]`, known to the caller by `tag`.
#[derive(Debug)]
pub struct QueuedBuf {
    pub tag: u64,
    pub buf: AlignedBuf,
    pub range: Range<usize>,
}

/// A completed buffer: its tag, the buffer itself, and the result of the write it was part of.
#[derive(Debug)]
pub struct QueuedWrite {
    pub tag: u64,
    pub buf: AlignedBuf,
    pub result: Result<()>,
}

/// Writes without flags, in flight at once. A write completes (and, without FUA, sits in the
/// device's volatile cache, as for [`crate::Device::write`]) when [`WriteQueue::complete`]
/// returns it, not before.
pub trait WriteQueue: Send + std::fmt::Debug {
    /// Starts one write of `parts` back to back from `offset` (one IO, as the block layer
    /// merges adjacent bios). Each buffer comes back with its tag once the write completed.
    /// On error the buffers come back at once and nothing was submitted.
    fn submit(
        &mut self,
        offset: u64,
        parts: Vec<QueuedBuf>,
    ) -> std::result::Result<(), (Vec<QueuedBuf>, DeviceError)>;

    /// Buffers whose writes completed since the last call; if `wait` and none has but some are
    /// in flight, waits for one. An error means the queue can no longer wait for its writes.
    fn complete(&mut self, wait: bool) -> Result<Vec<QueuedWrite>>;

    /// Writes submitted and not yet returned by `complete`.
    fn in_flight(&self) -> usize;
}

/// A write in flight: its buffers, and the iovecs the kernel reads them through.
struct Pending {
    offset: u64,
    parts: Vec<QueuedBuf>,
    /// Read by the kernel, never by us: kept alive until the completion.
    #[allow(dead_code)]
    iovecs: Vec<libc::iovec>,
    result: Result<()>,
}

// SAFETY of Send: the iovecs point into `parts`' heap pages, owned by the same value.
unsafe impl Send for Pending {}

/// An io_uring over one file, sharing the counters of the [`crate::FileDevice`] it came from.
pub(crate) struct UringQueue {
    ring: IoUring,
    file: File,
    len: u64,
    counters: Arc<IoCounters>,
    volatile: Arc<VolatileTracker>,
    pending: HashMap<u64, Pending>,
    next_id: u64,
}

impl std::fmt::Debug for UringQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UringQueue({} in flight)", self.pending.len())
    }
}

impl UringQueue {
    /// A queue for up to `depth` writes in flight over `file` (a duplicate of the device's
    /// descriptor). Fails where io_uring is unavailable (old kernel, seccomp, sysctl).
    pub(crate) fn new(
        file: File,
        len: u64,
        depth: usize,
        counters: Arc<IoCounters>,
        volatile: Arc<VolatileTracker>,
    ) -> std::io::Result<Self> {
        let entries = depth.clamp(1, 4096).next_power_of_two();
        let ring = IoUring::new(entries as u32)?;
        Ok(Self {
            ring,
            file,
            len,
            counters,
            volatile,
            pending: HashMap::new(),
            next_id: 0,
        })
    }

    /// Finishes a write the kernel did only `done` bytes of (rare), synchronously.
    fn finish_short(&self, p: &Pending, mut done: usize) -> Result<()> {
        let mut at = p.offset;
        for part in &p.parts {
            let n = part.range.len();
            if done >= n {
                done -= n;
                at += n as u64;
                continue;
            }
            let rest = part.range.start + done..part.range.end;
            let from = at + done as u64;
            self.file
                .write_all_at(&part.buf[rest], from)
                .map_err(|source| DeviceError::Io {
                    kind: IoKind::Write,
                    offset: from,
                    source,
                })?;
            done = 0;
            at += n as u64;
        }
        Ok(())
    }

    /// Takes what the kernel has completed into `out`.
    fn drain(&mut self, out: &mut Vec<QueuedWrite>) {
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (id, res) in cqes {
            let Some(p) = self.pending.remove(&id) else {
                debug_assert!(false, "completion of unknown write {id}");
                continue;
            };
            let total: usize = p.parts.iter().map(|b| b.range.len()).sum();
            let mut result = if res < 0 {
                Err(DeviceError::Io {
                    kind: IoKind::Write,
                    offset: p.offset,
                    source: std::io::Error::from_raw_os_error(-res),
                })
            } else if (res as usize) < total {
                self.finish_short(&p, res as usize)
            } else {
                Ok(())
            };
            if p.result.is_err() {
                result = p.result;
            }
            if result.is_ok() {
                self.volatile.volatile_write_completed();
                self.counters.write(total, WriteFlags::NONE);
            }
            for part in p.parts {
                out.push(QueuedWrite {
                    tag: part.tag,
                    buf: part.buf,
                    result: result.as_ref().map(|_| ()).map_err(|e| DeviceError::Io {
                        kind: IoKind::Write,
                        offset: p.offset,
                        source: std::io::Error::other(e.to_string()),
                    }),
                });
            }
        }
    }

    /// Waits for at least one completion, retrying when a signal interrupts the wait.
    fn wait_one(&mut self) -> std::io::Result<()> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl WriteQueue for UringQueue {
    fn submit(
        &mut self,
        offset: u64,
        parts: Vec<QueuedBuf>,
    ) -> std::result::Result<(), (Vec<QueuedBuf>, DeviceError)> {
        let fail = |parts, why: String| {
            let source = std::io::Error::other(why);
            Err((
                parts,
                DeviceError::Io {
                    kind: IoKind::Write,
                    offset,
                    source,
                },
            ))
        };
        if parts.is_empty() || parts.iter().any(|p| p.range.end > p.buf.len()) {
            return fail(parts, "empty write or range outside its buffer".into());
        }
        let total: usize = parts.iter().map(|b| b.range.len()).sum();
        if let Err(e) = check_io(IoKind::Write, offset, total, self.len) {
            return Err((parts, e));
        }
        let full = {
            let sq = self.ring.submission();
            sq.len() >= sq.capacity()
        };
        if full || self.pending.len() >= self.ring.params().cq_entries() as usize {
            return fail(parts, "write queue full".into());
        }
        let iovecs: Vec<libc::iovec> = parts
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.buf[p.range.clone()].as_ptr() as *mut libc::c_void,
                iov_len: p.range.len(),
            })
            .collect();
        let id = self.next_id;
        self.next_id += 1;
        let sqe = opcode::Writev::new(
            types::Fd(self.file.as_raw_fd()),
            iovecs.as_ptr(),
            iovecs.len() as u32,
        )
        .offset(offset)
        .build()
        .user_data(id);
        self.pending.insert(
            id,
            Pending {
                offset,
                parts,
                iovecs,
                result: Ok(()),
            },
        );
        // SAFETY: the entry points at the iovecs and, through them, at the buffers' heap pages;
        // both just moved into `pending` (moving a Vec or an AlignedBuf does not move its heap
        // memory) and stay there until this write's completion is reaped. `Drop` waits for
        // every write in flight. The queue has room (checked above), so the push cannot fail.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        debug_assert!(pushed.is_ok());
        if let Err(source) = self.ring.submit() {
            // The entry stays queued; a later submit or wait passes it to the kernel. Its
            // completion reports this error.
            if let Some(p) = self.pending.get_mut(&id) {
                p.result = Err(DeviceError::Io {
                    kind: IoKind::Write,
                    offset,
                    source,
                });
            }
        }
        Ok(())
    }

    fn complete(&mut self, wait: bool) -> Result<Vec<QueuedWrite>> {
        let mut out = Vec::new();
        self.drain(&mut out);
        while wait && out.is_empty() && !self.pending.is_empty() {
            // If waiting fails the ring is unusable: the writes in flight keep their buffers
            // (see Drop) and the caller gets the error.
            self.wait_one().map_err(|source| DeviceError::Io {
                kind: IoKind::Write,
                offset: 0,
                source,
            })?;
            self.drain(&mut out);
        }
        Ok(out)
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

impl Drop for UringQueue {
    fn drop(&mut self) {
        let mut out = Vec::new();
        while !self.pending.is_empty() {
            self.drain(&mut out);
            if self.pending.is_empty() || self.wait_one().is_err() {
                break;
            }
        }
        // Buffers the kernel may still read must outlive the ring: leak them rather than free
        // memory under an IO (only after the ring itself failed).
        for (_, p) in self.pending.drain() {
            std::mem::forget(p);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{Device, FileDevice, FileDeviceOptions};

    /// A file device over a new image of `len` bytes (kept while the directory lives).
    fn image(len: u64) -> (tempfile::TempDir, FileDevice) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        std::fs::File::create(&path).unwrap().set_len(len).unwrap();
        (
            dir,
            FileDevice::open(&path, FileDeviceOptions::default()).unwrap(),
        )
    }

    fn part(tag: u64, fill: u8, len: usize) -> QueuedBuf {
        let mut buf = AlignedBuf::zeroed(len);
        buf.fill(fill);
        QueuedBuf {
            tag,
            buf,
            range: 0..len,
        }
    }

    #[test]
    fn queued_writes_land_and_count_as_volatile() {
        let (_dir, dev) = image(1 << 20);
        let Some(mut q) = dev.write_queue(8) else {
            eprintln!("io_uring unavailable here: nothing to test");
            return;
        };
        // One write of two buffers, and one of a single buffer.
        q.submit(0, vec![part(1, 0xaa, 8192), part(2, 0xbb, 4096)])
            .unwrap();
        q.submit(65536, vec![part(3, 0xcc, 4096)]).unwrap();
        let mut back = Vec::new();
        while back.len() < 3 {
            back.extend(q.complete(true).unwrap());
        }
        assert_eq!(q.in_flight(), 0);
        let mut tags: Vec<u64> = back.iter().map(|w| w.tag).collect();
        tags.sort_unstable();
        assert_eq!(tags, vec![1, 2, 3]);
        assert!(back.iter().all(|w| w.result.is_ok()));
        let mut got = vec![0u8; 4096];
        for (off, fill) in [(0u64, 0xaa), (4096, 0xaa), (8192, 0xbb), (65536, 0xcc)] {
            dev.read(off, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == fill), "bytes at {off}");
        }
        let s = dev.stats();
        assert_eq!((s.writes, s.write_bytes), (2, 16384));
        // The completed writes are volatile: a flush is issued, not elided.
        dev.flush().unwrap();
        assert_eq!(dev.stats().flushes_issued, 1);
    }

    #[test]
    fn writes_past_the_end_are_refused_with_their_buffers() {
        let (_dir, dev) = image(64 << 10);
        let Some(mut q) = dev.write_queue(2) else {
            return;
        };
        let (parts, err) = q.submit(60 << 10, vec![part(7, 1, 8192)]).unwrap_err();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].tag, 7);
        assert!(matches!(err, DeviceError::OutOfRange { .. }), "{err:?}");
        assert_eq!(q.in_flight(), 0);
    }

    #[test]
    fn dropping_the_queue_waits_for_writes_in_flight() {
        let (_dir, dev) = image(1 << 20);
        let Some(mut q) = dev.write_queue(4) else {
            return;
        };
        for i in 0..4u64 {
            q.submit(i * 65536, vec![part(i, i as u8 + 1, 65536)])
                .unwrap();
        }
        drop(q);
        let mut got = vec![0u8; 65536];
        for i in 0..4u64 {
            dev.read(i * 65536, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == i as u8 + 1));
        }
    }
}
