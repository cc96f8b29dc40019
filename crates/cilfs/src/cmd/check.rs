//! `cilfs check IMAGE [--logdev PATH]`: replays the log in memory (nothing is written), then
//! checks every structure. Exit 0 clean, 1 inconsistent (each problem on its own line), 2 could
//! not check.

use crate::Failure;
use anyhow::anyhow;
use cilfs_core::fs::check::check_image;
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image file or block device
    image: PathBuf,
    /// The external log device, if the filesystem has one
    #[arg(long)]
    logdev: Option<PathBuf>,
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
    if report.is_clean() {
        Ok(())
    } else {
        Err(Failure::found(anyhow!(
            "{} is inconsistent",
            a.image.display()
        )))
    }
}
