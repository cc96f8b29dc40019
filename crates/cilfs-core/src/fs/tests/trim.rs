//! FITRIM (`Fs::trim`): only free blocks are discarded, never one in use or busy, within the
//! range and runs asked for; the count returned is what was discarded.

use super::*;

fn read_dev(dev: &SimDevice, blk: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS as usize];
    dev.read(blk * u64::from(BS), &mut b).unwrap();
    b
}

/// Files kept, files deleted, everything synced: a trim of the whole device discards exactly
/// the free blocks (they read as zeros), every kept file reads back before and after a
/// remount, and the image checks clean.
#[test]
fn trim_discards_exactly_the_free_blocks_and_every_file_reads_back() {
    let clock = TestClock::new();
    let dev = new_dev(71);
    let fs = mount(&dev, opts(&clock));
    let data = |i: usize| vec![0x40 + i as u8; 5 * BS as usize + 100];
    let files: Vec<u64> = (0..12)
        .map(|i| {
            let f = file_in_root(&fs, format!("f{i}").as_bytes());
            fs.write(U, f, 0, &data(i)).unwrap();
            f
        })
        .collect();
    for i in (0..12).step_by(3) {
        fs.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    let free = blocks_of(&fs, check::Role::Free);
    let used: Vec<u64> = blocks_of(&fs, check::Role::FileData);
    assert!(!free.is_empty() && !used.is_empty());
    let before: Vec<Vec<u8>> = used.iter().map(|&b| read_dev(&dev, b)).collect();

    let trimmed = fs.trim(0, u64::MAX, 0).unwrap();
    assert_eq!(
        trimmed,
        free.len() as u64 * u64::from(BS),
        "every free block, once"
    );
    for &b in &free {
        assert!(
            read_dev(&dev, b).iter().all(|&x| x == 0),
            "free block {b} discarded"
        );
    }
    let after: Vec<Vec<u8>> = used.iter().map(|&b| read_dev(&dev, b)).collect();
    assert!(before == after, "no block of file data was touched");
    for (i, &f) in files.iter().enumerate() {
        if i % 3 != 0 {
            assert_eq!(fs.read(f, 0, 1 << 20).unwrap(), data(i), "file {i}");
        }
    }
    assert_clean(&fs);
    // Writing after a trim reuses the discarded blocks like any free ones.
    let g = file_in_root(&fs, b"after");
    fs.write(U, g, 0, &vec![7u8; 40 * BS as usize]).unwrap();
    fs.unmount().unwrap();
    drop(fs);

    let fs = mount(&dev, opts(&clock));
    for (i, &f) in files.iter().enumerate() {
        if i % 3 != 0 {
            assert_eq!(
                fs.read(f, 0, 1 << 20).unwrap(),
                data(i),
                "file {i} after remount"
            );
        }
    }
    assert_eq!(fs.read(g, 0, 1 << 20).unwrap(), vec![7u8; 40 * BS as usize]);
    assert_clean(&fs);
}

/// Blocks a transaction freed whose checkpoint is not stable yet are busy: a crash could give
/// them back to their file, so a trim leaves them. After the crash the file is back with its
/// data, or gone; either way the image is clean.
#[test]
fn trim_leaves_blocks_freed_by_an_unstable_checkpoint() {
    let clock = TestClock::new();
    let dev = new_dev(72);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"doomed");
    let data = vec![0x5a_u8; 16 * BS as usize];
    fs.write(U, f, 0, &data).unwrap();
    fs.sync().unwrap();
    let owned = blocks_of(&fs, check::Role::FileData);
    assert_eq!(owned.len(), 16);
    fs.unlink(ROOT_INO, b"doomed").unwrap();
    assert!(
        fs.busy.taken_blocks() >= 16,
        "the unlink's checkpoint is not stable: its blocks are busy"
    );
    let free_now = blocks_of(&fs, check::Role::Free);
    assert!(
        owned.iter().all(|b| free_now.contains(b)),
        "free in the trees"
    );

    let trimmed = fs.trim(0, u64::MAX, 0).unwrap();
    assert!(trimmed > 0);
    assert_eq!(
        trimmed,
        (free_now.len() - owned.len()) as u64 * u64::from(BS),
        "every free block but the busy ones"
    );
    for &b in &owned {
        assert!(
            read_dev(&dev, b).iter().all(|&x| x == 0x5a),
            "busy block {b} kept its data"
        );
    }

    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    let after = mount(&crashed, opts(&clock));
    assert_clean(&after);
    if let Ok(a) = after.lookup(ROOT_INO, b"doomed") {
        assert_eq!(after.read(a.ino, 0, 1 << 20).unwrap(), data);
    }
}

