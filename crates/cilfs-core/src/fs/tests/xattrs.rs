//! Extended attributes: set, get, list, remove, the change xattr, and large values in reused
//! node blocks.

use super::*;

#[test]
fn xattrs_and_the_change_xattr() {
    let clock = TestClock::new();
    let dev = new_dev(3);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.setxattr(f, b"user.a", b"1", XattrFlags::default())
        .unwrap();
    fs.setxattr(f, b"user.b", &[9u8; 300], XattrFlags::default())
        .unwrap();
    // Names outside Linux's namespaces are refused as ext4 and XFS refuse them.
    for (name, unsupported) in [
        (&b"bogus.a"[..], true),
        (b"userx", true),
        (b"system.foo", true),
        (b"user.", false),
    ] {
        let r = fs.setxattr(f, name, b"1", XattrFlags::default());
        let g = fs.getxattr(f, name);
        for r in [r.map(|_| ()), g.map(|_| ())] {
            match r {
                Err(FsError::NotSupported(_)) if unsupported => {}
                Err(FsError::Invalid(_)) if !unsupported => {}
                other => panic!("{}: {other:?}", String::from_utf8_lossy(name)),
            }
        }
    }
    for name in [&b"trusted.t"[..], b"security.s"] {
        fs.setxattr(f, name, b"1", XattrFlags::default()).unwrap();
        assert_eq!(fs.getxattr(f, name).unwrap(), b"1");
        fs.removexattr(f, name).unwrap();
    }
    assert!(matches!(
        fs.setxattr(
            f,
            b"user.a",
            b"2",
            XattrFlags {
                create: true,
                replace: false
            }
        ),
        Err(FsError::Exists)
    ));
    assert!(matches!(
        fs.setxattr(
            f,
            b"user.c",
            b"2",
            XattrFlags {
                create: false,
                replace: true
            }
        ),
        Err(FsError::NoAttr)
    ));
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"1");
    let mut l = fs.listxattr(f).unwrap();
    l.sort();
    assert_eq!(
        l,
        vec![b"user.a".to_vec(), b"user.b".to_vec()],
        "the change xattr is not listed"
    );
    let c: u64 = String::from_utf8(fs.getxattr(f, items::xattr::CHANGE_XATTR).unwrap())
        .unwrap()
        .parse()
        .unwrap();
    assert!(matches!(
        fs.setxattr(f, items::xattr::CHANGE_XATTR, b"1", XattrFlags::default()),
        Err(FsError::NotPermitted)
    ));
    fs.removexattr(f, b"user.a").unwrap();
    assert!(matches!(fs.getxattr(f, b"user.a"), Err(FsError::NoAttr)));
    let c2: u64 = String::from_utf8(fs.getxattr(f, items::xattr::CHANGE_XATTR).unwrap())
        .unwrap()
        .parse()
        .unwrap();
    assert!(c2 > c);
    assert_clean(&fs);
}

/// Tree nodes freed by many unlinks are reused for large xattr values: the values must come back
/// byte for byte, never stamped with an LSN (a stamp offset left on the freed node's buffer made
/// write-back and replay overwrite bytes 16..43 of every value block).
fn xattr_values_in_reused_node_blocks(crash: bool) {
    let clock = TestClock::new();
    let dev = new_dev(if crash { 71 } else { 70 });
    let fs = mount(&dev, opts(&clock));
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let long = |i: usize| format!("{i:0>200}").into_bytes();
    for i in 0..1500 {
        fs.mknod(U, d, &long(i), items::inode::S_IFREG | 0o644, 0)
            .unwrap();
    }
    fs.sync().unwrap();
    let nodes_before = blocks_with_role(&fs, check::Role::TreeNode);
    for i in 0..1500 {
        fs.unlink(d, &long(i)).unwrap();
    }
    fs.sync().unwrap();
    let f = file_in_root(&fs, b"f");
    let mut rng = 0x1234_5678_9abc_def0u64 ^ u64::from(crash);
    let mut values = Vec::new();
    for i in 0..20 {
        let v: Vec<u8> = (0..5000)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        let name = format!("user.x{i}").into_bytes();
        fs.setxattr(f, &name, &v, XattrFlags::default()).unwrap();
        values.push((name, v));
    }
    fs.fsync(f).unwrap();
    let reused = blocks_with_role(&fs, check::Role::XattrValue)
        .intersection(&nodes_before)
        .count();
    assert!(reused > 0, "no value landed in a freed tree node");
    for (n, v) in &values {
        assert_eq!(&fs.getxattr(f, n).unwrap(), v, "before remount");
    }
    let dev = if crash {
        let c = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
        drop(fs);
        c
    } else {
        fs.unmount().unwrap();
        drop(fs);
        dev
    };
    let fs = mount(&dev, opts(&clock));
    for (n, v) in &values {
        assert!(
            &fs.getxattr(f, n).unwrap() == v,
            "{} differs after remount ({reused} values in reused blocks)",
            String::from_utf8_lossy(n)
        );
    }
    assert_clean(&fs);
}

#[test]
fn xattr_values_in_reused_node_blocks_survive_a_clean_unmount() {
    xattr_values_in_reused_node_blocks(false);
}

#[test]
fn xattr_values_in_reused_node_blocks_survive_a_crash() {
    xattr_values_in_reused_node_blocks(true);
}
