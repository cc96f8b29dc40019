//! A reader that goes away (`cilfs info IMG | head -1`) ends a command's output quietly: no
//! panic (exit 101), no message, and the command's own exit status. Each command writes into a
//! pipe whose read end is already closed, so every write it makes fails with EPIPE, whenever it
//! comes. `stat --watch` needs a mount: root and /dev/fuse.
#![allow(clippy::unwrap_used)]

use rustix::fs::{FileType, Mode, CWD};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;
use common::{cilfs, miscount_inodes, mkfs, s, CILFS};

/// The write end of a pipe nobody reads any more: a FIFO opened for reading (without waiting),
/// then for writing, then its reader closed.
fn broken_pipe(dir: &Path) -> File {
    let fifo = dir.join("pipe");
    let _ = std::fs::remove_file(&fifo);
    rustix::fs::mknodat(CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
    let reader = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(&fifo)
        .unwrap();
    let writer = OpenOptions::new().write(true).open(&fifo).unwrap();
    drop(reader);
    writer
}

/// Runs cilfs with its stdout on a broken pipe; asserts it ended quietly and returns its output.
#[track_caller]
fn run_into_broken_pipe(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(CILFS)
        .args(args)
        .stdin(Stdio::null())
        .stdout(broken_pipe(dir))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(101), "{args:?} panicked: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
    out
}

fn image(dir: &Path) -> PathBuf {
    let img = dir.join("fs.img");
    mkfs(&img, "64M");
    img
}

#[test]
fn info_logprint_check_and_mkfs_end_quietly_on_a_closed_stdout() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path());
    for args in [
        vec!["info", s(&img)],
        vec!["logprint", s(&img)],
        vec!["logprint", "--json", s(&img)],
        vec!["check", s(&img)],
    ] {
        let out = run_into_broken_pipe(tmp.path(), &args);
        assert!(out.status.success(), "{args:?}: {:?}", out.status);
        assert!(out.stderr.is_empty(), "{args:?}");
    }
    // mkfs prints its report after the work: the filesystem is made all the same.
    let other = tmp.path().join("other.img");
    let out = run_into_broken_pipe(tmp.path(), &["mkfs", "--size", "32M", s(&other)]);
    assert!(out.status.success(), "{:?}", out.status);
    assert!(cilfs(&["check", s(&other)]).status.success());
    // A command keeps its own status and its message: check of a damaged image still exits 1,
    // info of an image without a superblock 2.
    miscount_inodes(&img);
    let out = run_into_broken_pipe(tmp.path(), &["check", s(&img)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is inconsistent"));
    let mut bytes = std::fs::read(&other).unwrap();
    // The primary and both backup copies (byte 1 MiB, the last block).
    let len = bytes.len();
    bytes[..512].fill(0x5a);
    bytes[1 << 20..(1 << 20) + 512].fill(0x5a);
    bytes[len - 4096..].fill(0x5a);
    std::fs::write(&other, bytes).unwrap();
    let out = run_into_broken_pipe(tmp.path(), &["info", s(&other)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("superblock"));
}

#[test]
fn stat_watch_ends_when_its_reader_goes_away() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test needs /dev/fuse (run scripts/install-deps)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path());
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let out = cilfs(&["mount", s(&img), s(&dir)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = cilfs(&["unmount", s(self.0)]);
        }
    }
    let _unmount = Unmount(&dir);
    // A reader gone before the first line, with and without --json.
    for args in [
        vec!["stat", "--watch", "--json", s(&dir)],
        vec!["stat", "--watch", s(&dir)],
    ] {
        let out = run_into_broken_pipe(tmp.path(), &args);
        assert!(out.status.success(), "{args:?}: {:?}", out.status);
    }
    // `| head -1`: one line read, then the reader goes; the next second's line ends it.
    let mut child = Command::new(CILFS)
        .args(["stat", "--watch", "--json", s(&dir)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with('{'), "{first}");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(err.is_empty(), "{err}");
}
