//! Mount tests of the inode flags, the project ID, extent size hints, statx's birth time, the
//! shutdown ioctl and FITRIM, through the real tools: chattr, lsattr, xfs_io, stat and fstrim
//! (hints through the ioctl itself: xfs_io 6.1 runs `extsize` on XFS only). Needs root and
//! /dev/fuse.
#![allow(clippy::unwrap_used)]

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

mod common;
use common::cilfs_transported as cilfs;
use common::{errno, run, s, Mounted};
use rustix::io::Errno;

/// The flag letters lsattr shows for `p` (its first word).
fn lsattr(p: &std::path::Path) -> String {
    let out = run(&["lsattr", "-d", s(p)]);
    out.split_whitespace().next().unwrap_or("").to_string()
}

fn eperm(r: std::io::Result<impl std::fmt::Debug>) {
    assert_eq!(errno(r.unwrap_err()), Errno::PERM);
}

#[test]
fn chattr_lsattr_chproj_shutdown_and_birth_time() {
    let m = Mounted::new("64M", &[]);
    let f = m.p("frozen");
    fs::write(&f, b"kept as it is").unwrap();
    run(&["chattr", "+i", s(&f)]);
    assert!(lsattr(&f).contains('i'), "{}", lsattr(&f));
    eperm(OpenOptions::new().write(true).open(&f));
    eperm(fs::remove_file(&f));
    eperm(fs::rename(&f, m.p("moved")));
    eperm(fs::set_permissions(
        &f,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    ));
    assert_eq!(fs::read(&f).unwrap(), b"kept as it is");
    run(&["chattr", "-i", s(&f)]);
    assert!(!lsattr(&f).contains('i'));
    fs::write(&f, b"changed").unwrap();

    // Append-only: O_APPEND writes only, no truncate, no unlink.
    let log = m.p("log");
    fs::write(&log, b"one\n").unwrap();
    run(&["chattr", "+a", s(&log)]);
    assert!(lsattr(&log).contains('a'));
    eperm(OpenOptions::new().write(true).open(&log));
    eperm(fs::remove_file(&log));
    let mut a = OpenOptions::new().append(true).open(&log).unwrap();
    a.write_all(b"two\n").unwrap();
    drop(a);
    eperm(OpenOptions::new().write(true).truncate(true).open(&log));
    assert_eq!(fs::read(&log).unwrap(), b"one\ntwo\n");
    // An immutable directory gains no names.
    let d = m.p("dir");
    fs::create_dir(&d).unwrap();
    run(&["chattr", "+i", s(&d)]);
    assert!(lsattr(&d).contains('i'));
    eperm(fs::write(d.join("new"), b"x"));
    run(&["chattr", "-i", s(&d)]);

    // The project ID through FSSETXATTR and FSGETXATTR.
    let out = run(&["xfs_io", "-c", "chproj 42", "-c", "lsproj", s(&f)]);
    assert!(out.contains("projid = 42"), "{out}");
    let out = run(&["xfs_io", "-c", "lsproj", s(&f)]);
    assert!(out.contains("projid = 42"), "{out}");

    // Birth time: the creation time, a real date.
    let born = run(&["stat", "-c", "%W", s(&f)]);
    let secs: i64 = born.trim().parse().unwrap();
    let mtime = run(&["stat", "-c", "%Y", s(&f)]);
    assert!(
        secs > 0 && secs <= mtime.trim().parse::<i64>().unwrap(),
        "{born}"
    );
    assert_ne!(run(&["stat", "-c", "%w", s(&f)]).trim(), "-");

    // The label, through FS_IOC_SETFSLABEL and FS_IOC_GETFSLABEL on the mount's root.
    run(&["xfs_io", "-c", "label -s scratch", s(&m.dir)]);
    let out = run(&["xfs_io", "-c", "label", s(&m.dir)]);
    assert!(out.contains("label = \"scratch\""), "{out}");

    // Shutdown, flushing the log: made durable by it, and everything fails after it.
    fs::write(m.p("before"), b"logged").unwrap();
    fs::File::open(m.p("before")).unwrap().sync_all().unwrap();
    let out = run(&["xfs_io", "-x", "-c", "shutdown -f", s(&m.dir)]);
    assert!(!out.contains("error"), "{out}");
    assert_eq!(errno(fs::metadata(m.p("before")).unwrap_err()), Errno::IO);
    assert_eq!(
        errno(fs::read_dir(&m.dir).map(|_| ()).unwrap_err()),
        Errno::IO
    );
    assert_eq!(errno(fs::write(m.p("after"), b"x").unwrap_err()), Errno::IO);
    // The unmount writes nothing and says the log is left to replay (exit status 1, as for a
    // daemon that died), which the next mount does.
    let out = cilfs(&["unmount", s(&m.dir)]);
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(text.contains("will replay the log"), "{text}");
    let check = cilfs(&["check", s(&m.img)]);
    assert!(String::from_utf8_lossy(&check.stdout).contains("log: not clean"));
    m.mount(&[]);
    assert_eq!(fs::read(m.p("before")).unwrap(), b"logged");
    assert!(lsattr(&log).contains('a'));
    assert!(!m.p("after").exists());
    let out = run(&["xfs_io", "-c", "lsproj", s(&f)]);
    assert!(out.contains("projid = 42"), "{out}");
    run(&["chattr", "-a", s(&log)]);
    m.unmount();
    let info = cilfs(&["info", s(&m.img)]);
    assert!(String::from_utf8_lossy(&info.stdout).contains("label          scratch\n"));
}

