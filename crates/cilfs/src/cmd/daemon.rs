//! What the mount daemon owes its surroundings: SIGTERM, SIGINT and SIGHUP (what `systemctl
//! stop`, a shutdown and ^C send) unmount cleanly, as libfuse daemons do, and readiness is told
//! to a service manager (systemd's `Type=notify`).

use nix::sys::signal::{SigSet, Signal};
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const STOP_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

#[derive(Debug)]
pub enum StopError {
    Block(nix::Error),
    Thread(std::io::Error),
}

impl std::error::Error for StopError {}

impl std::fmt::Display for StopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopError::Block(e) => write!(f, "cannot block the stop signals: {e}"),
            StopError::Thread(e) => write!(f, "cannot start the signal thread: {e}"),
        }
    }
}

#[derive(Debug, Default)]
struct StopState {
    /// The first stop signal taken.
    signal: Option<Signal>,
    /// The mount point, once the mount exists.
    mounted: Option<PathBuf>,
}

/// Takes the stop signals on a thread of its own and turns them into an unmount of the mount
/// point, the same as `cilfs unmount` or `umount`: the kernel ends the FUSE session, whose end
/// runs the clean shutdown (write back, log forced, unmount record). A signal that comes before
/// the mount exists is kept until then.
#[derive(Debug, Clone)]
pub struct Stopper(Arc<Mutex<StopState>>);

impl Stopper {
    /// Blocks the stop signals in this thread, and so in every thread started after, and starts
    /// the thread that waits for them. Must run before any other thread exists: one that does
    /// not block them would take them with their default action, death.
    pub fn install() -> Result<Self, StopError> {
        let mut set = SigSet::empty();
        for s in STOP_SIGNALS {
            set.add(s);
        }
        set.thread_block().map_err(StopError::Block)?;
        let state = Arc::new(Mutex::new(StopState::default()));
        let st = Arc::clone(&state);
        std::thread::Builder::new()
            .name("cilfs-signals".into())
            .spawn(move || loop {
                let Ok(sig) = set.wait() else { continue };
                let mut s = st.lock();
                if s.signal.is_some() {
                    tracing::info!("{}: already unmounting", sig.as_str());
                    continue;
                }
                s.signal = Some(sig);
                let _ = sd_notify("STOPPING=1");
                match &s.mounted {
                    Some(dir) => {
                        tracing::info!("{}: unmounting {}", sig.as_str(), dir.display());
                        unmount(dir);
                    }
                    None => tracing::info!("{}: stopping before the mount is made", sig.as_str()),
                }
            })
            .map_err(StopError::Thread)?;
        Ok(Stopper(state))
    }

    /// The stop signal taken, if any.
    pub fn signal(&self) -> Option<Signal> {
        self.0.lock().signal
    }

    /// The mount on `dir` exists and serves: a stop signal now unmounts it, at once if one
    /// came already.
    pub fn mounted(&self, dir: &Path) {
        let mut s = self.0.lock();
        s.mounted = Some(dir.to_path_buf());
        if let Some(sig) = s.signal {
            tracing::info!("{}: unmounting {}", sig.as_str(), dir.display());
            unmount(dir);
        }
    }
}

/// Unmounts as `cilfs unmount` does. A busy mount point is detached instead (as libfuse's
/// unmount does): it leaves the namespace at once and the session ends when its last open file
/// is closed. Without the right to unmount (a user's mount made by fusermount3), fusermount3
/// does it.
fn unmount(dir: &Path) {
    use rustix::io::Errno;
    use rustix::mount::{unmount, UnmountFlags};
    let r = match unmount(dir, UnmountFlags::empty()) {
        Err(Errno::BUSY) => {
            tracing::info!(
                "{} is busy: detached; the daemon finishes when its last open file is closed",
                dir.display()
            );
            unmount(dir, UnmountFlags::DETACH)
        }
        Err(Errno::PERM) => {
            let ok = std::process::Command::new("fusermount3")
                .args(["-u", "-z", "--"])
                .arg(dir)
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                Ok(())
            } else {
                Err(Errno::PERM)
            }
        }
        r => r,
    };
    if let Err(e) = r {
        tracing::error!("cannot unmount {}: {e}", dir.display());
    }
}

/// Tells the service manager `state` ("READY=1", "STOPPING=1", "STATUS=...") through the
/// datagram socket NOTIFY_SOCKET names (a path, or an abstract name after '@'); without one,
/// nothing. Returns whether it was sent. Written here rather than taken from a crate: the
/// protocol is one datagram, and std has abstract socket addresses.
pub fn sd_notify(state: &str) -> std::io::Result<bool> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let sock = UnixDatagram::unbound()?;
    let addr = match target.as_bytes().strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(&target)?,
    };
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}
