//! cilfs as the system's tools run it: `mount -t fuse.cilfs`, an fstab line and `mount DIR`,
//! `nosuid`, `nodev` and `noexec` as kernel mount flags, and fsck(8) and mkfs(8) with their own
//! exit statuses. Needs root, /dev/fuse and util-linux (mount, umount, findmnt, setpriv, fsck,
//! mkfs). Each test installs the helpers with `cilfs install-helpers` (links in /sbin to the
//! binary under test) and puts back what was there before, as it puts back /etc/fstab.
#![allow(clippy::unwrap_used)]

use rustix::fs::{FileType, Mode, CWD};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

mod common;
use common::{as_user, cilfs, miscount_inodes, s, CILFS};

/// Where mount(8), fsck(8) and mkfs(8) look for helpers.
const SBIN: &str = "/sbin";
const HELPERS: [&str; 6] = [
    "mount.fuse.cilfs",
    "mount.fuseblk.cilfs",
    "mount.cilfs",
    "fsck.cilfs",
    "fsck.fuse.cilfs",
    "mkfs.cilfs",
];

fn run(program: &str, args: &[&str]) -> Output {
    common::output(Command::new(program).args(args))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {:?}: {}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[track_caller]
fn assert_status(what: &str, out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The helpers in /sbin, installed for one test, and the links that were at their names
/// before (put back when dropped). The tests here share /sbin, /etc/fstab and user nobody's
/// view of mounts: they take turns.
struct Helpers {
    before: Vec<(PathBuf, Option<PathBuf>)>,
    _turn: MutexGuard<'static, ()>,
}

static TURN: Mutex<()> = Mutex::new(());

impl Helpers {
    /// `None` (the test skips, saying why) when a name in /sbin holds something that is not
    /// a symbolic link: someone's own helper, which the test must not replace.
    fn install() -> Option<Self> {
        assert!(
            Path::new("/dev/fuse").exists(),
            "these tests need /dev/fuse (run scripts/install-deps)"
        );
        common::keep_machine_state();
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let mut before = Vec::new();
        for n in HELPERS {
            let p = Path::new(SBIN).join(n);
            match fs::symlink_metadata(&p) {
                Ok(m) if !m.file_type().is_symlink() => {
                    eprintln!(
                        "skipped: {} is not a symbolic link (someone's own helper, left alone)",
                        p.display()
                    );
                    return None;
                }
                _ => {}
            }
            let target = fs::read_link(&p).ok();
            before.push((p, target));
        }
        let guard = Helpers {
            before,
            _turn: turn,
        };
        assert_ok("cilfs install-helpers", &cilfs(&["install-helpers"]));
        let exe = fs::canonicalize(CILFS).unwrap();
        for n in HELPERS {
            assert_eq!(fs::read_link(Path::new(SBIN).join(n)).unwrap(), exe, "{n}");
        }
        Some(guard)
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        for (p, target) in &self.before {
            // Only our own link is taken away: nothing else was there, or a link we put back.
            if fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()) {
                let _ = fs::remove_file(p);
            }
            if let Some(t) = target {
                let _ = std::os::unix::fs::symlink(t, p);
            }
        }
    }
}

/// /etc/fstab with lines added for one test; the file is written back byte for byte on drop,
/// whether the test passed or not.
struct Fstab {
    before: Vec<u8>,
}

const FSTAB: &str = "/etc/fstab";

impl Fstab {
    fn add(line: &str) -> Self {
        let before = fs::read(FSTAB).unwrap_or_default();
        let guard = Fstab {
            before: before.clone(),
        };
        let mut now = before;
        if !now.is_empty() && !now.ends_with(b"\n") {
            now.push(b'\n');
        }
        now.extend_from_slice(line.as_bytes());
        now.push(b'\n');
        fs::write(FSTAB, now).unwrap();
        guard
    }
}

impl Drop for Fstab {
    fn drop(&mut self) {
        fs::write(FSTAB, &self.before).unwrap();
    }
}

/// An image and a mount point in a directory every user can traverse (user nobody runs
/// programs from the mount).
struct Fixture {
    tmp: tempfile::TempDir,
    img: PathBuf,
    dir: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let img = tmp.path().join("fs.img");
        let dir = tmp.path().join("mnt");
        fs::create_dir(&dir).unwrap();
        assert_ok("mkfs", &cilfs(&["mkfs", "-q", "--size", "64M", s(&img)]));
        Fixture { tmp, img, dir }
    }

    /// `mount -t fuse.cilfs IMG DIR [-o OPTS]`.
    fn mount(&self, opts: &str) -> Output {
        let mut args = vec!["-t", "fuse.cilfs", s(&self.img), s(&self.dir)];
        if !opts.is_empty() {
            args.extend(["-o", opts]);
        }
        run("mount", &args)
    }

    fn mount_options(&self) -> Vec<String> {
        let out = run("findmnt", &["-no", "OPTIONS", s(&self.dir)]);
        assert_ok("findmnt", &out);
        text(&out.stdout)
            .trim()
            .split(',')
            .map(str::to_string)
            .collect()
    }

    /// The mount's type and the image behind it: its source, or the file behind the loop
    /// device that is its source.
    fn mounted(&self) -> (String, PathBuf) {
        let out = run("findmnt", &["-no", "FSTYPE,SOURCE", s(&self.dir)]);
        assert_ok("findmnt", &out);
        let shown = text(&out.stdout);
        let (fstype, source) = shown.trim().split_once(' ').unwrap();
        let image = match source.strip_prefix("/dev/") {
            Some(dev) if dev.starts_with("loop") => {
                let back = fs::read_to_string(format!("/sys/block/{dev}/loop/backing_file"));
                PathBuf::from(back.unwrap().trim_end())
            }
            _ => PathBuf::from(source),
        };
        (fstype.to_string(), image)
    }

    fn is_mounted(&self) -> bool {
        run("findmnt", &[s(&self.dir)]).status.success()
    }

    fn unmount(&self) {
        assert_ok("cilfs unmount", &cilfs(&["unmount", s(&self.dir)]));
        assert_ok("check", &cilfs(&["check", s(&self.img)]));
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.is_mounted() {
            let _ = cilfs(&["unmount", s(&self.dir)]);
        }
    }
}

