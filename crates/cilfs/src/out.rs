//! Standard output for every command. A reader that goes away (`cilfs info IMG | head -1`) ends
//! the output quietly: std's `println!` panics on EPIPE (exit 101), because Rust ignores SIGPIPE.
//! Restoring SIGPIPE's default instead would need unsafe code, and would let a closed pipe kill
//! the mount daemon, which writes its readiness to a pipe and must outlive the process reading
//! it. So writes go through here: after a broken pipe nothing more is printed and the command
//! runs on to its own exit status (a check still exits 1 on a bad image); any other write error
//! (a full disk under `> file`) is reported once by `main` with exit status 2.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static CLOSED: AtomicBool = AtomicBool::new(false);
static FAILED: Mutex<Option<std::io::Error>> = Mutex::new(None);

/// What `println!` and `print!` expand to in this crate (see main.rs).
pub fn print(args: std::fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args) {
        stop(e);
    }
}

/// Flushes what `print!` left without a newline; called by `main` before it exits.
pub fn flush() {
    if !CLOSED.load(Ordering::Relaxed) {
        if let Err(e) = std::io::stdout().flush() {
            stop(e);
        }
    }
}

fn stop(e: std::io::Error) {
    CLOSED.store(true, Ordering::Relaxed);
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        if let Ok(mut failed) = FAILED.lock() {
            failed.get_or_insert(e);
        }
    }
}

/// Prints nothing more: a mount(8) helper is silent when all goes well.
pub fn quiet() {
    CLOSED.store(true, Ordering::Relaxed);
}

/// Whether standard output is gone: a command that would print forever (`stat --watch`) stops.
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// A write error other than a closed pipe, for `main` to report.
pub fn failure() -> Option<std::io::Error> {
    FAILED.lock().ok().and_then(|mut f| f.take())
}
