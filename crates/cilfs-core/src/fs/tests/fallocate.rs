//! fallocate's modes beyond preallocation and punched holes: zeroed ranges, collapsed and
//! inserted ranges (with their errors), across many extents and across crashes mid-shift.

use super::*;

const B: u64 = BS as u64;

/// Block `b`'s contents in the patterned files below: nonzero, and different from its
/// neighbours'.
fn pattern(b: u64) -> Vec<u8> {
    vec![(b % 250) as u8 + 1; BS as usize]
}

/// A file `name` with blocks `0..n` written with `pattern` where `keep(b)`, holes elsewhere;
/// the contents it should read. Written from the end, so no write appends and speculative
/// preallocation leaves the holes alone.
fn patterned(fs: &Fs, name: &[u8], n: u64, keep: impl Fn(u64) -> bool) -> (u64, Vec<u8>) {
    let f = file_in_root(fs, name);
    let mut want = vec![0u8; (n * B) as usize];
    for b in (0..n).rev().filter(|&b| keep(b)) {
        fs.write(U, f, b * B, &pattern(b)).unwrap();
        want[(b * B) as usize..((b + 1) * B) as usize].copy_from_slice(&pattern(b));
    }
    fs.setattr(
        U,
        f,
        SetAttr {
            size: Some(n * B),
            ..Default::default()
        },
    )
    .unwrap();
    (f, want)
}

fn contents(fs: &Fs, f: u64) -> Vec<u8> {
    let size = fs.getattr(f).unwrap().size;
    fs.read(f, 0, size as u32).unwrap()
}

fn blocks(fs: &Fs, f: u64) -> u64 {
    fs.getattr(f).unwrap().blocks_512 / (B / 512)
}

#[test]
fn zero_range_zeroes_preallocates_and_grows_unless_keep_size() {
    let clock = TestClock::new();
    let dev = new_dev(41);
    let fs = mount(&dev, opts(&clock));
    let (f, mut want) = patterned(&fs, b"z", 10, |_| true);
    // Partial blocks at both edges, two whole blocks between: still 10 blocks mapped.
    fs.zero_range(U, f, B + 100, 3 * B, true).unwrap();
    want[(B + 100) as usize..(4 * B + 100) as usize].fill(0);
    assert_eq!(contents(&fs, f), want);
    assert_eq!(blocks(&fs, f), 10);
    // Past the end with KEEP_SIZE: preallocated, the size kept.
    fs.zero_range(U, f, 20 * B, 2 * B, true).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 10 * B);
    assert_eq!(blocks(&fs, f), 12);
    // Across the end without it: the file grows to the range's end, zeros up to it.
    fs.zero_range(U, f, 10 * B - 10, B, false).unwrap();
    want.truncate((10 * B - 10) as usize);
    want.resize((11 * B - 10) as usize, 0);
    assert_eq!(contents(&fs, f), want);
    // Over a hole: allocated, reading zeros.
    let (g, _) = patterned(&fs, b"hole", 4, |b| b == 0);
    fs.zero_range(U, g, B, 2 * B + 5, true).unwrap();
    assert_eq!(blocks(&fs, g), 4);
    assert_eq!(
        contents(&fs, g)[B as usize..],
        vec![0u8; (3 * B) as usize][..]
    );
    // Errors: an empty range, a directory, a range past the largest file.
    assert!(matches!(
        fs.zero_range(U, f, 0, 0, false),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.zero_range(U, ROOT_INO, 0, B, false),
        Err(FsError::IsDir)
    ));
    assert!(matches!(
        fs.zero_range(U, f, u64::MAX - 10, 100, false),
        Err(FsError::TooBig)
    ));
    assert_clean(&fs);
    fs.unmount().unwrap();
    let fs = mount(&dev, opts(&clock));
    assert_eq!(contents(&fs, f), want);
    assert_clean(&fs);
}

