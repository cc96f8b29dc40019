//! `cilfs check IMAGE [--logdev PATH] [--clear-needs-check]`: replays the log in memory
//! (nothing is written), then checks every structure. Exit 0 clean, 1 inconsistent (each
//! problem on its own line), 2 could not check. The superblock's needs-check mark (a mount met
//! a corrupt block) is reported; `--clear-needs-check` clears it when the check finds the
//! filesystem consistent, the only write a check makes.

use crate::Failure;
use anyhow::anyhow;
use cilfs_core::check::check_image;
use cilfs_core::format::Superblock;
use cilfs_core::Geometry;
use cilfs_device::{AlignedBuf, Device, FileDevice, FileDeviceOptions, WriteFlags};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image file or block device
    image: PathBuf,
    /// The external log device, if the filesystem has one
    #[arg(long)]
    logdev: Option<PathBuf>,
    /// If the filesystem is consistent, clear the superblock's mark that a mount met a
    /// corrupt metadata block (the only write a check makes)
    #[arg(long)]
    clear_needs_check: bool,
}

impl Args {
    /// `fsck.cilfs`'s: `clear` when fsck(8) was allowed to change the filesystem (-a, -p, -y).
    pub fn new(image: PathBuf, logdev: Option<PathBuf>, clear: bool) -> Self {
        Args {
            image,
            logdev,
            clear_needs_check: clear,
        }
    }
}

pub fn run(a: Args) -> Result<(), Failure> {
    // A mounted filesystem changes under the check, which would judge a stale copy. Held
    // while checking, so that no mount starts meanwhile.
    let _locks = [Some(&a.image), a.logdev.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| super::mount::refuse_mounted(p, "checking it"))
        .collect::<Result<Vec<_>, _>>()?;
    let ro = FileDeviceOptions {
        read_only: true,
        ..Default::default()
    };
    let data: Arc<dyn Device> = Arc::new(FileDevice::open(&a.image, ro).map_err(Failure::usage)?);
    let logdev = match &a.logdev {
        Some(p) => {
            Some(Arc::new(FileDevice::open(p, ro).map_err(Failure::usage)?) as Arc<dyn Device>)
        }
        None => None,
    };
    let geo = Geometry::read(&*data, logdev.as_deref()).ok();
    let needs_check = geo.as_ref().is_some_and(|g| g.sb.needs_check);
    // A note, not a problem: such an image is as sound as it ever was.
    if geo.as_ref().is_some_and(|g| !g.sb.backups) {
        println!("superblock: no backup copies (made before cilfs kept them)");
    }
    let (report, recovery) = check_image(data, logdev)
        .map_err(|e| Failure::usage(anyhow!("{}: cannot check: {e}", a.image.display())))?;
    if !recovery.was_clean {
        println!(
            "log: not clean, {} checkpoints replayed in memory{}",
            recovery.checkpoints_replayed,
            recovery
                .torn
                .as_deref()
                .map(|t| format!(" ({t})"))
                .unwrap_or_default()
        );
    }
    for p in &report.problems {
        println!("{p}");
    }
    println!(
        "{}: {} inodes ({} directories), {} tree nodes, {} data blocks, {} free blocks: {}",
        a.image.display(),
        report.inodes,
        report.directories,
        report.tree_nodes,
        report.data_blocks,
        report.free_blocks,
        if report.is_clean() {
            "clean".to_string()
        } else {
            format!("{} problems", report.problems.len())
        }
    );
    if needs_check {
        say_needs_check(&a, report.is_clean())?;
    }
    if report.is_clean() {
        Ok(())
    } else {
        Err(Failure::found(anyhow!(
            "{} is inconsistent",
            a.image.display()
        )))
    }
}

/// Reports the superblock's needs-check mark, and clears it if asked and `consistent`.
fn say_needs_check(a: &Args, consistent: bool) -> Result<(), Failure> {
    let image = a.image.display();
    if !consistent {
        println!("superblock: a mount met a corrupt metadata block (needs check): still needed");
        return Ok(());
    }
    if !a.clear_needs_check {
        println!(
            "superblock: a mount met a corrupt metadata block (needs check); none is left: \
             cilfs check --clear-needs-check {image} clears the mark"
        );
        return Ok(());
    }
    clear_needs_check(&a.image)
        .map_err(|e| Failure::usage(anyhow!("{image}: clearing the needs-check mark: {e}")))?;
    println!("superblock: needs-check mark cleared");
    Ok(())
}

/// Rewrites the superblock with `needs_check` off, FUA (the lock taken in `run` is held).
fn clear_needs_check(image: &Path) -> Result<(), anyhow::Error> {
    let dev = FileDevice::open(image, FileDeviceOptions::default())?;
    let mut sb = Geometry::read(&dev, None).map(|g| g.sb).or_else(|_| {
        // With an external log, Geometry wants the log device; the superblock alone will do.
        let mut sector = AlignedBuf::zeroed(4096);
        dev.read(0, &mut sector)?;
        Ok::<_, anyhow::Error>(Superblock::decode(&sector[..512])?)
    })?;
    sb.needs_check = false;
    cilfs_core::format::geometry::write_superblock(&dev, &sb, WriteFlags::FUA)?;
    Ok(())
}
