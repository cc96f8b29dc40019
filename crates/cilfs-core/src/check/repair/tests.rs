//! Repair of damaged images on the simulated device: what survives is kept, check is clean
//! after, a second repair changes nothing, a dry run writes nothing.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::check::check_image;
use crate::fs::items::extent::Extent;
use crate::fs::items::header::{Header, HEADER_LSN_OFFSET};
use crate::fs::items::inode::EXTSIZE_MAX_BLOCKS;
use crate::fs::tests::{mount, new_dev, BS};
use crate::fs::tree::btree::Root;
use crate::fs::tree::keys::{key, KIND_DIRENT, KIND_EXTENT, KIND_INODE};
use crate::fs::tree::node::{Body, Node, Value, NODE_LSN_OFFSET};
use crate::fs::types::Cred;
use crate::fs::types::XattrFlags;
use crate::fs::{FileType, Fs, FsError, FsOptions, Inode, ROOT_INO};
use crate::log::stamp::{read_lsn_stamp, write_lsn_stamp};
use cilfs_device::SimDevice;

/// Enough files that the fs tree of 2 KiB blocks is three levels deep.
const FILES: usize = 700;

fn name(i: usize) -> Vec<u8> {
    format!("file-with-a-longer-name-{i:04}").into_bytes()
}

fn content(i: usize) -> Vec<u8> {
    vec![(i % 250) as u8 + 1; 500 + (i % 5) * 1000]
}

fn xvalue(i: usize) -> Vec<u8> {
    format!("value of file {i}").into_bytes()
}

fn populated() -> Arc<SimDevice> {
    let dev = new_dev(4200);
    let fs = mount(&dev, FsOptions::default());
    for i in 0..FILES {
        let f = fs
            .mknod(Cred::ROOT, ROOT_INO, &name(i), 0o100_644, 0)
            .unwrap()
            .ino;
        fs.write(Cred::ROOT, f, 0, &content(i)).unwrap();
        // Its blocks mapped before its xattr is set, as the damage below expects the tree.
        fs.fsync(f).unwrap();
        fs.setxattr(f, b"user.k", &xvalue(i), XattrFlags::default())
            .unwrap();
    }
    let d = fs.mkdir(Cred::ROOT, ROOT_INO, b"sub", 0o755).unwrap().ino;
    for j in 0..5 {
        fs.mknod(
            Cred::ROOT,
            d,
            format!("in-sub-{j}").as_bytes(),
            0o100_644,
            0,
        )
        .unwrap();
    }
    fs.unmount().unwrap();
    dev
}

fn hdr_blk(dev: &SimDevice) -> u64 {
    crate::Geometry::read(dev, None).unwrap().metadata_area().0
}

fn read_block(dev: &SimDevice, blk: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS as usize];
    dev.read(blk * u64::from(BS), &mut b).unwrap();
    b
}

fn write_block(dev: &SimDevice, blk: u64, b: &[u8]) {
    dev.write(blk * u64::from(BS), b, WriteFlags::NONE).unwrap();
    dev.flush().unwrap();
}

fn header(dev: &SimDevice) -> Header {
    let h = hdr_blk(dev);
    Header::decode(&read_block(dev, h), h).unwrap()
}

/// Rewrites the header with its stamp still valid.
fn put_header(dev: &SimDevice, h: &Header) {
    let blk = hdr_blk(dev);
    let old = read_block(dev, blk);
    let uuid = crate::Geometry::read(dev, None).unwrap().sb.uuid;
    let lsn = read_lsn_stamp(&old, HEADER_LSN_OFFSET, &uuid).unwrap();
    let mut b = vec![0u8; BS as usize];
    h.encode_into(&mut b);
    write_lsn_stamp(&mut b, HEADER_LSN_OFFSET, lsn, &uuid);
    write_block(dev, blk, &b);
}

/// Every node of a tree, root first, with its block.
fn nodes(dev: &SimDevice, root: Root, tree: u8) -> Vec<(u64, Node)> {
    let mut out = Vec::new();
    let mut stack = vec![root.blkno];
    while let Some(b) = stack.pop() {
        let n = Node::decode(&read_block(dev, b), b, tree).unwrap();
        if let Body::Interior(v) = &n.body {
            stack.extend(v.iter().rev().map(|(_, c)| *c));
        }
        out.push((b, n));
    }
    out
}

