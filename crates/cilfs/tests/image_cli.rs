//! What every command that opens an image (or a log device) does with a path that is not a
//! regular file or a block device: refuses it with one line naming it and exit status 2, without
//! waiting in open() first (a FIFO's blocking open waits forever for a writer). And a path that
//! cannot be opened at all: one line that gives the cause once.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

use rustix::fs::{FileType, Mode, CWD};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{cilfs, mkfs, s, CILFS};

/// Far longer than any refusal takes; only there so that a regression fails instead of hanging.
const SAFETY_DEADLINE: Duration = Duration::from_secs(60);

/// Runs cilfs with a deadline. Past it, the command is killed, and `fifo` is opened for reading
/// and writing (which never blocks on Linux) so that whatever still waits in open() on it, a
/// mount daemon in its own process group for one, gets its open and goes on; then the test fails.
fn cilfs_with_deadline(args: &[&str], fifo: &Path) -> Output {
    let mut child = Command::new(CILFS)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > SAFETY_DEADLINE {
            let _ = child.kill();
            let _release = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(fifo);
            let _ = child.wait();
            panic!(
                "cilfs {args:?} still running after {SAFETY_DEADLINE:?}: it blocked on the FIFO"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Asserts a refusal: exit status 2 and one line containing each of `needles`.
fn assert_refused(args: &[&str], out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: stderr: {err}");
    for needle in needles {
        assert!(
            err.contains(needle),
            "{args:?}: expected '{needle}' in: {err}"
        );
    }
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: not one line: {err}"
    );
}

struct Setup {
    _tmp: tempfile::TempDir,
    img: PathBuf,
    fifo: PathBuf,
    dir: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    let fifo = tmp.path().join("a-fifo");
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    mkfs(&img, "64M");
    rustix::fs::mknodat(CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
    Setup {
        _tmp: tmp,
        img,
        fifo,
        dir,
    }
}

#[test]
fn a_fifo_as_image_or_log_device_is_refused_without_blocking() {
    let t = setup();
    let (img, fifo, dir) = (s(&t.img), s(&t.fifo), s(&t.dir));
    let logdev_opt = format!("logdev={fifo}");
    let cases: Vec<Vec<&str>> = vec![
        vec!["check", fifo],
        vec!["info", fifo],
        vec!["logprint", fifo],
        vec!["mount", fifo, dir],
        vec!["mount", "--foreground", fifo, dir],
        vec!["check", img, "--logdev", fifo],
        vec!["info", img, "--logdev", fifo],
        vec!["logprint", img, "--logdev", fifo],
        vec!["mount", img, dir, "-o", &logdev_opt],
    ];
    for args in &cases {
        let out = cilfs_with_deadline(args, &t.fifo);
        assert_refused(args, &out, &[fifo, "not a regular file or block device"]);
    }
    // mkfs refused it already; it still does.
    let args = ["mkfs", fifo];
    assert_refused(
        &args,
        &cilfs_with_deadline(&args, &t.fifo),
        &[fifo, "not a regular file or block device"],
    );
    assert!(
        !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(dir),
        "nothing is mounted"
    );
    // The image is still usable: nothing was left holding it.
    let out = cilfs(&["check", img]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_directory_or_character_device_as_image_is_refused() {
    let t = setup();
    for bad in [s(&t.dir), "/dev/null"] {
        for cmd in ["check", "info", "logprint"] {
            let args = [cmd, bad];
            assert_refused(&args, &cilfs_with_deadline(&args, &t.fifo), &[bad]);
        }
    }
}

#[test]
fn a_missing_image_or_log_device_gives_its_cause_once() {
    let t = setup();
    let (img, dir) = (s(&t.img), s(&t.dir));
    let missing = t.img.with_file_name("missing.img");
    let missing = s(&missing);
    let under_file = format!("{img}/log");
    let logdev_opt = format!("logdev={missing}");
    let new_img = t.img.with_file_name("new.img");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["check", missing], "No such file or directory"),
        (vec!["info", missing], "No such file or directory"),
        (vec!["logprint", missing], "No such file or directory"),
        (vec!["mount", missing, dir], "No such file or directory"),
        (
            vec!["check", img, "--logdev", missing],
            "No such file or directory",
        ),
        (
            vec!["info", img, "--logdev", missing],
            "No such file or directory",
        ),
        (
            vec!["mount", img, dir, "-o", &logdev_opt],
            "No such file or directory",
        ),
        (
            vec!["mount", img, dir, "--foreground", "-o", &logdev_opt],
            "No such file or directory",
        ),
        (
            vec![
                "mkfs",
                "--size",
                "64M",
                "--logdev",
                &under_file,
                s(&new_img),
            ],
            "Not a directory",
        ),
        (
            vec!["mount", img, dir, "-o", "logdev="],
            "logdev needs a path",
        ),
    ];
    for (args, cause) in &cases {
        let out = cilfs_with_deadline(args, &t.fifo);
        assert_refused(args, &out, &[cause]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.matches(cause).count(),
            1,
            "{args:?}: the cause once: {err}"
        );
    }
    assert!(!new_img.exists());
}
