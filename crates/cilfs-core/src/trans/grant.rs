//! The reserve grant head: log space handed to transactions in FIFO order (docs/journal.md section 4).
//!
//! `in_use` is what the journal says is taken (log between the safe tail and the head, plus the
//! charges of unwritten CIL contexts); `reserved` is what open transactions hold. A transaction
//! that does not fit queues behind every earlier one; the one at the head of the queue calls the
//! journal back to make space (write the AIL back, push the CIL, flush), the others sleep.

use crate::util::sync::{lock, rank, wait, Condvar, Mutex, MutexGuard, Ranked};
use std::collections::VecDeque;

#[derive(Debug, Default)]
pub struct GrantState {
    pub capacity: u64,
    pub reserved: u64,
    pub in_use: u64,
    waiters: VecDeque<u64>,
    next_ticket: u64,
    shut_down: bool,
    /// Bumped by every change, so a waiter that dropped the lock to make space can tell whether
    /// it missed a wakeup meanwhile.
    version: u64,
}

impl GrantState {
    /// Reservations waiting for space now.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.in_use + self.reserved)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum ReserveError<E> {
    /// More than a quarter of the log: it could never be granted while anything else runs.
    TooLarge {
        need: u64,
        max: u64,
    },
    ShutDown,
    MakeSpace(E),
}

#[derive(Debug)]
pub struct GrantHead {
    state: Mutex<GrantState>,
    changed: Condvar,
    /// Contention on `state`'s lock (the lock table's `grant head`): every transaction takes
    /// it to reserve and again to commit.
    pub waits: crate::util::lockstat::LockWaits,
}