/// Changes the value of fs-tree item `k` in its leaf, the leaf's stamp kept valid (damage no
/// checksum catches).
fn edit_item(dev: &SimDevice, k: Key, f: impl FnOnce(&mut Vec<u8>)) {
    let uuid = crate::Geometry::read(dev, None).unwrap().sb.uuid;
    for (blk, mut n) in nodes(dev, header(dev).fs_root, TREE_FS) {
        let Body::Leaf(items) = &mut n.body else {
            continue;
        };
        let Some(at) = items.iter().position(|(x, _)| *x == k) else {
            continue;
        };
        let mut v = items[at].1.to_vec();
        f(&mut v);
        items[at].1 = Value::from(v);
        let old = read_block(dev, blk);
        let lsn = read_lsn_stamp(&old, NODE_LSN_OFFSET, &uuid).unwrap();
        let mut b = vec![0u8; BS as usize];
        n.encode_into(blk, &mut b);
        write_lsn_stamp(&mut b, NODE_LSN_OFFSET, lsn, &uuid);
        write_block(dev, blk, &b);
        return;
    }
    panic!("no item {k:?}");
}

fn open(dev: &Arc<SimDevice>) -> Arc<Fs> {
    mount(dev, FsOptions::default())
}

fn ino_of(dev: &Arc<SimDevice>, i: usize) -> u64 {
    let fs = open(dev);
    let ino = fs.lookup(ROOT_INO, &name(i)).unwrap().ino;
    fs.unmount().unwrap();
    ino
}

/// What check finds; an image it cannot open at all is one problem.
fn problems(dev: &Arc<SimDevice>) -> Vec<String> {
    match check_image(dev.clone() as Arc<dyn Device>, None) {
        Ok((r, _)) => r.problems,
        Err(e) => vec![e.to_string()],
    }
}

fn repair(dev: &Arc<SimDevice>) -> RepairReport {
    repair_image(
        dev.clone() as Arc<dyn Device>,
        None,
        RepairOptions::default(),
    )
    .unwrap()
}

/// Repairs, then: check is clean, a second repair changes nothing, and the filesystem takes
/// new files (the rebuilt trees and free list work for the allocator).
fn assert_repaired(dev: &Arc<SimDevice>) -> RepairReport {
    let r = repair(dev);
    assert!(r.changed(), "repair found nothing to do");
    assert!(r.problems_left.is_empty(), "left: {:#?}", r.problems_left);
    assert!(problems(dev).is_empty(), "{:#?}", problems(dev));
    let again = repair(dev);
    assert!(
        !again.changed(),
        "a second repair changed {:#?}",
        again.changes
    );
    let fs = open(dev);
    for j in 0..40 {
        let f = fs
            .mknod(
                Cred::ROOT,
                ROOT_INO,
                format!("after-{j}").as_bytes(),
                0o100_644,
                0,
            )
            .unwrap()
            .ino;
        fs.write(Cred::ROOT, f, 0, &content(j)).unwrap();
    }
    fs.unmount().unwrap();
    assert!(problems(dev).is_empty(), "after use: {:#?}", problems(dev));
    r
}

/// How the populated files came through: (intact at their names, intact in /lost+found,
/// gone). A file found at all must be intact.
fn survivors(dev: &Arc<SimDevice>) -> (usize, usize, usize) {
    let fs = open(dev);
    let (mut intact, mut gone) = (0, 0);
    for i in 0..FILES {
        match fs.lookup(ROOT_INO, &name(i)) {
            Ok(a) => {
                assert_eq!(fs.read(a.ino, 0, 1 << 20).unwrap(), content(i), "file {i}");
                assert_eq!(
                    fs.getxattr(a.ino, b"user.k").unwrap(),
                    xvalue(i),
                    "file {i}"
                );
                intact += 1;
            }
            Err(FsError::NotFound) => gone += 1,
            Err(e) => panic!("file {i}: {e}"),
        }
    }
    let mut found = 0;
    if let Ok(lf) = fs.lookup(ROOT_INO, b"lost+found") {
        for (e, _) in fs.readdir(lf.ino, 0, 100_000).unwrap() {
            if e.name.starts_with(b"#") && e.kind == FileType::Regular {
                let data = fs.read(e.ino, 0, 1 << 20).unwrap();
                assert!(
                    (0..FILES).any(|i| content(i) == data),
                    "{:?} holds no file's data",
                    String::from_utf8_lossy(&e.name)
                );
                found += 1;
            }
        }
    }
    fs.unmount().unwrap();
    (intact, found, gone - found)
}

