//! overlayfs with its upper and work directories on a cilfs mount and its lower layer on a
//! plain directory: copy-up (through O_TMPFILE), whiteouts (RENAME_WHITEOUT and mknod), opaque
//! and redirected directories (trusted.overlay.* xattrs); the same tree after the overlay is
//! mounted again, and after the cilfs daemon is killed and the image recovered. Needs root,
//! /dev/fuse and overlay in /proc/filesystems.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{as_user, mounts_on, run, s, Mounted};

/// What a path of the merged tree is: its type and mode, and a file's contents.
type Tree = BTreeMap<String, (u32, Vec<u8>)>;

fn tree(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let data = if md.is_file() {
                fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            if md.is_dir() {
                todo.push(p);
            }
            out.insert(rel, (md.mode(), data));
        }
    }
    out
}

/// An overlay mounted on `dir`; lazily unmounted when dropped (its upper may be dead).
struct Overlay {
    dir: PathBuf,
}

impl Overlay {
    fn mount(lower: &Path, upper: &Path, work: &Path, dir: &Path) -> Overlay {
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},redirect_dir=on",
            s(lower),
            s(upper),
            s(work)
        );
        let out = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts, s(dir)])
            .output()
            .unwrap();
        let dmesg = Command::new("dmesg").output().unwrap();
        let tail: Vec<_> = String::from_utf8_lossy(&dmesg.stdout)
            .lines()
            .filter(|l| l.contains("overlayfs"))
            .map(str::to_string)
            .collect();
        assert!(
            out.status.success(),
            "overlay mount: {} (kernel: {:?})",
            String::from_utf8_lossy(&out.stderr),
            &tail[tail.len().saturating_sub(4)..]
        );
        Overlay {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        while mounts_on(&self.dir) > 0 {
            if rustix::mount::unmount(&self.dir, rustix::mount::UnmountFlags::DETACH).is_err() {
                return;
            }
        }
    }
}

/// A counter of the mount's statistics xattr (`cilfs stat`).
fn counter(mnt: &Path, name: &str) -> u64 {
    let v = run(&[
        "getfattr",
        "--only-values",
        "-n",
        "user.cilfs.stats",
        s(mnt),
    ]);
    v.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == name)
        .map_or(0, |(_, n)| n.trim().parse().unwrap())
}

fn xattr(p: &Path, name: &str) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let n = rustix::fs::getxattr(p, name, &mut buf[..]).unwrap();
    buf.truncate(n);
    buf
}

fn write(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap();
}

fn append(p: &Path, data: &[u8]) {
    let mut f = fs::OpenOptions::new().append(true).open(p).unwrap();
    f.write_all(data).unwrap();
}

