//! The checker on damage made through raw transactions: misplaced items, damaged xattr values,
//! leaves out of order.

use super::*;

/// Damage made through raw transactions: the checker must name each kind.
#[test]
fn checker_finds_damage() {
    let clock = TestClock::new();
    let dev = new_dev(7);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[1u8; 5000]).unwrap();
    // Its blocks mapped (delayed allocation chooses them at write back).
    fs.fsync(f).unwrap();
    assert_clean(&fs);
    let damage = |what: &dyn Fn(&mut txn::FsTx<'_>)| {
        let mut st = fs.state.write();
        let mut t = fs.begin(&st).unwrap();
        what(&mut t);
        fs.commit(&mut st, t).unwrap();
    };
    // A wrong link count.
    damage(&|t| {
        let k = keys::key(f, keys::KIND_INODE, 0);
        let mut i =
            Inode::decode(f, &t.get(items::header::TREE_FS, k).unwrap().unwrap(), 0).unwrap();
        i.nlink = 3;
        t.insert(items::header::TREE_FS, k, &i.encode()).unwrap();
    });
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("link count 3 but 1 names")),
        "{:?}",
        r.problems
    );
    // A file block also marked free.
    let ext = {
        let st = fs.state.read();
        let mut v = fs.view(&st);
        space::map::extents_in(&mut v, f, 0, 1).unwrap()[0]
    };
    damage(&|t| {
        t.insert(
            items::header::TREE_FREE_BY_BLOCK,
            node::Key::new(ext.disk, 1),
            &[],
        )
        .unwrap();
        t.insert(
            items::header::TREE_FREE_BY_SIZE,
            node::Key::new(1, ext.disk),
            &[],
        )
        .unwrap();
        t.hdr.free_blocks += 1;
    });
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems.iter().any(|p| p.contains("owned twice")),
        "{:?}",
        r.problems
    );
    // A name pointing nowhere.
    damage(&|t| {
        posix::namei::dir_add(
            t,
            ROOT_INO,
            &DirEntry {
                ino: 999_999,
                kind: FileType::Regular,
                name: b"ghost".to_vec(),
            },
        )
        .unwrap();
    });
    let r = check::check(&fs).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("which does not exist")),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("size 1 but 2 entries")),
        "{:?}",
        r.problems
    );
}

/// The checker reads every item key and every xattr value block: an inode item off offset 0
/// (one flipped bit; lookups can no longer find it), a malformed orphan item, a value block
/// stamped as if it were a tree node, and bytes past a value's end are all reported.
#[test]
fn checker_rejects_misplaced_inode_items_and_damaged_xattr_values() {
    let clock = TestClock::new();
    let dev = new_dev(8);
    let fs = mount(&dev, opts(&clock));
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let f = file_in_root(&fs, b"f");
    let value = vec![0x6b; 2 * BS as usize + 100];
    fs.setxattr(f, b"user.big", &value, XattrFlags::default())
        .unwrap();
    assert_clean(&fs);
    let damage = |what: &dyn Fn(&mut txn::FsTx<'_>)| {
        let mut st = fs.state.write();
        let mut t = fs.begin(&st).unwrap();
        what(&mut t);
        fs.commit(&mut st, t).unwrap();
    };
    let problems = || check::check(&fs).unwrap().problems;
    // Bit 31 of the inode item's offset flipped.
    damage(&|t| {
        let k = keys::key(d, keys::KIND_INODE, 0);
        let v = t.get(items::header::TREE_FS, k).unwrap().unwrap();
        t.remove(items::header::TREE_FS, k).unwrap();
        t.insert(
            items::header::TREE_FS,
            keys::key(d, keys::KIND_INODE, 0x8000_0000),
            &v,
        )
        .unwrap();
    });
    fs.state.write().inodes.shard_mut(d).remove(&d);
    assert!(matches!(fs.lookup(ROOT_INO, b"d"), Err(FsError::NotFound)));
    let p = problems();
    assert!(
        p.iter().any(|p| p.contains("offset 0x80000000, not 0")),
        "{p:?}"
    );
    // An orphan item for inode 0.
    damage(&|t| {
        t.insert(
            items::header::TREE_FS,
            keys::key(keys::ORPHAN_OWNER, keys::KIND_ORPHAN, 0),
            &[],
        )
        .unwrap();
    });
    let p = problems();
    assert!(
        p.iter().any(|p| p.contains("malformed orphan item")),
        "{p:?}"
    );
    // A value block stamped like a tree node, and bytes past the value's end.
    let blocks: Vec<u64> = blocks_of(&fs, check::Role::XattrValue);
    assert_eq!(blocks.len(), 3);
    let uuid = fs.journal().geometry().sb.uuid;
    damage(&|t| {
        let r = t.tx.buf(blocks[0]).unwrap();
        let mut b = t.tx.data(r).to_vec();
        crate::log::stamp::write_lsn_stamp(
            &mut b,
            node::NODE_LSN_OFFSET,
            crate::log::Lsn::from_raw(1 << 32),
            &uuid,
        );
        t.tx.write(r, 0, &b);
        let r = t.tx.buf(blocks[2]).unwrap();
        t.tx.write(r, BS as usize - 1, &[1]);
    });
    let p = problems();
    assert!(
        p.iter().any(|p| p.contains(&format!(
            "xattr value block {} carries a metadata LSN stamp",
            blocks[0]
        ))),
        "{p:?}"
    );
    assert!(
        p.iter().any(|p| p.contains(&format!(
            "xattr value block {} holds bytes past the value's end",
            blocks[2]
        ))),
        "{p:?}"
    );
}

