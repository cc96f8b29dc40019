//! Mount tests of the FUSE transport that the shared suites do not cover: what the mount table
//! shows, sync(2) reaching cilfs, a user's mount through fusermount3 and the fallback from
//! io_uring queues to /dev/fuse reads. Most mounts here name `transport=native`, which stays
//! accepted for fstab lines that say it. The shared suites (mount.rs, mount_daemon.rs) run
//! over /dev/fuse reads and io_uring queues with CILFS_TEST_TRANSPORT=native and uring
//! (scripts/test does). Needs root, /dev/fuse, and for the sync test a loop device.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{cilfs, in_open_fuse_namespace, kill_daemon_matching, nobodys_base, s};

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn findmnt(dir: &Path, columns: &str) -> String {
    ok(
        Command::new("findmnt")
            .args(["-no", columns, s(dir)])
            .output()
            .unwrap(),
        "findmnt",
    )
    .trim()
    .to_string()
}

/// SIGKILLs the daemon serving `source` (no unmount record, nothing written back) and takes
/// its dead mount away.
fn kill_daemon(source: &Path, dir: &Path) {
    kill_daemon_matching(
        &format!("mount {} {} ", source.display(), dir.display()),
        dir,
    );
}

/// Writes twenty files under `dir` (names starting with `prefix`), calls sync(2) (not fsync),
/// SIGKILLs the daemon serving `kill_source` (nothing written back, no log forced), remounts
/// `source` and finds every file with its data; then unmounts and checks `source`.
fn synced_files_survive_sigkill(dir: &Path, prefix: &str, kill_source: &Path, source: &Path) {
    let files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            (
                format!("{prefix}f{i}"),
                format!("synced file {i}\n").repeat(i + 1).into_bytes(),
            )
        })
        .collect();
    for (name, data) in &files {
        fs::write(dir.join(name), data).unwrap();
    }
    rustix::fs::sync();
    kill_daemon(kill_source, dir);
    ok(
        cilfs(&["mount", s(source), s(dir), "-o", "transport=native"]),
        "remount",
    );
    for (name, data) in &files {
        assert_eq!(&fs::read(dir.join(name)).unwrap(), data, "{name}");
    }
    ok(cilfs(&["unmount", s(dir)]), "unmount");
    ok(cilfs(&["check", s(source)]), "check");
}

/// The tests that set the kernel's io_uring switch take turns: one turning it off for a
/// moment must not meet another's `uring=on` mount.
fn switch_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unmounts `dir` when dropped, so that a failed assertion leaves no mount and no daemon
/// behind (nothing to do, and nothing said, if it is unmounted already).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = cilfs(&["unmount", s(&self.0)]);
    }
}

#[test]
fn the_mount_table_shows_fuse_cilfs_the_image_and_the_flags_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let (img, dir) = (tmp.path().join("fs.img"), tmp.path().join("mnt"));
    fs::create_dir(&dir).unwrap();
    ok(cilfs(&["mkfs", "-q", "--size", "64M", s(&img)]), "mkfs");
    // noloop: the image file itself is the source, and the mount is plain fuse, which sync(2)
    // does not reach: the mount says so.
    let opts = "transport=native,nosuid,nodev,noexec,noatime,noloop";
    let out = cilfs(&["mount", s(&img), s(&dir), "-o", opts]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "mount");
    assert_eq!(
        said.matches("sync(2) and syncfs(2) do not reach cilfs")
            .count(),
        1,
        "{said}"
    );
    let _unmount = Unmount(dir.clone());
    let img = fs::canonicalize(&img).unwrap();
    assert_eq!(
        findmnt(&dir, "FSTYPE,SOURCE"),
        format!("fuse.cilfs {}", img.display())
    );
    let o = findmnt(&dir, "OPTIONS");
    for want in [
        "rw",
        "nosuid",
        "nodev",
        "noexec",
        "noatime",
        "default_permissions",
    ] {
        assert!(o.split(',').any(|x| x == want), "{want} missing: {o}");
    }
    fs::write(dir.join("f"), b"through /dev/fuse").unwrap();
    assert_eq!(fs::read(dir.join("f")).unwrap(), b"through /dev/fuse");
    ok(cilfs(&["unmount", s(&dir)]), "unmount");
    ok(cilfs(&["check", s(&img)]), "check");
    // Read-only, and without the flags: the defaults are mount(8)'s.
    ok(
        cilfs(&[
            "mount",
            s(&img),
            s(&dir),
            "-o",
            "transport=native,ro,noloop",
        ]),
        "mount ro",
    );
    let o = findmnt(&dir, "OPTIONS");
    assert!(o.starts_with("ro,"), "{o}");
    assert!(!o.contains("nosuid") && !o.contains("noexec"), "{o}");
    assert_eq!(fs::read(dir.join("f")).unwrap(), b"through /dev/fuse");
    ok(cilfs(&["unmount", s(&dir)]), "unmount");
}

