//! Ordered data: a crash never shows a file's size ahead of its data (`Inode::ordered_size`).

#![allow(clippy::unwrap_used)]

use crate::fs::tests::{assert_clean, mount, new_dev, TestClock};
use crate::fs::types::Cred;
use crate::fs::*;
use cilfs_device::{CrashOptions, SimDevice};

const U: Cred = Cred::user(1000, 1000);

/// `files` regular files in the root, each appended to in `rounds` rounds of 4 KiB writes
/// (two blocks), the files taking turns; the clock moves between rounds, so some appends log
/// their inode and some leave their size in memory. Each file owns 16 blocks after its fourth
/// append, so speculative preallocation maps blocks past its end from then on and most appends
/// land in the page cache. Returns the inodes and what each was written with.
fn appended_files(
    fs: &Fs,
    clock: &TestClock,
    files: usize,
    rounds: usize,
) -> (Vec<u64>, Vec<Vec<u8>>) {
    let inos: Vec<u64> = (0..files)
        .map(|i| {
            fs.mknod(
                U,
                ROOT_INO,
                format!("a{i}").as_bytes(),
                items::inode::S_IFREG | 0o644,
                0,
            )
            .unwrap()
            .ino
        })
        .collect();
    let mut written = vec![Vec::new(); files];
    for round in 0..rounds {
        for (k, &f) in inos.iter().enumerate() {
            // Never a zero: a zero read back is a byte the file was not written with.
            let chunk: Vec<u8> = (0..4096)
                .map(|j| (1 + (round * 7 + k * 13 + j) % 251) as u8)
                .collect();
            let off = written[k].len() as u64;
            fs.write(U, f, off, &chunk).unwrap();
            written[k].extend_from_slice(&chunk);
        }
        if round % 3 == 0 {
            clock.advance_ms(5);
        }
    }
    (inos, written)
}

