//! The FUSE transport: /dev/fuse read and written directly, requests decoded and replies
//! encoded by `cilfs-fuse-proto`, each opcode answered by one `Fs` call (`dispatch.rs`).
//!
//! - `mount.rs`: mount(2) with type `fuse.cilfs` (`fuseblk.cilfs` on a block device) and the
//!   image as source as root; fusermount3, which passes /dev/fuse back, for anyone else.
//! - `session.rs`: INIT, then worker threads sharing one /dev/fuse descriptor.
//! - `dispatch.rs`: one request to one answer.
//! - `dev.rs`: the reads and writes, and what their errors mean.
//! - `uring.rs`: FUSE over io_uring, a queue per CPU (`uring=auto|on|off`).
//! - `control.rs`: the remount ioctl, as the mount helper sends it.
//! - `ioctl.rs`: the Linux ioctls answered (inode flags, shutdown, label).

mod control;
mod dev;
mod dispatch;
mod ioctl;
mod mount;
mod session;
mod uring;

pub use control::request_remount;
pub use dispatch::OnDestroy;
pub use mount::{MountError, MountOptions};
pub use session::{init_config, AttrInvalidator, Notifier, ServeConfig, Session, SessionError};
pub use uring::{available as uring_available, Unavailable as UringUnavailable, UringMode};

/// The ioctl `cilfs remount` (and the mount helper's `-o remount`) sends on the mount's root
/// directory, opened read-only so that it works on a read-only mount too: `_IOW(0xCF, 1, u32)`,
/// the u32 being 1 for read-only and 0 for read-write (`Fs::set_read_only`). Root only.
pub const REMOUNT_IOCTL: u32 = (1 << 30) | (4 << 16) | (0xCF << 8) | 1;
