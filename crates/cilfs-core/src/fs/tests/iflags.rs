//! Inode flags users set (chattr): each one enforced (EPERM where Linux refuses), kept across
//! a remount and a crash, and the project ID set beside them.

#![allow(clippy::unwrap_used)]

use crate::fs::items::inode::{
    INODE_APPEND, INODE_IMMUTABLE, INODE_NOATIME, INODE_NODUMP, INODE_SYNC, S_IFDIR, S_IFREG,
};
use crate::fs::tests::{assert_clean, file_in_root, mount, new_dev, U};
use crate::fs::types::{Cred, FileAttr, RenameFlags, SetAttr, SetTime, XattrFlags};
use crate::fs::*;
use cilfs_device::CrashOptions;

fn set(fs: &Fs, ino: u64, flags: u32) {
    let project = fs.file_attr(ino).unwrap().project;
    fs.set_file_attr(
        Cred::ROOT,
        ino,
        FileAttr {
            flags,
            project,
            extsize: 0,
        },
    )
    .unwrap();
}

fn eperm<T: std::fmt::Debug>(r: FsResult<T>) {
    assert!(matches!(r, Err(FsError::NotPermitted)), "{r:?}");
}

#[test]
fn an_immutable_file_refuses_every_change_but_of_its_flags() {
    let dev = new_dev(1);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, b"data").unwrap();
    set(&fs, f, INODE_IMMUTABLE);
    eperm(fs.write(U, f, 0, b"x"));
    eperm(fs.write(U, f, 4, b"x"));
    let trunc = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    eperm(fs.setattr(U, f, trunc));
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    eperm(fs.setattr(U, f, chmod));
    let touch = SetAttr {
        mtime: Some(SetTime::Now),
        ..SetAttr::default()
    };
    eperm(fs.setattr(U, f, touch));
    eperm(fs.fallocate(U, f, 0, 4096, true, false));
    eperm(fs.zero_range(U, f, 0, 4096, true));
    eperm(fs.collapse_range(U, f, 0, 4096));
    eperm(fs.insert_range(U, f, 0, 4096));
    eperm(fs.link(f, ROOT_INO, b"g"));
    eperm(fs.unlink(ROOT_INO, b"f"));
    eperm(fs.rename(ROOT_INO, b"f", ROOT_INO, b"h", RenameFlags::default()));
    eperm(fs.set_xattr_as(U, f, b"user.a", Some(b"1"), XattrFlags::default()));
    eperm(fs.open_as(f, true, false));
    // Reading and opening for reading go on; the owner cannot clear the flag, root can.
    fs.open_as(f, false, false).unwrap();
    fs.release_inode(f).unwrap();
    assert_eq!(fs.read(f, 0, 10).unwrap(), b"data");
    eperm(fs.set_file_attr(U, f, FileAttr::default()));
    set(&fs, f, 0);
    fs.write(U, f, 0, b"D").unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert_clean(&fs);
}

#[test]
fn an_immutable_directory_gains_and_loses_no_names() {
    let fs = mount(&new_dev(2), FsOptions::default());
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let inside = fs.mknod(U, d, b"in", S_IFREG | 0o644, 0).unwrap().ino;
    set(&fs, d, INODE_IMMUTABLE);
    eperm(fs.mknod(U, d, b"new", S_IFREG | 0o644, 0));
    eperm(fs.mkdir(U, d, b"sub", 0o755));
    eperm(fs.symlink(U, d, b"l", b"t"));
    eperm(fs.unlink(d, b"in"));
    eperm(fs.link(inside, d, b"in2"));
    eperm(fs.rename(d, b"in", ROOT_INO, b"out", RenameFlags::default()));
    eperm(fs.rmdir(ROOT_INO, b"d"));
    // What is in it may still change.
    fs.write(U, inside, 0, b"x").unwrap();
    set(&fs, d, 0);
    fs.unlink(d, b"in").unwrap();
    assert_clean(&fs);
}

