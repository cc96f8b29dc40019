//! Idmapped mounts of a cilfs mount (FUSE_ALLOW_IDMAP): a bind mount made with open_tree,
//! given a user namespace's mapping with mount_setattr(MOUNT_ATTR_IDMAP) and attached with
//! move_mount. Files made through it by a mapped user are the mapped-back user's on disk,
//! chown and chmod through it work, a mapped user's write clears set-ID where root's keeps
//! it, and root's chattr +i and fstrim through the plain mount still work (the kernel names
//! no caller in those requests: cilfs asks the process). Needs root and /dev/fuse.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{as_user, run, s, Mounted};

/// The user namespace's mapping, uids and gids alike: on-disk id `id` appears as
/// `SHIFT + id` through the idmapped mount, for ids below 65536.
const SHIFT: u32 = 100_000;

/// `struct mount_attr` of <linux/mount.h>.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// A process sleeping in a new user namespace whose ids map `0..65536` to `SHIFT..`,
/// killed when dropped.
struct Userns(Child);

impl Userns {
    fn new() -> Userns {
        let child = Command::new("unshare")
            .args(["--user", "sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let ns = Userns(child);
        let pid = ns.0.id();
        let ours = fs::read_link("/proc/self/ns/user").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::read_link(format!("/proc/{pid}/ns/user")).ok().as_ref() == Some(&ours) {
            assert!(Instant::now() < deadline, "unshare --user did not unshare");
            std::thread::sleep(Duration::from_millis(10));
        }
        for map in ["uid_map", "gid_map"] {
            fs::write(format!("/proc/{pid}/{map}"), format!("0 {SHIFT} 65536\n")).unwrap();
        }
        ns
    }

    fn fd(&self) -> OwnedFd {
        fs::File::open(format!("/proc/{}/ns/user", self.0.id()))
            .unwrap()
            .into()
    }
}

impl Drop for Userns {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Attaches an idmapped bind mount of `src` on `dst` with the mapping of `ns`; the errno
/// mount_setattr answered if the kernel refuses to idmap this mount.
#[allow(unsafe_code)]
fn idmapped_bind(src: &Path, dst: &Path, ns: &Userns) -> Result<(), std::io::Error> {
    use rustix::fs::CWD;
    use rustix::mount::{move_mount, open_tree, MoveMountFlags, OpenTreeFlags};
    let tree = open_tree(
        CWD,
        src,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .unwrap();
    let userns = ns.fd();
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: the path is a NUL-terminated empty string, `attr` lives across the call and
    // its size is passed; the kernel only reads both.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_fd().as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    move_mount(
        tree.as_fd(),
        "",
        CWD,
        dst,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .unwrap();
    Ok(())
}

/// Detaches whatever is mounted on the path when dropped.
struct Detach<'a>(&'a Path);

impl Drop for Detach<'_> {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

fn ok(out: Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The flag letters lsattr shows for `p` (its first word).
fn lsattr(p: &Path) -> String {
    let out = run(&["lsattr", "-d", s(p)]);
    out.split_whitespace().next().unwrap_or("").to_string()
}

fn owner(p: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

#[test]
fn idmapped_mounts_map_owners_both_ways_and_root_keeps_its_ioctls() {
    common::keep_machine_state();
    // Users other than root reach the mounts (allow_other), through the temporary directory.
    let m = Mounted::new("64M", &["allow_other"]);
    fs::set_permissions(m._tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let shared = m.p("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    let mapped = m._tmp.path().join("mapped");
    fs::create_dir(&mapped).unwrap();
    let ns = Userns::new();
    if let Err(e) = idmapped_bind(&m.dir, &mapped, &ns) {
        // FUSE_ALLOW_IDMAP came with Linux 6.12: an older kernel refuses (EINVAL) whatever
        // cilfs asks; a newer one refuses only if cilfs did not take the flag.
        let release = run(&["uname", "-r"]);
        let mut v = release
            .split(|c: char| !c.is_ascii_digit())
            .map(|x| x.parse().unwrap_or(0));
        let (major, minor): (u32, u32) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        assert!(
            (major, minor) < (6, 12),
            "Linux {} refuses an idmapped mount of cilfs: mount_setattr: {e}",
            release.trim()
        );
        println!(
            "SKIPPED: Linux {} has no FUSE idmapped mounts (6.12): mount_setattr: {e}",
            release.trim()
        );
        return;
    }
    let _detach = Detach(&mapped);

    // The root directory, root's on disk, appears as SHIFT's through the idmapped mount.
    assert_eq!(owner(&mapped), (SHIFT, SHIFT));
    // A file made through it by mapped user SHIFT+1000 is user 1000's on disk.
    let via = mapped.join("shared/made");
    let (u, g) = (SHIFT + 1000, SHIFT + 1000);
    ok(as_user(u, g, &["touch", s(&via)]), "touch as a mapped user");
    ok(
        as_user(u, g, &["mkdir", s(&mapped.join("shared/dir"))]),
        "mkdir",
    );
    ok(
        as_user(u, g, &["ln", "-s", "made", s(&mapped.join("shared/link"))]),
        "symlink",
    );
    for name in ["made", "dir", "link"] {
        assert_eq!(owner(&shared.join(name)), (1000, 1000), "{name} on disk");
        assert_eq!(
            owner(&mapped.join("shared").join(name)),
            (u, g),
            "{name} mapped"
        );
    }
    // An unmapped user cannot create there (the kernel's EOVERFLOW, before cilfs).
    let out = as_user(1000, 1000, &["touch", s(&mapped.join("shared/unmapped"))]);
    assert!(!out.status.success());
    assert!(!shared.join("unmapped").exists());

    // The owner's chmod and root's chown through the idmapped mount.
    ok(
        as_user(u, g, &["chmod", "0640", s(&via)]),
        "chmod by the owner",
    );
    assert_eq!(
        fs::metadata(shared.join("made")).unwrap().mode() & 0o7777,
        0o640
    );
    run(&[
        "chown",
        &format!("{}:{}", SHIFT + 2000, SHIFT + 2001),
        s(&via),
    ]);
    assert_eq!(owner(&shared.join("made")), (2000, 2001));
    // A user who does not own it may not chmod it (the kernel's check, with the mapping).
    let out = as_user(u, g, &["chmod", "0666", s(&via)]);
    assert!(
        !out.status.success(),
        "chmod by a user who is not the owner"
    );
    // The new owner sets and clears set-group-ID in its own group.
    let (u2, g2) = (SHIFT + 2000, SHIFT + 2001);
    ok(as_user(u2, g2, &["chmod", "2640", s(&via)]), "chmod g+s");
    assert_eq!(
        fs::metadata(shared.join("made")).unwrap().mode() & 0o7777,
        0o2640
    );

    // Set-ID goes with a write by a mapped user who may write but lacks CAP_FSETID (the
    // kernel's FUSE_WRITE_KILL_SUIDGID) and stays with root's write.
    let on_disk = shared.join("made");
    let mode = || fs::metadata(&on_disk).unwrap().mode() & 0o7777;
    let append = |who: Option<(u32, u32)>, p: &Path| {
        let script = format!("echo x >> '{}'", p.display());
        let out = match who {
            Some((u, g)) => as_user(u, g, &["sh", "-c", &script]),
            None => Command::new("sh").args(["-c", &script]).output().unwrap(),
        };
        ok(out, "append");
    };
    fs::set_permissions(&on_disk, fs::Permissions::from_mode(0o6777)).unwrap();
    append(None, &on_disk);
    assert_eq!(mode(), 0o6777, "root's write cleared set-ID");
    append(Some((u, g)), &via);
    assert_eq!(mode(), 0o0777, "a mapped user's write kept set-ID");
    fs::set_permissions(&on_disk, fs::Permissions::from_mode(0o640)).unwrap();

    // Root through the plain mount: chattr +i is enforced, -i lifts it, fstrim trims.
    let f = m.p("shared/made");
    run(&["chattr", "+i", s(&f)]);
    assert!(lsattr(&f).contains('i'), "{}", lsattr(&f));
    assert!(fs::remove_file(&f).is_err());
    run(&["chattr", "-i", s(&f)]);
    run(&["fstrim", s(&m.dir)]);
    // A user without CAP_LINUX_IMMUTABLE may not, even on its own file; nor trim.
    let own = m.p("shared/own");
    ok(as_user(1000, 1000, &["touch", s(&own)]), "touch");
    assert!(!as_user(1000, 1000, &["chattr", "+i", s(&own)])
        .status
        .success());
    assert!(!as_user(1000, 1000, &["fstrim", s(&m.dir)]).status.success());
    // Root's chattr through the idmapped mount too.
    run(&["chattr", "+a", s(&mapped.join("shared/own"))]);
    assert!(lsattr(&own).contains('a'), "{}", lsattr(&own));
    run(&["chattr", "-a", s(&own)]);

    drop(_detach);
    drop(ns);
    m.unmount();
}

/// `-o noidmap`: cilfs does not take FUSE_ALLOW_IDMAP, and the kernel refuses to idmap the
/// mount (EINVAL), as before idmapped mounts.
#[test]
fn noidmap_mounts_refuse_an_idmapping() {
    common::keep_machine_state();
    let m = Mounted::new("64M", &["noidmap"]);
    let mapped = m._tmp.path().join("mapped");
    fs::create_dir(&mapped).unwrap();
    let ns = Userns::new();
    let r = idmapped_bind(&m.dir, &mapped, &ns);
    let _detach = Detach(&mapped);
    assert_eq!(
        r.map_err(|e| e.raw_os_error()),
        Err(Some(libc::EINVAL)),
        "an idmapped mount of a noidmap mount"
    );
    drop(ns);
    m.unmount();
}
