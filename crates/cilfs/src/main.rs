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
            eprintln!("cilfs: {}", one_line(&f.error));
            ExitCode::from(f.status)
        }
    }
}

/// The error and its causes on one line, each said once. Many errors already end with their
/// cause ("cannot open X: No such file or directory" with that io::Error as its source), and
/// anyhow's `{:#}` would append it again.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::one_line;
    use anyhow::Context;

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot open x: {}", self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn enoent() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::NotFound)
    }

    #[test]
    fn each_cause_once() {
        // A cause the message already states is not repeated...
        let e = anyhow::Error::new(Wrapped(enoent()));
        assert_eq!(one_line(&e), "cannot open x: entity not found");
        // ...one it does not state still is, and so is a context's.
        let e = Err::<(), _>(enoent()).context("reading y").unwrap_err();
        assert_eq!(one_line(&e), "reading y: entity not found");
        let e = Err::<(), _>(Wrapped(enoent()))
            .context("mounting")
            .unwrap_err();
        assert_eq!(one_line(&e), "mounting: cannot open x: entity not found");
    }
}
