//! `cilfs repair IMAGE [--logdev PATH] [-n]`: makes a filesystem whose log is damaged mountable
//! again, as `xfs_repair -L` does: the committed checkpoints before the damage are replayed,
//! the rest of the log is discarded (what that loses is said), and the filesystem is then
//! checked. Exit 0 consistent afterwards (or nothing to do), 1 problems remain, 2 could not run.
//! With `-n` nothing is written: it says what it would do.
//!
//! Today it repairs the log and the superblock's copies only; problems `cilfs check` finds
//! in the trees are reported, not fixed.

use crate::Failure;
use anyhow::anyhow;
use cilfs_core::fs::check::check_image;
use cilfs_core::fs::{Fs, FsOptions};
use cilfs_core::journal::{Journal, JournalConfig};
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image file or block device
    image: PathBuf,
    /// The external log device, if the filesystem has one
    #[arg(long)]
    logdev: Option<PathBuf>,
    /// Change nothing: report what a repair would do
    #[arg(short = 'n', long)]
    no_modify: bool,
}

fn open(p: &Path, read_only: bool) -> Result<Arc<dyn Device>, Failure> {
    let o = FileDeviceOptions {
        read_only,
        ..Default::default()
    };
    Ok(Arc::new(FileDevice::open(p, o).map_err(Failure::usage)?))
}

impl Args {
    /// `fsck.cilfs -a|-p|-y`'s: a repair that may write.
    pub fn new(image: PathBuf, logdev: Option<PathBuf>) -> Self {
        Args {
            image,
            logdev,
            no_modify: false,
        }
    }
}

pub fn run(a: Args) -> Result<(), Failure> {
    repair(&a).map(|_| ())
}

/// The repair; Ok(true) when it repaired damage (a damaged log) and left the filesystem
/// consistent, Ok(false) when there was none (a dirty log is replayed, which is no damage).
pub fn repair(a: &Args) -> Result<bool, Failure> {
    let image = a.image.display().to_string();
    // Held throughout: no mount may start while the log is cut and the trees are checked.
    let _locks = [Some(&a.image), a.logdev.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| super::mount::refuse_mounted(p, "repairing it"))
        .collect::<Result<Vec<_>, _>>()?;
    let ro = a.no_modify;
    // First, so that what follows reads the filesystem from its primary.
    let superblock = super::repair_sb::repair(&a.image, a.logdev.as_deref(), ro)?;
    let (before, recovery) = check_image(
        open(&a.image, true)?,
        a.logdev.as_ref().map(|p| open(p, true)).transpose()?,
    )
    .map_err(|e| Failure::usage(anyhow!("{image}: cannot repair: {e}")))?;
    let mut changed = false;
    if recovery.damaged {
        let what = recovery.torn.as_deref().unwrap_or("damaged");
        if ro {
            println!("log: {what}; would replay it up to the damage and discard the rest");
        } else {
            println!("log: {what}");
            salvage_log(a)?;
            println!(
                "log: {} checkpoints replayed up to the damage; the rest is discarded and the log \
                 starts again there",
                recovery.checkpoints_replayed
            );
            changed = true;
        }
    } else if !recovery.was_clean {
        println!(
            "log: not clean, {} checkpoints to replay{}",
            recovery.checkpoints_replayed,
            if ro { "" } else { " (replayed)" }
        );
        if !ro {
            salvage_log(a)?;
            changed = true;
        }
    }
    let report = if changed {
        check_image(
            open(&a.image, true)?,
            a.logdev.as_ref().map(|p| open(p, true)).transpose()?,
        )
        .map_err(|e| Failure::usage(anyhow!("{image}: checking after the repair: {e}")))?
        .0
    } else {
        before
    };
    // The damaged log was one of the problems before; what is left now is in the trees.
    let left: Vec<&String> = report
        .problems
        .iter()
        .filter(|p| !(ro && p.starts_with("log: ")))
        .collect();
    for p in &left {
        println!("{p}");
    }
    if left.is_empty() {
        println!(
            "{image}: {}",
            match (changed, ro) {
                (true, _) => "repaired: consistent",
                (false, false) if superblock => "repaired: consistent",
                (false, true) if recovery.damaged => "consistent apart from the log",
                (false, _) => "consistent: nothing to repair",
            }
        );
        return Ok((changed && recovery.damaged) || (superblock && !ro));
    }
    Err(Failure::found(anyhow!(
        "{image}: {} problems left: cilfs repair does not rebuild trees yet",
        left.len()
    )))
}

/// Mounts with the log salvaged (replayed up to any damage), writes everything back and
/// unmounts cleanly: the log starts again at the damage.
fn salvage_log(a: &Args) -> Result<(), Failure> {
    let image = a.image.display();
    let data = open(&a.image, false)?;
    let logdev = a.logdev.as_ref().map(|p| open(p, false)).transpose()?;
    let j = Journal::open_salvage(data, logdev, JournalConfig::default())
        .map_err(|e| Failure::usage(anyhow!("{image}: replaying the log: {e}")))?;
    let fs = Fs::open(j, FsOptions::default())
        .map_err(|e| Failure::usage(anyhow!("{image}: opening after the replay: {e}")))?;
    fs.unmount()
        .map_err(|e| Failure::usage(anyhow!("{image}: writing back after the replay: {e}")))?;
    Ok(())
}
