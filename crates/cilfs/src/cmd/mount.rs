//! `cilfs mount IMAGE DIR [-o opts]`: recover the log, mount through FUSE, and keep serving in
//! the background (a re-executed copy of this command in its own process group) once the mount
//! is usable; `--foreground` stays attached. `cilfs unmount DIR` ends it cleanly.

use super::daemon_log::{self, DaemonLog, Echo, QUIET};
use super::mount_opts::{self, MountOpts};
use crate::Failure;
use anyhow::anyhow;
use cilfs_core::fs::{Fs, FsOptions};
use cilfs_core::journal::{Journal, JournalConfig, PushMode};
use cilfs_core::Geometry;
use cilfs_device::{Device, DirectIo, FileDevice, FileDeviceOptions};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Image file or block device holding the filesystem
    image: PathBuf,
    /// Directory to mount on
    dir: PathBuf,
    /// Mount options, comma separated: logbufs=2..8, logbsize=16k..256k, logdev=PATH,
    /// flush=reduced|legacy, iversion=lazy|eager, tsgran=1ms, data=ordered|writeback,
    /// threads=N, cache=SIZE, writeback_cache, ro, allow_other, noatime|relatime|strictatime,
    /// nodiratime, lazytime, sync, dirsync, and mount(8)'s standard ones (see the README)
    #[arg(short = 'o')]
    options: Vec<String>,
    /// Stay attached to the terminal instead of serving in the background
    #[arg(long)]
    foreground: bool,
}

/// Set in the environment of the background copy: it reports readiness on stdout.
const NOTIFY_ENV: &str = "CILFS_MOUNT_NOTIFY";

pub fn run(mut a: Args) -> Result<(), Failure> {
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
    // `loop`: from here on the image is the loop device; this process holds it until the
    // mount is up (in the background) or over (in the foreground).
    let _loop = if opts.loop_dev && std::fs::metadata(&a.image).is_ok_and(|m| m.is_file()) {
        let l = cilfs_device::loopdev::attach(&a.image, opts.ro).map_err(Failure::usage)?;
        a.image = l.path.clone();
        Some(l)
    } else {
        None
    };
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

fn spawn_background(a: &Args) -> Result<(), Failure> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(Failure::usage)?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(&a.image)
        .arg(&a.dir)
        .arg("--foreground");
    for o in &a.options {
        cmd.arg("-o").arg(o);
    }
    // The daemon tells this process what it says while mounting, where it logs and when it is
    // ready on stdout (see `Notify`); its stderr would outlive this reader, so it has none:
    // everything it says later goes to its log.
    let mut child = cmd
        .env(NOTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own process group: a ^C at the terminal that ran mount does not reach it.
        .process_group(0)
        .spawn()
        .map_err(Failure::usage)?;
    let mut said = Vec::new();
    let mut log = None;
    let mut ready = false;
    if let Some(out) = child.stdout.take() {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(m) = l.strip_prefix("say ") {
                said.push(m.to_string());
            } else if let Some(w) = l.strip_prefix("log ") {
                log = Some(w.to_string());
            } else if l == "ready" {
                ready = true;
                break;
            }
        }
    }
    if ready {
        // What the daemon said while mounting (a log recovered, or left unreplayed, a check
        // owed) is news for whoever mounted.
        for m in &said {
            eprintln!("cilfs: {m}");
        }
        println!(
            "mounted {} on {} (unmount with: cilfs unmount {}; messages in {})",
            a.image.display(),
            a.dir.display(),
            a.dir.display(),
            log.as_deref().unwrap_or("the daemon's log")
        );
        return Ok(());
    }
    let status = child.wait().map_err(Failure::usage)?;
    let last = said
        .last()
        .cloned()
        .unwrap_or_else(|| format!("the mount daemon exited ({status})"));
    Err(Failure {
        status: status.code().map_or(2, |c| c.clamp(1, 255) as u8),
        error: anyhow!(last),
    })
}

/// An image's exclusive lock, held as long as this lives.
#[derive(Debug)]
pub struct ImageLock {
    _image: File,
    /// The file behind a loop device, locked too: one image reached through two names (the
    /// file, a loop device, another loop device) is still one.
    _backing: Option<File>,
}

/// Takes the image's exclusive lock: one mount (or unmount waiting for it, or a tool) at a
/// time. On a loop device, also the lock of the file behind it, when this process can open
/// that file (deleted since it was bound, unreadable to this user or in another mount
/// namespace, nobody can open it by that path either, and the device's lock stands alone).
/// `None`: held by someone else.
pub fn lock_image(image: &Path, wait: bool) -> std::io::Result<Option<ImageLock>> {
    let Some(f) = flock_path(image, wait)? else {
        return Ok(None);
    };
    let backing = match cilfs_device::loopdev::backing_file(image) {
        Some(b) => match flock_path(&b, wait) {
            Ok(Some(l)) => Some(l),
            Ok(None) => return Ok(None),
            Err(_) => None,
        },
        None => None,
    };
    Ok(Some(ImageLock {
        _image: f,
        _backing: backing,
    }))
}

