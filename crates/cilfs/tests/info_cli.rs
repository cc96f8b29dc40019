//! What `cilfs info` says of space and inodes: the counters of the filesystem header as they
//! lie in place, read without mounting or replaying the log, and a note when the log may hold
//! newer ones.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

mod common;
use common::{cilfs, mkfs, s};

fn info(args: &[&str]) -> String {
    let out = cilfs(args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The value after `label` on its line, as a number (thousands separators dropped).
fn number_after(text: &str, label: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in\n{text}"));
    let word = line[label.len()..].split_whitespace().next().unwrap();
    word.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("{line:?}"))
}

#[test]
fn info_shows_free_space_and_inodes_of_the_header_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    mkfs(&img, "64M");
    let text = info(&["info", s(&img)]);
    // 64 MiB of 4 KiB blocks, less the log, the superblock and the metadata mkfs wrote.
    let free = number_after(&text, "free space");
    assert!((8_000..16_384).contains(&free), "{text}");
    assert!(text.contains(" available to files"), "{text}");
    assert_eq!(number_after(&text, "inodes"), 1, "the root alone: {text}");
    assert!(!text.contains("as of the last header"), "clean: {text}");

    // Left as a crash would: the header in place is unchanged.
    drop(common::log_inode_count_change(&img, 5));
    let text = info(&["info", s(&img)]);
    assert!(text.contains("state          needs recovery"), "{text}");
    // Not replayed: the figure in place, and a note saying so.
    assert_eq!(number_after(&text, "inodes"), 1, "{text}");
    assert_eq!(number_after(&text, "free space"), free, "{text}");
    assert!(
        text.contains("as of the last header written in place: the log may hold newer"),
        "{text}"
    );
    assert!(text.contains(&format!("cilfs check {}", s(&img))), "{text}");
}

/// With an external log the header is the data device's second block, not the one past a log.
#[test]
fn info_finds_the_header_with_an_external_log() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    let log = tmp.path().join("log.img");
    let out = cilfs(&["mkfs", "-q", "--size", "32M", "--logdev", s(&log), s(&img)]);
    assert!(out.status.success(), "{out:?}");
    let text = info(&["info", s(&img), "--logdev", s(&log)]);
    assert_eq!(number_after(&text, "inodes"), 1, "{text}");
    let free = number_after(&text, "free space");
    assert!((4_000..8_192).contains(&free), "{text}");
}

/// `mkfs -L` sets the label, and `info` shows it.
#[test]
fn mkfs_sets_the_label_and_info_shows_it() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    let out = cilfs(&["mkfs", "-q", "--size", "32M", "-L", "scratch disk", s(&img)]);
    assert!(out.status.success(), "{out:?}");
    let text = info(&["info", s(&img)]);
    assert!(text.contains("label          scratch disk\n"), "{text}");
    let long = "l".repeat(256);
    let out = cilfs(&[
        "mkfs",
        "-q",
        "--force",
        "--size",
        "32M",
        "-L",
        &long,
        s(&img),
    ]);
    assert!(!out.status.success());
}
