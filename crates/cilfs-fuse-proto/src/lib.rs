//! The FUSE protocol as cilfs speaks it: the kernel's ABI (`<linux/fuse.h>`, 7.45), decoding
//! of requests and encoding of replies and notifications. Pure functions of bytes, no I/O:
//! the /dev/fuse and io_uring transports are built on top of it.
//!
//! - [`Request::parse`] decodes one message as read from /dev/fuse; every length is checked,
//!   and any input gives a typed error or a request, never a panic. An opcode the protocol
//!   does not define is [`Op::Unknown`], for the daemon to answer ENOSYS.
//! - [`Reply`] encodes answers, [`Dirents`] and [`DirentsPlus`] pack directory listings,
//!   [`Notification`] encodes what the server tells the kernel unasked.
//! - [`negotiate`] answers FUSE_INIT; its [`Negotiated`] tells later decoding which layouts
//!   apply.
//! - [`uring`] holds the FUSE-over-io_uring structures.

pub mod abi;
mod codec;
mod dirent;
mod error;
mod ext;
pub mod flags;
mod init;
mod notify;
mod opcode;
mod reply;
mod request;
pub mod uring;

pub use abi::*;
pub use dirent::{Dirents, DirentsPlus};
pub use error::ProtoError;
pub use ext::{Extension, Extensions, Groups};
pub use init::{negotiate, InitConfig, InitReply, Negotiated};
pub use notify::Notification;
pub use opcode::{NotifyCode, Opcode};
pub use reply::{reply_header, Errno, Reply};
pub use request::{ForgetList, Op, Request};
