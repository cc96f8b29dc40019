//! The superblock part of `cilfs repair` that only a file can have: an image file cut short
//! (its end copy lost) is extended back to the filesystem's size, so that the repair
//! (`check::repair`, which rewrites every damaged or missing copy) can write the copy there.

use crate::Failure;
use anyhow::anyhow;
use cilfs_core::format::geometry::Geometry;
use cilfs_device::{FileDevice, FileDeviceOptions};
use std::path::Path;

/// Ok(true) when it extended the file.
pub fn extend_cut_image(
    image: &Path,
    logdev: Option<&Path>,
    dry_run: bool,
) -> Result<bool, Failure> {
    let open = |p: &Path, read_only: bool| {
        FileDevice::open(
            p,
            FileDeviceOptions {
                read_only,
                ..Default::default()
            },
        )
        .map_err(Failure::usage)
    };
    let shown = image.display();
    let logdev = logdev.map(|p| open(p, true)).transpose()?;
    let log = logdev.as_ref().map(|d| d as _);
    let cannot = |e: &dyn std::fmt::Display| Failure::usage(anyhow!("{shown}: cannot repair: {e}"));
    // The end copy is the only thing past the end of a file one block short: give the file
    // its length back so the copy can be written (a block device cannot grow: it is reported).
    if !dry_run && std::fs::metadata(image).is_ok_and(|m| m.is_file()) {
        let g = Geometry::read(&open(image, true)?, log).map_err(|e| cannot(&e))?;
        let len = std::fs::metadata(image).map_err(|e| cannot(&e))?.len();
        if len < g.sb.data_bytes() {
            std::fs::OpenOptions::new()
                .write(true)
                .open(image)
                .and_then(|f| f.set_len(g.sb.data_bytes()))
                .map_err(|e| cannot(&e))?;
            println!(
                "superblock: {shown} was {len} bytes, cut short of the filesystem's {}: extended",
                g.sb.data_bytes()
            );
            return Ok(true);
        }
    }
    Ok(false)
}
