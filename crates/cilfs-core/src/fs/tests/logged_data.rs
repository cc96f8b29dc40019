//! Logged data: an fsync of a few dirty pages puts them into the log with its checkpoint (one
//! log write, no data-device flush), the AIL writes them in place later, reads see them
//! meanwhile, a block the log holds is written only through the log until a cover, and a
//! freed one is cancelled so no image of it lands on its next owner.

use super::*;
use crate::fs::items::extent::Extent;
use crate::fs::space::map::extents_in;

const B: u64 = BS as u64;

fn extents(fs: &Fs, ino: u64) -> Vec<Extent> {
    let st = fs.read_state();
    let mut v = fs.view(&st);
    extents_in(&mut v, ino, 0, crate::fs::tree::keys::OFFSET_MAX).unwrap()
}

/// The disk block of file block `fb`.
fn disk_of(fs: &Fs, ino: u64, fb: u64) -> u64 {
    let e = extents(fs, ino)
        .into_iter()
        .find(|e| e.file <= fb && fb < e.end())
        .expect("mapped");
    e.disk + (fb - e.file)
}

/// The filesystem a crash of `dev` now leaves, recovered (volatile writes lost, kept and, if
/// `torn`, torn).
fn recovered(dev: &SimDevice, torn: bool) -> Arc<Fs> {
    mount(
        &Arc::new(dev.crash(CrashOptions { torn_writes: torn })),
        FsOptions::default(),
    )
}

fn log_data_max(bytes: u64) -> FsOptions {
    FsOptions {
        log_data_max: bytes,
        ..FsOptions::default()
    }
}

/// Flushes a loop device pays for what happened since `before`: explicit flushes and
/// PREFLUSHes issued, and FUA writes (which it emulates with a flush).
fn flushes_since(dev: &SimDevice, before: cilfs_device::IoStats) -> u64 {
    let s = dev.stats();
    (s.flushes_issued - before.flushes_issued) + (s.fua_writes - before.fua_writes)
}

/// A new file's few blocks, fsynced: into the log, one FUA write and no flush; with the
/// logged path off the same fsync writes the data first and flushes it before the commit.
/// Both come back after a crash.
#[test]
fn a_small_fsync_logs_its_data_and_costs_one_flush() {
    for (max, logged, flushes) in [(DEFAULT_LOG_DATA_MAX, 3 * B, 1), (0, 0, 2)] {
        let dev = new_dev(71);
        let fs = mount(&dev, log_data_max(max));
        let f = file_in_root(&fs, b"f");
        fs.sync().unwrap();
        let data: Vec<u8> = (0..3 * B).map(|i| (i % 251) as u8 + 1).collect();
        fs.write(U, f, 0, &data).unwrap();
        let (before, logged0) = (dev.stats(), fs.stats().data_logged_bytes);
        fs.fsync(f).unwrap();
        assert_eq!(fs.stats().data_logged_bytes - logged0, logged);
        assert_eq!(flushes_since(&dev, before), flushes, "logged {logged}");
        let back = recovered(&dev, true);
        assert_eq!(back.read(f, 0, 3 * BS).unwrap(), data);
        assert!(extents(&back, f).iter().all(|e| !e.unwritten));
        assert_clean(&back);
    }
}

/// The block's newest bytes are its buffer's until the AIL wrote them: a read once the page
/// is gone is served from there, not from the device.
#[test]
fn a_logged_block_reads_from_its_buffer_until_written_back() {
    let dev = new_dev(72);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[0x5A; BS as usize]).unwrap();
    fs.fsync(f).unwrap();
    let disk = disk_of(&fs, f, 0);
    assert!(fs.journal().is_logged_data(disk));
    let mut raw = vec![0u8; BS as usize];
    dev.read(disk * B, &mut raw).unwrap();
    assert_ne!(raw, vec![0x5A; BS as usize], "not written in place yet");
    fs.drop_pages(&fs.write_state(), f, 0, u64::MAX);
    assert_eq!(fs.read(f, 0, BS).unwrap(), vec![0x5A; BS as usize]);
    // A clean unmount writes it back.
    fs.unmount().unwrap();
    dev.read(disk * B, &mut raw).unwrap();
    assert_eq!(raw, vec![0x5A; BS as usize]);
}

/// An overwrite of a block the log holds goes through the log too, even from a write back
/// that is not an fsync's: written in place, the replay of the older image would undo it.
#[test]
fn an_overwrite_of_a_logged_block_is_logged_and_its_newest_image_survives() {
    let dev = new_dev(73);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[0x11; BS as usize]).unwrap();
    fs.fsync(f).unwrap();
    let disk = disk_of(&fs, f, 0);
    let logged0 = fs.stats().data_logged_bytes;
    fs.write(U, f, 0, &[0x22; BS as usize]).unwrap();
    fs.writeback_all().unwrap();
    assert_eq!(fs.stats().data_logged_bytes - logged0, B, "logged again");
    fs.fsync(f).unwrap();
    assert_eq!(disk_of(&fs, f, 0), disk);
    // fdatasync of a third overwrite: its image must be forced too.
    fs.write(U, f, 0, &[0x33; BS as usize]).unwrap();
    fs.fdatasync(f).unwrap();
    let back = recovered(&dev, true);
    assert_eq!(back.read(f, 0, BS).unwrap(), vec![0x33; BS as usize]);
    assert_clean(&back);
}

