//! The filesystem crash explorer: each flush policy, both data modes, several seeds.

use cilfs_core::fs::DataMode;
use cilfs_core::log::FlushPolicy;
use cilfs_sim::{run_fs_crashtest, FsCrashConfig};

const POINTS: usize = 2000;

fn check(seed: u64, policy: FlushPolicy, data: DataMode) {
    explore(seed, policy, data, false, false);
}

fn explore(seed: u64, policy: FlushPolicy, data: DataMode, background: bool, external_log: bool) {
    let cfg = FsCrashConfig {
        seed,
        points: POINTS,
        policy,
        data,
        only_run: None,
        background,
        external_log,
    };
    let r = run_fs_crashtest(&cfg, &mut |_, _| {});
    let mode = if data == DataMode::Ordered {
        "ordered"
    } else {
        "writeback"
    };
    assert!(
        r.failed == 0,
        "{} of {} crash points failed; replay: cilfs crashtest fs --seed {seed} --points {POINTS} --policy {policy} --data {mode}{}{}\n{}",
        r.failed,
        r.passed + r.failed,
        if background { " --background" } else { "" },
        if external_log { " --external-log" } else { "" },
        r.failures.join("\n")
    );
    eprintln!(
        "{policy} {mode} background={background}: {} passed, {} checkpoints, {} log bytes, {} runs",
        r.passed, r.checkpoints, r.log_bytes, r.runs
    );
    assert!(r.checkpoints > 100, "only {} checkpoints", r.checkpoints);
    // Small fsyncs put file data into the log (`logdata=`): recovery replays some.
    assert!(r.data_logged_bytes > 0, "no file data went into the log");
    // The 256 KiB log of the tiny configuration wraps in most runs.
    assert!(
        r.log_bytes > r.runs as u64 * (256 << 10),
        "only {} bytes logged in {} runs",
        r.log_bytes,
        r.runs
    );
}

#[test]
fn reduced_ordered() {
    check(1, FlushPolicy::Reduced, DataMode::Ordered);
}

#[test]
fn legacy_ordered() {
    check(2, FlushPolicy::Legacy, DataMode::Ordered);
}

#[test]
fn reduced_writeback() {
    check(3, FlushPolicy::Reduced, DataMode::Writeback);
}

#[test]
fn reduced_ordered_second_seed() {
    check(4, FlushPolicy::Reduced, DataMode::Ordered);
}

#[test]
fn ail_ordered() {
    check(5, FlushPolicy::AilFlush, DataMode::Ordered);
}

#[test]
fn ail_writeback() {
    check(6, FlushPolicy::AilFlush, DataMode::Writeback);
}

// The mount's threads: the push and AIL workers, concurrent iclog IO and the flusher.

#[test]
fn background_reduced_ordered() {
    explore(7, FlushPolicy::Reduced, DataMode::Ordered, true, false);
}

#[test]
fn background_reduced_writeback() {
    explore(8, FlushPolicy::Reduced, DataMode::Writeback, true, false);
}

#[test]
fn background_legacy_ordered() {
    explore(9, FlushPolicy::Legacy, DataMode::Ordered, true, false);
}

#[test]
fn background_ail_ordered() {
    explore(10, FlushPolicy::AilFlush, DataMode::Ordered, true, false);
}

// The log on a device of its own: the data flush before a commit and the commit's FUA go to
// two devices, and logged file data is replayed from the log device.
#[test]
fn reduced_ordered_external_log() {
    explore(11, FlushPolicy::Reduced, DataMode::Ordered, false, true);
}

#[test]
fn ail_writeback_external_log() {
    explore(12, FlushPolicy::AilFlush, DataMode::Writeback, false, true);
}

#[test]
fn background_reduced_ordered_external_log() {
    explore(13, FlushPolicy::Reduced, DataMode::Ordered, true, true);
}
