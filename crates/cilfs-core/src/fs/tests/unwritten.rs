//! Unwritten extents: preallocation (fallocate, and the blocks appends map past the end)
//! writes nothing, reads as zeros whatever its blocks held, and becomes written only after the
//! data IO that fills it, so no crash shows a block's old contents.

use super::*;
use crate::fs::items::extent::Extent;
use crate::fs::space::map::extents_in;
use cilfs_device::{RecordedOp, RecordingDevice, SparseImage, Survival};

const B: u64 = BS as u64;

/// Block `b` of an old file: nonzero, and no new data below uses byte 0xEE.
fn old_block(b: u64) -> Vec<u8> {
    vec![(b % 200) as u8 + 1; BS as usize]
}

fn extents(fs: &Fs, ino: u64) -> Vec<Extent> {
    let st = fs.read_state();
    let mut v = fs.view(&st);
    extents_in(&mut v, ino, 0, crate::fs::tree::keys::OFFSET_MAX).unwrap()
}

/// Disk blocks a file's extents cover.
fn disk_blocks(exts: &[Extent]) -> std::collections::BTreeSet<u64> {
    exts.iter().flat_map(|e| e.disk..e.disk + e.len).collect()
}

/// A file of `n` blocks of `old_block`, fsynced, then unlinked and its frees made stable: its
/// blocks are free and still hold its data. Their disk numbers.
fn freed_old_file(fs: &Fs, n: u64) -> std::collections::BTreeSet<u64> {
    let f = file_in_root(fs, b"old");
    for b in (0..n).rev() {
        fs.write(U, f, b * B, &old_block(b)).unwrap();
    }
    fs.fsync(f).unwrap();
    let blocks = disk_blocks(&extents(fs, f));
    assert_eq!(blocks.len() as u64, n);
    fs.unlink(ROOT_INO, b"old").unwrap();
    fs.sync().unwrap();
    blocks
}

/// Whether `got` holds any byte of an old block where it should not (old blocks' bytes are
/// 1..=200, new data here is 0xEE and zeros).
fn shows_old_data(got: &[u8]) -> bool {
    got.iter().any(|&x| x != 0 && x != 0xEE)
}

#[test]
fn fallocated_blocks_read_zeros_and_are_not_written() {
    let clock = TestClock::new();
    let dev = new_dev(61);
    let fs = mount(&dev, opts(&clock));
    let old = freed_old_file(&fs, 64);
    let f = file_in_root(&fs, b"new");
    fs.fallocate(U, f, 0, 256 * B, false, false).unwrap();
    let exts = extents(&fs, f);
    assert!(exts.iter().all(|e| e.unwritten), "{exts:?}");
    let mine = disk_blocks(&exts);
    let reused: Vec<u64> = mine.intersection(&old).copied().collect();
    assert!(
        !reused.is_empty(),
        "the old file's blocks are preallocated again"
    );
    fs.sync().unwrap();
    // Nothing written to them: the device still holds the old data there.
    let mut raw = vec![0u8; BS as usize];
    dev.read(reused[0] * B, &mut raw).unwrap();
    assert!(shows_old_data(&raw), "a preallocated block was written");
    let got = fs.read(f, 0, (256 * B) as u32).unwrap();
    assert_eq!(
        got,
        vec![0u8; (256 * B) as usize],
        "an unwritten block read its old data"
    );
    // A write into the middle: in the page cache, then on disk and marked written.
    fs.write(U, f, 10 * B + 100, &[0xEE; 3000]).unwrap();
    fs.fsync(f).unwrap();
    let exts = extents(&fs, f);
    let written: u64 = exts.iter().filter(|e| !e.unwritten).map(|e| e.len).sum();
    assert_eq!(
        written, 2,
        "the two blocks written, and only they: {exts:?}"
    );
    assert_eq!(fs.getattr(f).unwrap().blocks_512, 256 * B / 512);
    let mut want = vec![0u8; (256 * B) as usize];
    want[(10 * B + 100) as usize..(10 * B + 3100) as usize].fill(0xEE);
    assert_eq!(fs.read(f, 0, (256 * B) as u32).unwrap(), want);
    assert_clean(&fs);
    // And after a crash, from the log.
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert_eq!(fs.read(f, 0, (256 * B) as u32).unwrap(), want);
    assert_clean(&fs);
}

