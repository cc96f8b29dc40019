//! The FUSE transport: /dev/fuse read and written directly, requests decoded and replies
//! encoded by `cilfs-fuse-proto`, each opcode answered by one `Fs` call (`dispatch.rs`).
//!
//! - `mount.rs`: mount(2) with type `fuse.cilfs` (`fuseblk.cilfs` on a block device) and the
//!   image as source as root; fusermount3, which passes /dev/fuse back, for anyone else.
//! - `session.rs`: INIT, then worker threads sharing one /dev/fuse descriptor.
//! - `dispatch.rs`: one request to one answer.
//! - `dev.rs`: the reads and writes, and what their errors mean.
//! - `uring.rs`: FUSE over io_uring, a queue per CPU (`uring=auto|on|off`).

mod dev;
mod dispatch;
mod mount;
mod session;
mod uring;

pub use mount::{MountError, MountOptions};
pub use session::{init_config, AttrInvalidator, Notifier, ServeConfig, Session, SessionError};
pub use uring::{available as uring_available, Unavailable as UringUnavailable, UringMode};