/// A loop device over an image file, detached when dropped.
struct Loop(PathBuf);

impl Loop {
    fn attach(file: &Path) -> Loop {
        let out = ok(
            Command::new("losetup")
                .args(["-f", "--show", s(file)])
                .output()
                .unwrap(),
            "losetup (the sync test needs a loop device)",
        );
        Loop(PathBuf::from(out.trim()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", s(&self.0)]).status();
    }
}

/// sync(2), not fsync, makes files durable: written, synced, the daemon killed with SIGKILL
/// (nothing written back, no log forced), and after the remount's recovery they are there
/// with their data. Linux passes sync(2) on to a /dev/fuse server (FUSE_SYNCFS) only on a
/// fuseblk mount (6.18; virtiofs too), so the image is a block device here, which the native
/// transport mounts as fuseblk.cilfs; on an image file the kernel sends nothing to answer.
#[test]
fn sync_reaches_cilfs_on_a_block_device_and_survives_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let (file, dir) = (tmp.path().join("disk"), tmp.path().join("mnt"));
    fs::create_dir(&dir).unwrap();
    fs::File::create(&file).unwrap().set_len(128 << 20).unwrap();
    let dev = Loop::attach(&file);
    ok(cilfs(&["mkfs", "-q", s(&dev.0)]), "mkfs");
    ok(
        cilfs(&["mount", s(&dev.0), s(&dir), "-o", "transport=native"]),
        "mount",
    );
    // Dropped before the loop device: the mount goes first.
    let _unmount = Unmount(dir.clone());
    assert_eq!(
        findmnt(&dir, "FSTYPE,SOURCE"),
        format!("fuseblk.cilfs {}", dev.0.display())
    );
    fs::create_dir(dir.join("d")).unwrap();
    synced_files_survive_sigkill(&dir, "d/", &dev.0, &dev.0);
}

/// An image file mounted with `-o loop` (as mount(8) mounts one): the mount is fuseblk.cilfs
/// on the loop device, so sync(2) reaches cilfs as on a block device, and files synced before
/// a SIGKILL of the daemon are there after the remount. A second mount of the image, loop or
/// not, shares the first's filesystem, and a check through another loop device is refused.
#[test]
fn an_image_file_mounted_with_loop_passes_sync_on_and_survives_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let (img, dir, dir2) = (
        tmp.path().join("fs.img"),
        tmp.path().join("mnt"),
        tmp.path().join("mnt2"),
    );
    fs::create_dir(&dir).unwrap();
    fs::create_dir(&dir2).unwrap();
    ok(cilfs(&["mkfs", "-q", "--size", "128M", s(&img)]), "mkfs");
    ok(
        cilfs(&["mount", s(&img), s(&dir), "-o", "loop,transport=native"]),
        "mount",
    );
    let _unmount = Unmount(dir.clone());
    let shown = findmnt(&dir, "FSTYPE,SOURCE");
    let (fstype, source) = shown.split_once(' ').unwrap();
    assert_eq!(fstype, "fuseblk.cilfs", "{shown}");
    assert!(source.starts_with("/dev/loop"), "{shown}");
    // A second mount of the image, through the loop device's file, is the first mount's
    // filesystem on a second directory (a bind mount): never a second daemon on the image.
    for opts in ["loop,transport=native", "transport=native"] {
        ok(cilfs(&["mount", s(&img), s(&dir2), "-o", opts]), opts);
        fs::write(dir.join("both"), opts).unwrap();
        assert_eq!(fs::read_to_string(dir2.join("both")).unwrap(), opts);
        let o = cilfs(&["unmount", s(&dir2)]);
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("stays mounted at"),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    // The image behind a second loop device is the same image: a tool refuses it too.
    {
        let second = Loop::attach(&img);
        let o = cilfs(&["check", s(&second.0)]);
        assert!(
            !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("is mounted"),
            "check through a second loop device: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // The daemon is named by the image it serves, not the loop device.
    synced_files_survive_sigkill(&dir, "", &img, &img);
}

/// A user's own mount over the native transport: fusermount3 mounts and passes /dev/fuse
/// back, the user writes and unmounts. In a private mount namespace with a 0666 /dev/fuse node
/// bound over the real one, since some containers keep /dev/fuse closed to users.
#[test]
fn a_users_native_mount_goes_through_fusermount3() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let (img, dir, as_nobody) = nobodys_base(base);
    let bin = env!("CARGO_BIN_EXE_cilfs");
    let script = format!(
        "{as_nobody} {bin} mkfs -q --size 64M {img}\n\
         trap '{as_nobody} {bin} unmount {dir} >/dev/null 2>&1 || true' EXIT\n\
         {as_nobody} {bin} mount {img} {dir} -o transport=native\n\
         findmnt -no FSTYPE,SOURCE,OPTIONS {dir}\n\
         {as_nobody} sh -c 'echo by-nobody > {dir}/f && cat {dir}/f && stat -c %u {dir}/f'\n\
         {as_nobody} {bin} unmount {dir}\n\
         findmnt {dir} >/dev/null && echo still-mounted || true\n",
        img = img.display(),
        dir = dir.display()
    );
    let (ran, o, e) = in_open_fuse_namespace(&base.join("fuse"), &script);
    assert!(ran, "{o}{e}");
    // fusermount3 makes plain fuse mounts, which sync(2) does not reach: said once.
    assert_eq!(
        e.matches("sync(2) and syncfs(2) do not reach cilfs")
            .count(),
        1,
        "{e}"
    );
    assert!(e.contains("fusermount3"), "{e}");
    assert!(
        o.contains(&format!("fuse.cilfs {}", img.display())) && o.contains("user_id=65534"),
        "{o}"
    );
    // fusermount3 adds nosuid and nodev to a user's mount whatever was asked.
    assert!(o.contains("nosuid") && o.contains("nodev"), "{o}");
    assert!(o.contains("by-nobody\n65534\n"), "{o}");
    assert!(
        o.contains(&format!(
            "unmounted {}; {} is clean",
            dir.display(),
            img.display()
        )),
        "{o}"
    );
    assert!(!o.contains("still-mounted"), "{o}");
    ok(cilfs(&["check", s(&img)]), "check");
}

/// Where the kernel has FUSE over io_uring, a native mount whose queues cannot all register
/// serves over /dev/fuse reads, whichever way the queues failed: refused by the kernel (a
/// payload buffer too small: the kernel turns the ring off itself) or before registering (the
/// session must turn it off, or the kernel would hold every request back for a ring that is
/// never ready). With uring=on the same failure ends the daemon instead.
#[test]
fn native_mounts_fall_back_to_dev_fuse_when_the_queues_cannot_register() {
    let switch = Path::new("/sys/module/fuse/parameters/enable_uring");
    if !switch.exists() {
        eprintln!("skipped: this kernel has no FUSE over io_uring");
        return;
    }
    let _turn = switch_turn();
    common::keep_machine_state();
    fs::write(switch, "Y").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (img, dir) = (tmp.path().join("fs.img"), tmp.path().join("mnt"));
    fs::create_dir(&dir).unwrap();
    ok(cilfs(&["mkfs", "-q", "--size", "64M", s(&img)]), "mkfs");
    let stat = |dir: &Path| -> serde_json::Value {
        let out = ok(cilfs(&["stat", "--json", s(dir)]), "stat");
        serde_json::from_str(&out).unwrap()
    };
    let mount = |fault: &str, opts: &str| {
        Command::new(common::CILFS)
            .env("CILFS_TEST_URING_FAULT", fault)
            .args(["mount", s(&img), s(&dir), "-o", opts])
            .output()
            .unwrap()
    };
    for fault in ["register", "setup", "none"] {
        ok(mount(fault, "transport=native"), "mount");
        let _unmount = Unmount(dir.clone());
        fs::write(dir.join(fault), fault).unwrap();
        assert_eq!(fs::read(dir.join(fault)).unwrap(), fault.as_bytes());
        let v = stat(&dir);
        assert_eq!(
            v["transport_uring"],
            u64::from(fault == "none"),
            "{fault}: {v}"
        );
        ok(cilfs(&["unmount", s(&dir)]), "unmount");
    }
    // uring=on: the mount was made before the queues could fail, so the daemon ends it.
    ok(mount("setup", "transport=native,uring=on"), "mount");
    let _unmount = Unmount(dir.clone());
    let gone = (0..500).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        common::mounts_on(&dir) == 0
    });
    assert!(gone, "uring=on served after its queues failed");
    // The daemon keeps the image's lock until it has exited, a moment after its mount went.
    let pattern = format!("mount {} {} ", img.display(), dir.display());
    let exited = (0..500).any(|_| {
        common::daemon_pid(&pattern).is_none() || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            false
        }
    });
    assert!(exited, "the daemon kept running after its mount went");
    ok(cilfs(&["check", s(&img)]), "check");
}

