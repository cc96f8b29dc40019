//! The read and write verifiers of tree nodes and the header (docs/journal.md section 5) on the simulated
//! device: damage a CRC catches, a stamp of another filesystem or from the future, and a node
//! broken in memory before its write back.

#![allow(clippy::unwrap_used)]

use crate::check;
use crate::fs::tests::{jcfg, new_dev, BS};
use crate::fs::tree::btree;
use crate::fs::tree::keys::{key, KIND_EXTENT, KIND_INODE};
use crate::fs::tree::node::{Node, LEAF_ENTRY_BYTES, NODE_HEADER_BYTES, NODE_LSN_OFFSET};
use crate::fs::txn::Trees;
use crate::fs::types::{Cred, SetAttr};
use crate::fs::*;
use crate::journal::JournalError;
use crate::log::stamp::{read_lsn_stamp, write_lsn_stamp};
use crate::log::Lsn;
use cilfs_device::{AlignedBuf, Device, SimDevice, WriteFlags};

const FILES: usize = 120;

fn content(i: usize) -> Vec<u8> {
    vec![(i % 250) as u8 + 1; 1000 + i * 3]
}

/// No atime updates: reads then write nothing, so whatever changes on the device after a
/// mount that only reads comes from the verifiers.
fn opts() -> FsOptions {
    FsOptions {
        atime: AtimeMode::Never,
        ..FsOptions::default()
    }
}

fn open(dev: &Arc<SimDevice>) -> FsResult<Arc<Fs>> {
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg())?;
    Fs::open(j, opts())
}

/// A cleanly unmounted filesystem of `FILES` files with data (several fs tree leaves):
/// the device and the files' inode numbers.
fn populated(seed: u64) -> (Arc<SimDevice>, Vec<u64>) {
    let dev = new_dev(seed);
    let fs = open(&dev).unwrap();
    let inos = (0..FILES)
        .map(|i| {
            let name = format!("file-{i:04}");
            let f = fs
                .mknod(Cred::ROOT, ROOT_INO, name.as_bytes(), 0o100_644, 0)
                .unwrap()
                .ino;
            fs.write(Cred::ROOT, f, 0, &content(i)).unwrap();
            f
        })
        .collect();
    fs.unmount().unwrap();
    (dev, inos)
}

/// The fs tree leaf that holds inode `ino`.
fn inode_leaf(fs: &Fs, ino: u64) -> u64 {
    leaf_of(fs, key(ino, KIND_INODE, 0))
}

/// The fs tree leaf that holds (or would hold) key `k`.
fn leaf_of(fs: &Fs, k: tree::node::Key) -> u64 {
    let st = fs.state.read();
    let root = fs.hdr(&st).roots().fs;
    let mut v = fs.view(&st);
    btree::leaf_blkno(&mut v, root, items::header::TREE_FS, k).unwrap()
}

fn read_block(dev: &SimDevice, b: u64) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(BS as usize);
    dev.read(b * u64::from(BS), &mut buf).unwrap();
    buf
}

fn write_block(dev: &SimDevice, b: u64, data: &[u8]) {
    dev.write(b * u64::from(BS), data, WriteFlags::FUA).unwrap();
}

/// Where the value of the entry with key `k` lies in leaf `block`.
fn value_range(block: &[u8], k: tree::node::Key) -> std::ops::Range<usize> {
    let count = usize::from(u16::from_le_bytes([block[6], block[7]]));
    (0..count)
        .map(|i| &block[NODE_HEADER_BYTES + i * LEAF_ENTRY_BYTES..])
        .find(|e| e[0..8] == k.a.to_le_bytes() && e[8..16] == k.b.to_le_bytes())
        .map(|e| {
            let off = usize::from(u16::from_le_bytes([e[16], e[17]]));
            off..off + usize::from(u16::from_le_bytes([e[18], e[19]]))
        })
        .unwrap()
}

/// The stamp's LSN of a block as written.
fn stamp_lsn(block: &[u8]) -> Lsn {
    read_lsn_stamp(block, NODE_LSN_OFFSET, &tests::layout().uuid).unwrap()
}

