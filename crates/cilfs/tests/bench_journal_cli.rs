//! `cilfs bench journal` as a user runs it: one JSON object whose counters describe the timed
//! run only, warm by default.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

use std::process::Command;

fn bench(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cilfs"))
        .args(["bench", "journal", "--json", "--commits", "2000"])
        .args(["--items", "256", "--log-size", "8M", "--logbsize", "32k"])
        .arg("--dir")
        .arg(dir.path())
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {err}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The warm-up reads the whole working set before the clock starts, so the timed run reads
/// nothing; `--cold` leaves those first reads in the run.
#[test]
fn the_timed_run_is_warm_unless_cold_is_asked() {
    let warm = bench(&[]);
    assert_eq!(warm["config"]["cold"], false);
    assert_eq!(warm["data_device"]["reads"], 0, "{warm}");
    assert!(warm["commits"].as_u64().unwrap() >= 2000, "{warm}");
    assert!(warm["checkpoints"].as_u64().unwrap() >= 1, "{warm}");

    let cold = bench(&["--cold"]);
    assert_eq!(cold["config"]["cold"], true);
    let reads = cold["data_device"]["reads"].as_u64().unwrap();
    assert!(reads >= 200, "a cold run read {reads} blocks: {cold}");
}
