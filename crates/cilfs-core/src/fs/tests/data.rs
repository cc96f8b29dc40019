//! File data: sparse files, truncate, fallocate, seek, fsync across a crash, orphans,
//! speculative preallocation and a failed data write.

use super::*;

#[test]
fn file_data_sparse_truncate_fallocate_seek() {
    let clock = TestClock::new();
    let dev = new_dev(2);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    let free0 = fs.statfs().bfree;
    assert_eq!(fs.write(U, f, 0, b"hello").unwrap(), 5);
    assert_eq!(fs.read(f, 0, 100).unwrap(), b"hello");
    // A write far out leaves a hole that reads as zeros.
    fs.write(U, f, 100_000, b"end").unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!(a.size, 100_003);
    assert_eq!(
        a.blocks_512,
        2 * u64::from(BS / 512),
        "two blocks allocated (small files get no preallocation), the rest sparse"
    );
    let mid = fs.read(f, 5, 99_995).unwrap();
    assert!(mid.iter().all(|&b| b == 0));
    assert_eq!(fs.read(f, 99_998, 10).unwrap(), b"\0\0end");
    assert_eq!(fs.seek(f, 0, true).unwrap(), 0);
    assert_eq!(fs.seek(f, 0, false).unwrap(), u64::from(BS));
    assert_eq!(
        fs.seek(f, 20_000, true).unwrap(),
        100_000 / u64::from(BS) * u64::from(BS)
    );
    assert!(matches!(fs.seek(f, 200_000, true), Err(FsError::NoData)));
    // Unaligned overwrite across blocks.
    let big: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    fs.write(U, f, 1000, &big).unwrap();
    let back = fs.read(f, 0, 12_000).unwrap();
    assert_eq!(&back[..5], b"hello");
    assert_eq!(&back[1000..11_000], &big[..]);
    // Truncate down frees, truncate up reads zeros past the old end.
    fs.setattr(
        U,
        f,
        SetAttr {
            size: Some(1500),
            ..Default::default()
        },
    )
    .unwrap();
    fs.setattr(
        U,
        f,
        SetAttr {
            size: Some(6000),
            ..Default::default()
        },
    )
    .unwrap();
    let back = fs.read(f, 0, 10_000).unwrap();
    assert_eq!(back.len(), 6000);
    assert_eq!(&back[1000..1500], &big[..500]);
    assert!(
        back[1500..].iter().all(|&b| b == 0),
        "no stale bytes after truncate up"
    );
    // fallocate and punch hole.
    fs.fallocate(U, f, 0, 20_000, false, false).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 20_000);
    fs.write(U, f, 0, &vec![7u8; 20_000]).unwrap();
    fs.fallocate(U, f, 3000, 8000, true, true).unwrap();
    let back = fs.read(f, 0, 20_000).unwrap();
    assert!(back[..3000].iter().all(|&b| b == 7));
    let nz: Vec<usize> = (3000..11_000).filter(|&i| back[i] != 0).collect();
    assert!(
        nz.is_empty(),
        "non-zero at {:?}..{:?} ({} bytes)",
        nz.first(),
        nz.last(),
        nz.len()
    );
    assert!(back[11_000..].iter().all(|&b| b == 7));
    assert_eq!(fs.getattr(f).unwrap().size, 20_000);
    // Punching holes into a sparse file allocates nothing, edges included.
    let sp = file_in_root(&fs, b"sparse");
    fs.setattr(
        U,
        sp,
        SetAttr {
            size: Some(100_000),
            ..SetAttr::default()
        },
    )
    .unwrap();
    fs.fallocate(U, sp, 5000, 50_000, true, true).unwrap();
    fs.fallocate(U, sp, 0, 5000, true, true).unwrap();
    fs.fallocate(U, sp, 99_990, 5, true, true).unwrap();
    assert_eq!(fs.getattr(sp).unwrap().blocks_512, 0, "blocks for a hole");
    assert_eq!(fs.read(sp, 0, 100).unwrap(), vec![0u8; 100]);
    // Unlinking gives every block back (after the freeing checkpoint is stable).
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.statfs().bfree, free0);
    assert_clean(&fs);
}

