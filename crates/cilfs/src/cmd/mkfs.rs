use crate::size::parse_size;
use crate::Failure;
use cilfs_core::mkfs::{plan, MkfsRequest};
use cilfs_device::IoStats;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image file or block device
    image: PathBuf,
    /// Filesystem size [default: 1G for a new file, the whole device or file otherwise]
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Block size: a power of two in 2048..65536
    #[arg(long, default_value = "4096", value_parser = parse_size)]
    block_size: u64,
    /// Log size [default: size/2048, at least 64M and at most 2G, at most a quarter of the device;
    /// with --logdev: the whole log device if it exists]
    #[arg(long, value_parser = parse_size)]
    log_size: Option<u64>,
    /// Put the log on this file or block device instead of inside the image
    #[arg(long)]
    logdev: Option<PathBuf>,
    /// Overwrite a target that contains data
    #[arg(long)]
    force: bool,
    /// Filesystem label, at most 255 bytes
    #[arg(short = 'L', long)]
    label: Option<String>,
    /// Print nothing but errors
    #[arg(long, short)]
    quiet: bool,
}

pub fn run(a: Args) -> Result<(), Failure> {
    // Held while mkfs runs: a mount's daemon would write over the new filesystem (--force
    // does not change that), and a mount starting meanwhile would read half of one.
    let _locks = [Some(&a.image), a.logdev.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| super::mount::refuse_mounted(p, "making a filesystem on it"))
        .collect::<Result<Vec<_>, _>>()?;
    let req = MkfsRequest {
        image: a.image.clone(),
        size: a.size,
        block_size: a.block_size,
        log_size: a.log_size,
        logdev: a.logdev.clone(),
        force: a.force,
    };
    let mut plan = plan(&req).map_err(Failure::usage)?;
    if let Some(l) = &a.label {
        if l.len() > cilfs_core::format::superblock::LABEL_MAX {
            return Err(Failure::usage(anyhow::anyhow!(
                "label of {} bytes: at most 255",
                l.len()
            )));
        }
        plan.label = l.clone().into_bytes();
    }
    let bar =
        ProgressBar::with_draw_target(Some(plan.layout.log_bytes()), ProgressDrawTarget::stderr());
    if a.quiet {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("writing log {bar:30} {bytes}/{total_bytes}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = plan
        .execute(
            (
                rustix::process::getuid().as_raw(),
                rustix::process::getgid().as_raw(),
            ),
            &mut |done, _| bar.set_position(done),
        )
        .map_err(Failure::usage)?;
    bar.finish_and_clear();
    if a.quiet {
        return Ok(());
    }
    // Print what is now on disk, read back through the same path `info` uses.
    let g = super::info::read_geometry(&a.image, a.logdev.as_deref())?;
    super::info::print_geometry(&a.image, a.logdev.as_deref(), &g);
    print_stats("data device io", &report.data_stats);
    if let Some(s) = &report.logdev_stats {
        print_stats("log device io", s);
    }
    Ok(())
}

fn print_stats(label: &str, s: &IoStats) {
    let fields: Vec<String> = s.fields().iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("{label:<15} {}", fields.join(" "));
}
