//! Mount tests through FUSE: every operation the filesystem serves, with its errno cases, on a
//! real mount made by `cilfs mount`. Each test ends with `cilfs unmount` and a clean `cilfs
//! check`. Needs root and /dev/fuse (CI has both; scripts/install-deps installs fuse3).
#![allow(clippy::unwrap_used)]

use rustix::fs::{FallocateFlags, FileType, Mode, RenameFlags, SeekFrom, XattrFlags, CWD};
use rustix::io::Errno;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

mod common;
use common::cilfs_transported as cilfs;
use common::{
    as_user, errno, mounts_on, run, set_atime_2001, sha1, wait_for_exit, Mounted, UnmountAll, Y2001,
};

#[test]
fn files_directories_links_and_errors() {
    let m = Mounted::new("256M", &[]);
    fs::write(m.p("a"), b"hello").unwrap();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"hello");
    // O_APPEND.
    let mut f = OpenOptions::new().append(true).open(m.p("a")).unwrap();
    f.write_all(b" world").unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("a")).unwrap(), b"hello world");
    // Truncate through setattr, and an O_TRUNC open.
    OpenOptions::new()
        .write(true)
        .open(m.p("a"))
        .unwrap()
        .set_len(4)
        .unwrap();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"hell");
    fs::write(m.p("a"), b"x").unwrap();
    assert_eq!(fs::metadata(m.p("a")).unwrap().len(), 1);
    // Directories.
    fs::create_dir(m.p("d")).unwrap();
    fs::create_dir(m.p("d/e")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 3);
    assert_eq!(errno(fs::create_dir(m.p("d")).unwrap_err()), Errno::EXIST);
    assert_eq!(
        errno(fs::remove_dir(m.p("d")).unwrap_err()),
        Errno::NOTEMPTY
    );
    assert_eq!(errno(fs::remove_file(m.p("d")).unwrap_err()), Errno::ISDIR);
    assert_eq!(errno(fs::remove_dir(m.p("a")).unwrap_err()), Errno::NOTDIR);
    assert_eq!(errno(fs::metadata(m.p("nope")).unwrap_err()), Errno::NOENT);
    assert_eq!(errno(fs::read_dir(m.p("a/x")).unwrap_err()), Errno::NOTDIR);
    let long = "n".repeat(256);
    assert_eq!(
        errno(fs::write(m.p(&long), b"").unwrap_err()),
        Errno::NAMETOOLONG
    );
    fs::write(m.p(&"n".repeat(255)), b"").unwrap();
    // Links and symlinks.
    fs::hard_link(m.p("a"), m.p("d/a2")).unwrap();
    assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(m.p("a")).unwrap().ino(),
        fs::metadata(m.p("d/a2")).unwrap().ino()
    );
    std::os::unix::fs::symlink("d/a2", m.p("s")).unwrap();
    assert_eq!(fs::read_link(m.p("s")).unwrap(), Path::new("d/a2"));
    assert_eq!(fs::read(m.p("s")).unwrap(), b"x");
    // Rename, over a file, and the two rename2 flags.
    fs::rename(m.p("a"), m.p("d/e/b")).unwrap();
    fs::write(m.p("c"), b"c").unwrap();
    fs::rename(m.p("c"), m.p("d/e/b")).unwrap();
    assert_eq!(
        fs::read(m.p("d/a2")).unwrap(),
        b"x",
        "the replaced inode lives on under its other name"
    );
    fs::write(m.p("f1"), b"1").unwrap();
    fs::write(m.p("f2"), b"2").unwrap();
    assert_eq!(
        rustix::fs::renameat_with(CWD, m.p("f1"), CWD, m.p("f2"), RenameFlags::NOREPLACE)
            .unwrap_err(),
        Errno::EXIST
    );
    rustix::fs::renameat_with(CWD, m.p("f1"), CWD, m.p("d"), RenameFlags::EXCHANGE).unwrap();
    assert_eq!(fs::read(m.p("d")).unwrap(), b"1");
    assert!(fs::metadata(m.p("f1/e")).unwrap().is_dir());
    assert_eq!(
        errno(fs::rename(m.p("f1"), m.p("f1/e/inside")).unwrap_err()),
        Errno::INVAL
    );
    // readdir sees everything, readdirplus gives the right types.
    let mut names: Vec<String> = fs::read_dir(&m.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "d".to_string(),
            "f1".into(),
            "f2".into(),
            "n".repeat(255),
            "s".into()
        ]
    );
    // Many entries: readdir across several replies, cookies stay valid.
    fs::create_dir(m.p("many")).unwrap();
    for i in 0..1000 {
        File::create(m.p(&format!("many/file{i}"))).unwrap();
    }
    assert_eq!(fs::read_dir(m.p("many")).unwrap().count(), 1000);
    for i in (0..1000).step_by(2) {
        fs::remove_file(m.p(&format!("many/file{i}"))).unwrap();
    }
    assert_eq!(fs::read_dir(m.p("many")).unwrap().count(), 500);
    // Everything survives an unmount and a new mount.
    m.unmount();
    m.mount(&[]);
    assert_eq!(fs::read(m.p("d")).unwrap(), b"1");
    assert_eq!(fs::read_link(m.p("s")).unwrap(), Path::new("d/a2"));
    assert_eq!(fs::read_dir(m.p("many")).unwrap().count(), 500);
    m.unmount();
}

