//! Writing records: checkpoints and unmount records go out through a ring of in-core log buffers
//! (iclogs) with the cache-flush policy of journal.md section 2.
//!
//! With asynchronous IO (`LogWriter::with_async_io`) up to `logbufs` iclogs are in flight at
//! once; the pushing thread fills the next iclog while earlier ones are written, and waits (a
//! noiclog event) only when the ring has no free buffer. Body iclogs go to the device's write
//! queue (io_uring on file devices: no thread hand-off, as the kernel submits bios) or, where it
//! has none, to IO threads. The iclog holding a commit record is written only after every
//! earlier iclog has completed, so its PREFLUSH covers them all. Without asynchronous IO (crash
//! tests) each iclog is written synchronously, which keeps runs deterministic.

use super::lsn::{LogSpace, Lsn};
use super::record::{
    pack, seal_record, OpHeader, OpKind, RecordHeader, OP_CONTINUATION, OP_CONTINUED,
    OP_HEADER_BYTES, SECTOR, SECTOR_PAYLOAD,
};
use crate::util::sync::{lock, mpsc, raise_priority, spawn, JoinHandle, Mutex};
use cilfs_device::{AlignedBuf, Device, DeviceError, QueuedBuf, WriteFlags, WriteQueue};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// Which cache flushes the log issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// One data-device flush before a checkpoint, PREFLUSH+FUA only on its commit iclog (FUA
    /// alone when the checkpoint fits in one iclog). Linux 5.14 and later.
    #[default]
    Reduced,
    /// PREFLUSH+FUA on every iclog (and a data-device flush before each when the log is
    /// external), as XFS did before Linux 5.14.
    Legacy,
}

impl std::str::FromStr for FlushPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reduced" => Ok(Self::Reduced),
            "legacy" => Ok(Self::Legacy),
            _ => Err(format!("flush policy '{s}': expected reduced or legacy")),
        }
    }
}

impl std::fmt::Display for FlushPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Reduced => "reduced",
            Self::Legacy => "legacy",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    pub logbufs: u32,
    pub logbsize: u32,
    pub policy: FlushPolicy,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            logbufs: 8,
            logbsize: 256 * 1024,
            policy: FlushPolicy::Reduced,
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    #[error("logbufs {0} is not in 2..8")]
    Logbufs(u32),
    #[error("logbsize {0} is not a power of two in 16k..256k")]
    Logbsize(u32),
    #[error("the log ({log_bytes} bytes) is too small for {logbufs} iclogs of {logbsize} bytes: it needs at least 4 rings")]
    LogTooSmall {
        log_bytes: u64,
        logbufs: u32,
        logbsize: u32,
    },
}

impl LogConfig {
    pub fn validate(&self, log_bytes: u64) -> Result<(), ConfigError> {
        if !(2..=8).contains(&self.logbufs) {
            return Err(ConfigError::Logbufs(self.logbufs));
        }
        if !self.logbsize.is_power_of_two() || !(16 * 1024..=256 * 1024).contains(&self.logbsize) {
            return Err(ConfigError::Logbsize(self.logbsize));
        }
        if log_bytes < 4 * u64::from(self.logbufs) * u64::from(self.logbsize) {
            return Err(ConfigError::LogTooSmall {
                log_bytes,
                logbufs: self.logbufs,
                logbsize: self.logbsize,
            });
        }
        Ok(())
    }

    /// This configuration, shrunk (logbsize first, then logbufs) until the log holds four rings
    /// of iclogs: what the defaults become on a small log.
    pub fn fitted_to(mut self, log_bytes: u64) -> Self {
        while self.validate(log_bytes).is_err() {
            if self.logbsize > 16 * 1024 {
                self.logbsize /= 2;
            } else if self.logbufs > 2 {
                self.logbufs -= 1;
            } else {
                break;
            }
        }
        self
    }

    /// Stream bytes one iclog carries.
    pub fn iclog_payload(&self) -> usize {
        (self.logbsize as usize / SECTOR - 1) * SECTOR_PAYLOAD
    }

