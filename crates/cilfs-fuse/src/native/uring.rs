//! FUSE over io_uring (Linux 6.14+, `fs/fuse/dev_uring.c`): requests arrive as io_uring
//! completions instead of /dev/fuse reads, and each reply goes back with the command that
//! fetches the next request.
//!
//! The kernel keeps one queue per possible CPU and puts a request in the queue of the CPU its
//! caller runs on (`task_cpu`), in whichever entry of that queue is waiting. It switches the
//! connection over only once every queue has an entry, and holds new requests back until then
//! (or until a registration fails, which turns the ring off for the connection). Here each
//! queue gets a few entries and each entry its own thread with its own small ring (128-byte
//! SQEs, one command in flight): the thread registers the entry (FUSE_IO_URING_CMD_REGISTER,
//! its header and payload buffers as two iovecs), waits for the completion that means a
//! request is in them, answers through the same `Dispatcher` as the /dev/fuse workers, and
//! commits the reply while fetching the next request (COMMIT_AND_FETCH). A thread per entry,
//! not per queue, because a slow request (an fsync waiting on a log force) then holds only its
//! own entry: one thread serving several entries would leave the others' requests waiting
//! behind it. Entries per queue: `threads` spread over the online CPUs, at least 2 (one slow
//! request does not stop a CPU's callers) and at most 8 (each entry's payload buffer is
//! max_write plus a page, a megabyte, though untouched pages cost nothing); a possible but
//! offline CPU gets one. Threads of an online CPU are pinned to it: the caller just ran there
//! and now sleeps waiting for the answer. The answer wakes the caller while that thread still
//! runs, so the scheduler may move the caller to an idle CPU, whose queue takes its next
//! request; unpinned threads avoid that hop but served metadata requests at half the rate
//! (docs/performance-log.md, 2026-11-30, evening), so they stay pinned.
//!
//! FORGET, BATCH_FORGET and INTERRUPT still come through /dev/fuse (the kernel's
//! `fuse_io_uring_ops` send them there), as do requests queued before the ring was ready, and
//! notifications go out through it: the session keeps one /dev/fuse worker.
//!
//! This is one of the two modules of cilfs-fuse with unsafe code (`unsafe_code` is denied
//! elsewhere; the other is `control.rs`'s one ioctl):
//! the kernel writes an entry's buffers between our submission and its completion and reads
//! them after the commit, which the borrow checker cannot see, and io-uring 0.7 cannot set the
//! SQE's `len` that REGISTER needs. The buffers are held as raw allocations that only their
//! thread touches, only between a completion and the next submission, and they are freed only
//! when no command is in flight (otherwise they are left for the process's exit).
#![allow(unsafe_code)]

use super::dev::FuseDev;
use super::dispatch::{Answer, Dispatcher};
use cilfs_fuse_proto::uring::{
    self as ring, UringCmd, UringCmdReq, UringReqHeader, PAYLOAD_HEADROOM,
};
use cilfs_fuse_proto::{reply_header, Errno, InHeader, Negotiated, OutHeader, Reply, Request};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::Scope;

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// The kernel's switch (root: `echo Y > ...`); absent when the kernel has no
/// CONFIG_FUSE_IO_URING.
const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Submission queue size of each thread's ring: one command in flight at a time.
const RING_ENTRIES: u32 = 2;

/// For the mount tests, which must see both ways of falling back on a kernel that has FUSE
/// over io_uring: `register` makes the last queue's entries register a payload buffer smaller
/// than the kernel accepts (it refuses with EINVAL and turns the ring off itself), `setup`
/// makes them fail before registering (the session must turn the ring off). Read once a
/// session starts its queues.
const FAULT_ENV: &str = "CILFS_TEST_URING_FAULT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Register,
    Setup,
}

fn fault() -> Option<Fault> {
    match std::env::var(FAULT_ENV).ok()?.as_str() {
        "register" => Some(Fault::Register),
        "setup" => Some(Fault::Setup),
        _ => None,
    }
}

