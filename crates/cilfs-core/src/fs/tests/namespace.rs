//! Names: lookup, create, link, unlink, rmdir, rename and their errors; lookup of "." by
//! number; readdir of a shared hash bucket.

use super::*;

#[test]
fn namespace_operations_and_errors() {
    let clock = TestClock::new();
    let dev = new_dev(1);
    let fs = mount(&dev, opts(&clock));
    let root = fs.getattr(ROOT_INO).unwrap();
    assert_eq!(root.kind, FileType::Directory);
    assert_eq!(root.nlink, 2);
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap();
    assert_eq!((d.uid, d.gid, d.nlink), (1000, 1000, 2));
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
    let f = fs
        .mknod(U, d.ino, b"f", items::inode::S_IFREG | 0o644, 0)
        .unwrap();
    assert!(matches!(
        fs.mknod(U, d.ino, b"f", items::inode::S_IFREG | 0o644, 0),
        Err(FsError::Exists)
    ));
    assert!(matches!(fs.lookup(d.ino, b"nope"), Err(FsError::NotFound)));
    assert!(matches!(fs.lookup(f.ino, b"x"), Err(FsError::NotDir)));
    assert!(matches!(
        fs.mkdir(U, ROOT_INO, &[b'a'; 256], 0o755),
        Err(FsError::NameTooLong)
    ));
    assert!(fs.mkdir(U, ROOT_INO, &[b'a'; 255], 0o755).is_ok());
    assert_eq!(fs.lookup(d.ino, b"f").unwrap().ino, f.ino);
    assert_eq!(fs.lookup(d.ino, b"..").unwrap().ino, ROOT_INO);
    assert_eq!(names(&fs, d.ino), vec![".", "..", "f"]);
    assert!(matches!(fs.rmdir(ROOT_INO, b"d"), Err(FsError::NotEmpty)));
    assert!(matches!(fs.unlink(ROOT_INO, b"d"), Err(FsError::IsDir)));
    assert!(matches!(fs.rmdir(d.ino, b"f"), Err(FsError::NotDir)));
    // Hard links and symlinks.
    let l = fs.link(f.ino, ROOT_INO, b"hard").unwrap();
    assert_eq!(l.nlink, 2);
    assert!(matches!(
        fs.link(d.ino, ROOT_INO, b"dirlink"),
        Err(FsError::NotPermitted)
    ));
    let s = fs.symlink(U, ROOT_INO, b"sym", b"d/f").unwrap();
    assert_eq!(fs.readlink(s.ino).unwrap(), b"d/f");
    let long = vec![b'x'; 4095];
    let s2 = fs.symlink(U, ROOT_INO, b"long", &long).unwrap();
    assert_eq!(fs.readlink(s2.ino).unwrap(), long);
    // Special files.
    let fifo = fs
        .mknod(U, ROOT_INO, b"fifo", items::inode::S_IFIFO | 0o600, 0)
        .unwrap();
    assert_eq!(fifo.kind, FileType::Fifo);
    let cdev = fs
        .mknod(
            Cred::ROOT,
            ROOT_INO,
            b"null",
            items::inode::S_IFCHR | 0o666,
            0x0103,
        )
        .unwrap();
    assert_eq!((cdev.kind, cdev.rdev), (FileType::CharDevice, 0x0103));
    // Rename: plain, over a file, noreplace, exchange, dir into itself.
    fs.rename(d.ino, b"f", ROOT_INO, b"g", RenameFlags::default())
        .unwrap();
    assert!(matches!(fs.lookup(d.ino, b"f"), Err(FsError::NotFound)));
    assert_eq!(fs.lookup(ROOT_INO, b"g").unwrap().ino, f.ino);
    let nr = RenameFlags {
        noreplace: true,
        ..RenameFlags::default()
    };
    assert!(matches!(
        fs.rename(ROOT_INO, b"g", ROOT_INO, b"hard", nr),
        Err(FsError::Exists)
    ));
    let ex = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    fs.rename(ROOT_INO, b"sym", ROOT_INO, b"fifo", ex).unwrap();
    assert_eq!(fs.lookup(ROOT_INO, b"sym").unwrap().ino, fifo.ino);
    assert_eq!(fs.lookup(ROOT_INO, b"fifo").unwrap().ino, s.ino);
    let sub = fs.mkdir(U, d.ino, b"sub", 0o755).unwrap();
    assert!(matches!(
        fs.rename(ROOT_INO, b"d", sub.ino, b"loop", RenameFlags::default()),
        Err(FsError::Invalid(_))
    ));
    fs.rename(d.ino, b"sub", ROOT_INO, b"sub2", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(fs.lookup(sub.ino, b"..").unwrap().ino, ROOT_INO);
    // Replacing a file drops its link.
    fs.rename(ROOT_INO, b"hard", ROOT_INO, b"sym", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 2);
    assert!(
        matches!(fs.getattr(fifo.ino), Err(FsError::NotFound)),
        "the replaced fifo is freed"
    );
    fs.unlink(ROOT_INO, b"g").unwrap();
    fs.unlink(ROOT_INO, b"sym").unwrap();
    assert!(matches!(fs.getattr(f.ino), Err(FsError::NotFound)));
    fs.rmdir(ROOT_INO, b"sub2").unwrap();
    fs.rmdir(ROOT_INO, b"d").unwrap();
    assert_eq!(
        fs.getattr(ROOT_INO).unwrap().nlink,
        3,
        "root, its '.', and the 255-byte dir"
    );
    // Everything survives a clean remount.
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    let mut want = vec![".", "..", "fifo", "long", "null"];
    let longname = String::from_utf8(vec![b'a'; 255]).unwrap();
    want.push(&longname);
    want.sort();
    assert_eq!(names(&fs, ROOT_INO), want);
    assert_eq!(
        fs.readlink(fs.lookup(ROOT_INO, b"fifo").unwrap().ino)
            .unwrap(),
        b"d/f"
    );
    assert_clean(&fs);
}

/// How the kernel finds an inode it forgot from a file handle: LOOKUP of "." in it, for any
/// type; an unlinked inode is gone; the generation is the creation time.
#[test]
fn lookup_of_dot_finds_any_inode_by_number() {
    let clock = TestClock::new();
    let dev = new_dev(1801);
    let fs = mount(&dev, opts(&clock));
    let f = fs
        .mknod(U, ROOT_INO, b"f", items::inode::S_IFREG | 0o644, 0)
        .unwrap();
    assert_eq!(fs.lookup(f.ino, b".").unwrap(), f);
    assert!(matches!(fs.lookup(f.ino, b".."), Err(FsError::NotDir)));
    clock.advance_ms(5);
    let g = fs
        .mknod(U, ROOT_INO, b"g", items::inode::S_IFREG | 0o644, 0)
        .unwrap();
    assert_ne!(f.generation, g.generation);
    assert_ne!(f.generation, 0);
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert!(matches!(fs.lookup(f.ino, b"."), Err(FsError::NotFound)));
}

/// Two names with one 56-bit hash share a bucket. A reader whose buffer holds one entry at a
/// time (the kernel's fills wherever it fills) still gets every name exactly once, also when
/// it removes each name as it gets it.
#[test]
fn readdir_in_small_steps_returns_every_name_of_a_shared_hash_bucket() {
    use crate::fs::tree::keys::name_hash;
    let clock = TestClock::new();
    let dev = new_dev(43);
    let fs = mount(&dev, opts(&clock));
    // Found by a birthday search: one hash, two names.
    let (a, b) = (&b"c9e18924c91b36e"[..], &b"c4fe0f87f7ce859"[..]);
    assert_eq!(name_hash(a), name_hash(b));
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let mut want: Vec<Vec<u8>> = vec![a.to_vec(), b.to_vec()];
    want.extend((0..40).map(|i| format!("filler-{i}").into_bytes()));
    for n in &want {
        fs.mknod(U, d, n, items::inode::S_IFREG | 0o644, 0).unwrap();
    }
    for step in [1, 2, 3, 7] {
        let (mut got, mut cookie) = (Vec::new(), 0);
        loop {
            let batch = fs.readdir(d, cookie, step).unwrap();
            // The caller's buffer takes only the first entry of each batch.
            let Some((e, next)) = batch.into_iter().next() else {
                break;
            };
            got.push(e.name);
            cookie = next;
        }
        got.retain(|n| n != b"." && n != b"..");
        got.sort();
        let mut w = want.clone();
        w.sort();
        assert_eq!(got, w, "batches of {step}, one entry taken from each");
    }
    // A reader that removes each name it is given (rm -r, Go's RemoveAll) one entry at a
    // time: the removals must not hide a name not yet returned.
    let e = fs.mkdir(U, ROOT_INO, b"e", 0o755).unwrap().ino;
    for n in &want {
        fs.mknod(U, e, n, items::inode::S_IFREG | 0o644, 0).unwrap();
    }
    let (mut removed, mut cookie) = (0, 0);
    while let Some((entry, next)) = fs.readdir(e, cookie, 1).unwrap().into_iter().next() {
        if entry.name != b"." && entry.name != b".." {
            fs.unlink(e, &entry.name).unwrap();
            removed += 1;
        }
        cookie = next;
    }
    assert_eq!(removed, want.len(), "names hidden by removals");
    fs.rmdir(ROOT_INO, b"e").unwrap();
    // Unlinking the first name of the bucket leaves the second listed.
    fs.unlink(d, a).unwrap();
    let names: Vec<Vec<u8>> = fs
        .readdir(d, 0, 1000)
        .unwrap()
        .into_iter()
        .map(|(e, _)| e.name)
        .collect();
    assert!(names.iter().any(|n| n == b));
    assert_clean(&fs);
}

/// A full filesystem, to its last block, and its big file closed and removed, but its release
/// not yet in (Linux sends FUSE's RELEASE after close returns): runs `op`, which needs space,
/// and releases the big file only once `op` waits for that release, so an `op` that does not
/// wait fails. Returns the filesystem and what `op` returned.
fn out_of_space_behind_an_open_orphan<R>(
    op: impl FnOnce(&Fs) -> FsResult<R>,
) -> (Arc<Fs>, FsResult<R>) {
    use crate::fs::posix::open::RELEASE_WAITERS;
    use std::sync::atomic::Ordering::SeqCst;
    let clock = TestClock::new();
    let dev = new_dev(78);
    let fs = mount(&dev, opts(&clock));
    let big = file_in_root(&fs, b"big");
    fs.open_inode(big).unwrap();
    let mut at = 0u64;
    for chunk in [vec![7u8; 64 * BS as usize], vec![7u8; BS as usize]] {
        while fs.write(U, big, at, &chunk).is_ok() {
            at += chunk.len() as u64;
        }
    }
    fs.unlink(ROOT_INO, b"big").unwrap();
    let waiters = RELEASE_WAITERS.load(SeqCst);
    let releaser = {
        let fs = Arc::clone(&fs);
        std::thread::spawn(move || {
            // Released once the operation waits for it (or after a minute, so one that never
            // waits fails instead of hanging the test).
            for _ in 0..60_000 {
                if RELEASE_WAITERS.load(SeqCst) > waiters {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            fs.release_inode(big).unwrap();
        })
    };
    let r = op(&fs);
    releaser.join().unwrap();
    assert!(
        RELEASE_WAITERS.load(SeqCst) > waiters,
        "the operation never ran out of space"
    );
    (fs, r)
}

/// A write out of space waits for the removed file's release and then succeeds, as it would
/// on a kernel filesystem.
#[test]
fn a_write_out_of_space_waits_for_an_open_orphans_release() {
    let chunk = vec![7u8; 64 * BS as usize];
    let (fs, wrote) = out_of_space_behind_an_open_orphan(|fs| {
        let small = file_in_root(fs, b"small");
        fs.write(U, small, 0, &chunk).map(|n| (small, n))
    });
    let (small, n) = wrote.unwrap();
    assert_eq!(n, chunk.len());
    assert_eq!(fs.read(small, 0, BS).unwrap(), vec![7u8; BS as usize]);
    assert_clean(&fs);
}

/// So do a fallocate, an xattr value and creates out of space.
#[test]
fn fallocate_xattrs_and_creates_out_of_space_wait_for_an_open_orphans_release() {
    let (fs, r) = out_of_space_behind_an_open_orphan(|fs| {
        let f = file_in_root(fs, b"prealloc");
        fs.fallocate(U, f, 0, 64 * u64::from(BS), false, false)
            .map(|()| f)
    });
    let f = r.unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 64 * u64::from(BS));
    assert_clean(&fs);
    let value = vec![3u8; 65_536];
    let (fs, r) = out_of_space_behind_an_open_orphan(|fs| {
        fs.setxattr(ROOT_INO, b"user.v", &value, XattrFlags::default())
    });
    r.unwrap();
    assert_eq!(fs.getxattr(ROOT_INO, b"user.v").unwrap(), value);
    assert_clean(&fs);
    // Directories until one needs a block the full filesystem lacks.
    let (fs, r) = out_of_space_behind_an_open_orphan(|fs| {
        (0..2000).try_for_each(|i| {
            fs.mkdir(U, ROOT_INO, format!("d{i}").as_bytes(), 0o755)
                .map(drop)
        })
    });
    r.unwrap();
    assert_eq!(
        fs.lookup(ROOT_INO, b"d1999").unwrap().kind,
        FileType::Directory
    );
    assert_clean(&fs);
}
