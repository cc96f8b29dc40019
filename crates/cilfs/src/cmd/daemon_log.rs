//! Where the mount daemon's messages go: its `tracing` events (and the libraries') to the
//! systemd journal when its stderr is the journal's stream (a unit), else to syslog when
//! /dev/log exists, else to a log file of its own, with a timestamp on every line.
//! `CILFS_LOG=journal|syslog|file` picks one. The log file is kept in a directory that
//! only its owner can write (/run/cilfs for root, $XDG_RUNTIME_DIR/cilfs or /tmp/cilfs-UID for
//! a user) and opened with O_NOFOLLOW and O_APPEND: never a symbolic link followed, never a
//! truncation, so another user can neither point it at a file nor erase what it said.
//!
//! Messages are also echoed to whoever started the daemon: the terminal of `--foreground`, or
//! the `cilfs mount` waiting for the background daemon to be ready (as `say` lines on the pipe
//! it reads), until it is.

use rustix::fs::{Mode, OFlags};
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// Events with this target go to the log only, never echoed: what the person mounting does
/// not need to read every time (the log was clean, the options in force).
pub const QUIET: &str = "cilfs::quiet";

/// The environment variable that picks the destination.
pub const CHOICE_ENV: &str = "CILFS_LOG";

#[derive(Debug)]
pub enum LogError {
    Choice(String),
    Dir {
        path: PathBuf,
        source: rustix::io::Errno,
    },
    NotPrivate {
        path: PathBuf,
        uid: u32,
    },
    Symlink(PathBuf),
    NotRegular(PathBuf),
    File {
        path: PathBuf,
        source: rustix::io::Errno,
    },
    Init(String),
}

impl std::error::Error for LogError {}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::Choice(v) => write!(
                f,
                "{CHOICE_ENV}={v}: use journal, syslog or file (or leave it unset)"
            ),
            LogError::Dir { path, source } => {
                write!(f, "log directory {}: {source}", path.display())
            }
            LogError::NotPrivate { path, uid } => write!(
                f,
                "log directory {} belongs to uid {uid}, not to this user: remove it",
                path.display()
            ),
            LogError::Symlink(p) => write!(
                f,
                "log file {} is a symbolic link, which is never followed: remove it",
                p.display()
            ),
            LogError::NotRegular(p) => {
                write!(
                    f,
                    "log file {} is not a regular file: remove it",
                    p.display()
                )
            }
            LogError::File { path, source } => {
                write!(f, "log file {}: {source}", path.display())
            }
            LogError::Init(e) => write!(f, "cannot set up logging: {e}"),
        }
    }
}

/// Where messages go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// stderr, which is the journal's stream: one line each, with a `<N>` priority prefix
    /// (journald stamps the time).
    Journal,
    /// syslog(3), facility daemon, ident "cilfs" with the pid.
    Syslog,
    /// The daemon's log file (a timestamp on each line).
    File(PathBuf),
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destination::Journal => write!(f, "the systemd journal (journalctl -t cilfs)"),
            Destination::Syslog => write!(f, "syslog (ident cilfs, facility daemon)"),
            Destination::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Whether stderr is the journal's stream: systemd sets JOURNAL_STREAM to its device and inode
/// (a child whose stderr was redirected inherits the variable but not the stream).
fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    rustix::fs::fstat(std::io::stderr()).is_ok_and(|st| st.st_dev == dev && st.st_ino == ino)
}

/// Where the daemon serving `mount_point` logs, without opening anything.
pub fn destination(mount_point: &Path) -> Result<Destination, LogError> {
    let choice = std::env::var(CHOICE_ENV).unwrap_or_default();
    match choice.as_str() {
        "journal" => Ok(Destination::Journal),
        "syslog" => Ok(Destination::Syslog),
        "file" => Ok(Destination::File(log_file(mount_point))),
        "" | "auto" if stderr_is_journal() => Ok(Destination::Journal),
        "" | "auto" if Path::new("/dev/log").exists() => Ok(Destination::Syslog),
        "" | "auto" => Ok(Destination::File(log_file(mount_point))),
        other => Err(LogError::Choice(other.to_string())),
    }
}

/// The directory of log files, private to the user: /run/cilfs for root, else
/// $XDG_RUNTIME_DIR/cilfs (that directory is the user's alone by the XDG rules), else
/// /tmp/cilfs-UID.
pub fn log_dir() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 && Path::new("/run").is_dir() {
        return PathBuf::from("/run/cilfs");
    }
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        let x = PathBuf::from(x);
        if std::fs::metadata(&x).is_ok_and(|m| m.is_dir() && m.uid() == uid) {
            return x.join("cilfs");
        }
    }
    PathBuf::from(format!("/tmp/cilfs-{uid}"))
}