    /// An upper bound on the log sectors a checkpoint whose op stream is `stream` bytes occupies.
    pub fn sectors_bound(&self, stream: u64) -> u64 {
        let p = self.iclog_payload() as u64;
        // Each record may hold a continuation op header and leave up to one op header unused.
        let records = stream / (p - 2 * OP_HEADER_BYTES as u64) + 1;
        let payload = stream + records * 2 * OP_HEADER_BYTES as u64;
        records * 2 + payload / SECTOR_PAYLOAD as u64 + 1
    }
}

/// Log counters (journal.md section 2), shared with whoever reports them.
#[derive(Debug, Default)]
pub struct LogCounters {
    pub iclog_writes: AtomicU64,
    pub log_bytes: AtomicU64,
    pub checkpoints: AtomicU64,
    pub noiclog_waits: AtomicU64,
    pub log_forces: AtomicU64,
    pub reservation_waits: AtomicU64,
    pub unmount_records: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    pub iclog_writes: u64,
    pub log_bytes: u64,
    pub checkpoints: u64,
    pub noiclog_waits: u64,
    pub log_forces: u64,
    pub reservation_waits: u64,
    pub unmount_records: u64,
}

impl LogCounters {
    pub fn snapshot(&self) -> LogStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LogStats {
            iclog_writes: l(&self.iclog_writes),
            log_bytes: l(&self.log_bytes),
            checkpoints: l(&self.checkpoints),
            noiclog_waits: l(&self.noiclog_waits),
            log_forces: l(&self.log_forces),
            reservation_waits: l(&self.reservation_waits),
            unmount_records: l(&self.unmount_records),
        }
    }
}

impl LogStats {
    pub fn fields(&self) -> [(&'static str, u64); 7] {
        [
            ("iclog_writes", self.iclog_writes),
            ("log_bytes", self.log_bytes),
            ("checkpoints", self.checkpoints),
            ("noiclog_waits", self.noiclog_waits),
            ("log_forces", self.log_forces),
            ("reservation_waits", self.reservation_waits),
            ("unmount_records", self.unmount_records),
        ]
    }
}

/// Where a written checkpoint landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// LSN of the record holding the start op: the checkpoint's items enter the AIL here.
    pub start: Lsn,
    /// LSN of the record holding the commit op.
    pub commit: Lsn,
    /// The tail the commit record carries: sampled before the start flush, or again before
    /// the commit iclog's PREFLUSH where that flushes the data device (`write_checkpoint_async`).
    /// Either way a flush made it stable before the commit record.
    pub tail: Lsn,
    /// The tail the body records carry (the first sample): what recovery starts from if the
    /// commit record is lost, so the head must not have overrun it either.
    pub body_tail: Lsn,
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
}