#[test]
fn collapse_and_insert_move_the_data_after_the_range() {
    let clock = TestClock::new();
    let dev = new_dev(42);
    let fs = mount(&dev, opts(&clock));
    let (f, mut want) = patterned(&fs, b"c", 8, |_| true);
    // A partial last block: the end moves with it.
    let size = 8 * B - 100;
    fs.setattr(
        U,
        f,
        SetAttr {
            size: Some(size),
            ..Default::default()
        },
    )
    .unwrap();
    want.truncate(size as usize);
    fs.collapse_range(U, f, 2 * B, 3 * B).unwrap();
    want.drain((2 * B) as usize..(5 * B) as usize);
    assert_eq!(fs.getattr(f).unwrap().size, size - 3 * B);
    assert_eq!(contents(&fs, f), want);
    assert_eq!(blocks(&fs, f), 5);
    fs.insert_range(U, f, B, 2 * B).unwrap();
    want.splice(B as usize..B as usize, vec![0u8; (2 * B) as usize]);
    assert_eq!(contents(&fs, f), want);
    assert_eq!(blocks(&fs, f), 5, "an inserted range is a hole");
    // Errors, as Linux gives them.
    let inval = |r: FsResult<()>| matches!(r, Err(FsError::Invalid(_)));
    assert!(inval(fs.collapse_range(U, f, 100, B)), "unaligned offset");
    assert!(inval(fs.insert_range(U, f, B, 100)), "unaligned length");
    assert!(inval(fs.insert_range(U, f, B, 0)), "empty");
    let end = fs.getattr(f).unwrap().size.div_ceil(B) * B;
    assert!(inval(fs.collapse_range(U, f, end - B, B)), "to the end");
    assert!(inval(fs.insert_range(U, f, end, B)), "at the end");
    assert!(matches!(
        fs.collapse_range(U, ROOT_INO, 0, B),
        Err(FsError::IsDir)
    ));
    let max = items::extent::max_file_size(BS) / B * B;
    let (big, _) = patterned(&fs, b"big", 1, |_| true);
    fs.setattr(
        U,
        big,
        SetAttr {
            size: Some(max - B),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        fs.insert_range(U, big, 0, 2 * B),
        Err(FsError::TooBig)
    ));
    assert_eq!(contents(&fs, f), want, "a refused call changes nothing");
    assert_clean(&fs);
    fs.unmount().unwrap();
    let fs = mount(&dev, opts(&clock));
    assert_eq!(contents(&fs, f), want);
    assert_clean(&fs);
}

#[test]
fn shifts_of_many_extents_run_in_bounded_transactions() {
    let clock = TestClock::new();
    let dev = new_dev(43);
    let fs = mount(&dev, opts(&clock));
    // Every other block written: 75 extents that cannot merge.
    let (f, mut want) = patterned(&fs, b"m", 150, |b| b % 2 == 0);
    let tx0 = fs.stats().transactions;
    fs.collapse_range(U, f, 3 * B, 6 * B).unwrap();
    want.drain((3 * B) as usize..(9 * B) as usize);
    assert!(
        fs.stats().transactions - tx0 >= 18,
        "about 70 extents moved 4 at a time"
    );
    assert_eq!(contents(&fs, f), want);
    fs.insert_range(U, f, 10 * B, 4 * B).unwrap();
    want.splice(
        (10 * B) as usize..(10 * B) as usize,
        vec![0u8; (4 * B) as usize],
    );
    assert_eq!(contents(&fs, f), want);
    // An insert that splits an extent: its two halves move apart.
    fs.write(U, f, 0, &vec![9u8; (3 * B) as usize]).unwrap();
    want[..(3 * B) as usize].fill(9);
    fs.insert_range(U, f, B, B).unwrap();
    want.splice(B as usize..B as usize, vec![0u8; B as usize]);
    assert_eq!(contents(&fs, f), want);
    assert_clean(&fs);
    fs.unmount().unwrap();
    let fs = mount(&dev, opts(&clock));
    assert_eq!(contents(&fs, f), want);
    assert_clean(&fs);
}

/// A device that dies at each point of a collapse or an insert of many extents, on a `sync`
/// mount (every batch is forced, so every shift point is a state the log can hold): the
/// recovered file is clean, its size the old or the new one, and each block holds zeros or the
/// data that was at it before or that the shift moves to it.
#[test]
fn a_crash_mid_shift_leaves_a_clean_file_of_moved_and_unmoved_blocks() {
    for insert in [false, true] {
        let mut outcomes = std::collections::HashSet::new();
        for step in 0..24u64 {
            let clock = TestClock::new();
            let dev = new_dev(44);
            let o = FsOptions {
                sync: SyncMode::All,
                ..opts(&clock)
            };
            let fs = mount(&dev, o.clone());
            let n = 90;
            let (f, before) = patterned(&fs, b"s", n, |b| b % 3 != 2);
            fs.sync().unwrap();
            let (first, len) = (4, 5);
            dev.inject_fault(
                dev.op_count() + step * 3,
                cilfs_device::FaultMode::FromThenOn,
            );
            let r = if insert {
                fs.insert_range(U, f, first * B, len * B)
            } else {
                fs.collapse_range(U, f, first * B, len * B)
            };
            let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
            drop(fs);
            let fs = mount(&crashed, o);
            assert_clean(&fs);
            let size = fs.getattr(f).unwrap().size;
            let new = if insert { n + len } else { n - len } * B;
            assert!(size == n * B || size == new, "{insert} {step}: size {size}");
            if r.is_ok() {
                assert_eq!(size, new, "durable once it returned on a sync mount");
            }
            let got = fs.read(f, 0, size as u32).unwrap();
            let at = |b: u64| before.get((b * B) as usize..((b + 1) * B) as usize);
            for b in 0..size / B {
                let blk = &got[(b * B) as usize..((b + 1) * B) as usize];
                let moved_from = match (insert, b >= first) {
                    (false, true) => Some(b + len),
                    (true, true) if b >= first + len => Some(b - len),
                    _ => None,
                };
                let ok = blk.iter().all(|&x| x == 0)
                    || at(b) == Some(blk)
                    || moved_from.and_then(at) == Some(blk);
                assert!(
                    ok,
                    "insert {insert} step {step}: block {b} holds stray data"
                );
            }
            outcomes.insert(got);
        }
        // Before, after, and states between them (the range unmapped, batches moved).
        assert!(
            outcomes.len() >= 4,
            "insert {insert}: {} outcomes",
            outcomes.len()
        );
    }
}

