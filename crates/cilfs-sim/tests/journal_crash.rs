//! The journal crash explorer on each flush policy and with an external log.

use cilfs_core::log::FlushPolicy;
use cilfs_sim::{run_journal_crashtest, JournalCrashConfig};

/// Per configuration; about a second each in a debug build.
const POINTS: usize = 2000;

fn check(seed: u64, policy: FlushPolicy, external_log: bool) {
    explore(seed, policy, external_log, false);
}

fn explore(seed: u64, policy: FlushPolicy, external_log: bool, background: bool) {
    explore_with(seed, policy, external_log, background, false);
}

fn explore_with(
    seed: u64,
    policy: FlushPolicy,
    external_log: bool,
    background: bool,
    io_errors: bool,
) -> cilfs_sim::CrashReport {
    let cfg = JournalCrashConfig {
        seed,
        points: POINTS,
        policy,
        external_log,
        background,
        io_errors,
    };
    let r = run_journal_crashtest(&cfg, &mut |_, _| {});
    assert!(
        r.failed == 0,
        "{} of {} crash points failed; replay: cilfs crashtest journal --seed {seed} --points {POINTS} --policy {policy}{}{}{}\n{}",
        r.failed,
        r.passed + r.failed,
        if external_log { " --external-log" } else { "" },
        if background { " --background" } else { "" },
        if io_errors { " --io-errors" } else { "" },
        r.failures.join("\n")
    );
    eprintln!(
        "{policy} external={external_log} background={background}: {} passed, {} checkpoints, {} laps, {} runs",
        r.passed,
        r.checkpoints,
        r.log_laps(),
        r.runs
    );
    assert!(r.checkpoints > 50, "only {} checkpoints", r.checkpoints);
    assert!(r.cache_evicted > 0, "the buffer cache never evicted");
    assert!(
        r.log_laps() > 2,
        "the log wrapped only {} times",
        r.log_laps()
    );
    r
}

#[test]
fn reduced_internal() {
    check(1, FlushPolicy::Reduced, false);
}

#[test]
fn legacy_internal() {
    check(2, FlushPolicy::Legacy, false);
}

#[test]
fn reduced_external() {
    check(3, FlushPolicy::Reduced, true);
}

#[test]
fn legacy_external() {
    check(4, FlushPolicy::Legacy, true);
}

#[test]
fn ail_internal() {
    check(5, FlushPolicy::AilFlush, false);
}

#[test]
fn ail_external() {
    check(6, FlushPolicy::AilFlush, true);
}

// The mount's threads and a second committer: each policy, and an external log.

#[test]
fn background_reduced_internal() {
    explore(7, FlushPolicy::Reduced, false, true);
}

#[test]
fn background_legacy_internal() {
    explore(8, FlushPolicy::Legacy, false, true);
}

#[test]
fn background_ail_internal() {
    explore(9, FlushPolicy::AilFlush, false, true);
}

#[test]
fn background_reduced_external() {
    explore(10, FlushPolicy::Reduced, true, true);
}

// IO errors: each run's devices fail a write or flush, from then on or once. With the mount's
// threads they also run in the scheduled build (tests/scheduled.rs), where a failing seed
// replays.

fn with_io_errors(seed: u64, policy: FlushPolicy, external_log: bool, background: bool) {
    let r = explore_with(seed, policy, external_log, background, true);
    assert!(
        r.most_runs_met_their_io_error(),
        "{} of {} runs met their IO error",
        r.io_errors_met,
        r.runs
    );
}

#[test]
fn io_errors_reduced_internal() {
    with_io_errors(11, FlushPolicy::Reduced, false, false);
}

#[test]
fn io_errors_ail_external() {
    with_io_errors(12, FlushPolicy::AilFlush, true, false);
}

/// Seed 81 found a dead mount's iclog writes landing after the next mount had recovered, and a
/// committer left waiting in a killed journal (unscheduled threads, about a run in three).
#[test]
fn background_io_errors_reduced_internal() {
    with_io_errors(81, FlushPolicy::Reduced, false, true);
}
