//! Making the FUSE mount: mount(2) with type `fuse.cilfs` and the image as its source, the
//! connection's descriptor named in the options, as the kernel's fuse documentation describes
//! them (fd, rootmode, user_id, group_id, default_permissions, allow_other).

use super::dev::FuseDev;
use rustix::mount::MountFlags;
use std::ffi::CString;
use std::path::Path;

/// What the mount looks like (the cilfs binary's mount options), spelled as kernel flags and
/// options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// What the mount table shows as the source: the image's path.
    pub source: String,
    /// The part of the type after `fuse.`: `cilfs`.
    pub subtype: String,
    pub read_only: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    pub noatime: bool,
    pub sync: bool,
    pub dirsync: bool,
    /// Let other users than the mounter in (root only, or user_allow_other for fusermount3).
    pub allow_other: bool,
    /// The kernel checks modes and ACLs itself.
    pub default_permissions: bool,
    /// The source is a block device: mount as `fuseblk` with this block size. The kernel
    /// then holds the device exclusively (the daemon's own open is not exclusive), sends
    /// FUSE_SYNCFS at sync(2) and syncfs(2) (Linux 6.18 does so for fuseblk and virtiofs
    /// only), and waits for the answer to FUSE_DESTROY at unmount.
    pub blksize: Option<u32>,
}

impl MountOptions {
    pub fn fstype(&self) -> String {
        let base = if self.blksize.is_some() {
            "fuseblk"
        } else {
            "fuse"
        };
        format!("{base}.{}", self.subtype)
    }

    pub fn flags(&self) -> MountFlags {
        let mut f = MountFlags::empty();
        for (on, flag) in [
            (self.read_only, MountFlags::RDONLY),
            (self.nosuid, MountFlags::NOSUID),
            (self.nodev, MountFlags::NODEV),
            (self.noexec, MountFlags::NOEXEC),
            (self.noatime, MountFlags::NOATIME),
            (self.sync, MountFlags::SYNCHRONOUS),
            (self.dirsync, MountFlags::DIRSYNC),
        ] {
            if on {
                f |= flag;
            }
        }
        f
    }

    /// The fuse filesystem's own options: the connection, the root's type (a directory), and
    /// who mounted (the kernel lets only that user in without allow_other).
    pub fn data(&self, fd: i32, uid: u32, gid: u32) -> String {
        let mut d = format!("fd={fd},rootmode=40000,user_id={uid},group_id={gid}");
        if self.default_permissions {
            d.push_str(",default_permissions");
        }
        if self.allow_other {
            d.push_str(",allow_other");
        }
        if let Some(b) = self.blksize {
            d.push_str(&format!(",blksize={b}"));
        }
        d
    }
}

/// Why the native transport could not mount.
#[derive(Debug)]
pub enum MountError {
    /// fusermount3 (a user's mount) could not be run, failed, or sent no descriptor.
    Fusermount(String),
    Open(std::io::Error),
    Mount(std::io::Error),
    BadPath(&'static str),
}

impl std::error::Error for MountError {}

impl std::fmt::Display for MountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MountError::Fusermount(e) => write!(f, "fusermount3: {e}"),
            MountError::Open(e) => write!(f, "cannot open /dev/fuse: {e}"),
            MountError::Mount(e) => write!(f, "mount(2): {e}"),
            MountError::BadPath(what) => write!(f, "{what} holds a NUL byte"),
        }
    }
}