#[test]
fn fsynced_file_survives_crash_and_orphans_are_reclaimed() {
    for seed in 0..8 {
        let clock = TestClock::new();
        let dev = new_dev(10 + seed);
        let fs = mount(&dev, opts(&clock));
        let f = file_in_root(&fs, b"kept");
        fs.write(U, f, 0, &vec![0xAB; 10_000]).unwrap();
        fs.fsync(f).unwrap();
        fs.sync().unwrap();
        let free_before = fs.statfs().bfree;
        // An open file, unlinked, with data: an orphan until release, or until the next mount.
        let o = file_in_root(&fs, b"orphan");
        fs.open_inode(o).unwrap();
        fs.write(U, o, 0, &vec![1u8; 50_000]).unwrap();
        fs.unlink(ROOT_INO, b"orphan").unwrap();
        assert_eq!(
            fs.read(o, 0, 10).unwrap(),
            vec![1u8; 10],
            "still readable while open"
        );
        fs.sync().unwrap();
        let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
        drop(fs);
        let fs = mount(&crashed, opts(&clock));
        assert_eq!(
            fs.read(f, 0, 20_000).unwrap(),
            vec![0xAB; 10_000],
            "seed {seed}"
        );
        assert!(
            matches!(fs.getattr(o), Err(FsError::NotFound)),
            "orphan reclaimed at mount"
        );
        assert_eq!(fs.stats.snapshot().orphans_reclaimed, 1);
        fs.sync().unwrap();
        assert_eq!(fs.statfs().bfree, free_before, "its blocks are free again");
        assert_clean(&fs);
    }
}