#[test]
fn overlayfs_over_a_cilfs_upper_keeps_its_tree_across_remounts_and_a_crash() {
    let filesystems = fs::read_to_string("/proc/filesystems").unwrap();
    if !filesystems.lines().any(|l| l.ends_with("\toverlay")) {
        println!("skipped: overlay is not in /proc/filesystems");
        return;
    }
    // allow_other: another user lists xattrs below.
    let m = Mounted::new("256M", &["allow_other"]);
    let base = m._tmp.path();
    let (lower, ov) = (base.join("lower"), base.join("ov"));
    for d in [&lower, &ov, &lower.join("d/sub"), &lower.join("rd")] {
        fs::create_dir_all(d).unwrap();
    }
    for (p, v) in [
        ("a", "lower a\n"),
        ("b", "lower b\n"),
        ("gone", "deleted above\n"),
        ("later", "deleted before the crash\n"),
        ("d/f", "in a replaced dir\n"),
        ("d/sub/x", "deeper\n"),
        ("rd/x", "in a renamed dir\n"),
    ] {
        write(&lower.join(p), v.as_bytes());
    }
    let (upper, work) = (m.p("upper"), m.p("work"));
    fs::create_dir(&upper).unwrap();
    fs::create_dir(&work).unwrap();
    let o = Overlay::mount(&lower, &upper, &work, &ov);
    let p = |rel: &str| ov.join(rel);
    write(&p("new"), b"made in the overlay\n");
    append(&p("a"), b"copied up\n");
    fs::remove_file(p("gone")).unwrap();
    fs::remove_dir_all(p("d")).unwrap();
    fs::create_dir(p("d")).unwrap();
    write(&p("d/inside"), b"in the opaque dir\n");
    fs::rename(p("rd"), p("rd2")).unwrap();
    assert_eq!(fs::read(p("a")).unwrap(), b"lower a\ncopied up\n");
    assert_eq!(fs::read(p("rd2/x")).unwrap(), b"in a renamed dir\n");
    assert!(!p("gone").exists() && !p("rd").exists() && !p("d/f").exists());
    // What overlayfs left in the upper layer.
    let w = fs::symlink_metadata(upper.join("gone")).unwrap();
    assert!(
        w.file_type().is_char_device() && w.rdev() == 0,
        "a whiteout"
    );
    assert_eq!(xattr(&upper.join("d"), "trusted.overlay.opaque"), b"y");
    assert_eq!(xattr(&upper.join("rd2"), "trusted.overlay.redirect"), b"rd");
    // trusted.* names are listed to root only.
    for d in [base, &m.dir, &upper] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let flags = rustix::fs::XattrFlags::empty();
    rustix::fs::setxattr(upper.join("d"), "user.seen", b"1", flags).unwrap();
    let listed = |who: u32| {
        let out = as_user(
            who,
            who,
            &[
                "getfattr",
                "-m",
                "-",
                "--absolute-names",
                s(&upper.join("d")),
            ],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(listed(0).contains("trusted.overlay.opaque"));
    let nobody = listed(65534);
    assert!(
        nobody.contains("user.seen") && !nobody.contains("trusted."),
        "{nobody}"
    );
    assert_eq!(
        fs::read(lower.join("a")).unwrap(),
        b"lower a\n",
        "lower untouched"
    );
    assert!(
        counter(&m.dir, "requests_tmpfile") > 0,
        "copy-up by O_TMPFILE"
    );
    let before = tree(&ov);
    drop(o);
    let o = Overlay::mount(&lower, &upper, &work, &ov);
    assert_eq!(tree(&ov), before, "after the overlay is mounted again");
    // More changes, made stable by syncfs, then the daemon killed with the overlay on it.
    append(&p("b"), b"copied up before the crash\n");
    fs::remove_file(p("later")).unwrap();
    fs::rename(p("rd2"), p("rd3")).unwrap();
    let before = tree(&ov);
    run(&["sync", "-f", s(&ov)]);
    m.kill_daemon();
    drop(o);
    m.mount(&["allow_other"]);
    let o = Overlay::mount(&lower, &upper, &work, &ov);
    assert_eq!(tree(&ov), before, "after a crash and recovery");
    drop(o);
    m.unmount();
}

/// O_TMPFILE on the cilfs mount itself: linkat names it (AT_EMPTY_PATH, root's), one made
/// O_EXCL cannot be named, and one still open when the daemon is killed is reclaimed at the
/// next mount.
#[test]
fn tmpfiles_on_a_mount_are_named_by_linkat_and_reclaimed_after_a_crash() {
    use rustix::fs::{openat, AtFlags, Mode, OFlags, CWD};
    let m = Mounted::new("256M", &[]);
    let tmp = |excl: bool| {
        let flags =
            OFlags::TMPFILE | OFlags::RDWR | if excl { OFlags::EXCL } else { OFlags::empty() };
        openat(CWD, &m.dir, flags, Mode::from_raw_mode(0o600)).unwrap()
    };
    let named = tmp(false);
    rustix::io::write(&named, b"named later").unwrap();
    assert_eq!(rustix::fs::fstat(&named).unwrap().st_nlink, 0);
    rustix::fs::linkat(&named, "", CWD, m.p("named"), AtFlags::EMPTY_PATH).unwrap();
    assert_eq!(rustix::fs::fstat(&named).unwrap().st_nlink, 1);
    assert_eq!(fs::read(m.p("named")).unwrap(), b"named later");
    let excl = tmp(true);
    assert!(rustix::fs::linkat(&excl, "", CWD, m.p("never"), AtFlags::EMPTY_PATH).is_err());
    drop((named, excl));
    let held = tmp(false);
    rustix::io::write(&held, &vec![5u8; 1 << 20]).unwrap();
    rustix::fs::fsync(&held).unwrap();
    run(&["sync", "-f", s(&m.dir)]);
    m.kill_daemon();
    drop(held);
    m.mount(&[]);
    assert_eq!(counter(&m.dir, "orphans_reclaimed"), 1);
    assert_eq!(fs::read(m.p("named")).unwrap(), b"named later");
    assert!(!m.p("never").exists());
    m.unmount();
}
