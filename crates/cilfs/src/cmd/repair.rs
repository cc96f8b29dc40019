//! `cilfs repair IMAGE [--logdev PATH] [-n]`: makes a damaged filesystem consistent again,
//! offline, as `xfs_repair` does: the log is replayed up to any damage and the rest discarded
//! (`-L` is implied), the trees are rebuilt from whatever survives (a scan of the data area
//! finds leaves an unreadable node no longer reaches), what check finds is fixed, and inodes
//! no name reaches go to `/lost+found`. Every change is listed at the end. Exit 0 consistent
//! afterwards (or nothing to do), 1 problems remain (with `-n`: a repair would change
//! something), 2 could not run. With `-n` nothing is written: it says what it would do.

use crate::Failure;
use anyhow::anyhow;
use cilfs_core::check::repair::{repair_image, RepairOptions, RepairProgress};
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
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

/// A bar on stderr when it is a terminal (indicatif draws nothing otherwise).
fn progress_bar() -> (ProgressBar, Box<dyn FnMut(RepairProgress) + Send>) {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg:6} {bar:30} {pos}/{len}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let b = bar.clone();
    let tell = Box::new(move |p: RepairProgress| {
        b.set_message(p.phase);
        if p.total > 0 {
            b.set_length(p.total);
        }
        b.set_position(p.done);
    });
    (bar, tell)
}

/// The repair; Ok(true) when it repaired damage and left the filesystem consistent,
/// Ok(false) when there was none (a dirty log is replayed, which is no damage).
pub fn repair(a: &Args) -> Result<bool, Failure> {
    let image = a.image.display().to_string();
    // Held throughout: no mount may start while the log is cut and the trees are rebuilt.
    let _locks = [Some(&a.image), a.logdev.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| super::mount::refuse_mounted(p, "repairing it"))
        .collect::<Result<Vec<_>, _>>()?;
    let ro = a.no_modify;
    // An image file cut short loses its end copy of the superblock: its length back first.
    super::repair_sb::extend_cut_image(&a.image, a.logdev.as_deref(), ro)?;
    let (bar, tell) = progress_bar();
    let report = repair_image(
        open(&a.image, ro)?,
        a.logdev.as_ref().map(|p| open(p, ro)).transpose()?,
        RepairOptions {
            dry_run: ro,
            progress: Some(tell),
        },
    );
    bar.finish_and_clear();
    let report = report.map_err(|e| Failure::usage(anyhow!("{image}: cannot repair: {e}")))?;
    if ro && report.log_damaged {
        println!("log: damaged; would replay it up to the damage and discard the rest");
    }
    if report.changed() {
        println!(
            "{} {} changes:",
            if ro { "a repair would make" } else { "made" },
            report.changes.len()
        );
        for c in &report.changes {
            println!("  {c}");
        }
    }
    if report.inodes_lost > 0 || report.moved_to_lost_found > 0 {
        println!(
            "{} inodes lost, {} put in /lost+found",
            report.inodes_lost, report.moved_to_lost_found
        );
    }
    for p in &report.problems_left {
        println!("{p}");
    }
    if !report.problems_left.is_empty() {
        return Err(Failure::found(anyhow!(
            "{image}: {} problems left{}",
            report.problems_left.len(),
            if ro {
                " even after a repair"
            } else {
                " after the repair"
            }
        )));
    }
    if ro && report.changed() {
        return Err(Failure::found(anyhow!(
            "{image}: not consistent; a repair would fix it (nothing was written)"
        )));
    }
    println!(
        "{image}: {}",
        if report.changed() {
            "repaired: consistent"
        } else {
            "consistent: nothing to repair"
        }
    );
    Ok(report.damage_repaired)
}
