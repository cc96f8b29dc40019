//! The explorers under the deterministic scheduler (`--cfg shuttle`, `scripts/sched-crashtest`;
//! scripts/test runs these): every thread of a run is a task of a seeded scheduler, so a seed
//! replays its interleavings and makes the same IO, byte for byte.
#![cfg(shuttle)]

use cilfs_core::fs::DataMode;
use cilfs_core::log::FlushPolicy;
use cilfs_sim::{run_fs_crashtest, run_journal_crashtest, FsCrashConfig, JournalCrashConfig};

fn journal(seed: u64, points: usize, policy: FlushPolicy, external_log: bool) -> Vec<u64> {
    let cfg = JournalCrashConfig {
        seed,
        points,
        policy,
        external_log,
        background: true,
    };
    let r = run_journal_crashtest(&cfg, &mut |_, _| {});
    assert_eq!(r.failed, 0, "seed {seed} {policy}: {:?}", r.failures);
    assert_eq!(r.passed, points);
    r.traces
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
        journal(seed, 1000, policy, external);
    }
}

/// The fs explorer, scheduled on one operation thread: its seed replays its IO too (the inodes'
/// timestamps come from the virtual clock).
#[test]
fn the_fs_explorer_scheduled_replays_its_io_trace() {
    let run = |seed, data| {
        let cfg = FsCrashConfig {
            seed,
            points: 200,
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
