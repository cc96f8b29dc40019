//! Damaged metadata on the simulated device: every access ends (no spinning thread), with the
//! data or an error, and damage that changes what a file reads is found by the checker.

#![allow(clippy::unwrap_used)]

use crate::check;
use crate::fs::tests::{jcfg, mount, new_dev, TestClock};
use crate::fs::tree::node::{INTERIOR_ENTRY_BYTES, NODE_HEADER_BYTES, NODE_LSN_OFFSET};
use crate::fs::txn::Trees;
use crate::fs::types::Cred;
use crate::fs::*;
use crate::log::stamp::write_lsn_stamp;
use crate::log::Lsn;
use cilfs_device::rng::SimRng;
use cilfs_device::{AlignedBuf, Device, SimDevice, WriteFlags};

const FILES: usize = 150;

fn content(i: usize) -> Vec<u8> {
    vec![(i % 250) as u8 + 1; 3000 + (i % 7) * 700]
}

/// A cleanly unmounted filesystem of `FILES` files with data, its fs tree two levels deep or
/// more; returns the device and the fs tree's root block.
fn populated() -> (Arc<SimDevice>, u64) {
    let clock = TestClock::new();
    let dev = new_dev(500);
    let fs = mount(
        &dev,
        FsOptions {
            clock: clock.clock(),
            ..FsOptions::default()
        },
    );
    for i in 0..FILES {
        let name = format!("file-with-a-longer-name-{i:04}");
        let f = fs
            .mknod(Cred::ROOT, ROOT_INO, name.as_bytes(), 0o100_644, 0)
            .unwrap()
            .ino;
        fs.write(Cred::ROOT, f, 0, &content(i)).unwrap();
    }
    let root = {
        let st = fs.state.read();
        let r = fs.hdr(&st).roots().fs;
        r
    };
    assert!(root.level >= 1, "the fs tree has an interior root");
    fs.unmount().unwrap();
    (dev, root.blkno)
}

/// Mounts a copy of `img` and reads every file; Ok(true) if all read back as written.
fn read_all(dev: &Arc<SimDevice>) -> Result<bool, FsError> {
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg())?;
    let fs = Fs::open(j, FsOptions::default())?;
    let mut same = true;
    for i in 0..FILES {
        let name = format!("file-with-a-longer-name-{i:04}");
        let got = fs
            .lookup(ROOT_INO, name.as_bytes())
            .and_then(|a| fs.read(a.ino, 0, 1 << 20));
        same &= got.is_ok_and(|d| d == content(i));
    }
    same &= fs
        .readdir(ROOT_INO, 0, 10_000)
        .is_ok_and(|v| v.len() == FILES + 2);
    Ok(same)
}

/// Flipped bits in the keys of the fs tree's root (a stamp that still verifies, as a bad
/// memory write before the CRC was taken would leave): every read ends, and any flip that
/// changes what a file reads is found by the checker.
#[test]
fn flipped_root_keys_never_hang_and_are_found_when_they_matter() {
    let (dev, root) = populated();
    let img = dev.stable_image();
    let len = dev.len();
    let mut rng = SimRng::new(77);
    let bs = tests::BS as usize;
    let (mut harmful, mut found) = (0, 0);
    for case in 0..48 {
        let d = Arc::new(SimDevice::from_image(img.clone(), len, case));
        let at = root * bs as u64;
        let mut b = AlignedBuf::zeroed(bs);
        d.read(at, &mut b).unwrap();
        let count = usize::from(u16::from_le_bytes([b[6], b[7]]));
        let entry = rng.below(count.max(1) as u64) as usize;
        let bit = rng.below(128) as usize;
        let p = NODE_HEADER_BYTES + entry * INTERIOR_ENTRY_BYTES + bit / 8;
        b[p] ^= 1 << (bit % 8);
        let o = usize::from(NODE_LSN_OFFSET);
        let lsn = Lsn::from_raw(u64::from_le_bytes(b[o..o + 8].try_into().unwrap()));
        write_lsn_stamp(&mut b, NODE_LSN_OFFSET, lsn, &tests::layout().uuid);
        d.write(at, &b, WriteFlags::FUA).unwrap();
        let intact = read_all(&d).unwrap_or(false);
        let r = check::check_image(d.clone() as Arc<dyn Device>, None);
        let clean = r.as_ref().is_ok_and(|(r, _)| r.is_clean());
        if !intact {
            harmful += 1;
            assert!(
                !clean,
                "case {case}: entry {entry} bit {bit}: reads changed, check clean"
            );
            found += 1;
        }
    }
    eprintln!("{harmful} of 48 flips changed what files read; the checker found {found}");
}

