//! The `loop` mount option: an image file mounted through a loop device, as mount(8) does
//! with `-o loop`. The mount is then `fuseblk.cilfs` on `/dev/loopN`, the one kind of FUSE
//! mount Linux passes sync(2) and syncfs(2) on to (FUSE_SYNCFS), so a `sync` makes what was
//! written before it durable, as on a block device. The device is attached with autoclear: it
//! goes away with the last holder (the kernel's mount and the daemon).
//!
//! From `<linux/loop.h>`: LOOP_CTL_GET_FREE on /dev/loop-control names a free device, and
//! LOOP_CONFIGURE binds it to an open file in one call (Linux 5.8). Both are ioctls, which
//! no safe wrapper here offers: hence the two unsafe calls, each on a file this module opened
//! and, for LOOP_CONFIGURE, a `repr(C)` copy of the kernel's structure.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{Error, Result};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device bound to an image; held open until dropped (autoclear then detaches it once
/// nothing else holds it).
#[derive(Debug)]
pub struct Attached {
    pub path: PathBuf,
    _dev: File,
}

/// Binds a free loop device to `image` (read-only when `ro`).
pub fn attach(image: &Path, ro: bool) -> Result<Attached> {
    let context = |what: String| move |e: Error| Error::new(e.kind(), format!("{what}: {e}"));
    let backing = OpenOptions::new()
        .read(true)
        .write(!ro)
        .open(image)
        .map_err(context(image.display().to_string()))?;
    let ctl = File::open("/dev/loop-control").map_err(context(
        "option loop: /dev/loop-control (loop devices need root and the loop module)".into(),
    ))?;
    // Another attach may take the device between the two calls: then ask again.
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(context("option loop: no free loop device".into())(
                Error::last_os_error(),
            ));
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = OpenOptions::new()
            .read(true)
            .write(!ro)
            .open(&path)
            .map_err(context(format!("option loop: {}", path.display())))?;
        let mut name = [0u8; LO_NAME_SIZE];
        let s = image.as_os_str().as_encoded_bytes();
        let k = s.len().min(LO_NAME_SIZE - 1);
        name[..k].copy_from_slice(&s[..k]);
        let cfg = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: 0,
                lo_sizelimit: 0,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags: LO_FLAGS_AUTOCLEAR | if ro { LO_FLAGS_READ_ONLY } else { 0 },
                lo_file_name: name,
                lo_crypt_name: [0; LO_NAME_SIZE],
                lo_encrypt_key: [0; LO_KEY_SIZE],
                lo_init: [0; 2],
            },
            reserved: [0; 8],
        };
        // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, which `cfg` is laid out as.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) };
        if r == 0 {
            return Ok(Attached { path, _dev: dev });
        }
        let e = Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(context(format!(
                "option loop: binding {} to {}",
                path.display(),
                image.display()
            ))(e));
        }
    }
    Err(Error::other(
        "option loop: every free loop device was taken before it could be bound",
    ))
}

/// The file a loop device reads and writes, if `dev` is one (`/sys/block/loopN/loop/backing_file`).
pub fn backing_file(dev: &Path) -> Option<PathBuf> {
    let canon = std::fs::canonicalize(dev).ok()?;
    let name = canon.file_name()?.to_str()?;
    if !name.starts_with("loop") {
        return None;
    }
    let s = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let p = PathBuf::from(s.trim_end_matches('\n'));
    (!p.as_os_str().is_empty()).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_structures_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }
}