/// With `noloop` sync(2) does not reach cilfs; the helper still prints nothing (scripts such
/// as xfstests compare what mount prints), and the note goes to the daemon's log.
#[test]
fn the_mount_helper_is_silent_about_sync_on_a_noloop_mount() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let f = Fixture::new();
    let out = f.mount("noloop");
    assert_ok("mount -t fuse.cilfs -o noloop", &out);
    assert_eq!(text(&out.stdout), "");
    assert_eq!(text(&out.stderr), "");
    assert_ok("umount", &run("umount", &[s(&f.dir)]));
}

/// On the mount at `f`: file `name` written with its name and fsynced, the filesystem shut
/// down with its log flushed (`xfs_io -x -c 'shutdown -f'`), and unmounted. The file's path.
fn write_fsync_and_shut_down(f: &Fixture, name: &str) -> std::path::PathBuf {
    let p = f.dir.join(name);
    fs::write(&p, name).unwrap();
    fs::File::open(&p).unwrap().sync_all().unwrap();
    let out = run("xfs_io", &["-x", "-c", "shutdown -f", s(&f.dir)]);
    assert_ok("xfs_io shutdown", &out);
    assert_ok("umount", &run("umount", &[s(&f.dir)]));
    p
}

/// A mount after a shutdown replays the log: the helper still prints nothing (xfstests
/// compares the output of every mount after its shutdowns; XFS says it in the kernel log),
/// while `cilfs mount` says it. What was fsynced before the shutdown is there.
#[test]
fn the_mount_helper_is_silent_about_a_replayed_log() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let f = Fixture::new();
    assert_ok("mount", &f.mount(""));
    write_fsync_and_shut_down(&f, "one");
    let out = f.mount("");
    assert_ok("mount after the shutdown", &out);
    assert_eq!(text(&out.stdout), "");
    assert_eq!(text(&out.stderr), "");
    assert_eq!(fs::read(f.dir.join("one")).unwrap(), b"one");
    write_fsync_and_shut_down(&f, "two");
    let out = cilfs(&["mount", s(&f.img), s(&f.dir)]);
    assert_ok("cilfs mount after the shutdown", &out);
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(said.contains("recovered the log"), "{said}");
    assert_eq!(fs::read(f.dir.join("two")).unwrap(), b"two");
    f.unmount();
}

