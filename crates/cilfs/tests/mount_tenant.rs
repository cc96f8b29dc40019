//! `cilfs tenant` on a mounted filesystem: projects assigned to a tree and inherited, limits
//! set, listed and kept across a remount, EXDEV across projects, and the counters `cilfs stat`
//! shows. Needs root and /dev/fuse; runs over both transports (CILFS_TEST_TRANSPORT).
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

mod common;
use common::{cilfs, errno, s, Mounted};

fn ok(args: &[&str]) -> String {
    let out = cilfs(args);
    assert!(
        out.status.success(),
        "cilfs {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn projects_are_assigned_inherited_limited_and_kept() {
    let m = Mounted::new("64M", &[]);
    fs::create_dir_all(m.p("a/deep")).unwrap();
    fs::write(m.p("a/deep/old"), b"before the project").unwrap();
    fs::create_dir(m.p("b")).unwrap();
    let out = ok(&["tenant", "assign", s(&m.p("a")), "7"]);
    assert!(out.contains("3 inodes in project 7"), "{out}");
    ok(&["tenant", "assign", s(&m.p("b")), "8"]);
    assert_eq!(ok(&["tenant", "show", s(&m.p("a/deep/old"))]).trim(), "7");
    // New files take their directory's project.
    fs::write(m.p("a/deep/new"), b"x").unwrap();
    assert_eq!(ok(&["tenant", "show", s(&m.p("a/deep/new"))]).trim(), "7");
    // Across projects: EXDEV (mv then copies), within one: fine.
    let e = fs::rename(m.p("a/deep/new"), m.p("b/new")).unwrap_err();
    assert_eq!(errno(e), rustix::io::Errno::XDEV);
    let e = fs::hard_link(m.p("a/deep/new"), m.p("b/link")).unwrap_err();
    assert_eq!(errno(e), rustix::io::Errno::XDEV);
    fs::rename(m.p("a/deep/new"), m.p("a/moved")).unwrap();
    // Limits: set, kept for fields not given, listed.
    ok(&["tenant", "limit", s(&m.dir), "7", "--write-iops", "500"]);
    let out = ok(&["tenant", "limit", s(&m.dir), "7", "--read-bps", "1048576"]);
    assert!(
        out.contains("write_iops=500") && out.contains("read_bps=1048576"),
        "{out}"
    );
    // Data IO charged to the project: synchronous writes of a new file.
    let mut f = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::SYNC.bits() as i32)
        .open(m.p("a/data"))
        .unwrap();
    for _ in 0..20 {
        f.write_all(&[7u8; 4096]).unwrap();
    }
    drop(f);
    let list = ok(&["tenant", "list", s(&m.dir), "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&list).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["project"] == 7)
        .unwrap_or_else(|| panic!("project 7 not listed: {list}"));
    assert_eq!(row["write_iops"], 500);
    assert!(row["write_ios"].as_u64().unwrap() >= 1, "{list}");
    let stat = ok(&["stat", s(&m.dir), "--json"]);
    assert!(stat.contains("\"tenant_7_write_ios\""), "{stat}");
    // Not as a user; not project 0.
    let out = cilfs(&["tenant", "limit", s(&m.dir), "0", "--write-iops", "1"]);
    assert_eq!(out.status.code(), Some(2));
    // Kept across a remount.
    m.unmount();
    m.mount(&[]);
    let list = ok(&["tenant", "list", s(&m.dir)]);
    assert!(
        list.lines()
            .any(|l| l.split_whitespace().take(2).eq(["7", "500"])),
        "{list}"
    );
    assert_eq!(ok(&["tenant", "show", s(&m.p("a/moved"))]).trim(), "7");
    ok(&["tenant", "clear", s(&m.dir), "7"]);
    let list = ok(&["tenant", "list", s(&m.dir), "--json"]);
    assert!(!list.contains("\"write_iops\":500"), "{list}");
    m.unmount();
}
