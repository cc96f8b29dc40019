use crate::Failure;
use cilfs_core::log::FlushPolicy;
use cilfs_sim::{run_journal_crashtest, JournalCrashConfig};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// Random transactions on the journal, crashed at flush/FUA points and between them
    Journal(JournalArgs),
    /// Random POSIX operations on the filesystem core, crashed at flush/FUA points and between
    Fs(FsArgs),
    /// Populated images damaged one block at a time (superblock, log, every metadata block
    /// type), then check, a mount that reads every file, repair, and check again
    Corrupt(CorruptArgs),
}

#[derive(Debug, clap::Args)]
pub struct CorruptArgs {
    /// Seed of the whole campaign [default: chosen at random and printed]
    #[arg(long)]
    seed: Option<u64>,
    /// Corruptions to make, each on a fresh copy of a populated image
    #[arg(long, default_value_t = 600)]
    cases: usize,
    /// Only this case of the seed (as a failure names it)
    #[arg(long)]
    case: Option<u64>,
    /// Leave repair out (check and mount only)
    #[arg(long)]
    no_repair: bool,
}

#[derive(Debug, clap::Args)]
pub struct FsArgs {
    /// Seed of the whole run [default: chosen at random and printed]
    #[arg(long)]
    seed: Option<u64>,
    /// Crash points to check
    #[arg(long, default_value_t = 2000)]
    points: usize,
    /// Flush policy of the log: reduced, legacy or ail
    #[arg(long, default_value = "reduced")]
    policy: FlushPolicy,
    /// Data ordering: ordered or writeback
    #[arg(long, default_value = "ordered")]
    data: String,
    /// Only this run of the seed (as a failure names it), with the crash points it has there
    #[arg(long)]
    run: Option<u64>,
    /// Run the mount's threads (push worker, AIL worker, concurrent iclog IO, the flusher)
    /// beside the operations; interleavings are replayable only in the scheduled build
    /// (scripts/sched-crashtest)
    #[arg(long)]
    background: bool,
    /// Put the log on its own simulated device
    #[arg(long)]
    external_log: bool,
}

#[derive(Debug, clap::Args)]
pub struct JournalArgs {
    /// Seed of the whole run [default: chosen at random and printed]
    #[arg(long)]
    seed: Option<u64>,
    /// Crash points to check
    #[arg(long, default_value_t = 2000)]
    points: usize,
    /// Flush policy of the log: reduced, legacy or ail
    #[arg(long, default_value = "reduced")]
    policy: FlushPolicy,
    /// Put the log on its own simulated device
    #[arg(long)]
    external_log: bool,
    /// Run the journal's threads as a mount does (push worker, AIL worker, concurrent iclog
    /// IO) with a second committer beside the workload; interleavings are replayable only in
    /// the scheduled build (scripts/sched-crashtest)
    #[arg(long)]
    background: bool,
    /// Make each run's devices fail a write or flush (from then on, or once): what returned
    /// before stays promised, the mount dies and is recovered
    #[arg(long)]
    io_errors: bool,
}

pub fn run(k: Kind) -> Result<(), Failure> {
    match k {
        Kind::Journal(a) => journal(a),
        Kind::Fs(a) => fs(a),
        Kind::Corrupt(a) => corrupt(a),
    }
}

fn random_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

fn fs(a: FsArgs) -> Result<(), Failure> {
    use cilfs_core::fs::DataMode;
    let data = match a.data.as_str() {
        "ordered" => DataMode::Ordered,
        "writeback" => DataMode::Writeback,
        x => {
            return Err(Failure::usage(anyhow::anyhow!(
                "--data {x}: use ordered or writeback"
            )))
        }
    };
    let seed = a.seed.unwrap_or_else(random_seed);
    let replay = format!(
        "{} fs --seed {seed} --points {} --policy {} --data {}{}{}{}",
        command(),
        a.points,
        a.policy,
        a.data,
        a.run.map(|r| format!(" --run {r}")).unwrap_or_default(),
        if a.background { " --background" } else { "" },
        if a.external_log {
            " --external-log"
        } else {
            ""
        }
    );
    eprintln!(
        "crashtest fs: seed {seed}, {} points, policy {}, data={}{}{}",
        a.points,
        a.policy,
        a.data,
        if a.background {
            ", background threads"
        } else {
            ""
        },
        if a.external_log { ", external log" } else { "" }
    );
    let bar = ProgressBar::new(a.points as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} crash points {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let cfg = cilfs_sim::FsCrashConfig {
        seed,
        points: a.points,
        policy: a.policy,
        data,
        only_run: a.run,
        background: a.background,
        external_log: a.external_log,
    };
    let r = cilfs_sim::run_fs_crashtest(&cfg, &mut |done, _| bar.set_position(done as u64));
    bar.finish_and_clear();
    let summary = format!(
        "{} workload runs, {} checkpoints, {} blocks changed role (tree node, xattr value, file \
         data)\n{} xattr values compared byte for byte after recovery, {} of them in blocks that \
         had been tree nodes or file data\n{} KiB of file data put into the log by fsyncs; {} \
         optimistic commits found what they read changed and ran again",
        r.runs,
        r.checkpoints,
        r.blocks_changed_role,
        r.xattr_values_checked,
        r.xattr_values_in_reused_blocks,
        r.data_logged_bytes / 1024,
        r.conflicts
    );
    report(&r, &summary, &replay)
}

/// Prints the failures, a summary, the replay command if anything failed and the final
/// `M passed, F failed` line; exit status 1 if anything failed.
/// The command that replays a run: a scheduled build's own script, whose seeds replay the
/// threads' interleavings too.
fn command() -> &'static str {
    if cilfs_sim::SCHEDULED {
        "scripts/sched-crashtest"
    } else {
        "cilfs crashtest"
    }
}

