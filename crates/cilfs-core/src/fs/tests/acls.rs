//! POSIX ACLs: validated, kept in step with the mode, inherited, refused with noacl, and
//! checked.

use super::*;

/// An ACL xattr value from (tag, perm, id) entries.
pub(crate) fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(t, p, i) in entries {
        v.extend_from_slice(&t.to_le_bytes());
        v.extend_from_slice(&p.to_le_bytes());
        v.extend_from_slice(&i.to_le_bytes());
    }
    v
}

fn acl_of(fs: &Fs, ino: u64, name: &[u8]) -> Option<acl::Acl> {
    match fs.getxattr(ino, name) {
        Ok(v) => acl::Acl::parse(&v).unwrap(),
        Err(FsError::NoAttr) => None,
        Err(e) => panic!("{e}"),
    }
}

const NOBODY: u32 = 65534;

const X: u32 = u32::MAX;

/// ACLs: validated before they are stored, kept in step with the mode both ways (chmod
/// rewrites the mask, an access ACL sets the group bits), a minimal ACL folded into the mode,
/// inherited from a directory's default ACL instead of the umask, and kept across a remount
/// and a crash.
#[test]
fn acls_are_validated_kept_in_step_with_the_mode_and_inherited() {
    use acl::{ACCESS, DEFAULT, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    let clock = TestClock::new();
    let dev = new_dev(90);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    let deny = acl_value(&[
        (USER_OBJ, 6, X),
        (USER, 0, NOBODY),
        (GROUP_OBJ, 4, X),
        (MASK, 4, X),
        (OTHER, 4, X),
    ]);
    fs.setxattr(f, ACCESS, &deny, XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getxattr(f, ACCESS).unwrap(), deny);
    assert_eq!(fs.getattr(f).unwrap().perm, 0o644);
    // chmod rewrites the mask (not the owning group's entry).
    let chmod = |mode: u32| {
        fs.setattr(
            U,
            f,
            SetAttr {
                mode: Some(mode),
                ..Default::default()
            },
        )
        .unwrap()
    };
    chmod(0o600);
    let a = acl_of(&fs, f, ACCESS).unwrap();
    assert_eq!(a.mode_bits(), 0o600);
    assert!(a.entries().contains(&acl::Entry {
        tag: GROUP_OBJ,
        perm: 4,
        id: X
    }));
    // An ACL with a wider mask widens the group bits.
    let grant = acl_value(&[
        (USER_OBJ, 6, X),
        (USER, 4, NOBODY),
        (GROUP_OBJ, 0, X),
        (MASK, 6, X),
        (OTHER, 0, X),
    ]);
    fs.setxattr(f, ACCESS, &grant, XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o660);
    // A minimal ACL is the mode: nothing is stored.
    let minimal = acl_value(&[(USER_OBJ, 7, X), (GROUP_OBJ, 5, X), (OTHER, 0, X)]);
    fs.setxattr(f, ACCESS, &minimal, XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o750);
    assert!(acl_of(&fs, f, ACCESS).is_none());
    // Malformed ACLs are refused and change nothing.
    for bad in [
        acl_value(&[
            (USER_OBJ, 6, X),
            (USER, 4, 7),
            (GROUP_OBJ, 4, X),
            (OTHER, 4, X),
        ]),
        acl_value(&[(USER_OBJ, 9, X), (GROUP_OBJ, 4, X), (OTHER, 4, X)]),
        vec![2, 0, 0, 0, 1],
    ] {
        assert!(matches!(
            fs.setxattr(f, ACCESS, &bad, XattrFlags::default()),
            Err(FsError::Invalid(_))
        ));
    }
    assert_eq!(fs.getattr(f).unwrap().perm, 0o750);
    // A default ACL belongs to directories.
    assert!(matches!(
        fs.setxattr(f, DEFAULT, &deny, XattrFlags::default()),
        Err(FsError::Access)
    ));
    // Inheritance: the default ACL replaces the umask.
    let umask = Cred { umask: 0o022, ..U };
    let d = fs.mkdir(umask, ROOT_INO, b"d", 0o777).unwrap();
    assert_eq!(d.perm, 0o755, "no default ACL: the umask applies");
    let def = acl_value(&[
        (USER_OBJ, 7, X),
        (USER, 7, NOBODY),
        (GROUP_OBJ, 5, X),
        (MASK, 7, X),
        (OTHER, 5, X),
    ]);
    fs.setxattr(d.ino, DEFAULT, &def, XattrFlags::default())
        .unwrap();
    let x = fs
        .mknod(umask, d.ino, b"x", items::inode::S_IFREG | 0o666, 0)
        .unwrap();
    assert_eq!(x.perm, 0o664);
    let xa = acl_of(&fs, x.ino, ACCESS).unwrap();
    assert_eq!(xa.mode_bits(), 0o664);
    assert!(acl_of(&fs, x.ino, DEFAULT).is_none());
    let y = fs.mkdir(umask, d.ino, b"y", 0o777).unwrap();
    assert_eq!(y.perm, 0o775);
    assert_eq!(fs.getxattr(y.ino, DEFAULT).unwrap(), def);
    let s = fs.symlink(umask, d.ino, b"s", b"x").unwrap();
    assert!(acl_of(&fs, s.ino, ACCESS).is_none(), "symlinks get no ACL");
    assert_clean(&fs);
    // Kept across a clean remount and a crash after fsync.
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(acl_of(&fs, x.ino, ACCESS).unwrap(), xa);
    fs.setxattr(f, ACCESS, &deny, XattrFlags::default())
        .unwrap();
    fs.fsync(f).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert_eq!(fs.getxattr(f, ACCESS).unwrap(), deny);
    assert_eq!(fs.getxattr(y.ino, DEFAULT).unwrap(), def);
    assert_clean(&fs);
}

/// Setting an access ACL clears set-group-ID for a caller outside the file's group, as Linux
/// does; and with `noacl` the ACL names are refused.
#[test]
fn acl_set_by_an_outsider_clears_set_group_id_and_noacl_refuses_acls() {
    use acl::{ACCESS, GROUP_OBJ, OTHER, USER_OBJ};
    let clock = TestClock::new();
    let dev = new_dev(91);
    let fs = mount(&dev, opts(&clock));
    let f = fs
        .mknod(U, ROOT_INO, b"f", items::inode::S_IFREG | 0o2755, 0)
        .unwrap()
        .ino;
    let v = acl_value(&[(USER_OBJ, 7, X), (GROUP_OBJ, 5, X), (OTHER, 4, X)]);
    fs.set_xattr_as(U, f, ACCESS, Some(&v), XattrFlags::default())
        .unwrap();
    assert_eq!(
        fs.getattr(f).unwrap().perm,
        0o2754,
        "the owner is in the group"
    );
    let outsider = Cred::user(1000, 2000);
    fs.set_xattr_as(outsider, f, ACCESS, Some(&v), XattrFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o754);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(
        &dev,
        FsOptions {
            acl: false,
            ..opts(&clock)
        },
    );
    assert!(matches!(
        fs.setxattr(f, ACCESS, &v, XattrFlags::default()),
        Err(FsError::NotSupported(_))
    ));
    assert!(matches!(
        fs.getxattr(f, ACCESS),
        Err(FsError::NotSupported(_))
    ));
}

/// The checker finds an access ACL that disagrees with the mode, and a default ACL on a file.
#[test]
fn checker_finds_acls_out_of_step() {
    use acl::{ACCESS, DEFAULT, GROUP_OBJ, OTHER, USER_OBJ};
    let clock = TestClock::new();
    let fs = mount(&new_dev(92), opts(&clock));
    let f = file_in_root(&fs, b"f");
    let v = acl_value(&[(USER_OBJ, 7, X), (GROUP_OBJ, 0, X), (OTHER, 0, X)]);
    let mut st = fs.state.write();
    fs.with_tx(&mut st, |t, _| {
        posix::xattr::put(t, f, ACCESS, Some(&v), XattrFlags::default())?;
        posix::xattr::put(t, f, DEFAULT, Some(&v), XattrFlags::default())?;
        Ok(((), vec![]))
    })
    .unwrap();
    drop(st);
    let p = check::check(&fs).unwrap().problems;
    assert!(
        p.iter()
            .any(|p| p.contains("mode 644 but its access ACL gives 700")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("default ACL on a non-directory")),
        "{p:?}"
    );
}
