//! The `cilfs` command. Each subcommand lives in `cmd/`; this file parses and dispatches, and owns
//! the exit statuses: 0 success, 1 a check found a problem, 2 bad input or could not run.

mod cmd;
mod size;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

// glibc's malloc spent a third of a million-entry directory run in `_int_malloc` walking
// fragmented bins (B+tree nodes decode into many short-lived vectors); mimalloc does not.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "cilfs",
    version,
    about = "A crash-safe journaling filesystem in userspace"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make a filesystem on an image file or a block device
    Mkfs(cmd::mkfs::Args),
    /// Print the geometry of a filesystem, like xfs_info
    Info(cmd::info::Args),
    /// Mount a filesystem through FUSE (recovering its log if needed)
    Mount(cmd::mount::Args),
    /// Unmount, returning once the image is clean
    Unmount(cmd::unmount::Args),
    /// Live counters of a mounted filesystem, or a file's change attribute
    Stat(cmd::stat::Args),
    /// Check every structure of a filesystem without writing to it
    Check(cmd::check::Args),
    /// Print every record and op of the log, like xfs_logprint
    Logprint(cmd::logprint::Args),
    /// Crash-test a layer on simulated devices
    #[command(subcommand)]
    Crashtest(cmd::crashtest::Kind),
    /// Benchmarks that print one JSON object of figures
    #[command(subcommand)]
    Bench(cmd::bench::Kind),
}

/// A failure with the exit status it maps to.
#[derive(Debug)]
pub struct Failure {
    pub status: u8,
    pub error: anyhow::Error,
}

impl Failure {
    /// A check ran and found problems.
    pub fn found(error: impl Into<anyhow::Error>) -> Self {
        Self {
            status: 1,
            error: error.into(),
        }
    }

    /// Bad input or could not run.
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Self {
            status: 2,
            error: error.into(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Mkfs(a) => cmd::mkfs::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Mount(a) => cmd::mount::run(a),
        Command::Unmount(a) => cmd::unmount::run(a),
        Command::Stat(a) => cmd::stat::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Logprint(a) => cmd::logprint::run(a),
        Command::Crashtest(k) => cmd::crashtest::run(k),
        Command::Bench(k) => cmd::bench::run(k),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("cilfs: {:#}", f.error);
            ExitCode::from(f.status)
        }
    }
}
