//! One decoded request in, one encoded answer out: each opcode translated to one `Fs` call,
//! whether the request came through /dev/fuse or an io_uring queue. Errors become errno values
//! in `errno.rs` only.

use crate::openers::{caller, Openers};
use crate::{errno, requests, STATS_XATTR};
use cilfs_core::fs::types::XattrFlags;
use cilfs_core::fs::types::{Caller, Capability, Cred, RenameFlags, SetAttr, SetTime};
use cilfs_core::fs::{Attr, FileType, Fs, FsError, Timespec};
use cilfs_fuse_proto::flags::{fattr, fsync, write as write_flags};
use cilfs_fuse_proto::{
    dirent_type, AttrOut, CreateIn, Dirents, DirentsPlus, EntryOut, Errno, FallocateIn, GetxattrIn,
    InHeader, IoctlIn, IoctlOut, Kstatfs, LseekIn, Op, OpenOut, ReadIn, Reply, Request, SetattrIn,
    SetxattrIn, Statx, StatxOut, SxTime, WriteIn, ROOT_ID,
};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Duration;

/// How long the kernel may keep attributes and names without asking again (entry and
/// attribute lifetimes). Safe because nothing changes behind the kernel's back: a mount holds
/// its image locked, so every change comes through this mount's kernel, which updates or
/// marks stale its own copy with each request: a reply carrying attributes replaces them
/// (lookup, create, mkdir, mknod, symlink, link, setattr); a write or fallocate marks size,
/// blocks, mtime and ctime stale, a read or readdir atime, an unlink, rename, link or xattr
/// change the ctime (and nlink, dropped in place, for the name removed), a change in a
/// directory the directory's attributes, an ACL change or a reverse invalidation everything.
/// Names change only through unlink, rmdir and rename, which the kernel applies to its
/// dentries itself, and inode numbers are never reused. What the core changes beyond what the
/// reply shows (set-user-ID and set-group-ID cleared by a write or fallocate) it reports
/// through `FsOptions::attrs_changed`, which drops the kernel's copy (`AttrInvalidator`).
/// Mount tests read each field from the kernel's copy right after such changes
/// (`attributes_stay_right_with_long_lifetimes`,
/// `set_user_and_group_id_cleared_behind_a_reply_reach_the_kernels_mode`). Every GETATTR and
/// revalidating LOOKUP this saves is a round trip through the daemon.
const TTL: Duration = Duration::from_secs(3600);

/// The value of [`STATS_XATTR`]: every counter of the filesystem and of the transport.
fn stats_text(fs: &Fs) -> Vec<u8> {
    let mut out = String::new();
    for (k, v) in fs.counters().into_iter().chain(requests::counters()) {
        out.push_str(&format!("{k} {v}\n"));
    }
    out.into_bytes()
}

/// What a request gets back.
#[derive(Debug)]
pub enum Answer {
    /// FORGET, BATCH_FORGET, INTERRUPT, NOTIFY_REPLY: the kernel waits for nothing.
    Nothing,
    Reply(Reply),
    /// READ, READLINK and xattr values: the header and the bytes go out in one writev, without
    /// copying a megabyte of READ data behind a header.
    Data {
        unique: u64,
        data: Vec<u8>,
    },
}

/// Run when the kernel sends DESTROY (a fuseblk mount being unmounted; umount(2) returns
/// once it is answered): the daemon makes everything stable there and lets go of the image.
pub type OnDestroy = Box<dyn FnOnce() + Send>;

/// The state the answers need beyond the filesystem: who opened each file handle.
pub struct Dispatcher {
    /// Taken by the first DESTROY.
    on_destroy: std::sync::Mutex<Option<OnDestroy>>,
    fs: Arc<Fs>,
    /// Who opened each file handle ([`Openers`]).
    openers: Openers,
    /// The kernel keeps written pages (`writeback_cache`): data cilfs has not seen yet.
    writeback_cache: bool,
}

fn cred(h: &InHeader) -> Cred {
    caller(h.uid, h.gid, h.pid)
}

/// The caller of a create, with the umask the kernel passed along (FUSE_DONT_MASK: ours to
/// apply, since a directory's default ACL replaces it).
fn creator(h: &InHeader, umask: u32) -> Cred {
    Cred { umask, ..cred(h) }
}

fn kind_bits(k: FileType) -> u32 {
    match k {
        FileType::Regular => libc::S_IFREG,
        FileType::Directory => libc::S_IFDIR,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Fifo => libc::S_IFIFO,
        FileType::Socket => libc::S_IFSOCK,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
    }
}

/// Seconds as the kernel reads them: a signed count stored in a u64 (two's complement for
/// times before 1970).
fn secs(t: Timespec) -> u64 {
    t.sec as u64
}

