//! Writing records: checkpoints and unmount records go out through a ring of in-core log buffers
//! (iclogs) with the cache-flush policy of docs/journal.md section 2.
//!
//! With asynchronous IO (`LogWriter::with_async_io`) up to `logbufs` iclogs are in flight at
//! once; the pushing thread fills the next iclog while earlier ones are written, and waits (a
//! noiclog event) only when the ring has no free buffer. Body iclogs go to the device's write
//! queue (io_uring on file devices: no thread hand-off, as the kernel submits bios) or, where it
//! has none, to IO threads. The iclog holding a commit record is written only after every
//! earlier iclog has completed, so its PREFLUSH covers them all. Without asynchronous IO (crash
//! tests) each iclog is written synchronously, which keeps runs deterministic.
//!
//! The jobs are split: `config` (flush policy, ring size), `counters`, `flush_clock` (which
//! data flushes completed since a point, for the AIL), `io` (the two back ends
//! for body iclogs: the device's write queue and IO threads), `ring` (the iclog ring and the
//! commit iclog in flight) and `records` (checkpoints and unmount records packed into iclogs).

mod config;
mod counters;
mod flush_clock;
mod io;
mod records;
mod ring;

pub use config::{ConfigError, FlushPolicy, LogConfig};
pub use counters::{LogCounters, LogStats};
pub use flush_clock::FlushClock;

use super::lsn::{LogSpace, Lsn};
use cilfs_device::{AlignedBuf, Device, DeviceError};
use io::{AsyncIo, IoPool, IO_THREADS};
use std::sync::Arc;

/// Where a written checkpoint landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// LSN of the record holding the start op: the checkpoint's items enter the AIL here.
    pub start: Lsn,
    /// LSN of the record holding the commit op.
    pub commit: Lsn,
    /// The tail the commit record carries: sampled before the start flush, or again before
    /// the commit iclog's PREFLUSH where that flushes the data device (`write_checkpoint_async`);
    /// under the ail policy, as the AIL publishes it, counting what the commit's flush covers.
    /// Either way a flush made it stable before the commit record.
    pub tail: Lsn,
    /// The tail the body records carry (the first sample): what recovery starts from if the
    /// commit record is lost, so the head must not have overrun it either.
    pub body_tail: Lsn,
    /// The ail policy: the `FlushClock` ticket of the flush of the data device the commit
    /// record was ordered after (its PREFLUSH on an internal log): complete once the checkpoint is.
    pub data_flush: Option<u64>,
}

/// The record writer. Owned by the journal, used under its push lock.
#[derive(Debug)]
pub struct LogWriter {
    log_dev: Arc<dyn Device>,
    data_dev: Arc<dyn Device>,
    external: bool,
    log_offset: u64,
    space: LogSpace,
    cfg: LogConfig,
    head: Lsn,
    generation: u32,
    /// `None` while the iclog is in flight on the IO pool.
    ring: Vec<Option<AlignedBuf>>,
    next_iclog: usize,
    counters: Arc<LogCounters>,
    io: Option<AsyncIo>,
    /// With the write queue: a thread that writes commit iclogs (PREFLUSH+FUA, synchronous
    /// syscalls here), so the pusher can fill the next checkpoint meanwhile, as XFS's CIL push
    /// returns once the commit iclog is released and its completion runs later.
    commit_io: Option<IoPool>,
    /// A commit iclog written by `commit_io` has not been waited for yet.
    commit_in_flight: bool,
    /// Its completion, when `commit_pending` found it already delivered.
    commit_reaped: Option<Result<(), DeviceError>>,
    /// The copy the commit thread wrote last, back for the next commit iclog: a new one each
    /// time was a fresh allocation, its pages faulted in and zeroed by the kernel (a tenth of
    /// the pusher's time with two threads creating).
    commit_spare: Option<AlignedBuf>,
    /// Tickets for the data-device flushes the commit path issues (ail policy).
    flush_clock: Arc<FlushClock>,
}

/// Where a log lives: its device and region, and the data device its flushes must cover.
#[derive(Debug, Clone)]
pub struct LogPlacement {
    pub log_dev: Arc<dyn Device>,
    pub data_dev: Arc<dyn Device>,
    /// The log is on its own device: a PREFLUSH there does not cover the data device.
    pub external: bool,
    /// Byte offset of the log region on `log_dev`.
    pub offset: u64,
    pub space: LogSpace,
}

impl LogWriter {
    /// A writer that puts the next record at `head`, stamping records with `generation`.
    pub fn new(
        place: LogPlacement,
        cfg: LogConfig,
        head: Lsn,
        generation: u32,
        counters: Arc<LogCounters>,
    ) -> Self {
        // An internal log's PREFLUSH is taken to flush the data device too (the commit record
        // then carries a tail sampled just before it): the two must be one device.
        debug_assert!(
            place.external
                || std::ptr::addr_eq(Arc::as_ptr(&place.log_dev), Arc::as_ptr(&place.data_dev)),
            "an internal log on a device other than the data device"
        );
        let ring = (0..cfg.logbufs)
            .map(|_| Some(AlignedBuf::zeroed(cfg.logbsize as usize)))
            .collect();
        Self {
            log_dev: place.log_dev,
            data_dev: place.data_dev,
            external: place.external,
            log_offset: place.offset,
            space: place.space,
            cfg,
            head,
            generation,
            ring,
            next_iclog: 0,
            counters,
            io: None,
            commit_io: None,
            commit_in_flight: false,
            commit_reaped: None,
            commit_spare: None,
            flush_clock: Arc::default(),
        }
    }