/// A read-only mount of an image whose log needs replaying (after a shutdown) replays it
/// first, as XFS does where the device can be written, through the loop device or not; the
/// file fsynced before the shutdown is there and the image is left clean.
#[test]
fn a_read_only_mount_after_a_shutdown_replays_the_log_first() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let f = Fixture::new();
    for (name, opts) in [("loop", ""), ("plain", "noloop")] {
        assert_ok("mount", &f.mount(opts));
        let p = write_fsync_and_shut_down(&f, name);
        let ro = if opts.is_empty() {
            "ro".to_string()
        } else {
            format!("ro,{opts}")
        };
        let out = f.mount(&ro);
        assert_ok("mount -o ro after the shutdown", &out);
        assert_eq!(text(&out.stderr), "");
        assert!(f.mount_options().contains(&"ro".to_string()));
        assert_eq!(fs::read(&p).unwrap(), name.as_bytes());
        f.unmount();
    }
}

#[test]
fn mount_t_fuse_cilfs_puts_nosuid_nodev_noexec_in_the_kernels_mount_flags() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let f = Fixture::new();
    let out = f.mount("nosuid,nodev,noexec");
    assert_ok("mount -t fuse.cilfs -o nosuid,nodev,noexec", &out);
    // A mount helper is silent when all went well.
    assert_eq!(text(&out.stdout), "");
    let opts = f.mount_options();
    for flag in ["nosuid", "nodev", "noexec", "rw", "default_permissions"] {
        assert!(opts.iter().any(|o| o == flag), "{flag} not in {opts:?}");
    }
    // nodev: a device file on the mount cannot be opened, even by root.
    let null = f.dir.join("null");
    rustix::fs::mknodat(
        CWD,
        &null,
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
    let e = fs::File::open(&null).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    f.unmount();

    // `-t cilfs` (mount.cilfs) with no options: mount(8)'s defaults, suid, dev and exec.
    assert_ok(
        "mount -t cilfs",
        &run("mount", &["-t", "cilfs", s(&f.img), s(&f.dir)]),
    );
    let opts = f.mount_options();
    for flag in ["nosuid", "nodev", "noexec", "ro"] {
        assert!(!opts.iter().any(|o| o == flag), "{flag} in {opts:?}");
    }
    fs::File::open(&null).unwrap();
    f.unmount();

    // `ro` reaches the kernel too.
    assert_ok("mount -o ro", &f.mount("ro"));
    assert!(f.mount_options().iter().any(|o| o == "ro"));
    let e = fs::write(f.dir.join("x"), b"x").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ReadOnlyFilesystem, "{e}");
    f.unmount();

    // A bad option is a wrong invocation (mount(8)'s 1), on one line, and mounts nothing; an
    // image that is not there is a failed mount (32).
    let out = f.mount("nosiud");
    assert_status("mount -o nosiud", &out, 1);
    assert!(text(&out.stderr).contains("unknown mount option 'nosiud'"));
    assert_eq!(text(&out.stderr).trim_end().lines().count(), 1);
    assert!(!f.is_mounted());
    let out = run(
        "mount",
        &[
            "-t",
            "fuse.cilfs",
            s(&f.tmp.path().join("none.img")),
            s(&f.dir),
        ],
    );
    assert_status("mount of a missing image", &out, 32);
    assert!(!f.is_mounted());
    // -f (fake) checks the options and mounts nothing.
    let out = run(
        "/sbin/mount.fuse.cilfs",
        &[s(&f.img), s(&f.dir), "-f", "-o", "rw,nosuid"],
    );
    assert_ok("mount.fuse.cilfs -f", &out);
    assert!(!f.is_mounted());
}

