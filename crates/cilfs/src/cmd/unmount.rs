//! `cilfs unmount DIR`: unmounts, then waits until the daemon has made everything stable,
//! written the unmount record and let go of the image.

use crate::Failure;
use anyhow::anyhow;
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The mount point
    dir: PathBuf,
}

/// One mount from /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub fstype: String,
    pub source: String,
    /// Mounted `ro`.
    pub read_only: bool,
}

/// The mounts whose mount point is `dir`, from /proc/self/mountinfo, the topmost last.
pub fn mounts_on(dir: &Path) -> Vec<MountEntry> {
    let Ok(canon) = std::fs::canonicalize(dir) else {
        return Vec::new();
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut l = left.split(' ').skip(4);
            let mnt = l.next()?;
            let read_only = l.next()?.split(',').any(|o| o == "ro");
            let mut r = right.split(' ');
            let fstype = r.next()?;
            let source = r.next()?;
            (Path::new(&unescape(mnt)) == canon).then(|| MountEntry {
                fstype: fstype.to_string(),
                source: unescape(source),
                read_only,
            })
        })
        .collect()
}

/// The image (FUSE source) of the cilfs mount at `dir`, from /proc/self/mountinfo.
pub fn mounted_image(dir: &Path) -> Option<PathBuf> {
    mounts_on(dir).into_iter().rev().find_map(|m| {
        // The pure-Rust mount reports the type as "fuse"; the source is the image path.
        // fuseblk.cilfs: the native transport's mount of an image on a block device.
        let ours = m.fstype == "fuse.cilfs"
            || m.fstype == "fuseblk.cilfs"
            || (m.fstype == "fuse" && Path::new(&m.source).exists());
        ours.then(|| PathBuf::from(m.source))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

pub fn run(a: Args) -> Result<(), Failure> {
    let image = mounted_image(&a.dir).ok_or_else(|| {
        Failure::usage(anyhow!(
            "{}: no cilfs filesystem is mounted there",
            a.dir.display()
        ))
    })?;
    let read_only = mounts_on(&a.dir).last().is_some_and(|m| m.read_only);
    unmount(&a.dir)?;
    // The daemon holds the image's lock until it has written the unmount record.
    let _lock = super::mount::lock_image(&image, true).map_err(Failure::usage)?;
    let dev = FileDevice::open(
        &image,
        FileDeviceOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .map_err(Failure::usage)?;
    if read_only {
        // A read-only mount writes nothing: the image is as the mount found it.
        println!(
            "unmounted {}; {} was mounted read-only and is unchanged",
            a.dir.display(),
            image.display()
        );
        return Ok(());
    }
    // The superblock alone says whether the unmount was clean (an external log is not needed).
    let mut sector = cilfs_device::AlignedBuf::zeroed(4096);
    let sb = dev
        .read(0, &mut sector)
        .ok()
        .and_then(|()| cilfs_core::format::Superblock::decode(&sector[..512]).ok());
    let log = super::daemon_log::destination(&a.dir)
        .map_or_else(|_| "the daemon's log".to_string(), |d| d.to_string());
    match sb {
        Some(sb) if sb.clean && sb.needs_check => {
            println!(
                "unmounted {}; {} needs a check: a corrupt metadata block was met while it was \
                 mounted (see {log}); run cilfs check {}",
                a.dir.display(),
                image.display(),
                image.display()
            );
            Ok(())
        }
        Some(sb) if sb.clean => {
            println!(
                "unmounted {}; {} is clean",
                a.dir.display(),
                image.display()
            );
            Ok(())
        }
        _ => Err(Failure::found(anyhow!(
            "{}: the daemon exited without a clean unmount; the next mount will replay the log (see {log})",
            image.display()
        ))),
    }
}

/// Unmounts `dir`: umount2 for root; fusermount3 for a user's own mount (made through it),
/// which is the only way a user may unmount, as fusermount3 checks that the mount is theirs.
fn unmount(dir: &Path) -> Result<(), Failure> {
    let is_root = rustix::process::geteuid().is_root();
    let direct = if is_root {
        rustix::mount::unmount(dir, rustix::mount::UnmountFlags::empty())
    } else {
        Err(rustix::io::Errno::PERM)
    };
    match direct {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::PERM) => {
            let out = std::process::Command::new("fusermount3")
                .args(["-u", "--"])
                .arg(dir)
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| {
                    Failure::usage(anyhow!(
                        "unmounting {}: only root or fusermount3 (package fuse3) can unmount, \
                         and running fusermount3 failed: {e}",
                        dir.display()
                    ))
                })?;
            if out.status.success() {
                return Ok(());
            }
            let said = String::from_utf8_lossy(&out.stderr);
            Err(Failure::usage(anyhow!(
                "unmounting {}: {}",
                dir.display(),
                said.trim()
                    .trim_start_matches("fusermount3: ")
                    .replace('\n', " ")
            )))
        }
        Err(e) => Err(Failure::usage(anyhow!("unmounting {}: {e}", dir.display()))),
    }
}
