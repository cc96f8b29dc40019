//! `cilfs mkfs` and `cilfs info` as a user runs them: every refused input names the problem,
//! exits 2 and leaves the target exactly as it was.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

use std::path::PathBuf;
use std::process::Output;

mod common;
use common::{cilfs, s};

/// Asserts a refusal: exit status 2 and a one-line message containing `needle`.
fn assert_refused(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
}

struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

#[test]
fn refuses_a_target_with_data_without_force() {
    let d = Dir::new();
    let img = d.path("data.img");
    std::fs::write(&img, b"precious user data").unwrap();
    assert_refused(&cilfs(&["mkfs", s(&img)]), "contains data (use --force");
    assert_eq!(std::fs::read(&img).unwrap(), b"precious user data");
    // --force overwrites it.
    let out = cilfs(&["mkfs", "--force", "--size", "32M", s(&img)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 32 << 20);
}

#[test]
fn refuses_a_size_too_small() {
    let d = Dir::new();
    let img = d.path("small.img");
    assert_refused(
        &cilfs(&["mkfs", "--size", "8M", s(&img)]),
        "size 8 MiB is too small: the minimum is 16 MiB",
    );
    assert!(!img.exists());
}

#[test]
fn refuses_a_log_too_small_or_larger_than_half_the_device() {
    let d = Dir::new();
    let img = d.path("fs.img");
    assert_refused(
        &cilfs(&["mkfs", "--log-size", "512k", s(&img)]),
        "log size 512 KiB is too small",
    );
    assert!(!img.exists());
    assert_refused(
        &cilfs(&["mkfs", "--size", "64M", "--log-size", "40M", s(&img)]),
        "log size 40 MiB is larger than half the device (32 MiB)",
    );
    assert!(!img.exists());
}

#[test]
fn refuses_a_log_device_too_small() {
    let d = Dir::new();
    let img = d.path("fs.img");
    let log = d.path("log.img");
    std::fs::write(&log, vec![0u8; 600 * 1024]).unwrap();
    assert_refused(
        &cilfs(&["mkfs", "--logdev", s(&log), s(&img)]),
        "log device too small",
    );
    assert!(!img.exists());
    assert_eq!(std::fs::read(&log).unwrap(), vec![0u8; 600 * 1024]);
    // A log size that does not fit the device is refused the same way.
    std::fs::write(&log, vec![0u8; 4 << 20]).unwrap();
    assert_refused(
        &cilfs(&["mkfs", "--logdev", s(&log), "--log-size", "8M", s(&img)]),
        "log device too small",
    );
    assert!(!img.exists());
    assert_eq!(std::fs::metadata(&log).unwrap().len(), 4 << 20);
}

#[test]
fn refuses_a_log_device_with_data() {
    let d = Dir::new();
    let img = d.path("fs.img");
    let log = d.path("log.img");
    std::fs::write(&log, b"someone's log").unwrap();
    assert_refused(
        &cilfs(&["mkfs", "--logdev", s(&log), s(&img)]),
        "contains data",
    );
    assert!(!img.exists());
    assert_eq!(std::fs::read(&log).unwrap(), b"someone's log");
}

#[test]
fn refuses_bad_block_sizes() {
    let d = Dir::new();
    let img = d.path("fs.img");
    // One rule and one message for every bad size, the rule `--help` and the README state.
    for bs in ["3000", "256", "512", "1024", "1.5k", "128k", "0"] {
        assert_refused(
            &cilfs(&["mkfs", "--block-size", bs, s(&img)]),
            "is not a power of two in 2048..65536",
        );
        assert!(!img.exists(), "block size {bs}");
    }
    let help = cilfs(&["mkfs", "--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("a power of two in 2048..65536"));
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .unwrap()
        .replace("\n  ", " ");
    assert!(
        readme.contains("a block size that is not a power of two in 2048..65536"),
        "README states another block size rule"
    );
    for bs in ["2048", "64k"] {
        let out = cilfs(&[
            "mkfs",
            "--force",
            "--size",
            "32M",
            "--block-size",
            bs,
            s(&img),
        ]);
        assert!(
            out.status.success(),
            "{bs}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn sizes_take_fractions_rounded_down_to_whole_blocks() {
    let d = Dir::new();
    let img = d.path("fs.img");
    let made = |size: &str, log_size: &str| {
        let out = cilfs(&[
            "mkfs",
            "--force",
            "--size",
            size,
            "--log-size",
            log_size,
            s(&img),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{size}: {err}");
        String::from_utf8_lossy(&cilfs(&["info", s(&img)]).stdout).into_owned()
    };
    // 1.5 GiB: 393216 blocks of 4 KiB; the image file is that long.
    let info = made("1.5G", "1.5M");
    assert!(
        info.contains("data           393216 blocks (1.5 GiB)"),
        "{info}"
    );
    assert!(info.contains("(384 blocks, 1.5 MiB)"), "{info}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 3 << 29);
    // 0.1 GiB is 107374182.4 bytes: 26214 whole blocks.
    let info = made("0.1g", "1M");
    assert!(info.contains("data           26214 blocks"), "{info}");
    // No fraction of a byte, no unknown suffix: one line, exit 2, nothing made.
    std::fs::remove_file(&img).unwrap();
    for (size, needle) in [
        ("1.5", "a number of bytes has no fraction"),
        ("1.5X", "unknown size suffix"),
        ("1..5G", "is not a size"),
        ("16384P", "is too large"),
    ] {
        assert_refused(&cilfs(&["mkfs", "--size", size, s(&img)]), needle);
        assert!(!img.exists(), "{size}");
    }
}

#[test]
fn info_needs_the_log_device_of_an_external_log() {
    let d = Dir::new();
    let img = d.path("fs.img");
    let log = d.path("log.img");
    let out = cilfs(&["mkfs", "--size", "64M", "--logdev", s(&log), s(&img)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_refused(
        &cilfs(&["info", s(&img)]),
        "external log: give its device with --logdev",
    );
    assert_refused(
        &cilfs(&["info", s(&img), "--logdev", s(&d.path("missing.img"))]),
        "missing.img",
    );
    let out = cilfs(&["info", s(&img), "--logdev", s(&log)]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("log            external"), "{text}");
}

#[test]
fn default_mkfs_and_info_agree() {
    let d = Dir::new();
    let img = d.path("fs.img");
    let out = cilfs(&["mkfs", s(&img)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mkfs_text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(mkfs_text.contains("data device io"), "{mkfs_text}");
    let meta = std::fs::metadata(&img).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    let info = String::from_utf8_lossy(&cilfs(&["info", s(&img)]).stdout).to_string();
    assert!(
        info.contains("data           262144 blocks (1.0 GiB)"),
        "{info}"
    );
    assert!(
        info.contains("log            internal, blocks 257..16641 (16384 blocks, 64.0 MiB)"),
        "{info}"
    );
    assert!(info.contains("state          clean"), "{info}");
    // info goes on with the header's counts, which mkfs does not print.
    let geometry = &info[..info.find("free space").unwrap_or(info.len())];
    assert!(
        mkfs_text.starts_with(geometry),
        "mkfs prints the geometry info prints"
    );
    assert!(info.contains("inodes         1 in use"), "{info}");
}

#[test]
fn info_on_garbage_names_the_problem() {
    let d = Dir::new();
    let img = d.path("junk.img");
    std::fs::write(&img, vec![0x5au8; 8192]).unwrap();
    assert_refused(
        &cilfs(&["info", s(&img)]),
        "not a cilfs filesystem: no cilfs superblock at its start (make one with cilfs mkfs)",
    );
    assert_refused(&cilfs(&["info", s(&d.path("none.img"))]), "none.img");
}

/// An image of another filesystem is named as such by every command that opens one.
#[test]
fn another_filesystems_image_is_named() {
    let d = Dir::new();
    let img = d.path("ext4.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(16 << 20).unwrap();
    drop(f);
    let made = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", s(&img)])
        .status();
    if !made.is_ok_and(|st| st.success()) {
        eprintln!("skipped: mkfs.ext4 (e2fsprogs, from scripts/install-deps) did not run");
        return;
    }
    for cmd in ["info", "check", "repair"] {
        assert_refused(
            &cilfs(&[cmd, s(&img)]),
            "not a cilfs filesystem: it holds an ext2/ext3/ext4 filesystem",
        );
    }
    let zero = d.path("zero.img");
    std::fs::write(&zero, vec![0u8; 1 << 20]).unwrap();
    assert_refused(
        &cilfs(&["info", s(&zero)]),
        "not a cilfs filesystem: its start is zeros, no filesystem yet",
    );
}
