//! Helpers shared by the integration tests: running the cilfs binary, a fresh image mounted on
//! a temporary directory, and what the mount tests ask of the system (mounts, daemons, users).
//! Each test file uses a part of them.
#![allow(dead_code, clippy::unwrap_used)]

use cilfs_core::journal::{Journal, JournalConfig};
use cilfs_core::trans::Reservation;
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use rustix::io::Errno;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

/// The cilfs binary under test.
pub const CILFS: &str = env!("CARGO_BIN_EXE_cilfs");

/// The kernel's switch for FUSE over io_uring, which a mount by root turns on.
pub const URING_SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// The switch as this test process found it, put back when the process exits.
static URING_AT_START: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

extern "C" fn put_back_uring_switch() {
    if let Some(Some(v)) = URING_AT_START.get() {
        let _ = fs::write(URING_SWITCH, v.trim());
    }
}

/// Tests leave the machine as they found it: a mount by root turns FUSE over io_uring on for
/// the whole machine (mount.rs's `enable_fuse_uring`), and some tests turn it on themselves;
/// the switch as it was before the first mount is written back when the test process exits.
/// Called before anything that may mount.
#[allow(unsafe_code)]
pub fn keep_machine_state() {
    URING_AT_START.get_or_init(|| {
        let v = fs::read_to_string(URING_SWITCH).ok();
        if v.is_some() {
            extern "C" {
                fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
            }
            // SAFETY: atexit(3) takes a function of no arguments that lives as long as the
            // process; it runs at the exit the test harness makes after the last test.
            unsafe {
                atexit(put_back_uring_switch);
            }
        }
        v
    });
}

/// Runs the cilfs command as given.
pub fn cilfs(args: &[&str]) -> Output {
    output(Command::new(CILFS).args(args))
}

/// Runs `cmd` for its output. An unmount (`cilfs unmount`, umount(8)) refused because the
/// mount is busy is tried again, for up to 5 s: the tests share one process, and a child that
/// another test is starting holds copies of this process's open files, this test's too, until
/// it execs, which under load can come after this test closed its last file there. Seen in CI
/// and measured: 2 of 200 umount(2) calls right after a close were refused while two threads
/// started processes, none without them.
pub fn output(cmd: &mut Command) -> Output {
    keep_machine_state();
    let unmount =
        cmd.get_program() == "umount" || cmd.get_args().next().is_some_and(|a| a == "unmount");
    for _ in 0..250 {
        let out = cmd.output().unwrap();
        let busy = !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("busy");
        if !(unmount && busy) {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cmd.output().unwrap()
}

/// The mount options CILFS_TEST_TRANSPORT stands for: `native` (requests through /dev/fuse
/// reads, `uring=off` so that the path is the same whatever the kernel's switch says) or
/// `uring` (through io_uring queues, `uring=on`: the mount fails rather than fall back).
pub fn transport_opts(t: &str) -> String {
    match t {
        "native" => "uring=off".into(),
        "uring" => "uring=on".into(),
        t => panic!("CILFS_TEST_TRANSPORT={t}: use native or uring"),
    }
}

/// The transport the suite runs over (CILFS_TEST_TRANSPORT): `default` when unset, with
/// `uring=auto` (io_uring queues or /dev/fuse reads, as the kernel's switch says).
pub fn test_transport() -> String {
    std::env::var("CILFS_TEST_TRANSPORT").unwrap_or_else(|_| "default".into())
}

/// The cilfs command; with CILFS_TEST_TRANSPORT=native or uring in the environment every
/// mount gets its `-o` options ([`transport_opts`]), so that a whole suite runs over /dev/fuse
/// reads and over io_uring queues.
pub fn transported(args: &[&str]) -> Command {
    let mut cmd = Command::new(CILFS);
    cmd.args(args);
    if let (Some(&"mount"), Ok(t)) = (args.first(), std::env::var("CILFS_TEST_TRANSPORT")) {
        cmd.arg("-o").arg(transport_opts(&t));
    }
    cmd
}

/// Runs `transported(args)`.
pub fn cilfs_transported(args: &[&str]) -> Output {
    output(&mut transported(args))
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs a program (`args[0]`), asserts it succeeded and returns its stdout.
pub fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn errno(e: std::io::Error) -> Errno {
    Errno::from_io_error(&e).unwrap()
}

pub fn sha1(p: &Path) -> String {
    run(&["sha1sum", p.to_str().unwrap()])
}

/// Makes a filesystem of `size` on `img` (quietly), asserting it worked.
pub fn mkfs(img: &Path, size: &str) {
    let out = cilfs(&["mkfs", "-q", "--size", size, s(img)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `args` as user `uid` and group `gid`, with no supplementary groups.
pub fn as_user(uid: u32, gid: u32, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
            "--",
        ])
        .args(args)
        .output()
        .unwrap()
}

/// A directory user nobody (65534) owns, mode 0755, with the paths of an image and a mount
/// point (made, and nobody's too) in it, for a user's own mount; and the shell words that run
/// a command as nobody with a clean environment.
pub fn nobodys_base(base: &Path) -> (PathBuf, PathBuf, String) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(base, fs::Permissions::from_mode(0o755)).unwrap();
    let (img, dir) = (base.join("fs.img"), base.join("mnt"));
    fs::create_dir(&dir).unwrap();
    let nobody = 65534;
    for p in [base, &dir] {
        rustix::fs::chown(p, Some(rustix::fs::Uid::from_raw(nobody)), None).unwrap();
    }
    let as_nobody = format!(
        "setpriv --reuid={nobody} --regid={nobody} --clear-groups env -i PATH=/usr/bin:/bin:/usr/sbin:/sbin"
    );
    (img, dir, as_nobody)
}

/// How many mounts /proc/self/mountinfo lists on `dir`.
pub fn mounts_on(dir: &Path) -> usize {
    let dir = format!(" {} ", dir.display());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&dir))
        .count()
}

/// Takes down whatever is still mounted on a directory when a test ends, passed or failed.
pub struct UnmountAll(pub PathBuf);

impl Drop for UnmountAll {
    fn drop(&mut self) {
        for _ in 0..4 {
            if mounts_on(&self.0) == 0 {
                return;
            }
            let _ = cilfs(&["unmount", self.0.to_str().unwrap()]);
        }
        while mounts_on(&self.0) > 0 {
            if rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH).is_err() {
                return;
            }
        }
    }
}

