//! `cilfs mount IMAGE DIR [-o opts]`: recover the log, mount through FUSE, and keep serving in
//! the background (a re-executed copy of this command in its own process group) once the mount
//! is usable; `--foreground` stays attached. `cilfs unmount DIR` ends it cleanly.

use super::mount_opts::{self, MountOpts};
use crate::Failure;
use anyhow::{anyhow, Context};
use cilfs_core::fs::{AtimeMode, Fs, FsOptions};
use cilfs_core::journal::{Journal, JournalConfig, PushMode};
use cilfs_core::Geometry;
use cilfs_device::{Device, DirectIo, FileDevice, FileDeviceOptions};
use fuser::{Config, MountOption, SessionACL};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image file or block device holding the filesystem
    image: PathBuf,
    /// Directory to mount on
    dir: PathBuf,
    /// Mount options, comma separated: logbufs=2..8, logbsize=16k..256k, logdev=PATH,
    /// flush=reduced|legacy, iversion=lazy|eager, tsgran=1ms, data=ordered|writeback,
    /// threads=N, cache=SIZE, writeback_cache, ro, allow_other
    #[arg(short = 'o')]
    options: Vec<String>,
    /// Stay attached to the terminal instead of serving in the background
    #[arg(long)]
    foreground: bool,
}

/// Set in the environment of the background copy: it reports readiness on stdout.
const NOTIFY_ENV: &str = "CILFS_MOUNT_NOTIFY";

pub fn run(a: Args) -> Result<(), Failure> {
    let opts = mount_opts::parse(&a.options).map_err(|e| Failure::usage(anyhow!(e)))?;
    if opts
        .logdev
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(Failure::usage(anyhow!(
            "option logdev needs a path (logdev=PATH)"
        )));
    }
    // The image and log device are opened once here, before any daemon is spawned, so that a
    // missing or unreadable path, a directory or a FIFO (whose blocking open would wait
    // forever for a writer) is refused at once with its own message.
    let probe = FileDeviceOptions {
        read_only: true,
        direct: DirectIo::Never,
        ..FileDeviceOptions::default()
    };
    for p in std::iter::once(&a.image).chain(opts.logdev.as_ref()) {
        FileDevice::open(p, probe).map_err(Failure::usage)?;
    }
    match std::fs::metadata(&a.dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Failure::usage(anyhow!(
                "{}: not a directory",
                a.dir.display()
            )))
        }
        Err(e) => return Err(Failure::usage(anyhow!("{}: {e}", a.dir.display()))),
    }
    refuse_mount_point(&a.dir)?;
    if opts.norecovery && !opts.ro {
        return Err(Failure::usage(anyhow!(
            "option norecovery needs ro: a read-write mount must replay the log"
        )));
    }
    if a.foreground {
        serve(&a, &opts)
    } else {
        spawn_background(&a)
    }
}

/// Refuses a directory that is already a mount point (of anything): a mount stacked on another
/// hides it, and one `cilfs unmount` would take both down.
fn refuse_mount_point(dir: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::MetadataExt;
    let what = match super::unmount::mounts_on(dir).last() {
        Some(m) => format!(" ({} from {})", m.fstype, m.source),
        None => {
            // Without mountinfo: a mount point's device differs from its parent's.
            let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            let dev = |p: &Path| std::fs::metadata(p).ok().map(|m| m.dev());
            match canon.parent() {
                Some(parent) if dev(&canon) != dev(parent) => String::new(),
                _ => return Ok(()),
            }
        }
    };
    Err(Failure::usage(anyhow!(
        "{} is already a mount point{what}: unmount it first or choose another directory",
        dir.display()
    )))
}

/// Where the background daemon writes its messages.
pub fn log_path(dir: &Path) -> PathBuf {
    let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let name: String = canon
        .display()
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    std::env::temp_dir().join(format!("cilfs-mount{name}.log"))
}

fn spawn_background(a: &Args) -> Result<(), Failure> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(Failure::usage)?;
    let log = log_path(&a.dir);
    let log_file = File::create(&log)
        .with_context(|| format!("creating {}", log.display()))
        .map_err(Failure::usage)?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(&a.image)
        .arg(&a.dir)
        .arg("--foreground");
    for o in &a.options {
        cmd.arg("-o").arg(o);
    }
    let mut child = cmd
        .env(NOTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        // Its own process group: a ^C at the terminal that ran mount does not reach it.
        .process_group(0)
        .spawn()
        .map_err(Failure::usage)?;
    let ready = child.stdout.take().map(|out| {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .any(|l| l == "ready")
    });
    if ready == Some(true) {
        // What the daemon said while mounting (a log recovered, or left unreplayed) is news
        // for whoever mounted.
        for l in std::fs::read_to_string(&log).unwrap_or_default().lines() {
            eprintln!("{l}");
        }
        println!(
            "mounted {} on {} (unmount with: cilfs unmount {}; messages in {})",
            a.image.display(),
            a.dir.display(),
            a.dir.display(),
            log.display()
        );
        return Ok(());
    }
    let status = child.wait().map_err(Failure::usage)?;
    let msg = std::fs::read_to_string(&log).unwrap_or_default();
    let last = msg
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("the mount daemon exited")
        .trim_start_matches("cilfs: ")
        .to_string();
    Err(Failure {
        status: status.code().map_or(2, |c| c.clamp(1, 255) as u8),
        error: anyhow!(last),
    })
}

