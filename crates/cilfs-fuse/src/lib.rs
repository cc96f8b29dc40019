//! The FUSE adapter of cilfs: each callback translates its arguments, calls one operation of
//! the core ([`cilfs_core::fs::Fs`]) and translates the result; errors become errno values in
//! [`errno::errno`] only. No filesystem logic lives here.

mod errno;
pub mod native;
mod openers;
pub mod requests;

pub use errno::{errno, observe_errors, ErrorObserver};

use cilfs_core::fs::types::{Cred, RenameFlags as CoreRename, SetAttr, SetTime};
use cilfs_core::fs::xattr::XattrFlags;
use cilfs_core::fs::{Attr, AttrsChanged, FileType as CoreType, Fs, FsError, Timespec};
use cilfs_fuse_proto::Opcode;
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use openers::{caller, Openers};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The root directory's read-only xattr carrying every counter as "name value" lines (what
/// `cilfs stat` reads): live figures without adding entries to the namespace.
pub const STATS_XATTR: &[u8] = b"user.cilfs.stats";

fn stats_text(fs: &Fs) -> Vec<u8> {
    let mut out = String::new();
    for (k, v) in fs.counters().into_iter().chain(requests::counters()) {
        out.push_str(&format!("{k} {v}\n"));
    }
    out.into_bytes()
}

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
/// through `FsOptions::attrs_changed`, which drops the kernel's copy ([`AttrInvalidator`]).
/// Mount tests read each field from the kernel's copy right after such changes
/// (`attributes_stay_right_with_long_lifetimes`,
/// `set_user_and_group_id_cleared_behind_a_reply_reach_the_kernels_mode`). Every GETATTR and
/// revalidating LOOKUP this saves is a round trip through the daemon.
const TTL: Duration = Duration::from_secs(3600);

#[derive(Debug)]
pub struct CilfsFuse {
    fs: Arc<Fs>,
    writeback_cache: bool,
    /// Who opened each file handle ([`openers::Openers`]).
    openers: Openers,
}

impl CilfsFuse {
    pub fn new(fs: Arc<Fs>, writeback_cache: bool) -> Self {
        CilfsFuse {
            fs,
            writeback_cache,
            openers: Openers::new(),
        }
    }

    /// A new file handle, remembering who opened it until its release.
    fn file_handle(&self, opener: Cred) -> FileHandle {
        FileHandle(self.openers.open(opener))
    }

    /// The caller a write is judged as ([`Openers::writer`]).
    fn writer(&self, req: &Request, fh: FileHandle, flags: WriteFlags) -> Cred {
        let from_page_cache = flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        self.openers.writer(fh.0, from_page_cache, cred(req))
    }
}

/// Drops the kernel's cached attributes of an inode whose attributes the core changed behind a
/// reply (`FsOptions::attrs_changed`: set-group-ID cleared by a write, which the kernel
/// follows by refreshing size and times only). Connected once the session exists; before
/// that the kernel has nothing cached.
#[derive(Debug, Clone, Default)]
pub struct AttrInvalidator(Arc<OnceLock<Notifier>>);

impl AttrInvalidator {
    pub fn connect(&self, notifier: Notifier) {
        let _ = self.0.set(notifier);
    }

    pub fn hook(&self) -> AttrsChanged {
        let slot = Arc::clone(&self.0);
        Arc::new(move |ino| {
            if let Some(n) = slot.get() {
                // A negative offset drops the attributes and leaves the pages alone: no page
                // lock to wait for while the request that asked may hold one. An inode the
                // kernel no longer caches is not an error worth a word.
                let _ = n.inval_inode(INodeNo(ino), -1, 0);
            }
        })
    }
}

fn cred(req: &Request) -> Cred {
    caller(req.uid(), req.gid(), req.pid())
}

/// The caller of a create, with the umask the kernel passed along.
fn creator(req: &Request, umask: u32) -> Cred {
    Cred { umask, ..cred(req) }
}