fn report(r: &cilfs_sim::CrashReport, summary: &str, replay: &str) -> Result<(), Failure> {
    for f in &r.failures {
        println!("FAIL {f}");
    }
    println!("{summary}");
    if cilfs_sim::SCHEDULED {
        // What a replay of the seed must reproduce: every run's IO, byte for byte.
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        r.traces.hash(&mut h);
        println!(
            "scheduled: {} runs' IO traces, fingerprint {:016x}",
            r.traces.len(),
            h.finish()
        );
    }
    if r.failed > 0 {
        println!("replay: {replay}");
    }
    println!("{} passed, {} failed", r.passed, r.failed);
    if r.failed > 0 {
        return Err(Failure::found(anyhow::anyhow!(
            "{} of {} crash points failed",
            r.failed,
            r.passed + r.failed
        )));
    }
    Ok(())
}

fn journal(a: JournalArgs) -> Result<(), Failure> {
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let replay = format!(
        "{} journal --seed {seed} --points {} --policy {}{}{}{}",
        command(),
        a.points,
        a.policy,
        if a.external_log {
            " --external-log"
        } else {
            ""
        },
        if a.background { " --background" } else { "" },
        if a.io_errors { " --io-errors" } else { "" }
    );
    eprintln!(
        "crashtest journal: seed {seed}, {} points, policy {}, {} log{}",
        a.points,
        a.policy,
        if a.external_log {
            "external"
        } else {
            "internal"
        },
        if a.background {
            ", background threads and two committers"
        } else {
            ""
        }
    );
    let bar = ProgressBar::new(a.points as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} crash points {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let cfg = JournalCrashConfig {
        seed,
        points: a.points,
        policy: a.policy,
        external_log: a.external_log,
        background: a.background,
        io_errors: a.io_errors,
    };
    let r = run_journal_crashtest(&cfg, &mut |done, _| bar.set_position(done as u64));
    bar.finish_and_clear();
    let mut summary = format!(
        "{} workload runs, {} checkpoints, log written {} times over",
        r.runs,
        r.checkpoints,
        r.log_laps()
    );
    if a.io_errors {
        summary += &format!("; {} runs met their injected IO error", r.io_errors_met);
    }
    report(&r, &summary, &replay)
}

fn corrupt(a: CorruptArgs) -> Result<(), Failure> {
    let seed = a.seed.unwrap_or_else(random_seed);
    eprintln!(
        "crashtest corrupt: seed {seed}, {} cases{}",
        a.case.map_or(a.cases, |_| 1),
        if a.no_repair { ", no repair" } else { "" }
    );
    let bar = ProgressBar::new(a.case.map_or(a.cases, |_| 1) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} corruptions {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let cfg = cilfs_sim::CorruptConfig {
        seed,
        cases: a.cases,
        only_case: a.case,
        repair: !a.no_repair,
    };
    let r = cilfs_sim::run_corrupt_campaign(&cfg, &mut |done, _| bar.set_position(done as u64))
        .map_err(|e| Failure::usage(anyhow::anyhow!("crashtest corrupt: {e}")))?;
    bar.finish_and_clear();
    for f in &r.failures {
        println!("FAIL {f}");
    }
    println!(
        "{:<18} {:>6} {:>6} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9}",
        "target",
        "cases",
        "found",
        "harmless",
        "refused",
        "read errs",
        "EUCLEAN",
        "tail cut",
        "repaired"
    );
    for (t, s) in &r.targets {
        println!(
            "{:<18} {:>6} {:>6} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9}",
            t.name(),
            s.cases,
            s.found,
            s.harmless,
            s.mount_refused,
            s.mounted_with_errors,
            s.corrupt_errors,
            s.tail_cut,
            format!("{}/{}", s.repaired_clean, s.repaired)
        );
    }
    if !r.lost_per_repair.is_empty() {
        let (median, max) = r.lost_median_max();
        println!(
            "names lost per repaired case: median {median}, max {max} (over {} cases); {} more \
             found whole in /lost+found",
            r.lost_per_repair.len(),
            r.in_lost_found
        );
    }
    let failed = r.failures.len();
    println!("{} cases, {} failed", r.cases, failed);
    if failed > 0 || r.hung {
        return Err(Failure::found(anyhow::anyhow!(
            "{failed} of {} corruptions failed",
            r.cases
        )));
    }
    Ok(())
}