#[test]
fn an_fstab_line_mounts_with_mount_dir_and_umount_leaves_the_image_clean() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let f = Fixture::new();
    // Options fstab lines carry for mount(8) and systemd, next to the filesystem's own.
    let line = format!(
        "{} {} fuse.cilfs defaults,nosuid,nodev,noauto,nofail,_netdev,default_permissions,\
         x-systemd.automount,x-systemd.device-timeout=10s,comment=cilfs-test,logbufs=4 0 0",
        s(&f.img),
        s(&f.dir)
    );
    let fstab = Fstab::add(&line);
    assert_ok("mount DIR", &run("mount", &[s(&f.dir)]));
    let opts = f.mount_options();
    for flag in ["nosuid", "nodev", "rw"] {
        assert!(opts.iter().any(|o| o == flag), "{flag} not in {opts:?}");
    }
    // As root the image goes through a loop device, as mount(8) does for a regular file.
    let (fstype, image) = f.mounted();
    assert_eq!(fstype, "fuseblk.cilfs");
    assert_eq!(image, fs::canonicalize(&f.img).unwrap());
    fs::create_dir(f.dir.join("d")).unwrap();
    fs::write(f.dir.join("d/file"), b"written through an fstab mount").unwrap();
    // umount(8) ends the session; the daemon then writes everything back and lets go of the
    // image's lock, which is what this waits for.
    assert_ok("umount DIR", &run("umount", &[s(&f.dir)]));
    let lock = fs::File::open(&f.img).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    drop(lock);
    assert_ok("check", &cilfs(&["check", s(&f.img)]));
    let info = text(&cilfs(&["info", s(&f.img)]).stdout);
    assert!(info.contains("state          clean"), "{info}");
    // The source alone finds the line too.
    assert_ok("mount IMG", &run("mount", &[s(&f.img)]));
    assert_eq!(
        fs::read(f.dir.join("d/file")).unwrap(),
        b"written through an fstab mount"
    );
    f.unmount();
    let before = fstab.before.clone();
    drop(fstab);
    assert_eq!(fs::read(FSTAB).unwrap_or_default(), before);
}

/// Runs `program` (on the mount) as user nobody, with no groups, and returns its output.
fn as_nobody(program: &Path, args: &[&str]) -> Output {
    let mut all = vec![s(program)];
    all.extend(args);
    as_user(65534, 65534, &all)
}

#[test]
fn a_set_user_id_root_program_runs_as_root_only_without_nosuid() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let f = Fixture::new();
    // allow_other: nobody must reach the mount at all.
    assert_ok(
        "mount -o allow_other,nosuid",
        &f.mount("allow_other,nosuid"),
    );
    let id = f.dir.join("id");
    fs::copy("/usr/bin/id", &id).unwrap();
    fs::set_permissions(&id, fs::Permissions::from_mode(0o4755)).unwrap();
    let out = as_nobody(&id, &["-u"]);
    assert_ok("id as nobody", &out);
    assert_eq!(text(&out.stdout).trim(), "65534", "nosuid: not root");
    f.unmount();

    assert_ok("mount -o allow_other", &f.mount("allow_other"));
    assert_eq!(
        fs::metadata(&id).unwrap().permissions().mode() & 0o7777,
        0o4755
    );
    let out = as_nobody(&id, &["-u"]);
    assert_ok("id as nobody", &out);
    assert_eq!(text(&out.stdout).trim(), "0", "suid: the owner's uid");
    f.unmount();

    // noexec: not even root runs it.
    assert_ok("mount -o noexec", &f.mount("allow_other,noexec"));
    let e = Command::new(&id).output().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    f.unmount();
}

