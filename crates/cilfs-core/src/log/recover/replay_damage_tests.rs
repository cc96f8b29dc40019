//! Replay against damaged blocks: a block damaged on disk outside the ranges its log items hold
//! is named and left failing its read check, never resealed as good; a torn write back, whose
//! stale sectors the later items cover, is not taken for damage.

#![allow(clippy::unwrap_used)]

use super::{replay, Checkpoint, ReplayTarget};
use crate::log::item_format::{decode_item, encode_buf_item};
use crate::log::stamp::{read_lsn_stamp, write_lsn_stamp};
use crate::log::Lsn;
use cilfs_device::{Device, SimDevice, WriteFlags};

const BS: usize = 4096;
const BLK: u64 = 3;
const STAMP: u16 = 4000;
const UUID: [u8; 16] = [9; 16];

/// A node-like block: `fill` everywhere, stamped at `lsn`.
fn block(fill: u8, lsn: Lsn) -> Vec<u8> {
    let mut b = vec![fill; BS];
    write_lsn_stamp(&mut b, STAMP, lsn, &UUID);
    b
}

/// A checkpoint logging `ranges` of `image` for `BLK`.
fn checkpoint(seq: u64, start: Lsn, image: &[u8], ranges: &[(u32, u32)]) -> Checkpoint {
    let raw = encode_buf_item(BLK, false, Some(STAMP), image, ranges);
    Checkpoint {
        seq,
        start,
        commit: start,
        items: vec![decode_item(&raw, BS as u32).unwrap()],
    }
}

fn target(dev: &SimDevice) -> ReplayTarget<'_> {
    ReplayTarget {
        dev,
        block_size: BS as u32,
        first_block: 1,
        end_block: 16,
        uuid: UUID,
    }
}

fn on_disk(dev: &SimDevice) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    dev.read(BLK * BS as u64, &mut b).unwrap();
    b
}

/// The block as written back at lsn 1:0, then one checkpoint changing bytes 100..200.
fn setup() -> (SimDevice, Vec<u8>, Checkpoint) {
    let dev = SimDevice::new(16 * BS as u64, 1);
    let old = block(0x11, Lsn::new(1, 0));
    dev.write(BLK * BS as u64, &old, WriteFlags::FUA).unwrap();
    let mut new = old.clone();
    new[100..200].fill(0x22);
    let ck = checkpoint(1, Lsn::new(1, 8), &new, &[(100, 100)]);
    (dev, new, ck)
}

#[test]
fn an_intact_block_replays_and_is_sealed() {
    let (dev, new, ck) = setup();
    let stats = replay(&[ck], &target(&dev)).unwrap();
    assert!(stats.damaged.is_empty(), "{:?}", stats.damaged);
    let back = on_disk(&dev);
    assert_eq!(read_lsn_stamp(&back, STAMP, &UUID), Some(Lsn::new(1, 8)));
    assert_eq!(back[..STAMP as usize], new[..STAMP as usize]);
}

#[test]
fn damage_outside_the_logged_ranges_is_named_and_left_failing_its_check() {
    let (dev, _, ck) = setup();
    // One bit flipped on disk where no logged range reaches.
    let mut disk = on_disk(&dev);
    disk[3000] ^= 0x04;
    dev.write(BLK * BS as u64, &disk, WriteFlags::FUA).unwrap();
    let stats = replay(&[ck], &target(&dev)).unwrap();
    assert_eq!(stats.damaged.len(), 1);
    assert_eq!(stats.damaged[0].blkno, BLK);
    assert_eq!(stats.damaged[0].checkpoint, 1);
    assert!(stats.damaged[0].to_string().contains("metadata block 3"));
    let back = on_disk(&dev);
    assert_eq!(back[100], 0x22, "the logged change is still applied");
    assert_eq!(
        read_lsn_stamp(&back, STAMP, &UUID),
        None,
        "a damaged block must not be resealed with a valid CRC"
    );
}