/// A file in the root, opened and appended to a block at a time, block i filled with i (so
/// speculative preallocation maps blocks past its end once it has 16).
fn appended_file(fs: &Fs, name: &[u8], n: u64) -> u64 {
    let bs = u64::from(BS);
    let f = fs
        .mknod(U, ROOT_INO, name, items::inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    fs.open_inode(f).unwrap();
    for i in 0..n {
        fs.write(U, f, i * bs, &[i as u8; BS as usize]).unwrap();
    }
    f
}

/// A crash before the last release leaves speculative preallocation mapped past the end of a
/// file; the mount after it cannot know those blocks from memory, so the next last release
/// frees every block past the end of a file no fallocate preallocated, and keeps them where
/// one did (its `INODE_PREALLOC` survives the crash).
#[test]
fn preallocation_left_by_a_crash_goes_at_the_next_last_release() {
    let clock = TestClock::new();
    let dev = new_dev(43);
    // Speculative preallocation serves appends that map their blocks as they come.
    let opts = |c: &TestClock| FsOptions {
        delalloc: false,
        ..opts(c)
    };
    let fs = mount(&dev, opts(&clock));
    let bs = u64::from(BS);
    let f = appended_file(&fs, b"log", 100);
    let g = appended_file(&fs, b"reserved", 40);
    fs.fallocate(U, g, 40 * bs, 64 * bs, true, false).unwrap();
    let h = appended_file(&fs, b"sparse", 20);
    // A hole punched in it: fewer blocks than its size, yet some past its end.
    fs.fallocate(U, h, 2 * bs, 16 * bs, true, true).unwrap();
    for ino in [f, g, h] {
        fs.fsync(ino).unwrap();
    }
    let blocks = |fs: &Fs, ino| fs.getattr(ino).unwrap().blocks_512 / (bs / 512);
    let (f_before, h_before) = (blocks(&fs, f), blocks(&fs, h));
    assert!(f_before > 100, "appends preallocated past the end");
    assert!(h_before > 4, "the appends preallocated past the end");
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let mut o = opts(&clock);
    let told = attrs_changed_log(&mut o);
    let fs = mount(&crashed, o);
    assert_eq!(
        blocks(&fs, f),
        f_before,
        "mapped past the end after the crash"
    );
    let free = fs.statfs().bfree;
    for ino in [f, g, h] {
        fs.open_inode(ino).unwrap();
        fs.release_inode(ino).unwrap();
    }
    assert_eq!(
        *told.lock(),
        vec![f, h],
        "the kernel's cached block counts of the trimmed files dropped, and only theirs"
    );
    assert_eq!(blocks(&fs, f), 100, "speculation the crash left was freed");
    assert_eq!(blocks(&fs, g), 104, "fallocated blocks past the end kept");
    assert_eq!(
        blocks(&fs, h),
        4,
        "blocks past the end of a sparse file freed"
    );
    assert_eq!(fs.read(f, 99 * bs, 4).unwrap(), vec![99u8; 4]);
    assert_eq!(fs.read(h, 19 * bs, 2).unwrap(), vec![19u8; 2]);
    assert_eq!(
        fs.statfs().bfree,
        free + (f_before - 100) + (h_before - 4),
        "the freed blocks are free space again"
    );
    assert_clean(&fs);
}

/// Speculative preallocation serves appends and goes at the last release: an appended file
/// keeps no blocks past its end once closed, a write far past the end preallocates nothing,
/// and blocks fallocate mapped past the end stay.
#[test]
fn speculative_preallocation_is_trimmed_at_the_last_release() {
    let clock = TestClock::new();
    let dev = new_dev(42);
    // Speculative preallocation serves appends that map their blocks as they come.
    let fs = mount(
        &dev,
        FsOptions {
            delalloc: false,
            ..opts(&clock)
        },
    );
    let bs = u64::from(BS);
    let blocks = |ino| fs.getattr(ino).unwrap().blocks_512 / (bs / 512);
    let appended = |name: &[u8], n: u64| appended_file(&fs, name, n);
    let f = appended(b"log", 100);
    assert!(blocks(f) > 100, "appends preallocated past the end");
    // Another handle keeps it: its writer may append into the blocks.
    fs.open_inode(f).unwrap();
    fs.release_inode(f).unwrap();
    assert!(blocks(f) > 100, "trimmed while still open");
    fs.release_inode(f).unwrap();
    assert_eq!(blocks(f), 100, "blocks past the end after the last release");
    assert_eq!(fs.read(f, 99 * bs, 4).unwrap(), vec![99u8; 4]);
    // A write far past the end leaves a hole and preallocates nothing.
    fs.open_inode(f).unwrap();
    fs.write(U, f, 1 << 30, b"far").unwrap();
    assert_eq!(blocks(f), 101);
    fs.release_inode(f).unwrap();
    // fallocate's blocks past the end are the caller's.
    let g = appended(b"reserved", 40);
    fs.fallocate(U, g, 40 * bs, 64 * bs, true, false).unwrap();
    fs.release_inode(g).unwrap();
    assert_eq!(blocks(g), 104, "fallocated blocks past the end kept");
    assert_eq!(fs.getattr(g).unwrap().size, 40 * bs);
    // An append after a fallocate far past the end preallocates again; the release frees
    // only what that append reserved, not the fallocated blocks.
    let h = appended(b"reserved-far", 20);
    fs.fallocate(U, h, 100 * bs, 64 * bs, true, false).unwrap();
    fs.write(U, h, 20 * bs, &[9; BS as usize]).unwrap();
    fs.release_inode(h).unwrap();
    assert_eq!(blocks(h), 20 + 1 + 64, "only speculative blocks trimmed");
    assert_clean(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(fs.getattr(f).unwrap().blocks_512 / (bs / 512), 101);
    assert_eq!(fs.getattr(g).unwrap().blocks_512 / (bs / 512), 104);
    assert_clean(&fs);
}

/// An fsync whose data write fails returns the error and keeps the pages dirty: the next
/// fsync writes them. Taken pages are marked clean; dropped after the failure, the next fsync
/// found nothing to write and succeeded, and a crash then showed the old contents.
#[test]
fn an_fsync_whose_data_write_fails_keeps_its_pages_for_the_next() {
    use cilfs_device::FaultMode;
    let clock = TestClock::new();
    let dev = new_dev(97);
    // Data written in place: a few pages would go into the log instead (`logged_data.rs`).
    let in_place = || FsOptions {
        log_data_max: 0,
        ..opts(&clock)
    };
    let fs = mount(&dev, in_place());
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[1u8; 3 * 4096]).unwrap();
    fs.sync().unwrap();
    fs.write(U, f, 0, &[2u8; 3 * 4096]).unwrap();
    // The fsync's first device operation is its data write: every block it needs is cached.
    dev.inject_fault(dev.op_count(), FaultMode::Once);
    assert!(
        fs.fsync(f).is_err(),
        "the injected fault did not reach the fsync"
    );
    dev.clear_fault();
    fs.fsync(f).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    let got = fs.read(f, 0, 3 * 4096).unwrap();
    assert!(
        got == vec![2u8; 3 * 4096],
        "the fsynced bytes were lost: {:?}",
        &got[..8]
    );
    assert_clean(&fs);
}

/// An orphan item for an inode that names still reach is damage: the mount's orphan
/// reclaim drops the item and keeps the file (before, it freed the file under its names),
/// and marks the superblock as needing a check.
#[test]
fn an_orphan_item_of_a_linked_inode_never_frees_it() {
    let clock = TestClock::new();
    let dev = new_dev(71);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"linked");
    fs.write(U, f, 0, &[7u8; 5000]).unwrap();
    {
        let mut st = fs.write_state();
        fs.with_tx(&mut st, |t, _| {
            t.insert(
                TREE_FS,
                keys::key(keys::ORPHAN_OWNER, keys::KIND_ORPHAN, f),
                &[],
            )?;
            Ok(((), vec![]))
        })
        .unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(fs.lookup(ROOT_INO, b"linked").unwrap().ino, f);
    assert_eq!(fs.read(f, 0, 10_000).unwrap(), vec![7u8; 5000]);
    assert!(fs.journal.superblock().needs_check);
    assert_clean(&fs);
}

/// A byte written at 2^63 - 2, the last offset a file holds (xfstests generic/525): the file
/// is 2^63 - 1 bytes, its last block ends at 2^63, it reads back and the image checks clean;
/// a byte past it is EFBIG.
#[test]
fn a_byte_at_the_last_offset_a_file_holds_reads_back_and_checks_clean() {
    let clock = TestClock::new();
    let dev = new_dev(91);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"huge");
    let last = (i64::MAX - 1) as u64;
    assert_eq!(fs.write(U, f, last, b"x").unwrap(), 1);
    assert_eq!(fs.getattr(f).unwrap().size, i64::MAX as u64);
    assert_eq!(fs.read(f, last, 10).unwrap(), b"x");
    assert!(matches!(
        fs.write(U, f, last + 1, b"y"),
        Err(FsError::TooBig)
    ));
    assert_clean(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(fs.read(f, last, 10).unwrap(), b"x");
    assert_clean(&fs);
}

/// fdatasync after an overwrite that only moved the timestamps writes the data and flushes
/// the device, with no log force (the checkpoint holding the new mtime may stay in memory),
/// and the data survives a crash; fsync forces that checkpoint. A write that grew the file
/// is forced by fdatasync too: the size is needed to read the data back.
#[test]
fn fdatasync_of_an_overwrite_forces_no_log_and_keeps_the_data() {
    let clock = TestClock::new();
    let dev = new_dev(71);
    // Blocks written in place: the first fsync would put these few into the log, and an
    // overwrite of a block the log holds goes there too (`logged_data.rs`).
    let fs = mount(
        &dev,
        FsOptions {
            log_data_max: 0,
            ..opts(&clock)
        },
    );
    let f = file_in_root(&fs, b"f");
    let b = BS as usize;
    fs.write(U, f, 0, &vec![1u8; 4 * b]).unwrap();
    fs.fsync(f).unwrap();
    let j = Arc::clone(fs.journal());
    let forces = || j.counters.log_forces.load(Ordering::Relaxed);

    clock.advance_ms(10);
    fs.write(U, f, u64::from(BS), &vec![0xAA; b]).unwrap();
    let (before, done) = (forces(), j.completed_seq());
    fs.fdatasync(f).unwrap();
    assert_eq!(forces(), before, "fdatasync of an overwrite forced the log");
    assert_eq!(j.completed_seq(), done);
    let back = mount(
        &Arc::new(dev.crash(CrashOptions { torn_writes: true })),
        opts(&clock),
    );
    let got = back.read(f, 0, 4 * BS).unwrap();
    assert_eq!(got.len(), 4 * b);
    assert!(
        got[b..2 * b].iter().all(|&x| x == 0xAA),
        "the overwrite is lost"
    );
    assert_clean(&back);

    clock.advance_ms(10);
    fs.write(U, f, 0, &vec![0xBB; b]).unwrap();
    let before = forces();
    fs.fsync(f).unwrap();
    assert!(forces() > before, "fsync must make the new mtime stable");

    clock.advance_ms(10);
    fs.write(U, f, 4 * u64::from(BS), &vec![0xCC; b]).unwrap();
    fs.fdatasync(f).unwrap();
    let back = mount(
        &Arc::new(dev.crash(CrashOptions { torn_writes: true })),
        opts(&clock),
    );
    assert_eq!(back.getattr(f).unwrap().size, 5 * u64::from(BS));
    let got = back.read(f, 4 * u64::from(BS), BS).unwrap();
    assert!(got.iter().all(|&x| x == 0xCC), "the appended block is lost");
    assert_clean(&back);
}

/// fdatasync after a write into preallocated (unwritten) blocks forces the transaction that
/// marks them written, though it logs an inode item differing only in its timestamps: the
/// extents changed. (The crash explorer found an fdatasync that judged by the item alone.)
#[test]
fn fdatasync_forces_the_conversion_of_preallocated_blocks() {
    let clock = TestClock::new();
    let dev = new_dev(72);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    let b = BS as usize;
    fs.fallocate(U, f, 0, 4 * u64::from(BS), false, false)
        .unwrap();
    fs.fsync(f).unwrap();
    clock.advance_ms(10);
    fs.write(U, f, u64::from(BS), &vec![0xAA; b]).unwrap();
    fs.fdatasync(f).unwrap();
    let back = mount(
        &Arc::new(dev.crash(CrashOptions { torn_writes: true })),
        opts(&clock),
    );
    let got = back.read(f, u64::from(BS), BS).unwrap();
    assert!(
        got.iter().all(|&x| x == 0xAA),
        "the write into preallocation is lost"
    );
    assert_clean(&back);
}
