//! Extent size hints (`xfs_io extsize`, FS_IOC_FSSETXATTR's fsx_extsize): set and read back on
//! a file without data blocks, refused (EINVAL) once it has some and for hints XFS refuses,
//! taken by what is made in a directory that has one, and kept across a remount and a crash.

#![allow(clippy::unwrap_used)]

use crate::fs::items::inode::{INODE_NODUMP, S_IFDIR, S_IFLNK, S_IFREG};
use crate::fs::tests::{assert_clean, file_in_root, mount, new_dev, BS, U};
use crate::fs::types::{Cred, FileAttr, SetAttr, ATTR_EXTSIZE, ATTR_EXTSZINHERIT};
use crate::fs::*;
use cilfs_device::CrashOptions;

fn hint(flags: u32, extsize: u32) -> FileAttr {
    FileAttr {
        flags,
        project: 0,
        extsize,
    }
}

fn einval<T: std::fmt::Debug>(r: FsResult<T>) {
    assert!(matches!(r, Err(FsError::Invalid(_))), "{r:?}");
}

#[test]
fn a_hint_is_set_read_back_and_cleared_on_a_file_without_data() {
    let fs = mount(&new_dev(1), FsOptions::default());
    let f = file_in_root(&fs, b"f");
    assert_eq!(fs.file_attr(f).unwrap(), hint(0, 0));
    let set = fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 2 * BS)).unwrap();
    assert_eq!(set, hint(ATTR_EXTSIZE, 2 * BS));
    assert_eq!(fs.file_attr(f).unwrap(), hint(ATTR_EXTSIZE, 2 * BS));
    // Another hint, then 0 with the flag (what `xfs_io extsize 0` sends): no hint, no flag.
    fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 8 * BS)).unwrap();
    assert_eq!(fs.file_attr(f).unwrap().extsize, 8 * BS);
    let cleared = fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 0)).unwrap();
    assert_eq!(cleared, hint(0, 0));
    assert_eq!(fs.file_attr(f).unwrap(), hint(0, 0));
    // A size with no blocks is no data (a truncate up maps nothing).
    let up = SetAttr {
        size: Some(10 * u64::from(BS)),
        ..SetAttr::default()
    };
    fs.setattr(U, f, up).unwrap();
    fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 4 * BS)).unwrap();
    // Someone else may not; the owner's other flags leave the hint as it is.
    assert!(matches!(
        fs.set_file_attr(Cred::user(1001, 1001), f, hint(ATTR_EXTSIZE, 2 * BS)),
        Err(FsError::NotPermitted)
    ));
    fs.set_file_attr(U, f, hint(ATTR_EXTSIZE | INODE_NODUMP, 4 * BS))
        .unwrap();
    assert_eq!(
        fs.file_attr(f).unwrap(),
        hint(ATTR_EXTSIZE | INODE_NODUMP, 4 * BS)
    );
    assert_clean(&fs);
}

#[test]
fn a_file_with_data_blocks_keeps_its_hint_until_truncated_to_none() {
    let fs = mount(&new_dev(2), FsOptions::default());
    let f = file_in_root(&fs, b"f");
    fs.write(U, f, 0, &[7u8; 3000]).unwrap();
    // Blocks mapped by the write, before any write back (XFS: delayed allocation).
    einval(fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 2 * BS)));
    fs.sync().unwrap();
    einval(fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 2 * BS)));
    assert_eq!(fs.file_attr(f).unwrap(), hint(0, 0));
    // The hint it has (none) given again, with another flag: taken.
    fs.set_file_attr(U, f, hint(INODE_NODUMP, 0)).unwrap();
    let trunc = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    fs.setattr(U, f, trunc).unwrap();
    fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 2 * BS)).unwrap();
    fs.write(U, f, 0, b"data").unwrap();
    einval(fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 4 * BS)));
    einval(fs.set_file_attr(U, f, hint(0, 0)));
    fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 2 * BS)).unwrap();
    assert_eq!(fs.file_attr(f).unwrap(), hint(ATTR_EXTSIZE, 2 * BS));
    // Preallocated blocks are data blocks too.
    let g = file_in_root(&fs, b"g");
    fs.fallocate(U, g, 0, u64::from(BS), true, false).unwrap();
    einval(fs.set_file_attr(U, g, hint(ATTR_EXTSIZE, 2 * BS)));
    assert_clean(&fs);
}

#[test]
fn hints_xfs_refuses_are_invalid() {
    let fs = mount(&new_dev(3), FsOptions::default());
    let f = file_in_root(&fs, b"f");
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let l = fs.symlink(U, ROOT_INO, b"l", b"f").unwrap().ino;
    // Not a multiple of the block size; without its flag.
    einval(fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, BS + 512)));
    einval(fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 512)));
    einval(fs.set_file_attr(U, f, hint(0, 2 * BS)));
    // Each flag for its type only, and neither for a symlink.
    einval(fs.set_file_attr(U, f, hint(ATTR_EXTSZINHERIT, 2 * BS)));
    einval(fs.set_file_attr(U, d, hint(ATTR_EXTSIZE, 2 * BS)));
    einval(fs.set_file_attr(U, l, hint(ATTR_EXTSIZE, 2 * BS)));
    einval(fs.set_file_attr(U, l, hint(ATTR_EXTSZINHERIT, 2 * BS)));
    // At most half the filesystem (the 16 MiB test device: 8 MiB), and never 2^21 blocks.
    let fs_blocks = {
        let st = fs.read_state();
        let h = fs.hdr(&st);
        h.data_end - h.data_start
    };
    let half = u32::try_from(fs_blocks / 2).unwrap();
    fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, half * BS))
        .unwrap();
    einval(fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, (half + 1) * BS)));
    einval(fs.set_file_attr(U, d, hint(ATTR_EXTSZINHERIT, 1 << 31)));
    // Nothing refused changed anything.
    assert_eq!(fs.file_attr(f).unwrap(), hint(ATTR_EXTSIZE, half * BS));
    assert_eq!(fs.file_attr(d).unwrap(), hint(0, 0));
    assert_eq!(fs.file_attr(l).unwrap(), hint(0, 0));
    assert_clean(&fs);
}