fn zero(dev: &SimDevice, blk: u64) {
    write_block(dev, blk, &vec![0u8; BS as usize]);
}

#[test]
fn an_interior_node_zeroed_loses_no_file_whose_leaves_survive() {
    let dev = populated();
    let h = header(&dev);
    assert!(h.fs_root.level >= 2, "the fs tree is three levels deep");
    let (blk, _) = nodes(&dev, h.fs_root, TREE_FS)
        .into_iter()
        .find(|(b, n)| n.level >= 1 && *b != h.fs_root.blkno)
        .unwrap();
    zero(&dev, blk);
    assert!(!problems(&dev).is_empty());
    let r = assert_repaired(&dev);
    assert!(r.rebuilt_trees && r.leaves_found > 0 && r.items_salvaged > 0);
    // The free-space trees read whole: the scan skips their free extents.
    let area = header(&dev).data_end - header(&dev).data_start;
    assert!(
        r.blocks_scanned > 0 && r.blocks_scanned < area,
        "{}",
        r.blocks_scanned
    );
    assert_eq!(survivors(&dev), (FILES, 0, 0));
    let fs = open(&dev);
    let sub = fs.lookup(ROOT_INO, b"sub").unwrap().ino;
    assert_eq!(fs.readdir(sub, 0, 100).unwrap().len(), 5 + 2);
    fs.unmount().unwrap();
}

#[test]
fn the_fs_root_zeroed_loses_no_file() {
    let dev = populated();
    zero(&dev, header(&dev).fs_root.blkno);
    let r = assert_repaired(&dev);
    assert!(r.rebuilt_trees);
    assert_eq!((r.inodes_lost, r.moved_to_lost_found), (0, 0));
    assert_eq!(survivors(&dev), (FILES, 0, 0));
}

#[test]
fn a_leaf_zeroed_loses_its_files_and_nothing_else() {
    let dev = populated();
    let h = header(&dev);
    let leaves: Vec<u64> = nodes(&dev, h.fs_root, TREE_FS)
        .into_iter()
        .filter(|(_, n)| n.level == 0)
        .map(|(b, _)| b)
        .collect();
    zero(&dev, leaves[leaves.len() / 2]);
    let r = assert_repaired(&dev);
    let (intact, found, gone) = survivors(&dev);
    assert_eq!(intact + found + gone, FILES);
    assert!(found + gone > 0, "the leaf held some file");
    assert!(intact > FILES - 40, "{intact} intact");
    assert_eq!(r.moved_to_lost_found as usize, found);
}

#[test]
fn a_name_pointing_nowhere_is_removed_and_its_inode_found() {
    let dev = populated();
    let ino = ino_of(&dev, 5);
    edit_item(
        &dev,
        key(
            ROOT_INO,
            KIND_DIRENT,
            crate::fs::tree::keys::name_hash(&name(5)),
        ),
        |v| {
            let mut es = crate::fs::items::dir::decode_slotted(v, ROOT_INO).unwrap();
            for (_, e) in &mut es {
                if e.name == name(5) {
                    e.ino = 1 << 40;
                }
            }
            *v = crate::fs::items::dir::encode_bucket(&es);
        },
    );
    assert!(problems(&dev).iter().any(|p| p.contains("does not exist")));
    let r = assert_repaired(&dev);
    assert_eq!((r.inodes_lost, r.moved_to_lost_found), (1, 1));
    assert_eq!(survivors(&dev), (FILES - 1, 1, 0));
    let fs = open(&dev);
    let lf = fs.lookup(ROOT_INO, b"lost+found").unwrap();
    assert_eq!(lf.mode & 0o7777, 0o700);
    assert_eq!(
        fs.lookup(lf.ino, format!("#{ino}").as_bytes()).unwrap().ino,
        ino
    );
    fs.unmount().unwrap();
}