    /// Writes body iclogs asynchronously so that several are in flight at once: through the
    /// log device's write queue where it has one, else from IO threads. The queue takes only
    /// unflagged writes, so the legacy policy (PREFLUSH+FUA on every iclog, each a flush and a
    /// synchronous write here) always uses the threads, which overlap those syscalls.
    pub fn with_async_io(mut self) -> Self {
        if self.io.is_none() {
            let queue = match self.cfg.policy {
                FlushPolicy::Reduced | FlushPolicy::AilFlush => {
                    self.log_dev.write_queue(self.ring.len())
                }
                FlushPolicy::Legacy => None,
            };
            self.io = Some(match queue {
                Some(queue) => {
                    self.commit_io = Some(IoPool::new(Arc::clone(&self.log_dev), 1));
                    AsyncIo::Queue {
                        queue,
                        plugged: Vec::new(),
                    }
                }
                None => self.io_threads(),
            });
        }
        self
    }

    /// Writes body iclogs from IO threads, whatever the device offers.
    pub fn with_io_threads(mut self) -> Self {
        if self.io.is_none() {
            self.io = Some(self.io_threads());
        }
        self
    }

    fn io_threads(&self) -> AsyncIo {
        AsyncIo::Threads(IoPool::new(
            Arc::clone(&self.log_dev),
            self.ring.len().min(IO_THREADS),
        ))
    }

    pub fn head(&self) -> Lsn {
        self.head
    }

    /// This writer's counters (shared with whoever passed them in).
    pub fn stats(&self) -> LogStats {
        self.counters.snapshot()
    }

    pub fn config(&self) -> &LogConfig {
        &self.cfg
    }

    pub fn space(&self) -> LogSpace {
        self.space
    }

    /// The clock whose tickets this writer's data flushes take, shared with the AIL.
    pub fn flush_clock(&self) -> Arc<FlushClock> {
        Arc::clone(&self.flush_clock)
    }
}

/// Model checks of the iclog ring with loom: `RUSTFLAGS="--cfg loom" cargo test -p cilfs-core
/// --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::log::item_format::encode_buf_item;
    use crate::log::recover::{scan_log, LogRegion};
    use cilfs_device::{IoStats, SimDevice, WriteFlags};
    use loom::sync::atomic::{AtomicUsize, Ordering as O};

    const LOG_BYTES: u64 = 256 * 1024;

    /// A device that knows how many writes are in flight, and counts commit-iclog (FUA) writes
    /// that started while another write had not completed.
    #[derive(Debug)]
    struct Watch {
        inner: SimDevice,
        in_flight: AtomicUsize,
        early_commits: AtomicUsize,
    }

    impl Device for Watch {
        fn read(&self, offset: u64, buf: &mut [u8]) -> cilfs_device::Result<()> {
            self.inner.read(offset, buf)
        }
        fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> cilfs_device::Result<()> {
            let others = self.in_flight.fetch_add(1, O::SeqCst);
            if flags.fua() && others != 0 {
                self.early_commits.fetch_add(1, O::SeqCst);
            }
            // The write is "in flight" across this scheduling point.
            loom::thread::yield_now();
            let r = self.inner.write(offset, buf, flags);
            self.in_flight.fetch_sub(1, O::SeqCst);
            r
        }
        fn flush(&self) -> cilfs_device::Result<()> {
            self.inner.flush()
        }
        fn len(&self) -> u64 {
            self.inner.len()
        }
        fn stats(&self) -> IoStats {
            self.inner.stats()
        }
    }

    /// A checkpoint spanning three iclogs written by two IO threads: in every interleaving the
    /// commit iclog starts only after every earlier iclog completed, completions in any order
    /// return every buffer to the ring, and the log reads back whole.
    #[test]
    fn commit_iclog_waits_for_the_body() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(2);
        b.check(|| {
            let dev = Arc::new(Watch {
                inner: SimDevice::new(LOG_BYTES, 1),
                in_flight: AtomicUsize::new(0),
                early_commits: AtomicUsize::new(0),
            });
            let cfg = LogConfig {
                logbufs: 2,
                logbsize: 16 * 1024,
                policy: FlushPolicy::Reduced,
            };
            let place = LogPlacement {
                log_dev: dev.clone(),
                data_dev: dev.clone(),
                external: false,
                offset: 0,
                space: LogSpace::new(LOG_BYTES),
            };
            let mut w = LogWriter::new(
                place,
                cfg,
                Lsn::new(1, 0),
                1,
                Arc::new(LogCounters::default()),
            )
            .with_io_threads();
            let data = vec![7u8; 4096];
            let items: Vec<Vec<u8>> = (0..9)
                .map(|i| encode_buf_item(i, false, None, &data, &[(0, 4000)]))
                .collect();
            w.write_checkpoint(1, items.iter(), |h, _| h).unwrap();
            assert!(
                w.ring.iter().all(Option::is_some),
                "a buffer never came back"
            );
            drop(w);
            assert_eq!(
                dev.early_commits.load(O::SeqCst),
                0,
                "commit iclog overtook the body"
            );
            let region = LogRegion {
                dev: &dev.inner,
                offset: 0,
                space: LogSpace::new(LOG_BYTES),
            };
            let scan = scan_log(&region, 4096).unwrap();
            assert_eq!(scan.checkpoints.len(), 1);
            assert_eq!(scan.checkpoints[0].items.len(), 9);
        });
    }
}
