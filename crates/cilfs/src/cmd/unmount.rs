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
        let ours =
            m.fstype == "fuse.cilfs" || (m.fstype == "fuse" && Path::new(&m.source).exists());
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
    rustix::mount::unmount(&a.dir, rustix::mount::UnmountFlags::empty())
        .map_err(|e| Failure::usage(anyhow!("unmounting {}: {e}", a.dir.display())))?;
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
    let clean = dev.read(0, &mut sector).is_ok()
        && cilfs_core::format::Superblock::decode(&sector[..512]).is_ok_and(|sb| sb.clean);
    if !clean {
        return Err(Failure::found(anyhow!(
            "{}: the daemon exited without a clean unmount; the next mount will replay the log (see {})",
            image.display(),
            super::mount::log_path(&a.dir).display()
        )));
    }
    println!(
        "unmounted {}; {} is clean",
        a.dir.display(),
        image.display()
    );
    Ok(())
}
