//! `cilfs unmount DIR`: unmounts, then waits until the daemon has made everything stable,
//! written the unmount record and let go of the image.

use super::mountinfo::{canonical, mounted_image, mounts_on};
use crate::Failure;
use anyhow::anyhow;
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The mount point
    dir: PathBuf,
}

pub fn run(a: Args) -> Result<(), Failure> {
    let source = mounted_image(&a.dir).ok_or_else(|| {
        Failure::usage(anyhow!(
            "{}: no cilfs filesystem is mounted there",
            a.dir.display()
        ))
    })?;
    // Mounted through a loop device: the image is the file behind it, looked up now, since
    // the device is detached once the mount is gone.
    let image = cilfs_device::loopdev::backing_file(&source).unwrap_or(source);
    let read_only = mounts_on(&a.dir).last().is_some_and(|m| m.read_only);
    unmount(&a.dir)?;
    // One of two mounts of the filesystem (`mount`'s second mount): the other goes on.
    if let Some(at) = super::mountinfo::cilfs_mount_of(&image) {
        println!(
            "unmounted {}; {} stays mounted at {}",
            a.dir.display(),
            image.display(),
            at.display()
        );
        return Ok(());
    }
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
    // The superblock alone says whether the unmount was clean (an external log is not needed).
    let mut sector = cilfs_device::AlignedBuf::zeroed(4096);
    let sb = dev
        .read(0, &mut sector)
        .ok()
        .and_then(|()| cilfs_core::format::Superblock::decode(&sector[..512]).ok());
    if read_only && !sb.as_ref().is_some_and(|sb| sb.clean) {
        // A mount made read-only writes nothing: the image is as the mount found it (a log
        // left for recovery included). One remounted read-only was left clean.
        println!(
            "unmounted {}; {} was mounted read-only and is unchanged",
            a.dir.display(),
            image.display()
        );
        return Ok(());
    }
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
    // A mount is busy for a moment after its last file is closed: a process that has just
    // exited, or a child forked by another thread that has not exec'd yet, still holds it.
    // Tried again for up to 5 s before it is called busy.
    let mut tries = 0;
    loop {
        match unmount_once(dir) {
            Err(Busy(_)) if tries < 250 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(Busy(said)) => {
                let holders = holders(dir);
                return Err(Failure::usage(anyhow!(
                    "unmounting {}: {said}{}",
                    dir.display(),
                    if holders.is_empty() {
                        String::new()
                    } else {
                        format!(": in use by {}", holders.join("; "))
                    }
                )));
            }
            Err(Other(f)) => return Err(f),
            Ok(()) => return Ok(()),
        }
    }
}

/// Why one unmount attempt failed.
enum Refused {
    /// EBUSY (umount2) or fusermount3's "busy", with what was said.
    Busy(String),
    Other(Failure),
}
use Refused::{Busy, Other};

/// The processes that hold `dir`'s mount, from /proc: their working or root directory, or an
/// open file, under it (at most ten named; those of other users only as root can see them).
fn holders(dir: &Path) -> Vec<String> {
    let Some(canon) = canonical(dir) else {
        return Vec::new();
    };
    let under = |p: &Path| p.starts_with(&canon);
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    let me = std::process::id().to_string();
    for e in procs.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let base = e.path();
        let mut what = Vec::new();
        for (link, name) in [("cwd", "working directory"), ("root", "root directory")] {
            if std::fs::read_link(base.join(link)).is_ok_and(|t| under(&t)) {
                what.push(name.to_string());
            }
        }
        if let Ok(fds) = std::fs::read_dir(base.join("fd")) {
            for fd in fds.flatten() {
                if let Ok(t) = std::fs::read_link(fd.path()) {
                    if under(&t) {
                        what.push(format!("open file {}", t.display()));
                    }
                }
            }
        }
        if what.is_empty() {
            continue;
        }
        let comm = std::fs::read_to_string(base.join("comm")).unwrap_or_default();
        what.dedup();
        found.push(format!("pid {pid} ({}): {}", comm.trim(), what.join(", ")));
        if found.len() == 10 {
            found.push("...".into());
            break;
        }
    }
    found
}

fn unmount_once(dir: &Path) -> Result<(), Refused> {
    let is_root = rustix::process::geteuid().is_root();
    let direct = if is_root {
        rustix::mount::unmount(dir, rustix::mount::UnmountFlags::empty())
    } else {
        Err(rustix::io::Errno::PERM)
    };
    match direct {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::BUSY) => Err(Busy(rustix::io::Errno::BUSY.to_string())),
        Err(rustix::io::Errno::PERM) => {
            let out = std::process::Command::new("fusermount3")
                .args(["-u", "--"])
                .arg(dir)
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| {
                    Other(Failure::usage(anyhow!(
                        "unmounting {}: only root or fusermount3 (package fuse3) can unmount, \
                         and running fusermount3 failed: {e}",
                        dir.display()
                    )))
                })?;
            if out.status.success() {
                return Ok(());
            }
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said
                .trim()
                .trim_start_matches("fusermount3: ")
                .replace('\n', " ");
            if said.contains("busy") {
                return Err(Busy(said));
            }
            Err(Other(Failure::usage(anyhow!(
                "unmounting {}: {said}",
                dir.display()
            ))))
        }
        Err(e) => Err(Other(Failure::usage(anyhow!(
            "unmounting {}: {e}",
            dir.display()
        )))),
    }
}