/// `path` opened and locked exclusively (waiting for it when `wait`), or `None` when another
/// holds it.
fn flock_path(path: &Path, wait: bool) -> std::io::Result<Option<File>> {
    use rustix::fs::{flock, FlockOperation};
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: never wait in open() (for a FIFO's writer); flock does not look at it.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
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
pub fn refuse_mounted(path: &Path, doing: &str) -> Result<Option<ImageLock>, Failure> {
    match lock_image(path, false) {
        Ok(Some(f)) => Ok(Some(f)),
        Ok(None) => Err(Failure::usage(anyhow!(
            "{} is mounted: unmount it before {doing}",
            path.display()
        ))),
        Err(_) => Ok(None),
    }
}

/// Writes one line of the protocol the background daemon speaks to the `cilfs mount` that
/// started it (`say MESSAGE`, `log WHERE`, `ready`). Errors are ignored: that process may be
/// gone, and it is only told.
fn notify(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn serve(a: &Args, opts: &MountOpts) -> Result<(), Failure> {
    // First, while this is the only thread: every thread started later inherits the blocked
    // stop signals, which the stopper's thread alone takes.
    let stop = super::daemon::Stopper::install().map_err(Failure::usage)?;
    // Resolved now: once mounted, resolving it would ask the session, which serves only later.
    let mount_point = std::fs::canonicalize(&a.dir).unwrap_or_else(|_| a.dir.clone());
    let background = std::env::var_os(NOTIFY_ENV).is_some();
    let echo = if background {
        Echo::Notify
    } else {
        Echo::Stderr
    };
    let log = match daemon_log::install(&mount_point, echo) {
        Ok(l) => l,
        Err(e) => {
            if background {
                notify(&format!("say {e}"));
            }
            return Err(Failure::usage(e));
        }
    };
    // Named absolutely in what the log says, wherever the daemon was started from.
    let a = &Args {
        image: std::fs::canonicalize(&a.image).unwrap_or_else(|_| a.image.clone()),
        ..a.clone()
    };
    tracing::info!(
        target: QUIET,
        "mounting {} on {} (options: {})",
        a.image.display(),
        mount_point.display(),
        if a.options.is_empty() { "none".to_string() } else { a.options.join(",") }
    );
    let r = serve_logged(a, opts, &stop, &mount_point, &log);
    if let Err(f) = &r {
        // Logged once: on a terminal main prints it, so the echo stops first; the background
        // mount's starter hears it through the echo.
        if log.echoes_to_stderr() {
            log.stop_echo();
        }
        tracing::error!("{}", crate::one_line(&f.error));
    }
    r
}

fn serve_logged(
    a: &Args,
    opts: &MountOpts,
    stop: &super::daemon::Stopper,
    mount_point: &Path,
    dlog: &DaemonLog,
) -> Result<(), Failure> {
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
    log_recovery(&a.image, &journal);
    let invalidator = cilfs_fuse::native::AttrInvalidator::default();
    let fs_opts = FsOptions {
        attrs_changed: Some(invalidator.hook()),
        holds_fsetid: Some(Arc::new(cilfs_fuse::holds_fsetid)),
        ..opts.fs_options()
    };
    let fs = Fs::open(Arc::clone(&journal), fs_opts)
        .map_err(|e| Failure::usage(anyhow!("{}: {e}", a.image.display())))?;
    observe_errors(&a.image, &journal, opts.ro);
    if let Some(sig) = stop.signal() {
        return Err(Failure::usage(anyhow!(
            "{} came before the mount was made: nothing was written",
            sig.as_str()
        )));
    }
    // A user's mount goes through fusermount3, which says why it failed in words of its own:
    // the usual obstacle, a /dev/fuse the user may not open, is explained here first.
    if let Some(e) = user_cannot_open_dev_fuse(&a.dir) {
        return Err(Failure::usage(e));
    }
    let session = super::transport::mount_native(&a.image, &a.dir, opts, &fs, &invalidator)?;
    // The mount exists: what recovery and the journal wrote meanwhile may reach the image. If
    // that fails, dropping the session unmounts.
    gate.release().map_err(|e| {
        Failure::usage(anyhow!(
            "{}: writing the recovered log: {e}",
            a.image.display()
        ))
    })?;
    stop.mounted(mount_point);
    let _ = super::daemon::sd_notify(&format!(
        "READY=1\nSTATUS=serving {} on {}",
        a.image.display(),
        a.dir.display()
    ));
    let serving = format!(
        "serving {} on {} (unmount with: cilfs unmount {})",
        a.image.display(),
        mount_point.display(),
        a.dir.display()
    );
    if std::env::var_os(NOTIFY_ENV).is_some() {
        // The starter prints its own line, then leaves: nobody reads the pipe after "ready".
        dlog.stop_echo();
        tracing::info!("{serving}");
        notify(&format!("log {}", dlog.destination));
        notify("ready");
    } else {
        tracing::info!("{serving}");
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
                if let Err(e) = fs.writeback_idle() {
                    tracing::error!("periodic write back failed: {e}");
                }
            })
    };
    let served = session.run(&fs, opts);
    drop(flusher);
    // Unmounted (or the connection was aborted): make everything stable and leave a clean log.
    let unmounted = fs.unmount();
    let needs_check = journal.superblock().needs_check;
    drop(fs);
    drop(journal);
    if let Err(e) = served {
        return Err(Failure::usage(anyhow!(
            "FUSE session ended with an error: {e}"
        )));
    }
    unmounted.map_err(|e| Failure::usage(anyhow!("clean unmount failed: {e}")))?;
    if needs_check && !opts.ro {
        tracing::warn!(
            "{} unmounted from {}: clean, but it needs a check (a corrupt metadata block was \
             met): run cilfs check {}",
            a.image.display(),
            mount_point.display(),
            a.image.display()
        );
    } else {
        tracing::info!(
            "{} unmounted from {}: clean",
            a.image.display(),
            mount_point.display()
        );
    }
    Ok(())
}

/// What recovery found and did, for the log (and, when it replayed or skipped anything, for
/// the person mounting).
fn log_recovery(image: &Path, journal: &Journal) {
    let r = journal.recovery_report();
    let image = image.display();
    if r.checkpoints_skipped > 0 {
        tracing::warn!(
            "{image}: norecovery: the log was not replayed ({} checkpoints): files are as \
             written in place, possibly older than the log and inconsistent",
            r.checkpoints_skipped
        );
    } else if !r.was_clean {
        tracing::info!(
            "{image}: recovered the log: {} checkpoints replayed ({} block images written, {} \
             cancelled, {} older than the disk's; log tail {}, head {})",
            r.checkpoints_replayed,
            r.replay.items_replayed,
            r.replay.items_cancelled,
            r.replay.items_newer_on_disk,
            r.tail,
            r.head,
        );
        // What recovery discarded is said out loud, whatever the reason.
        if let Some(t) = &r.torn {
            tracing::warn!("{image}: {t}");
        }
    } else {
        tracing::info!(target: QUIET, "{image}: the log was clean: nothing to replay");
    }
    if journal.superblock().needs_check {
        tracing::warn!(
            "{image}: an earlier mount met a corrupt metadata block: the filesystem needs a \
             check (unmount it, then cilfs check {image})"
        );
    }
}

/// Logs every corruption (with its block) and every IO error a request met, and marks the
/// superblock as needing a check at the first corruption (a read-only mount keeps the mark
/// in memory only: it writes nothing). Each corrupt block is logged once per mount.
fn observe_errors(image: &Path, journal: &Arc<Journal>, read_only: bool) {
    use cilfs_core::fs::FsError;
    use cilfs_core::journal::JournalError;
    let image = image.display().to_string();
    let journal = Arc::downgrade(journal);
    let seen = parking_lot::Mutex::new(std::collections::HashSet::new());
    cilfs_fuse::observe_errors(Box::new(move |e| {
        let blkno = match e {
            FsError::Corrupt { blkno, .. }
            | FsError::Journal(JournalError::BlockOutOfRange { blkno, .. }) => *blkno,
            FsError::Device(_) | FsError::Journal(JournalError::Device(_)) => {
                tracing::error!("{image}: I/O error: {e}");
                return;
            }
            _ => return,
        };
        if !seen.lock().insert(blkno) {
            return;
        }
        tracing::error!(block = blkno, "{image}: corruption: {e}");
        let Some(j) = journal.upgrade() else { return };
        match j.mark_needs_check() {
            Ok(true) if read_only => tracing::warn!(
                "{image} needs a check (cilfs check {image}); a read-only mount does not record it"
            ),
            Ok(true) => tracing::warn!(
                "{image} is marked as needing a check: run cilfs check {image} once unmounted"
            ),
            Ok(false) => {}
            Err(e) => {
                tracing::error!("{image}: cannot mark the superblock as needing a check: {e}")
            }
        }
    }));
}

/// For a mount by a user (not root), why it cannot be made if /dev/fuse will not open for
/// reading and writing, and what to do about it; None for root or an open that succeeds.
fn user_cannot_open_dev_fuse(dir: &Path) -> Option<anyhow::Error> {
    if rustix::process::geteuid().is_root() {
        return None;
    }
    let o = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .err()?;
    Some(anyhow!(
        "mounting on {}: cannot open /dev/fuse ({o}): a mount by a user needs /dev/fuse \
         readable and writable by that user (mode 0666, as the fuse3 package's udev rule \
         sets it); ask an administrator to chmod 0666 /dev/fuse, or mount as root",
        dir.display()
    ))
}