#[test]
fn a_wrong_link_count_is_recomputed() {
    let dev = populated();
    let ino = ino_of(&dev, 7);
    edit_item(&dev, key(ino, KIND_INODE, 0), |v| {
        let mut i = Inode::decode(ino, v, 0).unwrap();
        i.nlink = 5;
        *v = i.encode().to_vec();
    });
    assert!(problems(&dev).iter().any(|p| p.contains("link count 5")));
    let r = assert_repaired(&dev);
    assert!(
        r.changes.iter().any(|c| c.contains("link count 5 -> 1")),
        "{:#?}",
        r.changes
    );
    let fs = open(&dev);
    assert_eq!(fs.getattr(ino).unwrap().nlink, 1);
    fs.unmount().unwrap();
    assert_eq!(survivors(&dev), (FILES, 0, 0));
}

#[test]
fn a_damaged_extent_size_hint_is_cleared_and_the_file_kept() {
    let dev = populated();
    let (a, b) = (ino_of(&dev, 7), ino_of(&dev, 8));
    // A hint past XFS's bound; a long item that says no hint.
    edit_item(&dev, key(a, KIND_INODE, 0), |v| {
        v.extend_from_slice(&(EXTSIZE_MAX_BLOCKS + 1).to_le_bytes());
    });
    edit_item(&dev, key(b, KIND_INODE, 0), |v| {
        v.extend_from_slice(&[0; 4])
    });
    let before = problems(&dev);
    assert!(
        before.iter().any(|p| p.contains("extent size hint")),
        "{before:#?}"
    );
    let r = assert_repaired(&dev);
    for ino in [a, b] {
        let cleared = format!("inode {ino}: extent size hint cleared");
        assert!(
            r.changes.iter().any(|c| c.contains(&cleared)),
            "{:#?}",
            r.changes
        );
    }
    assert_eq!(r.inodes_lost, 0);
    assert_eq!(survivors(&dev), (FILES, 0, 0));
    let fs = open(&dev);
    assert_eq!(fs.file_attr(a).unwrap().extsize, 0);
    fs.unmount().unwrap();
}

#[test]
fn extents_outside_the_area_or_on_anothers_blocks_are_cut() {
    let dev = populated();
    let h = header(&dev);
    let (a, b, c) = (ino_of(&dev, 10), ino_of(&dev, 11), ino_of(&dev, 12));
    let disk_of = |ino: u64| {
        let fs = open(&dev);
        let _ = fs.getattr(ino).unwrap();
        fs.unmount().unwrap();
        let mut d = 0;
        for (_, n) in nodes(&dev, header(&dev).fs_root, TREE_FS) {
            if let Body::Leaf(items) = n.body {
                for (k, v) in items {
                    if k == key(ino, KIND_EXTENT, 0) {
                        d = Extent::decode(0, &v).unwrap().disk;
                    }
                }
            }
        }
        d
    };
    let b_disk = disk_of(b);
    edit_item(&dev, key(a, KIND_EXTENT, 0), |v| {
        v[0..8].copy_from_slice(&(h.data_end + 3).to_le_bytes());
    });
    // The later file takes the earlier one's blocks: the earlier keeps them.
    edit_item(&dev, key(c, KIND_EXTENT, 0), |v| {
        v[0..8].copy_from_slice(&b_disk.to_le_bytes());
    });
    let before = problems(&dev);
    assert!(
        before.iter().any(|p| p.contains("owned twice")),
        "{before:#?}"
    );
    assert!(
        before.iter().any(|p| p.contains("past the end")),
        "{before:#?}"
    );
    let r = assert_repaired(&dev);
    // The address outside the area: the whole extent goes; the stolen blocks: cut.
    let says = |what: &str| r.changes.iter().filter(|c| c.contains(what)).count();
    assert_eq!(says("leaves the data area, removed"), 1, "{:#?}", r.changes);
    assert_eq!(says("cut to"), 1, "{:#?}", r.changes);
    let fs = open(&dev);
    assert_eq!(fs.read(b, 0, 1 << 20).unwrap(), content(11));
    assert_eq!(fs.getattr(a).unwrap().blocks_512, 0);
    assert_ne!(fs.read(c, 0, 1 << 20).unwrap(), content(12));
    fs.unmount().unwrap();
}

