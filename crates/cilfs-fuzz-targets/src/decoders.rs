//! One body per decoder of a metadata item or block: tree nodes (whole and the raw paths that
//! read or edit a node without decoding it), inode, directory, extent and xattr items, ACLs and
//! the filesystem header. Each decodes the input as found on disk, and checks what an accepted
//! value promises: that it encodes back to itself, and that an edit in place gives the node the
//! decoding way gives.

use cilfs_core::fs::items::dir::{decode_bucket, decode_slotted, encode_bucket};
use cilfs_core::fs::items::extent::Extent;
use cilfs_core::fs::items::header::{Header, TREE_FS};
use cilfs_core::fs::items::inode::{
    Inode, Timespec, EXTSIZE_MAX_BLOCKS, INODE_ITEM_BYTES, S_IFDIR, S_IFREG,
};
use cilfs_core::fs::items::xattr;
use cilfs_core::fs::rules::acl::Acl;
use cilfs_core::fs::tree::btree::Root;
use cilfs_core::fs::tree::node::{
    check_leaf_layout, leaf_put_raw, leaf_remove_raw, raw_seek, raw_step, unused_stretch, Body,
    Key, KeyRange, Node, Seek, NODE_HEADER_BYTES,
};
use cilfs_core::fs::DirEntry;
use cilfs_core::fs::FileType;

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

/// The key of the 16 bytes at `at`, if the input has them.
fn key_at(b: &[u8], at: usize) -> Option<Key> {
    Some(Key::new(u64_at(b, at)?, u64_at(b, at + 8)?))
}

/// A tree node block: the input is the whole block (its length the block size), checked
/// against the tree, block number and level its own header claims, so that only the magic
/// stands between the fuzzer and the body.
pub fn node(data: &[u8]) {
    let (level, tree) = (
        data.get(4).copied().unwrap_or(0),
        data.get(5).copied().unwrap_or(0),
    );
    let blkno = u64_at(data, 8).unwrap_or(0);
    let decoded = Node::decode(data, blkno, tree);
    let (s, e) = unused_stretch(data);
    assert!(s <= e && e <= data.len(), "unused stretch {s}..{e}");
    let _ = check_leaf_layout(data, blkno, tree);

    // Keys to look for: either end, the first entry's, and one taken from the input's tail.
    let mut probes = vec![Key::MIN, Key::MAX];
    probes.extend(key_at(data, NODE_HEADER_BYTES));
    probes.extend(data.len().checked_sub(16).and_then(|at| key_at(data, at)));
    for k in probes.clone() {
        let _ = raw_step(data, blkno, tree, level, k);
        let _ = raw_seek(data, blkno, tree, k, Seek::AtOrAfter);
        let _ = raw_seek(data, blkno, tree, k, Seek::AtOrBefore);
    }

    if let Ok(n) = &decoded {
        // What a node that decodes promises: a lookup on its encoded block finds what a search
        // of it finds, and it encodes back to itself when it fits (values a corrupt leaf
        // shares may sum past the block: the tree splits such a node before writing it).
        for &k in &probes {
            let raw = raw_step(data, blkno, tree, level, k);
            if let (Body::Leaf(items), Ok(got)) = (&n.body, &raw) {
                let want = match items.binary_search_by(|(x, _)| x.cmp(&k)) {
                    Ok(i) => cilfs_core::fs::tree::node::RawStep::Found(items[i].1.to_vec()),
                    Err(_) => cilfs_core::fs::tree::node::RawStep::Absent,
                };
                assert_eq!(*got, want, "raw step for {k:?}");
            }
            assert!(raw.is_ok(), "a node that decodes fails a raw step: {raw:?}");
        }
        if n.encoded_bytes() <= data.len() {
            let mut out = data.to_vec();
            n.encode_into(blkno, &mut out);
            let again = Node::decode(&out, blkno, tree);
            assert_eq!(again.as_ref().ok(), Some(n), "re-encoded node: {again:?}");
            for (s, e) in n.used_ranges(data.len()) {
                assert!(s < e && e <= data.len());
            }
        }
    }

    // Edits in place, on copies: a key from the input's tail (or the first entry's) with a
    // value of the input's last bytes.
    let key = probes.last().copied().unwrap_or(Key::MIN);
    let vlen = usize::from(data.first().copied().unwrap_or(0) % 48).min(data.len());
    let val = &data[data.len() - vlen..];
    let mut put = data.to_vec();
    let got = leaf_put_raw(&mut put, blkno, tree, key, val, KeyRange::ALL);
    if let (Ok(Some(_)), Ok(n)) = (&got, &decoded) {
        let mut want = n.clone();
        if let Body::Leaf(items) = &mut want.body {
            match items.binary_search_by(|(x, _)| x.cmp(&key)) {
                Ok(i) => items[i].1 = val.to_vec().into(),
                Err(i) => items.insert(i, (key, val.to_vec().into())),
            }
        }
        let after = Node::decode(&put, blkno, tree);
        assert_eq!(after.as_ref().ok(), Some(&want), "leaf after a raw put");
    }
    let mut removed = data.to_vec();
    let got = leaf_remove_raw(&mut removed, blkno, tree, key, KeyRange::ALL);
    if let (Ok(Some(_)), Ok(n)) = (&got, &decoded) {
        let mut want = n.clone();
        if let Body::Leaf(items) = &mut want.body {
            items.retain(|(x, _)| *x != key);
        }
        let after = Node::decode(&removed, blkno, tree);
        assert_eq!(after.as_ref().ok(), Some(&want), "leaf after a raw remove");
    }
}