fn wire_attr(a: &Attr) -> cilfs_fuse_proto::Attr {
    cilfs_fuse_proto::Attr {
        ino: a.ino,
        size: a.size,
        blocks: a.blocks_512,
        atime: secs(a.atime),
        mtime: secs(a.mtime),
        ctime: secs(a.ctime),
        atimensec: a.atime.nsec,
        mtimensec: a.mtime.nsec,
        ctimensec: a.ctime.nsec,
        mode: kind_bits(a.kind) | u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // The kernel's fuse_attr carries 32 bits of device number.
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

/// Entry and attribute lifetimes: [`TTL`].
fn entry_out(a: &Attr) -> EntryOut {
    EntryOut {
        nodeid: a.ino,
        generation: a.generation,
        entry_valid: TTL.as_secs(),
        attr_valid: TTL.as_secs(),
        entry_valid_nsec: TTL.subsec_nanos(),
        attr_valid_nsec: TTL.subsec_nanos(),
        attr: wire_attr(a),
    }
}

fn attr_out(a: &Attr) -> AttrOut {
    AttrOut {
        attr_valid: TTL.as_secs(),
        attr_valid_nsec: TTL.subsec_nanos(),
        dummy: 0,
        attr: wire_attr(a),
    }
}

fn sx_time(t: Timespec) -> SxTime {
    SxTime {
        tv_sec: t.sec,
        tv_nsec: t.nsec,
        reserved: 0,
    }
}

/// STATX's answer: the basic attributes and the birth time (the kernel asks for it when a
/// caller wants btime, `stat -c %w`, and keeps it beside its attributes).
fn statx_out(a: &Attr) -> StatxOut {
    // The device number as mknod got it: the kernel's new_encode_dev.
    let (major, minor) = (
        (a.rdev as u32 & 0xfff00) >> 8,
        (a.rdev as u32 & 0xff) | ((a.rdev as u32 >> 12) & 0xfff00),
    );
    StatxOut {
        attr_valid: TTL.as_secs(),
        attr_valid_nsec: TTL.subsec_nanos(),
        stat: Statx {
            mask: libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            blksize: a.blksize,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            mode: (kind_bits(a.kind) | u32::from(a.perm)) as u16,
            ino: a.ino,
            size: a.size,
            blocks: a.blocks_512,
            atime: sx_time(a.atime),
            btime: sx_time(a.crtime),
            ctime: sx_time(a.ctime),
            mtime: sx_time(a.mtime),
            rdev_major: major,
            rdev_minor: minor,
            ..Statx::default()
        },
        ..StatxOut::default()
    }
}

/// A time the kernel sent (seconds as a signed count in a u64, nanoseconds below 1e9 from any
/// honest kernel; carried over if not, as SystemTime arithmetic would).
fn time_in(sec: u64, nsec: u32) -> Timespec {
    let carry = i64::from(nsec / 1_000_000_000);
    Timespec {
        sec: (sec as i64).saturating_add(carry),
        nsec: nsec % 1_000_000_000,
    }
}

fn fs_error(unique: u64, e: FsError) -> Answer {
    Answer::Reply(Reply::error(unique, errno::replied(&e)))
}

/// Whether a shut-down filesystem (the shutdown ioctl, or an IO error) answers `op` with EIO:
/// every request until the unmount, as on XFS, but those the kernel waits for no answer to
/// and DESTROY, which still runs the daemon's unmount.
fn refused_when_shut_down(op: &Op<'_>) -> bool {
    !matches!(
        op,
        Op::Forget(_)
            | Op::BatchForget(_)
            | Op::NotifyReply { .. }
            | Op::Interrupt(_)
            | Op::Destroy
    )
}

/// An IOCTL answered in full: its result 0 and the bytes the caller reads back.
fn ioctl_answer(unique: u64, r: Result<Vec<u8>, Errno>) -> Answer {
    match r {
        Ok(out) => {
            let mut data = Vec::with_capacity(IoctlOut::SIZE + out.len());
            IoctlOut {
                result: 0,
                flags: 0,
                in_iovs: 0,
                out_iovs: 0,
            }
            .encode(&mut data);
            data.extend_from_slice(&out);
            Answer::Data { unique, data }
        }
        Err(e) => fail(unique, e),
    }
}

fn fail(unique: u64, e: Errno) -> Answer {
    Answer::Reply(Reply::error(unique, e))
}

fn empty(unique: u64, r: Result<(), FsError>) -> Answer {
    match r {
        Ok(()) => Answer::Reply(Reply::empty(unique)),
        Err(e) => fs_error(unique, e),
    }
}

fn entry(unique: u64, r: Result<Attr, FsError>) -> Answer {
    match r {
        Ok(a) => Answer::Reply(Reply::entry(unique, &entry_out(&a))),
        Err(e) => fs_error(unique, e),
    }
}

/// GETXATTR and LISTXATTR's size rules: size 0 asks for the length, a value longer than the
/// caller's buffer is ERANGE.
fn sized(unique: u64, size: u32, v: Vec<u8>) -> Answer {
    if size == 0 {
        match u32::try_from(v.len()) {
            Ok(n) => Answer::Reply(Reply::xattr_size(unique, n)),
            Err(_) => fail(unique, Errno::E2BIG),
        }
    } else if v.len() > size as usize {
        fail(unique, Errno::ERANGE)
    } else {
        Answer::Data { unique, data: v }
    }
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("openers", &self.openers)
            .field("writeback_cache", &self.writeback_cache)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    pub fn new(fs: Arc<Fs>, writeback_cache: bool) -> Dispatcher {
        Dispatcher {
            on_destroy: std::sync::Mutex::new(None),
            fs,
            openers: Openers::new(),
            writeback_cache,
        }
    }

    /// What DESTROY runs before it is answered.
    pub fn on_destroy(self, f: Option<OnDestroy>) -> Dispatcher {
        Dispatcher {
            on_destroy: std::sync::Mutex::new(f),
            ..self
        }
    }

    /// `REMOUNT_IOCTL`: the filesystem switched to read-only (`1`) or read-write (`0`), by
    /// root only.
    fn remount(&self, u: u64, h: &InHeader, data: &[u8]) -> Answer {
        if !self.fs.capable(cred(h), Capability::SysAdmin) {
            return fail(u, Errno::EPERM);
        }
        let ro = match <[u8; 4]>::try_from(data).map(u32::from_ne_bytes) {
            Ok(1) => true,
            Ok(0) => false,
            _ => return fail(u, Errno::EINVAL),
        };
        match self.fs.set_read_only(ro) {
            Ok(()) => {
                tracing::info!(
                    "remounted {}",
                    if ro {
                        "read-only: everything written back, the log clean, nothing more written"
                    } else {
                        "read-write"
                    }
                );
                let out = cilfs_fuse_proto::IoctlOut {
                    result: 0,
                    flags: 0,
                    in_iovs: 0,
                    out_iovs: 0,
                };
                Answer::Reply(Reply::ioctl(u, &out))
            }
            Err(e) => {
                tracing::error!(
                    "remount {}: {e}",
                    if ro { "read-only" } else { "read-write" }
                );
                fs_error(u, e)
            }
        }
    }

    /// A new file handle, remembering who opened it until its release.
    fn file_handle(&self, opener: Cred) -> u64 {
        self.openers.open(opener)
    }

    fn opened(&self, fh: u64) -> OpenOut {
        OpenOut {
            fh,
            open_flags: 0,
            backing_id: 0,
        }
    }

    /// The caller a write is judged as ([`Openers::writer`]). A write a process made itself
    /// carries the kernel's word on set-ID (FUSE_WRITE_KILL_SUIDGID: the writer lacks
    /// CAP_FSETID), which is what a kernel-checked caller is judged by.
    fn writer(&self, h: &InHeader, fh: u64, flags: u32) -> Cred {
        let from_page_cache = flags & write_flags::CACHE != 0;
        let mut c = cred(h);
        if let Caller::KernelChecked { kill_setid } = &mut c.caller {
            if !from_page_cache {
                *kill_setid = Some(flags & write_flags::KILL_SUIDGID != 0);
            }
        }
        self.openers.writer(fh, from_page_cache, c)
    }

    /// Answers one request (INIT excepted: the session negotiates it before serving).
    pub fn answer(&self, req: &Request<'_>) -> Answer {
        let h = &req.header;
        requests::count(h.opcode);
        let u = h.unique;
        let ino = h.nodeid;
        let fs = &*self.fs;
        if fs.is_shut_down() && refused_when_shut_down(&req.op) {
            return fail(u, Errno::EIO);
        }
        match &req.op {
            Op::Forget(_) | Op::BatchForget(_) | Op::NotifyReply { .. } => Answer::Nothing,
            // Nothing here blocks on the caller, so an interrupted request simply finishes;
            // the kernel needs no answer to the INTERRUPT itself.
            Op::Interrupt(_) => Answer::Nothing,
            Op::Lookup { name } => entry(u, fs.lookup(ino, name.as_bytes())),
            Op::Getattr(_) => match fs.getattr(ino) {
                Ok(a) => Answer::Reply(Reply::attr(u, &attr_out(&a))),
                Err(e) => fs_error(u, e),
            },
            Op::Setattr(s) => self.setattr(u, h, ino, s),
            Op::Statx(_) => match fs.getattr(ino) {
                Ok(a) => Answer::Reply(Reply::statx(u, &statx_out(&a))),
                Err(e) => fs_error(u, e),
            },
            Op::Readlink => match fs.readlink(ino) {
                Ok(t) => Answer::Data { unique: u, data: t },
                Err(e) => fs_error(u, e),
            },
            // The first name is the new entry's, the second the link's target.
            Op::Symlink { name, target } => entry(
                u,
                fs.symlink(cred(h), ino, name.as_bytes(), target.as_bytes()),
            ),
            Op::Mknod { arg, name } => entry(
                u,
                fs.mknod(
                    creator(h, arg.umask),
                    ino,
                    name.as_bytes(),
                    arg.mode,
                    u64::from(arg.rdev),
                ),
            ),
            Op::Mkdir { arg, name } => entry(
                u,
                fs.mkdir(creator(h, arg.umask), ino, name.as_bytes(), arg.mode),
            ),
            Op::Unlink { name } => empty(u, fs.unlink(ino, name.as_bytes())),
            Op::Rmdir { name } => empty(u, fs.rmdir(ino, name.as_bytes())),
            Op::Rename { arg, name, newname } => {
                self.rename(u, h, ino, name, arg.newdir, newname, 0)
            }
            Op::Rename2 { arg, name, newname } => {
                self.rename(u, h, ino, name, arg.newdir, newname, arg.flags)
            }
            Op::Link { arg, newname } => entry(u, fs.link(arg.oldnodeid, ino, newname.as_bytes())),
            Op::Open(o) => self.open(u, h, ino, o.flags),
            Op::Read(r) => self.read(u, ino, r),
            Op::Write { arg, data } => self.write(u, h, ino, arg, data),
            Op::Statfs => self.statfs(u),
            Op::Release(r) => {
                self.openers.release(r.fh);
                empty(u, fs.release_inode(ino))
            }
            Op::Releasedir(_) => empty(u, fs.release_inode(ino)),
            Op::Fsync(a) if a.fsync_flags & fsync::FDATASYNC != 0 => empty(u, fs.fdatasync(ino)),
            Op::Fsync(_) | Op::Fsyncdir(_) => empty(u, fs.fsync(ino)),
            // ENOSYS: the kernel then sends no FLUSH again on this mount (`fc->no_flush`), and
            // every close costs one synchronous round trip less. Nothing is owed at close:
            // there are no locks to drop (the kernel keeps POSIX locks locally), dirty data
            // waits in the daemon's page cache whatever happens at close (fsync makes it
            // durable), the kernel still writes back its own dirty pages before a close
            // returns (writeback_cache), and the open count that keeps an unlinked file alive
            // drops at release, which still comes.
            Op::Flush(_) => fail(u, Errno::ENOSYS),
            Op::Setxattr { arg, name, value } => self.setxattr(u, h, ino, arg, name, value),
            Op::Getxattr { arg, name } => self.getxattr(u, ino, arg, name),
            Op::Listxattr(arg) => self.listxattr(u, h, ino, arg),
            Op::Removexattr { name } => empty(
                u,
                fs.set_xattr_as(cred(h), ino, name.as_bytes(), None, XattrFlags::default()),
            ),
            Op::Opendir(_) => self.opendir(u, ino),
            Op::Readdir(r) => self.readdir(u, ino, r),
            Op::Readdirplus(r) => self.readdirplus(u, ino, r),
            // Permission bits are checked by the kernel (default_permissions); this answers
            // existence.
            Op::Access(_) => empty(u, fs.getattr(ino).map(|_| ())),
            Op::Create { arg, name } => self.create(u, h, ino, arg, name),
            // The kernel sends "/" as the name: the file has none.
            Op::Tmpfile { arg, .. } => self.tmpfile(u, h, ino, arg),
            Op::Fallocate(f) => self.fallocate(u, h, ino, f),
            // With writeback_cache the kernel may hold written data cilfs has not seen, so
            // cilfs's holes may not be holes: ENOSYS has the kernel answer SEEK_DATA and
            // SEEK_HOLE itself from then on (the whole file as data), as for a FUSE server
            // without LSEEK.
            Op::Lseek(_) if self.writeback_cache => fail(u, Errno::ENOSYS),
            Op::Lseek(l) => self.lseek(u, ino, l),
            // syncfs(2) and sync(2), where the kernel passes them on: every dirty page written
            // back and the journal forced, so that what was synced survives a crash.
            Op::Syncfs(_) => empty(u, fs.sync()),
            // Unmounting (fuseblk only): umount(2) waits for this answer, so the daemon
            // makes everything stable first (`on_destroy`); without it, when the session ends.
            Op::Destroy => {
                let f = self
                    .on_destroy
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                if let Some(f) = f {
                    f();
                }
                Answer::Reply(Reply::empty(u))
            }
            Op::Ioctl { arg, data } => self.ioctl(u, h, ino, arg, data),
            // A second INIT after the handshake is the kernel's mistake.
            Op::Init(_) => fail(u, Errno::EIO),
            // Not served: the kernel then handles locks locally and falls back from
            // COPY_FILE_RANGE to reads and writes.
            Op::Getlk(_)
            | Op::Setlk(_)
            | Op::Setlkw(_)
            | Op::Bmap(_)
            | Op::Poll(_)
            | Op::CopyFileRange(_)
            | Op::CopyFileRange64(_)
            | Op::Unsupported { .. }
            | Op::Unknown { .. } => fail(u, Errno::ENOSYS),
        }
    }

    /// IOCTL: the remount ioctl, and the Linux ones `ioctl.rs` answers (inode flags,
    /// shutdown, label, FITRIM); any other fails (Python's isatty() on every open() sends one).
    fn ioctl(&self, u: u64, h: &InHeader, ino: u64, arg: &IoctlIn, data: &[u8]) -> Answer {
        use super::ioctl as i;
        let fs = &*self.fs;
        let r = match arg.cmd {
            super::REMOUNT_IOCTL => return self.remount(u, h, data),
            cmd if i::is_fileattr(cmd) => i::fileattr(fs, cred(h), ino, arg, data),
            i::FS_IOC_GETFSLABEL | i::FS_IOC_SETFSLABEL => i::label(fs, cred(h), arg.cmd, data),
            i::XFS_IOC_GOINGDOWN => i::shutdown(fs, cred(h), data),
            i::FITRIM => i::trim(fs, cred(h), data),
            _ => return fail(u, Errno::ENOSYS),
        };
        ioctl_answer(u, r)
    }

    /// OPEN: a new file handle, remembering the opener. The open(2) flags decide what the
    /// inode flags allow (the kernel does not know them).
    fn open(&self, u: u64, h: &InHeader, ino: u64, flags: u32) -> Answer {
        let fs = &*self.fs;
        let flags = flags as i32;
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        match fs.open_as(ino, write, flags & libc::O_APPEND != 0) {
            Ok(_) => {
                let fh = self.file_handle(cred(h));
                Answer::Reply(Reply::open(u, &self.opened(fh)))
            }
            Err(e) => fs_error(u, e),
        }
    }

    /// READ, touching the access time unless the file was opened O_NOATIME.
    fn read(&self, u: u64, ino: u64, r: &ReadIn) -> Answer {
        let fs = &*self.fs;
        // The open file's flags: O_NOATIME (the kernel let only the owner or root set it).
        let touch_atime = r.flags as i32 & libc::O_NOATIME == 0;
        match fs.read_opts(ino, r.offset, r.size, touch_atime) {
            Ok(data) => Answer::Data { unique: u, data },
            Err(e) => fs_error(u, e),
        }
    }

    /// WRITE, as the caller the open file handle names.
    fn write(&self, u: u64, h: &InHeader, ino: u64, arg: &WriteIn, data: &[u8]) -> Answer {
        let fs = &*self.fs;
        let who = self.writer(h, arg.fh, arg.write_flags);
        // The open file's flags: an O_DIRECT write reaches the device before its reply.
        let r = match arg.flags as i32 & libc::O_DIRECT != 0 {
            true => fs.write_direct(who, ino, arg.offset, data),
            false => fs.write(who, ino, arg.offset, data),
        };
        match r {
            // At most max_write bytes came, so the count fits.
            Ok(n) => Answer::Reply(Reply::write(u, n as u32)),
            Err(e) => fs_error(u, e),
        }
    }

    /// LISTXATTR: the names, each ended by a NUL. `trusted.*` names only to root
    /// (CAP_SYS_ADMIN), as ext4 and XFS list them (the kernel lets only it read them; it passes
    /// FUSE the list as given). The caller is judged once, and only if there is such a name.
    fn listxattr(&self, u: u64, h: &InHeader, ino: u64, arg: &GetxattrIn) -> Answer {
        let fs = &*self.fs;
        match fs.listxattr(ino) {
            Ok(names) => {
                let mut buf = Vec::new();
                let admin = std::cell::OnceCell::new();
                let shown = |n: &Vec<u8>| {
                    !n.starts_with(b"trusted.")
                        || *admin.get_or_init(|| fs.capable(cred(h), Capability::SysAdmin))
                };
                for n in names.into_iter().filter(shown) {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                sized(u, arg.size, buf)
            }
            Err(e) => fs_error(u, e),
        }
    }

    /// OPENDIR: only a directory opens as one.
    fn opendir(&self, u: u64, ino: u64) -> Answer {
        let fs = &*self.fs;
        match fs.open_inode(ino) {
            Ok(a) if a.kind == FileType::Directory => {
                Answer::Reply(Reply::open(u, &self.opened(0)))
            }
            Ok(_) => {
                let _ = fs.release_inode(ino);
                fail(u, Errno::ENOTDIR)
            }
            Err(e) => fs_error(u, e),
        }
    }

    /// SETATTR: the fields the request marks valid, the times given or now.
    fn setattr(&self, u: u64, h: &InHeader, ino: u64, s: &SetattrIn) -> Answer {
        let fs = &*self.fs;
        let has = |bit: u32| s.valid & bit != 0;
        let time = |set: u32, now: u32, sec: u64, nsec: u32| {
            has(set).then(|| {
                if has(now) {
                    SetTime::Now
                } else {
                    SetTime::At(time_in(sec, nsec))
                }
            })
        };
        let chown = has(fattr::UID) || has(fattr::GID);
        let mut who = cred(h);
        // A truncate's FATTR_KILL_SUIDGID says the caller lacks CAP_FSETID; with a chown the
        // kernel sets it whoever calls (set-user-ID always goes), so it says nothing then.
        if let Caller::KernelChecked { kill_setid } = &mut who.caller {
            if has(fattr::SIZE) && !chown {
                *kill_setid = Some(has(fattr::KILL_SUIDGID));
            }
        }
        let sa = SetAttr {
            mode: has(fattr::MODE).then_some(s.mode),
            uid: has(fattr::UID).then_some(s.uid),
            gid: has(fattr::GID).then_some(s.gid),
            size: has(fattr::SIZE).then_some(s.size),
            atime: time(fattr::ATIME, fattr::ATIME_NOW, s.atime, s.atimensec),
            mtime: time(fattr::MTIME, fattr::MTIME_NOW, s.mtime, s.mtimensec),
        };
        match fs.setattr(who, ino, sa) {
            Ok(a) => Answer::Reply(Reply::attr(u, &attr_out(&a))),
            Err(e) => fs_error(u, e),
        }
    }

    /// STATFS.
    fn statfs(&self, u: u64) -> Answer {
        let fs = &*self.fs;
        let s = fs.statfs();
        Answer::Reply(Reply::statfs(
            u,
            &Kstatfs {
                blocks: s.blocks,
                bfree: s.bfree,
                bavail: s.bavail,
                files: s.files,
                ffree: s.ffree,
                bsize: s.bsize,
                namelen: s.namelen,
                frsize: s.bsize,
                ..Kstatfs::default()
            },
        ))
    }

    /// SETXATTR, its flags translated.
    fn setxattr(
        &self,
        u: u64,
        h: &InHeader,
        ino: u64,
        arg: &SetxattrIn,
        name: &std::ffi::OsStr,
        value: &[u8],
    ) -> Answer {
        let fs = &*self.fs;
        let flags = arg.flags as i32;
        let f = XattrFlags {
            create: flags & libc::XATTR_CREATE != 0,
            replace: flags & libc::XATTR_REPLACE != 0,
        };
        empty(
            u,
            fs.set_xattr_as(cred(h), ino, name.as_bytes(), Some(value), f),
        )
    }

    /// GETXATTR; the root's statistics xattr is the daemon's own.
    fn getxattr(&self, u: u64, ino: u64, arg: &GetxattrIn, name: &std::ffi::OsStr) -> Answer {
        let fs = &*self.fs;
        let r = if ino == ROOT_ID && name.as_bytes() == STATS_XATTR {
            Ok(stats_text(fs))
        } else {
            fs.getxattr(ino, name.as_bytes())
        };
        match r {
            Ok(v) => sized(u, arg.size, v),
            Err(e) => fs_error(u, e),
        }
    }

    /// READDIR: as many entries as fit the kernel's buffer.
    fn readdir(&self, u: u64, ino: u64, r: &ReadIn) -> Answer {
        let fs = &*self.fs;
        match fs.readdir(ino, r.offset, 128) {
            Ok(entries) => {
                let mut out = Dirents::new(r.size);
                for (e, next) in entries {
                    let typ = dirent_type(kind_bits(e.kind));
                    match out.push(e.ino, next, typ, &e.name) {
                        Ok(true) => {}
                        Ok(false) => break,
                        // A name the kernel would refuse the whole listing for (the core
                        // stores none): left out, the listing goes on.
                        Err(_) => continue,
                    }
                }
                match Reply::dirents(u, &out) {
                    Ok(r) => Answer::Reply(r),
                    Err(_) => fail(u, Errno::EIO),
                }
            }
            Err(e) => fs_error(u, e),
        }
    }

    /// READDIRPLUS: entries with their attributes, as many as fit the kernel's buffer.
    fn readdirplus(&self, u: u64, ino: u64, r: &ReadIn) -> Answer {
        let fs = &*self.fs;
        match fs.readdir(ino, r.offset, 64) {
            Ok(entries) => {
                let mut out = DirentsPlus::new(r.size);
                for (i, (e, next)) in entries.into_iter().enumerate() {
                    let a = match fs.getattr(e.ino) {
                        Ok(a) => a,
                        // Unlinked since the listing was read: its name is gone too.
                        Err(FsError::NotFound) => continue,
                        // A corrupt or unreadable inode fails the listing (EUCLEAN, EIO)
                        // rather than dropping a name silently; entries already added go
                        // out first and the next call starts at the failing one.
                        Err(e) if i == 0 => return fs_error(u, e),
                        Err(_) => break,
                    };
                    let typ = dirent_type(kind_bits(e.kind));
                    match out.push(&entry_out(&a), e.ino, next, typ, &e.name) {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(_) => continue,
                    }
                }
                match Reply::dirents_plus(u, &out) {
                    Ok(r) => Answer::Reply(r),
                    Err(_) => fail(u, Errno::EIO),
                }
            }
            Err(e) => fs_error(u, e),
        }
    }

    /// CREATE: a new regular file, opened.
    fn create(
        &self,
        u: u64,
        h: &InHeader,
        ino: u64,
        arg: &CreateIn,
        name: &std::ffi::OsStr,
    ) -> Answer {
        let fs = &*self.fs;
        let r = fs
            .mknod(creator(h, arg.umask), ino, name.as_bytes(), arg.mode, 0)
            .and_then(|a| fs.open_inode(a.ino));
        match r {
            Ok(a) => {
                let fh = self.file_handle(cred(h));
                Answer::Reply(Reply::create(u, &entry_out(&a), &self.opened(fh)))
            }
            Err(e) => fs_error(u, e),
        }
    }

    /// TMPFILE (O_TMPFILE): a new unnamed regular file, opened; its link count of 0 is what
    /// lets the kernel's linkat name it later.
    fn tmpfile(&self, u: u64, h: &InHeader, ino: u64, arg: &CreateIn) -> Answer {
        match self.fs.tmpfile(creator(h, arg.umask), ino, arg.mode) {
            Ok(a) => {
                let fh = self.file_handle(cred(h));
                Answer::Reply(Reply::create(u, &entry_out(&a), &self.opened(fh)))
            }
            Err(e) => fs_error(u, e),
        }
    }

    /// FALLOCATE, every mode of Linux's, with its mode checks (`vfs_fallocate`): one mode
    /// at a time, KEEP_SIZE required by PUNCH_HOLE and refused by COLLAPSE_RANGE and
    /// INSERT_RANGE. UNSHARE_RANGE is preallocation (no block is shared in cilfs). The kernel
    /// (6.18, `fuse_file_fallocate`) sends only KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE, writes
    /// its cached pages of the range back first and drops them after; it refuses the others
    /// itself, which a kernel that sent them would have to drop from the offset to the end.
    fn fallocate(&self, u: u64, h: &InHeader, ino: u64, f: &FallocateIn) -> Answer {
        let fs = &*self.fs;
        let mode = f.mode as i32;
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let (off, len, c) = (f.offset, f.length, cred(h));
        let r = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 | libc::FALLOC_FL_UNSHARE_RANGE => fs.fallocate(c, ino, off, len, keep, false),
            libc::FALLOC_FL_PUNCH_HOLE if keep => fs.fallocate(c, ino, off, len, true, true),
            libc::FALLOC_FL_ZERO_RANGE => fs.zero_range(c, ino, off, len, keep),
            libc::FALLOC_FL_COLLAPSE_RANGE if !keep => fs.collapse_range(c, ino, off, len),
            libc::FALLOC_FL_INSERT_RANGE if !keep => fs.insert_range(c, ino, off, len),
            _ => return fail(u, Errno::EOPNOTSUPP),
        };
        empty(u, r)
    }

    /// LSEEK: SEEK_DATA and SEEK_HOLE.
    fn lseek(&self, u: u64, ino: u64, l: &LseekIn) -> Answer {
        let fs = &*self.fs;
        let data = match l.whence as i32 {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return fail(u, Errno::EINVAL),
        };
        // A negative offset lies outside the file, as past its end: ENXIO, as Linux
        // filesystems answer (iomap_seek_data/hole).
        if (l.offset as i64) < 0 {
            return fail(u, Errno::ENXIO);
        }
        match fs.seek(ino, l.offset, data) {
            Ok(o) => Answer::Reply(Reply::lseek(u, o)),
            Err(e) => fs_error(u, e),
        }
    }

    /// RENAME and RENAME2; the caller owns a whiteout (the kernel sends its ids for
    /// RENAME_WHITEOUT, and has checked it may make one: CAP_MKNOD).
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        u: u64,
        h: &InHeader,
        parent: u64,
        name: &std::ffi::OsStr,
        newparent: u64,
        newname: &std::ffi::OsStr,
        flags: u32,
    ) -> Answer {
        let (noreplace, exchange, whiteout) = (
            libc::RENAME_NOREPLACE,
            libc::RENAME_EXCHANGE,
            libc::RENAME_WHITEOUT,
        );
        if flags & !(noreplace | exchange | whiteout) != 0 {
            return fail(u, Errno::EINVAL);
        }
        let f = RenameFlags {
            noreplace: flags & noreplace != 0,
            exchange: flags & exchange != 0,
            whiteout: flags & whiteout != 0,
        };
        let (name, newname) = (name.as_bytes(), newname.as_bytes());
        empty(
            u,
            self.fs
                .rename_as(cred(h), parent, name, newparent, newname, f),
        )
    }
}

/// Answers one request; a bug met while answering must not leave the caller waiting forever
/// nor take the thread with it: the request gets EIO.
pub(super) fn answer_caught(d: &Dispatcher, req: &Request<'_>) -> Answer {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| d.answer(req))).unwrap_or_else(|_| {
        tracing::error!("answering {:?} panicked: EIO", req.op.opcode());
        Answer::Reply(Reply::error(req.header.unique, Errno::EIO))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Requests of a filesystem that took FUSE_ALLOW_IDMAP.
    mod idmap;

    #[test]
    fn times_before_1970_travel_as_twos_complement() {
        let t = Timespec { sec: -2, nsec: 500 };
        assert_eq!(secs(t), u64::MAX - 1);
        assert_eq!(time_in(secs(t), 500), t);
        // An out-of-range nanosecond count carries into the seconds.
        assert_eq!(time_in(5, 2_000_000_001), Timespec { sec: 7, nsec: 1 });
    }

    #[test]
    fn xattr_size_rules() {
        let v = b"value".to_vec();
        assert!(matches!(sized(9, 0, v.clone()),
            Answer::Reply(r) if r == Reply::xattr_size(9, 5)));
        assert!(matches!(sized(9, 4, v.clone()),
            Answer::Reply(r) if r == Reply::error(9, Errno::ERANGE)));
        assert!(matches!(sized(9, 5, v.clone()),
            Answer::Data { unique: 9, data } if data == v));
    }

    #[test]
    fn modes_carry_the_file_type() {
        for (k, bits) in [
            (FileType::Regular, 0o100000),
            (FileType::Directory, 0o040000),
            (FileType::Symlink, 0o120000),
            (FileType::Fifo, 0o010000),
            (FileType::Socket, 0o140000),
            (FileType::CharDevice, 0o020000),
            (FileType::BlockDevice, 0o060000),
        ] {
            assert_eq!(kind_bits(k), bits);
        }
        assert_eq!(
            dirent_type(kind_bits(FileType::Directory)),
            libc::DT_DIR as u32
        );
    }

    /// An Fs over a simulated disk whose volatile cache a crash can drop.
    mod sim {
        use cilfs_core::format::superblock::SbLog;
        use cilfs_core::fs::{mkfs, Fs, FsOptions};
        use cilfs_core::journal::{Journal, JournalConfig, PushMode};
        use cilfs_core::log::{FlushPolicy, LogConfig};
        use cilfs_core::mkfs::{write_filesystem, Layout};
        use cilfs_device::{Device, SimDevice};
        use std::sync::Arc;

        fn jcfg() -> JournalConfig {
            JournalConfig {
                log: LogConfig {
                    logbufs: 2,
                    logbsize: 32 * 1024,
                    policy: FlushPolicy::Reduced,
                },
                cil_limit: Some(64 * 1024),
                // Nothing written behind the test's back: what is stable is what a force made so.
                push_mode: PushMode::Inline,
                cache_bytes_max: Some(1 << 20),
                log_force_interval: None,
                cil_sharding: Default::default(),
            }
        }

        pub fn new_dev() -> Arc<SimDevice> {
            let layout = Layout {
                uuid: [0x33; 16],
                block_size: 2048,
                data_blocks: 8192,
                log: SbLog::Internal { start: 1 },
                log_blocks: 512,
                backups: false,
            };
            let dev = Arc::new(SimDevice::new(8192 * 2048, 7));
            write_filesystem(&*dev, None, &layout, &mut |_, _| {}).unwrap();
            let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
            mkfs::format(&j, 0, 0).unwrap();
            j.unmount().unwrap();
            dev
        }

        pub fn mount(dev: Arc<SimDevice>) -> Arc<Fs> {
            mount_with(dev, FsOptions::default())
        }

        pub fn mount_with(dev: Arc<SimDevice>, opts: FsOptions) -> Arc<Fs> {
            let j = Journal::open(dev as Arc<dyn Device>, None, jcfg()).unwrap();
            Fs::open(j, opts).unwrap()
        }
    }

    fn header(opcode: cilfs_fuse_proto::Opcode, unique: u64, nodeid: u64) -> InHeader {
        InHeader {
            len: 0,
            opcode: opcode as u32,
            unique,
            nodeid,
            uid: 0,
            gid: 0,
            pid: 0,
            total_extlen: 0,
            padding: 0,
        }
    }

    fn request<'a>(h: InHeader, op: Op<'a>) -> Request<'a> {
        Request {
            header: h,
            op,
            extensions: Default::default(),
        }
    }

    /// SYNCFS makes what was written stable: a crash that keeps only what reached the disk
    /// has the file after it, and has nothing without it.
    #[test]
    fn syncfs_makes_created_and_written_files_survive_a_crash() {
        use cilfs_device::CrashOptions;
        use cilfs_fuse_proto::{CreateIn, Opcode, SyncfsIn, WriteIn};
        use std::ffi::OsStr;
        let dev = sim::new_dev();
        let d = Dispatcher::new(sim::mount(Arc::clone(&dev)), false);
        let name = OsStr::new("synced");
        let create = CreateIn {
            flags: libc::O_WRONLY as u32,
            mode: libc::S_IFREG | 0o644,
            umask: 0o022,
            open_flags: 0,
        };
        let ino = match d.answer(&request(
            header(Opcode::Create, 1, ROOT_ID),
            Op::Create { arg: create, name },
        )) {
            Answer::Reply(r) => {
                let b = r.as_bytes();
                assert_eq!(&b[4..8], &0i32.to_le_bytes(), "create failed");
                u64::from_le_bytes(b[16..24].try_into().unwrap())
            }
            other => panic!("create: {other:?}"),
        };
        let data = b"made durable by syncfs";
        let write = WriteIn {
            size: data.len() as u32,
            ..WriteIn::default()
        };
        assert!(matches!(
            d.answer(&request(header(Opcode::Write, 2, ino), Op::Write { arg: write, data })),
            Answer::Reply(r) if r == Reply::write(2, data.len() as u32)
        ));
        let lost = sim::mount(Arc::new(dev.crash(CrashOptions::default())));
        assert!(
            lost.lookup(ROOT_ID, b"synced").is_err(),
            "stable before the sync"
        );
        assert!(matches!(
            d.answer(&request(header(Opcode::Syncfs, 3, ROOT_ID), Op::Syncfs(SyncfsIn::default()))),
            Answer::Reply(r) if r == Reply::empty(3)
        ));
        let kept = sim::mount(Arc::new(dev.crash(CrashOptions::default())));
        let a = kept.lookup(ROOT_ID, b"synced").unwrap();
        assert_eq!(kept.read_opts(a.ino, 0, 100, false).unwrap(), data);
    }

    /// The remount ioctl: refused to anyone but root and for a value other than 0 or 1;
    /// from root, 1 makes the filesystem read-only (a mkdir is EROFS) and 0 read-write again.
    /// DESTROY runs the daemon's hook before it is answered.
    #[test]
    fn the_remount_ioctl_switches_read_only_for_root_and_destroy_runs_its_hook() {
        use cilfs_fuse_proto::{IoctlIn, MkdirIn, Opcode};
        use std::ffi::OsStr;
        let destroyed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::clone(&destroyed);
        let fs = sim::mount(sim::new_dev());
        let d = Dispatcher::new(Arc::clone(&fs), false).on_destroy(Some(Box::new(move || {
            seen.store(true, std::sync::atomic::Ordering::SeqCst)
        })));
        let ioctl = |unique: u64, uid: u32, v: u32| {
            let arg = IoctlIn {
                cmd: super::super::REMOUNT_IOCTL,
                in_size: 4,
                ..IoctlIn::default()
            };
            let h = InHeader {
                uid,
                ..header(Opcode::Ioctl, unique, ROOT_ID)
            };
            let data = v.to_ne_bytes();
            match d.answer(&request(h, Op::Ioctl { arg, data: &data })) {
                Answer::Reply(r) => i32::from_le_bytes(r.as_bytes()[4..8].try_into().unwrap()),
                other => panic!("ioctl: {other:?}"),
            }
        };
        let mkdir = |unique: u64, name: &str| {
            let arg = MkdirIn {
                mode: 0o755,
                umask: 0,
            };
            let op = Op::Mkdir {
                arg,
                name: OsStr::new(name),
            };
            match d.answer(&request(header(Opcode::Mkdir, unique, ROOT_ID), op)) {
                Answer::Reply(r) => i32::from_le_bytes(r.as_bytes()[4..8].try_into().unwrap()),
                other => panic!("mkdir: {other:?}"),
            }
        };
        assert_eq!(ioctl(1, 1000, 1), -libc::EPERM);
        assert_eq!(ioctl(2, 0, 7), -libc::EINVAL);
        assert!(!fs.is_read_only());
        assert_eq!(ioctl(3, 0, 1), 0);
        assert!(fs.is_read_only() && fs.journal().superblock().clean);
        assert_eq!(mkdir(4, "a"), -libc::EROFS);
        assert_eq!(ioctl(5, 0, 0), 0);
        assert_eq!(mkdir(6, "b"), 0);
        assert!(!destroyed.load(std::sync::atomic::Ordering::SeqCst));
        assert!(matches!(
            d.answer(&request(header(Opcode::Destroy, 7, ROOT_ID), Op::Destroy)),
            Answer::Reply(r) if r == Reply::empty(7)
        ));
        assert!(destroyed.load(std::sync::atomic::Ordering::SeqCst));
    }

    /// The inode-flag ioctls as the kernel's fileattr calls send them (four bytes of flags,
    /// a 28-byte fsxattr), then the shutdown ioctl: refused to a user, and from root every
    /// request after it is EIO.
    #[test]
    fn flag_ioctls_round_trip_and_the_shutdown_ioctl_fails_everything_after_it() {
        use super::super::ioctl::*;
        use cilfs_fuse_proto::{IoctlIn, Opcode};
        let d = Dispatcher::new(sim::mount(sim::new_dev()), false);
        let ioctl = |unique: u64, uid: u32, cmd: u32, data: &[u8], out_size: u32| {
            let arg = IoctlIn {
                cmd,
                in_size: data.len() as u32,
                out_size,
                ..IoctlIn::default()
            };
            let h = InHeader {
                uid,
                ..header(Opcode::Ioctl, unique, ROOT_ID)
            };
            match d.answer(&request(h, Op::Ioctl { arg, data })) {
                Answer::Data { data, .. } => Ok(data[IoctlOut::SIZE..].to_vec()),
                Answer::Reply(r) => Err(i32::from_le_bytes(r.as_bytes()[4..8].try_into().unwrap())),
                Answer::Nothing => panic!("ioctl: no answer"),
            }
        };
        // FS_NODUMP_FL | FS_NOATIME_FL, set by root on the root directory.
        let flags = 0x40u32 | 0x80;
        assert_eq!(
            ioctl(1, 0, FS_IOC_SETFLAGS, &flags.to_ne_bytes(), 0),
            Ok(vec![])
        );
        assert_eq!(
            ioctl(2, 0, FS_IOC_GETFLAGS, &[], 4),
            Ok(flags.to_ne_bytes().to_vec())
        );
        // FS_EXTENT_FL is not kept; immutable is root's to set.
        assert_eq!(
            ioctl(3, 0, FS_IOC_SETFLAGS, &0x80000u32.to_ne_bytes(), 0),
            Err(-libc::EOPNOTSUPP)
        );
        assert_eq!(
            ioctl(4, 1000, FS_IOC_SETFLAGS, &0x10u32.to_ne_bytes(), 0),
            Err(-libc::EPERM)
        );
        let mut fsx = [0u8; 28];
        fsx[12..16].copy_from_slice(&42u32.to_ne_bytes());
        assert_eq!(ioctl(5, 0, FS_IOC_FSSETXATTR, &fsx, 0), Ok(vec![]));
        let got = ioctl(6, 0, FS_IOC_FSGETXATTR, &[], 28).unwrap();
        assert_eq!(&got[12..16], &42u32.to_ne_bytes());
        assert_eq!(
            &got[0..4],
            &0u32.to_ne_bytes(),
            "FSSETXATTR cleared the flags"
        );
        let mut label = [0u8; 256];
        label[..7].copy_from_slice(b"scratch");
        assert_eq!(ioctl(11, 0, FS_IOC_SETFSLABEL, &label, 0), Ok(vec![]));
        assert_eq!(
            ioctl(12, 0, FS_IOC_GETFSLABEL, &[], 256),
            Ok(label.to_vec())
        );
        assert_eq!(
            ioctl(13, 1000, FS_IOC_SETFSLABEL, &label, 0),
            Err(-libc::EPERM)
        );
        assert_eq!(
            ioctl(14, 0, FS_IOC_SETFSLABEL, &[b'x'; 256], 0),
            Err(-libc::EINVAL)
        );
        // FITRIM: the range back with len set to the bytes discarded; root only, and a
        // length under a block is EINVAL.
        let range = |start: u64, len: u64, minlen: u64| {
            [start, len, minlen]
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect::<Vec<u8>>()
        };
        let got = ioctl(15, 0, FITRIM, &range(0, u64::MAX, 0), 24).unwrap();
        let trimmed = u64::from_ne_bytes(got[8..16].try_into().unwrap());
        assert!(trimmed > 0 && trimmed % 512 == 0, "{trimmed}");
        assert_eq!((&got[0..8], &got[16..24]), (&[0u8; 8][..], &[0u8; 8][..]));
        assert_eq!(
            ioctl(16, 1000, FITRIM, &range(0, u64::MAX, 0), 24),
            Err(-libc::EPERM)
        );
        assert_eq!(
            ioctl(17, 0, FITRIM, &range(0, 100, 0), 24),
            Err(-libc::EINVAL)
        );
        assert_eq!(ioctl(18, 0, FITRIM, &[0u8; 8], 24), Err(-libc::EINVAL));
        assert_eq!(ioctl(7, 1000, XFS_IOC_GOINGDOWN, &[], 4), Err(-libc::EPERM));
        assert_eq!(ioctl(8, 0, XFS_IOC_GOINGDOWN, &[], 4), Ok(vec![]));
        assert_eq!(ioctl(9, 0, FS_IOC_GETFLAGS, &[], 4), Err(-libc::EIO));
        assert!(matches!(
            d.answer(&request(header(Opcode::Getattr, 10, ROOT_ID),
                Op::Getattr(Default::default()))),
            Answer::Reply(r) if r == Reply::error(10, Errno::EIO)
        ));
    }

    /// Extent size hints as `xfs_io extsize` sends them (FSGETXATTR, then FSSETXATTR with
    /// FS_XFLAG_EXTSIZE or FS_XFLAG_EXTSZINHERIT added and fsx_extsize set): read back with
    /// their flag, EINVAL where XFS refuses them, taken by a file made in a directory with one,
    /// and kept by a chattr (SETFLAGS, which carries no hint).
    #[test]
    fn extent_size_hint_ioctls_set_refuse_and_inherit_as_xfs() {
        use super::super::ioctl::*;
        use cilfs_fuse_proto::{IoctlIn, Opcode};
        let fs = sim::mount(sim::new_dev());
        let d = Dispatcher::new(Arc::clone(&fs), false);
        let bs = fs.getattr(ROOT_ID).unwrap().blksize;
        let ioctl = |unique: u64, ino: u64, cmd: u32, data: &[u8], out_size: u32| {
            let arg = IoctlIn {
                cmd,
                in_size: data.len() as u32,
                out_size,
                ..IoctlIn::default()
            };
            match d.answer(&request(
                header(Opcode::Ioctl, unique, ino),
                Op::Ioctl { arg, data },
            )) {
                Answer::Data { data, .. } => Ok(data[IoctlOut::SIZE..].to_vec()),
                Answer::Reply(r) => Err(i32::from_le_bytes(r.as_bytes()[4..8].try_into().unwrap())),
                Answer::Nothing => panic!("ioctl: no answer"),
            }
        };
        let fsx = |xflags: u32, extsize: u32| {
            let mut b = [0u8; 28];
            b[0..4].copy_from_slice(&xflags.to_ne_bytes());
            b[4..8].copy_from_slice(&extsize.to_ne_bytes());
            b
        };
        // (xflags, extsize) as FSGETXATTR reports them.
        let get = |unique: u64, ino: u64| {
            let b = ioctl(unique, ino, FS_IOC_FSGETXATTR, &[], 28).unwrap();
            let at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap());
            (at(0), at(4))
        };
        const EXTSIZE: u32 = 0x800;
        const EXTSZINHERIT: u32 = 0x1000;
        let f = fs
            .mknod(Cred::ROOT, ROOT_ID, b"f", libc::S_IFREG | 0o644, 0)
            .unwrap()
            .ino;
        assert_eq!(get(1, f), (0, 0));
        assert_eq!(
            ioctl(2, f, FS_IOC_FSSETXATTR, &fsx(EXTSIZE, 2 * bs), 0),
            Ok(vec![])
        );
        assert_eq!(get(3, f), (EXTSIZE, 2 * bs));
        // chattr +d: the hint and its flag stay; GETFLAGS shows no hint flag.
        assert_eq!(
            ioctl(4, f, FS_IOC_SETFLAGS, &0x40u32.to_ne_bytes(), 0),
            Ok(vec![])
        );
        assert_eq!(get(5, f), (EXTSIZE | 0x80, 2 * bs));
        assert_eq!(
            ioctl(6, f, FS_IOC_GETFLAGS, &[], 4),
            Ok(0x40u32.to_ne_bytes().to_vec())
        );
        // `extsize 0`: the flag set, the hint 0: no hint, no flag.
        assert_eq!(
            ioctl(7, f, FS_IOC_FSSETXATTR, &fsx(EXTSIZE, 0), 0),
            Ok(vec![])
        );
        assert_eq!(get(8, f), (0, 0));
        // Not a multiple of the block size, no flag, the directory's flag on a file.
        for (u, (xflags, extsize)) in [(EXTSIZE, bs + 512), (0, 2 * bs), (EXTSZINHERIT, 2 * bs)]
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                ioctl(
                    10 + u as u64,
                    f,
                    FS_IOC_FSSETXATTR,
                    &fsx(xflags, extsize),
                    0
                ),
                Err(-libc::EINVAL),
                "{xflags:#x} {extsize}"
            );
        }
        // A file with data blocks keeps the hint it has.
        fs.write(Cred::ROOT, f, 0, b"data").unwrap();
        assert_eq!(
            ioctl(20, f, FS_IOC_FSSETXATTR, &fsx(EXTSIZE, 2 * bs), 0),
            Err(-libc::EINVAL)
        );
        assert_eq!(get(21, f), (0, 0));
        // A directory's hint, which what is made in it takes.
        assert_eq!(
            ioctl(22, ROOT_ID, FS_IOC_FSSETXATTR, &fsx(EXTSIZE, 4 * bs), 0),
            Err(-libc::EINVAL)
        );
        assert_eq!(
            ioctl(
                23,
                ROOT_ID,
                FS_IOC_FSSETXATTR,
                &fsx(EXTSZINHERIT, 4 * bs),
                0
            ),
            Ok(vec![])
        );
        assert_eq!(get(24, ROOT_ID), (EXTSZINHERIT, 4 * bs));
        let g = fs
            .mknod(Cred::ROOT, ROOT_ID, b"g", libc::S_IFREG | 0o644, 0)
            .unwrap()
            .ino;
        assert_eq!(get(25, g), (EXTSIZE, 4 * bs));
        // A copy-on-write hint is not kept.
        let mut cow = fsx(0, 0);
        cow[16..20].copy_from_slice(&bs.to_ne_bytes());
        assert_eq!(
            ioctl(26, g, FS_IOC_FSSETXATTR, &cow, 0),
            Err(-libc::EOPNOTSUPP)
        );
    }

    /// STATX answers the basic attributes and the birth time: the inode's creation time,
    /// which later changes leave alone.
    #[test]
    fn statx_answers_the_birth_time() {
        use cilfs_fuse_proto::{Opcode, StatxIn};
        let fs = sim::mount(sim::new_dev());
        let d = Dispatcher::new(Arc::clone(&fs), false);
        let a = fs
            .mknod(Cred::ROOT, ROOT_ID, b"born", libc::S_IFREG | 0o644, 0)
            .unwrap();
        fs.write(Cred::ROOT, a.ino, 0, b"later").unwrap();
        let op = Op::Statx(StatxIn::default());
        let r = match d.answer(&request(header(Opcode::Statx, 1, a.ino), op)) {
            Answer::Reply(r) => r,
            other => panic!("statx: {other:?}"),
        };
        let out = StatxOut::decode(&r.as_bytes()[16..]).unwrap();
        let sx = out.stat;
        assert_eq!(sx.mask & libc::STATX_BTIME, libc::STATX_BTIME);
        assert_eq!(sx.mask & libc::STATX_BASIC_STATS, libc::STATX_BASIC_STATS);
        assert_eq!(
            (sx.btime.tv_sec, sx.btime.tv_nsec),
            (a.crtime.sec, a.crtime.nsec)
        );
        assert_eq!(
            (sx.ino, sx.size, u32::from(sx.mode)),
            (a.ino, 5, libc::S_IFREG | 0o644)
        );
    }

    /// FALLOCATE's modes and their combinations, as Linux checks them: each mode alone (or
    /// with KEEP_SIZE where it may have it) reaches the core; PUNCH_HOLE without KEEP_SIZE,
    /// two modes at once, KEEP_SIZE on COLLAPSE_RANGE and unknown bits are EOPNOTSUPP;
    /// misaligned collapses and inserts EINVAL.
    #[test]
    fn fallocate_modes_reach_the_core_with_linux_checks() {
        use cilfs_fuse_proto::{FallocateIn, Opcode};
        let fs = sim::mount(sim::new_dev());
        let d = Dispatcher::new(Arc::clone(&fs), false);
        let f = fs
            .mknod(
                cilfs_core::fs::types::Cred::ROOT,
                ROOT_ID,
                b"f",
                libc::S_IFREG | 0o644,
                0,
            )
            .unwrap()
            .ino;
        fs.write(cilfs_core::fs::types::Cred::ROOT, f, 0, &[7u8; 8 * 2048])
            .unwrap();
        let falloc = |unique: u64, mode: i32, offset: u64, length: u64| {
            let arg = FallocateIn {
                offset,
                length,
                mode: mode as u32,
                ..FallocateIn::default()
            };
            match d.answer(&request(
                header(Opcode::Fallocate, unique, f),
                Op::Fallocate(arg),
            )) {
                Answer::Reply(r) => i32::from_le_bytes(r.as_bytes()[4..8].try_into().unwrap()),
                other => panic!("fallocate: {other:?}"),
            }
        };
        use libc::{
            FALLOC_FL_COLLAPSE_RANGE as COLLAPSE, FALLOC_FL_INSERT_RANGE as INSERT,
            FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH,
            FALLOC_FL_UNSHARE_RANGE as UNSHARE, FALLOC_FL_ZERO_RANGE as ZERO,
        };
        let refused = -libc::EOPNOTSUPP;
        assert_eq!(falloc(1, PUNCH, 0, 2048), refused);
        assert_eq!(falloc(2, PUNCH | ZERO | KEEP, 0, 2048), refused);
        assert_eq!(falloc(3, COLLAPSE | KEEP, 0, 2048), refused);
        assert_eq!(falloc(4, INSERT | COLLAPSE, 0, 2048), refused);
        assert_eq!(falloc(5, 0x80, 0, 2048), refused);
        assert_eq!(falloc(6, COLLAPSE, 100, 2048), -libc::EINVAL);
        assert_eq!(falloc(7, INSERT, 16 * 2048, 2048), -libc::EINVAL);
        let size = |want: u64| assert_eq!(fs.getattr(f).unwrap().size, want);
        assert_eq!(falloc(8, COLLAPSE, 2048, 2 * 2048), 0);
        size(6 * 2048);
        assert_eq!(falloc(9, INSERT, 0, 2048), 0);
        size(7 * 2048);
        assert_eq!(fs.read_opts(f, 0, 2048, false).unwrap(), vec![0u8; 2048]);
        assert_eq!(falloc(10, ZERO, 7 * 2048, 100), 0);
        size(7 * 2048 + 100);
        assert_eq!(falloc(11, ZERO | KEEP, 0, 1 << 20), 0);
        size(7 * 2048 + 100);
        assert_eq!(falloc(12, UNSHARE, 0, 8 * 2048), 0);
        size(8 * 2048);
        assert_eq!(falloc(13, PUNCH | KEEP, 0, 2048), 0);
    }

    /// With writeback_cache the kernel may hold data cilfs has not seen: LSEEK is ENOSYS, so
    /// the kernel answers SEEK_DATA and SEEK_HOLE itself; without it, cilfs answers.
    #[test]
    fn lseek_is_left_to_the_kernel_under_writeback_cache() {
        use cilfs_fuse_proto::{LseekIn, Opcode};
        for (wbc, want_errno) in [(true, Some(libc::ENOSYS)), (false, None)] {
            let d = Dispatcher::new(sim::mount(sim::new_dev()), wbc);
            let l = LseekIn {
                offset: 0,
                whence: libc::SEEK_DATA as u32,
                ..LseekIn::default()
            };
            let r = match d.answer(&request(header(Opcode::Lseek, 1, ROOT_ID), Op::Lseek(l))) {
                Answer::Reply(r) => r,
                other => panic!("lseek: {other:?}"),
            };
            let errno = i32::from_le_bytes(r.as_bytes()[4..8].try_into().unwrap());
            match want_errno {
                Some(e) => assert_eq!(errno, -e, "writeback_cache {wbc}"),
                None => assert_ne!(errno, -libc::ENOSYS, "writeback_cache {wbc}"),
            }
        }
    }
}