/// The process id of a process whose command line holds `pattern` (pgrep -f), if one runs.
pub fn daemon_pid(pattern: &str) -> Option<String> {
    let out = Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .unwrap();
    let pids = String::from_utf8(out.stdout).unwrap();
    pids.lines().next().map(str::to_string)
}

/// Kills the daemon whose command line holds `pattern` with SIGKILL (no unmount record,
/// nothing written back) and takes its dead mount on `dir` away.
pub fn kill_daemon_matching(pattern: &str, dir: &Path) {
    let pid = daemon_pid(pattern).expect("daemon pid");
    assert!(Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap()
        .success());
    let gone = (0..500).any(|_| {
        !Path::new(&format!("/proc/{pid}")).exists() || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        }
    });
    assert!(gone, "the daemon died");
    let _ = rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH);
}

/// Waits for a child with a generous safety deadline, killing it if it hangs.
pub fn wait_for_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    for _ in 0..12_000 {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    panic!("the daemon did not exit within 120 s");
}

/// Adds one to the inode count in the filesystem header (the first block of the metadata area),
/// through the journal so that the block's stamp and CRC stay valid: only the checker's cross
/// check of the count against the tree can find it.
pub fn miscount_inodes(img: &Path) {
    log_inode_count_change(img, 1).unmount().unwrap();
}

/// Adds `n` to the header's inode count in a checkpoint forced to the log, and returns the
/// journal: unmounted, the change is written in place; dropped, the image is left as a crash
/// would (the inline journal writes nothing back before it needs log space).
pub fn log_inode_count_change(img: &Path, n: u64) -> Arc<Journal> {
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(img, FileDeviceOptions::default()).unwrap());
    let j = Journal::open(dev, None, JournalConfig::default()).unwrap();
    let header = j.metadata_area().0;
    let seq = {
        let mut tx = j
            .begin(Reservation::for_buffers(1, j.block_size()))
            .unwrap();
        let b = tx.buf(header).unwrap();
        let count = u64::from_le_bytes(tx.data(b)[104..112].try_into().unwrap());
        tx.write(b, 104, &(count + n).to_le_bytes());
        // The header keeps its LSN stamp at byte 8 (docs/on-disk-format.md).
        tx.set_lsn_offset(b, 8);
        tx.commit().unwrap()
    };
    j.force(seq).unwrap();
    j
}

/// A fresh image mounted on a directory of a temporary directory; mounts go through
/// `transported`, and whatever is still mounted on the directory is taken down when dropped.
pub struct Mounted {
    pub _tmp: tempfile::TempDir,
    pub img: PathBuf,
    pub dir: PathBuf,
}

impl Mounted {
    pub fn new(size: &str, opts: &[&str]) -> Self {
        assert!(
            Path::new("/dev/fuse").exists(),
            "mount tests need /dev/fuse (run scripts/install-deps)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("fs.img");
        let dir = tmp.path().join("mnt");
        fs::create_dir(&dir).unwrap();
        mkfs(&img, size);
        let m = Mounted {
            _tmp: tmp,
            img,
            dir,
        };
        m.mount(opts);
        m
    }

    pub fn mount(&self, opts: &[&str]) {
        let mut args = vec![
            "mount",
            self.img.to_str().unwrap(),
            self.dir.to_str().unwrap(),
        ];
        for o in opts {
            args.push("-o");
            args.push(o);
        }
        let out = cilfs_transported(&args);
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Unmounts and checks the image.
    pub fn unmount(&self) {
        self.unmount_without_check();
        let out = cilfs(&["check", self.img.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "check: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    /// Unmounts, leaving the image unchecked (a read-only mount of a dirty log leaves it so).
    pub fn unmount_without_check(&self) {
        let out = cilfs(&["unmount", self.dir.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "unmount: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Kills the background daemon serving this mount with SIGKILL (no unmount record) and
    /// takes its dead mount away: the image is left with a log that needs replay.
    pub fn kill_daemon(&self) {
        kill_daemon_matching(&format!("mount {} ", self.img.display()), &self.dir);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        drop(UnmountAll(self.dir.clone()));
    }
}

/// 2001-01-01 00:00:00 UTC, the atime the atime tests start from.
pub const Y2001: i64 = 978_307_200;

/// Sets `p`'s atime to `Y2001` with touch(1), through the mount.
pub fn set_atime_2001(p: &Path) {
    let out = Command::new("touch")
        .args(["-a", "-d", "2001-01-01 00:00:00 UTC"])
        .arg(p)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `script` with sh in a private mount namespace where `node`, a /dev/fuse of mode 0666
/// made for the purpose, stands over /dev/fuse, so an unprivileged user can mount there (this
/// machine's own /dev/fuse is 0600). Returns whether it succeeded, its stdout and its stderr.
pub fn in_open_fuse_namespace(node: &Path, script: &str) -> (bool, String, String) {
    let script = format!(
        "set -e\n\
         mknod {node} c 10 229 && chmod 666 {node} && mount --bind {node} /dev/fuse\n{script}",
        node = node.display()
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