/// A leaf and an interior node in blocks of a few sizes, and a leaf of one shared value.
pub fn node_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for bs in [512usize, 2048, 4096] {
        let leaf = Node {
            tree: TREE_FS,
            level: 0,
            body: Body::Leaf(vec![
                (Key::new(1, 1), b"inode".to_vec().into()),
                (Key::new(1, 2), Vec::new().into()),
                (Key::new(2, 7), vec![9; 40].into()),
                (Key::new(3, 0), b"x".to_vec().into()),
            ]),
        };
        let mut b = vec![0u8; bs];
        leaf.encode_into(12, &mut b);
        out.push(b);
        let interior = Node {
            tree: 2,
            level: 1,
            body: Body::Interior(vec![
                (Key::MIN, 20),
                (Key::new(5, 0), 21),
                (Key::new(9, 9), 22),
            ]),
        };
        let mut b = vec![0u8; bs];
        interior.encode_into(13, &mut b);
        out.push(b);
    }
    out
}

/// An inode item, decoded for inode 7, and what an accepted inode feeds: its attributes at
/// every block size, its generation, and its encoding.
pub fn inode(data: &[u8]) {
    let Ok(i) = Inode::decode(7, data, 3) else {
        return;
    };
    for bs in [2048u32, 4096, 65536] {
        let a = i.attr(bs);
        assert_eq!(a.size, i.size);
    }
    let _ = i.generation();
    let _ = i.ordered_size();
    for t in [i.atime, i.mtime, i.ctime, i.crtime] {
        for g in [0, 1, 1000, 1_000_000_000, u32::MAX] {
            let _ = t.truncated(g);
        }
    }
    // An accepted extent size hint is one a regular file or directory may hold, and bounded;
    // the item is long exactly when it carries one.
    assert!(i.extsize <= EXTSIZE_MAX_BLOCKS, "{i:?}");
    assert!(i.extsize == 0 || i.may_have_extsize(), "{i:?}");
    let enc = i.encode();
    assert_eq!(enc.len() == INODE_ITEM_BYTES, i.extsize == 0, "{i:?}");
    let again = Inode::decode(7, &enc, 3);
    assert_eq!(again.as_ref().ok(), Some(&i), "re-encoded inode: {again:?}");
}

