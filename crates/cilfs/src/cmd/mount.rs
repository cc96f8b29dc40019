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
    /// flush=reduced|legacy|ail, iversion=lazy|eager, tsgran=1ms, data=ordered|writeback,
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
/// Set for the daemon of a mount(8) helper run without -v: notes that are not news go to the
/// log only.
const QUIET_ENV: &str = "CILFS_MOUNT_QUIET";

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
    let mut dir_meta = std::fs::metadata(&a.dir);
    if dir_meta
        .as_ref()
        .is_err_and(|e| e.raw_os_error() == Some(rustix::io::Errno::NOTCONN.raw_os_error()))
    {
        clean_dead_mount(&a.dir)?;
        dir_meta = std::fs::metadata(&a.dir);
    }
    match dir_meta {
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
    // Mounted already: the same filesystem at a second place, as a kernel filesystem's second
    // mount of its device shares the first's superblock.
    if matches!(lock_image(&a.image, false), Ok(None)) {
        if let Some(at) = super::mountinfo::cilfs_mount_of(&a.image) {
            return bind_second_mount(&a, &opts, &at);
        }
    }
    if a.foreground {
        serve(&a, &opts)
    } else {
        spawn_background(&a)
    }
}

/// Mounts the filesystem already mounted at `at` on `a.dir` too, as a bind mount of it: one
/// daemon serves both, changes through either show in the other at once, and the image is
/// let go when the last of them is unmounted. Its own `ro` is kept; every other option is the
/// first mount's.
fn bind_second_mount(a: &Args, opts: &MountOpts, at: &Path) -> Result<(), Failure> {
    use rustix::mount::{mount_bind, mount_remount, MountFlags};
    mount_bind(at, &a.dir).map_err(|e| {
        Failure::usage(anyhow!(
            "{} is mounted at {}; mounting it on {} too (a bind mount): {e}",
            a.image.display(),
            at.display(),
            a.dir.display()
        ))
    })?;
    if opts.ro {
        if let Err(e) = mount_remount(&a.dir, MountFlags::BIND | MountFlags::RDONLY, "") {
            let _ = rustix::mount::unmount(&a.dir, rustix::mount::UnmountFlags::empty());
            return Err(Failure::usage(anyhow!(
                "{}: making the second mount read-only: {e}",
                a.dir.display()
            )));
        }
    }
    if std::env::var_os(QUIET_ENV).is_none() {
        println!(
            "{} is mounted at {} already: mounted on {} too, served by the same daemon (options \
             other than ro are the first mount's)",
            a.image.display(),
            at.display(),
            a.dir.display()
        );
    }
    Ok(())
}

