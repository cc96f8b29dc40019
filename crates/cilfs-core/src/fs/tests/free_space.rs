//! Free space: ENOSPC without damage, allocation past busy extents, the log forced instead of a
//! shutdown, statfs, and where tree splits take their blocks.

use super::*;

#[test]
fn full_device_gives_enospc_and_unlink_still_works() {
    let clock = TestClock::new();
    let dev = new_dev(6);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"big");
    let chunk = vec![5u8; 1 << 20];
    let mut off = 0;
    // Fill with shrinking writes until not even one block fits.
    let mut size = chunk.len();
    loop {
        match fs.write(U, f, off, &chunk[..size]) {
            Ok(n) => off += n as u64,
            Err(FsError::NoSpace) if size > BS as usize => size /= 2,
            Err(e) => {
                assert!(matches!(e, FsError::NoSpace), "{e}");
                break;
            }
        }
        assert!(off < 64 << 20, "never ran out of space");
    }
    assert!(
        off > 12 << 20,
        "most of the 16 MiB device was usable: {off}"
    );
    // Creates (which need a few blocks for the tree) run out soon after.
    let mut created = 0;
    let err = loop {
        match fs.mknod(
            U,
            ROOT_INO,
            format!("more{created}").as_bytes(),
            items::inode::S_IFREG | 0o644,
            0,
        ) {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
        assert!(created < 5000, "creates never ran out of space");
    };
    assert!(matches!(err, FsError::NoSpace), "{err}");
    // Overwrites need no new space.
    fs.write(U, f, 0, b"still writable in place").unwrap();
    // What was written is intact; unlink works and gives the space back.
    assert_eq!(fs.read(f, off - 10, 10).unwrap(), vec![5u8; 10]);
    fs.unlink(ROOT_INO, b"big").unwrap();
    fs.sync().unwrap();
    let f2 = file_in_root(&fs, b"again");
    fs.write(U, f2, 0, &chunk).unwrap();
    assert_clean(&fs);
}

/// Allocates every free extent, owned by nothing: tests then give pieces back to shape the free
/// space, and `give_back` the rest before checking.
fn take_all_free_space(fs: &Fs) -> Vec<(u64, u64)> {
    let mut taken = Vec::new();
    let mut st = fs.state.write();
    fs.with_tx(&mut st, |t, _| {
        while let Some(e) = t.alloc_extent(u64::MAX >> 1, 1)? {
            taken.push(e);
        }
        Ok(((), vec![]))
    })
    .unwrap();
    taken
}

/// Index of the longest of `extents`.
fn longest(extents: &[(u64, u64)]) -> usize {
    (0..extents.len()).max_by_key(|&i| extents[i].1).unwrap()
}

fn give_back(fs: &Fs, taken: &[(u64, u64)]) {
    let mut st = fs.state.write();
    fs.with_tx(&mut st, |t, _| {
        for &(s, l) in taken {
            t.free_extent(s, l)?;
        }
        Ok(((), vec![]))
    })
    .unwrap();
}

/// A mount whose CIL holds a quarter of the log before a checkpoint, so that the frees of a
/// test's few hundred transactions stay busy until it forces the log.
fn mount_with_a_large_cil(dev: &Arc<SimDevice>, clock: &TestClock) -> Arc<Fs> {
    let cfg = JournalConfig {
        cil_limit: Some(256 * 1024),
        ..jcfg()
    };
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    Fs::open(j, opts(clock)).unwrap()
}

