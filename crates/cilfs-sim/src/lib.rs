//! Crash exploration. A seeded workload runs on recorded simulated devices; afterwards the crash
//! image at chosen operation indexes (every flush/FUA point is a candidate, and points between
//! them) is rebuilt with a seeded choice of lost and torn volatile writes, recovered, and checked
//! against a model of which states recovery may produce. A corruption campaign damages
//! populated images block by block and checks what check, a mount and repair make of them.

pub mod corrupt;
pub mod fs_crash;
pub mod journal_crash;
mod recorded;

pub use corrupt::{run_corrupt_campaign, CorruptConfig, CorruptReport};
pub use fs_crash::{run_fs_crashtest, FsCrashConfig};
pub use journal_crash::{run_journal_crashtest, CrashReport, JournalCrashConfig};

/// Whether this build runs the explorers under the deterministic scheduler (`--cfg shuttle`,
/// `scripts/sched-crashtest`), where a seed replays its runs' interleavings.
pub const SCHEDULED: bool = cilfs_sync::SCHEDULED;