/// The log file of the daemon serving `mount_point`: its absolute path escaped as
/// `systemd-escape --path` does (one name per mount point, and back again), then `.log`.
pub fn log_file(mount_point: &Path) -> PathBuf {
    let canon = std::fs::canonicalize(mount_point).unwrap_or_else(|_| mount_point.to_path_buf());
    log_dir().join(format!("{}.log", escape_path(&canon)))
}

/// `systemd-escape --path`: slashes trimmed and turned into '-', every byte but ASCII letters,
/// digits, ':', '_' and a '.' that does not lead as `\xNN`; the root is "-".
fn escape_path(p: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = p.as_os_str().as_bytes();
    let parts: Vec<&[u8]> = bytes
        .split(|&b| b == b'/')
        .filter(|s| !s.is_empty())
        .collect();
    if parts.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push('-');
        }
        for (j, &b) in part.iter().enumerate() {
            let plain = b.is_ascii_alphanumeric()
                || b == b':'
                || b == b'_'
                || (b == b'.' && (i, j) != (0, 0));
            if plain {
                out.push(b as char);
            } else {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out
}

/// Makes (0700) or opens the private log directory, refusing one that is a symbolic link or
/// that belongs to another user; one of ours that others may enter is closed to them.
fn open_private_dir(path: &Path) -> Result<rustix::fd::OwnedFd, LogError> {
    let dir_err = |source| LogError::Dir {
        path: path.to_path_buf(),
        source,
    };
    match rustix::fs::mkdir(path, Mode::RWXU) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(dir_err(e)),
    }
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(dir_err)?;
    let st = rustix::fs::fstat(&fd).map_err(dir_err)?;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(LogError::NotPrivate {
            path: path.to_path_buf(),
            uid: st.st_uid,
        });
    }
    if st.st_mode & 0o077 != 0 {
        rustix::fs::fchmod(&fd, Mode::RWXU).map_err(dir_err)?;
    }
    Ok(fd)
}

/// Opens (creating it 0600) the log file for appending: never through a symbolic link, never
/// truncated, never anything but a regular file (O_NONBLOCK: a FIFO planted there must not
/// hold the open).
pub fn open_log_file(path: &Path) -> Result<File, LogError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let dirfd = open_private_dir(dir)?;
    let name = path.file_name().unwrap_or(path.as_os_str());
    let fd = rustix::fs::openat(
        &dirfd,
        name,
        OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::APPEND
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::NOCTTY
            | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => LogError::Symlink(path.to_path_buf()),
        source => LogError::File {
            path: path.to_path_buf(),
            source,
        },
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|source| LogError::File {
        path: path.to_path_buf(),
        source,
    })?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(LogError::NotRegular(path.to_path_buf()));
    }
    Ok(File::from(fd))
}

/// Who sees the messages besides the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// Nobody (stderr is the log).
    None,
    /// The terminal (or whatever stderr is) of `--foreground`, as `cilfs: MESSAGE`.
    Stderr,
    /// The `cilfs mount` that started the daemon, as `say MESSAGE` lines on stdout.
    Notify,
}

/// The installed log: where it goes, and the echo, which the daemon stops once nobody listens.
#[derive(Debug, Clone)]
pub struct DaemonLog {
    pub destination: Destination,
    echo: Echo,
    echo_on: Arc<AtomicBool>,
}

impl DaemonLog {
    /// The person who started the daemon has gone (the background mount is ready) or has
    /// heard enough: later messages go to the log only.
    pub fn stop_echo(&self) {
        self.echo_on.store(false, Ordering::Release);
    }

    /// Messages reach the terminal through stderr.
    pub fn echoes_to_stderr(&self) -> bool {
        self.echo == Echo::Stderr && self.echo_on.load(Ordering::Acquire)
    }
}

enum Sink {
    Journal,
    Syslog,
    File(File),
}

struct DaemonLayer {
    sink: Sink,
    echo: Echo,
    echo_on: Arc<AtomicBool>,
    pid: u32,
}

/// An event as one line: its message, then any other fields as `name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            n => {
                let _ = write!(self.fields, " {n}={value:?}");
            }
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message.push_str(value),
            n => {
                let _ = write!(self.fields, " {n}={value}");
            }
        }
    }
}

fn severity(l: &Level) -> nix::syslog::Severity {
    use nix::syslog::Severity as S;
    match *l {
        Level::ERROR => S::LOG_ERR,
        Level::WARN => S::LOG_WARNING,
        Level::INFO => S::LOG_INFO,
        _ => S::LOG_DEBUG,
    }
}