/// The loop device behind the mount at `dir` (its source), which must be bound to `img`.
fn loop_device_of(dir: &Path, img: &Path) -> String {
    let shown = findmnt(dir, "FSTYPE,SOURCE");
    let (fstype, source) = shown.split_once(' ').unwrap();
    assert_eq!(fstype, "fuseblk.cilfs", "{shown}");
    let dev = source.strip_prefix("/dev/").unwrap().to_string();
    assert!(dev.starts_with("loop"), "{shown}");
    let back = fs::read_to_string(format!("/sys/block/{dev}/loop/backing_file")).unwrap();
    assert_eq!(Path::new(back.trim_end()), fs::canonicalize(img).unwrap());
    dev
}

/// Whether loop device `dev` is still bound to a file.
fn bound(dev: &str) -> bool {
    Path::new(&format!("/sys/block/{dev}/loop/backing_file")).exists()
}

/// Waits (bounded) for loop device `dev` to be detached, as autoclear does once the mount and
/// the daemon have let go of it.
fn assert_detached(dev: &str) {
    let gone = (0..500).any(|_| {
        !bound(dev) || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            false
        }
    });
    assert!(gone, "{dev} is still bound after its mount ended");
}

/// A mount by root with no options goes through a loop device (fuseblk.cilfs), so `sync`
/// (the command: sync(2)) and `sync -f FILE` (syncfs(2) on one file's descriptor) reach cilfs:
/// files and directories written, synced, the daemon SIGKILLed (nothing written back, no log
/// forced) and its dead mount detached (`umount -l`), the remount finds every one. The loop
/// device goes away with the mount, killed daemon or not, and ps names the daemon by the
/// image.
#[test]
fn a_default_mount_as_root_goes_through_a_loop_device_and_sync_makes_files_durable() {
    let tmp = tempfile::tempdir().unwrap();
    let (img, dir) = (tmp.path().join("fs.img"), tmp.path().join("mnt"));
    fs::create_dir(&dir).unwrap();
    ok(cilfs(&["mkfs", "-q", "--size", "128M", s(&img)]), "mkfs");
    let pattern = format!("mount {} {} ", img.display(), dir.display());
    for (round, how) in [["sync"].as_slice(), &["sync", "-f"]].iter().enumerate() {
        let out = cilfs(&["mount", s(&img), s(&dir)]);
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        ok(out, "mount");
        assert!(!said.contains("do not reach cilfs"), "{said}");
        let _unmount = Unmount(dir.clone());
        let dev = loop_device_of(&dir, &img);
        assert!(common::daemon_pid(&pattern).is_some(), "ps names the image");
        let top = dir.join(format!("r{round}"));
        fs::create_dir_all(top.join("a/b")).unwrap();
        let files: Vec<(PathBuf, Vec<u8>)> = (0..20)
            .map(|i| {
                let p = if i % 2 == 0 {
                    top.join(format!("f{i}"))
                } else {
                    top.join(format!("a/b/f{i}"))
                };
                (
                    p,
                    format!("round {round} file {i}\n")
                        .repeat(i + 1)
                        .into_bytes(),
                )
            })
            .collect();
        for (p, data) in &files {
            fs::write(p, data).unwrap();
        }
        // `sync -f FILE` syncs the filesystem FILE is on.
        let mut cmd = Command::new(how[0]);
        cmd.args(&how[1..]);
        if how.len() > 1 {
            cmd.arg(&files[0].0);
        }
        ok(cmd.output().unwrap(), &format!("{how:?}"));
        let pid = common::daemon_pid(&pattern).unwrap();
        ok(
            Command::new("kill").args(["-9", &pid]).output().unwrap(),
            "kill",
        );
        let dead = (0..500).any(|_| {
            !Path::new(&format!("/proc/{pid}")).exists() || {
                std::thread::sleep(std::time::Duration::from_millis(10));
                false
            }
        });
        assert!(dead, "the daemon died");
        ok(
            Command::new("umount")
                .args(["-l", s(&dir)])
                .output()
                .unwrap(),
            "umount -l",
        );
        assert_detached(&dev);
        ok(cilfs(&["mount", s(&img), s(&dir)]), "remount");
        for r in 0..=round {
            assert!(dir.join(format!("r{r}/a/b")).is_dir(), "r{r}/a/b");
        }
        for (p, data) in &files {
            assert_eq!(&fs::read(p).unwrap(), data, "{}", p.display());
        }
        let dev = loop_device_of(&dir, &img);
        let out = ok(cilfs(&["unmount", s(&dir)]), "unmount");
        assert!(out.contains("is clean"), "{out}");
        assert_detached(&dev);
        ok(cilfs(&["check", s(&img)]), "check");
    }
}

