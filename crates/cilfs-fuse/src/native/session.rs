//! The /dev/fuse session: INIT answered on one thread, then worker threads that each read a
//! request, answer it and write the reply, until the kernel says the mount is gone; with FUSE
//! over io_uring (`uring.rs`), queue threads answer the requests and one /dev/fuse worker the
//! rest (FORGET, INTERRUPT).

use super::dev::{FuseDev, Received};
use super::dispatch::{answer_caught, Answer, Dispatcher};
use super::mount::{mount, MountError, MountOptions};
use super::uring::{self, Unavailable, UringMode};
use cilfs_core::fs::{AttrsChanged, Fs};
use cilfs_fuse_proto::flags::init as f;
use cilfs_fuse_proto::{
    negotiate, reply_header, Errno, InHeader, InitConfig, InitReply, Negotiated, Notification, Op,
    Opcode, OutHeader, ProtoError, Reply, Request,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The largest WRITE the kernel may send.
const MAX_WRITE: u32 = 1 << 20;

/// A request buffer: the kernel refuses a read smaller than the largest WRITE it may send
/// (its header and arguments fit in the page beside the data).
const BUF_SIZE: usize = MAX_WRITE as usize + 4096;

/// How the session serves, from the mount options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeConfig {
    /// Worker threads reading /dev/fuse (`threads=N`).
    pub threads: usize,
    /// The kernel keeps dirty pages and writes them back (`writeback_cache`).
    pub writeback_cache: bool,
    /// Whether requests come through io_uring queues (`uring=`).
    pub uring: UringMode,
    /// Whether INIT takes FUSE_ALLOW_IDMAP when the kernel offers it (`idmap`, `noidmap`).
    pub idmap: bool,
}

/// A mounted FUSE connection, not yet served. Dropped without having run to the end, it
/// detaches its mount (a mount whose daemon failed before serving must not stay behind).
pub struct Session {
    dev: Arc<FuseDev>,
    dir: PathBuf,
    ended: bool,
    on_destroy: std::sync::Mutex<Option<super::dispatch::OnDestroy>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("dev", &self.dev)
            .field("dir", &self.dir)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// Writes notifications to the session's /dev/fuse.
#[derive(Debug, Clone)]
pub struct Notifier(Arc<FuseDev>);

impl Notifier {
    /// Drops the kernel's cached attributes of `ino` and its cached data in [off, off+len)
    /// (off negative: the attributes only). False if the kernel does not cache the inode.
    pub fn inval_inode(&self, ino: u64, off: i64, len: i64) -> std::io::Result<bool> {
        self.0
            .send(&[Notification::inval_inode(ino, off, len).as_bytes()])
    }
}

/// Drops the kernel's copy of attributes the core changed behind a reply
/// (`FsOptions::attrs_changed`: set-user-ID and set-group-ID cleared by a write, which the
/// kernel follows by refreshing size and times only). Connected once the session exists;
/// before that the kernel has nothing cached.
#[derive(Debug, Clone, Default)]
pub struct AttrInvalidator(Arc<OnceLock<Notifier>>);

impl AttrInvalidator {
    pub fn connect(&self, n: Notifier) {
        let _ = self.0.set(n);
    }