/// A populated image with the leaf of one file's inode changed on the device by `damage`:
/// the device, the inodes, the victim's index, the leaf, and which files have their inode or
/// their extent in that leaf.
fn with_damaged_leaf(
    seed: u64,
    damage: impl FnOnce(&mut [u8], u64),
) -> (Arc<SimDevice>, Vec<u64>, usize, u64, Vec<bool>) {
    let (dev, inos) = populated(seed);
    let fs = open(&dev).unwrap();
    let victim = FILES / 2;
    let leaf = inode_leaf(&fs, inos[victim]);
    let in_leaf: Vec<bool> = inos
        .iter()
        .map(|&i| inode_leaf(&fs, i) == leaf || leaf_of(&fs, key(i, KIND_EXTENT, 0)) == leaf)
        .collect();
    assert!(in_leaf.iter().filter(|&&x| !x).count() > FILES / 2);
    fs.unmount().unwrap();
    drop(fs);
    let mut b = read_block(&dev, leaf);
    damage(&mut b, inos[victim]);
    write_block(&dev, leaf, &b);
    (dev, inos, victim, leaf, in_leaf)
}

/// Mounts the damaged image: the victim's inode is corrupt (the block and `expect` in the
/// message), and every other file reads back as written or fails as corrupt in that leaf: at
/// most those with their inode or extent there and one at each of its edges (a search for a
/// file's extents may step into the next leaf to find where they end).
fn assert_only_the_leaf_fails(
    dev: &Arc<SimDevice>,
    inos: &[u64],
    victim: usize,
    leaf: u64,
    in_leaf: &[bool],
    expect: &str,
) -> Arc<Fs> {
    let fs = open(dev).unwrap();
    for _ in 0..2 {
        match fs.getattr(inos[victim]) {
            Err(FsError::Corrupt { blkno, what }) => {
                assert_eq!(blkno, leaf);
                assert!(what.contains(expect), "{what}");
            }
            r => panic!("the victim's inode: {r:?}"),
        }
    }
    let mut read = 0;
    for (i, &ino) in inos.iter().enumerate() {
        match fs.read(ino, 0, 1 << 20) {
            Ok(d) => {
                assert_eq!(d, content(i), "file {i}");
                read += 1;
            }
            Err(FsError::Corrupt { blkno, .. }) if blkno == leaf => {}
            Err(e) => panic!("file {i}: {e}"),
        }
    }
    let elsewhere = in_leaf.iter().filter(|&&x| !x).count();
    assert!(read + 2 >= elsewhere && read > FILES / 2, "{read} read");
    assert!(fs.journal.superblock().needs_check);
    fs
}

/// One bit flipped in a leaf's value: the node still decodes, but its CRC fails. Every access
/// that needs the leaf is corrupt, every other file reads as written, the superblock says a
/// check is needed, and nothing but the superblock (and the log, at mount and unmount)
/// changes on the device.
#[test]
fn a_bit_flipped_in_a_leaf_value_fails_its_users_and_nothing_else() {
    let (dev, inos, victim, leaf, in_leaf) = with_damaged_leaf(601, |b, ino| {
        let r = value_range(b, key(ino, KIND_INODE, 0));
        b[r.start + r.len() / 2] ^= 0x10;
    });
    assert!(Node::decode(&read_block(&dev, leaf), leaf, items::header::TREE_FS).is_ok());
    let before = dev.stable_image();
    let fs = assert_only_the_leaf_fails(&dev, &inos, victim, leaf, &in_leaf, "CRC32C");
    let first = fs.journal.metadata_area().0;
    fs.unmount().unwrap();
    drop(fs);
    let after = dev.stable_image();
    let bs = u64::from(BS);
    let changed: Vec<u64> = (0..dev.len() / bs)
        .filter(|&b| {
            let (mut x, mut y) = (vec![0u8; BS as usize], vec![0u8; BS as usize]);
            before.read(b * bs, &mut x);
            after.read(b * bs, &mut y);
            x != y
        })
        .collect();
    assert!(changed.contains(&0), "the superblock did not change");
    assert!(
        changed.iter().all(|&b| b == 0 || b < first),
        "blocks changed outside the superblock and the log: {changed:?}"
    );
    // A check names the block.
    let (r, _) = check::check_image(dev.clone() as Arc<dyn Device>, None).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains(&format!("block {leaf}"))),
        "{:?}",
        r.problems
    );
}

/// A leaf whose stamp carries another filesystem's UUID (a valid CRC of its own): corrupt.
#[test]
fn a_stamp_of_another_filesystem_is_corrupt() {
    let (dev, inos, victim, leaf, in_leaf) = with_damaged_leaf(602, |b, _| {
        let lsn = stamp_lsn(b);
        write_lsn_stamp(b, NODE_LSN_OFFSET, lsn, &[0x33; 16]);
    });
    assert_only_the_leaf_fails(&dev, &inos, victim, leaf, &in_leaf, "another filesystem");
}

