//! Mount tests of the daemon's operability: where its messages go (a log file that follows no
//! symbolic link, with timestamps; the journal's stream under systemd), corruption met while
//! mounted (logged with its block, the image marked for a check), the `sync`, `dirsync` and
//! `nodiratime` options, ordered data after a killed daemon, and a user's own mount. Needs root and /dev/fuse, as mount.rs.
#![allow(clippy::unwrap_used)]

use rustix::io::Errno;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{
    errno, in_open_fuse_namespace, mounts_on, nobodys_base, output, run, set_atime_2001, sha1,
    transported, wait_for_exit, Mounted, Y2001,
};

fn cilfs(args: &[&str]) -> Output {
    cilfs_env(args, &[])
}

/// `cilfs` with extra environment variables.
fn cilfs_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    output(transported(args).envs(env.iter().copied()))
}

/// The log file a mount names in its "messages in PATH" line.
fn log_named_by(mount_stdout: &[u8]) -> PathBuf {
    let text = String::from_utf8_lossy(mount_stdout);
    let at = text.find("messages in ").expect("mount names its log") + "messages in ".len();
    PathBuf::from(text[at..].trim_end().trim_end_matches(')'))
}

/// Whether `line` starts with an RFC 3339 UTC timestamp, "2026-11-25T08:26:03.036314Z ".
fn timestamped(line: &str) -> bool {
    let b = line.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        r.into_iter()
            .all(|i| b.get(i).is_some_and(u8::is_ascii_digit))
    };
    let Some(z) = line.find("Z ") else {
        return false;
    };
    digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && (z == 19 || (b[19] == b'.' && digits(20..z)))
}