impl GrantHead {
    /// `state` locked, its waits counted.
    fn locked(&self) -> Ranked<MutexGuard<'_, GrantState>, { rank::GRANT }> {
        Ranked::acquire(|| {
            self.waits
                .acquire(|| self.state.try_lock().ok(), || lock(&self.state))
        })
    }

    pub fn new(capacity: u64) -> Self {
        Self {
            state: Mutex::new(GrantState {
                capacity,
                ..Default::default()
            }),
            changed: Condvar::new(),
            waits: crate::util::lockstat::LockWaits::new("grant head"),
        }
    }

    /// Takes `unit` bytes in FIFO order; returns how long it waited, if it had to. While at the
    /// head of the queue and short of space it calls `make_space` (without the lock held), which
    /// returns whether it made progress; otherwise it sleeps until the state changes.
    pub fn reserve<E>(
        &self,
        unit: u64,
        mut make_space: impl FnMut() -> Result<bool, E>,
    ) -> Result<Option<std::time::Duration>, ReserveError<E>> {
        let mut g = self.locked();
        let max = g.capacity / 4;
        if unit > max {
            return Err(ReserveError::TooLarge { need: unit, max });
        }
        // Nobody queued and it fits: granted at once, without a ticket (the queue's buffer is
        // one more cache line every commit would pass between the cores).
        if !g.shut_down && g.waiters.is_empty() && g.available() >= unit {
            g.reserved += unit;
            g.version += 1;
            return Ok(None);
        }
        let ticket = g.next_ticket;
        g.next_ticket += 1;
        g.waiters.push_back(ticket);
        let mut waiting_since = None;
        loop {
            if g.shut_down {
                g.waiters.retain(|&t| t != ticket);
                drop(g);
                self.changed.notify_all();
                return Err(ReserveError::ShutDown);
            }
            let first = g.waiters.front() == Some(&ticket);
            if first && g.available() >= unit {
                g.waiters.pop_front();
                g.reserved += unit;
                g.version += 1;
                let next_in_line = !g.waiters.is_empty();
                drop(g);
                // The next in line may fit too.
                if next_in_line {
                    self.changed.notify_all();
                }
                return Ok(waiting_since.map(|t: std::time::Instant| {
                    cilfs_sync::time::now().saturating_duration_since(t)
                }));
            }
            waiting_since.get_or_insert_with(cilfs_sync::time::now);
            if first {
                let seen = g.version;
                drop(g);
                let progress = make_space();
                g = self.locked();
                match progress {
                    Ok(true) => continue,
                    // Something changed while the lock was dropped: its wakeup went to nobody.
                    Ok(false) if g.version != seen => continue,
                    Ok(false) => {}
                    Err(e) => {
                        g.waiters.retain(|&t| t != ticket);
                        drop(g);
                        self.changed.notify_all();
                        return Err(ReserveError::MakeSpace(e));
                    }
                }
            }
            g = g.map_guard(|g| wait(&self.changed, g));
        }
    }

    /// Reserves `unit` only if it fits now and nobody waits ahead of it (the queue stays FIFO):
    /// never sleeps and never makes space. `Ok(false)`: the caller must wait (`reserve`)
    /// somewhere it holds no lock another operation needs, then try again.
    pub fn try_reserve(&self, unit: u64) -> Result<bool, ReserveError<std::convert::Infallible>> {
        let mut g = self.locked();
        let max = g.capacity / 4;
        if unit > max {
            return Err(ReserveError::TooLarge { need: unit, max });
        }
        if g.shut_down {
            return Err(ReserveError::ShutDown);
        }
        if !g.waiters.is_empty() || g.available() < unit {
            return Ok(false);
        }
        g.reserved += unit;
        g.version += 1;
        Ok(true)
    }

    /// Changes the state (reservations returned, space freed or taken) and wakes the waiters.
    ///
    /// Only a queue with someone in it is woken: every commit comes through here, and a
    /// wakeup is a system call even when nobody sleeps. A waiter is in the queue before it
    /// first looks at the state, under the same lock, so none can miss this change.
    pub fn update<R>(&self, f: impl FnOnce(&mut GrantState) -> R) -> R {
        let (r, waiters) = {
            let mut g = self.locked();
            g.version += 1;
            (f(&mut g), !g.waiters.is_empty())
        };
        if waiters {
            self.changed.notify_all();
        }
        r
    }

    pub fn release(&self, unit: u64) {
        self.update(|g| {
            assert!(
                g.reserved >= unit,
                "releasing {unit} of {} reserved bytes",
                g.reserved
            );
            g.reserved -= unit;
        });
    }

    pub fn read<R>(&self, f: impl FnOnce(&GrantState) -> R) -> R {
        f(&self.locked())
    }

    /// Fails every waiter and every later reservation.
    pub fn shut_down(&self) {
        self.update(|g| g.shut_down = true);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Arc;

    #[test]
    fn too_large_and_shutdown() {
        let g = GrantHead::new(100);
        assert!(matches!(
            g.reserve::<()>(26, || Ok(false)),
            Err(ReserveError::TooLarge { need: 26, max: 25 })
        ));
        assert_eq!(g.reserve::<()>(25, || Ok(false)), Ok(None));
        g.shut_down();
        assert_eq!(
            g.reserve::<()>(1, || Ok(false)),
            Err(ReserveError::ShutDown)
        );
    }

    #[test]
    fn a_reservation_that_fits_still_queues_behind_a_waiter() {
        let g = Arc::new(GrantHead::new(100));
        g.update(|s| s.in_use = 80);
        let first = {
            let g = Arc::clone(&g);
            std::thread::spawn(move || g.reserve::<()>(25, || Ok(false)).map(|_| ()))
        };
        while g.read(|s| s.waiting()) == 0 {
            std::thread::yield_now();
        }
        // 20 free: 10 would fit, but the waiter for 25 came first.
        let second = {
            let g = Arc::clone(&g);
            std::thread::spawn(move || g.reserve::<()>(10, || Ok(false)).map(|_| ()))
        };
        while g.read(|s| s.waiting()) < 2 {
            assert!(!second.is_finished(), "the second passed the first waiter");
            std::thread::yield_now();
        }
        assert_eq!(g.read(|s| s.reserved), 0);
        g.update(|s| s.in_use = 0);
        first.join().unwrap().unwrap();
        second.join().unwrap().unwrap();
        assert_eq!(g.read(|s| s.reserved), 35);
    }

    #[test]
    fn try_reserve_takes_only_what_fits_now_and_never_passes_a_waiter() {
        let g = Arc::new(GrantHead::new(100));
        assert!(matches!(
            g.try_reserve(26),
            Err(ReserveError::TooLarge { need: 26, max: 25 })
        ));
        assert_eq!(g.try_reserve(25), Ok(true));
        g.update(|s| s.in_use = 70);
        assert_eq!(g.try_reserve(10), Ok(false), "5 left");
        assert_eq!(g.try_reserve(5), Ok(true));
        g.release(30);
        // A waiter queued for 25 with 20 free: a try that would fit still must not pass it.
        g.update(|s| s.in_use = 80);
        let w = {
            let g = Arc::clone(&g);
            std::thread::spawn(move || g.reserve::<()>(25, || Ok(false)).map(|_| ()))
        };
        while g.read(|s| s.waiters.is_empty()) {
            std::thread::yield_now();
        }
        assert_eq!(g.try_reserve(10), Ok(false), "the waiter comes first");
        g.update(|s| s.in_use = 0);
        w.join().unwrap().unwrap();
        assert_eq!(g.try_reserve(10), Ok(true));
        g.shut_down();
        assert_eq!(g.try_reserve(1), Err(ReserveError::ShutDown));
    }

    #[test]
    fn waiters_are_served_in_order() {
        let g = Arc::new(GrantHead::new(100));
        g.update(|s| s.in_use = 100);
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for i in 0..4u64 {
            let (g2, order) = (Arc::clone(&g), Arc::clone(&order));
            threads.push(std::thread::spawn(move || {
                g2.reserve::<()>(10, || Ok(false)).unwrap();
                // Only one fits at a time: the next is granted after this release, so the order
                // recorded here is the grant order.
                order.lock().unwrap().push(i);
                g2.release(10);
            }));
            // Queue them one after another.
            while g.read(|s| s.waiters.len()) < (i + 1) as usize {
                std::thread::yield_now();
            }
        }
        g.update(|s| s.in_use = 85);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(g.read(|s| s.reserved), 0);
    }
}