#[test]
fn fsck_cilfs_and_mkfs_cilfs_keep_their_tools_exit_statuses() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    // mkfs(8) runs mkfs.cilfs; the size after the device is in blocks.
    let out = run("mkfs", &["-t", "cilfs", "-q", s(&img), "8192"]);
    assert_ok("mkfs -t cilfs", &out);
    let info = text(&cilfs(&["info", s(&img)]).stdout);
    assert!(
        info.contains("data           8192 blocks (32.0 MiB)"),
        "{info}"
    );
    // mkfs(8)'s failure status is 1: a target with a filesystem needs -f.
    let out = run("/sbin/mkfs.cilfs", &[s(&img)]);
    assert_status("mkfs.cilfs over a filesystem", &out, 1);
    assert!(text(&out.stderr).contains("contains data"));
    let out = run(
        "/sbin/mkfs.cilfs",
        &["-f", "-q", "-b", "size=2048", "-d", "size=48M", s(&img)],
    );
    assert_ok("mkfs.cilfs -f -b size=2048 -d size=48M", &out);
    let info = text(&cilfs(&["info", s(&img)]).stdout);
    assert!(info.contains("block size     2048 bytes"), "{info}");
    assert!(info.contains("data           24576 blocks"), "{info}");
    assert_status(
        "mkfs.cilfs -Z",
        &run("/sbin/mkfs.cilfs", &["-Z", s(&img)]),
        1,
    );

    // fsck: 0 clean, with every flag fsck(8) passes.
    for flags in [
        &[][..],
        &["-a"],
        &["-p"],
        &["-n"],
        &["-y"],
        &["-f", "-y"],
        &["-fn"],
    ] {
        let mut args = flags.to_vec();
        args.push(s(&img));
        assert_ok(
            &format!("fsck.cilfs {flags:?}"),
            &run("/sbin/fsck.cilfs", &args),
        );
    }
    assert_ok("fsck -t cilfs", &run("fsck", &["-t", "cilfs", s(&img)]));
    // 4: errors left uncorrected when only checked (no flag, -n).
    miscount_inodes(&img);
    for flags in [&["-n"][..], &[]] {
        let mut args = flags.to_vec();
        args.push(s(&img));
        let out = run("/sbin/fsck.cilfs", &args);
        assert_status(&format!("fsck.cilfs {flags:?} on a damaged image"), &out, 4);
        assert!(text(&out.stdout).contains("header counts 2 inodes, the tree holds 1"));
        assert!(text(&out.stderr).contains("errors left uncorrected"));
        assert_eq!(text(&out.stderr).trim_end().lines().count(), 1);
    }
    assert_status("fsck -t cilfs", &run("fsck", &["-t", "cilfs", s(&img)]), 4);
    // 1: corrected, by the repair -a, -p and -y run.
    for flag in ["-a", "-p", "-y"] {
        let out = run("/sbin/fsck.cilfs", &[flag, s(&img)]);
        assert_status(&format!("fsck.cilfs {flag} on a damaged image"), &out, 1);
        assert!(text(&out.stdout).contains("header: inode count 2 -> 1"));
        assert!(text(&out.stderr).contains("errors corrected"));
        assert_ok(
            &format!("fsck.cilfs -n after {flag}"),
            &run("/sbin/fsck.cilfs", &["-n", s(&img)]),
        );
        miscount_inodes(&img);
    }
    // 8: could not check; 16: usage.
    let missing = tmp.path().join("none.img");
    assert_status(
        "fsck.cilfs of nothing",
        &run("/sbin/fsck.cilfs", &[s(&missing)]),
        8,
    );
    assert_status(
        "fsck.cilfs -Z",
        &run("/sbin/fsck.cilfs", &["-Z", s(&img)]),
        16,
    );
    assert_status("fsck.cilfs", &run("/sbin/fsck.cilfs", &[]), 16);
}

