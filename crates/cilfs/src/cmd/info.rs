//! `cilfs info IMAGE [--logdev PATH]`: the layout, state, free space and inode counts of a
//! filesystem, read without mounting it or replaying its log (as xfs_info and dumpe2fs -h).

use crate::Failure;
use anyhow::anyhow;
use cilfs_core::format::geometry::{uuid_string, Geometry};
use cilfs_core::format::superblock::SbLog;
use cilfs_core::fs::items::header::Header;
use cilfs_core::fs::types::RESERVE_BLOCKS;
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
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
    let mounted = matches!(super::mount::lock_image(&a.image, false), Ok(None));
    // While mounted the superblock says "needs recovery" (it is marked clean only at
    // unmount): say why, rather than leave an admin thinking the image is damaged.
    if mounted {
        println!("mounted        yes: the state above is that of a live mount");
    }
    let h = read_header(&a.image, &g)?;
    print_counts(&h, u64::from(g.sb.block_size));
    if !g.sb.clean || mounted {
        // The counters move with every commit, in the log first; the header block is written
        // in place only as the log tail moves past it. Replaying here would need a write (or
        // a copy of every replayed block) for a figure `cilfs check` gives exactly.
        println!("counts         as of the last header written in place: the log may hold newer");
        if mounted {
            println!("               (cilfs stat on the mount point counts live)");
        } else {
            println!(
                "               (an unclean image: cilfs check {} replays the log in memory and counts)",
                a.image.display()
            );
        }
    }
    Ok(())
}

/// The filesystem header as it lies in place (the first block after the internal log, or the
/// first after the superblock with an external one): its counters are current on a clean
/// image, and those of the last header write otherwise. Read-only, nothing replayed.
fn read_header(image: &Path, g: &Geometry) -> Result<Header, Failure> {
    let data = FileDevice::open(
        image,
        FileDeviceOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .map_err(Failure::usage)?;
    let (first, _) = g.metadata_area();
    let bs = u64::from(g.sb.block_size);
    let mut block = vec![0u8; g.sb.block_size as usize];
    let cannot = |e: String| {
        Failure::usage(anyhow!(
            "{}: cannot read the filesystem header (block {first}): {e}",
            image.display()
        ))
    };
    data.read(first * bs, &mut block)
        .map_err(|e| cannot(e.to_string()))?;
    Header::decode(&block, first).map_err(|e| cannot(e.to_string()))
}

/// Free space and inodes as the header counts them, as statfs on a mount would show them.
fn print_counts(h: &Header, bs: u64) {
    let g = super::stat::grouped;
    // The free list holds free blocks kept for the free-space trees' own nodes: free all the
    // same, as statfs counts them.
    let free = h.free_blocks + h.freelist.len() as u64;
    let area = h.data_end.saturating_sub(h.data_start);
    let avail = h.free_blocks.saturating_sub(RESERVE_BLOCKS);
    println!(
        "free space     {} of {} blocks ({} of {}), {} available to files",
        g(free),
        g(area),
        mib(free.saturating_mul(bs)),
        mib(area.saturating_mul(bs)),
        g(avail)
    );
    println!(
        "inodes         {} in use, {} free (no fixed count: as many as there are free blocks), next number {}",
        g(h.inode_count),
        g(avail),
        h.next_ino
    );
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
    println!("label          {}", String::from_utf8_lossy(&sb.label));
    println!(
        "format         version {}",
        cilfs_core::format::FORMAT_VERSION
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
    match sb.backup_blocks()[..] {
        [front, end] => println!(
            "backups        superblock copies at blocks {front} (byte {}) and {end} (the last)",
            front * u64::from(sb.block_size)
        ),
        _ => println!("backups        none (made before cilfs kept backup superblocks)"),
    }
    if let Some(b) = g.from_backup {
        println!(
            "superblock     primary damaged ({}), using the backup at block {b}: cilfs repair {} \
             rewrites it",
            g.primary_damage.as_deref().unwrap_or("unreadable"),
            image.display()
        );
    }
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