/// The shutdown ioctl is root's (EPERM otherwise), and chattr +i and FITRIM too.
#[test]
fn shutdown_and_immutable_are_roots_only() {
    let m = Mounted::new("64M", &["allow_other"]);
    // The user reaches the mount through the test's directory.
    let perm = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    fs::set_permissions(m.dir.parent().unwrap(), perm).unwrap();
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
    let user = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = user(&["chattr", "+i", s(&f)]);
    assert!(!out.status.success());
    let out = user(&["chattr", "+d", s(&f)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(lsattr(&f).contains('d'));
    let out = user(&["xfs_io", "-x", "-c", "shutdown", s(&m.dir)]);
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("not permitted"), "{text}");
    // FITRIM too (CAP_SYS_ADMIN on Linux).
    let out = user(&["fstrim", s(&m.dir)]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("not permitted"), "{text}");
    assert_eq!(fs::read(&f).unwrap(), b"x");
    m.unmount();
}

/// FITRIM through `fstrim`: the deleted files' blocks (made stable by `sync`, which the
/// default loop mount passes on) are punched out of the image, which shrinks on disk; the
/// files kept read back, before and after a remount, and the image checks clean. A length
/// under one block is EINVAL.
#[test]
fn fstrim_discards_free_space_and_files_read_back() {
    use std::os::unix::fs::MetadataExt;
    let m = Mounted::new("64M", &[]);
    let data = |i: u8| -> Vec<u8> { (0..(2 << 20)).map(|j: u32| (j as u8) ^ i).collect() };
    for i in 0..6u8 {
        let p = m.p(&format!("f{i}"));
        fs::write(&p, data(i)).unwrap();
        fs::File::open(&p).unwrap().sync_all().unwrap();
    }
    for i in [1u8, 3, 4] {
        fs::remove_file(m.p(&format!("f{i}"))).unwrap();
    }
    run(&["sync", "-f", s(&m.dir)]);
    let before = fs::metadata(&m.img).unwrap().blocks();
    let out = run(&["fstrim", "-v", s(&m.dir)]);
    let bytes: u64 = out
        .split('(')
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {out:?}"));
    assert!(bytes >= 6 << 20, "at least the three deleted files: {out}");
    let after = fs::metadata(&m.img).unwrap().blocks();
    assert!(
        (before - after) * 512 >= 6 << 20,
        "the image gave back their space: {before} -> {after} sectors"
    );
    for i in [0u8, 2, 5] {
        assert_eq!(fs::read(m.p(&format!("f{i}"))).unwrap(), data(i));
    }
    let bad = Command::new("fstrim")
        .args(["-o", "0", "-l", "100", s(&m.dir)])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("Invalid argument"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    m.unmount();
    let check = cilfs(&["check", s(&m.img)]);
    assert!(check.status.success(), "{check:?}");
    m.mount(&[]);
    for i in [0u8, 2, 5] {
        assert_eq!(fs::read(m.p(&format!("f{i}"))).unwrap(), data(i));
    }
    assert!(!m.p("f1").exists());
}

/// `struct fsxattr`, as FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR carry it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;
const FS_XFLAG_EXTSIZE: u32 = 0x800;
const FS_XFLAG_EXTSZINHERIT: u32 = 0x1000;

#[allow(unsafe_code)]
fn fsx_get(p: &std::path::Path) -> FsXattr {
    let f = fs::File::open(p).unwrap();
    let mut x = FsXattr::default();
    // SAFETY: FS_IOC_FSGETXATTR writes one `struct fsxattr`, which `x` is, on an open fd.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            FS_IOC_FSGETXATTR,
            &mut x,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    x
}

/// What `xfs_io extsize N` does: the attributes read, the hint's flag added for the file's
/// type, the hint set.
#[allow(unsafe_code)]
fn set_extsize(p: &std::path::Path, extsize: u32) -> std::io::Result<()> {
    let mut x = fsx_get(p);
    x.xflags |= if p.is_dir() {
        FS_XFLAG_EXTSZINHERIT
    } else {
        FS_XFLAG_EXTSIZE
    };
    x.extsize = extsize;
    let f = fs::File::open(p).unwrap();
    // SAFETY: FS_IOC_FSSETXATTR reads one `struct fsxattr`, which `x` is, from an open fd.
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&f), FS_IOC_FSSETXATTR, &x) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Extent size hints through the kernel's FSSETXATTR (the VFS's checks, then cilfs's): set
/// on an empty file and read back with FS_XFLAG_EXTSIZE, EINVAL for a file with data and
/// for a size that is no multiple of the block size, cleared by 0, taken by a file made in a
/// directory with one, and kept across a remount.
#[test]
fn extent_size_hints_through_fssetxattr() {
    let m = Mounted::new("64M", &[]);
    let bs = u32::try_from(fs::metadata(&m.dir).unwrap().blksize()).unwrap();
    let f = m.p("hinted");
    fs::write(&f, b"").unwrap();
    set_extsize(&f, 2 * bs).unwrap();
    let x = fsx_get(&f);
    assert_eq!(
        (x.xflags & FS_XFLAG_EXTSIZE, x.extsize),
        (FS_XFLAG_EXTSIZE, 2 * bs)
    );
    let einval = |r: std::io::Result<()>| assert_eq!(errno(r.unwrap_err()), Errno::INVAL);
    einval(set_extsize(&f, bs + 512));
    set_extsize(&f, 0).unwrap();
    assert_eq!(fsx_get(&f).xflags & FS_XFLAG_EXTSIZE, 0);
    set_extsize(&f, 4 * bs).unwrap();
    let full = m.p("full");
    fs::write(&full, b"data").unwrap();
    einval(set_extsize(&full, 2 * bs));
    assert_eq!(fsx_get(&full).extsize, 0);
    let d = m.p("dir");
    fs::create_dir(&d).unwrap();
    set_extsize(&d, 8 * bs).unwrap();
    let x = fsx_get(&d);
    assert_eq!(
        (x.xflags & FS_XFLAG_EXTSZINHERIT, x.extsize),
        (FS_XFLAG_EXTSZINHERIT, 8 * bs)
    );
    fs::write(d.join("child"), b"").unwrap();
    m.unmount();
    m.mount(&[]);
    assert_eq!(fsx_get(&f).extsize, 4 * bs);
    assert_eq!(fsx_get(&d).extsize, 8 * bs);
    let x = fsx_get(&d.join("child"));
    assert_eq!(
        (x.xflags & FS_XFLAG_EXTSIZE, x.extsize),
        (FS_XFLAG_EXTSIZE, 8 * bs)
    );
    m.unmount();
}
