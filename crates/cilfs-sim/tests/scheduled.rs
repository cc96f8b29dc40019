//! The explorers under the deterministic scheduler (`--cfg shuttle`, `scripts/sched-crashtest`;
//! scripts/test runs these): every thread of a run is a task of a seeded scheduler, so a seed
//! replays its interleavings and makes the same IO, byte for byte.
#![cfg(shuttle)]

use cilfs_core::fs::DataMode;
use cilfs_core::log::FlushPolicy;
use cilfs_sim::{run_fs_crashtest, run_journal_crashtest, FsCrashConfig, JournalCrashConfig};

fn journal(seed: u64, points: usize, policy: FlushPolicy, external_log: bool) -> Vec<u64> {
    journal_with(seed, points, policy, external_log, false).traces
}

fn journal_with(
    seed: u64,
    points: usize,
    policy: FlushPolicy,
    external_log: bool,
    io_errors: bool,
) -> cilfs_sim::CrashReport {
    let cfg = JournalCrashConfig {
        seed,
        points,
        policy,
        external_log,
        background: true,
        io_errors,
    };
    let r = run_journal_crashtest(&cfg, &mut |_, _| {});
    assert_eq!(r.failed, 0, "seed {seed} {policy}: {:?}", r.failures);
    assert_eq!(r.passed, points);
    r
}

/// The mount's threads meet an injected IO error in each run (a write or flush failing from
/// then on, or once): what returned before it stays, and the dead mount recovers.
#[test]
fn the_journal_explorer_scheduled_with_io_errors() {
    for (seed, policy, external) in [
        (61, FlushPolicy::Reduced, false),
        (62, FlushPolicy::AilFlush, false),
        (63, FlushPolicy::Legacy, true),
    ] {
        let r = journal_with(seed, 600, policy, external, true);
        assert!(
            r.most_runs_met_their_io_error(),
            "{policy}: {} of {} runs met their IO error",
            r.io_errors_met,
            r.runs
        );
    }
}

/// The same seed twice: every run's IO trace is the same. Another seed: they differ.
#[test]
fn a_seed_replays_the_journal_explorers_io_trace() {
    for policy in [FlushPolicy::Reduced, FlushPolicy::AilFlush] {
        let a = journal(7, 300, policy, false);
        assert_eq!(a.len(), 3);
        assert_eq!(
            a,
            journal(7, 300, policy, false),
            "{policy}: seed 7 ran differently twice"
        );
        assert_ne!(
            a,
            journal(8, 300, policy, false),
            "{policy}: seeds 7 and 8 made the same IO"
        );
    }
}

/// The journal in the mount's threads (push worker, iclog IO, AIL worker, a second committer),
/// scheduled, for every flush policy and an external log.
#[test]
fn the_journal_explorer_scheduled_in_the_mounts_threads() {
    for (seed, policy, external) in [
        (4801, FlushPolicy::Reduced, false),
        (4802, FlushPolicy::AilFlush, false),
        (4803, FlushPolicy::Legacy, false),
        (4804, FlushPolicy::Reduced, true),
        (4805, FlushPolicy::AilFlush, true),
    ] {
        journal(seed, 600, policy, external);
    }
}

/// The fs explorer, scheduled on one operation thread: its seed replays its IO too (the inodes'
/// timestamps come from the virtual clock).
#[test]
fn the_fs_explorer_scheduled_replays_its_io_trace() {
    let run = |seed, data| {
        let cfg = FsCrashConfig {
            seed,
            points: 100,
            policy: FlushPolicy::Reduced,
            data,
            only_run: None,
            background: false,
            external_log: false,
        };
        let r = run_fs_crashtest(&cfg, &mut |_, _| {});
        assert_eq!(r.failed, 0, "seed {seed}: {:?}", r.failures);
        r.traces
    };
    for data in [DataMode::Ordered, DataMode::Writeback] {
        let a = run(4806, data);
        assert_eq!(a, run(4806, data), "fs seed 4806 ran differently twice");
    }
}

fn fs_background(seed: u64, points: usize) -> cilfs_sim::CrashReport {
    let cfg = FsCrashConfig {
        seed,
        points,
        policy: FlushPolicy::Reduced,
        data: DataMode::Ordered,
        only_run: None,
        background: true,
        external_log: false,
    };
    run_fs_crashtest(&cfg, &mut |_, _| {})
}

/// The fs explorer with the mount's threads (push worker, iclog IO, AIL worker, the flusher)
/// and two more operation threads, scheduled: it passes, and a seed replays its IO.
#[test]
fn the_fs_explorer_scheduled_in_the_mounts_threads() {
    let a = fs_background(4807, 100);
    assert_eq!(a.failed, 0, "{:?}", a.failures);
    assert!(a.conflicts > 0, "the operation threads never met");
    assert_eq!(a.traces, fs_background(4807, 100).traces);
}

/// With the publish's check that what a commit read is still current turned off, the
/// scheduled fs explorer fails within a few runs: commits of the operation threads publish
/// over each other.
#[test]
fn a_publish_without_its_check_is_found() {
    cilfs_core::util::mutants::set_publish_check_off(true);
    let mut tried = Vec::new();
    let found = (4808..4816).find_map(|seed| {
        let r = fs_background(seed, 100);
        tried.push((seed, r.passed, r.conflicts));
        (r.failed > 0).then_some((seed, r))
    });
    cilfs_core::util::mutants::set_publish_check_off(false);
    let Some((seed, r)) = found else {
        panic!("the broken publish went unnoticed: (seed, points passed, conflicts) {tried:?}");
    };
    eprintln!("broken publish found by seed {seed}: {}", r.failures[0]);
}