    pub fn hook(&self) -> AttrsChanged {
        let slot = Arc::clone(&self.0);
        Arc::new(move |ino| {
            if let Some(n) = slot.get() {
                // A negative offset drops the attributes and leaves the pages alone: no page
                // lock to wait for while the request that asked may hold one. An inode the
                // kernel no longer caches is not an error worth a word.
                let _ = n.inval_inode(ino, -1, 0);
            }
        })
    }
}

/// What INIT asks of the kernel: the flags below, the sizes for one max_write and the
/// timestamp granularity of the filesystem; FUSE_OVER_IO_URING if `uring` (then the kernel
/// holds requests back until the queues are registered, or one registration failed);
/// FUSE_ALLOW_IDMAP if `idmap`.
pub fn init_config(fs: &Fs, writeback_cache: bool, uring: bool, idmap: bool) -> InitConfig {
    let mut flags = f::ASYNC_READ
        | f::BIG_WRITES
        | f::MAX_PAGES
        // The umask is ours to apply: a directory's default ACL replaces it.
        | f::DONT_MASK
        | f::DO_READDIRPLUS
        | f::READDIRPLUS_AUTO
        | f::PARALLEL_DIROPS
        // File handles that outlive the kernel's inode cache (NFS export, open_by_handle_at):
        // the kernel finds a forgotten inode by LOOKUP of "." in it, and checks the generation.
        | f::EXPORT_SUPPORT
        // The kernel then stops asking for security.capability before every write (it sets
        // SB_NOSEC and remembers, per inode, that a check found nothing to clear) and stops
        // refreshing attributes and sending a mode of its own before a truncate or chown: the
        // core clears set-user-ID and set-group-ID by Linux's rules on every write, truncate,
        // fallocate and chown (judging CAP_FSETID by the kernel's KILL_SUIDGID flags where a
        // request carries them, otherwise from the caller's process), and drops
        // security.capability on each of them. What it clears behind a reply reaches the
        // kernel through attrs_changed ([`AttrInvalidator`]).
        | f::HANDLE_KILLPRIV_V2
        // A symlink's target never changes and inode numbers are never reused, so the kernel
        // may keep targets in its page cache instead of asking at every path walk through
        // one (cilfs moves no atime on readlink).
        | f::CACHE_SYMLINKS
        // Ioctls on directories too (the mount's root takes the shutdown and label ioctls).
        | f::HAS_IOCTL_DIR;
    // Idmapped mounts (mount_setattr MOUNT_ATTR_IDMAP), which the kernel allows only with
    // default_permissions (cilfs always mounts with it). It then sends ids only with the
    // requests that create an inode (mapped through the mount's idmapping), and
    // FUSE_INVALID_UIDGID in every other, on every mount: the dispatcher makes those
    // callers `Caller::KernelChecked`, whose permission the kernel checked, whose
    // capabilities the core asks their process for, and whose set-ID clearing follows the
    // kernel's KILL_SUIDGID flags.
    if idmap {
        flags |= f::ALLOW_IDMAP;
    }
    if fs.options().acl {
        flags |= f::POSIX_ACL;
    }
    if writeback_cache {
        flags |= f::WRITEBACK_CACHE;
    }
    if uring {
        flags |= f::OVER_IO_URING;
    }
    InitConfig {
        flags,
        // The kernel's own bound applies: negotiate keeps the smaller.
        max_readahead: u32::MAX,
        max_write: MAX_WRITE,
        // Enough 4 KiB pages for one max_write; the kernel caps it at its own limit.
        max_pages: (MAX_WRITE / 4096) as u16,
        // 16 background requests, congestion at three quarters.
        max_background: 16,
        congestion_threshold: 12,
        time_gran: fs.options().tsgran_ns,
        request_timeout: 0,
    }
}

/// Why a session ended other than by an unmount.
#[derive(Debug)]
pub enum SessionError {
    Io(std::io::Error),
    /// The kernel speaks a protocol older than cilfs-fuse-proto accepts.
    Init(ProtoError),
    Thread(std::io::Error),
    /// `uring=on` and the queues could not serve.
    Uring(Unavailable),
}

impl std::error::Error for SessionError {}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::Io(e) => write!(f, "/dev/fuse: {e}"),
            SessionError::Init(e) => write!(f, "FUSE_INIT: {e}"),
            SessionError::Thread(e) => write!(f, "cannot start a FUSE worker thread: {e}"),
            SessionError::Uring(e) => write!(f, "uring=on: FUSE over io_uring unavailable: {e}"),
        }
    }
}

