//! The FUSE transport a mount serves through: cilfs's own (`cilfs_fuse::native`), decoding
//! requests with cilfs-fuse-proto and answering each with one `Fs` call, through io_uring
//! queues or /dev/fuse reads as `uring=auto|on|off` says. It mounts type fuse.cilfs
//! (fuseblk.cilfs on a block device) with the image as source; the rest of the daemon (gate,
//! signals, readiness, clean unmount) only makes the mount and runs the session.

use super::mount_opts::MountOpts;
use crate::Failure;
use anyhow::anyhow;
use cilfs_core::fs::{AtimeMode, Fs};
use cilfs_fuse::native;
use std::path::Path;
use std::sync::Arc;

/// A mount made and not yet served.
#[derive(Debug)]
pub struct Session(native::Session);

impl Session {
    /// Runs `f` when the kernel sends DESTROY (a fuseblk unmount waits for its answer).
    pub fn on_destroy(&mut self, f: native::OnDestroy) {
        self.0.on_destroy(f);
    }

    /// Serves until unmounted.
    pub fn run(self, fs: &Arc<Fs>, opts: &MountOpts) -> Result<(), anyhow::Error> {
        let cfg = native::ServeConfig {
            threads: opts.threads,
            writeback_cache: opts.writeback_cache,
            uring: opts.uring,
            idmap: opts.idmap,
        };
        self.0.run(Arc::clone(fs), cfg).map_err(anyhow::Error::from)
    }
}

/// The mount's options, as kernel flags and fuse options. An image on a block device mounts as
/// `fuseblk.cilfs`, the one kind of /dev/fuse mount Linux passes sync(2) on to (FUSE_SYNCFS);
/// `block_size` is the filesystem's, bounded by what the kernel takes (512 to a page).
pub fn native_options(image: &Path, opts: &MountOpts, block_size: u32) -> native::MountOptions {
    use std::os::unix::fs::FileTypeExt;
    let blkdev = std::fs::metadata(image).is_ok_and(|m| m.file_type().is_block_device());
    native::MountOptions {
        source: std::fs::canonicalize(image)
            .unwrap_or_else(|_| image.to_path_buf())
            .display()
            .to_string(),
        subtype: "cilfs".into(),
        read_only: opts.ro,
        nosuid: !opts.suid,
        nodev: !opts.dev,
        noexec: !opts.exec,
        // Only for the mount table's sake: the kernel leaves atime on FUSE inodes to us.
        noatime: opts.atime == AtimeMode::Never,
        sync: opts.sync,
        dirsync: opts.dirsync,
        allow_other: opts.allow_other,
        default_permissions: true,
        blksize: blkdev.then(|| block_size.clamp(512, 4096)),
    }
}

/// Mounts `dir`; `invalidator` then reaches the session.
pub fn mount_native(
    image: &Path,
    dir: &Path,
    opts: &MountOpts,
    fs: &Fs,
    invalidator: &native::AttrInvalidator,
) -> Result<Session, Failure> {
    // uring=on: refused before anything is mounted when the kernel's switch is off or this
    // process may not set up io_uring (the session reports the rest: the kernel offers FUSE
    // over io_uring exactly when the switch is on).
    if opts.uring == native::UringMode::On {
        native::uring_available().map_err(|e| {
            Failure::usage(anyhow!(
                "uring=on: FUSE over io_uring is unavailable: {e} (root can enable it with \
                 echo Y > /sys/module/fuse/parameters/enable_uring)"
            ))
        })?;
    }
    let s = native::Session::mount(dir, &native_options(image, opts, fs.block_size()))
        .map_err(|e| Failure::usage(mount_error(dir, &e)))?;
    invalidator.connect(s.notifier());
    // For the log only: the person mounting asked for it.
    tracing::info!(
        target: super::daemon_log::QUIET,
        "FUSE transport: native ({}, {} threads, uring={:?})",
        native_options(image, opts, fs.block_size()).fstype(),
        opts.threads,
        opts.uring
    );
    Ok(Session(s))
}

/// Why the mount could not be made, with what to do when /dev/fuse does not exist.
fn mount_error(dir: &Path, e: &native::MountError) -> anyhow::Error {
    let missing = matches!(e, native::MountError::Open(io)
        if io.kind() == std::io::ErrorKind::NotFound);
    if missing {
        return anyhow!(
            "mounting on {}: {e}: /dev/fuse does not exist: load the fuse module (modprobe \
             fuse), or give the container the device",
            dir.display()
        );
    }
    anyhow!("mounting on {}: {e}", dir.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_mount_flags_follow_the_options() {
        let o = super::super::mount_opts::parse(&[
            "ro,nosuid,nodev,noexec,noatime,allow_other,dirsync".into(),
        ])
        .expect("valid");
        let n = native_options(Path::new("/nonexistent/img"), &o, 4096);
        assert_eq!(n.source, "/nonexistent/img");
        assert!(n.read_only && n.nosuid && n.nodev && n.noexec && n.noatime && n.allow_other);
        assert!(n.dirsync && !n.sync && n.default_permissions);
        assert_eq!(n.blksize, None, "an image file mounts as fuse");
        let d = native_options(Path::new("/img"), &MountOpts::default(), 4096);
        assert!(!d.read_only && !d.nosuid && !d.nodev && !d.noexec && !d.noatime && !d.allow_other);
    }
}