/// How long a wait for a completion lasts before the thread looks whether the session ended
/// (the kernel normally ends every entry with ENOTCONN at unmount; this is the backstop).
const STOP_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the native transport serves through io_uring queues (mount option `uring=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UringMode {
    /// /dev/fuse only.
    Off,
    /// io_uring where the kernel and this process allow it, else /dev/fuse.
    #[default]
    Auto,
    /// io_uring or no mount.
    On,
}

/// Why a session does not serve through io_uring.
#[derive(Debug)]
pub enum Unavailable {
    /// `uring=off`.
    Off,
    /// No /sys/module/fuse/parameters/enable_uring: a kernel without CONFIG_FUSE_IO_URING.
    NoKernelSupport,
    /// The kernel's switch reads N.
    Disabled,
    Param(io::Error),
    /// io_uring_setup with 128-byte SQEs was refused (seccomp, kernel.io_uring_disabled, ...).
    Setup(io::Error),
    Cpus(String),
    /// The kernel did not offer FUSE_OVER_IO_URING at INIT.
    NotOffered,
    /// FUSE_IO_URING_CMD_REGISTER failed (the kernel then serves through /dev/fuse).
    Register {
        qid: u16,
        error: io::Error,
    },
    Thread(io::Error),
    /// The connection ended (the filesystem was unmounted) before the queues registered:
    /// nothing is unavailable, the session is simply over.
    Gone,
}

impl std::error::Error for Unavailable {}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Off => write!(f, "uring=off"),
            Unavailable::NoKernelSupport => {
                write!(f, "the kernel has no FUSE over io_uring (no {PARAM})")
            }
            Unavailable::Disabled => write!(f, "{PARAM} is N"),
            Unavailable::Param(e) => write!(f, "reading {PARAM}: {e}"),
            Unavailable::Setup(e) => write!(f, "io_uring with 128-byte entries refused: {e}"),
            Unavailable::Cpus(e) => write!(f, "the possible CPUs: {e}"),
            Unavailable::NotOffered => {
                write!(f, "the kernel did not offer FUSE_OVER_IO_URING at INIT")
            }
            Unavailable::Register { qid, error } => {
                write!(f, "FUSE_IO_URING_CMD_REGISTER on queue {qid}: {error}")
            }
            Unavailable::Thread(e) => write!(f, "cannot start a queue thread: {e}"),
            Unavailable::Gone => write!(f, "the connection ended before the queues registered"),
        }
    }
}

/// What can be known before mounting: the kernel's switch is on, and this process may set up
/// a ring with 128-byte SQEs. (The kernel offers FUSE_OVER_IO_URING at INIT exactly when the
/// switch is on.)
pub fn available() -> Result<(), Unavailable> {
    match std::fs::read_to_string(PARAM) {
        Ok(s) if s.trim() == "Y" => {}
        Ok(_) => return Err(Unavailable::Disabled),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Unavailable::NoKernelSupport),
        Err(e) => return Err(Unavailable::Param(e)),
    }
    new_ring().map(drop).map_err(Unavailable::Setup)
}

/// A ring for one thread. DEFER_TASKRUN: the kernel copies the next request into the entry
/// (task work) only when this thread waits for it, with no interrupt meanwhile; kernels
/// without it (before 6.1) get a plain ring.
fn new_ring() -> io::Result<Ring> {
    Ring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING_ENTRIES)
        .or_else(|_| Ring::builder().build(RING_ENTRIES))
}

/// One queue: its id (the CPU's number), the CPU its threads are pinned to (none when
/// offline), and how many entries (threads) serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct QueuePlan {
    pub qid: u16,
    pub cpu: Option<usize>,
    pub entries: usize,
}

/// CPUs as /sys lists them: "0-3,8,10-11".
fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
        if b < a || b - a > 65535 {
            return None;
        }
        cpus.extend(a..=b);
    }
    Some(cpus)
}

fn read_cpus(what: &str) -> Result<Vec<usize>, Unavailable> {
    let path = format!("/sys/devices/system/cpu/{what}");
    let text =
        std::fs::read_to_string(&path).map_err(|e| Unavailable::Cpus(format!("{path}: {e}")))?;
    parse_cpu_list(&text).ok_or_else(|| Unavailable::Cpus(format!("{path}: {:?}", text.trim())))
}

/// The queues the kernel will wait for: one per possible CPU, numbered as the CPUs (the kernel
/// makes `num_possible_cpus()` queues and picks one by CPU number).
fn plan_for(
    possible: &[usize],
    online: &[usize],
    threads: usize,
) -> Result<Vec<QueuePlan>, Unavailable> {
    let n = possible.len();
    if n == 0 || n > usize::from(u16::MAX) {
        return Err(Unavailable::Cpus(format!("{n} possible CPUs")));
    }
    let per = threads.div_ceil(online.len().max(1)).clamp(2, 8);
    Ok((0..n)
        .map(|qid| {
            let on = online.contains(&qid);
            QueuePlan {
                qid: qid as u16,
                cpu: on.then_some(qid),
                entries: if on { per } else { 1 },
            }
        })
        .collect())
}

pub(super) fn plan(threads: usize) -> Result<Vec<QueuePlan>, Unavailable> {
    let possible = read_cpus("possible")?;
    let online = read_cpus("online").unwrap_or_else(|_| possible.clone());
    plan_for(&possible, &online, threads)
}

/// The queues serving: how many, how many entries in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Started {
    pub queues: usize,
    pub entries: usize,
}

/// Starts the queue threads inside `s` and waits for their registrations. Ok once every queue
/// has at least one entry (the kernel then sends requests through the ring; an entry that
/// failed is logged). Otherwise the threads are told to stop, the kernel is made to serve
/// through /dev/fuse ([`turn_off`]), and the error says why.
pub(super) fn start<'scope, 'env>(
    s: &'scope Scope<'scope, 'env>,
    dev: &'env FuseDev,
    d: &'env Dispatcher,
    session: &'env Negotiated,
    plan: &[QueuePlan],
    payload: usize,
    stop: &'env AtomicBool,
) -> Result<Started, Unavailable> {
    let (tx, rx) = mpsc::channel();
    let mut spawned = 0;
    let mut first_error = None;
    let fault = fault();
    'spawn: for q in plan {
        let fault = fault.filter(|_| usize::from(q.qid) + 1 == plan.len());
        for i in 0..q.entries {
            let (tx, q) = (tx.clone(), q.clone());
            let shared = Shared {
                dev,
                d,
                session,
                stop,
            };
            let r = std::thread::Builder::new()
                .name(format!("cilfs-uring-{}.{i}", q.qid))
                .spawn_scoped(s, move || queue_thread(shared, &q, payload, tx, fault));
            match r {
                Ok(_) => spawned += 1,
                Err(e) => {
                    first_error = Some(Unavailable::Thread(e));
                    break 'spawn;
                }
            }
        }
    }
    drop(tx);
    let mut registered = vec![0usize; plan.len()];
    // Each thread reports once and then drops its sender (one that died first drops it too),
    // so this ends when all have answered.
    for (qid, r) in rx.iter().take(spawned) {
        match r {
            Ok(()) => {
                if let Some(n) = registered.get_mut(usize::from(qid)) {
                    *n += 1;
                }
            }
            Err(e) => {
                tracing::warn!("FUSE over io_uring: {e}");
                first_error.get_or_insert(e);
            }
        }
    }
    if registered.iter().all(|&n| n > 0) {
        return Ok(Started {
            queues: plan.len(),
            entries: registered.iter().sum(),
        });
    }
    stop.store(true, Ordering::Release);
    // An unmount right after INIT ends the connection while the entries register: every
    // registration then fails with the connection gone, and there is nothing to turn off.
    if let Some(Unavailable::Register { error, .. }) = &first_error {
        if error.raw_os_error().is_some_and(gone) {
            return Err(Unavailable::Gone);
        }
    }
    // A failed registration already turned the ring off; a thread that failed before
    // registering did not, and the kernel would hold every request back for a ring that will
    // never be ready.
    if let Err(e) = turn_off(dev) {
        tracing::error!("FUSE over io_uring: cannot turn the ring off for this connection: {e}");
    }
    Err(first_error.unwrap_or(Unavailable::Cpus("a queue has no entry".into())))
}

/// Makes the kernel give up the ring for this connection and serve through /dev/fuse: it does
/// so when a registration fails (`fuse_uring_cmd` clears `fc->io_uring` and wakes the requests
/// it held back for the ring). Queue u16::MAX is one it refuses (EINVAL) before it reads any
/// buffer.
fn turn_off(dev: &FuseDev) -> io::Result<()> {
    let mut ring = new_ring()?;
    let req = UringCmdReq {
        qid: u16::MAX,
        ..UringCmdReq::default()
    };
    let sqe = opcode::UringCmd80::new(types::Fd(dev.raw()), UringCmd::Register as u32)
        .cmd(req.command_area())
        .build();
    // SAFETY: the command points at no memory (addr 0, no buffers); the kernel refuses the
    // queue number before it would read the iovecs.
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| io::Error::other("submission queue full"))?;
    ring.submit_and_wait(1)?;
    let result = ring.completion().next().map(|c| c.result());
    match result {
        Some(r) if r < 0 => Ok(()),
        other => Err(io::Error::other(format!(
            "registering queue {} gave {other:?}",
            u16::MAX
        ))),
    }
}

/// Sets an SQE's `len` (bytes 24..28 of `io_uring_sqe`): REGISTER passes the number of its
/// iovecs there, which io-uring 0.7's UringCmd80 cannot set.
fn with_len(sqe: squeue::Entry128, len: u32) -> io::Result<squeue::Entry128> {
    const OPCODE_AT: usize = 0;
    const ADDR_AT: usize = 16;
    const LEN_AT: usize = 24;
    // SAFETY: Entry128 is #[repr(C)]: an io_uring_sqe (64 bytes of integers and unions of
    // integers, no padding, built from a zeroed value so every byte is initialized) then 64
    // bytes of command; transmute checks the sizes. Every byte pattern is a valid Entry128.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    // The layout is the kernel's; a mismatch would be a different crate's Entry128.
    if bytes[OPCODE_AT] != opcode::UringCmd80::CODE || bytes[ADDR_AT..ADDR_AT + 8] == [0; 8] {
        return Err(io::Error::other("io_uring SQE layout is not the kernel's"));
    }
    bytes[LEN_AT..LEN_AT + 4].copy_from_slice(&len.to_le_bytes());
    // SAFETY: as above, any 128 bytes are a valid Entry128.
    Ok(unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) })
}

/// An entry's buffers: the `fuse_uring_req_header`, and [`PAYLOAD_HEADROOM`] bytes followed by
/// the payload (the headroom is where a request is assembled into one message), and the two
/// iovecs REGISTER names. Raw pointers because the kernel writes them behind our back.
struct Buffers {
    header: *mut [u8],
    buf: *mut [u8],
    iov: *mut [libc::iovec; 2],
}

impl Buffers {
    fn new(payload: usize) -> Buffers {
        // Zeroed allocations of this size are fresh pages: a megabyte costs memory only as the
        // kernel fills it.
        let header = Box::into_raw(vec![0u8; UringReqHeader::SIZE].into_boxed_slice());
        let buf = Box::into_raw(vec![0u8; PAYLOAD_HEADROOM + payload].into_boxed_slice());
        let iov = Box::into_raw(Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: UringReqHeader::SIZE,
            },
            libc::iovec {
                iov_base: buf.cast::<u8>().wrapping_add(PAYLOAD_HEADROOM).cast(),
                iov_len: payload,
            },
        ]));
        Buffers { header, buf, iov }
    }

    /// The header buffer and the whole buffer (headroom and payload). Only between a
    /// completion and the next submission.
    fn get(&mut self) -> (&mut [u8], &mut [u8]) {
        // SAFETY: both are live allocations owned by this value (freed only by `free`, which
        // consumes it). The kernel writes them only while a command of this entry is in flight
        // and reads them only after the next commit is submitted; the caller asks after a
        // completion and drops the slices before submitting (they borrow `self`, which
        // `Worker::submit` needs mutably). Nothing else holds a reference: only raw pointers
        // were kept.
        unsafe { (&mut *self.header, &mut *self.buf) }
    }

    /// Frees the buffers.
    ///
    /// # Safety
    /// No command naming them may be in flight: the kernel could still write them.
    unsafe fn free(self) {
        // SAFETY: the three came from Box::into_raw in `new` and are freed once, here; the
        // caller guarantees the kernel no longer uses them.
        unsafe {
            drop(Box::from_raw(self.header));
            drop(Box::from_raw(self.buf));
            drop(Box::from_raw(self.iov));
        }
    }
}

/// One entry and the thread serving it.
struct Worker<'a> {
    dev: &'a FuseDev,
    qid: u16,
    ring: Ring,
    bufs: Buffers,
    /// A command of this entry is with the kernel (its completion not yet reaped).
    in_flight: bool,
    /// A completion taken while registering, served first.
    early: Option<i32>,
    d: &'a Dispatcher,
    session: &'a Negotiated,
    stop: &'a AtomicBool,
}

/// The connection is gone: unmounted, aborted, or the ring cancelled at exit.
fn gone(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV
    )
}

impl Worker<'_> {
    fn submit(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: the SQE names this entry's iovecs (REGISTER) or only numbers (COMMIT), and
        // through the iovecs the entry's buffers; all stay allocated while a command is in
        // flight (`in_flight` keeps `Buffers::free` from running, and a thread that ends with
        // one in flight leaves them allocated), and this thread touches them only after the
        // completion.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        self.in_flight = true;
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The next completion's result, or None when the session ended first.
    fn next(&mut self) -> io::Result<Option<i32>> {
        if let Some(r) = self.early.take() {
            return Ok(Some(r));
        }
        let ts = types::Timespec::from(STOP_POLL);
        loop {
            if let Some(c) = self.ring.completion().next() {
                self.in_flight = false;
                return Ok(Some(c.result()));
            }
            if self.stop.load(Ordering::Acquire) {
                return Ok(None);
            }
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Registers the entry. The kernel refuses at once (the command completes from the
    /// submission with the error); a registration completes only when a request comes.
    fn register(&mut self) -> io::Result<()> {
        let req = UringCmdReq {
            qid: self.qid,
            ..UringCmdReq::default()
        };
        let sqe = opcode::UringCmd80::new(types::Fd(self.dev.raw()), UringCmd::Register as u32)
            .cmd(req.command_area())
            .addr(Some(self.bufs.iov as u64))
            .build();
        self.submit(with_len(sqe, 2)?)?;
        if let Some(c) = self.ring.completion().next() {
            self.in_flight = false;
            if c.result() < 0 {
                return Err(io::Error::from_raw_os_error(-c.result()));
            }
            self.early = Some(c.result());
        }
        Ok(())
    }

    fn commit(&mut self, commit_id: u64) -> io::Result<()> {
        let req = UringCmdReq {
            commit_id,
            qid: self.qid,
            ..UringCmdReq::default()
        };
        let sqe =
            opcode::UringCmd80::new(types::Fd(self.dev.raw()), UringCmd::CommitAndFetch as u32)
                .cmd(req.command_area())
                .build();
        self.submit(sqe)
    }

    /// Answers the request in the entry's buffers and leaves the reply there; returns the
    /// commit id. Whatever the buffers hold, the entry gets a reply (an undecodable request
    /// EINVAL), since the kernel gives the entry back only with a commit.
    fn answer(&mut self) -> u64 {
        let (d, session) = (self.d, self.session);
        let (header, buf) = self.bufs.get();
        // The header buffer is a whole fuse_uring_req_header: these cannot fail.
        let commit_id = ring::ent_in_out(header).map_or(0, |e| e.commit_id);
        let unique = InHeader::decode(header).map_or(0, |h| h.unique);
        let answer = match ring::assemble(header, buf) {
            Ok(r) => match Request::parse_with(&buf[r.msg.clone()], session) {
                Ok(req) => super::dispatch::answer_caught(d, &req),
                Err(e) => {
                    tracing::warn!(
                        "undecodable FUSE request over io_uring ({} bytes): {e}",
                        r.msg.len()
                    );
                    Answer::Reply(Reply::error(unique, Errno::EINVAL))
                }
            },
            Err(e) => {
                tracing::warn!("undecodable FUSE-over-io_uring entry: {e}");
                Answer::Reply(Reply::error(unique, Errno::EINVAL))
            }
        };
        crate::requests::count_ring();
        let payload = &mut buf[PAYLOAD_HEADROOM..];
        let placed = match &answer {
            // The kernel gives an entry back only with a commit, reply or not (dev_uring.c
            // never asks whether the request wants one). FORGET and INTERRUPT do not come this
            // way; NOTIFY_REPLY, the one request without a reply that does, has no out
            // arguments, so an empty success is what its commit reads.
            Answer::Nothing => {
                ring::put_reply(header, payload, Reply::empty(unique).as_bytes(), &[])
            }
            Answer::Reply(r) => ring::put_reply(header, payload, r.as_bytes(), &[]),
            Answer::Data { unique, data } => reply_header(*unique, data.len()).and_then(|h| {
                let mut head = Vec::with_capacity(OutHeader::SIZE);
                h.encode(&mut head);
                ring::put_reply(header, payload, &head, data)
            }),
        };
        if let Err(e) = placed {
            tracing::error!("FUSE reply over io_uring: {e}: answered EIO");
            // A bare header fits any entry.
            let _ = ring::put_reply(
                header,
                payload,
                Reply::error(unique, Errno::EIO).as_bytes(),
                &[],
            );
        }
        commit_id
    }

    /// Serves until the connection is gone or the session tells the thread to stop.
    fn serve(&mut self) -> io::Result<()> {
        // Registrations in a row with no request between: the kernel lost the entry that many
        // times (a commit it could not match), which no longer looks like a passing state.
        let mut again = 0;
        while let Some(res) = self.next()? {
            if res >= 0 {
                again = 0;
                let id = self.answer();
                self.commit(id)?;
                continue;
            }
            let errno = -res;
            if gone(errno) {
                return Ok(());
            }
            // A commit the kernel refused (ENOENT: it no longer knows the request; EIO: the
            // entry was not where it expected) leaves the entry with us, out of its queue: a
            // new registration puts it back.
            if matches!(errno, libc::ENOENT | libc::EIO | libc::EAGAIN) && again < 3 {
                tracing::warn!(
                    "FUSE over io_uring, queue {}: {}: registering the entry again",
                    self.qid,
                    io::Error::from_raw_os_error(errno)
                );
                again += 1;
                self.register()?;
                continue;
            }
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(())
    }
}

/// Pins the calling thread to `cpu`; a refusal (a cpuset without it) leaves it unpinned.
fn pin(cpu: usize) {
    if cpu >= rustix::thread::CpuSet::MAX_CPU {
        return;
    }
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
        tracing::debug!("FUSE over io_uring: not pinned to CPU {cpu}: {e}");
    }
}

type Report = (u16, Result<(), Unavailable>);

/// What every queue thread shares with the session.
#[derive(Clone, Copy)]
struct Shared<'a> {
    dev: &'a FuseDev,
    d: &'a Dispatcher,
    session: &'a Negotiated,
    stop: &'a AtomicBool,
}

fn queue_thread(
    shared: Shared<'_>,
    q: &QueuePlan,
    payload: usize,
    report: mpsc::Sender<Report>,
    fault: Option<Fault>,
) {
    let Shared {
        dev,
        d,
        session,
        stop,
    } = shared;
    if let Some(cpu) = q.cpu {
        pin(cpu);
    }
    // The ring is made here: with SINGLE_ISSUER only its creator may submit.
    let ring = match new_ring() {
        Ok(r) if fault != Some(Fault::Setup) => r,
        Ok(_) => {
            let e = io::Error::other(format!("{FAULT_ENV}=setup"));
            let _ = report.send((q.qid, Err(Unavailable::Setup(e))));
            return;
        }
        Err(e) => {
            let _ = report.send((q.qid, Err(Unavailable::Setup(e))));
            return;
        }
    };
    let payload = match fault {
        Some(Fault::Register) => 4096,
        _ => payload,
    };
    let mut w = Worker {
        dev,
        qid: q.qid,
        ring,
        bufs: Buffers::new(payload),
        in_flight: false,
        early: None,
        d,
        session,
        stop,
    };
    match w.register() {
        Err(error) => {
            let _ = report.send((q.qid, Err(Unavailable::Register { qid: q.qid, error })));
        }
        Ok(()) => {
            let _ = report.send((q.qid, Ok(())));
            drop(report);
            if let Err(e) = w.serve() {
                tracing::error!("FUSE over io_uring, queue {}: {e}: the entry stops", q.qid);
            }
        }
    }
    let Worker {
        bufs,
        in_flight,
        ring,
        ..
    } = w;
    // The ring goes first: closing it cancels what it still has with the kernel.
    drop(ring);
    if !in_flight {
        // SAFETY: no command of this entry is in flight (its last completion was reaped, or
        // nothing was submitted), so the kernel no longer uses the buffers.
        unsafe { bufs.free() };
    }
    // With a command in flight the buffers stay allocated until the process exits: the
    // kernel may still write them while the closed ring's cancellation runs.
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_as_sys_writes_them() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-2,4,6-7"), Some(vec![0, 1, 2, 4, 6, 7]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list("0-99999999"), None);
    }

    #[test]
    fn every_possible_cpu_gets_a_queue() {
        let p = plan_for(&[0, 1, 2, 3], &[0, 1], 4).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(
            p[1],
            QueuePlan {
                qid: 1,
                cpu: Some(1),
                entries: 2
            }
        );
        // Offline CPUs: one entry, unpinned.
        assert_eq!(
            p[3],
            QueuePlan {
                qid: 3,
                cpu: None,
                entries: 1
            }
        );
        // threads spread over the online CPUs, 2..=8 each.
        assert_eq!(plan_for(&[0, 1], &[0, 1], 1).unwrap()[0].entries, 2);
        assert_eq!(plan_for(&[0, 1], &[0, 1], 12).unwrap()[0].entries, 6);
        assert_eq!(plan_for(&[0], &[0], 64).unwrap()[0].entries, 8);
        assert!(plan_for(&[], &[], 4).is_err());
    }

    #[test]
    fn register_sqes_carry_the_iovec_count() {
        let sqe = opcode::UringCmd80::new(types::Fd(5), UringCmd::Register as u32)
            .cmd([7; 80])
            .addr(Some(0x1000))
            .build();
        let sqe = with_len(sqe, 2).unwrap();
        // SAFETY: as in with_len: 128 plain bytes.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(bytes[0], opcode::UringCmd80::CODE);
        assert_eq!(&bytes[4..8], &5i32.to_le_bytes());
        assert_eq!(&bytes[8..12], &1u32.to_le_bytes(), "cmd_op");
        assert_eq!(&bytes[16..24], &0x1000u64.to_le_bytes(), "addr");
        assert_eq!(&bytes[24..28], &2u32.to_le_bytes(), "len");
        assert_eq!(&bytes[48..128], &[7; 80], "the command area");
        // No address: not a REGISTER with buffers, refused.
        let bare = opcode::UringCmd80::new(types::Fd(5), 1).build();
        assert!(with_len(bare, 2).is_err());
    }
}