pub fn inode_seeds() -> Vec<Vec<u8>> {
    let t = Timespec {
        sec: 1_700_000_000,
        nsec: 5,
    };
    let base = Inode {
        ino: 7,
        mode: S_IFREG | 0o644,
        uid: 1000,
        gid: 1000,
        nlink: 1,
        size: 10_000,
        disk_size: 10_000,
        dirty_from: u64::MAX,
        blocks: 5,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        rdev: 0,
        change: 3,
        flags: 0,
        parent: 0,
        project: 0,
        extsize: 0,
    };
    let dir = Inode {
        mode: S_IFDIR | 0o755,
        nlink: 2,
        parent: 1,
        ..base.clone()
    };
    let mut short = base.encode().to_vec();
    short.truncate(INODE_ITEM_BYTES - 1);
    // The long item, with an extent size hint: a file's own and a directory's to pass on.
    let hinted = Inode {
        blocks: 0,
        extsize: 16,
        ..base.clone()
    };
    let dir_hinted = Inode {
        extsize: EXTSIZE_MAX_BLOCKS,
        ..dir.clone()
    };
    let mut long = hinted.encode().to_vec();
    long.push(0);
    vec![
        base.encode().to_vec(),
        dir.encode().to_vec(),
        short,
        hinted.encode().to_vec(),
        dir_hinted.encode().to_vec(),
        long,
    ]
}

/// A directory entry bucket of directory 9: what decodes encodes back to what decodes.
pub fn dir(data: &[u8]) {
    let plain = decode_bucket(data, 9);
    let slotted = decode_slotted(data, 9);
    assert_eq!(plain.is_ok(), slotted.is_ok());
    let Ok(slotted) = slotted else {
        return;
    };
    assert!(slotted.windows(2).all(|w| w[0].0 <= w[1].0), "slot order");
    assert!(slotted.iter().all(|(_, e)| !e.name.is_empty()));
    let again = decode_slotted(&encode_bucket(&slotted), 9);
    assert_eq!(again.as_ref().ok(), Some(&slotted), "re-encoded bucket");
}

pub fn dir_seeds() -> Vec<Vec<u8>> {
    let e = |ino: u64, kind: FileType, name: &[u8]| DirEntry {
        ino,
        kind,
        name: name.to_vec(),
    };
    vec![
        encode_bucket(&[(0, e(5, FileType::Regular, b"a-file"))]),
        encode_bucket(&[
            (0, e(5, FileType::Regular, b"one")),
            (3, e(6, FileType::Directory, b"two")),
            (30, e(7, FileType::Symlink, &[b'n'; 255])),
        ]),
    ]
}

/// An extent item: the first 8 bytes of the input are the file block its key holds (cut to
/// the key's 56 bits), the rest the value.
pub fn extent(data: &[u8]) {
    let file = u64_at(data, 0).unwrap_or(0) & ((1 << 56) - 1);
    let v = data.get(8..).unwrap_or(&[]);
    let Ok(e) = Extent::decode(file, v) else {
        return;
    };
    assert!(e.end() > e.file);
    assert!(
        e.disk.checked_add(e.len).is_some(),
        "extent past 2^64 blocks"
    );
    let again = Extent::decode(file, &e.encode());
    assert_eq!(again.as_ref().ok(), Some(&e), "re-encoded extent");
}

pub fn extent_seeds() -> Vec<Vec<u8>> {
    let e = Extent {
        file: 4,
        disk: 300,
        len: 8,
        unwritten: false,
    };
    let mut a = 4u64.to_le_bytes().to_vec();
    a.extend_from_slice(&e.encode());
    let mut u = 4u64.to_le_bytes().to_vec();
    u.extend_from_slice(
        &Extent {
            unwritten: true,
            ..e
        }
        .encode(),
    );
    let mut far = ((1u64 << 56) - 1).to_le_bytes().to_vec();
    far.extend_from_slice(
        &Extent {
            file: 0,
            disk: u64::MAX,
            len: u64::from(u32::MAX),
            unwritten: false,
        }
        .encode(),
    );
    vec![a, u, far]
}

