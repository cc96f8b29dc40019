//! Delayed allocation (`space/delalloc.rs`): a buffered write into a hole only promises its
//! blocks; write back chooses, writes and maps them; everything that drops, maps or reads the
//! pages in between keeps the promise, the data and the block map in step.
#![allow(clippy::unwrap_used)]

use crate::fs::items::extent::Extent;
use crate::fs::tests::{assert_clean, mount, new_dev, BS};
use crate::fs::types::{Cred, FileAttr, ATTR_EXTSIZE};
use crate::fs::*;
use cilfs_device::CrashOptions;

const U: Cred = Cred::user(1000, 1000);
const B: u64 = BS as u64;

fn file(fs: &Fs, name: &[u8]) -> u64 {
    fs.mknod(U, ROOT_INO, name, items::inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino
}

fn extents(fs: &Fs, ino: u64) -> Vec<Extent> {
    let st = fs.read_state();
    crate::fs::space::map::extents_in(&mut fs.view(&st), ino, 0, u64::MAX >> 8).unwrap()
}

fn promised(fs: &Fs) -> u64 {
    fs.lock_busy().delalloc_blocks()
}

fn blocks(fs: &Fs, ino: u64) -> u64 {
    fs.getattr(ino).unwrap().blocks_512 / (B / 512)
}

/// A write into a hole maps nothing and runs no transaction; its blocks are promised (stat
/// and statfs count them), chosen contiguous at write back for the whole file, and mapped
/// written; the promise is then given back.
#[test]
fn a_write_into_a_hole_gets_its_blocks_at_write_back() {
    // Time stands still: no write moves the timestamps, which would log the inode.
    let clock = crate::fs::tests::TestClock::new();
    let o = FsOptions {
        clock: clock.clock(),
        ..FsOptions::default()
    };
    let fs = mount(&new_dev(1801), o);
    let f = file(&fs, b"f");
    let free = fs.statfs().bfree;
    let tx = fs.stats().transactions;
    for i in 0..40u64 {
        fs.write(U, f, i * B, &vec![i as u8 + 1; B as usize])
            .unwrap();
    }
    assert_eq!(fs.stats().transactions, tx, "no write ran a transaction");
    assert!(extents(&fs, f).is_empty());
    assert_eq!(promised(&fs), 40);
    assert_eq!(blocks(&fs, f), 40, "stat counts the promised blocks");
    assert_eq!(fs.statfs().bfree, free - 40, "statfs counts them as used");
    assert_eq!(fs.read(f, 39 * B, 2).unwrap(), vec![40u8; 2]);
    fs.fsync(f).unwrap();
    let e = extents(&fs, f);
    assert_eq!(e.len(), 1, "one contiguous run: {e:?}");
    assert!(!e[0].unwritten && e[0].len == 40);
    assert_eq!((promised(&fs), blocks(&fs, f)), (0, 40));
    assert_eq!(fs.read_state().cache.delalloc_of(f), 0);
    assert_clean(&fs);
}

/// A small fsync puts pages written into holes into the log with the mapping of their blocks,
/// in one transaction: mapped after their images, the allocation took them off the logged
/// path, and a read of the pages' blocks before the AIL wrote them found zeros.
#[test]
fn a_small_fsync_logs_new_blocks_with_their_mapping() {
    let fs = mount(&new_dev(1802), FsOptions::default());
    let f = file(&fs, b"f");
    let data: Vec<u8> = (0..5033u32).map(|i| (i % 251) as u8 + 1).collect();
    fs.write(U, f, 33212, &data).unwrap();
    fs.fsync(f).unwrap();
    assert!(
        fs.stats().data_logged_bytes > 0,
        "the fsync logged its data"
    );
    let _ = fs.write_state().cache.drop_range(f, 0, u64::MAX);
    assert_eq!(fs.read(f, 33212, 5033).unwrap(), data);
    // In place later, never overwritten by the logged images.
    fs.write(U, f, 33212, &vec![9u8; 5033]).unwrap();
    fs.sync().unwrap();
    fs.unmount().unwrap();
    assert_eq!(promised(&fs), 0);
}

/// Truncate, punch and the last release of an unlinked file drop pages that wait for blocks,
/// and give their promise back.
#[test]
fn dropped_pages_give_their_promise_back() {
    let fs = mount(&new_dev(1803), FsOptions::default());
    let free = fs.statfs().bfree;
    let f = file(&fs, b"f");
    fs.write(U, f, 0, &vec![1u8; 10 * B as usize]).unwrap();
    fs.truncate(U, f, 4 * B + 10).unwrap();
    assert_eq!(promised(&fs), 5);
    fs.fallocate(U, f, B, 2 * B, true, true).unwrap();
    assert_eq!(promised(&fs), 3, "the punched blocks' promise given back");
    let mut want = vec![1u8; 4 * B as usize + 10];
    want[B as usize..3 * B as usize].fill(0);
    assert_eq!(fs.read(f, 0, 5 * BS).unwrap(), want);
    let g = file(&fs, b"g");
    fs.open_inode(g).unwrap();
    fs.write(U, g, 0, &vec![2u8; 7 * B as usize]).unwrap();
    fs.unlink(ROOT_INO, b"g").unwrap();
    assert_eq!(promised(&fs), 10);
    fs.release_inode(g).unwrap();
    assert_eq!(promised(&fs), 3);
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(promised(&fs), 0);
    fs.sync().unwrap();
    assert_eq!(fs.statfs().bfree, free);
    assert_clean(&fs);
}

/// Space runs out at the write, not at its write back: the promises stop at the reserve, and
/// every promised page is written back whole.
#[test]
fn enospc_comes_at_the_write_and_write_back_always_finds_its_blocks() {
    let fs = mount(&new_dev(1804), FsOptions::default());
    let f = file(&fs, b"f");
    let chunk = vec![5u8; 16 * B as usize];
    let mut at = 0u64;
    let err = loop {
        match fs.write(U, f, at, &chunk) {
            Ok(_) => at += chunk.len() as u64,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, FsError::NoSpace), "{err:?}");
    assert!(at > 0);
    fs.sync().unwrap();
    assert_eq!(promised(&fs), 0);
    assert_eq!(blocks(&fs, f), at / B);
    let _ = fs.write_state().cache.drop_range(f, 0, u64::MAX);
    assert_eq!(fs.read(f, at - B, BS).unwrap(), vec![5u8; B as usize]);
    assert_clean(&fs);
}

/// What maps blocks under a file's pages writes them back first: fallocate keeps the written
/// data and leaves no page marked over a mapped block; SEEK_DATA finds the pages in holes.
#[test]
fn fallocate_and_seek_see_pages_that_wait_for_blocks() {
    let fs = mount(&new_dev(1805), FsOptions::default());
    let f = file(&fs, b"f");
    fs.write(U, f, 8 * B, &vec![3u8; 2 * B as usize]).unwrap();
    assert_eq!(fs.seek(f, 0, true).unwrap(), 8 * B);
    assert_eq!(fs.seek(f, 8 * B, false).unwrap(), 10 * B);
    fs.fallocate(U, f, 0, 16 * B, false, false).unwrap();
    assert_eq!(fs.read_state().cache.delalloc_of(f), 0);
    assert_eq!(promised(&fs), 0);
    assert_eq!(
        fs.read(f, 8 * B, 2 * BS).unwrap(),
        vec![3u8; 2 * B as usize]
    );
    assert_eq!(blocks(&fs, f), 16);
    assert_clean(&fs);
}

/// A file whose pages wait for blocks has data blocks, as XFS counts delayed ones: its
/// extent size hint stays.
#[test]
fn a_hint_stays_while_pages_wait_for_blocks() {
    let fs = mount(&new_dev(1806), FsOptions::default());
    let f = file(&fs, b"f");
    fs.write(U, f, 0, b"x").unwrap();
    let r = fs.set_file_attr(
        U,
        f,
        FileAttr {
            flags: ATTR_EXTSIZE,
            project: 0,
            extsize: 4 * BS,
        },
    );
    assert!(matches!(r, Err(FsError::Invalid(_))), "{r:?}");
}

/// A crash before write back shows the hole (and, in ordered mode, the size the log holds
/// stays at or below the first page that waits), never a block's old contents; what the
/// fsync covered survives.
#[test]
fn a_crash_before_write_back_shows_a_hole_or_the_old_size() {
    let dev = new_dev(1807);
    let fs = mount(&dev, FsOptions::default());
    let f = file(&fs, b"f");
    fs.write(U, f, 0, &vec![7u8; 3 * B as usize]).unwrap();
    fs.fsync(f).unwrap();
    // Old contents in free blocks the next allocation may take.
    let g = file(&fs, b"g");
    fs.write(U, g, 0, &vec![0xAB; 8 * B as usize]).unwrap();
    fs.fsync(g).unwrap();
    fs.unlink(ROOT_INO, b"g").unwrap();
    fs.sync().unwrap();
    fs.write(U, f, 3 * B, &vec![8u8; 5 * B as usize]).unwrap();
    // The size is logged by another change of the inode before any write back.
    fs.setattr(
        U,
        f,
        crate::fs::types::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    fs.journal.force_all().unwrap();
    let crashed = std::sync::Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, FsOptions::default());
    let size = fs.getattr(f).unwrap().size;
    assert!(size >= 3 * B, "the fsynced part: {size}");
    let got = fs.read(f, 0, 8 * BS).unwrap();
    assert_eq!(&got[..3 * B as usize], &vec![7u8; 3 * B as usize][..]);
    assert!(
        got[3 * B as usize..].iter().all(|&b| b == 8 || b == 0),
        "nothing but the new data or zeros past the fsynced part"
    );
    assert!(!got.contains(&0xAB), "no old contents");
    assert_clean(&fs);
}
