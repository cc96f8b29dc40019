//! Which FUSE transport a mount serves through: `transport=native` (the default, cilfs's own,
//! `cilfs_fuse::native`, with requests through io_uring queues as `uring=auto|on|off` says) or
//! `transport=fuser` (the fuser crate, kept for comparison while it is still maintained here).
//! Native is the default since a run on a quiet machine (docs/bench-results.md, 2026-11-27)
//! found it as fast as fuser over /dev/fuse and 1.3-1.8x faster over io_uring, and only it
//! passes sync(2) on (on a block device), kills set-ID bits as the kernel asks and serves
//! FUSE over io_uring. Both mount the same
//! way (type fuse.cilfs, or fuseblk.cilfs for the native transport on a block device; the
//! image as source; the same flags) and answer with the same `Fs`
//! calls; the rest of the daemon (gate, signals, readiness, clean unmount) does not know which.

use super::mount_opts::MountOpts;
use crate::Failure;
use anyhow::anyhow;
use cilfs_core::fs::{AtimeMode, AttrsChanged, Fs};
use cilfs_fuse::native;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    Fuser,
    #[default]
    Native,
}

impl Transport {
    pub fn parse(v: &str) -> Result<Transport, String> {
        match v {
            "fuser" => Ok(Transport::Fuser),
            "native" => Ok(Transport::Native),
            x => Err(format!("transport={x}: use fuser or native")),
        }
    }
}

/// `uring=`: whether the native transport takes requests through io_uring queues.
pub fn parse_uring(v: &str) -> Result<native::UringMode, String> {
    match v {
        "auto" => Ok(native::UringMode::Auto),
        "on" => Ok(native::UringMode::On),
        "off" => Ok(native::UringMode::Off),
        x => Err(format!("uring={x}: use auto, on or off")),
    }
}

/// Where the core's "attributes changed behind a reply" goes: to the session of the
/// transport in use, once it exists.
#[derive(Debug, Clone, Default)]
pub struct Invalidator {
    pub fuser: cilfs_fuse::AttrInvalidator,
    pub native: native::AttrInvalidator,
}

impl Invalidator {
    pub fn hook(&self, t: Transport) -> AttrsChanged {
        match t {
            Transport::Fuser => self.fuser.hook(),
            Transport::Native => self.native.hook(),
        }
    }
}

/// A mount made and not yet served.
#[derive(Debug)]
pub enum Session {
    Fuser(fuser::Session<cilfs_fuse::CilfsFuse>),
    Native(native::Session),
}

impl Session {
    /// Serves until unmounted.
    pub fn run(self, fs: &Arc<Fs>, opts: &MountOpts) -> Result<(), anyhow::Error> {
        match self {
            // fuser ends quietly on ENODEV only; ECONNABORTED is the same end of the
            // connection (see cilfs-fuse's dev.rs), and the clean shutdown follows.
            Session::Fuser(s) => match s.run() {
                Err(e)
                    if e.raw_os_error() == Some(rustix::io::Errno::CONNABORTED.raw_os_error()) =>
                {
                    Ok(())
                }
                r => r.map_err(anyhow::Error::from),
            },
            Session::Native(s) => {
                let cfg = native::ServeConfig {
                    threads: opts.threads,
                    writeback_cache: opts.writeback_cache,
                    uring: opts.uring,
                };
                s.run(Arc::clone(fs), cfg).map_err(anyhow::Error::from)
            }
        }
    }
}

/// The native mount's options: the choices the fuser path's MountOption list makes
/// (mount.rs), as kernel flags and fuse options. An image on a block device mounts as
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

/// Mounts `dir` through the native transport.
pub fn mount_native(
    image: &Path,
    dir: &Path,
    opts: &MountOpts,
    fs: &Fs,
    invalidator: &Invalidator,
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
        .map_err(|e| Failure::usage(anyhow!("mounting on {}: {e}", dir.display())))?;
    invalidator.native.connect(s.notifier());
    // For the log only: the person mounting asked for it.
    tracing::info!(
        target: super::daemon_log::QUIET,
        "FUSE transport: native ({}, {} threads, uring={:?})",
        native_options(image, opts, fs.block_size()).fstype(),
        opts.threads,
        opts.uring
    );
    Ok(Session::Native(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_names() {
        assert_eq!(Transport::parse("fuser"), Ok(Transport::Fuser));
        assert_eq!(Transport::parse("native"), Ok(Transport::Native));
        assert!(Transport::parse("uring").is_err());
        assert_eq!(Transport::default(), Transport::Native);
        assert_eq!(parse_uring("on"), Ok(native::UringMode::On));
        assert_eq!(parse_uring("off"), Ok(native::UringMode::Off));
        assert_eq!(parse_uring("auto"), Ok(native::UringMode::Auto));
        assert!(parse_uring("yes").is_err());
        let o = super::super::mount_opts::parse(&["transport=native,uring=on".into()]).unwrap();
        assert_eq!(o.uring, native::UringMode::On);
        assert_eq!(
            super::super::mount_opts::MountOpts::default().uring,
            native::UringMode::Auto
        );
        // uring=on alone takes the default transport; with fuser it is refused.
        let o = super::super::mount_opts::parse(&["uring=on".into()]).unwrap();
        assert_eq!(o.transport, Transport::Native);
        assert!(
            super::super::mount_opts::parse(&["transport=fuser,uring=on".into()])
                .unwrap_err()
                .contains("transport=native")
        );
    }

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
