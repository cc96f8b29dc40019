//! The `cilfs` command. Each subcommand lives in `cmd/`; this file parses and dispatches, and owns
//! the exit statuses: 0 success, 1 a check found a problem, 2 bad input or could not run. Run by
//! a helper's name (`mount.fuse.cilfs`, `fsck.cilfs`, `mkfs.cilfs`: see cmd/helpers.rs), it is
//! that helper, with its tool's arguments and exit statuses.

/// Every print of this crate goes through `out`, so that a closed stdout ends the output quietly
/// instead of panicking (see out.rs); this shadows std's `println!` in every module below.
macro_rules! println {
    () => {
        $crate::out::print(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod cmd;
mod out;
mod size;

use clap::{Parser, Subcommand};
use std::io::Write;
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
    /// Tenants: directory trees in projects, and each project's IO limits
    #[command(subcommand)]
    Tenant(cmd::tenant::Command),
    /// Check every structure of a filesystem without writing to it
    Check(cmd::check::Args),
    /// Make a filesystem with a damaged log mountable again: replay the log up to the damage
    /// and discard the rest (as xfs_repair -L), then check
    Repair(cmd::repair::Args),
    /// Print every record and op of the log, like xfs_logprint
    Logprint(cmd::logprint::Args),
    /// Crash-test a layer on simulated devices
    #[command(subcommand)]
    Crashtest(cmd::crashtest::Kind),
    /// Benchmarks that print one JSON object of figures
    #[command(subcommand)]
    Bench(cmd::bench::Kind),
    /// Link mount.fuse.cilfs, mount.cilfs, fsck.cilfs and mkfs.cilfs to this binary (for mount(8),
    /// fstab, fsck(8) and mkfs(8))
    InstallHelpers(cmd::helpers::InstallArgs),
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
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some((name, helper)) = args.first().and_then(|a| cmd::helpers::called_as(a)) {
        return finish(name, cmd::helpers::run(helper, name, &args[1..]));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // A usage error is one line like every other error (clap adds the usage and a tip);
        // help and version, asked for or shown for a bare `cilfs`, print in full.
        Err(e)
            if e.use_stderr()
                && e.kind() != clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            return finish("cilfs", Err(Failure::usage(anyhow::anyhow!(clap_line(&e)))));
        }
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Mkfs(a) => cmd::mkfs::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Mount(a) => cmd::mount::run(a),
        Command::Unmount(a) => cmd::unmount::run(a),
        Command::Stat(a) => cmd::stat::run(a),
        Command::Tenant(c) => cmd::tenant::run(c),
        Command::Check(a) => cmd::check::run(a),
        Command::Repair(a) => cmd::repair::run(a),
        Command::Logprint(a) => cmd::logprint::run(a),
        Command::Crashtest(k) => cmd::crashtest::run(k),
        Command::Bench(k) => cmd::bench::run(k),
        Command::InstallHelpers(a) => cmd::helpers::install(a),
    };
    finish("cilfs", result)
}

/// Prints the failure, if any, as `name: error` on one line and gives its status. Output that
/// could not be written (other than to a reader that went away) is a failure too.
fn finish(name: &str, result: Result<(), Failure>) -> ExitCode {
    out::flush();
    let result = match (result, out::failure()) {
        (Ok(()), Some(e)) => Err(Failure::usage(
            anyhow::Error::new(e).context("writing to standard output"),
        )),
        (result, _) => result,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // Not eprintln!: a closed stderr must not turn a failure into a panic.
            let _ = writeln!(std::io::stderr(), "{name}: {}", one_line(&f.error));
            ExitCode::from(f.status)
        }
    }
}

/// A clap error's message without the usage and tips clap adds, for a one-line error.
fn clap_line(e: &clap::Error) -> String {
    // The first paragraph: the message and what it lists ("required arguments were not
    // provided:" and the arguments on the lines after).
    let text = e.to_string();
    let words: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    words.join(" ").trim_start_matches("error: ").to_string()
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
