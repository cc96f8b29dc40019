//! Set-user-ID and set-group-ID cleared by data changes and chown, as Linux does.

use super::*;

fn set_mode(fs: &Fs, ino: u64, mode: u32) {
    let sa = SetAttr {
        mode: Some(mode),
        ..SetAttr::default()
    };
    fs.setattr(Cred::ROOT, ino, sa).unwrap();
}

#[test]
fn data_changes_clear_set_user_and_group_id_as_linux_does() {
    let clock = TestClock::new();
    let dev = new_dev(41);
    let mut o = opts(&clock);
    // Process 77 is also in group 500; every other process has no supplementary groups.
    o.groups_of = Some(Arc::new(|pid| if pid == 77 { vec![500] } else { vec![] }));
    let told = attrs_changed_log(&mut o);
    let fs = mount(&dev, o);
    let f = fs
        .mknod(Cred::ROOT, ROOT_INO, b"f", items::inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    fs.setattr(
        Cred::ROOT,
        f,
        SetAttr {
            gid: Some(500),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let size = |s| SetAttr {
        size: Some(s),
        ..SetAttr::default()
    };
    type Change<'a> = (&'a str, Box<dyn Fn(Cred) -> FsResult<()> + 'a>);
    let changes: Vec<Change> = vec![
        ("write", Box::new(|c| fs.write(c, f, 0, b"x").map(|_| ()))),
        (
            "truncate",
            Box::new(|c| fs.setattr(c, f, size(3000)).map(|_| ())),
        ),
        (
            "truncate to the same size",
            Box::new(|c| {
                let s = fs.getattr(f)?.size;
                fs.setattr(c, f, size(s)).map(|_| ())
            }),
        ),
        (
            "fallocate",
            Box::new(|c| fs.fallocate(c, f, 0, 8192, false, false)),
        ),
        (
            "fallocate keeping the size",
            Box::new(|c| fs.fallocate(c, f, 20_000, 4096, true, false)),
        ),
        (
            "punching whole blocks",
            Box::new(|c| fs.fallocate(c, f, 2048, 2048, true, true)),
        ),
        (
            "punching past the end",
            Box::new(|c| fs.fallocate(c, f, 1 << 20, 4096, true, true)),
        ),
    ];
    let outsider = U;
    let member_by_supplementary_group = Cred { pid: 77, ..U };
    let member_by_primary_group = Cred::user(1000, 500);
    for (what, change) in &changes {
        for (mode, who, left) in [
            (0o2666, outsider, 0o666),
            (0o2676, outsider, 0o676),
            (0o4666, outsider, 0o666),
            (0o6676, outsider, 0o676),
            (0o6666, member_by_supplementary_group, 0o2666),
            (0o2676, member_by_supplementary_group, 0o676),
            (0o2666, member_by_primary_group, 0o2666),
            (0o6676, Cred::ROOT, 0o6676),
        ] {
            set_mode(&fs, f, mode);
            told.lock().clear();
            change(who).unwrap();
            assert_eq!(
                format!("{:o}", perm(&fs, f)),
                format!("{left:o}"),
                "{what} by {who:?} of a {mode:o} file"
            );
            // Truncate answers with the new attributes; the others must say they changed.
            let want = match left != mode && !what.starts_with("truncate") {
                true => vec![f],
                false => vec![],
            };
            assert_eq!(*told.lock(), want, "{what} by {who:?} of a {mode:o} file");
        }
    }
    drop(changes);
    // A truncate by a caller without CAP_FSETID comes with the mode the kernel cleared
    // set-user-ID from (its older rule keeps set-group-ID without group execute).
    set_mode(&fs, f, 0o6666);
    let sa = SetAttr {
        size: Some(10),
        mode: Some(0o2666),
        ..SetAttr::default()
    };
    fs.setattr(U, f, sa).unwrap();
    assert_eq!(format!("{:o}", perm(&fs, f)), "666");
    // The cleared bits are logged: a crash right after an fsync keeps them cleared.
    set_mode(&fs, f, 0o6666);
    fs.write(U, f, 0, b"y").unwrap();
    fs.fsync(f).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(fs);
    let fs = mount(&crashed, opts(&clock));
    assert_eq!(perm(&fs, f), 0o666);
    assert_clean(&fs);
}

#[test]
fn chown_clears_set_user_and_group_id_as_linux_does() {
    let clock = TestClock::new();
    let dev = new_dev(42);
    let fs = mount(&dev, opts(&clock));
    let owner = |uid: Option<u32>, gid: Option<u32>| SetAttr {
        uid,
        gid,
        ..SetAttr::default()
    };
    let f = fs
        .mknod(Cred::ROOT, ROOT_INO, b"f", items::inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    let d = fs.mkdir(Cred::ROOT, ROOT_INO, b"d", 0o755).unwrap().ino;
    // (file owner, group, mode, caller, new owner, new group, mode left), as on ext4.
    for (uid, gid, mode, who, to_uid, to_gid, left) in [
        // Root too loses set-user-ID, and set-group-ID when group execute is set.
        (0, 0, 0o6755, Cred::ROOT, Some(1000), None, 0o755),
        (0, 0, 0o4644, Cred::ROOT, Some(0), None, 0o644),
        (0, 0, 0o2644, Cred::ROOT, Some(1000), None, 0o2644),
        (0, 0, 0o2644, Cred::ROOT, None, Some(1000), 0o2644),
        // An owner outside the file's group loses set-group-ID even without group execute.
        (1000, 0, 0o2644, U, Some(1000), None, 0o644),
        (1000, 0, 0o2644, U, None, Some(1000), 0o644),
        // An owner in the file's group keeps it.
        (1000, 1000, 0o2644, U, Some(1000), None, 0o2644),
        (1000, 1000, 0o6644, U, None, Some(1000), 0o2644),
    ] {
        fs.setattr(Cred::ROOT, f, owner(Some(uid), Some(gid)))
            .unwrap();
        set_mode(&fs, f, mode);
        fs.setattr(who, f, owner(to_uid, to_gid)).unwrap();
        let a = fs.getattr(f).unwrap();
        assert_eq!(
            format!("{:o}", a.perm),
            format!("{left:o}"),
            "{uid}:{gid} {mode:o} chown by {who:?} to {to_uid:?}:{to_gid:?}"
        );
        assert_eq!(
            (a.uid, a.gid),
            (to_uid.unwrap_or(uid), to_gid.unwrap_or(gid))
        );
    }
    // Directories keep both (set-group-ID on a directory is inheritance, not privilege).
    set_mode(&fs, d, 0o6775);
    fs.setattr(Cred::ROOT, d, owner(Some(1000), Some(1000)))
        .unwrap();
    assert_eq!(perm(&fs, d), 0o6775);
    assert_clean(&fs);
}
