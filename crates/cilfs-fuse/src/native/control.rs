//! The client side of `REMOUNT_IOCTL`: what the mount helper sends a running daemon when
//! `mount -o remount,ro|rw` changes its mount. An ioctl, not an xattr, because it must reach
//! the daemon on a read-only mount too, where the kernel refuses setxattr before asking it.
//! One `ioctl(2)` call, which no safe wrapper here offers: this module's one unsafe block.
#![allow(unsafe_code)]

use super::REMOUNT_IOCTL;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Asks the daemon serving the cilfs mount at `dir` to switch to read-only (`ro`) or back to
/// read-write, and waits for it: after a switch to read-only everything is on disk and the log
/// is clean. Errors are the daemon's answer (EPERM: not root; EROFS: a mount made `ro`) or
/// ENOTTY when `dir` is not the root of a cilfs mount that knows the ioctl.
pub fn request_remount(dir: &Path, ro: bool) -> std::io::Result<()> {
    let root = std::fs::File::open(dir)?;
    let value = u32::from(ro);
    // SAFETY: REMOUNT_IOCTL is _IOW(.., u32): the kernel reads four bytes from the pointer,
    // which points at `value`, alive for the call; `root` is an open descriptor.
    let r = unsafe { libc::ioctl(root.as_raw_fd(), REMOUNT_IOCTL as _, &value as *const u32) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
