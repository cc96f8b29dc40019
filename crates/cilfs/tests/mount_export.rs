//! File handles that outlive the kernel's inode cache (FUSE_EXPORT_SUPPORT, what an NFS server
//! over cilfs needs): name_to_handle_at, `echo 2 > /proc/sys/vm/drop_caches`, then
//! open_by_handle_at reads the file; a handle of a file unlinked meanwhile is stale. Needs root,
//! /dev/fuse and a C compiler (installed by scripts/install-deps); runs over both transports.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{s, Mounted};

/// Builds tests/support/handle.c into `dir`.
fn handle_tool(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/handle.c");
    let bin = dir.join("handle");
    let out = Command::new("cc")
        .args(["-O1", "-o", s(&bin), s(&src)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
}

#[test]
fn file_handles_survive_dropping_the_kernels_caches() {
    let m = Mounted::new("64M", &[]);
    let tool = handle_tool(m._tmp.path());
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/kept"), b"still here after the caches went").unwrap();
    fs::write(m.p("d/gone"), b"unlinked").unwrap();
    let save = |name: &str| {
        let h = m
            ._tmp
            .path()
            .join(format!("{}.handle", name.replace('/', "-")));
        let out = Command::new(&tool)
            .args(["save", s(&m.p(name)), s(&h)])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "save {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        h
    };
    let kept = save("d/kept");
    let gone = save("d/gone");
    let dir = save("d");
    fs::remove_file(m.p("d/gone")).unwrap();
    drop_caches();
    let open = |h: &Path| {
        Command::new(&tool)
            .args(["open", s(&m.dir), s(h)])
            .output()
            .unwrap()
    };
    let out = open(&kept);
    assert!(
        out.status.success(),
        "open_by_handle_at after drop_caches: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"still here after the caches went");
    // A directory's handle too (what NFS resolves paths through).
    drop_caches();
    let out = open(&dir);
    assert!(
        out.status.success(),
        "a directory's handle: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The unlinked file's handle is stale, not someone else's file.
    drop_caches();
    let out = open(&gone);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "ESTALE");
    // And after a remount (a new kernel inode cache altogether).
    m.unmount();
    m.mount(&[]);
    let out = open(&kept);
    assert!(
        out.status.success(),
        "after a remount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"still here after the caches went");
    m.unmount();
}