/// Opens /dev/fuse and mounts it on `dir`: with mount(2) as root, through fusermount3 (the
/// set-user-ID helper of fuse3) as anyone else. The kernel queues INIT as soon as the mount
/// exists; callers of the filesystem wait until the session answers it.
pub fn mount(dir: &Path, opts: &MountOptions) -> Result<FuseDev, MountError> {
    if !rustix::process::geteuid().is_root() {
        return mount_as_user(dir, opts);
    }
    let dev = FuseDev::open(Path::new("/dev/fuse")).map_err(MountError::Open)?;
    let data = opts.data(
        dev.raw(),
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let data = CString::new(data).map_err(|_| MountError::BadPath("mount options"))?;
    let source = CString::new(opts.source.as_bytes()).map_err(|_| MountError::BadPath("source"))?;
    rustix::mount::mount(
        source.as_c_str(),
        dir,
        opts.fstype().as_str(),
        opts.flags(),
        data.as_c_str(),
    )
    .map_err(|e| MountError::Mount(e.into()))?;
    Ok(dev)
}

impl MountOptions {
    /// The options fusermount3 takes: the mount flags by name, the source and subtype, and
    /// the fuse options it passes on (it adds fd, rootmode, user_id and group_id itself, and
    /// nosuid and nodev for a user whatever is asked).
    pub fn fusermount_options(&self) -> String {
        let mut o = vec![if self.read_only { "ro" } else { "rw" }.to_string()];
        for (on, name) in [
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
            (self.noatime, "noatime"),
            (self.sync, "sync"),
            (self.dirsync, "dirsync"),
            (self.default_permissions, "default_permissions"),
            (self.allow_other, "allow_other"),
        ] {
            if on {
                o.push(name.to_string());
            }
        }
        // fusermount3 splits its options at commas; a comma in a path is escaped with a
        // backslash, and so is a backslash.
        let source = self.source.replace('\\', "\\\\").replace(',', "\\,");
        o.push(format!("fsname={source}"));
        o.push(format!("subtype={}", self.subtype));
        o.join(",")
    }
}

/// A user's mount: fusermount3 opens /dev/fuse, mounts it on `dir` and sends the descriptor
/// back over the socket named by `_FUSE_COMMFD` (one byte with an SCM_RIGHTS message). Only
/// `fuse` mounts: fuseblk needs root.
fn mount_as_user(dir: &Path, opts: &MountOptions) -> Result<FuseDev, MountError> {
    use rustix::fd::AsRawFd;
    use rustix::io::{fcntl_setfd, FdFlags};
    use rustix::net::{
        recvmsg, socketpair, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
        SocketFlags, SocketType,
    };
    let fail =
        |what: &str, e: &dyn std::fmt::Display| MountError::Fusermount(format!("{what}: {e}"));
    let opts = MountOptions {
        blksize: None,
        ..opts.clone()
    };
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| fail("socketpair", &e))?;
    // fusermount3 finds its end by number, so that end must survive the exec; the daemon
    // starts no other program meanwhile (its only other thread waits for stop signals).
    fcntl_setfd(&theirs, FdFlags::empty()).map_err(|e| fail("socket", &e))?;
    let status = std::process::Command::new("fusermount3")
        .arg("-o")
        .arg(opts.fusermount_options())
        .arg("--")
        .arg(dir)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .status();
    drop(theirs);
    let status = status.map_err(|e| fail("cannot run it (install fuse3)", &e))?;
    if !status.success() {
        return Err(MountError::Fusermount(format!(
            "mounting {} failed ({status}; its message is above)",
            dir.display()
        )));
    }
    let mut byte = [0u8; 1];
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    recvmsg(&ours, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
        .map_err(|e| fail("receiving the /dev/fuse descriptor", &e))?;
    let fd = control.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    match fd {
        Some(fd) => Ok(FuseDev::from_fd(fd)),
        None => Err(MountError::Fusermount(
            "mounted, but sent no /dev/fuse descriptor".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> MountOptions {
        MountOptions {
            source: "/img".into(),
            subtype: "cilfs".into(),
            read_only: false,
            nosuid: false,
            nodev: false,
            noexec: false,
            noatime: false,
            sync: false,
            dirsync: false,
            allow_other: false,
            default_permissions: true,
            blksize: None,
        }
    }

    #[test]
    fn options_string_names_the_connection_and_owner() {
        let o = opts();
        assert_eq!(o.fstype(), "fuse.cilfs");
        assert_eq!(
            o.data(7, 1000, 100),
            "fd=7,rootmode=40000,user_id=1000,group_id=100,default_permissions"
        );
        let o = MountOptions {
            allow_other: true,
            ..o
        };
        assert!(o
            .data(3, 0, 0)
            .ends_with(",default_permissions,allow_other"));
        let o = MountOptions {
            blksize: Some(4096),
            ..o
        };
        assert_eq!(o.fstype(), "fuseblk.cilfs");
        assert!(o.data(3, 0, 0).ends_with(",allow_other,blksize=4096"));
    }

    #[test]
    fn flags_follow_the_options() {
        assert_eq!(opts().flags(), MountFlags::empty());
        let o = MountOptions {
            read_only: true,
            nosuid: true,
            nodev: true,
            noexec: true,
            noatime: true,
            sync: true,
            dirsync: true,
            ..opts()
        };
        let all = MountFlags::RDONLY
            | MountFlags::NOSUID
            | MountFlags::NODEV
            | MountFlags::NOEXEC
            | MountFlags::NOATIME
            | MountFlags::SYNCHRONOUS
            | MountFlags::DIRSYNC;
        assert_eq!(o.flags(), all);
    }

    #[test]
    fn fusermount_gets_the_flags_by_name_and_an_escaped_source() {
        let o = MountOptions {
            source: "/a,b\\c".into(),
            nosuid: true,
            noexec: true,
            allow_other: true,
            ..opts()
        };
        assert_eq!(
            o.fusermount_options(),
            "rw,nosuid,noexec,default_permissions,allow_other,fsname=/a\\,b\\\\c,subtype=cilfs"
        );
        let ro = MountOptions {
            read_only: true,
            ..opts()
        };
        assert!(ro.fusermount_options().starts_with("ro,"));
    }
}
