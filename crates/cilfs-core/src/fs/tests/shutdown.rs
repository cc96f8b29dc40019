//! The shutdown ioctl's three modes: what each makes stable first, that everything after it
//! fails and nothing more is written, and that the next mount recovers from the log.

#![allow(clippy::unwrap_used)]

use crate::fs::tests::{assert_clean, file_in_root, mount, new_dev, U};
use crate::fs::types::ShutdownMode;
use crate::fs::*;
use crate::journal::JournalError;
use cilfs_device::CrashOptions;

fn shut<T: std::fmt::Debug>(r: FsResult<T>) {
    assert!(
        matches!(r, Err(FsError::Journal(JournalError::Shutdown))),
        "{r:?}"
    );
}

/// Before the shutdown: `synced` durable, then `logged` created and an overwrite of `synced`
/// kept in the page cache. Returns what a mount of the crashed device shows: whether `logged`
/// exists, and `synced`'s contents.
fn run(mode: ShutdownMode) -> (bool, Vec<u8>) {
    let dev = new_dev(11);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"synced");
    fs.write(U, f, 0, b"old!").unwrap();
    fs.sync().unwrap();
    fs.write(U, f, 0, b"new!").unwrap();
    file_in_root(&fs, b"logged");
    fs.shutdown(mode).unwrap();
    assert!(fs.is_shut_down());
    shut(fs.write(U, f, 0, b"late"));
    shut(fs.mknod(U, ROOT_INO, b"late", items::inode::S_IFREG | 0o644, 0));
    shut(fs.unlink(ROOT_INO, b"synced"));
    shut(fs.fsync(f));
    shut(fs.unmount());
    let after = mount(
        &std::sync::Arc::new(dev.crash(CrashOptions { torn_writes: true })),
        FsOptions::default(),
    );
    assert_clean(&after);
    assert!(after.lookup(ROOT_INO, b"late").is_err());
    let logged = after.lookup(ROOT_INO, b"logged").is_ok();
    (logged, after.read(f, 0, 10).unwrap())
}

#[test]
fn default_shutdown_flushes_data_and_log() {
    assert_eq!(run(ShutdownMode::Default), (true, b"new!".to_vec()));
}

#[test]
fn logflush_shutdown_keeps_the_log_and_drops_unwritten_data() {
    assert_eq!(run(ShutdownMode::LogFlush), (true, b"old!".to_vec()));
}

#[test]
fn nologflush_shutdown_keeps_only_what_was_stable() {
    assert_eq!(run(ShutdownMode::NoLogFlush), (false, b"old!".to_vec()));
}