/// A mount point left by a killed daemon answers "Transport endpoint is not connected"; the
/// next `cilfs mount` on it takes the dead mount away (it is cilfs's, and nobody holds its
/// image) and mounts. A dead mount whose image is in use by another mount is explained.
#[test]
fn a_dead_mount_point_is_taken_away_by_the_next_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let (img, dir) = (tmp.path().join("fs.img"), tmp.path().join("mnt"));
    fs::create_dir(&dir).unwrap();
    ok(cilfs(&["mkfs", "-q", "--size", "64M", s(&img)]), "mkfs");
    let pattern = format!("mount {} {} ", img.display(), dir.display());
    ok(cilfs(&["mount", s(&img), s(&dir)]), "mount");
    let _unmount = Unmount(dir.clone());
    fs::write(dir.join("f"), b"before the kill").unwrap();
    rustix::fs::sync();
    let pid = common::daemon_pid(&pattern).unwrap();
    ok(
        Command::new("kill").args(["-9", &pid]).output().unwrap(),
        "kill",
    );
    let dead = (0..500).any(|_| {
        fs::metadata(&dir).is_err_and(|e| e.raw_os_error() == Some(libc_enotconn())) || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        }
    });
    assert!(dead, "the mount point answers ENOTCONN");
    // Its image, mounted elsewhere meanwhile: the dead mount is left, and explained.
    let other = tmp.path().join("other");
    fs::create_dir(&other).unwrap();
    ok(cilfs(&["mount", s(&img), s(&other)]), "mount elsewhere");
    let out = cilfs(&["mount", s(&img), s(&dir)]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "mounted over a dead mount: {said}");
    assert!(
        said.contains(&format!("umount {}", dir.display())),
        "{said}"
    );
    assert!(said.contains("still in use"), "{said}");
    ok(cilfs(&["unmount", s(&other)]), "unmount elsewhere");
    let out = cilfs(&["mount", s(&img), s(&dir)]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "mount over the dead mount");
    assert!(said.contains("took away the dead mount"), "{said}");
    assert_eq!(common::mounts_on(&dir), 1);
    assert_eq!(fs::read(dir.join("f")).unwrap(), b"before the kill");
    ok(cilfs(&["unmount", s(&dir)]), "unmount");
}

