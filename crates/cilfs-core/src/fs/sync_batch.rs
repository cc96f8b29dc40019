//! Group commit for fsync across threads, as jbd2 batches synchronous handles
//! (`jbd2_journal_stop` in fs/jbd2/transaction.c): a fsync whose data is written and committed
//! waits a moment for another thread's fsync before it forces the log and flushes, so that both
//! share one device flush.
//!
//! Without it two threads that fsync in turn never share a flush: while one flushes, the other
//! writes and then finds the flush started before its write completed, so it needs one of its
//! own, and each flush covers one fsync (two threads did 1.33x one thread in `cilfs bench fs
//! --workload fsync`). Three or more threads share flushes anyway; two need the wait.
//!
//! A fsync waits only when another thread finished a fsync lately (a load of concurrent
//! fsyncs), never for its own thread's (one thread fsyncing in a loop never waits), and for no
//! longer than a force and flush take on average, capped at `WAIT_MAX`. An arrival ends the
//! wait at once. The wait only delays a fsync: what it makes durable, and when it returns
//! relative to its data, do not change.

use parking_lot::{Condvar, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// The longest a fsync waits for a companion.
const WAIT_MAX: Duration = Duration::from_millis(5);

/// Threads remembered as having fsynced lately.
const RECENT: usize = 4;

/// How a fsync came through [`SyncBatch::gather`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gathered {
    /// No other thread fsyncs lately: it went on alone at once.
    Alone,
    /// Another fsync was waiting for a companion: it went on at once, and so did the waiter.
    Joined,
    /// It waited and another fsync came.
    Companion,
    /// It waited for the average flush time and nobody came.
    TimedOut,
}

#[derive(Debug, Default)]
struct State {
    /// Fsyncs that reached their flush so far: a waiter watches this move.
    arrivals: u64,
    /// Fsyncs waiting for a companion now.
    waiting: u32,
    /// The threads that finished a fsync lately, and when.
    recent: [Option<(ThreadId, Instant)>; RECENT],
    /// How long a force and flush take, averaged (ns).
    flush_ns: u64,
}

/// See the module comment.
#[derive(Debug, Default)]
pub(crate) struct SyncBatch {
    state: Mutex<State>,
    arrived: Condvar,
}

impl SyncBatch {
    /// Called by a fsync whose data is written and committed, before it forces and flushes.
    pub(crate) fn gather(&self) -> Gathered {
        self.gather_with(WAIT_MAX)
    }

    fn gather_with(&self, wait_max: Duration) -> Gathered {
        let me = std::thread::current().id();
        let mut s = self.state.lock();
        s.arrivals += 1;
        if s.waiting > 0 {
            self.arrived.notify_all();
            return Gathered::Joined;
        }
        let wait = Duration::from_nanos(s.flush_ns).min(wait_max);
        // Lately: within a few flushes, the time another thread's fsync loop takes to come
        // round again.
        let lately = wait * 4;
        let now = Instant::now();
        let others = s
            .recent
            .iter()
            .flatten()
            .any(|&(t, end)| t != me && now.duration_since(end) <= lately);
        if !others || wait.is_zero() {
            return Gathered::Alone;
        }
        let seen = s.arrivals;
        let deadline = now + wait;
        s.waiting += 1;
        while s.arrivals == seen {
            if self.arrived.wait_until(&mut s, deadline).timed_out() {
                break;
            }
        }
        s.waiting -= 1;
        if s.arrivals == seen {
            Gathered::TimedOut
        } else {
            Gathered::Companion
        }
    }

    /// A fsync's force and flush, begun at `started`, are done.
    pub(crate) fn done(&self, started: Instant) {
        let me = std::thread::current().id();
        let end = Instant::now();
        let took = u64::try_from(end.duration_since(started).as_nanos()).unwrap_or(u64::MAX);
        let mut s = self.state.lock();
        // An eighth of each new figure, as jbd2 averages its commit time.
        s.flush_ns = if s.flush_ns == 0 {
            took
        } else {
            s.flush_ns - s.flush_ns / 8 + took / 8
        };
        // This thread's entry, else an empty one, else the oldest.
        let slot = s
            .recent
            .iter()
            .position(|r| r.is_some_and(|(t, _)| t == me))
            .or_else(|| s.recent.iter().position(Option::is_none))
            .or_else(|| {
                s.recent
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, r)| r.map(|(_, e)| e))
                    .map(|(i, _)| i)
            })
            .unwrap_or(0);
        s.recent[slot] = Some((me, end));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Arc;

    /// Long enough that a test passing by timing out would take minutes: these tests never
    /// depend on a wait ending by the clock.
    const FOREVER: Duration = Duration::from_secs(600);

    fn batch_with_history(flush: Duration) -> Arc<SyncBatch> {
        let b = Arc::new(SyncBatch::default());
        b.state.lock().flush_ns = u64::try_from(flush.as_nanos()).unwrap();
        b
    }

    #[test]
    fn one_thread_fsyncing_in_a_loop_never_waits() {
        let b = batch_with_history(FOREVER);
        for _ in 0..3 {
            let t = Instant::now();
            assert_eq!(b.gather_with(FOREVER), Gathered::Alone);
            b.done(t);
        }
    }

    #[test]
    fn a_fsync_after_another_threads_waits_until_a_companion_arrives() {
        let b = batch_with_history(FOREVER);
        // Another thread fsynced just now.
        let other = Arc::clone(&b);
        std::thread::spawn(move || other.done(Instant::now()))
            .join()
            .unwrap();
        b.state.lock().flush_ns = u64::try_from(FOREVER.as_nanos()).unwrap();
        let waiter = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.gather_with(FOREVER))
        };
        while b.state.lock().waiting == 0 {
            std::thread::yield_now();
        }
        // The companion goes on at once, and releases the waiter.
        assert_eq!(b.gather_with(FOREVER), Gathered::Joined);
        assert_eq!(waiter.join().unwrap(), Gathered::Companion);
        assert_eq!(b.state.lock().waiting, 0);
    }

    #[test]
    fn with_no_flush_measured_yet_nobody_waits() {
        let b = Arc::new(SyncBatch::default());
        let other = Arc::clone(&b);
        std::thread::spawn(move || {
            let t = Instant::now();
            other.done(t);
        })
        .join()
        .unwrap();
        b.state.lock().flush_ns = 0;
        assert_eq!(b.gather_with(FOREVER), Gathered::Alone);
    }
}