/// Changes made through a transaction, so every block keeps a valid stamp: damage no CRC
/// catches, as a bad memory write before the write-back would leave.
fn damage_committed(fs: &Fs, what: &dyn Fn(&mut txn::FsTx<'_>)) {
    let mut st = fs.state.write();
    let mut t = fs.begin(&st).unwrap();
    what(&mut t);
    fs.commit(&mut st, t).unwrap();
}

fn remount(dev: &Arc<SimDevice>, fs: Arc<Fs>) -> Result<Arc<Fs>, FsError> {
    fs.unmount().unwrap();
    drop(fs);
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg())?;
    Fs::open(j, FsOptions::default())
}

/// A filesystem with one file, `kept`, holding `data`: the device, the mount and its inode.
fn with_a_kept_file(seed: u64) -> (Arc<SimDevice>, Arc<Fs>, u64) {
    let dev = new_dev(seed);
    let fs = mount(&dev, FsOptions::default());
    let f = fs
        .mknod(Cred::ROOT, ROOT_INO, b"kept", 0o100_644, 0)
        .unwrap()
        .ino;
    fs.write(Cred::ROOT, f, 0, b"data").unwrap();
    (dev, fs, f)
}

/// A filesystem with two empty files, `a` and `b`: the device, the mount and their inodes.
fn with_two_files(seed: u64) -> (Arc<SimDevice>, Arc<Fs>, u64, u64) {
    let dev = new_dev(seed);
    let fs = mount(&dev, FsOptions::default());
    let file = |name: &[u8]| {
        fs.mknod(Cred::ROOT, ROOT_INO, name, 0o100_644, 0)
            .unwrap()
            .ino
    };
    let (a, b) = (file(b"a"), file(b"b"));
    (dev, fs, a, b)
}

/// The header's next inode number at 2^64-1 (valid CRC): creates fail as corrupt instead of
/// wrapping round onto the root, everything else keeps working, and check reports it.
#[test]
fn a_next_inode_number_at_the_top_fails_creates_and_never_overwrites_the_root() {
    let (dev, fs, _) = with_a_kept_file(501);
    damage_committed(&fs, &|t| t.hdr.next_ino = u64::MAX);
    let fs = remount(&dev, fs).unwrap();
    for name in [&b"a"[..], b"b", b"c"] {
        let r = fs.mknod(Cred::ROOT, ROOT_INO, name, 0o100_644, 0);
        assert!(matches!(r, Err(FsError::Corrupt { .. })), "{r:?}");
        assert!(matches!(
            fs.mkdir(Cred::ROOT, ROOT_INO, name, 0o755),
            Err(FsError::Corrupt { .. })
        ));
    }
    assert_eq!(
        fs.getattr(ROOT_INO).unwrap().kind,
        items::inode::FileType::Directory
    );
    let kept = fs.lookup(ROOT_INO, b"kept").unwrap().ino;
    assert_eq!(fs.read(kept, 0, 10).unwrap(), b"data");
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems.iter().any(|p| p.contains("past the limit")),
        "{:?}",
        r.problems
    );
}