/// Model checks with loom: `RUSTFLAGS="--cfg loom" cargo test -p cilfs-core --release grant`.
#[cfg(all(test, loom))]
mod loom_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use loom::sync::Arc;

    /// Explores every interleaving with up to three preemptions (loom's usual bound: bugs seldom
    /// need more, and the full space of four threads with condvars is too large to finish).
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    /// Two reservations that cannot both fit, and a third thread freeing space: whatever the
    /// interleaving, both are granted (no lost wakeup), never more than the capacity is handed
    /// out, and the one that queued first is granted first.
    #[test]
    fn fifo_no_lost_wakeup_never_over_capacity() {
        model(|| {
            let g = Arc::new(GrantHead::new(40));
            g.update(|s| s.in_use = 30);
            let granted = Arc::new(loom::sync::Mutex::new(Vec::new()));
            let mut hs = Vec::new();
            for i in 0..2u64 {
                let (g, granted) = (Arc::clone(&g), Arc::clone(&granted));
                hs.push(loom::thread::spawn(move || {
                    g.reserve::<()>(10, || Ok(false)).unwrap();
                    let r = g.read(|s| s.reserved + s.in_use);
                    assert!(r <= 40, "over capacity: {r}");
                    granted.lock().unwrap().push(i);
                    g.release(10);
                }));
            }
            let freer = {
                let g = Arc::clone(&g);
                loom::thread::spawn(move || g.update(|s| s.in_use = 20))
            };
            for h in hs {
                h.join().unwrap();
            }
            freer.join().unwrap();
            assert_eq!(granted.lock().unwrap().len(), 2);
            assert_eq!(g.read(|s| s.reserved), 0);
        });
    }

    /// The head of the queue makes space itself; a second waiter behind it is woken when it does.
    #[test]
    fn head_of_queue_makes_space() {
        model(|| {
            let g = Arc::new(GrantHead::new(40));
            g.update(|s| s.in_use = 40);
            let mut hs = Vec::new();
            for _ in 0..2 {
                let g = Arc::clone(&g);
                hs.push(loom::thread::spawn(move || {
                    let g2 = Arc::clone(&g);
                    g.reserve::<()>(10, move || {
                        g2.update(|s| s.in_use = s.in_use.saturating_sub(10));
                        Ok(true)
                    })
                    .unwrap();
                }));
            }
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(g.read(|s| s.reserved), 20);
        });
    }
}