#[test]
fn damage_a_later_item_overwrites_is_not_reported() {
    let (dev, new, ck1) = setup();
    let mut disk = on_disk(&dev);
    disk[150] ^= 0x04;
    dev.write(BLK * BS as u64, &disk, WriteFlags::FUA).unwrap();
    // Inside the logged range: the replayed bytes replace the damaged ones.
    let mut newer = new.clone();
    newer[300..310].fill(0x33);
    let ck2 = checkpoint(2, Lsn::new(1, 16), &newer, &[(100, 100), (300, 10)]);
    let stats = replay(&[ck1, ck2], &target(&dev)).unwrap();
    assert!(stats.damaged.is_empty(), "{:?}", stats.damaged);
    assert_eq!(
        read_lsn_stamp(&on_disk(&dev), STAMP, &UUID),
        Some(Lsn::new(1, 16))
    );
}

/// A write back of the first checkpoint's image, torn (its first sector new, the rest old),
/// with a second checkpoint logging only what changed after that write back began: after the
/// first item the block is a mix, after the second it is whole again.
#[test]
fn a_torn_write_back_is_not_damage() {
    let dev = SimDevice::new(16 * BS as u64, 1);
    let old = block(0x11, Lsn::new(1, 0));
    let mut a = old.clone();
    a[100..200].fill(0x22);
    a[1000..1100].fill(0x22);
    let ck1 = checkpoint(1, Lsn::new(1, 8), &a, &[(100, 100), (1000, 100)]);
    let mut written = a.clone();
    write_lsn_stamp(&mut written, STAMP, Lsn::new(1, 8), &UUID);
    let mut torn = old.clone();
    torn[..512].copy_from_slice(&written[..512]);
    dev.write(BLK * BS as u64, &torn, WriteFlags::FUA).unwrap();
    let mut b = a.clone();
    b[2000..2010].fill(0x44);
    let ck2 = checkpoint(2, Lsn::new(1, 16), &b, &[(2000, 10)]);
    let stats = replay(&[ck1, ck2], &target(&dev)).unwrap();
    assert!(stats.damaged.is_empty(), "{:?}", stats.damaged);
    let back = on_disk(&dev);
    assert_eq!(read_lsn_stamp(&back, STAMP, &UUID), Some(Lsn::new(1, 16)));
    assert_eq!(back[..STAMP as usize], b[..STAMP as usize]);
}

/// Items from a binary that logged no content CRC replay as before, unchecked.
#[test]
fn items_without_a_content_crc_replay_unchecked() {
    let (dev, _, mut ck) = setup();
    ck.items[0].content_crc = None;
    let mut disk = on_disk(&dev);
    disk[3000] ^= 0x04;
    dev.write(BLK * BS as u64, &disk, WriteFlags::FUA).unwrap();
    let stats = replay(&[ck], &target(&dev)).unwrap();
    assert!(stats.damaged.is_empty());
    assert!(read_lsn_stamp(&on_disk(&dev), STAMP, &UUID).is_some());
}

/// A node's free middle is never logged and means nothing: whatever the disk holds there is
/// not damage, while a flip beside it still is.
#[test]
fn the_unlogged_stretch_is_not_checked() {
    for (at, damaged) in [(2500, false), (1100, true)] {
        let dev = SimDevice::new(16 * BS as u64, 1);
        let mut disk = block(0x11, Lsn::new(1, 0));
        disk[at] ^= 0x40;
        dev.write(BLK * BS as u64, &disk, WriteFlags::FUA).unwrap();
        let mut new = block(0x11, Lsn::new(1, 0));
        new[100..200].fill(0x22);
        new[2000..3000].fill(0); // free middle, zero in memory
        let mut raw = Vec::new();
        crate::log::item_format::encode_buf_item_into(
            &mut raw,
            BLK,
            false,
            Some(STAMP),
            &new,
            &[(100, 100)],
            Some((2000, 3000)),
        );
        let ck = Checkpoint {
            seq: 1,
            start: Lsn::new(1, 8),
            commit: Lsn::new(1, 8),
            items: vec![decode_item(&raw, BS as u32).unwrap()],
        };
        let stats = replay(&[ck], &target(&dev)).unwrap();
        assert_eq!(!stats.damaged.is_empty(), damaged, "flip at {at}");
        let sealed = read_lsn_stamp(&on_disk(&dev), STAMP, &UUID).is_some();
        assert_eq!(sealed, !damaged, "flip at {at}");
    }
}