/// fsx on the core, where collapse and insert are reached (Linux's FUSE refuses them before
/// the daemon; `crates/cilfs/tests/mount_fsx.rs` is the same through a mount): random writes,
/// truncates and every fallocate mode on one file against a copy in memory, compared after
/// each operation, checked and remounted now and then. `CILFS_FSX_OPS` sets the length
/// (default 1500), `CILFS_FSX_SEED` the seed.
#[test]
fn fsx_on_the_core_with_every_mode() {
    let env = |n: &str, d: u64| {
        std::env::var(n)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (ops, seed) = (env("CILFS_FSX_OPS", 1500), env("CILFS_FSX_SEED", 1));
    let clock = TestClock::new();
    let dev = new_dev(45);
    let mut fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"fsx");
    let mut rng = cilfs_device::rng::SimRng::new(seed);
    let mut want: Vec<u8> = Vec::new();
    let max = 128 * 1024;
    let mut shifts = 0;
    for i in 0..ops {
        let size = want.len() as u64;
        let off = rng.below((size + 8 * B).min(max));
        let len = 1 + rng.below(16 * 1024);
        let (end, sz) = (off + len, size as usize);
        match rng.below(10) {
            0..=3 if end <= max => {
                let data = vec![(i % 250) as u8 + 1; len as usize];
                fs.write(U, f, off, &data).unwrap();
                want.resize(want.len().max(end as usize), 0);
                want[off as usize..end as usize].copy_from_slice(&data);
            }
            4 => {
                let to = rng.below(max);
                fs.setattr(
                    U,
                    f,
                    SetAttr {
                        size: Some(to),
                        ..Default::default()
                    },
                )
                .unwrap();
                want.resize(to as usize, 0);
            }
            5 if end <= max => {
                let keep = rng.bool();
                fs.zero_range(U, f, off, len, keep).unwrap();
                want[off.min(size) as usize..(end as usize).min(sz)].fill(0);
                if !keep {
                    want.resize(want.len().max(end as usize), 0);
                }
            }
            6 => {
                fs.fallocate(U, f, off, len, true, true).unwrap();
                want[off.min(size) as usize..(end as usize).min(sz)].fill(0);
            }
            7 if end <= max => {
                let keep = rng.bool();
                fs.fallocate(U, f, off, len, keep, false).unwrap();
                if !keep {
                    want.resize(want.len().max(end as usize), 0);
                }
            }
            8 | 9 => {
                let (o, l) = (off / B * B, len.div_ceil(B) * B);
                if rng.below(2) == 0 {
                    let r = fs.collapse_range(U, f, o, l);
                    if o + l >= size {
                        assert!(matches!(r, Err(FsError::Invalid(_))), "op {i}: {r:?}");
                    } else {
                        r.unwrap();
                        want.drain(o as usize..(o + l) as usize);
                        shifts += 1;
                    }
                } else if size + l <= max {
                    let r = fs.insert_range(U, f, o, l);
                    if o >= size {
                        assert!(matches!(r, Err(FsError::Invalid(_))), "op {i}: {r:?}");
                    } else {
                        r.unwrap();
                        want.splice(o as usize..o as usize, vec![0u8; l as usize]);
                        shifts += 1;
                    }
                }
            }
            _ => {}
        }
        assert_eq!(contents(&fs, f), want, "op {i}");
        if i % 500 == 499 {
            assert_clean(&fs);
            fs.unmount().unwrap();
            drop(fs);
            fs = mount(&dev, opts(&clock));
            assert_eq!(contents(&fs, f), want, "op {i}, after a remount");
        }
    }
    assert_clean(&fs);
    assert!(shifts > ops / 20, "only {shifts} collapses and inserts");
}