#[test]
fn corrupted_header_counters_are_recomputed() {
    let dev = populated();
    let good = header(&dev);
    let mut h = good.clone();
    h.next_ino = 2;
    h.inode_count = 7;
    h.free_blocks = 3;
    put_header(&dev, &h);
    assert!(problems(&dev).len() >= 3);
    let r = assert_repaired(&dev);
    assert!(!r.rebuilt_trees, "{:#?}", r.changes);
    assert_eq!(r.changes.len(), 3, "{:#?}", r.changes);
    assert_eq!(survivors(&dev), (FILES, 0, 0));
}

#[test]
fn zeroed_free_space_trees_are_rebuilt() {
    let dev = populated();
    let h = header(&dev);
    zero(&dev, h.bno_root.blkno);
    zero(&dev, h.size_root.blkno);
    let r = assert_repaired(&dev);
    assert!(r.rebuilt_trees);
    assert_eq!(header(&dev).fs_root, h.fs_root, "the fs tree is kept");
    assert_eq!(survivors(&dev), (FILES, 0, 0));
}

#[test]
fn an_unreadable_header_is_rebuilt_from_a_scan() {
    let dev = populated();
    zero(&dev, hdr_blk(&dev));
    let r = assert_repaired(&dev);
    assert!(r.rebuilt_trees && r.leaves_found > 0);
    assert_eq!(survivors(&dev), (FILES, 0, 0));
}

#[test]
fn a_dry_run_changes_no_byte_and_says_what_it_would_do() {
    let dev = populated();
    let h = header(&dev);
    zero(&dev, h.fs_root.blkno);
    let (live, stable) = (dev.live_image(), dev.stable_image());
    let r = repair_image(
        dev.clone() as Arc<dyn Device>,
        None,
        RepairOptions {
            dry_run: true,
            progress: None,
        },
    )
    .unwrap();
    assert!(r.rebuilt_trees && r.changed());
    assert!(r.problems_left.is_empty(), "{:#?}", r.problems_left);
    assert!(dev.live_image() == live && dev.stable_image() == stable);
    assert!(!problems(&dev).is_empty());
}

#[test]
fn a_consistent_image_is_left_alone() {
    let dev = populated();
    let live = dev.live_image();
    let mut phases = Vec::new();
    let seen = Arc::new(cilfs_sync::Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let r = repair_image(
        dev.clone() as Arc<dyn Device>,
        None,
        RepairOptions {
            dry_run: false,
            progress: Some(Box::new(move |p| s.lock().push(p.phase))),
        },
    )
    .unwrap();
    assert!(!r.changed(), "{:#?}", r.changes);
    assert!(r.problems_left.is_empty());
    assert!(dev.live_image() == live, "nothing written");
    phases.extend(seen.lock().iter().copied());
    // Found consistent by the check before the trees: nothing walked, nothing written.
    assert!(
        phases.contains(&"log") && phases.contains(&"check"),
        "{phases:?}"
    );
    assert!(!phases.contains(&"write"), "{phases:?}");
}

/// Repair's own writes are crash-safe: a repair cut off after any of its writes, with the
/// writes still volatile then lost, kept or torn sector by sector, leaves an image that the
/// next repair finishes: check clean, and every file that the uninterrupted repair keeps is
/// kept, intact.
fn assert_repair_crash_safe(dev: &SimDevice) {
    use cilfs_device::{RecordingDevice, Survival};
    let base = dev.stable_image();
    let len = dev.len();
    let rec = Arc::new(RecordingDevice::new(
        SimDevice::from_image(base.clone(), len, 1),
        base,
    ));
    let first = repair_image(
        rec.clone() as Arc<dyn Device>,
        None,
        RepairOptions::default(),
    )
    .unwrap();
    assert!(first.rebuilt_trees && first.problems_left.is_empty());
    let ops = rec.ops();
    let whole = Arc::new(SimDevice::from_image(rec.image_at(ops.len()), len, 2));
    let expect = survivors(&whole);
    // Every durability point, and points between them.
    let mut points: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_durability_point())
        .map(|(i, _)| i + 1)
        .collect();
    points.extend((1..ops.len()).step_by((ops.len() / 24).max(1)));
    points.sort_unstable();
    points.dedup();
    assert!(
        points.len() >= ops.len().min(24),
        "{} crash points",
        points.len()
    );
    for (j, &n) in points.iter().enumerate() {
        // The fates of the volatile writes: seeded per point, some torn.
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ n as u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let img = rec.crash_image(n, &mut |_, sectors| match next() % 3 {
            0 => Survival::Lost,
            1 => Survival::Kept,
            _ => Survival::Torn((0..sectors).map(|_| next() & 1 == 1).collect()),
        });
        let d = Arc::new(SimDevice::from_image(img, len, j as u64));
        let r = repair(&d);
        assert!(
            r.problems_left.is_empty(),
            "crash after op {n} of {}: {:#?}",
            ops.len(),
            r.problems_left
        );
        assert_eq!(survivors(&d), expect, "crash after op {n} of {}", ops.len());
    }
}