/// How body iclogs are written while the pusher fills the next.
#[derive(Debug)]
enum AsyncIo {
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
type Returned = (Vec<(usize, AlignedBuf)>, DeviceError);

/// The tag of a copy made for the second piece of a record wrapping past the end of the log:
/// its buffer is dropped on completion (the original returns with the first piece).
const COPY_TAG: u64 = u64::MAX;

/// Adjacent iclogs merged into one queued write at most.
const PLUG_MAX_ICLOGS: usize = 2;
/// An iclog is held back for merging only while at least this many others are free: holding it
/// when the ring is nearly drained makes the pusher wait for it (at 32 KiB iclogs, holding with
/// one free left waited on 5-6% of iclogs, two on 4-5%, never holding lost the merges' speed).
const HOLD_MIN_FREE_ICLOGS: usize = 2;

impl AsyncIo {
    /// Hands one iclog write over; on failure its buffers (and any plugged) come back. An
    /// iclog is held back for merging only if `may_hold`: the pusher can go on filling the
    /// next iclog without waiting, so the hold costs it nothing.
    fn submit(&mut self, job: Job, may_hold: bool) -> Result<(), Returned> {
        match self {
            Self::Queue { queue, plugged } => {
                if job.ios.len() != 1 {
                    submit_group(&mut **queue, std::mem::take(plugged))?;
                    return submit_wrapped(&mut **queue, job);
                }
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
    fn unplug(&mut self) -> Result<(), Returned> {
        match self {
            Self::Queue { queue, plugged } => submit_group(&mut **queue, std::mem::take(plugged)),
            Self::Threads(_) => Ok(()),
        }
    }

    /// Completed iclog writes; if `wait`, at least one (waiting for it).
    fn completions(&mut self, wait: bool) -> Result<Vec<Done>, DeviceError> {
        match self {
            Self::Queue { queue, .. } => Ok(queue
                .complete(wait)?
                .into_iter()
                .filter(|c| c.tag != COPY_TAG)
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

fn threads_gone(offset: u64) -> DeviceError {
    DeviceError::Io {
        kind: cilfs_device::IoKind::Write,
        offset,
        source: std::io::Error::other("iclog IO threads are gone"),
    }
}

/// Returns the buffers of a failed submission to the ring, and its error.
fn put_back(
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

/// The buffers of `parts` that are ring slots (not copies), for handing back after a failure.
fn ring_buffers(parts: Vec<QueuedBuf>) -> Vec<(usize, AlignedBuf)> {
    parts
        .into_iter()
        .filter(|p| p.tag != COPY_TAG)
        .map(|p| (p.tag as usize, p.buf))
        .collect()
}

/// Submits `group`, adjacent one-piece iclogs (see `merges`), to the queue as one write.
fn submit_group(queue: &mut dyn WriteQueue, group: Vec<Job>) -> Result<(), Returned> {
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
fn submit_wrapped(queue: &mut dyn WriteQueue, job: Job) -> Result<(), Returned> {
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

/// One iclog write handed to the IO pool: its buffer travels with it and comes back on completion.
#[derive(Debug)]
struct Job {
    slot: usize,
    buf: AlignedBuf,
    /// (device offset, byte range of `buf`): two when the record wraps past the end of the log.
    ios: Vec<(u64, std::ops::Range<usize>)>,
    flags: WriteFlags,
}

struct Done {
    slot: usize,
    buf: AlignedBuf,
    result: Result<(), DeviceError>,
}

/// What an IO thread is told: write this iclog, or stop. (An explicit stop rather than a closed
/// channel, so that loom, which does not model hang-ups, can check the pool.)
enum Msg {
    Write(Job),
    Stop,
}

/// Threads that write iclogs, so several are in flight at once.
struct IoPool {
    jobs: mpsc::Sender<Msg>,
    done: mpsc::Receiver<Done>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for IoPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoPool({} threads)", self.threads.len())
    }
}

impl IoPool {
    fn new(dev: Arc<dyn Device>, threads: usize) -> Self {
        let (jobs_tx, jobs_rx) = mpsc::channel::<Msg>();
        let (done_tx, done_rx) = mpsc::channel::<Done>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let threads = (0..threads)
            .filter_map(|i| {
                let (rx, tx, dev) = (Arc::clone(&jobs_rx), done_tx.clone(), Arc::clone(&dev));
                spawn(format!("cilfs-iclog-{i}"), move || {
                    raise_priority();
                    loop {
                        let (jobs, stop) = take_jobs(&rx);
                        let mut jobs = jobs.into_iter().peekable();
                        while let Some(first) = jobs.next() {
                            let mut group = vec![first];
                            while let Some(next) = jobs.next_if(|n| merges(&group, n)) {
                                group.push(next);
                            }
                            let result = write_group(&*dev, &group);
                            for job in group {
                                let done = Done {
                                    slot: job.slot,
                                    buf: job.buf,
                                    result: result.as_ref().map(|_| ()).map_err(|e| {
                                        DeviceError::Io {
                                            kind: cilfs_device::IoKind::Write,
                                            offset: job.ios[0].0,
                                            source: std::io::Error::other(e.to_string()),
                                        }
                                    }),
                                };
                                if tx.send(done).is_err() {
                                    return;
                                }
                            }
                        }
                        if stop {
                            return;
                        }
                    }
                })
            })
            .collect();
        Self {
            jobs: jobs_tx,
            done: done_rx,
            threads,
        }
    }
}

/// Waits for the next iclog write, then takes every one already queued behind it (at most a
/// ring's worth), so that adjacent iclogs can go out as one IO. Returns the jobs and whether a
/// stop came after them.
fn take_jobs(rx: &Mutex<mpsc::Receiver<Msg>>) -> (Vec<Job>, bool) {
    let rx = lock(rx);
    let mut jobs = Vec::new();
    match rx.recv() {
        Ok(Msg::Write(j)) => jobs.push(j),
        Ok(Msg::Stop) | Err(_) => return (jobs, true),
    }
    while jobs.len() < MERGE_MAX_ICLOGS {
        match rx.try_recv() {
            Ok(Msg::Write(j)) => jobs.push(j),
            Ok(Msg::Stop) => return (jobs, true),
            Err(_) => break,
        }
    }
    (jobs, false)
}

/// Whether `next` can join `group` in one IO: both unflagged body iclogs (flagged ones carry
/// their own PREFLUSH/FUA and stay alone, as the block layer never merges flush requests), in
/// one piece each, and `next` starts where the group ends.
fn merges(group: &[Job], next: &Job) -> bool {
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

/// Writes a group of iclogs: one IO when it holds several (see `merges`).
fn write_group(dev: &dyn Device, group: &[Job]) -> Result<(), DeviceError> {
    if let [job] = group {
        for (off, r) in &job.ios {
            dev.write(*off, &job.buf[r.clone()], job.flags)?;
        }
        return Ok(());
    }
    let bufs: Vec<&[u8]> = group.iter().map(|j| &j.buf[j.ios[0].1.clone()]).collect();
    dev.write_vectored(group[0].ios[0].0, &bufs)
}

/// iclog IO threads: enough to keep iclogs in flight while another thread merges the ones
/// queued behind them; more would take each iclog alone as soon as it is queued.
const IO_THREADS: usize = 2;

/// The most iclogs one IO thread takes at once (and so merges into one write).
const MERGE_MAX_ICLOGS: usize = 8;

impl Drop for IoPool {
    fn drop(&mut self) {
        for _ in &self.threads {
            let _ = self.jobs.send(Msg::Stop);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
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
        }
    }

    /// Writes body iclogs asynchronously so that several are in flight at once: through the
    /// log device's write queue where it has one, else from IO threads. The queue takes only
    /// unflagged writes, so the legacy policy (PREFLUSH+FUA on every iclog, each a flush and a
    /// synchronous write here) always uses the threads, which overlap those syscalls.
    pub fn with_async_io(mut self) -> Self {
        if self.io.is_none() {
            let queue = match self.cfg.policy {
                FlushPolicy::Reduced => self.log_dev.write_queue(self.ring.len()),
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

    /// Puts completed iclogs back in the ring; returns the first error among them.
    fn take_back(&mut self, wait: bool) -> Result<(), DeviceError> {
        let Some(io) = self.io.as_mut() else {
            unreachable!("iclog in flight without asynchronous IO")
        };
        if wait {
            put_back(&mut self.ring, io.unplug())?;
        }
        let mut first_err = Ok(());
        for d in io.completions(wait)? {
            self.ring[d.slot] = Some(d.buf);
            if first_err.is_ok() {
                first_err = d.result;
            }
        }
        first_err
    }

    /// Takes completions until ring slot `slot` has its buffer back.
    fn wait_slot(&mut self, slot: usize) -> Result<(), DeviceError> {
        let mut first_err = Ok(());
        while self.ring[slot].is_none() {
            let r = self.take_back(true);
            if first_err.is_ok() {
                first_err = r;
            }
        }
        first_err
    }

    /// Waits until no iclog is in flight, commit iclogs included.
    fn wait_all(&mut self) -> Result<(), DeviceError> {
        let mut r = Ok(());
        for slot in 0..self.ring.len() {
            let x = self.wait_slot(slot);
            if r.is_ok() {
                r = x;
            }
        }
        let x = self.wait_commit();
        if r.is_ok() {
            r = x;
        }
        r
    }

    /// Whether a commit iclog left in flight by `write_checkpoint_async` may not have completed.
    pub fn commit_in_flight(&self) -> bool {
        self.commit_in_flight
    }

    /// Whether the commit iclog left in flight is still being written. Takes its completion if
    /// it has arrived, so `wait_commit` then returns at once.
    pub fn commit_pending(&mut self) -> bool {
        if !self.commit_in_flight || self.commit_reaped.is_some() {
            return false;
        }
        let Some(pool) = self.commit_io.as_ref() else {
            return false;
        };
        match pool.done.try_recv() {
            Ok(d) => {
                self.commit_reaped = Some(d.result);
                self.commit_spare = Some(d.buf);
                false
            }
            Err(_) => true,
        }
    }

    /// Forgets the commit iclog left in flight if it has completed without error, and says so.
    /// A failed one stays, for `wait_commit` to report.
    fn take_completed_commit(&mut self) -> bool {
        if self.commit_pending() || !matches!(self.commit_reaped, Some(Ok(()))) {
            return false;
        }
        self.commit_reaped = None;
        self.commit_in_flight = false;
        true
    }

    /// Waits for the commit iclog left in flight by `write_checkpoint_async`, if any: once it
    /// returns Ok, that checkpoint is stable.
    pub fn wait_commit(&mut self) -> Result<(), DeviceError> {
        if !self.commit_in_flight {
            return Ok(());
        }
        if let Some(r) = self.commit_reaped.take() {
            self.commit_in_flight = false;
            return r;
        }
        let Some(pool) = self.commit_io.as_ref() else {
            unreachable!("a commit iclog in flight without the commit thread")
        };
        let done = pool.done.recv().map_err(|_| threads_gone(0));
        self.commit_in_flight = false;
        let done = done?;
        self.commit_spare = Some(done.buf);
        done.result
    }

    /// Takes the completions that have already arrived, without waiting.
    fn reap(&mut self) -> Result<(), DeviceError> {
        if self.io.is_none() {
            return Ok(());
        }
        self.take_back(false)
    }

    /// Makes `next_iclog` a free ring slot, waiting for one (a noiclog event) if every iclog is
    /// in flight. Completions already delivered are taken first: an iclog whose IO finished is
    /// free (as XFS's completion handler makes it ACTIVE again), so finding it is no wait. Any
    /// free slot will do, the next in ring order first: writes may complete out of order, and
    /// nothing but the commit iclog (which waits for all) depends on the order they finish in.
    fn claim(&mut self) -> Result<(), DeviceError> {
        let n = self.ring.len();
        let start = self.next_iclog;
        let free = |ring: &[Option<AlignedBuf>]| {
            (0..n).map(|k| (start + k) % n).find(|&s| ring[s].is_some())
        };
        if free(&self.ring).is_none() {
            self.reap()?;
        }
        let mut first_err = Ok(());
        let mut counted = false;
        loop {
            if let Some(slot) = free(&self.ring) {
                self.next_iclog = slot;
                return first_err;
            }
            if !counted {
                self.counters.noiclog_waits.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            if let Err(e) = self.take_back(true) {
                if free(&self.ring).is_none() {
                    return Err(e);
                }
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
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

    /// Writes one checkpoint: start op, one op per item payload, commit op.
    ///
    /// `sample_tail(start)` gives the tail to stamp, at most `start` (where the checkpoint's
    /// first record goes). It is called before anything is written; with the reduced policy the
    /// data device is then flushed, so the sampled tail is safe to stamp into every record and
    /// everything written back before the sample (and all ordered data) is stable before the
    /// first iclog goes out. It is called again for a commit iclog whose PREFLUSH covers the
    /// data device (internal log, or legacy on an external one): the commit record carries that
    /// fresher tail, which the flush makes safe as XFS's tail-sampling rule does, and the
    /// returned `Written::tail` is the one it carries.
    ///
    /// Owned images are dropped as soon as they are packed, so the memory of a checkpoint being
    /// written shrinks while the next context fills.
    pub fn write_checkpoint<I>(
        &mut self,
        seq: u64,
        items: I,
        sample_tail: impl FnMut(Lsn) -> Lsn,
    ) -> Result<Written, DeviceError>
    where
        I: ExactSizeIterator,
        I::Item: AsRef<[u8]>,
    {
        let w = self.write_checkpoint_async(seq, items, sample_tail, &mut || true)?;
        self.wait_commit()?;
        Ok(w)
    }

    /// As `write_checkpoint`, but with the write queue the commit iclog may still be in flight
    /// on return: the checkpoint is stable only once `wait_commit` (or the next checkpoint's
    /// commit, which waits for it) returns Ok. Until then a later checkpoint must not stamp a
    /// tail past this one's start.
    ///
    /// The commit iclog of the checkpoint before may itself still be in flight: `prior_stable`
    /// runs (at most once) as soon as that commit is found completed without error, between
    /// this checkpoint's iclogs, so the caller can complete the earlier checkpoint without
    /// waiting for this body (as XFS runs completions at IO completion). If it returns false
    /// (the caller shut down), nothing more of this checkpoint is written.
    pub fn write_checkpoint_async<I>(
        &mut self,
        seq: u64,
        items: I,
        mut sample_tail: impl FnMut(Lsn) -> Lsn,
        prior_stable: &mut dyn FnMut() -> bool,
    ) -> Result<Written, DeviceError>
    where
        I: ExactSizeIterator,
        I::Item: AsRef<[u8]>,
    {
        let body_tail = sample_tail(self.head);
        if self.cfg.policy == FlushPolicy::Reduced {
            self.data_dev.flush()?;
        }
        let count = items.len() as u64;
        self.claim()?;
        let mut w = RecordStream::new(self, body_tail);
        w.prior_stable = Some(prior_stable);
        w.resample_tail = Some(&mut sample_tail);
        w.op(seq, OpKind::Start, &seq.to_le_bytes())?;
        for item in items {
            w.op(seq, OpKind::Item, item.as_ref())?;
        }
        w.op(seq, OpKind::Commit, &count.to_le_bytes())?;
        let (start, commit, tail) = w.finish()?;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(Written {
            start,
            commit,
            tail,
            body_tail,
        })
    }

    /// Writes an unmount record, PREFLUSH+FUA after a data-device flush, and returns its LSN.
    /// The caller has emptied the AIL: the record's tail is the record itself.
    pub fn write_unmount(&mut self) -> Result<Lsn, DeviceError> {
        self.wait_all()?;
        self.data_dev.flush()?;
        let tail = self.head;
        let mut w = RecordStream::new(self, tail);
        w.force_flags = true;
        w.op(0, OpKind::Unmount, &[])?;
        let (lsn, _, _) = w.finish()?;
        self.counters
            .unmount_records
            .fetch_add(1, Ordering::Relaxed);
        Ok(lsn)
    }

    /// Seals and writes the iclog in ring slot `slot` holding `stream_len` stream bytes at the
    /// head, with `flags`. A record that runs past the end of the log goes out as two IOs.
    fn write_iclog(
        &mut self,
        slot: usize,
        stream_len: usize,
        tail: Lsn,
        flags: WriteFlags,
        wait: bool,
    ) -> Result<Lsn, DeviceError> {
        let lsn = self.head;
        let header = RecordHeader {
            cycle: lsn.cycle(),
            payload_len: stream_len as u32,
            lsn,
            tail,
            generation: self.generation,
            crc: 0,
        };
        let sectors = header.total_sectors();
        let bytes = sectors * SECTOR;
        let Some(buf) = self.ring[slot].as_mut() else {
            unreachable!("writing iclog {slot} while it is in flight")
        };
        header.encode_into(&mut buf[..SECTOR]);
        // Zero the tail of the last payload sector so stale stream bytes never reach disk.
        let used =
            SECTOR + (stream_len / SECTOR_PAYLOAD) * SECTOR + 4 + stream_len % SECTOR_PAYLOAD;
        if used < bytes {
            buf[used..bytes].fill(0);
        }
        let to_end = (self.space.sectors - lsn.block()) as usize;
        seal_record(&mut buf[..bytes], |i| {
            if i < to_end {
                lsn.cycle()
            } else {
                lsn.cycle() + 1
            }
        });
        debug_assert!(RecordHeader::decode(&buf[..SECTOR]).is_ok());
        if self.external && self.cfg.policy == FlushPolicy::Legacy {
            // PREFLUSH on the log device does not cover the data device.
            self.data_dev.flush()?;
        }
        let base = self.log_offset;
        let ios = if sectors <= to_end {
            vec![(base + self.space.offset(lsn), 0..bytes)]
        } else {
            let split = to_end * SECTOR;
            vec![
                (base + self.space.offset(lsn), 0..split),
                (base, split..bytes),
            ]
        };
        match (&mut self.io, wait) {
            (Some(_), false) if flags != WriteFlags::NONE && self.commit_io.is_some() => {
                // A commit iclog: a copy goes to the commit thread, so the ring slot is free
                // for the next checkpoint at once.
                debug_assert!(!self.commit_in_flight, "two commit iclogs in flight");
                let Some(buf) = self.ring[slot].as_ref() else {
                    unreachable!("iclog {slot} in flight")
                };
                let offset = ios.first().map_or(0, |io| io.0);
                let mut copy = match self.commit_spare.take() {
                    Some(b) if b.len() >= bytes => b,
                    _ => AlignedBuf::zeroed(self.cfg.logbsize as usize),
                };
                copy[..bytes].copy_from_slice(&buf[..bytes]);
                let job = Job {
                    slot,
                    buf: copy,
                    ios,
                    flags,
                };
                let Some(pool) = self.commit_io.as_ref() else {
                    unreachable!("checked above")
                };
                pool.jobs
                    .send(Msg::Write(job))
                    .map_err(|_| threads_gone(offset))?;
                self.commit_in_flight = true;
            }
            (Some(io), false) => {
                debug_assert!(
                    flags == WriteFlags::NONE || matches!(io, AsyncIo::Threads(_)),
                    "the write queue takes only unflagged iclogs"
                );
                let Some(buf) = self.ring[slot].take() else {
                    unreachable!("iclog {slot} submitted twice")
                };
                // Hold it back for merging only while the pusher has others to fill meanwhile.
                let may_hold =
                    self.ring.iter().filter(|b| b.is_some()).count() >= HOLD_MIN_FREE_ICLOGS;
                let job = Job {
                    slot,
                    buf,
                    ios,
                    flags,
                };
                put_back(&mut self.ring, io.submit(job, may_hold))?;
            }
            _ => {
                let Some(buf) = self.ring[slot].as_ref() else {
                    unreachable!("iclog {slot} in flight")
                };
                for (off, r) in ios {
                    self.log_dev.write(off, &buf[r], flags)?;
                }
            }
        }
        self.head = self.space.advance(lsn, sectors as u32);
        self.counters.iclog_writes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .log_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(lsn)
    }
}

/// Packs an op stream into consecutive iclogs and writes them with the policy's flags.
struct RecordStream<'w> {
    w: &'w mut LogWriter,
    tail: Lsn,
    slot: usize,
    stream_len: usize,
    capacity: usize,
    /// LSN of the first record written, and how many have been.
    first: Option<Lsn>,
    records: usize,
    /// Every record PREFLUSH+FUA (unmount record).
    force_flags: bool,
    /// Told when the previous checkpoint's commit iclog completed (`write_checkpoint_async`).
    prior_stable: Option<&'w mut dyn FnMut() -> bool>,
    /// Samples the tail again for a commit iclog whose PREFLUSH covers the data device.
    resample_tail: Option<&'w mut dyn FnMut(Lsn) -> Lsn>,
}

impl<'w> RecordStream<'w> {
    fn new(w: &'w mut LogWriter, tail: Lsn) -> Self {
        let slot = w.next_iclog;
        let capacity = w.cfg.iclog_payload();
        Self {
            w,
            tail,
            slot,
            stream_len: 0,
            capacity,
            first: None,
            records: 0,
            force_flags: false,
            prior_stable: None,
            resample_tail: None,
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        debug_assert!(bytes.len() <= self.capacity - self.stream_len);
        let Some(buf) = self.w.ring[self.slot].as_mut() else {
            unreachable!("filling iclog {} while it is in flight", self.slot)
        };
        pack(buf, self.stream_len, bytes);
        self.stream_len += bytes.len();
    }

    fn op(&mut self, tid: u64, kind: OpKind, mut data: &[u8]) -> Result<(), DeviceError> {
        let mut flags = 0;
        // Only item ops may be split across records; the others are small and must stay whole.
        let splittable = kind == OpKind::Item;
        loop {
            let need = OP_HEADER_BYTES
                + if splittable {
                    usize::from(!data.is_empty())
                } else {
                    data.len()
                };
            if self.capacity - self.stream_len < need {
                self.emit(false)?;
            }
            let room = self.capacity - self.stream_len - OP_HEADER_BYTES;
            let n = data.len().min(room);
            if n < data.len() {
                flags |= OP_CONTINUED;
            }
            let header = OpHeader {
                tid,
                kind,
                flags,
                len: n as u32,
            };
            self.put(&header.encode());
            self.put(&data[..n]);
            data = &data[n..];
            if data.is_empty() {
                return Ok(());
            }
            self.emit(false)?;
            flags = OP_CONTINUATION;
        }
    }

    /// Writes the current iclog; `last` marks the one holding the commit (or unmount) op.
    fn emit(&mut self, last: bool) -> Result<(), DeviceError> {
        let policy = self.w.cfg.policy;
        let flags = if self.force_flags || policy == FlushPolicy::Legacy {
            WriteFlags::PREFLUSH | WriteFlags::FUA
        } else if !last {
            WriteFlags::NONE
        } else if self.records == 0 {
            // Start and commit share this iclog; the pre-checkpoint flush covered the rest.
            WriteFlags::FUA
        } else {
            WriteFlags::PREFLUSH | WriteFlags::FUA
        };
        if last {
            // The commit iclog goes out only after every earlier iclog completed, so that its
            // PREFLUSH (or the FUA of a one-iclog checkpoint) covers the whole checkpoint.
            self.w.wait_all()?;
            // Its PREFLUSH also makes stable what the AIL wrote back while the body went out
            // (on an internal log the flush is the data device's; legacy flushes the data
            // device before each flagged write to an external log): the commit record may
            // carry the tail as it is now, so that space frees one checkpoint sooner.
            let covers_data = !self.w.external || policy == FlushPolicy::Legacy;
            if flags.contains(WriteFlags::PREFLUSH) && covers_data {
                if let Some(sample) = self.resample_tail.take() {
                    let fresh = sample(self.first.unwrap_or(self.w.head));
                    debug_assert!(fresh >= self.tail, "tail {fresh} behind {}", self.tail);
                    self.tail = self.tail.max(fresh);
                }
            }
        }
        // A checkpoint's commit iclog may stay in flight (see `write_checkpoint_async`); an
        // unmount record is always written synchronously.
        let wait = last && (self.force_flags || self.w.commit_io.is_none());
        let lsn = self
            .w
            .write_iclog(self.slot, self.stream_len, self.tail, flags, wait)?;
        self.first.get_or_insert(lsn);
        self.records += 1;
        self.w.next_iclog = (self.slot + 1) % self.w.ring.len();
        self.stream_len = 0;
        if !last {
            if self.prior_stable.is_some() && self.w.take_completed_commit() {
                if let Some(f) = self.prior_stable.take() {
                    if !f() {
                        return Err(DeviceError::Io {
                            kind: cilfs_device::IoKind::Write,
                            offset: self.w.log_offset,
                            source: std::io::Error::other(
                                "the journal shut down while a checkpoint was written",
                            ),
                        });
                    }
                }
            }
            self.w.claim()?;
            self.slot = self.w.next_iclog;
        }
        Ok(())
    }

    /// Writes the last iclog; returns the first and last record LSNs and the tail the last
    /// one carries.
    fn finish(mut self) -> Result<(Lsn, Lsn, Lsn), DeviceError> {
        let last = self.w.head;
        self.emit(true)?;
        Ok((self.first.unwrap_or(last), last, self.tail))
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
    use cilfs_device::{IoStats, SimDevice};
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
            w.write_checkpoint(1, items.iter(), |h| h).unwrap();
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