/// The checker finds a leaf that the in-place edits would refuse (`node::check_leaf_layout`):
/// one whose keys are out of order (which decoding refuses too) and one whose values are not
/// packed (which decoding accepts), each made in memory from a clean fs tree leaf.
#[test]
fn the_checker_finds_a_leaf_with_keys_out_of_order_or_values_not_packed() {
    use node::{LEAF_ENTRY_BYTES, NODE_HEADER_BYTES};
    let clock = TestClock::new();
    let fs = mount(&new_dev(47), opts(&clock));
    for i in 0..3u8 {
        let f = file_in_root(&fs, &[b'f', b'0' + i]);
        fs.write(U, f, 0, &[i; 100]).unwrap();
    }
    assert_clean(&fs);
    let root = fs.read_state().hdr.lock().fs_root;
    assert_eq!(root.level, 0, "the fs tree is one leaf");
    let buf = fs.journal.buf(root.blkno).unwrap();
    let entry = |i: usize| NODE_HEADER_BYTES + i * LEAF_ENTRY_BYTES;
    let problems = || check::check(&fs).unwrap().problems;
    let clean = buf.lock().data.to_vec();
    // Keys 0 and 1 swapped, their values with them.
    {
        let mut g = buf.lock();
        let (a, b) = (
            g.data[entry(0)..entry(1)].to_vec(),
            g.data[entry(1)..entry(2)].to_vec(),
        );
        g.data[entry(0)..entry(1)].copy_from_slice(&b);
        g.data[entry(1)..entry(2)].copy_from_slice(&a);
    }
    let found = problems();
    assert!(
        found.iter().any(|p| p.contains("out of order")),
        "keys out of order not found: {found:?}"
    );
    // The last (lowest) value moved 8 bytes down into the free middle, its offset with it:
    // every key still finds its value, but the values are no longer packed.
    {
        let mut g = buf.lock();
        g.data.copy_from_slice(&clean);
        let count = usize::from(u16::from_le_bytes([g.data[6], g.data[7]]));
        let e = entry(count - 1);
        let off = usize::from(u16::from_le_bytes([g.data[e + 16], g.data[e + 17]]));
        let len = usize::from(u16::from_le_bytes([g.data[e + 18], g.data[e + 19]]));
        assert!(
            len > 0 && off - 8 >= entry(count),
            "a value with room below it"
        );
        g.data.copy_within(off..off + len, off - 8);
        g.data[e + 16..e + 18].copy_from_slice(&((off - 8) as u16).to_le_bytes());
    }
    node::Node::decode(&buf.lock().data, root.blkno, items::header::TREE_FS).expect("it decodes");
    let found = problems();
    assert!(
        found.iter().any(|p| p.contains("not packed")),
        "values not packed not found: {found:?}"
    );
    buf.lock().data.copy_from_slice(&clean);
    assert_clean(&fs);
}

/// Each transaction of an orphan's reclaim is consistent on its own: the inode's block count
/// follows the extents each batch frees, so that a check between two batches (live, or of
/// an image a crash left there) finds nothing wrong. The fs explorer's background mode found
/// "2 blocks recorded, extents map 0" with a live check beside another thread's unlink.
#[test]
fn each_reclaim_batch_leaves_the_inode_consistent() {
    let clock = TestClock::new();
    let dev = new_dev(8);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    let bs = u64::from(layout().block_size);
    // One extent per written block: more than one batch frees.
    for i in 0..40 {
        fs.write(U, f, 2 * i * bs, &vec![7u8; bs as usize]).unwrap();
    }
    fs.fsync(f).unwrap();
    fs.open_inode(f).unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
    let mut batches = 0;
    while !fs.reclaim_batch(f).unwrap() {
        batches += 1;
        assert_clean(&fs);
    }
    assert!(batches >= 2, "{batches} batches");
    fs.release_inode(f).unwrap();
    assert_clean(&fs);
}