#[test]
fn a_repair_crashed_anywhere_is_finished_by_the_next() {
    let dev = populated();
    zero(&dev, header(&dev).fs_root.blkno);
    assert_repair_crash_safe(&dev);
}

#[test]
fn a_repair_of_a_lost_interior_node_crashed_anywhere_is_finished_by_the_next() {
    let dev = populated();
    let h = header(&dev);
    let (blk, _) = nodes(&dev, h.fs_root, TREE_FS)
        .into_iter()
        .find(|(b, n)| n.level >= 1 && *b != h.fs_root.blkno)
        .unwrap();
    zero(&dev, blk);
    assert_repair_crash_safe(&dev);
}

/// A mount that met a corrupt block marks the superblock as needing a check; the repair that
/// leaves the image consistent clears the mark (a dry run only says it would), and a second
/// repair has nothing to do.
#[test]
fn repair_clears_the_needs_check_mark() {
    let dev = populated();
    zero(&dev, header(&dev).fs_root.blkno);
    let sb = |d: &SimDevice| crate::Geometry::read(d, None).unwrap().sb;
    let mut marked = sb(&dev);
    marked.needs_check = true;
    crate::format::geometry::write_superblock(&*dev, &marked, WriteFlags::FUA).unwrap();
    let dry = repair_image(
        dev.clone() as Arc<dyn Device>,
        None,
        RepairOptions {
            dry_run: true,
            ..RepairOptions::default()
        },
    )
    .unwrap();
    assert!(dry.changes.iter().any(|c| c.contains("would be cleared")));
    assert!(sb(&dev).needs_check);
    let r = repair(&dev);
    assert!(r
        .changes
        .iter()
        .any(|c| c.contains("needs-check mark cleared")));
    assert!(!sb(&dev).needs_check);
    assert!(!repair(&dev).changed());
}

/// A name damaged under a valid CRC no longer matches the hash its bucket is filed under: the
/// entry is filed again under its name's hash, so the file keeps a name (the damaged one)
/// instead of going to /lost+found.
#[test]
fn an_entry_under_the_wrong_hash_is_filed_under_its_own() {
    let dev = populated();
    let ino = ino_of(&dev, 7);
    let mut damaged = name(7);
    damaged[0] = b'g';
    let hash = crate::fs::tree::keys::name_hash(&name(7));
    let d = damaged.clone();
    edit_item(&dev, key(ROOT_INO, KIND_DIRENT, hash), |v| {
        let mut es = crate::fs::items::dir::decode_slotted(v, ROOT_INO).unwrap();
        for (_, e) in &mut es {
            if e.name == name(7) {
                e.name = d.clone();
            }
        }
        *v = crate::fs::items::dir::encode_bucket(&es);
    });
    assert!(!problems(&dev).is_empty());
    let r = assert_repaired(&dev);
    assert!(
        r.changes.iter().any(|c| c.contains("filed under its own")),
        "{:#?}",
        r.changes
    );
    assert_eq!(r.moved_to_lost_found, 0);
    let fs = open(&dev);
    assert_eq!(fs.lookup(ROOT_INO, &damaged).unwrap().ino, ino);
    assert_eq!(fs.read(ino, 0, 1 << 20).unwrap(), content(7));
    fs.unmount().unwrap();
}