/// Takes the image's exclusive lock: one mount (or unmount waiting for it) at a time.
pub fn lock_image(image: &Path, wait: bool) -> std::io::Result<Option<File>> {
    use rustix::fs::{flock, FlockOperation};
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: never wait in open() (for a FIFO's writer); flock does not look at it.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(image)?;
    let op = if wait {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    match flock(&f, op) {
        Ok(()) => Ok(Some(f)),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Takes the lock of an image or log device that a tool is about to read or write, refusing
/// one that a mount holds (as mkfs.xfs and xfs_repair refuse a mounted device): `doing` says
/// what the tool would do. A path that cannot be opened is left to the tool to report.
pub fn refuse_mounted(path: &Path, doing: &str) -> Result<Option<File>, Failure> {
    match lock_image(path, false) {
        Ok(Some(f)) => Ok(Some(f)),
        Ok(None) => Err(Failure::usage(anyhow!(
            "{} is mounted: unmount it before {doing}",
            path.display()
        ))),
        Err(_) => Ok(None),
    }
}

fn serve(a: &Args, opts: &MountOpts) -> Result<(), Failure> {
    // First, while this is the only thread: every thread started later inherits the blocked
    // stop signals, which the stopper's thread alone takes.
    let stop = super::daemon::Stopper::install().map_err(Failure::usage)?;
    // Resolved now: once mounted, resolving it would ask the session, which serves only later.
    let mount_point = std::fs::canonicalize(&a.dir).unwrap_or_else(|_| a.dir.clone());
    let _lock = lock_image(&a.image, false)
        .map_err(Failure::usage)?
        .ok_or_else(|| {
            Failure::usage(anyhow!("{} is in use by another mount", a.image.display()))
        })?;
    // The log device is written as much as the image: one mount (or mkfs, or check) at a time.
    let _log_lock = match &opts.logdev {
        Some(p) => Some(
            lock_image(p, false)
                .map_err(Failure::usage)?
                .ok_or_else(|| {
                    Failure::usage(anyhow!("{} is in use by another mount", p.display()))
                })?,
        ),
        None => None,
    };
    // `ro` opens read-only (an image without write permission, on read-only media) and keeps
    // whatever the journal writes (superblock, unmount record) in memory.
    let dev_opts = FileDeviceOptions {
        read_only: opts.ro,
        ..FileDeviceOptions::default()
    };
    let data: Arc<dyn Device> =
        Arc::new(FileDevice::open(&a.image, dev_opts).map_err(Failure::usage)?);
    let logdev: Option<Arc<dyn Device>> = match &opts.logdev {
        Some(p) => Some(Arc::new(
            FileDevice::open(p, dev_opts).map_err(Failure::usage)?,
        )),
        None => None,
    };
    let geo = Geometry::read(&*data, logdev.as_deref())
        .map_err(|e| Failure::usage(anyhow!("{}: {e}", a.image.display())))?;
    if opts.ro && !geo.sb.clean && !opts.norecovery {
        return Err(Failure::usage(anyhow!(
            "{}: the log needs recovery, which writes to the image: mount it read-write once, \
             or add norecovery to mount it read-only without replaying the log",
            a.image.display()
        )));
    }
    // Until the FUSE mount exists nothing reaches the devices: a mount that fails leaves them
    // as they were. A read-only mount never lets anything through.
    let gate = cilfs_device::Gate::new();
    let hold = |d: Arc<dyn Device>| -> Arc<dyn Device> {
        if opts.ro {
            Arc::new(cilfs_device::OverlayDevice::new(d))
        } else {
            Arc::new(gate.wrap(d))
        }
    };
    let (data, logdev) = (hold(data), logdev.map(hold));
    let mut log = opts.log_config();
    if opts.default_geometry() {
        log = log.fitted_to(geo.log_bytes);
    }
    let cfg = JournalConfig {
        log,
        push_mode: PushMode::Background,
        cache_bytes_max: opts.cache,
        ..JournalConfig::default()
    };
    let journal = if opts.norecovery {
        Journal::open_norecovery(data, logdev, cfg)
    } else {
        Journal::open(data, logdev, cfg)
    }
    .map_err(|e| Failure::usage(anyhow!("{}: {e}", a.image.display())))?;
    let r = journal.recovery_report().clone();
    if r.checkpoints_skipped > 0 {
        eprintln!(
            "cilfs: {}: norecovery: the log was not replayed ({} checkpoints): files are as \
             written in place, possibly older than the log and inconsistent",
            a.image.display(),
            r.checkpoints_skipped
        );
    } else if !r.was_clean {
        eprintln!(
            "cilfs: {}: recovered the log: {} checkpoints replayed{}",
            a.image.display(),
            r.checkpoints_replayed,
            r.torn
                .as_deref()
                .map(|t| format!(", {t}"))
                .unwrap_or_default()
        );
    }
    let invalidator = cilfs_fuse::AttrInvalidator::default();
    let fs_opts = FsOptions {
        attrs_changed: Some(invalidator.hook()),
        holds_fsetid: Some(Arc::new(cilfs_fuse::holds_fsetid)),
        ..opts.fs_options()
    };
    let fs = Fs::open(Arc::clone(&journal), fs_opts)
        .map_err(|e| Failure::usage(anyhow!("{}: {e}", a.image.display())))?;
    let mut mo = vec![
        MountOption::FSName(
            std::fs::canonicalize(&a.image)
                .unwrap_or_else(|_| a.image.clone())
                .display()
                .to_string(),
        ),
        MountOption::Subtype("cilfs".into()),
        MountOption::DefaultPermissions,
        // Without Dev and Suid fuser's mount sets nodev,nosuid; cilfs's defaults are mount(8)'s.
        if opts.dev {
            MountOption::Dev
        } else {
            MountOption::NoDev
        },
        if opts.suid {
            MountOption::Suid
        } else {
            MountOption::NoSuid
        },
        if opts.ro {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    if opts.allow_other {
        mo.push(MountOption::CUSTOM("allow_other".into()));
    }
    if !opts.exec {
        mo.push(MountOption::NoExec);
    }
    // Only for the mount table's sake: the kernel leaves atime on FUSE inodes to us.
    if opts.atime == AtimeMode::Never {
        mo.push(MountOption::NoAtime);
    }
    let mut config = Config::default();
    config.mount_options = mo;
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads);
    config.clone_fd = true;
    if let Some(sig) = stop.signal() {
        return Err(Failure::usage(anyhow!(
            "{} came before the mount was made: nothing was written",
            sig.as_str()
        )));
    }
    let session = fuser::Session::new(
        cilfs_fuse::CilfsFuse::new(Arc::clone(&fs), opts.writeback_cache),
        &a.dir,
        &config,
    )
    .map_err(|e| Failure::usage(anyhow!("mounting on {}: {e}", a.dir.display())))?;
    invalidator.connect(session.notifier());
    // The mount exists: what recovery and the journal wrote meanwhile may reach the image. If
    // that fails, dropping the session unmounts.
    gate.release().map_err(|e| {
        Failure::usage(anyhow!(
            "{}: writing the recovered log: {e}",
            a.image.display()
        ))
    })?;
    stop.mounted(&mount_point);
    let _ = super::daemon::sd_notify(&format!(
        "READY=1\nSTATUS=serving {} on {}",
        a.image.display(),
        a.dir.display()
    ));
    if std::env::var_os(NOTIFY_ENV).is_some() {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
    } else {
        eprintln!(
            "cilfs: serving {} on {} (unmount with: cilfs unmount {})",
            a.image.display(),
            a.dir.display(),
            a.dir.display()
        );
    }
    // File data waits in the page cache like in a kernel's: written back every 30 s (and at
    // fsync, sync and unmount, and under memory pressure).
    let flusher = {
        let fs = Arc::downgrade(&fs);
        std::thread::Builder::new()
            .name("cilfs-flush".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_secs(30));
                let Some(fs) = fs.upgrade() else { return };
                if let Err(e) = fs.writeback_all() {
                    eprintln!("cilfs: periodic write back failed: {e}");
                }
            })
    };
    let served = session.run();
    drop(flusher);
    // Unmounted (or the connection was aborted): make everything stable and leave a clean log.
    let unmounted = fs.unmount();
    drop(fs);
    drop(journal);
    if let Err(e) = served {
        return Err(Failure::usage(anyhow!(
            "FUSE session ended with an error: {e}"
        )));
    }
    unmounted.map_err(|e| Failure::usage(anyhow!("clean unmount failed: {e}")))?;
    Ok(())
}
