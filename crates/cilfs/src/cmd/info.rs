use crate::Failure;
use cilfs_core::format::superblock::SbLog;
use cilfs_core::geometry::{uuid_string, Geometry};
use cilfs_device::{FileDevice, FileDeviceOptions};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image file or block device
    image: PathBuf,
    /// The external log device, if the filesystem has one
    #[arg(long)]
    logdev: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<(), Failure> {
    let g = read_geometry(&a.image, a.logdev.as_deref())?;
    print_geometry(&a.image, a.logdev.as_deref(), &g);
    // While mounted the superblock says "needs recovery" (it is marked clean only at
    // unmount): say why, rather than leave an admin thinking the image is damaged.
    if matches!(super::mount::lock_image(&a.image, false), Ok(None)) {
        println!("mounted        yes: the state above is that of a live mount");
    }
    Ok(())
}

/// Opens the devices read-only and reads the filesystem's layout.
pub fn read_geometry(image: &Path, logdev: Option<&Path>) -> Result<Geometry, Failure> {
    let opts = FileDeviceOptions {
        read_only: true,
        ..Default::default()
    };
    let data = FileDevice::open(image, opts).map_err(Failure::usage)?;
    let logdev = logdev
        .map(|p| FileDevice::open(p, opts))
        .transpose()
        .map_err(Failure::usage)?;
    Geometry::read(&data, logdev.as_ref().map(|d| d as _))
        .map_err(|e| Failure::usage(anyhow::anyhow!("{}: {e}", image.display())))
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

pub fn print_geometry(image: &Path, logdev: Option<&Path>, g: &Geometry) {
    let sb = &g.sb;
    println!("image          {}", image.display());
    println!("uuid           {}", uuid_string(&sb.uuid));
    println!(
        "format         version {}",
        cilfs_core::format::superblock::FORMAT_VERSION
    );
    println!(
        "block size     {} bytes, sector size 512 bytes",
        sb.block_size
    );
    println!(
        "data           {} blocks ({})",
        sb.data_blocks,
        mib(sb.data_bytes())
    );
    match sb.log {
        SbLog::Internal { start } => println!(
            "log            internal, blocks {start}..{} ({} blocks, {})",
            start + sb.log_blocks,
            sb.log_blocks,
            mib(sb.log_bytes())
        ),
        SbLog::External { log_uuid } => println!(
            "log            external on {}, uuid {}, blocks 1..{} ({} blocks, {})",
            logdev.map_or_else(|| "?".into(), |p| p.display().to_string()),
            uuid_string(&log_uuid),
            1 + sb.log_blocks,
            sb.log_blocks,
            mib(sb.log_bytes())
        ),
    }
    println!("log offset     byte {} of the log device", g.log_offset);
    println!(
        "state          {}, unclean-mount epoch {}",
        if sb.clean { "clean" } else { "needs recovery" },
        sb.unclean_epoch
    );
    if sb.needs_check {
        println!(
            "needs check    yes: a mount met a corrupt metadata block; run cilfs check {}",
            image.display()
        );
    }
}