/// Writes into unwritten blocks, crashed at every moment of their write back (every prefix of
/// the device's operations, unflushed writes lost): a block reads as its new data or as zeros,
/// never as what it held before; after the fsync returned, as its new data.
#[test]
fn a_crash_during_write_back_into_preallocation_never_shows_old_data() {
    let clock = TestClock::new();
    let base = new_dev(62);
    let len = BLOCKS * B;
    let fs = mount(&base, opts(&clock));
    freed_old_file(&fs, 64);
    let f = file_in_root(&fs, b"new");
    // The size covers all of it: every unwritten block is read below.
    fs.fallocate(U, f, 0, 64 * B, false, false).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let image: SparseImage = base.live_image();
    let rec = Arc::new(RecordingDevice::new(
        SimDevice::from_image(image.clone(), len, 62),
        image,
    ));
    let j = Journal::open(rec.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    let fs = Fs::open(j, opts(&clock)).unwrap();
    // Writes over the preallocated blocks: every one lands in the page cache.
    for b in 0..48 {
        fs.write(U, f, b * B, &[0xEE; BS as usize]).unwrap();
    }
    let before_fsync = rec.op_count();
    fs.fsync(f).unwrap();
    let synced = rec.op_count();
    drop(fs);
    let mut checked = 0;
    for n in before_fsync..=synced {
        // Writes still volatile at the crash: all lost, all kept, or every other one kept.
        for fate in 0..3 {
            let mut choose = |i: usize, _| match (fate, i % 2) {
                (0, _) | (2, 1) => Survival::Lost,
                _ => Survival::Kept,
            };
            let image = rec.crash_image(n, &mut choose);
            let dev = Arc::new(SimDevice::from_image(image, len, 1));
            let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
            let fs = Fs::open(j, opts(&clock)).unwrap();
            let size = fs.getattr(f).unwrap().size;
            let got = fs.read(f, 0, (64 * B) as u32).unwrap();
            assert!(
                !shows_old_data(&got),
                "crash after {n} ops ({fate}): old data shows"
            );
            assert_eq!(size, 64 * B);
            if n == synced {
                let mut want = vec![0xEE; (48 * B) as usize];
                want.resize((64 * B) as usize, 0);
                assert_eq!(got, want, "fsynced data");
            }
            assert_clean(&fs);
            checked += 1;
        }
    }
    assert!(checked > 3, "crash points explored: {checked}");
}

/// Appends grow a file through speculative preallocation (`nodelalloc`) or delayed
/// allocation: each block is written to the device once (before unwritten extents,
/// preallocated blocks were zeroed, then written again).
#[test]
fn appends_write_each_data_block_once() {
    appends_write_each_data_block_once_with(false);
    appends_write_each_data_block_once_with(true);
}

fn appends_write_each_data_block_once_with(delalloc: bool) {
    let clock = TestClock::new();
    let dev = new_dev(63);
    let len = BLOCKS * B;
    let image = dev.live_image();
    let rec = Arc::new(RecordingDevice::new(
        SimDevice::from_image(image.clone(), len, 63),
        image,
    ));
    let j = Journal::open(rec.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    let fs = Fs::open(
        j,
        FsOptions {
            delalloc,
            ..opts(&clock)
        },
    )
    .unwrap();
    let f = file_in_root(&fs, b"appended");
    fs.open_inode(f).unwrap();
    for b in 0..600 {
        fs.write(U, f, b * B, &[0xEE; BS as usize]).unwrap();
    }
    fs.fsync(f).unwrap();
    let exts = extents(&fs, f);
    if delalloc {
        // Their blocks chosen together at write back, and mapped written.
        assert!(
            exts.len() <= 2 && exts.iter().all(|e| !e.unwritten),
            "appends allocated at write back: {exts:?}"
        );
    } else {
        assert!(
            exts.iter().any(|e| e.unwritten),
            "appends preallocated past the end: {exts:?}"
        );
    }
    let mine = disk_blocks(&exts);
    let mut written_to_file = 0u64;
    for op in rec.ops() {
        if let RecordedOp::Write { offset, data, .. } = op {
            let first = offset / B;
            let n = data.len() as u64 / B;
            written_to_file += (first..first + n).filter(|b| mine.contains(b)).count() as u64;
        }
    }
    assert_eq!(written_to_file, 600, "block writes into the file's blocks");
    fs.release_inode(f).unwrap();
    assert!(extents(&fs, f).iter().all(|e| !e.unwritten));
    assert_eq!(
        fs.read(f, 0, (600 * B) as u32).unwrap(),
        vec![0xEE; (600 * B) as usize]
    );
    assert_clean(&fs);
}

/// An O_DIRECT write is on the device when it returns: no dirty page left, its blocks
/// written, and the device holding its data (a write into the page cache leaves none there).
#[test]
fn a_direct_write_reaches_the_device_before_it_returns() {
    let clock = TestClock::new();
    let dev = new_dev(64);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"direct");
    let g = file_in_root(&fs, b"buffered");
    fs.write_direct(U, f, 0, &[0xEE; 3 * BS as usize]).unwrap();
    fs.write(U, g, 0, &[0xEE; 3 * BS as usize]).unwrap();
    let on_device = |ino: u64| {
        let exts = extents(&fs, ino);
        let mut raw = vec![0u8; BS as usize];
        dev.read(exts[0].disk * B, &mut raw).unwrap();
        (
            raw == vec![0xEE; BS as usize],
            exts.iter().all(|e| !e.unwritten),
        )
    };
    assert_eq!(
        on_device(f),
        (true, true),
        "the direct write's data and extent"
    );
    assert!(
        extents(&fs, g).is_empty(),
        "a buffered write into a hole waits in the page cache for its blocks"
    );
    assert_eq!(fs.read_state().cache.delalloc_of(g), 3);
    assert!(fs.read_state().cache.dirty_blocks(f).is_empty());
    assert_eq!(fs.read(f, 0, BS).unwrap(), vec![0xEE; BS as usize]);
    assert_clean(&fs);
}

/// SEEK_DATA passes over unwritten blocks and SEEK_HOLE stops at them, as on XFS, except
/// where a page holds data written into them that write back has not converted yet; once it
/// has, they are written extents and data either way.
#[test]
fn seek_takes_unwritten_blocks_as_holes_unless_a_page_holds_their_data() {
    let dev = new_dev(61);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"f");
    fs.fallocate(U, f, 0, 16 * B, false, false).unwrap();
    assert!(extents(&fs, f).iter().all(|e| e.unwritten));
    assert!(matches!(fs.seek(f, 0, true), Err(FsError::NoData)));
    assert_eq!(fs.seek(f, 0, false).unwrap(), 0);
    // Block 5 written: a page, its extent still unwritten until write back.
    fs.write(U, f, 5 * B, &vec![0xEE; BS as usize]).unwrap();
    assert!(extents(&fs, f)
        .iter()
        .any(|e| e.unwritten && e.file <= 5 && 5 < e.end()));
    assert_eq!(fs.seek(f, 0, true).unwrap(), 5 * B);
    assert_eq!(fs.seek(f, 5 * B, false).unwrap(), 6 * B);
    assert_eq!(fs.seek(f, 3 * B + 7, false).unwrap(), 3 * B + 7);
    fs.fsync(f).unwrap();
    let written: Vec<_> = extents(&fs, f)
        .into_iter()
        .filter(|e| !e.unwritten)
        .map(|e| (e.file, e.end()))
        .collect();
    assert_eq!(written, vec![(5, 6)]);
    // The pages may go: the extent itself says data now.
    fs.drop_pages(&fs.write_state(), f, 0, u64::MAX);
    assert_eq!(fs.seek(f, 0, true).unwrap(), 5 * B);
    assert_eq!(fs.seek(f, 5 * B, false).unwrap(), 6 * B);
    assert!(matches!(fs.seek(f, 6 * B, true), Err(FsError::NoData)));
}

