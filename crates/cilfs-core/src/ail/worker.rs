//! The AIL pusher thread (XFS's xfsaild): writes items back in place ahead of need so that the
//! push worker never waits for metadata writeback, and reservations rarely have to. The passes
//! themselves are the journal's (`Journal::ail_push_ahead`, `Journal::relieve_waiters`), which
//! hands them in at start: this thread only decides when they run.

use cilfs_sync::thread::JoinHandle;
use cilfs_sync::{Condvar, Mutex};
use std::sync::{Arc, Weak};

#[derive(Debug, Default)]
struct State {
    kicked: bool,
    /// A reservation is waiting for log space.
    urgent: bool,
    stop: bool,
}

#[derive(Debug)]
pub(crate) struct AilWorker {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl AilWorker {
    /// Starts the thread for `owner` (the journal), held weakly: each pass upgrades it and
    /// runs `pass(owner, urgent)`, `urgent` when a reservation waits for log space (relief
    /// first) and else an ordinary pass ahead of need. The thread ends when `pass` returns
    /// false, when the owner is gone, or at `stop`.
    pub(crate) fn start<T: Send + Sync + 'static>(
        owner: &Arc<T>,
        pass: impl Fn(&T, bool) -> bool + Send + 'static,
    ) -> Self {
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let weak: Weak<T> = Arc::downgrade(owner);
        let s = Arc::clone(&shared);
        let thread = cilfs_sync::thread::spawn_named("cilfs-ail", move || loop {
            let urgent = {
                let mut st = s.0.lock();
                while !st.kicked && !st.urgent && !st.stop {
                    s.1.wait(&mut st);
                }
                if st.stop {
                    return;
                }
                // Relief first; an ordinary kick stays set for the pass after it.
                if !st.urgent {
                    st.kicked = false;
                }
                std::mem::take(&mut st.urgent)
            };
            let Some(owner) = weak.upgrade() else { return };
            if !pass(&owner, urgent) {
                return;
            }
        })
        .ok();
        Self { shared, thread }
    }

    /// Asks for a pass: the thread checks free log space and cache size and writes back.
    pub(crate) fn kick(&self) {
        self.shared.0.lock().kicked = true;
        self.shared.1.notify_one();
    }

    /// Asks for space for a waiting reservation (see `Journal::relieve_waiters`).
    pub(crate) fn kick_urgent(&self) {
        self.shared.0.lock().urgent = true;
        self.shared.1.notify_one();
    }

    pub(crate) fn stop(mut self) {
        self.shared.0.lock().stop = true;
        self.shared.1.notify_one();
        if let Some(t) = self.thread.take() {
            // It may itself have dropped the last reference to the journal.
            if t.thread().id() != cilfs_sync::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