impl Session {
    /// Mounts `dir` (see [`mount`]); serving starts with [`Session::run`].
    pub fn mount(dir: &Path, opts: &MountOptions) -> Result<Session, MountError> {
        let dev = mount(dir, opts)?;
        Ok(Session {
            dev: Arc::new(dev),
            dir: dir.to_path_buf(),
            ended: false,
            on_destroy: std::sync::Mutex::new(None),
        })
    }

    /// Runs `f` when the kernel sends DESTROY, before answering it ([`super::OnDestroy`]).
    pub fn on_destroy(&mut self, f: super::OnDestroy) {
        *self.on_destroy.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }

    pub fn notifier(&self) -> Notifier {
        Notifier(Arc::clone(&self.dev))
    }

    /// Serves until the mount is gone (unmounted, or the connection aborted).
    pub fn run(mut self, fs: Arc<Fs>, cfg: ServeConfig) -> Result<(), SessionError> {
        let r = self.serve(fs, cfg);
        self.ended = r.is_ok();
        r
    }

    fn serve(&self, fs: Arc<Fs>, cfg: ServeConfig) -> Result<(), SessionError> {
        crate::requests::set_transport(crate::requests::Transport::Native);
        let wanted = match cfg.uring {
            UringMode::Off => Err(Unavailable::Off),
            UringMode::Auto | UringMode::On => uring::available(),
        };
        if let (UringMode::On, Err(e)) = (cfg.uring, &wanted) {
            // Checked before mounting too; this is the switch turned off meanwhile.
            return Err(SessionError::Uring(Unavailable::Param(
                std::io::Error::other(e.to_string()),
            )));
        }
        let mut buf = vec![0u8; BUF_SIZE];
        let Some(session) = self.handshake(&fs, cfg, wanted.is_ok(), &mut buf)? else {
            return Ok(());
        };
        drop(buf);
        let on_destroy = self
            .on_destroy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let dispatcher = Dispatcher::new(fs, cfg.writeback_cache).on_destroy(on_destroy);
        let threads = cfg.threads.max(1);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let ring = wanted.and_then(|()| {
                if session.flags & f::OVER_IO_URING == 0 {
                    return Err(Unavailable::NotOffered);
                }
                let plan = uring::plan(threads)?;
                // Said before the queues start: once the last one registers, the kernel sends
                // requests over them, and a stat served there before `start` returned said
                // /dev/fuse (seen under load in mount_native's fallback test). Nothing is
                // served over /dev/fuse until `start` returns, so a failure is told in time.
                crate::requests::set_uring(plan.len(), 0);
                uring::start(
                    s,
                    &self.dev,
                    &dispatcher,
                    &session,
                    &plan,
                    payload_size(),
                    &stop,
                )
            });
            // Said once, in the log: which transport serves and why.
            if ring.is_err() {
                crate::requests::set_transport(crate::requests::Transport::Native);
            }
            let dev_workers = match ring {
                Ok(started) => {
                    crate::requests::set_uring(started.queues, started.entries);
                    tracing::info!(
                        "FUSE transport: io_uring, {} queues, {} entries; FORGET, INTERRUPT and \
                         notifications over /dev/fuse",
                        started.queues,
                        started.entries
                    );
                    1
                }
                // Unmounted before the queues registered: the session ends as any other does.
                Err(Unavailable::Gone) => {
                    stop.store(true, Ordering::Release);
                    return Ok(());
                }
                Err(why) if cfg.uring == UringMode::On => {
                    stop.store(true, Ordering::Release);
                    return Err(SessionError::Uring(why));
                }
                Err(why) => {
                    tracing::info!("FUSE transport: /dev/fuse, {threads} threads ({why})");
                    threads
                }
            };
            let mut workers = Vec::with_capacity(dev_workers);
            for i in 0..dev_workers {
                let w = std::thread::Builder::new()
                    .name(format!("cilfs-fuse-{i}"))
                    .spawn_scoped(s, || worker(&self.dev, &dispatcher, &session))
                    .map_err(SessionError::Thread);
                match w {
                    Ok(w) => workers.push(w),
                    Err(e) if workers.is_empty() => {
                        stop.store(true, Ordering::Release);
                        return Err(e);
                    }
                    // The ones started serve; the read that ends them ends the session.
                    Err(e) => tracing::warn!("{e}"),
                }
            }
            let mut first_error = None;
            for w in workers {
                let r = w.join().unwrap_or_else(|_| {
                    Err(SessionError::Io(std::io::Error::other(
                        "a FUSE worker panicked",
                    )))
                });
                if let (Err(e), None) = (r, &first_error) {
                    first_error = Some(e);
                }
            }
            // The mount is gone: the kernel has ended the queues' entries too (ENOTCONN);
            // this only spares a queue thread the wait for a completion that never comes.
            stop.store(true, Ordering::Release);
            first_error.map_or(Ok(()), Err)
        })
    }

    /// Answers INIT. Before it the kernel sends nothing else; `None` if the mount went away
    /// before it came.
    fn handshake(
        &self,
        fs: &Fs,
        cfg: ServeConfig,
        uring: bool,
        buf: &mut [u8],
    ) -> Result<Option<Negotiated>, SessionError> {
        let config = init_config(fs, cfg.writeback_cache, uring, cfg.idmap);
        loop {
            let n = match self.dev.receive(buf).map_err(SessionError::Io)? {
                Received::Request(n) => n,
                Received::Ended => return Ok(None),
            };
            let msg = &buf[..n];
            let req = match Request::parse(msg) {
                Ok(r) => r,
                Err(e) => {
                    answer_garbage(&self.dev, msg, &e);
                    continue;
                }
            };
            let unique = req.header.unique;
            let Op::Init(init) = req.op else {
                tracing::warn!(
                    "FUSE request {:?} before INIT: answered EIO",
                    req.op.opcode()
                );
                send(&self.dev, Reply::error(unique, Errno::EIO).as_bytes(), &[]);
                continue;
            };
            crate::requests::count(cilfs_fuse_proto::Opcode::Init as u32);
            match negotiate(&init, &config) {
                Ok(InitReply::Accept { out, session }) => {
                    // What the kernel can do, for whoever reads the log: which FUSE
                    // features (passthrough, io_uring, extent maps) this kernel has.
                    tracing::info!(
                        "FUSE protocol 7.{} (the kernel offers 7.{}, INIT flags {:#x}; agreed {:#x})",
                        session.minor,
                        init.minor,
                        init.flags(),
                        session.flags
                    );
                    if fs.options().acl && init.flags() & f::POSIX_ACL == 0 {
                        tracing::warn!(
                            "the kernel does not offer FUSE_POSIX_ACL: ACLs are not enforced"
                        );
                    }
                    send(&self.dev, Reply::init(unique, &out).as_bytes(), &[]);
                    return Ok(Some(session));
                }
                // The kernel will ask again with our major version.
                Ok(InitReply::OfferMajor(out)) => {
                    send(&self.dev, Reply::init(unique, &out).as_bytes(), &[]);
                }
                Err(e) => {
                    send(
                        &self.dev,
                        Reply::error(unique, Errno::EPROTO).as_bytes(),
                        &[],
                    );
                    return Err(SessionError::Init(e));
                }
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.ended {
            // A fuseblk mount's unmount sends DESTROY and waits for its answer, without a
            // timeout and unkillably: nobody serves any more, so a thread of its own answers
            // what still comes (DESTROY, and a sync(2)'s SYNCFS meanwhile, which would hang
            // every later sync on the machine) until the connection ends. It is not waited
            // for: a detached mount still in use keeps its connection until the last close.
            let dev = Arc::clone(&self.dev);
            let _ = std::thread::Builder::new()
                .name("cilfs-fuse-end".into())
                .spawn(move || refuse_until_ended(&dev));
            // Detached: whoever has a file open there keeps it until closing, and the
            // connection ends with the last /dev/fuse descriptor.
            let detached = rustix::mount::unmount(&self.dir, rustix::mount::UnmountFlags::DETACH);
            // A user's mount is fusermount3's to take down.
            if detached == Err(rustix::io::Errno::PERM) {
                let _ = std::process::Command::new("fusermount3")
                    .args(["-u", "-z", "--"])
                    .arg(&self.dir)
                    .status();
            }
        }
    }
}

/// Answers every request of a session that no longer serves: DESTROY with success (the
/// unmount goes on), anything else with EIO, until the connection ends.
fn refuse_until_ended(dev: &FuseDev) {
    let mut buf = vec![0u8; BUF_SIZE];
    while let Ok(Received::Request(n)) = dev.receive(&mut buf) {
        let Ok(h) = InHeader::decode(&buf[..n]) else {
            continue;
        };
        let reply = match h.opcode {
            o if o == Opcode::Forget as u32
                || o == Opcode::BatchForget as u32
                || o == Opcode::Interrupt as u32 =>
            {
                continue
            }
            o if o == Opcode::Destroy as u32 => Reply::empty(h.unique),
            _ => Reply::error(h.unique, Errno::EIO),
        };
        let _ = dev.send(&[reply.as_bytes()]);
    }
}

/// Writes a reply; a failure other than the kernel no longer waiting is logged, and the
/// worker goes on (the next read tells whether the connection is still there).
fn send(dev: &FuseDev, head: &[u8], data: &[u8]) {
    let r = if data.is_empty() {
        dev.send(&[head])
    } else {
        dev.send(&[head, data])
    };
    if let Err(e) = r {
        tracing::error!("writing a FUSE reply: {e}");
    }
}

/// A message that does not decode: EINVAL if its header names a request to answer, never
/// a panic; without a whole header there is nothing to answer.
fn answer_garbage(dev: &FuseDev, msg: &[u8], e: &ProtoError) {
    tracing::warn!("undecodable FUSE request ({} bytes): {e}", msg.len());
    let Ok(h) = InHeader::decode(msg) else { return };
    let no_reply = [
        Opcode::Forget as u32,
        Opcode::BatchForget as u32,
        Opcode::Interrupt as u32,
    ];
    if !no_reply.contains(&h.opcode) {
        send(dev, Reply::error(h.unique, Errno::EINVAL).as_bytes(), &[]);
    }
}

/// The size of a queue entry's payload buffer: what the kernel requires
/// (`fuse_uring_create_ring_ent`: at least max_write and max_pages pages; what we ask in INIT
/// bounds what it agrees to).
fn payload_size() -> usize {
    let page = rustix::param::page_size();
    (MAX_WRITE as usize)
        .max(usize::from((MAX_WRITE / 4096) as u16) * page)
        .max(8192)
}

fn worker(dev: &FuseDev, d: &Dispatcher, session: &Negotiated) -> Result<(), SessionError> {
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let n = match dev.receive(&mut buf).map_err(SessionError::Io)? {
            Received::Request(n) => n,
            Received::Ended => return Ok(()),
        };
        let msg = &buf[..n];
        let req = match Request::parse_with(msg, session) {
            Ok(r) => r,
            Err(e) => {
                answer_garbage(dev, msg, &e);
                continue;
            }
        };
        match answer_caught(d, &req) {
            Answer::Nothing => {}
            Answer::Reply(r) => send(dev, r.as_bytes(), &[]),
            Answer::Data { unique, data } => match reply_header(unique, data.len()) {
                Ok(h) => {
                    let mut head = Vec::with_capacity(OutHeader::SIZE);
                    h.encode(&mut head);
                    send(dev, &head, &data);
                }
                Err(_) => send(dev, Reply::error(unique, Errno::EIO).as_bytes(), &[]),
            },
        }
    }
}