fn libc_enotconn() -> i32 {
    rustix::io::Errno::NOTCONN.raw_os_error()
}

/// `cilfs unmount` of a mount a process keeps busy (its working directory is there) tries
/// for a while, then says busy and names the process; once it has left, the unmount goes
/// through.
#[test]
fn unmount_names_what_keeps_a_mount_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let (img, dir) = (tmp.path().join("fs.img"), tmp.path().join("mnt"));
    fs::create_dir(&dir).unwrap();
    ok(cilfs(&["mkfs", "-q", "--size", "64M", s(&img)]), "mkfs");
    ok(cilfs(&["mount", s(&img), s(&dir)]), "mount");
    let _unmount = Unmount(dir.clone());
    fs::create_dir(dir.join("sub")).unwrap();
    let mut holder = Command::new("sleep")
        .arg("600")
        .current_dir(dir.join("sub"))
        .spawn()
        .unwrap();
    // Not through common::output, which would try again itself.
    let out = Command::new(common::CILFS)
        .args(["unmount", s(&dir)])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(!out.status.success(), "unmounted while busy: {said}");
    assert!(said.contains("busy"), "{said}");
    assert!(
        said.contains(&format!("pid {} (sleep): working directory", holder.id())),
        "{said}"
    );
    let out = ok(cilfs(&["unmount", s(&dir)]), "unmount");
    assert!(out.contains("is clean"), "{out}");
}

