//! The locks, threads, thread-locals and clock of cilfs's threaded code, in one place so that
//! the code users run can also run under a deterministic scheduler.
//!
//! Every build that runs (the daemon, the tools, the tests) gets parking_lot's locks and std's
//! threads, unchanged: the types below are re-exports. Under `--cfg shuttle` (the deterministic
//! explorers, `scripts/sched-crashtest`) the same names are shuttle's: the real code's threads
//! (operations, the CIL push worker, iclog IO, the AIL worker, the flusher) run as shuttle
//! tasks on one OS thread, every lock, wait, spawn and yield is a point where a seeded
//! scheduler picks the next task, and a seed replays one interleaving exactly.
//!
//! Under shuttle, time is virtual (`time::now`): it moves only when a timed wait times out or a
//! thread sleeps, by the time asked, so that code which decides by elapsed time decides the
//! same way on every replay. A timed wait is a yield that the scheduler's random stream
//! (replayed with the schedule) ends as a timeout one time in 32, else as a spurious wake:
//! callers loop on their condition, as every condition variable's callers must.

#[cfg(not(shuttle))]
mod real;
#[cfg(not(shuttle))]
pub use real::*;

#[cfg(shuttle)]
mod sched;
#[cfg(shuttle)]
pub use sched::*;