/// A leaf stamped with an LSN past the log's head (a valid CRC): corrupt, since no write back
/// stamps a block with a checkpoint the log has not reached.
#[test]
fn a_stamp_lsn_past_the_log_head_is_corrupt() {
    let (dev, inos, victim, leaf, in_leaf) = with_damaged_leaf(603, |b, _| {
        let lsn = stamp_lsn(b);
        let future = Lsn::new(lsn.cycle() + 100, lsn.block());
        write_lsn_stamp(b, NODE_LSN_OFFSET, future, &tests::layout().uuid);
    });
    assert_only_the_leaf_fails(&dev, &inos, victim, leaf, &in_leaf, "past the log head");
}

/// A header block whose CRC fails (a bit flipped past the encoded header): the mount is
/// refused as corrupt, naming the header's block.
#[test]
fn a_header_whose_crc_fails_refuses_the_mount() {
    let dev = new_dev(605);
    let first = open(&dev).unwrap().journal.metadata_area().0;
    let mut b = read_block(&dev, first);
    b[BS as usize - 1] ^= 1;
    write_block(&dev, first, &b);
    match open(&dev) {
        Err(FsError::Corrupt { blkno, what }) => {
            assert_eq!(blkno, first);
            assert!(what.contains("CRC32C"), "{what}");
        }
        r => panic!("{:?}", r.map(|_| ())),
    }
}

/// A leaf broken in memory after its checkpoint was logged (as a bad memory write would):
/// its write back is refused, the journal shuts down naming the block, the block on disk is
/// unchanged, and the next mount replays the good image from the log.
#[test]
fn a_node_broken_in_memory_is_never_written_back() {
    let dev = new_dev(604);
    let fs = open(&dev).unwrap();
    fs.journal.set_ail_push_ahead(false);
    let f = fs
        .mknod(Cred::ROOT, ROOT_INO, b"a", 0o100_644, 0)
        .unwrap()
        .ino;
    fs.write(Cred::ROOT, f, 0, b"data").unwrap();
    fs.sync().unwrap();
    let leaf = inode_leaf(&fs, f);
    let on_disk = read_block(&dev, leaf);
    {
        let buf = fs.journal.buf(leaf).unwrap();
        let mut g = buf.lock();
        assert!(!g.dirty.is_empty(), "the leaf was already written back");
        g.data[0] ^= 0xff;
    }
    let e = fs.unmount().unwrap_err();
    assert!(
        matches!(&e, FsError::Journal(JournalError::BadWrite { blkno, .. }) if *blkno == leaf),
        "{e}"
    );
    assert!(e.to_string().contains("bad node magic"), "{e}");
    assert_eq!(read_block(&dev, leaf)[..], on_disk[..]);
    assert!(matches!(
        fs.mknod(Cred::ROOT, ROOT_INO, b"b", 0o100_644, 0),
        Err(FsError::Journal(_))
    ));
    drop(fs);
    let fs = open(&dev).unwrap();
    assert_eq!(fs.read(f, 0, 10).unwrap(), b"data");
    tests::assert_clean(&fs);
}

/// A file whose extent was changed (through a transaction, so every stamp verifies) to map
/// `disk`: the device, its mount and the file.
fn with_extent_at(seed: u64, disk: impl Fn(u64) -> (u64, u64)) -> (Arc<SimDevice>, Arc<Fs>, u64) {
    let dev = new_dev(seed);
    let fs = open(&dev).unwrap();
    let f = fs
        .mknod(Cred::ROOT, ROOT_INO, b"f", 0o100_644, 0)
        .unwrap()
        .ino;
    fs.write(Cred::ROOT, f, 0, &[7u8; 3000]).unwrap();
    fs.sync().unwrap();
    let end = fs.journal.metadata_area().1;
    {
        let mut st = fs.state.write();
        let mut t = fs.begin(&st).unwrap();
        let k = key(f, KIND_EXTENT, 0);
        let v = t.get(items::header::TREE_FS, k).unwrap().unwrap();
        let mut e = items::extent::Extent::decode(0, &v).unwrap();
        (e.disk, e.len) = disk(end);
        t.insert(items::header::TREE_FS, k, &e.encode()).unwrap();
        fs.commit(&mut st, t).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    (dev.clone(), open(&dev).unwrap(), f)
}

/// Blocks `[b, b + n)` of the device.
fn blocks(dev: &SimDevice, b: u64, n: u64) -> Vec<u8> {
    (b..b + n)
        .flat_map(|x| read_block(dev, x).to_vec())
        .collect()
}

/// An extent that maps blocks of the log: reads and writes of the file are corrupt, and
/// nothing is written there.
#[test]
fn an_extent_into_the_log_is_corrupt_and_never_written() {
    let (dev, fs, f) = with_extent_at(606, |_| (400, 2));
    let first = fs.journal.metadata_area().0;
    assert!(400 + 2 < first, "block 400 is not in the log");
    let log_before = blocks(&dev, 400, 2);
    assert!(matches!(fs.read(f, 0, 100), Err(FsError::Corrupt { .. })));
    let w = fs
        .write(Cred::ROOT, f, 0, &[9u8; 3000])
        .and_then(|_| fs.sync());
    assert!(matches!(w, Err(FsError::Corrupt { .. })), "{w:?}");
    let _ = fs.unmount();
    drop(fs);
    assert_eq!(blocks(&dev, 400, 2), log_before, "the log was written over");
}

/// An extent that reaches past the data area's end: corrupt on read and on write.
#[test]
fn an_extent_past_the_data_area_is_corrupt() {
    let (_dev, fs, f) = with_extent_at(607, |end| (end - 1, 2));
    let r = fs.read(f, 0, 100);
    assert!(
        matches!(&r, Err(FsError::Corrupt { what, .. }) if what.contains("outside the data area")),
        "{r:?}"
    );
    let w = fs
        .write(Cred::ROOT, f, 0, &[9u8; 3000])
        .and_then(|_| fs.sync());
    assert!(matches!(w, Err(FsError::Corrupt { .. })), "{w:?}");
    // Other files keep working.
    let g = fs
        .mknod(Cred::ROOT, ROOT_INO, b"g", 0o100_644, 0)
        .unwrap()
        .ino;
    fs.write(Cred::ROOT, g, 0, b"fine").unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.read(g, 0, 10).unwrap(), b"fine");
}