#[test]
fn an_append_only_file_grows_at_its_end_only() {
    let fs = mount(&new_dev(3), FsOptions::default());
    let f = file_in_root(&fs, b"log");
    fs.write(U, f, 0, b"one ").unwrap();
    set(&fs, f, INODE_APPEND);
    fs.write(U, f, 4, b"two").unwrap();
    eperm(fs.write(U, f, 0, b"X"));
    eperm(fs.write(U, f, 100, b"X"));
    eperm(fs.open_as(f, true, false));
    fs.open_as(f, true, true).unwrap();
    fs.release_inode(f).unwrap();
    let trunc = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    eperm(fs.setattr(U, f, trunc));
    eperm(fs.fallocate(U, f, 0, 2048, true, true));
    eperm(fs.zero_range(U, f, 0, 2048, true));
    eperm(fs.collapse_range(U, f, 0, 4096));
    eperm(fs.insert_range(U, f, 0, 4096));
    // Preallocation adds only, times set to now need only write access.
    fs.fallocate(U, f, 0, 4096, true, false).unwrap();
    let touch = SetAttr {
        mtime: Some(SetTime::Now),
        ..SetAttr::default()
    };
    fs.setattr(U, f, touch).unwrap();
    eperm(fs.unlink(ROOT_INO, b"log"));
    eperm(fs.rename(ROOT_INO, b"log", ROOT_INO, b"x", RenameFlags::default()));
    eperm(fs.set_xattr_as(U, f, b"user.a", None, XattrFlags::default()));
    assert_eq!(fs.read(f, 0, 100).unwrap(), b"one two");
    // An append-only directory gains names, and loses none.
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    set(&fs, d, INODE_APPEND);
    fs.mknod(U, d, b"a", S_IFREG | 0o644, 0).unwrap();
    eperm(fs.unlink(d, b"a"));
    assert_clean(&fs);
}

#[test]
fn setting_flags_is_for_the_owner_immutable_for_root_unknown_ones_not_at_all() {
    let fs = mount(&new_dev(4), FsOptions::default());
    let f = file_in_root(&fs, b"f");
    let other = Cred::user(1001, 1001);
    let want = |flags| FileAttr {
        flags,
        project: 0,
        extsize: 0,
    };
    fs.set_file_attr(U, f, want(INODE_NODUMP | INODE_NOATIME))
        .unwrap();
    eperm(fs.set_file_attr(other, f, want(0)));
    eperm(fs.set_file_attr(U, f, want(INODE_IMMUTABLE)));
    eperm(fs.set_file_attr(U, f, want(INODE_APPEND)));
    eperm(fs.set_file_attr(
        U,
        f,
        FileAttr {
            flags: INODE_NODUMP,
            project: 7,
            extsize: 0,
        },
    ));
    assert!(matches!(
        fs.set_file_attr(Cred::ROOT, f, want(1 << 20)),
        Err(FsError::NotSupported(_))
    ));
    assert_eq!(
        fs.file_attr(f).unwrap(),
        FileAttr {
            flags: INODE_NODUMP | INODE_NOATIME,
            project: 0,
            extsize: 0,
        }
    );
}

#[test]
fn noatime_keeps_the_access_time_and_sync_makes_writes_durable() {
    let dev = new_dev(5);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, b"data").unwrap();
    set(&fs, f, INODE_NOATIME | INODE_SYNC);
    fs.sync().unwrap();
    // The write moved mtime past atime: relatime would move atime at this read.
    let before = fs.getattr(f).unwrap().atime;
    fs.read(f, 0, 4).unwrap();
    assert_eq!(fs.getattr(f).unwrap().atime, before);
    fs.write(U, f, 4, b" more").unwrap();
    // No force since: the write's own reply made it durable.
    let crashed = mount(
        &Arc::new(dev.crash(CrashOptions { torn_writes: true })),
        FsOptions::default(),
    );
    assert_eq!(crashed.read(f, 0, 100).unwrap(), b"data more");
    assert_eq!(
        crashed.file_attr(f).unwrap().flags,
        INODE_NOATIME | INODE_SYNC
    );
    assert_clean(&crashed);
}

#[test]
fn flags_and_project_survive_a_remount_and_a_crash() {
    let dev = new_dev(6);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"f");
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let fa = FileAttr {
        flags: INODE_IMMUTABLE | INODE_NODUMP,
        project: 42,
        extsize: 0,
    };
    fs.set_file_attr(Cred::ROOT, f, fa).unwrap();
    set(&fs, d, INODE_APPEND);
    fs.fsync(f).unwrap();
    fs.fsync(d).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    let after = mount(&crashed, FsOptions::default());
    assert_eq!(after.file_attr(f).unwrap(), fa);
    assert_eq!(after.file_attr(d).unwrap().flags, INODE_APPEND);
    eperm(after.write(U, f, 0, b"x"));
    assert_clean(&after);
    after.unmount().unwrap();
    drop(after);
    let again = mount(&crashed, FsOptions::default());
    assert_eq!(again.file_attr(f).unwrap(), fa);
    assert_eq!(
        again.getattr(d).unwrap().mode & crate::fs::items::inode::S_IFMT,
        S_IFDIR
    );
}