/// As root on a kernel with FUSE over io_uring, a default mount serves through the io_uring
/// queues even when the kernel's switch was off: the mount turns it on and says so in its
/// log. The switch is put back as it was.
#[test]
fn a_default_mount_as_root_turns_fuse_over_io_uring_on() {
    let switch = Path::new(common::URING_SWITCH);
    if !switch.exists() {
        eprintln!("skipped: this kernel has no FUSE over io_uring");
        return;
    }
    let _turn = switch_turn();
    common::keep_machine_state();
    let before = fs::read_to_string(switch).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (img, dir) = (tmp.path().join("fs.img"), tmp.path().join("mnt"));
    fs::create_dir(&dir).unwrap();
    ok(cilfs(&["mkfs", "-q", "--size", "64M", s(&img)]), "mkfs");
    fs::write(switch, "N").unwrap();
    let out = cilfs(&["mount", s(&img), s(&dir)]);
    let on = fs::read_to_string(switch).unwrap();
    fs::write(switch, before.trim()).unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "mount");
    let _unmount = Unmount(dir.clone());
    assert_eq!(on.trim(), "Y", "the switch after the mount");
    assert!(said.contains("turned FUSE over io_uring on"), "{said}");
    fs::write(dir.join("f"), b"through the queues").unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&ok(cilfs(&["stat", "--json", s(&dir)]), "stat")).unwrap();
    assert_eq!(v["transport_uring"], 1, "{v}");
    ok(cilfs(&["unmount", s(&dir)]), "unmount");
}