/// A freed block the log holds is cancelled: when a direct write puts another file's data
/// in place there, neither the AIL nor a recovery brings the old image back over it.
#[test]
fn a_freed_logged_block_is_cancelled_before_its_next_owner_writes_it() {
    let dev = new_dev(74);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"old");
    fs.write(U, f, 0, &[0x0D; BS as usize]).unwrap();
    fs.fsync(f).unwrap();
    let disk = disk_of(&fs, f, 0);
    assert!(fs.journal().is_logged_data(disk));
    fs.unlink(ROOT_INO, b"old").unwrap();
    fs.sync().unwrap();
    // Direct writes until the freed block is the new file's.
    let g = file_in_root(&fs, b"new");
    let chunk = 64u64;
    let mut at = 0;
    while !extents(&fs, g)
        .iter()
        .any(|e| e.disk <= disk && disk < e.disk + e.len)
    {
        fs.write_direct(U, g, at * B, &vec![0x77; (chunk * B) as usize])
            .unwrap();
        at += chunk;
        assert!(at < BLOCKS, "block {disk} never reused");
    }
    let fb = extents(&fs, g)
        .iter()
        .find(|e| e.disk <= disk && disk < e.disk + e.len)
        .map(|e| e.file + (disk - e.disk))
        .unwrap();
    fs.fsync(g).unwrap();
    assert_eq!(fs.read(g, fb * B, BS).unwrap(), vec![0x77; BS as usize]);
    let back = recovered(&dev, false);
    assert_eq!(back.read(g, fb * B, BS).unwrap(), vec![0x77; BS as usize]);
    assert_clean(&back);
}

/// Appends fsynced one block at a time: the first go into the log, up to the inode's share;
/// the rest go in place. A truncate to zero then cancels every logged block in its batches
/// (its reservation holds them), and a crash at any fsync keeps every fsynced block.
#[test]
fn appends_past_the_inodes_share_go_in_place_and_a_truncate_cancels_the_rest() {
    let dev = new_dev(75);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"log");
    let share = fs.logged_blocks_per_inode() as u64;
    assert!(share >= 4, "a share of {share} blocks on the test log");
    let n = share + 8;
    let block = |i: u64| vec![(i % 250) as u8 + 1; BS as usize];
    let mut crashes = Vec::new();
    for i in 0..n {
        fs.write(U, f, i * B, &block(i)).unwrap();
        fs.fsync(f).unwrap();
        if i % 5 == 4 {
            crashes.push((i + 1, dev.crash(CrashOptions { torn_writes: true })));
        }
    }
    assert_eq!(fs.journal().logged_data_of(f), share as usize);
    assert_eq!(fs.stats().data_logged_bytes, share * B);
    for (synced, c) in crashes {
        let back = mount(&Arc::new(c), FsOptions::default());
        for i in 0..synced {
            assert_eq!(back.read(f, i * B, BS).unwrap(), block(i), "block {i}");
        }
        assert_clean(&back);
    }
    fs.setattr(
        U,
        f,
        SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 0);
    assert_clean(&fs);
}

/// A cover (everything written back, a record whose tail is itself) leaves no image to
/// replay: the block leaves the logged path and its next write back goes in place.
#[test]
fn a_cover_lets_a_logged_block_go_in_place_again() {
    let dev = new_dev(76);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[0x44; BS as usize]).unwrap();
    fs.fsync(f).unwrap();
    let disk = disk_of(&fs, f, 0);
    assert!(fs.journal().is_logged_data(disk));
    assert!(fs.journal().cover().unwrap());
    assert!(!fs.journal().is_logged_data(disk));
    let logged0 = fs.stats().data_logged_bytes;
    fs.write(U, f, 0, &[0x55; BS as usize]).unwrap();
    fs.writeback_all().unwrap();
    assert_eq!(fs.stats().data_logged_bytes, logged0, "written in place");
    fs.fsync(f).unwrap();
    let back = recovered(&dev, true);
    assert_eq!(back.read(f, 0, BS).unwrap(), vec![0x55; BS as usize]);
    assert_clean(&back);
}

/// Blocks of many small files, logged, freed and then given to one large file leave the
/// logged path when they are allocated again: truncating the large file cancels none of
/// them, where cancelling every one in its batches would pass the log's largest reservation.
#[test]
fn blocks_allocated_again_leave_the_logged_path() {
    let dev = new_dev(77);
    let fs = mount(&dev, FsOptions::default());
    let files = 300u64;
    for i in 0..files {
        let f = file_in_root(&fs, format!("s{i}").as_bytes());
        fs.write(U, f, 0, &[0x61; BS as usize]).unwrap();
        fs.fsync(f).unwrap();
    }
    assert!(fs.stats().data_logged_bytes >= files * B);
    for i in 0..files {
        fs.unlink(ROOT_INO, format!("s{i}").as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    let big = file_in_root(&fs, b"big");
    let len = 4096 * B;
    for at in (0..len).step_by((256 * B) as usize) {
        fs.write_direct(U, big, at, &vec![0x62; (256 * B) as usize])
            .unwrap();
    }
    let logged_in_big: usize = extents(&fs, big)
        .iter()
        .map(|e| fs.journal().logged_data_in(e.disk, e.disk + e.len).len())
        .sum();
    assert_eq!(
        logged_in_big, 0,
        "allocated blocks still on the logged path"
    );
    fs.setattr(
        U,
        big,
        SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    fs.fsync(big).unwrap();
    let back = recovered(&dev, true);
    assert_eq!(back.getattr(big).unwrap().size, 0);
    assert_clean(&back);
}