/// The daemon's log file (CILFS_LOG=file): every line timestamped, appended to by each mount
/// and never truncated; a symbolic link planted where it goes is refused, not followed, and
/// its target is untouched (the mount fails and says why).
#[test]
fn the_log_file_has_timestamps_is_appended_and_never_follows_a_symlink() {
    let m = Mounted::new("64M", &[]);
    m.unmount();
    let file_log = [("CILFS_LOG", "file")];
    let (img, dir) = (m.img.to_str().unwrap(), m.dir.to_str().unwrap());
    let out = cilfs_env(&["mount", img, dir], &file_log);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = log_named_by(&out.stdout);
    let _rm = RemoveOnDrop(log.clone());
    fs::write(m.p("f"), b"x").unwrap();
    m.unmount();
    let first = fs::read_to_string(&log).unwrap();
    assert!(
        first.contains(&format!("mounting {img} on {dir}")),
        "{first}"
    );
    assert!(
        first.contains(&format!("{img} unmounted from {dir}: clean")),
        "{first}"
    );
    for l in first.lines() {
        assert!(timestamped(l), "no timestamp: {l}");
    }
    let mode = fs::metadata(&log).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", log.display());
    let dir_mode = fs::metadata(log.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700, "the log directory is private");
    // A second mount appends.
    let out = cilfs_env(&["mount", img, dir], &file_log);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.unmount();
    let second = fs::read_to_string(&log).unwrap();
    assert!(second.starts_with(&first), "the log was truncated");
    assert_eq!(
        second.matches("unmounted from").count(),
        first.matches("unmounted from").count() + 1,
        "{second}"
    );
    // A symbolic link where the log goes.
    let target = m.img.with_file_name("precious");
    fs::write(&target, b"not a log").unwrap();
    fs::remove_file(&log).unwrap();
    std::os::unix::fs::symlink(&target, &log).unwrap();
    let before = sha1(&m.img);
    let out = cilfs_env(&["mount", img, dir], &file_log);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("symbolic link") && err.contains(log.to_str().unwrap()),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert_eq!(
        fs::read(&target).unwrap(),
        b"not a log",
        "the target is untouched"
    );
    assert!(fs::symlink_metadata(&log).unwrap().file_type().is_symlink());
    assert_eq!(mounts_on(&m.dir), 0, "nothing mounted");
    assert_eq!(sha1(&m.img), before, "nothing written");
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// The last leaf of the fs tree of an unmounted image (internal log, 4 KiB blocks): walked
/// from the header's root through each interior node's last child.
fn last_fs_tree_leaf(img: &Path) -> u64 {
    let data = fs::read(img).unwrap();
    let bs = 4096usize;
    let u64_at = |b: usize| u64::from_le_bytes(data[b..b + 8].try_into().unwrap());
    let (log_start, log_blocks) = (u64_at(48), u64_at(56));
    let header = (log_start + log_blocks) as usize * bs;
    assert_eq!(&data[header..header + 4], &0x4346_5348u32.to_le_bytes());
    let mut node = u64_at(header + 40) as usize;
    loop {
        let b = node * bs;
        assert_eq!(&data[b..b + 4], &0x4342_5431u32.to_le_bytes(), "a node");
        assert_eq!(data[b + 5], 1, "of the fs tree");
        if data[b + 4] == 0 {
            return node as u64;
        }
        let count = u16::from_le_bytes([data[b + 6], data[b + 7]]) as usize;
        node = u64_at(b + 48 + (count - 1) * 24 + 16) as usize;
    }
}

/// A corrupt tree node met while mounted: the request gets EUCLEAN, the log names the block,
/// the superblock is marked at once, and unmount and info say a check is needed; check
/// reports the mark, and clears it with --clear-needs-check only once the filesystem is
/// consistent again.
#[test]
fn a_corrupt_tree_node_is_logged_with_its_block_and_the_image_is_marked_for_a_check() {
    let m = Mounted::new("64M", &[]);
    fs::create_dir(m.p("d")).unwrap();
    // Enough inodes for the fs tree to have many leaves; the newest sort last.
    for i in 0..300 {
        fs::write(m.p(&format!("d/file-with-a-long-name-{i}")), b"x").unwrap();
    }
    m.unmount();
    let leaf = last_fs_tree_leaf(&m.img);
    let flip = |img: &Path| {
        let mut f = OpenOptions::new().read(true).write(true).open(img).unwrap();
        let mut b = [0u8; 1];
        f.seek(std::io::SeekFrom::Start(leaf * 4096)).unwrap();
        f.read_exact(&mut b).unwrap();
        f.seek(std::io::SeekFrom::Start(leaf * 4096)).unwrap();
        f.write_all(&[b[0] ^ 0xff]).unwrap();
    };
    flip(&m.img);
    let (img, dir) = (m.img.to_str().unwrap(), m.dir.to_str().unwrap());
    let out = cilfs_env(&["mount", img, dir], &[("CILFS_LOG", "file")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = log_named_by(&out.stdout);
    let _rm = RemoveOnDrop(log.clone());
    let e = fs::metadata(m.p("d/file-with-a-long-name-299")).unwrap_err();
    assert_eq!(errno(e), Errno::UCLEAN);
    // A listing never drops the names whose inodes sit in the bad block: it fails with
    // EUCLEAN instead (readdirplus used to skip them, 4 of 300 names gone without an error).
    let listed: Result<Vec<_>, _> = fs::read_dir(m.p("d")).unwrap().collect();
    match listed {
        Ok(names) => assert_eq!(names.len(), 300, "names dropped from the listing"),
        Err(e) => assert_eq!(errno(e), Errno::UCLEAN),
    }
    // Marked at once, while still mounted: a crash now would keep it.
    let info = cilfs(&["info", img]);
    let info = String::from_utf8_lossy(&info.stdout).into_owned();
    assert!(info.contains("needs check    yes"), "{info}");
    let said = fs::read_to_string(&log).unwrap();
    let line = said
        .lines()
        .find(|l| l.contains("corrupt"))
        .unwrap_or_else(|| panic!("no corruption logged: {said}"));
    assert!(
        line.contains(&format!("metadata block {leaf} is corrupt")),
        "{line}"
    );
    assert!(line.contains("ERROR") && timestamped(line), "{line}");
    let out = cilfs(&["unmount", dir]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("needs a check") && !text.contains("is clean"),
        "{text}"
    );
    let info = cilfs(&["info", img]);
    let info = String::from_utf8_lossy(&info.stdout).into_owned();
    assert!(info.contains("state          clean"), "{info}");
    assert!(info.contains("needs check    yes"), "{info}");
    // The check finds the damage and leaves the mark, even when asked to clear it.
    let out = cilfs(&["check", "--clear-needs-check", img]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("metadata block {leaf} is corrupt")),
        "{text}"
    );
    assert!(text.contains("still needed"), "{text}");
    // The block mended by hand: consistent again, but the mark stays until a check that may
    // write clears it.
    flip(&m.img);
    let out = cilfs(&["check", img]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("--clear-needs-check"), "{text}");
    let info = String::from_utf8_lossy(&cilfs(&["info", img]).stdout).into_owned();
    assert!(
        info.contains("needs check    yes"),
        "check without leave to write: {info}"
    );
    let out = cilfs(&["check", "--clear-needs-check", img]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("mark cleared"), "{text}");
    let info = String::from_utf8_lossy(&cilfs(&["info", img]).stdout).into_owned();
    assert!(!info.contains("needs check"), "{info}");
    m.mount(&[]);
    assert_eq!(fs::read(m.p("d/file-with-a-long-name-299")).unwrap(), b"x");
    let out = cilfs(&["unmount", dir]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("is clean"));
}

/// Under systemd (stderr is the journal's stream, JOURNAL_STREAM names it) the daemon writes
/// each message once, with a syslog priority prefix and no timestamp (journald adds its own).
#[test]
fn under_systemd_messages_go_to_the_journal_stream_with_priorities() {
    use rustix::process::{kill_process, Pid, Signal};
    let m = Mounted::new("64M", &[]);
    m.unmount();
    let sock_path = m.img.with_file_name("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let stream = m.img.with_file_name("journal");
    let stderr = File::create(&stream).unwrap();
    let st = rustix::fs::fstat(&stderr).unwrap();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_cilfs"))
        .args(["mount", "--foreground"])
        .arg(&m.img)
        .arg(&m.dir)
        .env("NOTIFY_SOCKET", &sock_path)
        .env("JOURNAL_STREAM", format!("{}:{}", st.st_dev, st.st_ino))
        .env_remove("CILFS_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).expect("READY=1 within 60 s");
    assert!(buf[..n].starts_with(b"READY=1"));
    kill_process(Pid::from_raw(daemon.id() as i32).unwrap(), Signal::TERM).unwrap();
    let status = wait_for_exit(&mut daemon);
    let said = fs::read_to_string(&stream).unwrap();
    assert!(status.success(), "{status}: {said}");
    assert!(said.contains("<6>SIGTERM: unmounting"), "{said}");
    assert!(said.contains("unmounted from"), "{said}");
    for l in said.lines() {
        assert!(l.starts_with('<') && !timestamped(&l[3..]), "{l}");
    }
    assert_eq!(
        said.matches("SIGTERM: unmounting").count(),
        1,
        "once: {said}"
    );
}

/// The mount options `sync` and `dirsync` force changes before the reply: names and data
/// written with no fsync survive a SIGKILL of the daemon; `findmnt` shows them and the type
/// (fuse.cilfs, or fuseblk.cilfs through a loop device).
#[test]
fn sync_and_dirsync_make_changes_durable_before_the_reply() {
    for opt in ["sync", "dirsync"] {
        let m = Mounted::new("64M", &[opt]);
        let shown = run(&["findmnt", "-no", "FSTYPE,OPTIONS", m.dir.to_str().unwrap()]);
        // fuseblk.cilfs: a mount by root of an image file goes through a loop device.
        assert!(
            shown.starts_with("fuse.cilfs ") || shown.starts_with("fuseblk.cilfs "),
            "{shown}"
        );
        assert!(shown.split([' ', ',']).any(|o| o == opt), "{opt}: {shown}");
        fs::create_dir(m.p("d")).unwrap();
        fs::write(m.p("d/f"), b"written").unwrap();
        fs::rename(m.p("d/f"), m.p("d/g")).unwrap();
        m.kill_daemon();
        m.mount(&[]);
        let names: Vec<_> = fs::read_dir(m.p("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["g"], "{opt}");
        if opt == "sync" {
            assert_eq!(fs::read(m.p("d/g")).unwrap(), b"written", "{opt}: data");
        }
        m.unmount();
    }
}

/// Ordered data through the mount: files appended in 4 KiB writes with no fsync, another
/// file and the directory fsynced, the daemon SIGKILLed: after recovery each appended file
/// reads as a prefix of what was written, never with zeros where its data was still in the
/// daemon's page cache.
#[test]
fn appended_files_read_as_a_prefix_of_what_was_written_after_a_killed_daemon() {
    let m = Mounted::new("256M", &[]);
    let chunk = |k: usize, round: usize| -> Vec<u8> {
        (0..4096)
            .map(|j| (1 + (round * 7 + k * 13 + j) % 251) as u8)
            .collect()
    };
    let names: Vec<String> = (0..8).map(|k| format!("a{k}")).collect();
    let mut files: Vec<File> = names
        .iter()
        .map(|n| File::create(m.p(n)).unwrap())
        .collect();
    let rounds = 200;
    for round in 0..rounds {
        for (k, f) in files.iter_mut().enumerate() {
            f.write_all(&chunk(k, round)).unwrap();
        }
    }
    drop(files);
    let mut other = File::create(m.p("synced")).unwrap();
    other.write_all(b"forced").unwrap();
    other.sync_all().unwrap();
    File::open(&m.dir).unwrap().sync_all().unwrap();
    m.kill_daemon();
    m.mount(&[]);
    for (k, n) in names.iter().enumerate() {
        let got = fs::read(m.p(n)).unwrap();
        let want: Vec<u8> = (0..rounds).flat_map(|r| chunk(k, r)).collect();
        assert!(got.len() <= want.len(), "{n}: {} bytes", got.len());
        if let Some(p) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!(
                "{n} ({} of {} bytes) differs from what was written at byte {p}: not a prefix",
                got.len(),
                want.len()
            );
        }
    }
    assert_eq!(fs::read(m.p("synced")).unwrap(), b"forced");
    m.unmount();
}

/// Damage in the middle of a dirty log: mount refuses with the way out, check reports it,
/// repair replays up to the damage and starts the log again, and a second repair has nothing
/// to do.
#[test]
fn a_log_damaged_before_committed_checkpoints_is_refused_and_repaired() {
    let m = Mounted::new("64M", &[]);
    for i in 0..12 {
        let mut f = File::create(m.p(&format!("f{i}"))).unwrap();
        f.write_all(&[i as u8 + 1; 3000]).unwrap();
        f.sync_all().unwrap();
        File::open(&m.dir).unwrap().sync_all().unwrap();
    }
    m.kill_daemon();
    let img = m.img.to_str().unwrap();
    let out = common::cilfs(&["logprint", "--json", img]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let records = log["records"].as_array().unwrap();
    let n = records.len();
    assert!(n >= 2, "{n} records");
    // Not the last record (a commit): a committed checkpoint follows the damage.
    let r = records[..n - 1]
        .iter()
        .find(|r| r["sectors"].as_u64().unwrap() >= 2)
        .unwrap();
    let at = log["log_offset"].as_u64().unwrap() + r["log_byte"].as_u64().unwrap() + 512 + 100;
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&m.img)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(std::io::SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x40;
    f.seek(std::io::SeekFrom::Start(at)).unwrap();
    f.write_all(&b).unwrap();
    drop(f);
    let dir = m.dir.to_str().unwrap();
    let out = common::cilfs_transported(&["mount", img, dir]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a damaged log mounted");
    assert!(
        said.contains("is damaged at lsn") && said.contains("cilfs repair"),
        "{said}"
    );
    assert_eq!(mounts_on(&m.dir), 0);
    let out = common::cilfs(&["check", img]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("log: the log is damaged"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let sum = sha1(&m.img);
    let out = common::cilfs(&["repair", "-n", img]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("would replay it up to the damage"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(sha1(&m.img), sum, "repair -n wrote to the image");
    // fsck(8)'s helper: -n leaves it (4, uncorrected), -y repairs it (1, corrected).
    let fsck = m._tmp.path().join("fsck.cilfs");
    std::os::unix::fs::symlink(common::CILFS, &fsck).unwrap();
    let out = output(Command::new(&fsck).args(["-n", img]));
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(sha1(&m.img), sum, "fsck -n wrote to the image");
    let out = output(Command::new(&fsck).args(["-y", img]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("repaired: consistent"),
        "{out:?}"
    );
    let out = common::cilfs(&["repair", img]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nothing to repair"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    m.mount(&[]);
    // What survives is a prefix of the fsynced files, each whole.
    let mut kept = 0;
    for i in 0..12 {
        match fs::read(m.p(&format!("f{i}"))) {
            Ok(d) => {
                assert_eq!(d, vec![i as u8 + 1; 3000], "f{i}");
                assert_eq!(kept, i, "f{i} kept after a lost file");
                kept += 1;
            }
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
        }
    }
    assert!(kept < 12, "the damage lost nothing");
    m.unmount();
}

/// `nodiratime`: a readdir leaves the directory's atime alone while reads still move files'
/// (strictatime); `diratime` (the default) moves it.
#[test]
fn nodiratime_leaves_directory_atime_alone() {
    for (opts, dir_moves) in [
        ("strictatime,nodiratime", false),
        ("strictatime,diratime", true),
    ] {
        let m = Mounted::new("64M", &[opts]);
        let (f, d) = (m.p("f"), m.p("d"));
        fs::write(&f, b"data").unwrap();
        fs::create_dir(&d).unwrap();
        for p in [&f, &d] {
            set_atime_2001(p);
        }
        assert_eq!(fs::read(&f).unwrap(), b"data");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 0);
        assert!(fs::metadata(&f).unwrap().atime() > Y2001, "{opts}: file");
        assert_eq!(
            fs::metadata(&d).unwrap().atime() > Y2001,
            dir_moves,
            "{opts}: directory"
        );
        m.unmount();
    }
}

/// A user's own mount (made through fusermount3) is unmounted by `cilfs unmount` run as that
/// user; a user who cannot open /dev/fuse is told why and what to do. As root: the user is
/// nobody (setpriv), and where /dev/fuse is closed to users (mode 0600, as in some
/// containers) the mount runs in a private mount namespace with a 0666 node bound over it.
#[test]
fn a_users_own_mount_unmounts_and_a_closed_dev_fuse_is_explained() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let (img, dir, as_nobody) = nobodys_base(base);
    let bin = env!("CARGO_BIN_EXE_cilfs");
    let sh = |script: &str| Command::new("sh").args(["-c", script]).output().unwrap();
    let out = sh(&format!(
        "{as_nobody} {bin} mkfs -q --size 64M {}",
        img.display()
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let closed = sh(&format!("{as_nobody} test -r /dev/fuse -a -w /dev/fuse"))
        .status
        .code()
        != Some(0);
    if closed {
        let out = sh(&format!(
            "{as_nobody} {bin} mount {} {}",
            img.display(),
            dir.display()
        ));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("cannot open /dev/fuse") && err.contains("chmod 0666 /dev/fuse"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert_eq!(mounts_on(&dir), 0);
    }
    // The user's mount and unmount, in a namespace of their own where /dev/fuse is open.
    let script = format!(
        "{as_nobody} {bin} mount {img} {dir}\n\
         findmnt -no FSTYPE,OPTIONS {dir}\n\
         {as_nobody} sh -c 'echo by-nobody > {dir}/f'\n\
         {as_nobody} {bin} unmount {dir}\n\
         findmnt {dir} >/dev/null && echo still-mounted || true\n",
        img = img.display(),
        dir = dir.display()
    );
    let (ran, o, e) = in_open_fuse_namespace(&base.join("fuse"), &script);
    assert!(ran, "{o}{e}");
    assert!(
        o.contains("fuse.cilfs") && o.contains("user_id=65534"),
        "{o}"
    );
    assert!(
        o.contains(&format!(
            "unmounted {}; {} is clean",
            dir.display(),
            img.display()
        )),
        "{o}"
    );
    assert!(!o.contains("still-mounted"), "{o}");
    let out = cilfs(&["check", img.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