/// The supplementary groups of process `pid` (the `Groups:` line of /proc/PID/status); none if
/// the process is gone. What `FsOptions::groups_of` is set to on a mount.
pub fn supplementary_groups(pid: u32) -> Vec<u32> {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    s.lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Linux's capability number of CAP_FSETID (`<linux/capability.h>`).
const CAP_FSETID: u32 = 4;

/// Whether process `pid`, running as filesystem uid `uid`, holds CAP_FSETID as the kernel's
/// `capable(CAP_FSETID)` would judge it (from /proc/PID/status); `None` if the process is gone
/// or the pid now names a process of another user. What `FsOptions::holds_fsetid` is set to on
/// a mount: with FUSE_HANDLE_KILLPRIV_V2 the kernel tells whether a truncate's caller may keep
/// set-user-ID only in a flag fuser 0.18 does not pass on (FATTR_KILL_SUIDGID), and a root
/// without CAP_FSETID must lose it.
pub fn holds_fsetid(pid: u32, uid: u32) -> Option<bool> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| s.lines().find_map(|l| l.strip_prefix(name));
    // Real, effective, saved and filesystem uid: the request carries the last.
    let fsuid: u32 = field("Uid:")?.split_whitespace().nth(3)?.parse().ok()?;
    if fsuid != uid {
        return None;
    }
    let effective = u64::from_str_radix(field("CapEff:")?.trim(), 16).ok()?;
    // capable() asks the initial user namespace: a process in another one holds nothing there
    // whatever its own namespace grants it.
    static OURS: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    let ours = OURS.get_or_init(|| std::fs::read_link("/proc/self/ns/user").ok());
    let same_ns =
        ours.is_some() && std::fs::read_link(format!("/proc/{pid}/ns/user")).ok() == *ours;
    Some(same_ns && effective & (1 << CAP_FSETID) != 0)
}

fn system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
            + Duration::from_nanos(u64::from(t.nsec))
    }
}

fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let mut sec = -(d.as_secs() as i64);
            let mut nsec = d.subsec_nanos();
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Timespec { sec, nsec }
        }
    }
}