/// The range and the minimum run: only whole blocks inside `[start, start+len)` go, runs
/// shorter than `minlen` stay, and a start past the end or a length under a block is EINVAL.
#[test]
fn trim_keeps_to_its_range_and_minimum_run_and_refuses_bad_ones() {
    let clock = TestClock::new();
    let dev = new_dev(73);
    let fs = mount(&dev, opts(&clock));
    // Free space in short runs: every other file of 3 blocks deleted.
    for i in 0..40 {
        let f = file_in_root(&fs, format!("f{i}").as_bytes());
        fs.write(U, f, 0, &vec![1u8; 3 * BS as usize]).unwrap();
        // Its blocks chosen now, between its neighbours' (not at write back, all together).
        fs.fsync(f).unwrap();
    }
    for i in (0..40).step_by(2) {
        fs.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    let bs = u64::from(BS);
    let free = blocks_of(&fs, check::Role::Free);
    let dev_bytes = BLOCKS * bs;

    assert!(matches!(
        fs.trim(dev_bytes, 1 << 20, 0),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.trim(u64::MAX, u64::MAX, 0),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(fs.trim(0, bs - 1, 0), Err(FsError::Invalid(_))));
    assert!(matches!(fs.trim(0, 0, 0), Err(FsError::Invalid(_))));
    // A minimum run longer than any free run: nothing.
    assert_eq!(fs.trim(0, u64::MAX, dev_bytes).unwrap(), 0);

    // A window from the middle of one block to the middle of another: whole blocks inside.
    let (lo, hi) = (free[free.len() / 4], free[free.len() * 3 / 4]);
    let start = lo * bs + bs / 2;
    let len = (hi - lo) * bs;
    let inside = free.iter().filter(|&&b| b > lo && b < hi).count() as u64;
    let first = fs.trim(start, len, 0).unwrap();
    assert_eq!(first, inside * bs);
    // Everything with runs of 3 blocks or more: the deleted files' holes are 3 long, so all
    // runs count; runs of at least 4 blocks leave the 3-block holes that stand alone.
    let all = fs.trim(0, u64::MAX, 3 * bs).unwrap();
    let runs = free_runs(&free);
    let expect3: u64 = runs.iter().filter(|r| r.1 >= 3).map(|r| r.1).sum();
    assert_eq!(all, expect3 * bs);
    let expect4: u64 = runs.iter().filter(|r| r.1 >= 4).map(|r| r.1).sum();
    assert_eq!(fs.trim(0, u64::MAX, 4 * bs).unwrap(), expect4 * bs);
    assert!(expect4 < expect3, "some runs are exactly 3 blocks");
    assert_clean(&fs);
}

/// Consecutive free blocks as (start, len) runs.
fn free_runs(free: &[u64]) -> Vec<(u64, u64)> {
    let mut v: Vec<u64> = free.to_vec();
    v.sort_unstable();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for b in v {
        match runs.last_mut() {
            Some(r) if r.0 + r.1 == b => r.1 += 1,
            _ => runs.push((b, 1)),
        }
    }
    runs
}

/// A read-only mount refuses (EROFS), as a device opened read-only cannot discard.
#[test]
fn trim_on_a_read_only_mount_is_refused() {
    let clock = TestClock::new();
    let dev = new_dev(74);
    let fs = mount(&dev, opts(&clock));
    fs.set_read_only(true).unwrap();
    assert!(matches!(fs.trim(0, u64::MAX, 0), Err(FsError::ReadOnly)));
}