/// An xattr bucket of inode 9: it encodes back to itself, and the ACLs it holds inline are
/// parsed as a getxattr or an inheritance would.
pub fn xattr(data: &[u8]) {
    let Ok(entries) = xattr::decode(data, 9) else {
        return;
    };
    for e in &entries {
        if let xattr::Value::Inline(v) = &e.value {
            if cilfs_core::fs::rules::acl::kind_of(&e.name).is_some() {
                acl(v);
            }
        }
    }
    let again = xattr::decode(&xattr::encode(&entries), 9);
    assert_eq!(
        again.as_ref().ok(),
        Some(&entries),
        "re-encoded xattr bucket"
    );
}

pub fn xattr_seeds() -> Vec<Vec<u8>> {
    let acl_value = acl_seeds().swap_remove(1);
    vec![
        xattr::encode(&[xattr::Entry {
            name: b"user.a".to_vec(),
            value: xattr::Value::Inline(b"value".to_vec()),
        }]),
        xattr::encode(&[
            xattr::Entry {
                name: cilfs_core::fs::rules::acl::ACCESS.to_vec(),
                value: xattr::Value::Inline(acl_value),
            },
            xattr::Entry {
                name: b"user.big".to_vec(),
                value: xattr::Value::Remote {
                    start: 40,
                    blocks: 2,
                    len: 3000,
                },
            },
        ]),
    ]
}

/// An ACL as a setxattr hands it over or an xattr item holds it: a valid one is canonical
/// once parsed, and mode changes keep it valid.
pub fn acl(data: &[u8]) {
    let Ok(Some(a)) = Acl::parse(data) else {
        return;
    };
    let again = Acl::parse(&a.encode());
    assert_eq!(
        again.as_ref().ok(),
        Some(&Some(a.clone())),
        "re-encoded ACL"
    );
    let _ = a.is_minimal();
    let mode = a.mode_bits();
    let mut b = a.clone();
    b.chmod(mode ^ 0o777);
    assert!(
        matches!(Acl::parse(&b.encode()), Ok(Some(_))),
        "ACL after chmod"
    );
    let mut c = a;
    let _ = c.create_mask(0o666);
    assert!(
        matches!(Acl::parse(&c.encode()), Ok(Some(_))),
        "ACL after create"
    );
}

pub fn acl_seeds() -> Vec<Vec<u8>> {
    let acl = |entries: &[(u16, u16, u32)]| {
        let mut v = 2u32.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    };
    use cilfs_core::fs::rules::acl::{GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    vec![
        acl(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]),
        acl(&[
            (USER_OBJ, 7, u32::MAX),
            (USER, 5, 1000),
            (USER, 4, 1001),
            (GROUP_OBJ, 5, u32::MAX),
            (GROUP, 1, 50),
            (MASK, 7, u32::MAX),
            (OTHER, 0, u32::MAX),
        ]),
        acl(&[]),
    ]
}

/// The filesystem header block: the input is the whole block. One that decodes encodes back
/// to itself.
pub fn header(data: &[u8]) {
    let Ok(h) = Header::decode(data, 4) else {
        return;
    };
    let mut out = vec![0u8; data.len()];
    h.encode_into(&mut out);
    let again = Header::decode(&out, 4);
    assert_eq!(again.as_ref().ok(), Some(&h), "re-encoded header");
    let before = Header {
        next_ino: h.next_ino.wrapping_add(5),
        ..h.clone()
    };
    let mut moved = before.clone();
    moved.apply_counter_changes(&h.counter_changes(&before));
}

pub fn header_seeds() -> Vec<Vec<u8>> {
    let h = Header {
        fs_root: Root {
            blkno: 70,
            level: 1,
        },
        bno_root: Root {
            blkno: 71,
            level: 0,
        },
        size_root: Root {
            blkno: 72,
            level: 0,
        },
        next_ino: 100,
        free_blocks: 50,
        inode_count: 60,
        data_start: 66,
        data_end: 128,
        freelist: vec![73, 74, 75],
    };
    [2048usize, 4096]
        .into_iter()
        .map(|bs| {
            let mut b = vec![0u8; bs];
            h.encode_into(&mut b);
            b
        })
        .collect()
}