/// Direct appends write their new blocks in place before the one transaction that maps them
/// written: a commit per request, no page cached, each byte written to the device once, no
/// preallocation. A crash at any moment shows a file whose every byte below its size is
/// one that was written (the mapping never reaches the log ahead of the data).
#[test]
fn direct_appends_commit_once_each_cache_nothing_and_survive_crashes() {
    let dev = new_dev(65);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"direct");
    fs.sync().unwrap();
    let chunk = |i: u64| -> Vec<u8> { vec![(i % 250) as u8 + 1; 16 * BS as usize] };
    let j = Arc::clone(fs.journal());
    let (commits0, bytes0) = (j.extra.commits.get(), fs.stats().data_write_bytes);
    let n = 24u64;
    let mut crashed = Vec::new();
    for i in 0..n {
        fs.write_direct(U, f, i * 16 * B, &chunk(i)).unwrap();
        if i % 6 == 5 {
            crashed.push(dev.crash(CrashOptions { torn_writes: true }));
        }
    }
    assert_eq!(j.extra.commits.get() - commits0, n, "one commit a request");
    assert_eq!(fs.stats().data_write_bytes - bytes0, n * 16 * B);
    assert!(!fs.read_state().cache.has_pages(f), "nothing cached");
    let a = fs.getattr(f).unwrap();
    assert_eq!(a.size, n * 16 * B);
    assert_eq!(
        a.blocks_512,
        n * 16 * B / 512,
        "no preallocation past the end"
    );
    for c in crashed {
        let back = mount(&Arc::new(c), FsOptions::default());
        let size = back.getattr(f).unwrap().size;
        let data = back.read(f, 0, size as u32).unwrap();
        for (i, piece) in data.chunks(16 * BS as usize).enumerate() {
            assert_eq!(
                piece,
                &chunk(i as u64)[..piece.len()],
                "chunk {i} of {size} bytes"
            );
        }
        assert_clean(&back);
    }
}