/// A directory whose inode item is lost keeps its entries: repair makes the inode again, and
/// the name that reached it reaches it again, with every name under it. A file whose inode
/// item is lost keeps its data the same way.
#[test]
fn a_lost_inode_item_is_made_again_and_keeps_what_it_held() {
    let dev = populated();
    let sub = {
        let fs = open(&dev);
        let s = fs.lookup(ROOT_INO, b"sub").unwrap().ino;
        fs.unmount().unwrap();
        s
    };
    let file = ino_of(&dev, 9);
    for ino in [sub, file] {
        // Too short to decode: salvage drops the inode item, its other items stay.
        edit_item(&dev, key(ino, KIND_INODE, 0), |v| v.truncate(3));
    }
    assert!(!problems(&dev).is_empty());
    let r = assert_repaired(&dev);
    assert!(
        r.changes
            .iter()
            .filter(|c| c.contains("made again"))
            .count()
            == 2,
        "{:#?}",
        r.changes
    );
    assert_eq!(r.moved_to_lost_found, 0);
    let fs = open(&dev);
    // Its name in the root still reaches it.
    let d = fs.lookup(ROOT_INO, b"sub").unwrap();
    assert_eq!(d.ino, sub);
    let names: Vec<Vec<u8>> = fs
        .readdir(sub, 0, 100)
        .unwrap()
        .into_iter()
        .map(|(e, _)| e.name)
        .filter(|n| n.starts_with(b"in-sub-"))
        .collect();
    assert_eq!(names.len(), 5, "{names:?}");
    // The file: its name in the root still reaches it, with its data (rounded up to blocks).
    let a = fs.lookup(ROOT_INO, &name(9)).unwrap();
    assert_eq!(a.ino, file);
    let data = fs.read(file, 0, 1 << 20).unwrap();
    assert_eq!(&data[..content(9).len()], &content(9)[..]);
    fs.unmount().unwrap();
}

/// A superblock whose log generation (or unclean-mount epoch) is at its largest value no
/// mount can raise: the mount refuses it; repair replays the log's checkpoints, zeroes the
/// log and starts the counters again, and every file, the fsynced ones still in the log
/// included, comes through.
#[test]
fn exhausted_log_counters_are_started_again_after_replay() {
    use crate::format::geometry::{write_superblock, Geometry};
    use cilfs_device::{CrashOptions, WriteFlags};
    for field in ["log generation", "unclean epoch"] {
        let dev = populated();
        // Fsynced changes left in the log by a crash.
        let fs = open(&dev);
        let f = fs
            .mknod(Cred::ROOT, ROOT_INO, b"in-the-log", 0o100_644, 0)
            .unwrap()
            .ino;
        fs.write(Cred::ROOT, f, 0, &content(3)).unwrap();
        fs.fsync(f).unwrap();
        let dev = Arc::new(dev.crash(CrashOptions { torn_writes: false }));
        drop(fs);
        let mut sb = Geometry::read(&*dev, None).unwrap().sb;
        assert!(!sb.clean);
        match field {
            "log generation" => sb.log_generation = u32::MAX,
            _ => sb.unclean_epoch = u64::MAX,
        }
        write_superblock(&*dev, &sb, WriteFlags::FUA).unwrap();
        let refused = crate::journal::Journal::open(
            dev.clone() as Arc<dyn Device>,
            None,
            crate::journal::JournalConfig::default(),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string();
        assert!(refused.contains("largest value"), "{field}: {refused}");

        let r = assert_repaired(&dev);
        assert!(
            r.changes.iter().any(|c| c.contains("started again")),
            "{field}: {:#?}",
            r.changes
        );
        let sb = Geometry::read(&*dev, None).unwrap().sb;
        assert!(sb.log_generation < 16 && sb.unclean_epoch < 16, "{sb:?}");
        assert_eq!(survivors(&dev), (FILES, 0, 0), "{field}");
        let fs = open(&dev);
        let got = fs.lookup(ROOT_INO, b"in-the-log").unwrap();
        assert_eq!(fs.read(got.ino, 0, 1 << 16).unwrap(), content(3), "{field}");
        fs.unmount().unwrap();
    }
}