#[test]
fn install_helpers_leaves_a_file_that_is_not_a_link_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let mine = tmp.path().join("mkfs.cilfs");
    fs::write(&mine, b"#!/bin/sh\n# someone's own\n").unwrap();
    let out = cilfs(&["install-helpers", "--dir", s(tmp.path())]);
    assert_status("install-helpers over a file", &out, 2);
    assert!(text(&out.stderr).contains("is not a symbolic link"));
    // Nothing was changed, the other names included.
    assert_eq!(fs::read(&mine).unwrap(), b"#!/bin/sh\n# someone's own\n");
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    // Links (from an earlier install) are replaced; --force replaces the file too.
    assert_ok(
        "install-helpers --force",
        &cilfs(&["install-helpers", "--force", "--dir", s(tmp.path())]),
    );
    assert_ok(
        "install-helpers again",
        &cilfs(&["install-helpers", "--dir", s(tmp.path())]),
    );
    let exe = fs::canonicalize(CILFS).unwrap();
    for n in HELPERS {
        assert_eq!(fs::read_link(tmp.path().join(n)).unwrap(), exe);
    }
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), HELPERS.len());
}

/// umount(8) returns once the daemon has made the image clean and let go of it (a fuseblk
/// mount's unmount waits for the daemon's answer to DESTROY, which comes after the unmount
/// record): fsck right after it finds the image free and clean, and so does a mount right
/// after it, every time.
#[test]
fn umount_then_fsck_and_umount_then_mount_succeed_every_time() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let f = Fixture::new();
    let line = format!("{} {} cilfs noauto 0 0", s(&f.img), s(&f.dir));
    let _fstab = Fstab::add(&line);
    assert_ok("mount DIR", &run("mount", &[s(&f.dir)]));
    for i in 0..20 {
        fs::write(f.dir.join(format!("a{i}")), format!("round {i}")).unwrap();
        assert_ok(&format!("umount DIR ({i})"), &run("umount", &[s(&f.dir)]));
        assert_ok(
            &format!("fsck -t cilfs IMG right after umount ({i})"),
            &run("fsck", &["-t", "cilfs", s(&f.img)]),
        );
        assert_ok(&format!("mount DIR ({i})"), &run("mount", &[s(&f.dir)]));
    }
    for i in 0..20 {
        fs::write(f.dir.join(format!("b{i}")), format!("round {i}")).unwrap();
        assert_ok(&format!("umount DIR ({i})"), &run("umount", &[s(&f.dir)]));
        assert_ok(
            &format!("mount DIR right after umount ({i})"),
            &run("mount", &[s(&f.dir)]),
        );
    }
    for i in 0..20 {
        for p in ["a", "b"] {
            assert_eq!(
                fs::read_to_string(f.dir.join(format!("{p}{i}"))).unwrap(),
                format!("round {i}")
            );
        }
    }
    f.unmount();
}