/// A leaf damaged on disk outside the ranges the log holds for it: replay rebuilds the block
/// but does not reseal it as good. Check names it, the mount fails the accesses that need it
/// with EUCLEAN and asks for a check, and repair leaves a clean image. Before, replay stamped
/// a valid CRC over the damage, and check called the image clean.
#[test]
fn damage_under_a_logged_leaf_is_not_laundered_by_replay() {
    let (dev, inos) = populated(611);
    let fs = open(&dev).unwrap();
    let victim = FILES / 2;
    let leaf = inode_leaf(&fs, inos[victim]);
    let neighbour = (0..FILES)
        .find(|&i| i != victim && inode_leaf(&fs, inos[i]) == leaf)
        .unwrap();
    // The neighbour's inode changes and is fsynced: the leaf is in the log, not written back.
    let mode = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(Cred::ROOT, inos[neighbour], mode).unwrap();
    fs.fsync(inos[neighbour]).unwrap();
    let crashed = Arc::new(dev.crash(cilfs_device::CrashOptions { torn_writes: false }));
    drop(fs);
    let (_, scan) = crate::journal::scan(&*crashed, None).unwrap();
    assert!(
        scan.checkpoints
            .iter()
            .any(|c| c.items.iter().any(|i| i.blkno == leaf)),
        "the log holds the leaf"
    );
    // The victim's inode, which the log does not cover, damaged on disk (a bit flip).
    let mut b = read_block(&crashed, leaf);
    let r = value_range(&b, key(inos[victim], KIND_INODE, 0));
    b[r.start + 2] ^= 0x10;
    write_block(&crashed, leaf, &b);

    let (report, recovery) = check::check_image(crashed.clone() as Arc<dyn Device>, None).unwrap();
    assert_eq!(recovery.replay.damaged.len(), 1, "{:?}", recovery.replay);
    assert_eq!(recovery.replay.damaged[0].blkno, leaf);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains(&format!("metadata block {leaf}"))),
        "{:?}",
        report.problems
    );

    let fs = open(&crashed).unwrap();
    assert!(fs.journal.superblock().needs_check);
    match fs.getattr(inos[victim]) {
        Err(FsError::Corrupt { blkno, .. }) => assert_eq!(blkno, leaf),
        r => panic!("the victim's inode: {r:?}"),
    }
    let far = (0..FILES)
        .find(|&i| {
            inode_leaf(&fs, inos[i]) != leaf && leaf_of(&fs, key(inos[i], KIND_EXTENT, 0)) != leaf
        })
        .unwrap();
    assert_eq!(fs.read(inos[far], 0, 1 << 20).unwrap(), content(far));
    fs.unmount().unwrap();
    drop(fs);

    crate::check::repair::repair_image(
        crashed.clone() as Arc<dyn Device>,
        None,
        crate::check::repair::RepairOptions::default(),
    )
    .unwrap();
    let (report, _) = check::check_image(crashed.clone() as Arc<dyn Device>, None).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}