/// A next inode number behind the numbers in use (valid CRC): a create handed a live inode's
/// number fails instead of writing over it (later ones take numbers past it).
#[test]
fn a_next_inode_number_behind_the_live_ones_never_overwrites_an_inode() {
    let (dev, fs, f) = with_a_kept_file(502);
    damage_committed(&fs, &|t| t.hdr.next_ino = f);
    let fs = remount(&dev, fs).unwrap();
    for i in 0..40 {
        match fs.mknod(
            Cred::ROOT,
            ROOT_INO,
            format!("new{i}").as_bytes(),
            0o100_644,
            0,
        ) {
            Ok(a) => assert_ne!(a.ino, f, "a create took a live inode's number"),
            Err(FsError::Corrupt { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let kept = fs.lookup(ROOT_INO, b"kept").unwrap();
    assert_eq!(kept.ino, f);
    assert_eq!(kept.size, 4);
    assert_eq!(fs.read(f, 0, 10).unwrap(), b"data");
}

/// Inode `a` of two, its item changed by `damage` under a valid CRC: `a` is corrupt for
/// whoever needs it (`getattr`, and a write when `write_too`), the other works, and check
/// reports a problem containing `found`.
fn one_of_two_inodes_damaged(seed: u64, damage: fn(&mut Inode), write_too: bool, found: &str) {
    let (dev, fs, a, b) = with_two_files(seed);
    damage_committed(&fs, &|t| {
        let k = tree::keys::key(a, tree::keys::KIND_INODE, 0);
        let mut i =
            Inode::decode(a, &t.get(items::header::TREE_FS, k).unwrap().unwrap(), 0).unwrap();
        damage(&mut i);
        t.insert(items::header::TREE_FS, k, &i.encode()).unwrap();
    });
    let fs = remount(&dev, fs).unwrap();
    assert!(matches!(fs.getattr(a), Err(FsError::Corrupt { .. })));
    if write_too {
        assert!(matches!(
            fs.write(Cred::ROOT, a, 0, b"x"),
            Err(FsError::Corrupt { .. })
        ));
    }
    assert!(fs.getattr(b).is_ok());
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems.iter().any(|p| p.contains(found)),
        "{:?}",
        r.problems
    );
}

/// Inode sizes at 2^63 and past (valid CRC): the inode is corrupt for whoever needs it, the
/// others work, and check reports it.
#[test]
fn a_size_past_the_largest_file_is_corrupt_and_found() {
    let past = |i: &mut Inode| {
        i.size = 1 << 63;
        i.disk_size = 1 << 63;
    };
    one_of_two_inodes_damaged(503, past, false, "past the largest file");
}

/// A superblock whose data area was halved (valid CRC): the mount is refused, naming the
/// disagreement, instead of serving reads and writes that fail.
#[test]
fn a_superblock_that_disagrees_with_the_header_refuses_the_mount() {
    use crate::format::Superblock;
    let dev = new_dev(504);
    let mut s0 = AlignedBuf::zeroed(tests::BS as usize);
    dev.read(0, &mut s0).unwrap();
    let mut sb = Superblock::decode(&s0[..512]).unwrap();
    sb.data_blocks /= 2;
    s0[..512].copy_from_slice(&sb.encode());
    dev.write(0, &s0, WriteFlags::FUA).unwrap();
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    let Err(FsError::Corrupt { what, .. }) = Fs::open(j, FsOptions::default()) else {
        panic!("mounted");
    };
    assert!(what.contains("one of them is damaged"), "{what}");
}

/// The fs tree's root or the header zeroed: check reports the damage (a problem, exit 1)
/// instead of giving up (exit 2), and names the block.
#[test]
fn a_zeroed_root_or_header_is_a_problem_check_reports() {
    let (dev, root) = populated();
    let bs = tests::BS as usize;
    let hdr_blk = crate::Geometry::read(&*dev, None)
        .unwrap()
        .metadata_area()
        .0;
    for blk in [root, hdr_blk] {
        let d = Arc::new(SimDevice::from_image(dev.stable_image(), dev.len(), blk));
        d.write(blk * bs as u64, &AlignedBuf::zeroed(bs), WriteFlags::FUA)
            .unwrap();
        let (r, _) = check::check_image(d.clone() as Arc<dyn Device>, None)
            .unwrap_or_else(|e| panic!("block {blk}: check gave up: {e}"));
        assert!(!r.is_clean(), "block {blk}");
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains(&format!("block {blk}"))),
            "block {blk}: {:?}",
            r.problems
        );
    }
}

/// A child pointer of the fs tree's root set past the device under a valid CRC: check
/// reports it instead of giving up, and a mount refuses or fails only what needs that child.
#[test]
fn a_child_pointer_outside_the_area_is_a_problem_check_reports() {
    let (dev, root) = populated();
    let bs = tests::BS as usize;
    let d = Arc::new(SimDevice::from_image(dev.stable_image(), dev.len(), 5));
    let mut b = AlignedBuf::zeroed(bs);
    d.read(root * bs as u64, &mut b).unwrap();
    let p = NODE_HEADER_BYTES + 16;
    b[p..p + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let o = usize::from(NODE_LSN_OFFSET);
    let lsn = Lsn::from_raw(u64::from_le_bytes(b[o..o + 8].try_into().unwrap()));
    write_lsn_stamp(&mut b, NODE_LSN_OFFSET, lsn, &tests::layout().uuid);
    d.write(root * bs as u64, &b, WriteFlags::FUA).unwrap();
    let (r, _) = check::check_image(d.clone() as Arc<dyn Device>, None)
        .unwrap_or_else(|e| panic!("check gave up: {e}"));
    assert!(
        r.problems.iter().any(|p| p.contains(&u64::MAX.to_string())),
        "{:?}",
        r.problems
    );
}

/// A change attribute at the top of its range (valid CRC; found by the image fuzz target): the
/// counter in memory would wrap at the next bump and go back, so the inode is corrupt for
/// whoever needs it, the others work, and check reports it.
#[test]
fn a_change_attribute_past_its_range_is_corrupt_and_found() {
    one_of_two_inodes_damaged(504, |i| i.change = u64::MAX, true, "change attribute");
}

/// A time with a billion nanoseconds or more (valid CRC) is no time: the inode is corrupt for
/// whoever needs it, the others work, and check reports it.
#[test]
fn a_time_past_its_last_nanosecond_is_corrupt_and_found() {
    one_of_two_inodes_damaged(
        505,
        |i| i.mtime.nsec = 1_000_000_000,
        true,
        "nanoseconds past a second",
    );
}

/// A remote xattr value (valid CRC) claiming more blocks than its length takes: reading it and
/// freeing it (its file's unlink) refuse it as corrupt, instead of reading or freeing blocks it
/// never owned, and check reports it. The image fuzz target's find: a 700-byte value claiming
/// 44 blocks, whose unlink cancelled all 44 in one transaction, past its reservation.
#[test]
fn a_remote_xattr_value_of_more_blocks_than_its_length_is_corrupt_and_found() {
    use crate::fs::items::xattr::{self, Value};
    let (dev, fs, a, b) = with_two_files(505);
    fs.write(Cred::ROOT, b, 0, &[7; 20_000]).unwrap();
    let value = vec![0x42; 3000];
    fs.setxattr(a, b"user.big", &value, types::XattrFlags::default())
        .unwrap();
    let k = tree::keys::key(
        a,
        tree::keys::KIND_XATTR,
        tree::keys::name_hash(b"user.big"),
    );
    damage_committed(&fs, &|t| {
        let mut e = xattr::decode(&t.get(items::header::TREE_FS, k).unwrap().unwrap(), a).unwrap();
        let Value::Remote { blocks, .. } = &mut e[0].value else {
            panic!("a 3000-byte value is remote");
        };
        *blocks += 5;
        t.insert(items::header::TREE_FS, k, &xattr::encode(&e))
            .unwrap();
    });
    let fs = remount(&dev, fs).unwrap();
    assert!(matches!(
        fs.getxattr(a, b"user.big"),
        Err(FsError::Corrupt { .. })
    ));
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems.iter().any(|p| p.contains("3000 bytes in")),
        "{:?}",
        r.problems
    );
    assert!(fs.unlink(ROOT_INO, b"a").is_err());
    assert_eq!(fs.read(b, 0, 20_000).unwrap(), vec![7; 20_000]);
}

/// A header (valid CRC) counting fewer free blocks than the free-space trees hold: an
/// allocation past the count is refused as corrupt instead of the count wrapping below zero.
/// The image fuzz target's find (a write's freelist refill, `fix_freelist`).
#[test]
fn an_allocation_past_the_headers_free_count_is_corrupt() {
    let dev = new_dev(506);
    let fs = mount(&dev, FsOptions::default());
    damage_committed(&fs, &|t| t.hdr.free_blocks = 3);
    let fs = remount(&dev, fs).unwrap();
    let st = fs.state.write();
    let mut t = fs.begin(&st).unwrap();
    assert!(matches!(t.alloc_extent(2, 2), Ok(Some((_, 2)))));
    assert!(matches!(t.alloc_extent(2, 2), Err(FsError::Corrupt { .. })));
    drop(t);
    drop(st);
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("header counts 3 free blocks")),
        "{:?}",
        r.problems
    );
}