#[test]
fn special_files_xattrs_fallocate_seek_statfs() {
    let m = Mounted::new("256M", &[]);
    rustix::fs::mknodat(
        CWD,
        m.p("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    rustix::fs::mknodat(
        CWD,
        m.p("sock"),
        FileType::Socket,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let dev = rustix::fs::makedev(1, 3);
    rustix::fs::mknodat(
        CWD,
        m.p("null"),
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        dev,
    )
    .unwrap();
    rustix::fs::mknodat(
        CWD,
        m.p("blk"),
        FileType::BlockDevice,
        Mode::from_raw_mode(0o600),
        rustix::fs::makedev(7, 0),
    )
    .unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(fs::metadata(m.p("fifo")).unwrap().file_type().is_fifo());
    assert!(fs::metadata(m.p("sock")).unwrap().file_type().is_socket());
    let n = fs::metadata(m.p("null")).unwrap();
    assert!(n.file_type().is_char_device());
    assert_eq!(n.rdev(), dev);
    assert!(fs::metadata(m.p("blk"))
        .unwrap()
        .file_type()
        .is_block_device());
    // Xattrs, and the read-only, unlisted change attribute.
    let f = m.p("x");
    fs::write(&f, b"data").unwrap();
    rustix::fs::setxattr(&f, "user.one", b"1", XattrFlags::empty()).unwrap();
    rustix::fs::setxattr(&f, "user.two", &[7u8; 500], XattrFlags::empty()).unwrap();
    assert_eq!(
        rustix::fs::setxattr(&f, "user.one", b"1", XattrFlags::CREATE).unwrap_err(),
        Errno::EXIST
    );
    assert_eq!(
        rustix::fs::setxattr(&f, "user.three", b"1", XattrFlags::REPLACE).unwrap_err(),
        Errno::NODATA
    );
    let mut buf = vec![0u8; 1024];
    let n = rustix::fs::getxattr(&f, "user.two", &mut buf[..]).unwrap();
    assert_eq!(&buf[..n], &[7u8; 500]);
    assert_eq!(
        rustix::fs::getxattr(&f, "user.two", &mut buf[..10]).unwrap_err(),
        Errno::RANGE
    );
    let n = rustix::fs::listxattr(&f, &mut buf[..]).unwrap();
    let mut names: Vec<&[u8]> = buf[..n]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .collect();
    names.sort();
    assert_eq!(names, vec![&b"user.one"[..], b"user.two"]);
    let big: Vec<u8> = (0..30_000u32).map(|i| (i % 251) as u8).collect();
    rustix::fs::setxattr(&f, "user.big", &big, XattrFlags::empty()).unwrap();
    let mut bigbuf = vec![0u8; 65536];
    let n = rustix::fs::getxattr(&f, "user.big", &mut bigbuf[..]).unwrap();
    assert_eq!(&bigbuf[..n], &big[..]);
    rustix::fs::removexattr(&f, "user.big").unwrap();
    rustix::fs::removexattr(&f, "user.one").unwrap();
    assert_eq!(
        rustix::fs::removexattr(&f, "user.one").unwrap_err(),
        Errno::NODATA
    );
    let n = rustix::fs::getxattr(&f, "user.cilfs.change", &mut buf[..]).unwrap();
    let c1: u64 = std::str::from_utf8(&buf[..n]).unwrap().parse().unwrap();
    assert_eq!(
        rustix::fs::setxattr(&f, "user.cilfs.change", b"1", XattrFlags::empty()).unwrap_err(),
        Errno::PERM
    );
    fs::write(&f, b"other").unwrap();
    let out = cilfs(&["stat", "--change", f.to_str().unwrap()]);
    let c2: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(c2 > c1, "{c2} > {c1}");
    // fallocate: allocate, keep size, punch a hole; SEEK_DATA/SEEK_HOLE.
    let g = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("g"))
        .unwrap();
    rustix::fs::fallocate(&g, FallocateFlags::empty(), 0, 1 << 20).unwrap();
    assert_eq!(g.metadata().unwrap().len(), 1 << 20);
    rustix::fs::fallocate(&g, FallocateFlags::KEEP_SIZE, 1 << 20, 1 << 20).unwrap();
    assert_eq!(g.metadata().unwrap().len(), 1 << 20);
    (&g).write_all(&[9u8; 1 << 20]).unwrap();
    rustix::fs::fallocate(
        &g,
        FallocateFlags::KEEP_SIZE | FallocateFlags::PUNCH_HOLE,
        8192,
        65536,
    )
    .unwrap();
    let mut back = vec![0u8; 1 << 20];
    (&g).seek(std::io::SeekFrom::Start(0)).unwrap();
    (&g).read_exact(&mut back).unwrap();
    assert!(back[..8192].iter().all(|&b| b == 9));
    assert!(back[8192..73728].iter().all(|&b| b == 0));
    assert!(back[73728..].iter().all(|&b| b == 9));
    assert_eq!(rustix::fs::seek(&g, SeekFrom::Hole(0)).unwrap(), 8192);
    assert_eq!(rustix::fs::seek(&g, SeekFrom::Data(8192)).unwrap(), 73728);
    // A negative offset (rustix passes the u64 on as an off_t) is ENXIO, as on ext4 and XFS.
    for neg in [u64::MAX, u64::MAX - 4095, 1 << 63] {
        for whence in [SeekFrom::Data(neg), SeekFrom::Hole(neg)] {
            assert_eq!(
                rustix::fs::seek(&g, whence).unwrap_err(),
                Errno::NXIO,
                "{whence:?}"
            );
        }
    }
    // Linux's FUSE (6.18) refuses COLLAPSE_RANGE itself, whatever the daemon serves.
    assert_eq!(
        rustix::fs::fallocate(&g, FallocateFlags::COLLAPSE_RANGE, 0, 4096).unwrap_err(),
        Errno::OPNOTSUPP
    );
    // ZERO_RANGE reaches cilfs: zeros, the size grown to the range's end.
    g.write_all_at(&[5u8; 8192], 0).unwrap();
    rustix::fs::fallocate(&g, FallocateFlags::ZERO_RANGE, 100, (1 << 20) + 100).unwrap();
    assert_eq!(g.metadata().unwrap().len(), (1 << 20) + 200);
    let mut back = vec![1u8; 8192];
    g.read_exact_at(&mut back, 0).unwrap();
    assert!(back[..100].iter().all(|&b| b == 5) && back[100..].iter().all(|&b| b == 0));
    rustix::fs::fsync(&g).unwrap();
    rustix::fs::fdatasync(&g).unwrap();
    drop(g);
    let s = rustix::fs::statfs(&m.dir).unwrap();
    assert!(s.f_blocks > 0 && s.f_bfree <= s.f_blocks && s.f_bavail <= s.f_bfree);
    assert_eq!(s.f_namelen, 255);
    // Live counters without any new name in the namespace.
    let out = cilfs(&["stat", "--json", m.dir.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["transactions"].as_u64().unwrap() > 0);
    assert!(v["fsyncs"].as_u64().unwrap() >= 2);
    // Requests by opcode and the transport: 1,000 one-byte writes are 1,000 WRITE requests,
    // and over io_uring 1,000 requests through the queues (so that a mount that fell back to
    // /dev/fuse reads fails here).
    let t = common::test_transport();
    // The default (uring=auto) takes the queues exactly when the kernel's switch is on.
    if t != "default" {
        assert_eq!(v["transport_uring"].as_u64(), Some(u64::from(t == "uring")));
    }
    let writes = |v: &serde_json::Value| v["requests_write"].as_u64().unwrap_or(0);
    let ring = |v: &serde_json::Value| v["uring_requests"].as_u64().unwrap_or(0);
    let (before, ring_before) = (writes(&v), ring(&v));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("bytes"))
        .unwrap();
    for _ in 0..1000 {
        f.write_all(b"x").unwrap();
    }
    drop(f);
    let out = cilfs(&["stat", "--json", m.dir.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(writes(&v) - before, 1000, "{v}");
    if t == "uring" {
        assert!(v["uring_queues"].as_u64().unwrap() > 0, "{v}");
        assert!(ring(&v) - ring_before >= 1000, "{v}");
    }
    assert!(v["requests_lookup"].as_u64().unwrap() > 0);
    m.unmount();
}

/// `cilfs stat DIR` opens with a summary in human units that agrees with statfs and names the
/// transport and the data mode; the counters themselves come with --all, each with its rate.
#[test]
fn stat_summarises_the_mount_and_lists_the_counters_with_all() {
    for (opts, mode) in [(&[][..], "ordered"), (&["data=writeback"][..], "writeback")] {
        let m = Mounted::new("64M", opts);
        for i in 0..10 {
            fs::write(m.p(&format!("f{i}")), b"x").unwrap();
        }
        let dir = m.dir.to_str().unwrap();
        let out = cilfs(&["stat", dir]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.starts_with(&format!("{dir}: rates over the last ")),
            "{text}"
        );
        // The root and the ten files.
        let st = rustix::fs::statvfs(&m.dir).unwrap();
        assert_eq!(st.f_files - st.f_ffree, 11);
        assert!(text.contains("\ninodes      11 used, "), "{text}");
        // The data area: 64 MiB less the log.
        let total = (st.f_blocks * st.f_frsize) as f64 / f64::from(1 << 20);
        assert!(
            text.contains(&format!(" available, of {total:.1} MiB (")),
            "{text}"
        );
        assert!(text.contains("\noperations  "), "{text}");
        assert!(text.contains(" writes/s, "), "{text}");
        assert!(text.contains(&format!("\ndata mode   {mode} (")), "{text}");
        let transport = match common::test_transport().as_str() {
            "uring" => "io_uring, ",
            "native" => "/dev/fuse reads",
            _ => "",
        };
        assert!(
            text.contains(&format!("\ntransport   {transport}")),
            "{text}"
        );
        assert!(
            !text.contains("transactions "),
            "counters only with --all: {text}"
        );

        let out = cilfs(&["stat", "--all", dir]);
        let all = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{all}");
        assert!(all.contains("\ninodes      11 used, "), "{all}");
        let line = |name: &str| {
            all.lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .unwrap_or_else(|| panic!("no {name} in {all}"))
                .to_string()
        };
        // Each counter read twice, so each has its rate; no file was made between the readings
        // (write back of the files' data may still run a transaction meanwhile).
        assert!(line("transactions").ends_with("/s)"), "{all}");
        assert!(line("requests_create").ends_with("  (+0/s)"), "{all}");
        assert_eq!(
            line("data_ordered").split_whitespace().nth(1),
            Some(if mode == "ordered" { "1" } else { "0" })
        );
        m.unmount();
    }
}

#[test]
fn unlinked_open_files_live_until_closed() {
    let m = Mounted::new("128M", &[]);
    let free0 = rustix::fs::statfs(&m.dir).unwrap().f_bfree;
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("tmp"))
        .unwrap();
    f.write_all(&vec![1u8; 8 << 20]).unwrap();
    fs::remove_file(m.p("tmp")).unwrap();
    assert_eq!(errno(fs::metadata(m.p("tmp")).unwrap_err()), Errno::NOENT);
    let meta = f.metadata().unwrap();
    assert_eq!((meta.len(), meta.nlink()), (8 << 20, 0));
    f.seek(std::io::SeekFrom::Start(100)).unwrap();
    let mut b = [0u8; 4];
    f.read_exact(&mut b).unwrap();
    assert_eq!(b, [1u8; 4]);
    assert!(rustix::fs::statfs(&m.dir).unwrap().f_bfree < free0);
    drop(f);
    // The last close frees it; FUSE sends the release after close returns, so wait for it.
    let came_back = (0..500).any(|_| {
        let after = rustix::fs::statfs(&m.dir).unwrap().f_bfree;
        after + 16 >= free0 || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        }
    });
    assert!(
        came_back,
        "the blocks of the unlinked file came back after its last close"
    );
    m.unmount();
}

#[test]
fn posix_permissions_sticky_setgid_and_suid() {
    let m = Mounted::new("128M", &["allow_other"]);
    let t = m.p("tmp");
    fs::create_dir(&t).unwrap();
    fs::set_permissions(&t, fs::Permissions::from_mode(0o1777)).unwrap();
    let file = t.join("mine");
    let out = as_user(
        1001,
        1001,
        &["sh", "-c", &format!("echo a > {}", file.display())],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::metadata(&file).unwrap().uid(),
        1001,
        "new files belong to the caller"
    );
    // Sticky: another user cannot remove it.
    let out = as_user(1002, 1002, &["rm", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(file.exists());
    // Without write permission on the directory: EACCES.
    fs::create_dir(m.p("ro")).unwrap();
    let out = as_user(1001, 1001, &["touch", m.p("ro/x").to_str().unwrap()]);
    assert!(!out.status.success());
    // Setgid directory: new files take its group, new directories its setgid bit.
    let g = m.p("grp");
    fs::create_dir(&g).unwrap();
    rustix::fs::chown(&g, None, Some(rustix::process::Gid::from_raw(500))).unwrap();
    fs::set_permissions(&g, fs::Permissions::from_mode(0o2777)).unwrap();
    let out = as_user(
        1001,
        1001,
        &[
            "sh",
            "-c",
            &format!("touch {0}/f && mkdir {0}/sub", g.display()),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::metadata(g.join("f")).unwrap().gid(), 500);
    let sub = fs::metadata(g.join("sub")).unwrap();
    assert_eq!((sub.gid(), sub.mode() & 0o2000), (500, 0o2000));
    // Set-user-ID is cleared when someone else writes, and on chown.
    let s = t.join("suid");
    fs::write(&s, b"#!/bin/sh\n").unwrap();
    rustix::fs::chown(
        &s,
        Some(rustix::process::Uid::from_raw(1001)),
        Some(rustix::process::Gid::from_raw(1001)),
    )
    .unwrap();
    fs::set_permissions(&s, fs::Permissions::from_mode(0o4777)).unwrap();
    let out = as_user(
        1001,
        1001,
        &["sh", "-c", &format!("echo more >> {}", s.display())],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::metadata(&s).unwrap().mode() & 0o4000,
        0,
        "write cleared set-user-ID"
    );
    fs::set_permissions(&s, fs::Permissions::from_mode(0o4755)).unwrap();
    rustix::fs::chown(&s, Some(rustix::process::Uid::from_raw(1002)), None).unwrap();
    assert_eq!(
        fs::metadata(&s).unwrap().mode() & 0o4000,
        0,
        "chown cleared set-user-ID"
    );
    m.unmount();
}

#[test]
fn full_filesystem_enospc_then_unlink_works() {
    let m = Mounted::new("32M", &[]);
    let mut f = File::create(m.p("big")).unwrap();
    let chunk = vec![3u8; 1 << 20];
    let err = loop {
        if let Err(e) = f.write_all(&chunk) {
            break e;
        }
    };
    assert_eq!(errno(err), Errno::NOSPC);
    drop(f);
    fs::remove_file(m.p("big")).unwrap();
    fs::write(m.p("small"), vec![1u8; 1 << 20]).unwrap();
    m.unmount();
}

#[test]
fn bad_mount_options_mount_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    let dir = tmp.path().join("mnt");
    fs::create_dir(&dir).unwrap();
    assert!(
        cilfs(&["mkfs", "-q", "--size", "64M", img.to_str().unwrap()])
            .status
            .success()
    );
    for bad in [
        "nosuch",
        "logbufs=9",
        "logbsize=1M",
        "flush=never",
        "iversion=sometimes",
        "tsgran=5s",
        "cache=16M",
        "cache=3G",
        "cache=1P",
        "cache=99999999999P",
        "transport=fuser",
        "transport=uring",
    ] {
        let out = cilfs(&[
            "mount",
            img.to_str().unwrap(),
            dir.to_str().unwrap(),
            "-o",
            bad,
        ]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{bad}: one line: {err}");
        assert!(!fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(dir.to_str().unwrap()));
    }
    // The fuser transport is gone: asking for it names what serves instead.
    let out = cilfs(&[
        "mount",
        img.to_str().unwrap(),
        dir.to_str().unwrap(),
        "-o",
        "transport=fuser",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("transport=fuser: the fuser transport has been removed")
            && err.contains("transport=native")
            && err.contains("uring=on|off|auto"),
        "{err}"
    );
    // An image another program holds (a tool, not a mount) is refused.
    let lock = fs::File::open(&img).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let out = cilfs(&["mount", img.to_str().unwrap(), dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    drop(lock);
    // A second mount of a mounted image is the same filesystem on a second directory.
    let dir2 = tmp.path().join("mnt2");
    fs::create_dir(&dir2).unwrap();
    assert!(
        cilfs(&["mount", img.to_str().unwrap(), dir.to_str().unwrap()])
            .status
            .success()
    );
    let out = cilfs(&["mount", img.to_str().unwrap(), dir2.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    fs::write(dir.join("f"), b"seen twice").unwrap();
    assert_eq!(fs::read(dir2.join("f")).unwrap(), b"seen twice");
    assert!(cilfs(&["unmount", dir2.to_str().unwrap()]).status.success());
    assert!(cilfs(&["unmount", dir.to_str().unwrap()]).status.success());
}

#[test]
fn a_directory_that_is_already_a_mount_point_is_refused() {
    let m = Mounted::new("64M", &[]);
    let _cleanup = UnmountAll(m.dir.clone());
    fs::write(m.p("first"), b"on the first image").unwrap();
    let img2 = m.img.with_file_name("second.img");
    assert!(
        cilfs(&["mkfs", "-q", "--size", "64M", img2.to_str().unwrap()])
            .status
            .success()
    );
    let dir = m.dir.to_str().unwrap();
    for fg in [false, true] {
        let mut args = vec!["mount", img2.to_str().unwrap(), dir];
        if fg {
            args.push("--foreground");
        }
        let out = cilfs(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("is already a mount point"), "{err}");
        assert!(err.contains(dir), "names the directory: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert_eq!(mounts_on(&m.dir), 1, "nothing stacked on the first mount");
    }
    // The first mount still serves, and the second image is free for a mount elsewhere.
    assert_eq!(fs::read(m.p("first")).unwrap(), b"on the first image");
    let dir2 = m.dir.with_file_name("mnt2");
    fs::create_dir(&dir2).unwrap();
    let _cleanup2 = UnmountAll(dir2.clone());
    let out = cilfs(&["mount", img2.to_str().unwrap(), dir2.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(cilfs(&["unmount", dir2.to_str().unwrap()]).status.success());
    // One unmount, and the directory is no mount point any more.
    m.unmount();
    assert_eq!(mounts_on(&m.dir), 0);
}

#[test]
fn killed_daemon_leaves_a_log_the_next_mount_replays() {
    let m = Mounted::new("128M", &[]);
    fs::write(m.p("kept"), b"synced").unwrap();
    File::open(m.p("kept")).unwrap().sync_all().unwrap();
    fs::create_dir(m.p("dir")).unwrap();
    // A directory fsync makes the namespace change durable (sync(2) reaches the filesystem
    // only on a fuseblk.cilfs mount, through FUSE_SYNCFS).
    File::open(&m.dir).unwrap().sync_all().unwrap();
    // Kill the daemon: no unmount record.
    m.kill_daemon();
    let out = cilfs(&["check", m.img.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("not clean"),
        "the log needed replay"
    );
    m.mount(&[]);
    assert_eq!(fs::read(m.p("kept")).unwrap(), b"synced");
    assert!(m.p("dir").is_dir());
    m.unmount();
}

/// A plain FUSE mount (`noloop`) is not `fuseblk`: umount(8) returns before its daemon has
/// written the image back and let go of it. A mount right after waits for that instead of
/// calling the image in use, and finds every file whole.
#[test]
fn a_mount_right_after_a_plain_umount_waits_for_the_image() {
    let m = Mounted::new("512M", &["noloop"]);
    let data: Vec<u8> = (0..32u32 << 20).map(|i| (i % 251) as u8).collect();
    for round in 0..3 {
        let name = format!("f{round}");
        fs::write(m.p(&name), &data).unwrap();
        run(&["umount", m.dir.to_str().unwrap()]);
        m.mount(&["noloop"]);
        for r in 0..=round {
            assert!(
                fs::read(m.p(&format!("f{r}"))).unwrap() == data,
                "f{r} after remount {round}"
            );
        }
    }
    m.unmount();
}

/// df comes back after a delete: 200 MiB written and deleted on a 512 MiB
/// image, with `sync` around the delete as a user would run it, and the free blocks are back
/// within 1%. `sync` need not reach cilfs (only a fuseblk.cilfs mount gets FUSE_SYNCFS), so
/// this holds because statfs counts the blocks freed by the unlink, busy until a checkpoint
/// makes the free stable, as free: they came back 200 MiB short before.
#[test]
fn df_comes_back_after_writing_and_deleting_200_mib() {
    let m = Mounted::new("512M", &[]);
    let before = rustix::fs::statfs(&m.dir).unwrap();
    let mut f = File::create(m.p("big")).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..200 {
        f.write_all(&chunk).unwrap();
    }
    drop(f);
    let sync = || assert!(Command::new("sync").status().unwrap().success());
    sync();
    let full = rustix::fs::statfs(&m.dir).unwrap();
    let file_blocks = (200 << 20) / full.f_bsize as u64;
    assert!(
        full.f_bavail + file_blocks <= before.f_bavail,
        "the file took less than 200 MiB: {} -> {} blocks available",
        before.f_bavail,
        full.f_bavail
    );
    fs::remove_file(m.p("big")).unwrap();
    sync();
    let after = rustix::fs::statfs(&m.dir).unwrap();
    let within_1pct = |now: u64, then: u64| now.abs_diff(then) * 100 <= then;
    assert!(
        within_1pct(after.f_bfree, before.f_bfree) && within_1pct(after.f_bavail, before.f_bavail),
        "free {} -> {}, available {} -> {} blocks",
        before.f_bfree,
        after.f_bfree,
        before.f_bavail,
        after.f_bavail
    );
    m.unmount();
}

/// POSIX ACLs are enforced for another user, kept in step with the mode, inherited from
/// default ACLs (with a set-group-ID directory), validated, and kept across a remount;
/// `noacl` refuses them.
#[test]
fn acls_are_enforced_inherited_and_kept() {
    const NOBODY: u32 = 65534;
    let m = Mounted::new("128M", &["allow_other"]);
    fs::set_permissions(&m.dir, fs::Permissions::from_mode(0o1777)).unwrap();
    let (f, g) = (m.p("f"), m.p("g"));
    fs::write(&f, b"open\n").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&g, b"secret\n").unwrap();
    fs::set_permissions(&g, fs::Permissions::from_mode(0o640)).unwrap();
    let reads = |p: &Path| {
        as_user(NOBODY, NOBODY, &["cat", p.to_str().unwrap()])
            .status
            .success()
    };
    assert!(reads(&f) && !reads(&g), "the mode alone decides");
    run(&["setfacl", "-m", "u:nobody:---", f.to_str().unwrap()]);
    run(&["setfacl", "-m", "u:nobody:r", g.to_str().unwrap()]);
    assert!(!reads(&f), "an ACL deny entry blocks");
    assert!(reads(&g), "an ACL grant allows");
    assert_eq!(fs::metadata(&g).unwrap().mode() & 0o777, 0o640);
    // chmod rewrites the mask.
    fs::set_permissions(&g, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(run(&["getfacl", "-n", g.to_str().unwrap()]).contains("mask::---"));
    assert!(!reads(&g), "the mask now hides the named entry");
    // Default ACLs in a set-group-ID directory: files and directories inherit, the umask is
    // not applied, new directories keep set-group-ID and the directory's group.
    let d = m.p("d");
    fs::create_dir(&d).unwrap();
    run(&["setfacl", "-d", "-m", "u:nobody:rwx", d.to_str().unwrap()]);
    rustix::fs::chown(&d, None, Some(rustix::process::Gid::from_raw(500))).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o2755)).unwrap();
    run(&[
        "sh",
        "-c",
        &format!("umask 022 && touch {0}/x && mkdir {0}/y", d.display()),
    ]);
    let x = fs::metadata(d.join("x")).unwrap();
    assert_eq!(
        (x.mode(), x.gid()),
        (0o100_664, 500),
        "the mode Linux gives"
    );
    let y = fs::metadata(d.join("y")).unwrap();
    assert_eq!((y.mode(), y.gid()), (0o42_775, 500));
    let ya = run(&["getfacl", "-n", d.join("y").to_str().unwrap()]);
    assert!(
        ya.contains("\nuser:65534:rwx") && ya.contains("default:user:65534:rwx"),
        "{ya}"
    );
    let xa = run(&["getfacl", "-n", d.join("x").to_str().unwrap()]);
    assert!(xa.contains("user:65534:rwx\t#effective:rw-"), "{xa}");
    let appends = as_user(
        NOBODY,
        NOBODY,
        &["sh", "-c", &format!("echo z >> {}/x", d.display())],
    );
    assert!(appends.status.success(), "the inherited entry grants write");
    // A malformed ACL is refused: a named user and no mask.
    let mut bad = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 7),
        (4, 4, u32::MAX),
        (32, 4, u32::MAX),
    ] {
        bad.extend_from_slice(&tag.to_le_bytes());
        bad.extend_from_slice(&perm.to_le_bytes());
        bad.extend_from_slice(&id.to_le_bytes());
    }
    let r = rustix::fs::setxattr(&f, "system.posix_acl_access", &bad, XattrFlags::empty());
    assert_eq!(r, Err(Errno::INVAL));
    // Kept across a remount.
    m.unmount();
    m.mount(&["allow_other"]);
    assert!(!reads(&f) && !reads(&g));
    assert!(run(&["getfacl", "-n", f.to_str().unwrap()]).contains("user:65534:---"));
    m.unmount();
    m.mount(&["allow_other", "noacl"]);
    let out = Command::new("setfacl")
        .args(["-m", "u:nobody:r", g.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success(), "noacl refuses ACLs");
    m.unmount();
}

/// A python3 that an unprivileged user may run (a pyenv shim under /root is not one).
fn python3() -> &'static str {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("this test needs python3 in /usr/bin or /usr/local/bin (scripts/install-deps)")
}

#[test]
fn set_user_and_group_id_are_cleared_by_another_users_data_changes() {
    let m = Mounted::new("128M", &["allow_other"]);
    let w = m.p("w");
    fs::create_dir(&w).unwrap();
    fs::set_permissions(&w, fs::Permissions::from_mode(0o1777)).unwrap();
    let f = w.join("f");
    let p = f.display();
    // msync sends the page the kernel's write back, with root's credentials in its header.
    let mmap = format!(
        "{} -c \"import mmap, os; fd = os.open('{p}', os.O_RDWR); m = mmap.mmap(fd, 4096); \
         m[0:2] = b'mm'; m.flush(); m.close(); os.close(fd)\"",
        python3()
    );
    let changes = [
        ("write", format!("printf x 1<> {p}")),
        ("append", format!("echo x >> {p}")),
        ("truncate", format!("truncate -s 100 {p}")),
        ("fallocate", format!("fallocate -l 65536 {p}")),
        ("punch", format!("fallocate -p -o 0 -l 4096 {p}")),
        ("mmap write", mmap),
    ];
    let mode = |f: &Path| fs::metadata(f).unwrap().mode() & 0o7777;
    for (what, script) in &changes {
        // A root:root file: nobody is outside its group. The mode is read at once, so a bit
        // the kernel kept cached would fail it too.
        for (before, after) in [(0o2666, 0o666), (0o2676, 0o676), (0o6666, 0o666)] {
            fs::write(&f, vec![1u8; 8192]).unwrap();
            fs::set_permissions(&f, fs::Permissions::from_mode(before)).unwrap();
            let out = as_user(65534, 65534, &["sh", "-c", script]);
            assert!(
                out.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                format!("{:o}", mode(&f)),
                format!("{after:o}"),
                "{what} by nobody of a {before:o} file"
            );
        }
        // Root may keep them.
        fs::write(&f, vec![1u8; 8192]).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o6676)).unwrap();
        let out = Command::new("sh").args(["-c", script]).output().unwrap();
        assert!(out.status.success(), "{what} by root");
        assert_eq!(format!("{:o}", mode(&f)), "6676", "{what} by root");
    }
    assert_eq!(
        &fs::read(&f).unwrap()[..2],
        b"mm",
        "the mmap write reached the file"
    );
    // chown: an owner outside the file's group loses set-group-ID even without group execute;
    // root loses set-user-ID and keeps set-group-ID without group execute (as on ext4).
    let chown = |uid: u32, gid: u32| {
        rustix::fs::chown(
            &f,
            Some(rustix::process::Uid::from_raw(uid)),
            Some(rustix::process::Gid::from_raw(gid)),
        )
        .unwrap()
    };
    chown(65534, 0);
    fs::set_permissions(&f, fs::Permissions::from_mode(0o2644)).unwrap();
    let out = as_user(65534, 65534, &["chown", "65534", f.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(format!("{:o}", mode(&f)), "644", "chown by its owner");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6644)).unwrap();
    chown(0, 0);
    assert_eq!(format!("{:o}", mode(&f)), "2644", "chown by root");
    m.unmount();
}

#[test]
fn reads_move_atime_as_relatime_strictatime_and_noatime_say() {
    let times = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (
            (m.atime(), m.atime_nsec()),
            (m.mtime(), m.mtime_nsec()),
            (m.ctime(), m.ctime_nsec()),
        )
    };
    for (opt, moves, moves_again) in [
        (None, true, false),
        (Some("relatime"), true, false),
        (Some("strictatime"), true, true),
        (Some("noatime"), false, false),
    ] {
        let opts: Vec<&str> = opt.into_iter().collect();
        let m = Mounted::new("64M", &opts);
        let (f, d) = (m.p("f"), m.p("d"));
        fs::write(&f, b"data").unwrap();
        fs::create_dir(&d).unwrap();
        for p in [&f, &d] {
            set_atime_2001(p);
            assert_eq!(times(p).0, (Y2001, 0), "{opt:?}");
        }
        let (_, mtime, ctime) = times(&f);
        assert_eq!(fs::read(&f).unwrap(), b"data");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 0);
        // stat right after the read: the kernel asks again for an atime a read made stale.
        let (atime, mtime2, ctime2) = times(&f);
        assert_eq!(
            (mtime2, ctime2),
            (mtime, ctime),
            "{opt:?}: a read is not a change"
        );
        assert_eq!(atime.0 > Y2001, moves, "{opt:?}: file atime {atime:?}");
        assert_eq!(times(&d).0 .0 > Y2001, moves, "{opt:?}: directory atime");
        // A second read (a new open, so it reaches the daemon) a little later: only
        // strictatime moves an atime newer than mtime and ctime.
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::read(&f).unwrap();
        assert_eq!(times(&f).0 != atime, moves_again, "{opt:?}: second read");
        let kept = times(&f).0;
        if opt == Some("noatime") {
            assert!(fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .any(|l| l.contains(m.dir.to_str().unwrap()) && l.contains("noatime")));
        }
        // Logged like any change: still there after a remount.
        m.unmount();
        m.mount(&opts);
        assert_eq!(times(&f).0, kept, "{opt:?}: after a remount");
        m.unmount();
    }
}

/// `cilfs check`'s output: whether the log needed replay.
fn needs_recovery(img: &Path) -> bool {
    let out = cilfs(&["check", img.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "check: {text}");
    text.contains("log: not clean")
}

/// `cilfs mount --foreground` of `m`, as a systemd unit runs it: readiness goes to the datagram
/// socket `notify`, messages to `log`.
fn foreground_daemon(m: &Mounted, notify: &Path, log: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_cilfs"))
        .args(["mount", "--foreground"])
        .arg(&m.img)
        .arg(&m.dir)
        .env("NOTIFY_SOCKET", notify)
        .stdout(std::process::Stdio::null())
        .stderr(File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// SIGTERM, SIGINT and SIGHUP (systemctl stop, ^C, a closed terminal) end the daemon with a
/// clean unmount: files and a directory made a moment before, with no fsync, are there after
/// a remount, and the image needed no recovery. The daemon runs in the foreground as a
/// systemd unit runs it, telling readiness through NOTIFY_SOCKET.
#[test]
fn stop_signals_unmount_cleanly() {
    use rustix::process::{kill_process, Pid, Signal};
    let m = Mounted::new("128M", &[]);
    let _cleanup = UnmountAll(m.dir.clone());
    m.unmount();
    let sock_path = m.img.with_file_name("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let recv = || {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).expect("a notification within 60 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let signals = [
        ("SIGTERM", Signal::TERM),
        ("SIGINT", Signal::INT),
        ("SIGHUP", Signal::HUP),
    ];
    for (k, (name, sig)) in signals.iter().enumerate() {
        let log = m.img.with_file_name(format!("daemon-{k}.log"));
        let mut daemon = foreground_daemon(&m, &sock_path, &log);
        let ready = recv();
        assert!(ready.starts_with("READY=1"), "{name}: {ready}");
        assert_eq!(mounts_on(&m.dir), 1, "{name}: ready means mounted");
        fs::write(m.p(&format!("file{k}")), format!("written before {name}")).unwrap();
        fs::create_dir(m.p(&format!("dir{k}"))).unwrap();
        fs::write(m.p(&format!("dir{k}/inner")), vec![k as u8; 100_000]).unwrap();
        let pid = Pid::from_raw(daemon.id() as i32).unwrap();
        kill_process(pid, *sig).unwrap();
        let status = wait_for_exit(&mut daemon);
        let said = fs::read_to_string(&log).unwrap();
        assert!(status.success(), "{name}: {status}: {said}");
        assert!(said.contains(&format!("{name}: unmounting")), "{said}");
        assert_eq!(recv(), "STOPPING=1", "{name}");
        assert_eq!(mounts_on(&m.dir), 0, "{name}: unmounted");
        let info = cilfs(&["info", m.img.to_str().unwrap()]);
        let info = String::from_utf8_lossy(&info.stdout).into_owned();
        assert!(info.contains("state          clean"), "{name}: {info}");
        assert!(!info.contains("mounted"), "{name}: {info}");
        assert!(!needs_recovery(&m.img), "{name}: the log needed no replay");
        m.mount(&[]);
        for (j, (n, _)) in signals.iter().enumerate().take(k + 1) {
            assert_eq!(
                fs::read_to_string(m.p(&format!("file{j}"))).unwrap(),
                format!("written before {n}")
            );
            assert_eq!(
                fs::read(m.p(&format!("dir{j}/inner"))).unwrap(),
                vec![j as u8; 100_000]
            );
        }
        m.unmount();
    }
}

/// mkfs (with --force too) and check refuse an image that is mounted, or a log device a
/// mount uses, with one line and exit 2, as mkfs.xfs and xfs_repair -n refuse a mounted
/// device; the mount goes on unharmed.
#[test]
fn mkfs_and_check_refuse_a_mounted_image() {
    let m = Mounted::new("64M", &[]);
    fs::write(m.p("kept"), b"still here").unwrap();
    let img = m.img.clone();
    let img = img.to_str().unwrap();
    let other = m.img.with_file_name("other.img");
    let other = other.to_str().unwrap();
    for args in [
        vec!["mkfs", "-q", img],
        vec!["mkfs", "-q", "--force", img],
        vec![
            "mkfs", "-q", "--force", "--size", "32M", "--logdev", img, other,
        ],
        vec!["check", img],
    ] {
        let out = cilfs(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("is mounted: unmount it"), "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line: {err}"
        );
    }
    assert!(!Path::new(other).exists(), "nothing made");
    // info still reads it, and says it is mounted.
    let info = cilfs(&["info", img]);
    assert!(info.status.success());
    assert!(String::from_utf8_lossy(&info.stdout).contains("mounted        yes"));
    assert_eq!(fs::read(m.p("kept")).unwrap(), b"still here");
    m.unmount();
    // Unmounted, both work again.
    assert!(cilfs(&["check", img]).status.success());
    assert!(cilfs(&["mkfs", "-q", "--force", img]).status.success());
}

/// A mount that fails (here: a user without access to /dev/fuse and no right to mount on the
/// directory) after opening the image and recovering its log leaves the image byte-identical:
/// the log still needs its replay, which the next mount does.
#[test]
fn a_failed_mount_leaves_the_image_byte_identical() {
    const NOBODY: u32 = 65534;
    let m = Mounted::new("64M", &[]);
    fs::write(m.p("synced"), b"in the log").unwrap();
    File::open(m.p("synced")).unwrap().sync_all().unwrap();
    File::open(&m.dir).unwrap().sync_all().unwrap();
    m.kill_daemon();
    // The user may read and write the image, not mount on the root-owned directory.
    let tmp = m.img.parent().unwrap().to_path_buf();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
    rustix::fs::chown(
        &m.img,
        Some(rustix::process::Uid::from_raw(NOBODY)),
        Some(rustix::process::Gid::from_raw(NOBODY)),
    )
    .unwrap();
    let before = sha1(&m.img);
    for opts in ["", "allow_other"] {
        let mut args = vec![
            env!("CARGO_BIN_EXE_cilfs"),
            "mount",
            "--foreground",
            m.img.to_str().unwrap(),
            m.dir.to_str().unwrap(),
        ];
        if !opts.is_empty() {
            args.extend(["-o", opts]);
        }
        let out = as_user(NOBODY, NOBODY, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{opts}: {err}");
        assert!(
            err.contains("mounting on"),
            "{opts}: failed at the mount: {err}"
        );
        assert_eq!(mounts_on(&m.dir), 0);
        assert_eq!(sha1(&m.img), before, "{opts}: the image was written: {err}");
    }
    assert!(needs_recovery(&m.img), "the replay was not written");
    m.mount(&[]);
    assert_eq!(fs::read(m.p("synced")).unwrap(), b"in the log");
    m.unmount();
}

/// `ro` writes nothing once mounted. A dirty log is replayed first, as XFS does, through the
/// image opened read-write for that alone, and the image is left clean; `norecovery` mounts
/// without replaying it (and says so) and writes nothing at all. On read-only media (a
/// read-only bind mount, where even root cannot open it for writing) an image with mode 0444
/// mounts read-only, and one with a dirty log is refused (one line naming `norecovery`) or
/// mounted with `ro,norecovery`.
#[test]
fn ro_replays_a_dirty_log_first_norecovery_writes_nothing_and_read_only_media_mount() {
    let m = Mounted::new("64M", &[]);
    fs::write(m.p("clean"), b"before the crash").unwrap();
    m.unmount();
    let make_dirty = |name: &str| {
        m.mount(&[]);
        fs::write(m.p(name), b"in the log").unwrap();
        File::open(m.p(name)).unwrap().sync_all().unwrap();
        File::open(&m.dir).unwrap().sync_all().unwrap();
        m.kill_daemon();
    };
    make_dirty("synced");
    let (img, dir) = (m.img.clone(), m.dir.clone());
    let (img, dir) = (img.to_str().unwrap(), dir.to_str().unwrap());
    let dirty = sha1(&m.img);
    let out = cilfs(&["mount", img, dir, "-o", "norecovery"]);
    assert_eq!(out.status.code(), Some(2), "norecovery alone is refused");
    let out = cilfs(&["mount", img, dir, "-o", "ro,norecovery"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("not replayed"), "says so: {err}");
    assert_eq!(fs::read(m.p("clean")).unwrap(), b"before the crash");
    assert_eq!(errno(fs::write(m.p("new"), b"x").unwrap_err()), Errno::ROFS);
    m.unmount_without_check();
    assert_eq!(sha1(&m.img), dirty, "ro,norecovery wrote to the image");
    assert!(needs_recovery(&m.img), "the log is still there");
    // `ro` on the dirty log: replayed, then mounted read-only.
    let out = cilfs(&["mount", img, dir, "-o", "ro"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(fs::read(m.p("synced")).unwrap(), b"in the log");
    assert_eq!(errno(fs::write(m.p("new"), b"x").unwrap_err()), Errno::ROFS);
    m.unmount();
    assert!(!needs_recovery(&m.img), "the replay left the image clean");
    make_dirty("late");
    let dirty = sha1(&m.img);
    // Read-only media: the image's directory bind-mounted read-only over itself.
    let tmp = m.img.parent().unwrap().to_path_buf();
    fs::set_permissions(&m.img, fs::Permissions::from_mode(0o444)).unwrap();
    rustix::mount::mount_bind(&tmp, &tmp).unwrap();
    let _media = UnmountAll(tmp.clone());
    let _cleanup = UnmountAll(m.dir.clone());
    rustix::mount::mount_remount(
        &tmp,
        rustix::mount::MountFlags::BIND | rustix::mount::MountFlags::RDONLY,
        "",
    )
    .unwrap();
    assert_eq!(
        OpenOptions::new()
            .write(true)
            .open(&m.img)
            .unwrap_err()
            .raw_os_error(),
        Some(Errno::ROFS.raw_os_error())
    );
    let out = cilfs(&["mount", img, dir]);
    assert_eq!(out.status.code(), Some(2), "read-write is refused");
    assert_eq!(mounts_on(&m.dir), 0);
    let out = cilfs(&["mount", img, dir, "-o", "ro"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("norecovery"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert_eq!(mounts_on(&m.dir), 0);
    m.mount(&["ro", "norecovery"]);
    assert_eq!(fs::read(m.p("synced")).unwrap(), b"in the log");
    assert_eq!(fs::read(m.p("clean")).unwrap(), b"before the crash");
    m.unmount_without_check();
    assert_eq!(sha1(&m.img), dirty);
}

/// A stop signal on a busy mount (a file held open) detaches it, as libfuse's unmount does:
/// it leaves the namespace at once, the open file keeps working, and the daemon ends with a
/// clean unmount when that file is closed.
#[test]
fn a_stop_signal_on_a_busy_mount_detaches_it_and_ends_at_the_last_close() {
    use rustix::process::{kill_process, Pid, Signal};
    let m = Mounted::new("64M", &[]);
    let _cleanup = UnmountAll(m.dir.clone());
    m.unmount();
    let sock_path = m.img.with_file_name("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let log = m.img.with_file_name("daemon.log");
    let mut daemon = foreground_daemon(&m, &sock_path, &log);
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).expect("READY=1 within 60 s");
    assert!(buf[..n].starts_with(b"READY=1"));
    let mut f = File::create(m.p("busy")).unwrap();
    f.write_all(b"before the signal, ").unwrap();
    kill_process(Pid::from_raw(daemon.id() as i32).unwrap(), Signal::TERM).unwrap();
    let detached = (0..6000).any(|_| {
        mounts_on(&m.dir) == 0 || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        }
    });
    assert!(detached, "the busy mount left the namespace");
    assert!(
        daemon.try_wait().unwrap().is_none(),
        "the daemon serves the open file"
    );
    f.write_all(b"after it").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let status = wait_for_exit(&mut daemon);
    let said = fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}: {said}");
    assert!(said.contains("is busy: detached"), "{said}");
    assert!(!needs_recovery(&m.img));
    m.mount(&[]);
    assert_eq!(
        fs::read(m.p("busy")).unwrap(),
        b"before the signal, after it"
    );
    m.unmount();
}

/// The kernel keeps names and attributes for an hour (the adapter's TTL), so each change must
/// reach its copy at once: through the reply, the kernel's own bookkeeping, or an
/// invalidation from the daemon. Each check is a statx right after the change asking for the
/// one field it checks, which the kernel answers from its copy unless that field is marked
/// stale (a full stat refetches everything once any field is stale, and would hide a field
/// left behind).
#[test]
fn attributes_stay_right_with_long_lifetimes() {
    use rustix::fs::{statx, AtFlags, Statx, StatxFlags};
    use std::os::unix::fs::symlink;
    let m = Mounted::new("128M", &[]);
    let sx = |p: &Path, mask: StatxFlags| -> Statx {
        statx(CWD, p, AtFlags::SYMLINK_NOFOLLOW, mask).unwrap()
    };
    let nlink = |p: &Path| sx(p, StatxFlags::NLINK).stx_nlink;
    let size = |p: &Path| sx(p, StatxFlags::SIZE).stx_size;
    let blocks = |p: &Path| sx(p, StatxFlags::BLOCKS).stx_blocks;
    let ctime = |p: &Path| {
        let t = sx(p, StatxFlags::CTIME).stx_ctime;
        (t.tv_sec, t.tv_nsec)
    };
    let mtime = |p: &Path| {
        let t = sx(p, StatxFlags::MTIME).stx_mtime;
        (t.tv_sec, t.tv_nsec)
    };
    // Past the mount's 1 ms timestamp granularity.
    let tick = || std::thread::sleep(std::time::Duration::from_millis(3));
    // Hard links: the count seen through one name follows link, unlink and rename over the
    // other, and so does the ctime.
    let (a, b, c) = (m.p("a"), m.p("b"), m.p("c"));
    fs::write(&a, b"a").unwrap();
    assert_eq!(nlink(&a), 1);
    let before = ctime(&a);
    tick();
    fs::hard_link(&a, &b).unwrap();
    assert_eq!(nlink(&a), 2, "after a link");
    assert_ne!(ctime(&a), before, "a link changes the ctime");
    let before = ctime(&a);
    tick();
    fs::remove_file(&b).unwrap();
    assert_eq!(nlink(&a), 1, "after unlinking the other name");
    assert_ne!(ctime(&a), before, "an unlink changes the ctime");
    fs::hard_link(&a, &b).unwrap();
    fs::write(&c, b"c").unwrap();
    assert_eq!(nlink(&a), 2);
    let before = ctime(&a);
    tick();
    fs::rename(&c, &b).unwrap();
    assert_eq!(nlink(&a), 1, "after a rename over the other name");
    assert_ne!(
        ctime(&a),
        before,
        "losing a name to a rename changes the ctime"
    );
    assert_eq!(fs::read(&b).unwrap(), b"c");
    assert_eq!(errno(fs::metadata(&c).unwrap_err()), Errno::NOENT);
    // A chmod or chown through one name shows through the other.
    fs::hard_link(&a, &c).unwrap();
    fs::set_permissions(&c, fs::Permissions::from_mode(0o600)).unwrap();
    rustix::fs::chown(&c, Some(rustix::process::Uid::from_raw(1000)), None).unwrap();
    let s = sx(&a, StatxFlags::MODE | StatxFlags::UID);
    assert_eq!((u32::from(s.stx_mode) & 0o7777, s.stx_uid), (0o600, 1000));
    // An xattr changes the ctime.
    let before = ctime(&a);
    tick();
    rustix::fs::setxattr(&a, "user.k", b"v", XattrFlags::empty()).unwrap();
    assert_ne!(ctime(&a), before, "setxattr changes the ctime");
    // Directories: link count, size (its entries) and mtime follow what is made, moved and
    // removed in them.
    let (d, e) = (m.p("d"), m.p("e"));
    fs::create_dir(&d).unwrap();
    fs::create_dir(&e).unwrap();
    let empty = size(&d);
    let before = mtime(&d);
    tick();
    fs::create_dir(d.join("sub")).unwrap();
    assert_eq!((nlink(&d), size(&d)), (3, empty + 1));
    assert_ne!(mtime(&d), before, "a mkdir changes its parent's mtime");
    fs::write(d.join("f"), b"").unwrap();
    assert_eq!(size(&d), empty + 2);
    fs::rename(d.join("sub"), e.join("sub")).unwrap();
    assert_eq!((nlink(&d), nlink(&e)), (2, 3));
    assert_eq!((size(&d), size(&e)), (empty + 1, empty + 1));
    fs::remove_dir(e.join("sub")).unwrap();
    assert_eq!((nlink(&e), size(&e)), (2, empty));
    fs::remove_file(d.join("f")).unwrap();
    assert_eq!(size(&d), empty);
    // Size, blocks and mtime after writes, fallocate and truncate.
    let f = m.p("f");
    fs::write(&f, vec![1u8; 100]).unwrap();
    let before = mtime(&f);
    tick();
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(&[2u8; 100_000])
        .unwrap();
    assert_eq!(size(&f), 100_100);
    assert!(blocks(&f) >= 100_100 / 512, "{}", blocks(&f));
    assert_ne!(mtime(&f), before, "a write changes the mtime");
    // Not against the count before: blocks the appends preallocated past the end go at the
    // last release, which the kernel sends after close returns.
    let h = OpenOptions::new().write(true).open(&f).unwrap();
    rustix::fs::fallocate(&h, FallocateFlags::KEEP_SIZE, 1 << 20, 1 << 20).unwrap();
    assert_eq!(size(&f), 100_100, "KEEP_SIZE keeps the size");
    assert!(
        blocks(&f) >= 100_100 / 512 + (1 << 20) / 512,
        "fallocate's blocks show: {}",
        blocks(&f)
    );
    h.set_len(10).unwrap();
    drop(h);
    assert_eq!(size(&f), 10);
    assert!(blocks(&f) <= 8, "{}", blocks(&f));
    // An unlinked file still open has no link left.
    let h = File::open(&f).unwrap();
    fs::remove_file(&f).unwrap();
    assert_eq!(h.metadata().unwrap().nlink(), 0);
    drop(h);
    // Symlink targets are cached: a symlink made again under the same name is a new one.
    let s = m.p("s");
    symlink("a", &s).unwrap();
    assert_eq!(fs::read(&s).unwrap(), b"a");
    fs::remove_file(&s).unwrap();
    symlink("b", &s).unwrap();
    assert_eq!(fs::read_link(&s).unwrap(), Path::new("b"));
    assert_eq!(fs::read(&s).unwrap(), b"c");
    m.unmount();
}

/// With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves set-user-ID and set-group-ID to the daemon
/// and tells whether a truncate's caller holds CAP_FSETID only in a flag cilfs does not read
/// (the core asks the caller's process): root without CAP_FSETID loses them on a write,
/// truncate or fallocate, as Linux says (root with it keeps them:
/// `set_user_and_group_id_are_cleared_by_another_users_data_changes`).
#[test]
fn root_without_cap_fsetid_loses_set_user_and_group_id() {
    let m = Mounted::new("64M", &[]);
    let f = m.p("f");
    let p = f.display();
    for (what, script) in [
        ("write", format!("printf x 1<> {p}")),
        ("truncate", format!("truncate -s 100 {p}")),
        ("fallocate", format!("fallocate -l 65536 {p}")),
    ] {
        fs::write(&f, vec![1u8; 8192]).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o6775)).unwrap();
        let out = Command::new("setpriv")
            .args(["--inh-caps=-fsetid", "--bounding-set=-fsetid", "--"])
            .args(["sh", "-c", &script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            format!("{:o}", fs::metadata(&f).unwrap().mode() & 0o7777),
            "775",
            "{what} by root without CAP_FSETID"
        );
    }
    m.unmount();
}

/// File capabilities (security.capability) go with any change of the file's data or owner,
/// root's included, as on Linux, and stay through a read or a chmod.
#[test]
fn file_capabilities_go_with_writes_truncates_fallocates_and_chowns() {
    // A version 2 capability set: effective, CAP_NET_RAW permitted.
    const CAPS: [u8; 20] = [
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    const NAME: &str = "security.capability";
    let m = Mounted::new("64M", &[]);
    let f = m.p("f");
    let p = f.display();
    let has_caps = || {
        let mut buf = [0u8; 64];
        match rustix::fs::getxattr(&f, NAME, &mut buf) {
            Ok(n) => {
                assert_eq!(&buf[..n], CAPS);
                true
            }
            Err(e) => {
                assert_eq!(e, Errno::NODATA);
                false
            }
        }
    };
    fs::write(&f, vec![1u8; 8192]).unwrap();
    for (what, script) in [
        ("write", format!("printf x 1<> {p}")),
        ("truncate", format!("truncate -s 100 {p}")),
        ("fallocate", format!("fallocate -l 65536 {p}")),
        ("chown", format!("chown 1000 {p}")),
        ("read", format!("cat {p} > /dev/null")),
        ("chmod", format!("chmod 755 {p}")),
    ] {
        rustix::fs::setxattr(&f, NAME, &CAPS, XattrFlags::empty()).unwrap();
        assert!(has_caps());
        run(&["sh", "-c", &script]);
        let kept = matches!(what, "read" | "chmod");
        assert_eq!(has_caps(), kept, "{what} by root");
    }
    m.unmount();
}

/// Set-user-ID and set-group-ID that another user's write, fallocate or page-cache write
/// cleared show at once in the mode the kernel keeps, which exec and permission checks use:
/// a statx asking for the mode alone gets the kernel's copy, and only the daemon's
/// invalidation makes it stale (a stat also asks for mtime and ctime, which a write marks
/// stale, and so it fetches the mode too).
#[test]
fn set_user_and_group_id_cleared_behind_a_reply_reach_the_kernels_mode() {
    use rustix::fs::{AtFlags, StatxFlags};
    let m = Mounted::new("64M", &["allow_other"]);
    let w = m.p("w");
    fs::create_dir(&w).unwrap();
    fs::set_permissions(&w, fs::Permissions::from_mode(0o1777)).unwrap();
    let f = w.join("f");
    let p = f.display();
    let kernels_mode = |f: &Path| {
        let s = rustix::fs::statx(CWD, f, AtFlags::empty(), StatxFlags::MODE).unwrap();
        u32::from(s.stx_mode) & 0o7777
    };
    let mmap = format!(
        "{} -c \"import mmap, os; fd = os.open('{p}', os.O_RDWR); m = mmap.mmap(fd, 4096); \
         m[0:2] = b'mm'; m.flush(); m.close(); os.close(fd)\"",
        python3()
    );
    for (what, script) in [
        ("write", format!("printf x 1<> {p}")),
        ("fallocate", format!("fallocate -l 65536 {p}")),
        ("punch", format!("fallocate -p -o 0 -l 4096 {p}")),
        ("mmap write", mmap),
    ] {
        fs::write(&f, vec![1u8; 8192]).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o6666)).unwrap();
        assert_eq!(format!("{:o}", kernels_mode(&f)), "6666");
        let out = as_user(65534, 65534, &["sh", "-c", &script]);
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(format!("{:o}", kernels_mode(&f)), "666", "{what} by nobody");
    }
    m.unmount();
}
