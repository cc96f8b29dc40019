//! `cilfs bench journal` as a user runs it: one JSON object whose counters describe the timed
//! run only, warm by default.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

mod common;

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

/// A run time that is not a positive number of seconds is refused with a usage error; both
/// benchmarks panicked on one before. `bench fs --ops` alone runs to its count.
#[test]
fn run_times_are_checked_and_ops_alone_sets_the_work() {
    for bench in ["journal", "fs"] {
        for bad in ["-1", "0", "nan", "inf", "1e300", "soon"] {
            let seconds = format!("--seconds={bad}");
            let args = ["bench", bench, "--workload", "create"];
            let args = [&args[..if bench == "fs" { 4 } else { 2 }], &[&seconds]].concat();
            let out = common::cilfs(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "bench {bench} --seconds={bad}: {err}"
            );
            assert!(err.contains("not a number of seconds"), "{err}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let out = common::run(&[
        common::CILFS,
        "bench",
        "fs",
        "--workload",
        "create",
        "--json",
        "--ops",
        "2500",
        "--dir",
        common::s(dir.path()),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ops"], 2500, "{v}");
    assert_eq!(v["config"]["seconds"], serde_json::Value::Null, "{v}");
}