/// `mount -o remount,ro DIR` goes through the helper: the kernel's flag changes, writes fail
/// with EROFS, the daemon has written everything back and left the image clean and writes
/// nothing more; `remount,rw` writes again, and other flags change alone. An option the
/// mount cannot change is refused with its name.
#[test]
fn mount_o_remount_switches_ro_and_rw_and_flags() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let f = Fixture::new();
    assert_ok(
        "mount -t cilfs",
        &run("mount", &["-t", "cilfs", s(&f.img), s(&f.dir)]),
    );
    fs::create_dir(f.dir.join("d")).unwrap();
    fs::write(f.dir.join("d/f"), b"before the remount").unwrap();
    assert_ok(
        "mount -o remount,ro",
        &run("mount", &["-o", "remount,ro", s(&f.dir)]),
    );
    assert!(f.mount_options().iter().any(|o| o == "ro"));
    let e = fs::write(f.dir.join("d/g"), b"x").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ReadOnlyFilesystem, "{e}");
    let info = text(&cilfs(&["info", s(&f.img)]).stdout);
    assert!(info.contains("state          clean"), "{info}");
    // Nothing more is written: reads, a sync and a while of the daemon's own rounds leave the
    // image as it was.
    let before = common::sha1(&f.img);
    assert_eq!(fs::read(f.dir.join("d/f")).unwrap(), b"before the remount");
    assert_ok("sync", &run("sync", &[]));
    assert_eq!(common::sha1(&f.img), before);

    assert_ok(
        "mount -o remount,rw",
        &run("mount", &["-o", "remount,rw", s(&f.dir)]),
    );
    assert!(f.mount_options().iter().any(|o| o == "rw"));
    fs::write(f.dir.join("d/g"), b"after the remount").unwrap();
    let info = text(&cilfs(&["info", s(&f.img)]).stdout);
    assert!(info.contains("needs recovery"), "in use again: {info}");

    assert_ok(
        "mount -o remount,noexec,nosuid",
        &run("mount", &["-o", "remount,noexec,nosuid", s(&f.dir)]),
    );
    let opts = f.mount_options();
    for flag in ["rw", "noexec", "nosuid"] {
        assert!(opts.iter().any(|o| o == flag), "{flag} not in {opts:?}");
    }
    let out = run("mount", &["-o", "remount,logbufs=4", s(&f.dir)]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("logbufs=4"),
        "{}",
        text(&out.stderr)
    );
    f.unmount();
    // A mount made read-only has no writable devices: it is not switched to read-write.
    assert_ok("mount -o ro", &f.mount("ro"));
    let out = run("mount", &["-o", "remount,rw", s(&f.dir)]);
    assert!(!out.status.success(), "remount,rw of a ro mount");
    assert!(
        text(&out.stderr).contains("read-only"),
        "{}",
        text(&out.stderr)
    );
    assert!(f.mount_options().iter().any(|o| o == "ro"));
    f.unmount();
    assert_eq!(fs::read(f.dir.join("d/g")).ok(), None, "unmounted");
}

/// A second `mount -t fuse.cilfs` of a mounted image mounts the same filesystem there too, as
/// a kernel filesystem's second mount of its device does (xfstests' generic/732): renames
/// through one show through the other, unmounting the first leaves the second working, and the
/// image is let go, clean, when the last is unmounted.
#[test]
fn a_second_mount_of_a_mounted_image_shares_its_filesystem() {
    let Some(_h) = Helpers::install() else {
        return;
    };
    let f = Fixture::new();
    let second = f.tmp.path().join("second");
    fs::create_dir(&second).unwrap();
    assert_ok("mount", &f.mount(""));
    assert_ok(
        "second mount",
        &run("mount", &["-t", "fuse.cilfs", s(&f.img), s(&second)]),
    );
    fs::create_dir(f.dir.join("A")).unwrap();
    fs::create_dir(f.dir.join("B")).unwrap();
    fs::write(f.dir.join("A/f"), b"one file, two mounts").unwrap();
    fs::rename(f.dir.join("A/f"), f.dir.join("B/f")).unwrap();
    assert_eq!(
        fs::read(second.join("B/f")).unwrap(),
        b"one file, two mounts"
    );
    fs::rename(second.join("B/f"), second.join("A/f")).unwrap();
    assert!(f.dir.join("A/f").exists() && !f.dir.join("B/f").exists());
    // The first mount goes; the second still serves, and then lets the image go.
    let out = cilfs(&["unmount", s(&f.dir)]);
    assert_ok("unmount the first", &out);
    assert!(
        text(&out.stdout).contains("stays mounted at"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        fs::read(second.join("A/f")).unwrap(),
        b"one file, two mounts"
    );
    fs::write(second.join("later"), b"after the first went").unwrap();
    assert_ok("umount the second", &run("umount", &[s(&second)]));
    let lock = fs::File::open(&f.img).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    drop(lock);
    assert_ok("check", &cilfs(&["check", s(&f.img)]));
    assert_ok("mount again", &f.mount(""));
    assert_eq!(
        fs::read(f.dir.join("later")).unwrap(),
        b"after the first went"
    );
    f.unmount();
}