#[test]
fn what_is_made_in_a_directory_with_a_hint_takes_it() {
    let fs = mount(&new_dev(4), FsOptions::default());
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    // A directory's hint changes whatever it holds.
    fs.mknod(U, d, b"before", S_IFREG | 0o644, 0).unwrap();
    fs.set_file_attr(U, d, hint(ATTR_EXTSZINHERIT, 4 * BS))
        .unwrap();
    assert_eq!(fs.file_attr(d).unwrap(), hint(ATTR_EXTSZINHERIT, 4 * BS));
    let before = fs.lookup(d, b"before").unwrap().ino;
    assert_eq!(fs.file_attr(before).unwrap(), hint(0, 0));
    let f = fs.mknod(U, d, b"f", S_IFREG | 0o644, 0).unwrap().ino;
    assert_eq!(fs.file_attr(f).unwrap(), hint(ATTR_EXTSIZE, 4 * BS));
    let sub = fs.mkdir(U, d, b"sub", 0o755).unwrap().ino;
    assert_eq!(fs.file_attr(sub).unwrap(), hint(ATTR_EXTSZINHERIT, 4 * BS));
    let deeper = fs.mknod(U, sub, b"g", S_IFREG | 0o644, 0).unwrap().ino;
    assert_eq!(fs.file_attr(deeper).unwrap(), hint(ATTR_EXTSIZE, 4 * BS));
    let tmp = fs.tmpfile(U, d, S_IFREG | 0o600).unwrap().ino;
    assert_eq!(fs.file_attr(tmp).unwrap(), hint(ATTR_EXTSIZE, 4 * BS));
    fs.release_inode(tmp).unwrap();
    let l = fs.symlink(U, d, b"l", b"f").unwrap().ino;
    assert_eq!(fs.getattr(l).unwrap().mode & S_IFLNK, S_IFLNK);
    assert_eq!(fs.file_attr(l).unwrap(), hint(0, 0));
    let fifo = fs.mknod(U, d, b"p", 0o010_644, 0).unwrap().ino;
    assert_eq!(fs.file_attr(fifo).unwrap(), hint(0, 0));
    // The new file's hint is its own: the directory's, cleared, leaves it.
    fs.set_file_attr(U, d, hint(ATTR_EXTSZINHERIT, 0)).unwrap();
    assert_eq!(fs.file_attr(f).unwrap().extsize, 4 * BS);
    let after = fs.mknod(U, d, b"after", S_IFREG | 0o644, 0).unwrap().ino;
    assert_eq!(fs.file_attr(after).unwrap(), hint(0, 0));
    let outside = file_in_root(&fs, b"outside");
    assert_eq!(fs.file_attr(outside).unwrap(), hint(0, 0));
    assert_clean(&fs);
}

#[test]
fn hints_survive_a_remount_and_a_crash() {
    let dev = new_dev(5);
    let fs = mount(&dev, FsOptions::default());
    let f = file_in_root(&fs, b"f");
    let gone = file_in_root(&fs, b"gone");
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    fs.set_file_attr(U, f, hint(ATTR_EXTSIZE, 2 * BS)).unwrap();
    fs.set_file_attr(U, gone, hint(ATTR_EXTSIZE, 2 * BS))
        .unwrap();
    fs.set_file_attr(U, d, hint(ATTR_EXTSZINHERIT, 8 * BS))
        .unwrap();
    // Cleared again: the item goes back to its short form.
    fs.set_file_attr(U, gone, hint(0, 0)).unwrap();
    fs.fsync(f).unwrap();
    fs.fsync(d).unwrap();
    fs.fsync(gone).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    let after = mount(&crashed, FsOptions::default());
    assert_eq!(after.file_attr(f).unwrap(), hint(ATTR_EXTSIZE, 2 * BS));
    assert_eq!(after.file_attr(d).unwrap(), hint(ATTR_EXTSZINHERIT, 8 * BS));
    assert_eq!(after.file_attr(gone).unwrap(), hint(0, 0));
    let g = after.mknod(U, d, b"g", S_IFREG | 0o644, 0).unwrap().ino;
    assert_clean(&after);
    after.unmount().unwrap();
    drop(after);
    let again = mount(&crashed, FsOptions::default());
    assert_eq!(again.file_attr(f).unwrap(), hint(ATTR_EXTSIZE, 2 * BS));
    assert_eq!(again.file_attr(g).unwrap(), hint(ATTR_EXTSIZE, 8 * BS));
    assert_eq!(
        again.getattr(d).unwrap().mode & crate::fs::items::inode::S_IFMT,
        S_IFDIR
    );
    assert_clean(&again);
}