impl<S: Subscriber> Layer<S> for DaemonLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut line = Line::default();
        event.record(&mut line);
        let meta = event.metadata();
        // One line per event, whatever a message held.
        let msg = format!("{}{}", line.message, line.fields).replace('\n', " ");
        // Errors from these writes have nowhere to go: a log that cannot be written is not a
        // reason to fail the request that logged.
        match &self.sink {
            Sink::File(f) => {
                let mut ts = String::new();
                let _ = SystemTime.format_time(&mut Writer::new(&mut ts));
                let text = format!("{ts} {:<5} cilfs[{}]: {msg}\n", meta.level(), self.pid);
                // One write with O_APPEND: lines of concurrent events never interleave.
                let _ = (&*f).write_all(text.as_bytes());
            }
            Sink::Journal => {
                let text = format!("<{}>{msg}\n", severity(meta.level()) as i32);
                let _ = std::io::stderr().lock().write_all(text.as_bytes());
            }
            Sink::Syslog => {
                let pri = nix::syslog::Priority::new(
                    severity(meta.level()),
                    nix::syslog::Facility::LOG_DAEMON,
                );
                let _ = nix::syslog::syslog(pri, msg.as_str());
            }
        }
        if meta.target() == QUIET || !self.echo_on.load(Ordering::Acquire) {
            return;
        }
        match self.echo {
            Echo::None => {}
            Echo::Stderr => {
                let _ = std::io::stderr()
                    .lock()
                    .write_all(format!("cilfs: {msg}\n").as_bytes());
            }
            Echo::Notify => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(format!("say {msg}\n").as_bytes());
                let _ = out.flush();
            }
        }
    }
}

/// Sets the process's tracing subscriber: INFO and above to the destination for
/// `mount_point`, echoed as `echo` says (not at all when stderr is the journal).
pub fn install(mount_point: &Path, echo: Echo) -> Result<DaemonLog, LogError> {
    let destination = destination(mount_point)?;
    let sink = match &destination {
        Destination::Journal => Sink::Journal,
        Destination::Syslog => {
            nix::syslog::openlog(
                Some(c"cilfs"),
                nix::syslog::LogFlags::LOG_PID,
                nix::syslog::Facility::LOG_DAEMON,
            )
            .map_err(|e| LogError::Init(format!("openlog: {e}")))?;
            Sink::Syslog
        }
        Destination::File(p) => Sink::File(open_log_file(p)?),
    };
    let echo = if destination == Destination::Journal && stderr_is_journal() && echo == Echo::Stderr
    {
        Echo::None
    } else {
        echo
    };
    let echo_on = Arc::new(AtomicBool::new(echo != Echo::None));
    let layer = DaemonLayer {
        sink,
        echo,
        echo_on: Arc::clone(&echo_on),
        pid: std::process::id(),
    };
    tracing_subscriber::registry()
        .with(layer.with_filter(LevelFilter::INFO))
        .try_init()
        .map_err(|e| LogError::Init(e.to_string()))?;
    // A panic is logged too: the background daemon's stderr goes nowhere.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!("panic: {info}");
        default_hook(info);
    }));
    Ok(DaemonLog {
        destination,
        echo,
        echo_on,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paths_escape_as_systemd_escape_does() {
        assert_eq!(escape_path(Path::new("/")), "-");
        assert_eq!(escape_path(Path::new("/srv/data")), "srv-data");
        assert_eq!(escape_path(Path::new("/srv/my data/")), "srv-my\\x20data");
        assert_eq!(escape_path(Path::new("/a-b/c_d.e")), "a\\x2db-c_d.e");
        assert_eq!(escape_path(Path::new("/.hidden/x")), "\\x2ehidden-x");
        // Distinct mount points, distinct files (the old scheme made both "_a_b").
        assert_ne!(
            escape_path(Path::new("/a/b")),
            escape_path(Path::new("/a_b"))
        );
    }

    #[test]
    fn the_log_file_is_appended_never_truncated_and_never_a_symlink_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("logs");
        let path = dir.join("x.log");
        open_log_file(&path).unwrap().write_all(b"one\n").unwrap();
        open_log_file(&path).unwrap().write_all(b"two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&path), 0o600);
        // A symbolic link where the log goes: refused, its target untouched.
        let target = tmp.path().join("target");
        std::fs::write(&target, b"precious").unwrap();
        let link = dir.join("y.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(open_log_file(&link), Err(LogError::Symlink(_))));
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        // A FIFO: refused without waiting for a reader.
        let fifo = dir.join("z.log");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::RUSR | Mode::WUSR,
            0,
        )
        .unwrap();
        assert!(matches!(
            open_log_file(&fifo),
            Err(LogError::File { .. } | LogError::NotRegular(_))
        ));
        // A log directory open to others is closed to them.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        open_log_file(&path).unwrap();
        assert_eq!(mode(&dir), 0o700);
    }
}