/// Unlinking many one-block files leaves as many one-block free extents, busy until the
/// checkpoint that freed them is stable. An allocation must still find the large free extent
/// beyond them: the by-size search looked at the 64 smallest candidates only, all busy, and
/// failed with ENOSPC on a device that was 80% free (and stayed so while no checkpoint came).
#[test]
fn allocation_looks_past_many_busy_small_extents() {
    let clock = TestClock::new();
    let dev = new_dev(61);
    let fs = mount_with_a_large_cil(&dev, &clock);
    let block = vec![3u8; BS as usize];
    let files = files_holding(&fs, 300, &block);
    fs.sync().unwrap();
    let checkpoints = || fs.journal().stats().log.checkpoints;
    let before = checkpoints();
    // Every other file: its block's neighbours stay allocated, so each free is an extent alone.
    for i in (0..300).step_by(2) {
        fs.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    assert_eq!(checkpoints(), before, "a checkpoint made the frees stable");
    let g = file_in_root(&fs, b"new");
    let other = vec![9u8; BS as usize];
    let first_write = dev.volatile_writes();
    fs.write(U, g, 0, &other).unwrap();
    fs.writeback_all().unwrap();
    let data_writes = first_write..dev.volatile_writes();
    assert!(
        !data_writes.is_empty(),
        "the new block was not written back in place"
    );
    assert_eq!(fs.read(g, 0, BS).unwrap(), other);
    assert_eq!(fs.read(files[1], 0, BS).unwrap(), block);
    assert_clean(&fs);
    // A crash that keeps the new file's data write and loses everything else since the sync:
    // the unlinks are gone, so every file is back, and none may show the new file's bytes.
    let crashed = Arc::new(dev.crash_with(&mut |i, _| {
        if data_writes.contains(&i) {
            cilfs_device::Survival::Kept
        } else {
            cilfs_device::Survival::Lost
        }
    }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    for (i, &f) in files.iter().enumerate() {
        assert_eq!(fs.read(f, 0, BS).unwrap(), block, "file f{i}");
    }
    assert_clean(&fs);
}

/// The last, exhaustive search: the smallest extents and the largest are all busy, and only a
/// middle-sized one (neither among the first candidates nor the largest) is usable.
#[test]
fn allocation_reads_every_extent_before_enospc() {
    let clock = TestClock::new();
    let fs = mount_with_a_large_cil(&new_dev(62), &clock);
    // Take all free space, then give back pieces: a middle extent M first, made stable, then
    // 100 one-block extents and a large one L, left busy.
    let taken = take_all_free_space(&fs);
    let mut st = fs.state.write();
    let (start, len) = *taken.iter().max_by_key(|e| e.1).unwrap();
    assert!(len > 3000, "one large free extent after mkfs: {taken:?}");
    let (m, m_len) = (start + 2000, 600);
    let (l, l_len) = (start + 200, 1500);
    fs.with_tx(&mut st, |t, _| {
        t.free_extent(m, m_len).map(|()| ((), vec![]))
    })
    .unwrap();
    fs.journal().force_all().unwrap();
    fs.with_tx(&mut st, |t, _| {
        for k in 0..100 {
            t.free_extent(start + 2 * k, 1)?;
        }
        t.free_extent(l, l_len)?;
        Ok(((), vec![]))
    })
    .unwrap();
    let got = fs
        .with_tx(&mut st, |t, _| {
            let one = t.alloc_extent(1, 1)?;
            let four = t.alloc_extent(4, 4)?;
            Ok(((one, four), vec![]))
        })
        .unwrap()
        .0;
    let in_m = |e: Option<(u64, u64)>| e.is_some_and(|(s, n)| s >= m && s + n <= m + m_len);
    assert!(
        in_m(got.0) && in_m(got.1),
        "allocated {got:?} outside {m}+{m_len}"
    );
}

/// With every free block busy (freed by a checkpoint not yet stable) and none left otherwise,
/// operations that need a new tree node force the log before their transaction instead of
/// failing inside it: a failure there, after the transaction logged changes, shut the journal
/// down. Hundreds of renames with long names split the target directory's leaves many times.
#[test]
fn renames_with_only_busy_space_force_the_log_instead_of_shutting_down() {
    let clock = TestClock::new();
    let fs = mount_with_a_large_cil(&new_dev(63), &clock);
    let a = fs.mkdir(U, ROOT_INO, b"a", 0o755).unwrap().ino;
    let b = fs.mkdir(U, ROOT_INO, b"b", 0o755).unwrap().ino;
    let name = |i: usize| format!("{i:04}-{}", "n".repeat(200)).into_bytes();
    for i in 0..300 {
        fs.mknod(U, a, &name(i), items::inode::S_IFREG | 0o644, 0)
            .unwrap();
    }
    fs.sync().unwrap();
    let mut taken = take_all_free_space(&fs);
    {
        let mut st = fs.state.write();
        let largest = longest(&taken);
        let (start, len) = taken[largest];
        assert!(len > 500, "{taken:?}");
        // Give some back: busy until a checkpoint is stable, the only free space there is.
        fs.with_tx(&mut st, |t, _| {
            t.free_extent(start, 500).map(|()| ((), vec![]))
        })
        .unwrap();
        taken[largest] = (start + 500, len - 500);
    }
    for i in 0..300 {
        fs.rename(a, &name(i), b, &name(i), RenameFlags::default())
            .unwrap_or_else(|e| panic!("rename {i}: {e}"));
    }
    assert_eq!(names(&fs, b).len(), 302, "300 names with . and ..");
    // The space taken above belongs to nothing: give it back before checking.
    give_back(&fs, &taken);
    assert_clean(&fs);
}

/// A large xattr value needs contiguous blocks, which the count-based space check does not
/// promise: with free space in single blocks and one large extent busy, setxattr forces the
/// log and tries again instead of failing with ENOSPC.
#[test]
fn a_large_xattr_forces_the_log_when_only_a_busy_extent_is_long_enough() {
    let clock = TestClock::new();
    let fs = mount_with_a_large_cil(&new_dev(64), &clock);
    let f = file_in_root(&fs, b"f");
    fs.sync().unwrap();
    let mut taken = take_all_free_space(&fs);
    {
        let mut st = fs.state.write();
        let largest = longest(&taken);
        let (start, len) = taken[largest];
        assert!(len > 2000, "{taken:?}");
        // 600 single blocks made stable, then a long extent left busy.
        fs.with_tx(&mut st, |t, _| {
            for k in 0..600 {
                t.free_extent(start + 2 * k, 1)?;
            }
            Ok(((), vec![]))
        })
        .unwrap();
        drop(st);
        fs.journal().force_all().unwrap();
        let mut st = fs.state.write();
        fs.with_tx(&mut st, |t, _| {
            t.free_extent(start + 1500, 100).map(|()| ((), vec![]))
        })
        .unwrap();
        // What stays taken: the odd blocks below 1200, and the rest around the long extent.
        taken[largest] = (start + 1600, len - 1600);
        for k in 0..600 {
            taken.push((start + 2 * k + 1, 1));
        }
        taken.push((start + 1200, 300));
    }
    let value = vec![0x5a; 3 * BS as usize];
    fs.setxattr(f, b"user.big", &value, XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getxattr(f, b"user.big").unwrap(), value);
    give_back(&fs, &taken);
    assert_clean(&fs);
}

/// df comes back after a delete without a sync: the blocks of an unlinked
/// file stay busy until the checkpoint that freed them is stable, but statfs counts them as
/// free and available, as XFS does (they belong to no file). The promise holds: a file that
/// needs them gets them, by forcing the log before it allocates, never by reusing a block whose
/// free a crash could still undo.
#[test]
fn statfs_counts_an_unlinked_files_busy_blocks_as_free_and_writes_can_use_them() {
    let clock = TestClock::new();
    let dev = new_dev(65);
    let fs = mount_with_a_large_cil(&dev, &clock);
    fs.sync().unwrap();
    let before = fs.statfs();
    let within_1pct = |now: u64, then: u64| now.abs_diff(then) * 100 <= then;
    let chunk = vec![0x6b; 64 * 1024];
    let chunk_blocks = chunk.len() as u64 / u64::from(BS);
    let write_file = |name: &[u8], chunks: u64| {
        let f = fs
            .mknod(U, ROOT_INO, name, items::inode::S_IFREG | 0o644, 0)
            .unwrap()
            .ino;
        for i in 0..chunks {
            fs.write(U, f, i * chunk.len() as u64, &chunk)
                .unwrap_or_else(|e| panic!("chunk {i} of {chunks}: {e}"));
        }
        f
    };
    // 4 MiB, made stable: a quarter of the device.
    let big = write_file(b"big", 64);
    fs.fsync(big).unwrap();
    let big_blocks = 64 * chunk_blocks;
    assert!(fs.statfs().bavail + big_blocks <= before.bavail);
    let checkpoints = || fs.journal().stats().log.checkpoints;
    let at_unlink = checkpoints();
    fs.unlink(ROOT_INO, b"big").unwrap();
    assert_eq!(
        checkpoints(),
        at_unlink,
        "a checkpoint made the frees stable"
    );
    let busy = fs.stats().busy_blocks;
    assert!(busy >= big_blocks, "only {busy} blocks busy");
    let after = fs.statfs();
    assert!(
        within_1pct(after.bfree, before.bfree) && within_1pct(after.bavail, before.bavail),
        "before the file {before:?}, after its unlink {after:?} with {busy} blocks busy"
    );
    // A file of nearly everything statfs calls available: more than is free outside the busy
    // extents, so its writes must force the log to get them.
    let chunks = after.bavail * 98 / 100 / chunk_blocks;
    assert!(chunks * chunk_blocks > after.bavail - busy);
    let next = write_file(b"next", chunks);
    assert!(
        checkpoints() > at_unlink,
        "the busy blocks were used unforced"
    );
    assert_eq!(fs.stats().busy_blocks, 0);
    let last = (chunks - 1) * chunk.len() as u64;
    assert_eq!(fs.read(next, last, chunk.len() as u32).unwrap(), chunk);
    assert_clean(&fs);
    // A crash now: the unlink was stable before any of its blocks was reused, so it stays done,
    // and no block belongs to both files.
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert!(matches!(
        fs.lookup(ROOT_INO, b"big"),
        Err(FsError::NotFound)
    ));
    assert_clean(&fs);
}

/// Splits of the fs tree take their blocks from the free list while it holds more than the
/// quarter kept for the free-space trees, so they leave those trees (whose roots every
/// allocation reads) alone: the free block count does not move until the list is topped up.
#[test]
fn fs_tree_splits_take_blocks_from_the_free_list() {
    let dev = new_dev(62);
    let fs = mount(&dev, FsOptions::default());
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let hdr = || {
        let st = fs.read_state();
        let h = st.hdr.lock();
        (h.freelist.len(), h.free_blocks)
    };
    let (list, free) = hdr();
    let low =
        crate::fs::txn::freelist_band(crate::fs::items::header::freelist_capacity(BS as usize)).0;
    assert!(
        list > low + 4,
        "a list of {list} leaves no room to take from"
    );
    let mut i = 0;
    while hdr().0 > list - 4 {
        assert!(i < 5000, "5000 creates took no block from the free list");
        fs.mknod(
            U,
            d,
            format!("{i:0>100}").as_bytes(),
            items::inode::S_IFREG | 0o644,
            0,
        )
        .unwrap();
        i += 1;
    }
    assert_eq!(
        hdr().1,
        free,
        "splits took blocks from the free-space trees"
    );
    assert_clean(&fs);
}