/// Another file written and fsynced, and the root directory fsynced: the log is forced with
/// whatever it holds of the appended files.
fn force_through_another_file(fs: &Fs) {
    let other = fs
        .mknod(U, ROOT_INO, b"synced", items::inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    fs.write(U, other, 0, b"forced").unwrap();
    fs.fsync(other).unwrap();
    fs.fsync(ROOT_INO).unwrap();
}

fn assert_prefix(fs: &Fs, inos: &[u64], written: &[Vec<u8>], what: &str) -> usize {
    let mut whole = 0;
    for (k, &f) in inos.iter().enumerate() {
        let got = fs.read(f, 0, 1 << 20).unwrap();
        let want = &written[k];
        assert!(
            got.len() <= want.len(),
            "{what}: file {k} has {} bytes, more than the {} written",
            got.len(),
            want.len()
        );
        if let Some(p) = got.iter().zip(want).position(|(a, b)| a != b) {
            panic!(
                "{what}: file {k} ({} of {} bytes) differs from what was written at byte {p} \
                 (reads {:#x}, written {:#x}): not a prefix",
                got.len(),
                want.len(),
                got[p],
                want[p]
            );
        }
        whole += usize::from(got.len() == want.len());
    }
    whole
}

fn crash_and_mount(dev: &SimDevice, clock: &TestClock) -> Arc<Fs> {
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    mount(
        &crashed,
        FsOptions {
            clock: clock.clock(),
            ..FsOptions::default()
        },
    )
}

#[test]
fn appended_files_read_as_a_prefix_of_what_was_written_after_a_crash() {
    for seed in 0..4 {
        let clock = TestClock::new();
        let dev = new_dev(300 + seed);
        let fs = mount(
            &dev,
            FsOptions {
                clock: clock.clock(),
                ..FsOptions::default()
            },
        );
        let (inos, written) = appended_files(&fs, &clock, 8, 40);
        force_through_another_file(&fs);
        let fs2 = crash_and_mount(&dev, &clock);
        drop(fs);
        assert_prefix(&fs2, &inos, &written, &format!("seed {seed}"));
        assert_clean(&fs2);
    }
}

#[test]
fn written_back_appends_are_whole_after_a_crash() {
    let clock = TestClock::new();
    let dev = new_dev(320);
    let fs = mount(
        &dev,
        FsOptions {
            clock: clock.clock(),
            ..FsOptions::default()
        },
    );
    let (inos, written) = appended_files(&fs, &clock, 6, 30);
    // What sync does: pages written back, then their sizes logged and the log forced.
    fs.sync().unwrap();
    let fs2 = crash_and_mount(&dev, &clock);
    drop(fs);
    assert_eq!(
        assert_prefix(&fs2, &inos, &written, "after sync"),
        inos.len(),
        "every file whole after sync"
    );
    assert_clean(&fs2);
}

#[test]
fn a_size_held_back_by_dirty_pages_is_logged_once_they_are_written() {
    let clock = TestClock::new();
    let dev = new_dev(321);
    let fs = mount(
        &dev,
        FsOptions {
            clock: clock.clock(),
            ..FsOptions::default()
        },
    );
    let (inos, written) = appended_files(&fs, &clock, 2, 20);
    // The periodic flush writes the pages back and logs the sizes they held back; a later
    // force (another file's fsync) makes them stable without a sync of these files.
    fs.writeback_idle().unwrap();
    force_through_another_file(&fs);
    let fs2 = crash_and_mount(&dev, &clock);
    drop(fs);
    assert_eq!(assert_prefix(&fs2, &inos, &written, "after write back"), 2);
    assert_clean(&fs2);
}

/// A file of 3 blocks and 600 bytes, all 0x4b, fsynced; truncated into its last block, then
/// `regrow` (which zeroes the old last block past the new end), then its pages written back;
/// the log never forced. A crash that keeps every data write shows the fsynced size (the
/// truncates are only in memory): it may read the zeros the regrow brought into the file, but
/// not zeros past the regrown end, which the file never held.
fn shrink_regrow_crash(seed: u64, regrow: &dyn Fn(&Fs, u64)) {
    let bs = u64::from(crate::fs::tests::BS);
    let (size, short, grown) = (3 * bs + 600, 2 * bs + 300, 2 * bs + 900);
    let clock = TestClock::new();
    let dev = new_dev(seed);
    let fs = mount(
        &dev,
        FsOptions {
            clock: clock.clock(),
            ..FsOptions::default()
        },
    );
    let f = fs
        .mknod(U, ROOT_INO, b"f", items::inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    fs.write(U, f, 0, &vec![0x4b; size as usize]).unwrap();
    fs.fsync(f).unwrap();
    fs.truncate(U, f, short).unwrap();
    regrow(&fs, f);
    fs.writeback_all().unwrap();
    let crashed = Arc::new(dev.crash_with(&mut |_, _| cilfs_device::Survival::Kept));
    drop(fs);
    let fs2 = mount(
        &crashed,
        FsOptions {
            clock: clock.clock(),
            ..FsOptions::default()
        },
    );
    let got = fs2.read(f, 0, 1 << 20).unwrap();
    assert_eq!(
        got.len() as u64,
        size,
        "the fsynced size: the truncates were never logged"
    );
    for (p, &b) in got.iter().enumerate() {
        let p = p as u64;
        let zero_ok = (short..grown).contains(&p);
        assert!(
            b == 0x4b || (b == 0 && zero_ok),
            "byte {p} reads {b:#x}: neither written nor a zero the file held"
        );
    }
    assert_clean(&fs2);
}

#[test]
fn a_regrow_by_truncate_never_zeroes_past_its_new_end_ahead_of_the_shrink() {
    shrink_regrow_crash(330, &|fs, f| {
        let bs = u64::from(crate::fs::tests::BS);
        fs.truncate(U, f, 2 * bs + 900).unwrap();
    });
}

#[test]
fn a_write_into_the_last_block_never_zeroes_past_its_end_ahead_of_the_shrink() {
    shrink_regrow_crash(331, &|fs, f| {
        let bs = u64::from(crate::fs::tests::BS);
        fs.write(U, f, 2 * bs + 800, &[0x4b; 100]).unwrap();
    });
}