/// Refuses a directory that is already a mount point (of anything): a mount stacked on another
/// hides it, and one `cilfs unmount` would take both down.
fn refuse_mount_point(dir: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::MetadataExt;
    let what = match super::mountinfo::mounts_on(dir).last() {
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

/// A mount point whose FUSE daemon is gone (killed, crashed) answers everything with ENOTCONN
/// until it is unmounted. A cilfs mount whose image nobody holds (its daemon's lock went
/// with it) is taken away here, by root; anything else is explained.
fn clean_dead_mount(dir: &Path) -> Result<(), Failure> {
    let how = format!(
        "{d} is the mount point of a FUSE filesystem whose daemon is gone (Transport endpoint \
         is not connected): take the dead mount away with umount {d} (or cilfs unmount {d}) and \
         mount again",
        d = dir.display()
    );
    let Some(image) = super::mountinfo::mounted_image(dir) else {
        return Err(Failure::usage(anyhow!(how)));
    };
    let image = cilfs_device::loopdev::backing_file(&image).unwrap_or(image);
    let free = matches!(lock_image(&image, false), Ok(Some(_)));
    if !free || !rustix::process::geteuid().is_root() {
        return Err(Failure::usage(anyhow!(
            "{how} (its image {} {})",
            image.display(),
            if free {
                "is not in use"
            } else {
                "is still in use"
            }
        )));
    }
    rustix::mount::unmount(dir, rustix::mount::UnmountFlags::empty())
        .or_else(|_| rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH))
        .map_err(|e| Failure::usage(anyhow!("{how}: unmounting it failed: {e}")))?;
    eprintln!(
        "cilfs: {}: took away the dead mount of {} left by a daemon that is gone",
        dir.display(),
        image.display()
    );
    Ok(())
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
    if crate::out::closed() {
        // A mount(8) helper, silent when all goes well: the daemon keeps its notes to its log.
        cmd.env(QUIET_ENV, "1");
    }
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

/// How long a mount waits for an image that no mount shows but something still holds.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The lock of an image (or log device), waiting up to [`RELEASE_WAIT`] while no mount of it
/// is left: a plain FUSE mount's umount(2) returns before its daemon has written the image
/// back and let go of it (only a `fuseblk` unmount waits for the daemon's DESTROY), so a mount
/// right after one would otherwise find it in use. `None` if it is still held then, or held
/// by a live mount.
fn lock_once_released(image: &Path) -> std::io::Result<Option<ImageLock>> {
    let deadline = std::time::Instant::now() + RELEASE_WAIT;
    let mut said = false;
    loop {
        if let Some(l) = lock_image(image, false)? {
            return Ok(Some(l));
        }
        if super::mountinfo::cilfs_mount_of(image).is_some()
            || std::time::Instant::now() >= deadline
        {
            return Ok(None);
        }
        if !said {
            tracing::info!(
                target: QUIET,
                "{} is held but mounted nowhere: waiting up to {} s for the last mount's daemon \
                 to let go of it",
                image.display(),
                RELEASE_WAIT.as_secs()
            );
            said = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
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
    let _lock = lock_once_released(&a.image)
        .map_err(Failure::usage)?
        .ok_or_else(|| {
            Failure::usage(anyhow!("{} is in use by another mount", a.image.display()))
        })?;
    // The log device is written as much as the image: one mount (or mkfs, or check) at a time.
    let _log_lock = match &opts.logdev {
        Some(p) => Some(
            lock_once_released(p)
                .map_err(Failure::usage)?
                .ok_or_else(|| {
                    Failure::usage(anyhow!("{} is in use by another mount", p.display()))
                })?,
        ),
        None => None,
    };
    // Released when DESTROY has been answered after a clean unmount (see `on_destroy`), so
    // that a tool or mount run as soon as umount(2) returns finds the image free.
    let held_locks: HeldLocks = Arc::new(parking_lot::Mutex::new(Some((_lock, _log_lock))));
    // An image file goes through a loop device (see `wants_loop`); this process holds it
    // until it exits, the kernel's mount until it is gone, and autoclear detaches it then.
    let attached = if wants_loop(&a.image, opts) {
        match cilfs_device::loopdev::attach(&a.image, opts.ro) {
            Ok(l) => Some(l),
            Err(e) if opts.loop_dev == Some(true) => return Err(Failure::usage(e)),
            Err(e) => {
                tracing::warn!("{e}: mounting {} without a loop device", a.image.display());
                None
            }
        }
    } else {
        None
    };
    // What the daemon opens and mounts: the loop device, or the image itself.
    let device: &Path = attached.as_ref().map_or(&a.image, |l| &l.path);
    // `ro` opens read-only (an image without write permission, on read-only media) and keeps
    // whatever the journal writes (superblock, unmount record) in memory.
    let dev_opts = FileDeviceOptions {
        read_only: opts.ro,
        ..FileDeviceOptions::default()
    };
    let open = || -> Result<Opened, Failure> {
        let data: Arc<dyn Device> =
            Arc::new(FileDevice::open(device, dev_opts).map_err(Failure::usage)?);
        let logdev: Option<Arc<dyn Device>> = match &opts.logdev {
            Some(p) => Some(Arc::new(
                FileDevice::open(p, dev_opts).map_err(Failure::usage)?,
            )),
            None => None,
        };
        let geo = Geometry::read(&*data, logdev.as_deref())
            .map_err(|e| Failure::usage(anyhow!("{}: {e}", a.image.display())))?;
        Ok((data, logdev, geo))
    };
    let (mut data, mut logdev, mut geo) = open()?;
    if opts.ro && !geo.sb.clean && !opts.norecovery {
        // As XFS does, a read-only mount of a filesystem whose log needs replaying replays
        // it first, where the devices can be written (xfstests mounts read-only after its
        // shutdowns); on read-only media it cannot, and says how to go on.
        // Through the image itself: a read-only mount's loop device is read-only too.
        drop((data, logdev));
        recover_for_read_only(&a.image, opts.logdev.as_deref())?;
        (data, logdev, geo) = open()?;
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
        capable: Some(Arc::new(cilfs_fuse::capable)),
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
    if opts.uring != cilfs_fuse::native::UringMode::Off {
        enable_fuse_uring();
    }
    let destroyed: Arc<std::sync::OnceLock<Result<(), String>>> = Arc::default();
    // A user's mount goes through fusermount3, which says why it failed in words of its own:
    // the usual obstacle, a /dev/fuse the user may not open, is explained here first.
    if let Some(e) = user_cannot_open_dev_fuse(&a.dir) {
        return Err(Failure::usage(e));
    }
    let mut session = super::transport::mount_native(device, &a.dir, opts, &fs, &invalidator)?;
    session.on_destroy(on_destroy(&fs, &held_locks, &destroyed));
    // A block device (a loop device included) mounts as fuseblk by root; fusermount3 makes
    // plain fuse mounts only.
    let fuseblk = rustix::process::geteuid().is_root()
        && std::fs::metadata(device).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_block_device()
        });
    if !fuseblk {
        // Linux sends SYNCFS to fuseblk mounts only: here sync(2) and syncfs(2) return
        // without cilfs hearing of them. Said once, to whoever mounted and in the log.
        let why = if opts.loop_dev == Some(false) {
            "noloop"
        } else if !rustix::process::geteuid().is_root() {
            "a user's mount, made through fusermount3, cannot be one"
        } else {
            "no loop device could be used"
        };
        let note = format!(
            "sync(2) and syncfs(2) do not reach cilfs on this mount (fuse.cilfs, not fuseblk: \
             {why}): files are made durable by fsync(2), by the unmount, and otherwise by the \
             daemon's own write back within about a minute"
        );
        // A mount(8) helper is silent when all goes well (scripts compare what mount
        // prints): the note then goes to the log alone.
        if crate::out::closed() || std::env::var_os(QUIET_ENV).is_some() {
            tracing::warn!(target: QUIET, "{note}");
        } else {
            tracing::warn!("{note}");
        }
    }
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
        "serving {}{} on {} (unmount with: cilfs unmount {})",
        a.image.display(),
        attached
            .as_ref()
            .map(|l| format!(" through {}", l.path.display()))
            .unwrap_or_default(),
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
    // Unmounted (or the connection was aborted): make everything stable and leave a clean log,
    // unless DESTROY did already.
    let unmounted = match destroyed.get() {
        Some(r) => r.clone(),
        None => unmount_unless_shut_down(&fs),
    };
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

/// The kernel's switch for FUSE over io_uring (Linux 6.14+ built with CONFIG_FUSE_IO_URING).
const URING_SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns FUSE over io_uring on in the kernel when it is off and this is root: it is off by
/// default, and the native transport serves faster through it (docs/bench-results.md). The
/// switch is the kernel's, for every FUSE mount made after it until the module is reloaded
/// or the machine restarts; said in the log. Where it stays off (not root, no such kernel),
/// the session says once why it serves over /dev/fuse instead.
fn enable_fuse_uring() {
    if !rustix::process::geteuid().is_root() {
        return;
    }
    match std::fs::read_to_string(URING_SWITCH) {
        Ok(v) if v.trim() == "N" => match std::fs::write(URING_SWITCH, "Y") {
            Ok(()) => tracing::info!(
                "turned FUSE over io_uring on in the kernel ({URING_SWITCH}: Y, for every FUSE \
                 mount made from now on; uring=off leaves it alone)"
            ),
            Err(e) => tracing::warn!("cannot turn FUSE over io_uring on ({URING_SWITCH}): {e}"),
        },
        _ => {}
    }
}

/// Whether the image is mounted through a loop device: `loop` says yes, `noloop` no, and by
/// default a mount by root of an image file does (as mount(8) does for a regular file),
/// since only then is the mount `fuseblk.cilfs`, the kind Linux passes sync(2) and syncfs(2)
/// on to and whose umount(2) waits for the daemon. A user's mount goes through fusermount3,
/// which makes plain `fuse` mounts only.
fn wants_loop(image: &Path, opts: &MountOpts) -> bool {
    let file = std::fs::metadata(image).is_ok_and(|m| m.is_file());
    file && opts
        .loop_dev
        .unwrap_or_else(|| rustix::process::geteuid().is_root())
}

/// The clean unmount, unless the filesystem was shut down by the shutdown ioctl: then
/// nothing more is written, and the next mount recovers from the log.
fn unmount_unless_shut_down(fs: &Fs) -> Result<(), String> {
    if fs.is_shut_down_on_request() {
        tracing::warn!(
            "unmounted after a shutdown: nothing written; the next mount recovers the log"
        );
        return Ok(());
    }
    fs.unmount().map_err(|e| e.to_string())
}

/// The image's lock and the log device's, until DESTROY lets go of them.
type HeldLocks = Arc<parking_lot::Mutex<Option<(ImageLock, Option<ImageLock>)>>>;

/// What DESTROY does before umount(2) returns: the clean unmount (its result kept for the end
/// of `serve_logged`), then, if it succeeded, the image's locks let go of.
fn on_destroy(
    fs: &Arc<Fs>,
    locks: &HeldLocks,
    result: &Arc<std::sync::OnceLock<Result<(), String>>>,
) -> cilfs_fuse::native::OnDestroy {
    let (fs, locks, result) = (Arc::clone(fs), Arc::clone(locks), Arc::clone(result));
    Box::new(move || {
        let r = unmount_unless_shut_down(&fs);
        if r.is_ok() {
            drop(locks.lock().take());
        }
        let _ = result.set(r);
    })
}

/// The data device, the log device if there is one, and the geometry read from them.
type Opened = (Arc<dyn Device>, Option<Arc<dyn Device>>, Geometry);

/// Replays the log of an image a read-only mount found unclean, through devices opened
/// read-write for that alone, and leaves it clean (the unmount record written): what XFS does
/// for a read-only mount of a device it may write. Fails, saying how to go on, where the
/// devices cannot be written.
fn recover_for_read_only(image: &Path, logdev: Option<&Path>) -> Result<(), Failure> {
    let rw = FileDeviceOptions::default();
    let cannot = |e: &dyn std::fmt::Display| {
        Failure::usage(anyhow!(
            "{}: the log needs recovery, which writes to the image, and it cannot be written \
             ({e}): add norecovery to mount it read-only without replaying the log",
            image.display()
        ))
    };
    let data: Arc<dyn Device> = Arc::new(FileDevice::open(image, rw).map_err(|e| cannot(&e))?);
    let logdev: Option<Arc<dyn Device>> = match logdev {
        Some(p) => Some(Arc::new(FileDevice::open(p, rw).map_err(|e| cannot(&e))?)),
        None => None,
    };
    let journal = Journal::open(data, logdev, JournalConfig::default())
        .map_err(|e| Failure::usage(anyhow!("{}: {e}", image.display())))?;
    log_recovery(image, &journal);
    journal
        .unmount()
        .map_err(|e| Failure::usage(anyhow!("{}: after replaying the log: {e}", image.display())))
}

/// What recovery found and did, for the log (and, when it replayed or skipped anything, for
/// the person mounting, unless that is mount(8), which prints nothing on success).
fn log_recovery(image: &Path, journal: &Journal) {
    let r = journal.recovery_report();
    let image = image.display();
    let g = journal.geometry();
    if let Some(b) = g.from_backup {
        tracing::warn!(
            "{image}: superblock: primary damaged ({}), using the backup at block {b}: a \
             read-write mount rewrites the primary from it (a read-only one cannot: cilfs \
             repair does)",
            g.primary_damage.as_deref().unwrap_or("unreadable")
        );
    }
    if r.checkpoints_skipped > 0 {
        tracing::warn!(
            "{image}: norecovery: the log was not replayed ({} checkpoints): files are as \
             written in place, possibly older than the log and inconsistent",
            r.checkpoints_skipped
        );
    } else if !r.was_clean {
        let note = format!(
            "{image}: recovered the log: {} checkpoints replayed ({} block images written, {} \
             cancelled, {} older than the disk's; log tail {}, head {})",
            r.checkpoints_replayed,
            r.replay.items_replayed,
            r.replay.items_cancelled,
            r.replay.items_newer_on_disk,
            r.tail,
            r.head,
        );
        // A mount(8) helper is silent when all goes well, and a replayed log is all going
        // well (XFS says it in the kernel log, not in mount's output; xfstests compares the
        // output of every mount after a shutdown): then the log alone has it.
        if crate::out::closed() || std::env::var_os(QUIET_ENV).is_some() {
            tracing::info!(target: QUIET, "{note}");
        } else {
            tracing::info!("{note}");
        }
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
