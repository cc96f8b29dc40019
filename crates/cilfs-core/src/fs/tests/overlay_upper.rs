//! What overlayfs asks of an upper filesystem: O_TMPFILE (an open orphan, named by a link,
//! freed by its last release or reclaimed after a crash) and RENAME_WHITEOUT (a character
//! device 0:0 left in the rename's own transaction).

use super::acls::acl_value;
use super::*;
use crate::fs::items::inode::{S_IFDIR, S_IFREG};
use cilfs_device::{RecordingDevice, Survival};

const WHITEOUT: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: false,
    whiteout: true,
};

#[test]
fn a_tmpfile_is_an_open_orphan_until_a_link_names_it() {
    let clock = TestClock::new();
    let dev = new_dev(300);
    let fs = mount(&dev, opts(&clock));
    let t = fs.tmpfile(U, ROOT_INO, S_IFREG | 0o640).unwrap();
    assert_eq!(
        (t.nlink, t.kind, t.perm, t.uid),
        (0, FileType::Regular, 0o640, 1000)
    );
    assert_eq!(names(&fs, ROOT_INO), [".", ".."], "no name");
    fs.write(U, t.ino, 0, b"made unnamed").unwrap();
    assert_clean(&fs);
    let a = fs.link(t.ino, ROOT_INO, b"named").unwrap();
    assert_eq!((a.ino, a.nlink), (t.ino, 1));
    fs.release_inode(t.ino).unwrap();
    assert_eq!(fs.lookup(ROOT_INO, b"named").unwrap().ino, t.ino);
    assert_clean(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(fs.stats.snapshot().orphans_reclaimed, 0);
    assert_eq!(fs.read(t.ino, 0, 100).unwrap(), b"made unnamed");
    assert_eq!(fs.getattr(t.ino).unwrap().nlink, 1);
    assert_clean(&fs);
}

#[test]
fn the_last_release_of_an_unnamed_tmpfile_frees_it_and_a_freed_one_cannot_be_linked() {
    let clock = TestClock::new();
    let dev = new_dev(301);
    let fs = mount(&dev, opts(&clock));
    fs.sync().unwrap();
    let (free0, files0) = (fs.statfs().bfree, fs.statfs().ffree);
    let t = fs.tmpfile(U, ROOT_INO, S_IFREG | 0o600).unwrap().ino;
    fs.write(U, t, 0, &vec![7u8; 50_000]).unwrap();
    // A second open, then both released: only the last frees it.
    fs.open_inode(t).unwrap();
    fs.release_inode(t).unwrap();
    assert_eq!(fs.read(t, 0, 4).unwrap(), [7u8; 4], "still open once");
    fs.release_inode(t).unwrap();
    assert!(matches!(fs.getattr(t), Err(FsError::NotFound)));
    assert!(matches!(
        fs.link(t, ROOT_INO, b"late"),
        Err(FsError::NotFound)
    ));
    assert!(matches!(fs.open_inode(t), Err(FsError::NotFound)));
    fs.sync().unwrap();
    assert_eq!((fs.statfs().bfree, fs.statfs().ffree), (free0, files0));
    assert_clean(&fs);
}

#[test]
fn a_crash_reclaims_an_unnamed_tmpfile_at_the_next_mount_and_keeps_a_named_one() {
    for seed in 0..6 {
        let clock = TestClock::new();
        let dev = new_dev(310 + seed);
        let fs = mount(&dev, opts(&clock));
        fs.sync().unwrap();
        let free0 = fs.statfs().bfree;
        let lost = fs.tmpfile(U, ROOT_INO, S_IFREG | 0o644).unwrap().ino;
        fs.write(U, lost, 0, &vec![1u8; 30_000]).unwrap();
        let kept = fs.tmpfile(U, ROOT_INO, S_IFREG | 0o644).unwrap().ino;
        fs.write(U, kept, 0, b"kept").unwrap();
        fs.link(kept, ROOT_INO, b"kept").unwrap();
        fs.fsync(kept).unwrap();
        fs.sync().unwrap();
        let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
        drop(fs);
        let fs = mount(&crashed, opts(&clock));
        assert!(
            matches!(fs.getattr(lost), Err(FsError::NotFound)),
            "seed {seed}"
        );
        assert_eq!(fs.stats.snapshot().orphans_reclaimed, 1, "seed {seed}");
        assert_eq!(fs.read(kept, 0, 100).unwrap(), b"kept", "seed {seed}");
        assert_eq!(fs.getattr(kept).unwrap().nlink, 1);
        fs.unlink(ROOT_INO, b"kept").unwrap();
        fs.sync().unwrap();
        assert_eq!(
            fs.statfs().bfree,
            free0,
            "seed {seed}: every block free again"
        );
        assert_clean(&fs);
    }
}

/// Mode, owner and ACL as a create in the same directory: a set-group-ID directory's group
/// and a default ACL (which replaces the umask).
#[test]
fn a_tmpfile_inherits_as_a_create_does() {
    use acl::{ACCESS, DEFAULT, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    let clock = TestClock::new();
    let dev = new_dev(302);
    let fs = mount(&dev, opts(&clock));
    let d = fs.mkdir(Cred::ROOT, ROOT_INO, b"d", 0o777).unwrap().ino;
    fs.setattr(
        Cred::ROOT,
        d,
        SetAttr {
            mode: Some(0o2777),
            gid: Some(50),
            ..Default::default()
        },
    )
    .unwrap();
    let masked = Cred { umask: 0o077, ..U };
    let plain = fs.tmpfile(masked, d, S_IFREG | 0o666).unwrap();
    assert_eq!((plain.perm, plain.uid, plain.gid), (0o600, 1000, 50));
    let default = acl_value(&[
        (USER_OBJ, 7, u32::MAX),
        (USER, 5, 4242),
        (GROUP_OBJ, 5, u32::MAX),
        (MASK, 7, u32::MAX),
        (OTHER, 4, u32::MAX),
    ]);
    fs.setxattr(d, DEFAULT, &default, XattrFlags::default())
        .unwrap();
    let t = fs.tmpfile(masked, d, S_IFREG | 0o666).unwrap();
    let c = fs.mknod(masked, d, b"c", S_IFREG | 0o666, 0).unwrap();
    assert_eq!((t.perm, t.gid), (c.perm, c.gid));
    assert_eq!(t.perm, 0o664, "the default ACL, not the umask");
    assert_eq!(
        fs.getxattr(t.ino, ACCESS).unwrap(),
        fs.getxattr(c.ino, ACCESS).unwrap()
    );
    assert!(matches!(
        fs.tmpfile(U, d, S_IFDIR | 0o755),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.tmpfile(U, c.ino, S_IFREG | 0o644),
        Err(FsError::NotDir)
    ));
    for i in [plain.ino, t.ino] {
        fs.release_inode(i).unwrap();
    }
    assert_clean(&fs);
}

/// The whiteout: a character device 0:0 of mode 0, the caller's, under the source's name;
/// with RENAME_NOREPLACE over an existing name nothing happens; with RENAME_EXCHANGE it is
/// refused.
#[test]
fn rename_whiteout_leaves_a_character_device_0_0_under_the_old_name() {
    let clock = TestClock::new();
    let dev = new_dev(303);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    let d = fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap().ino;
    let size0 = fs.getattr(ROOT_INO).unwrap().size;
    fs.rename_as(U, ROOT_INO, b"f", d, b"g", WHITEOUT).unwrap();
    let w = fs.lookup(ROOT_INO, b"f").unwrap();
    assert_ne!(w.ino, f);
    assert_eq!(
        (w.kind, w.rdev, w.perm, w.nlink, w.uid, w.gid),
        (FileType::CharDevice, 0, 0, 1, 1000, 1000)
    );
    assert_eq!(fs.lookup(d, b"g").unwrap().ino, f);
    assert_eq!(
        fs.getattr(ROOT_INO).unwrap().size,
        size0,
        "one name for one"
    );
    // A directory moved out with a whiteout: the old parent loses its "..", keeps the name.
    let sub = fs.mkdir(U, d, b"sub", 0o755).unwrap().ino;
    assert_eq!(fs.getattr(d).unwrap().nlink, 3);
    fs.rename_as(U, d, b"sub", ROOT_INO, b"sub", WHITEOUT)
        .unwrap();
    assert_eq!(fs.getattr(d).unwrap().nlink, 2);
    assert_eq!(fs.lookup(d, b"sub").unwrap().kind, FileType::CharDevice);
    assert_eq!(fs.lookup(ROOT_INO, b"sub").unwrap().ino, sub);
    // NOREPLACE over a name: refused, nothing changed.
    let noreplace = RenameFlags {
        noreplace: true,
        ..WHITEOUT
    };
    assert!(matches!(
        fs.rename(d, b"g", ROOT_INO, b"d", noreplace),
        Err(FsError::Exists)
    ));
    fs.rename(d, b"g", ROOT_INO, b"h", noreplace).unwrap();
    assert_eq!(fs.lookup(d, b"g").unwrap().kind, FileType::CharDevice);
    let exchange = RenameFlags {
        exchange: true,
        ..WHITEOUT
    };
    assert!(matches!(
        fs.rename(ROOT_INO, b"h", d, b"g", exchange),
        Err(FsError::Invalid(_))
    ));
    assert_eq!(fs.lookup(ROOT_INO, b"h").unwrap().ino, f);
    // A whiteout is removed as any file.
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert_clean(&fs);
}

/// The whiteout and the move are one transaction: a crash anywhere shows both or neither.
/// The same for a tmpfile and its link: no name, and its inode reclaimed; or the name.
#[test]
fn a_crash_shows_a_rename_with_its_whiteout_and_a_linked_tmpfile_whole_or_not_at_all() {
    let clock = TestClock::new();
    let dev = new_dev(304);
    let fs = mount(&dev, opts(&clock));
    let f = file_in_root(&fs, b"f");
    fs.mkdir(U, ROOT_INO, b"d", 0o755).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let (base, len) = (dev.stable_image(), dev.len());
    let rec = Arc::new(RecordingDevice::new(
        SimDevice::from_image(base.clone(), len, 1),
        base,
    ));
    let j = Journal::open(rec.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    let fs = Fs::open(j, opts(&clock)).unwrap();
    let d = fs.lookup(ROOT_INO, b"d").unwrap().ino;
    fs.rename_as(U, ROOT_INO, b"f", d, b"f", WHITEOUT).unwrap();
    let t = fs.tmpfile(U, ROOT_INO, S_IFREG | 0o644).unwrap().ino;
    fs.write(U, t, 0, b"tmp").unwrap();
    fs.link(t, d, b"t").unwrap();
    fs.sync().unwrap();
    drop(fs);
    let n = rec.op_count();
    let (mut renamed, mut linked) = (0, 0);
    for at in 0..=n {
        let mut x = 0x2545_f491_4f6c_dd1du64 ^ at as u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let img = rec.crash_image(at, &mut |_, sectors| match next() % 3 {
            0 => Survival::Lost,
            1 => Survival::Kept,
            _ => Survival::Torn((0..sectors).map(|_| next() & 1 == 1).collect()),
        });
        let fs = mount(&Arc::new(SimDevice::from_image(img, len, 2)), opts(&clock));
        assert_clean(&fs);
        let old = fs.lookup(ROOT_INO, b"f").unwrap();
        match fs.lookup(d, b"f") {
            Ok(a) => {
                assert_eq!(a.ino, f, "crash at {at}");
                assert_eq!((old.kind, old.rdev), (FileType::CharDevice, 0));
                renamed += 1;
            }
            Err(FsError::NotFound) => assert_eq!(old.ino, f, "crash at {at}: half a rename"),
            Err(e) => panic!("{e}"),
        }
        match fs.lookup(d, b"t") {
            Ok(a) => {
                assert_eq!((a.ino, a.nlink), (t, 1), "crash at {at}");
                let c = fs.read(t, 0, 10).unwrap();
                assert!(c.is_empty() || c == b"tmp", "crash at {at}: {c:?}");
                linked += 1;
            }
            Err(FsError::NotFound) => {
                assert!(
                    matches!(fs.getattr(t), Err(FsError::NotFound)),
                    "crash at {at}"
                )
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        renamed > 0 && renamed <= n && linked > 0,
        "{renamed} {linked} of {n}"
    );
}

/// The last release of an O_TMPFILE begins its reclaim while a link of it, checked while it
/// was still open, has yet to publish: the link wins, and the reclaim frees nothing of it.
#[test]
fn a_last_release_racing_a_checked_link_leaves_the_named_file_whole() {
    use crate::fs::txn::shared_tx::AFTER_CHECK;
    type Releaser = Option<std::thread::JoinHandle<FsResult<()>>>;
    let clock = TestClock::new();
    let dev = new_dev(305);
    let fs = mount(&dev, opts(&clock));
    let t = fs.tmpfile(U, ROOT_INO, S_IFREG | 0o644).unwrap().ino;
    fs.write(U, t, 0, &[3u8; 20_000]).unwrap();
    let releaser: Arc<Mutex<Releaser>> = Arc::default();
    let reached = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (f, slot, seen) = (Arc::clone(&fs), Arc::clone(&releaser), Arc::clone(&reached));
    AFTER_CHECK.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            let g = Arc::clone(&f);
            *slot.lock() = Some(std::thread::spawn(move || g.release_inode(t)));
            // Until the release holds the file's IO lock: past its look, bound for reclaim.
            for _ in 0..50_000_000u64 {
                if !f.io.idle(t) {
                    seen.store(true, Ordering::SeqCst);
                    break;
                }
                std::thread::yield_now();
            }
        }))
    });
    fs.link(t, ROOT_INO, b"named").unwrap();
    let release = releaser.lock().take().unwrap();
    release.join().unwrap().unwrap();
    assert!(
        reached.load(Ordering::SeqCst),
        "the release never reached its reclaim"
    );
    assert_eq!(fs.getattr(t).unwrap().nlink, 1);
    assert_eq!(fs.read(t, 0, 30_000).unwrap(), vec![3u8; 20_000]);
    assert_eq!(fs.stats.snapshot().orphans_reclaimed, 0);
    assert_clean(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(fs.read(t, 0, 30_000).unwrap(), vec![3u8; 20_000]);
    assert_clean(&fs);
}