fn kind(k: CoreType) -> FileType {
    match k {
        CoreType::Regular => FileType::RegularFile,
        CoreType::Directory => FileType::Directory,
        CoreType::Symlink => FileType::Symlink,
        CoreType::Fifo => FileType::NamedPipe,
        CoreType::Socket => FileType::Socket,
        CoreType::CharDevice => FileType::CharDevice,
        CoreType::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks_512,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

fn name(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

fn err(e: FsError) -> Errno {
    errno::replied(&e)
}

impl Filesystem for CilfsFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        requests::count(Opcode::Init as u32);
        // The umask is ours to apply: a directory's default ACL replaces it.
        let _ = config.add_capabilities(InitFlags::FUSE_DONT_MASK);
        // The kernel enforces ACLs (and turns default_permissions on) once we store them.
        if self.fs.options().acl && config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_err() {
            tracing::warn!("the kernel does not offer FUSE_POSIX_ACL: ACLs are not enforced");
        }
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // File handles that outlive the kernel's inode cache (NFS export, open_by_handle_at):
        // the kernel finds a forgotten inode by LOOKUP of "." in it, and checks the generation.
        let _ = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT);
        // The kernel then stops asking for security.capability before every write (it sets
        // SB_NOSEC and remembers, per inode, that a check found nothing to clear) and stops
        // refreshing attributes and sending a mode of its own before a truncate or chown: the
        // core clears set-user-ID and set-group-ID by Linux's rules on every write, truncate,
        // fallocate and chown (judging CAP_FSETID from the caller's process, since fuser
        // 0.18 passes on no FATTR_KILL_SUIDGID), and drops security.capability on each of
        // them. What it clears behind a reply reaches the kernel through attrs_changed.
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        // A symlink's target never changes and inode numbers are never reused, so the kernel
        // may keep targets in its page cache instead of asking at every path walk through
        // one (cilfs moves no atime on readlink).
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        if self.writeback_cache {
            let _ = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config
            .set_time_granularity(Duration::from_nanos(u64::from(self.fs.options().tsgran_ns)));
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        requests::count(Opcode::Lookup as u32);
        match self.fs.lookup(parent.0, name(n)) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(a.generation)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        requests::count(Opcode::Getattr as u32);
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        requests::count(Opcode::Setattr as u32);
        let t = |x: Option<TimeOrNow>| {
            x.map(|x| match x {
                TimeOrNow::Now => SetTime::Now,
                TimeOrNow::SpecificTime(t) => SetTime::At(timespec(t)),
            })
        };
        let sa = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: t(atime),
            mtime: t(mtime),
        };
        match self.fs.setattr(cred(req), ino.0, sa) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        requests::count(Opcode::Readlink as u32);
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(err(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        requests::count(Opcode::Mknod as u32);
        match self.fs.mknod(
            creator(req, umask),
            parent.0,
            name(n),
            mode,
            u64::from(rdev),
        ) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(a.generation)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        requests::count(Opcode::Mkdir as u32);
        match self.fs.mkdir(creator(req, umask), parent.0, name(n), mode) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(a.generation)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        requests::count(Opcode::Unlink as u32);
        match self.fs.unlink(parent.0, name(n)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        requests::count(Opcode::Rmdir as u32);
        match self.fs.rmdir(parent.0, name(n)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        requests::count(Opcode::Symlink as u32);
        match self.fs.symlink(
            cred(req),
            parent.0,
            name(link),
            target.as_os_str().as_bytes(),
        ) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(a.generation)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        requests::count(Opcode::Rename as u32);
        let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) {
            return reply.error(Errno::EINVAL);
        }
        let f = CoreRename {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        match self
            .fs
            .rename(parent.0, name(n), newparent.0, name(newname), f)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        requests::count(Opcode::Link as u32);
        match self.fs.link(ino.0, newparent.0, name(newname)) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(a.generation)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        requests::count(Opcode::Open as u32);
        match self.fs.open_inode(ino.0) {
            Ok(_) => reply.opened(self.file_handle(cred(req)), FopenFlags::empty()),
            Err(e) => reply.error(err(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        requests::count(Opcode::Read as u32);
        // The open file's flags: O_NOATIME (the kernel let only the owner or root set it).
        let touch_atime = flags.0 & libc::O_NOATIME == 0;
        match self.fs.read_opts(ino.0, offset, size, touch_atime) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(err(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        requests::count(Opcode::Write as u32);
        let who = self.writer(req, fh, write_flags);
        match self.fs.write(who, ino.0, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(err(e)),
        }
    }

    /// ENOSYS: the kernel then sends no FLUSH again on this mount (`fc->no_flush`), and every
    /// close costs one synchronous round trip less. Nothing is owed at close: there are no
    /// locks to drop (the kernel keeps POSIX locks locally), dirty data waits in the daemon's
    /// page cache whatever happens at close (fsync makes it durable), the kernel still writes
    /// back its own dirty pages before a close returns (writeback_cache), and the open count
    /// that keeps an unlinked file alive drops at release, which still comes.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        requests::count(Opcode::Flush as u32);
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        requests::count(Opcode::Release as u32);
        self.openers.release(fh.0);
        match self.fs.release_inode(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        requests::count(Opcode::Fsync as u32);
        match self.fs.fsync(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        requests::count(Opcode::Opendir as u32);
        match self.fs.open_inode(ino.0) {
            Ok(a) if a.kind == CoreType::Directory => {
                reply.opened(FileHandle(0), FopenFlags::empty())
            }
            Ok(_) => {
                let _ = self.fs.release_inode(ino.0);
                reply.error(Errno::ENOTDIR)
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        requests::count(Opcode::Readdir as u32);
        match self.fs.readdir(ino.0, offset, 128) {
            Ok(entries) => {
                for (e, next) in entries {
                    if reply.add(
                        INodeNo(e.ino),
                        next,
                        kind(e.kind),
                        OsStr::from_bytes(&e.name),
                    ) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        requests::count(Opcode::Readdirplus as u32);
        match self.fs.readdir(ino.0, offset, 64) {
            Ok(entries) => {
                for (i, (e, next)) in entries.into_iter().enumerate() {
                    let a = match self.fs.getattr(e.ino) {
                        Ok(a) => a,
                        // Unlinked since the listing was read: its name is gone too.
                        Err(FsError::NotFound) => continue,
                        // A corrupt or unreadable inode fails the listing (EUCLEAN, EIO) rather
                        // than dropping a name silently; entries already added go out first and
                        // the next call starts at the failing one.
                        Err(e) if i == 0 => return reply.error(err(e)),
                        Err(_) => break,
                    };
                    if reply.add(
                        INodeNo(e.ino),
                        next,
                        OsStr::from_bytes(&e.name),
                        &TTL,
                        &file_attr(&a),
                        Generation(a.generation),
                    ) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        requests::count(Opcode::Releasedir as u32);
        match self.fs.release_inode(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        requests::count(Opcode::Fsyncdir as u32);
        match self.fs.fsync(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        requests::count(Opcode::Statfs as u32);
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        requests::count(Opcode::Setxattr as u32);
        let f = XattrFlags {
            create: flags & libc::XATTR_CREATE != 0,
            replace: flags & libc::XATTR_REPLACE != 0,
        };
        match self
            .fs
            .set_xattr_as(cred(req), ino.0, name(n), Some(value), f)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        requests::count(Opcode::Getxattr as u32);
        let r = if ino == INodeNo::ROOT && name(n) == STATS_XATTR {
            Ok(stats_text(&self.fs))
        } else {
            self.fs.getxattr(ino.0, name(n))
        };
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(err(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        requests::count(Opcode::Listxattr as u32);
        match self.fs.listxattr(ino.0) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32);
                } else if buf.len() > size as usize {
                    reply.error(Errno::ERANGE);
                } else {
                    reply.data(&buf);
                }
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        requests::count(Opcode::Removexattr as u32);
        let f = XattrFlags::default();
        match self.fs.set_xattr_as(cred(req), ino.0, name(n), None, f) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        requests::count(Opcode::Access as u32);
        // Permission bits are checked by the kernel (default_permissions); this answers
        // existence.
        match self.fs.getattr(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        requests::count(Opcode::Create as u32);
        let r = self
            .fs
            .mknod(creator(req, umask), parent.0, name(n), mode, 0)
            .and_then(|a| self.fs.open_inode(a.ino));
        match r {
            Ok(a) => reply.created(
                &TTL,
                &file_attr(&a),
                Generation(a.generation),
                self.file_handle(cred(req)),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        requests::count(Opcode::Fallocate as u32);
        let known = libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE;
        if mode & !known != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        match self
            .fs
            .fallocate(cred(req), ino.0, offset, length, keep, punch)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    /// No ioctls, answered as the native dispatcher answers them and without the warning
    /// fuser's default logs for each: Python's isatty() on every open() sends one (27,815
    /// lines in one stress session's log).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        requests::count(Opcode::Ioctl as u32);
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        requests::count(Opcode::Lseek as u32);
        // As the native dispatcher: the kernel's cached writes make cilfs's holes unreliable.
        if self.writeback_cache {
            return reply.error(Errno::ENOSYS);
        }
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        // A negative offset lies outside the file, as past its end: ENXIO, as Linux
        // filesystems answer (iomap_seek_data/hole).
        let Ok(off) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match self.fs.seek(ino.0, off, data) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(err(e)),
        }
    }
}
