//! The lazy change attribute (docs/journal.md section 6): a 64-bit word, low bit QUERIED, value in
//! the upper 63 bits. A query sets QUERIED; a change bumps the value only if someone queried
//! since the last bump (or the caller forces it because the inode is being logged anyway).

use crate::util::sync::AtomicU64;
use std::sync::atomic::Ordering;

const QUERIED: u64 = 1;

#[derive(Debug)]
pub struct ChangeCounter(AtomicU64);

impl ChangeCounter {
    /// An inode loaded from disk: it may have been observed before a crash, so it starts queried.
    pub fn loaded(value: u64) -> Self {
        ChangeCounter(AtomicU64::new((value << 1) | QUERIED))
    }

    /// A newly created inode: nobody can have seen it.
    pub fn created(value: u64) -> Self {
        ChangeCounter(AtomicU64::new(value << 1))
    }

    /// Returns the value and marks it observed.
    pub fn query(&self) -> u64 {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            if cur & QUERIED != 0 {
                return cur >> 1;
            }
            match self.0.compare_exchange_weak(
                cur,
                cur | QUERIED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return cur >> 1,
                Err(now) => cur = now,
            }
        }
    }

    /// Whether it was queried since its last bump (the next change must bump it).
    pub fn is_queried(&self) -> bool {
        self.0.load(Ordering::Acquire) & QUERIED != 0
    }

    /// The value without marking it observed (to store it).
    pub fn peek(&self) -> u64 {
        self.0.load(Ordering::Acquire) >> 1
    }

    /// A copy to work on (an optimistic operation's private inode).
    pub fn copy(&self) -> Self {
        ChangeCounter(AtomicU64::new(self.0.load(Ordering::Acquire)))
    }

    /// Takes over `other`'s state: the operation that worked on the copy published, and
    /// this counter had not moved since the copy was made (checked under the lock). A query
    /// since the copy was made marked this counter: a copy that did not bump keeps the mark,
    /// or the next change would not bump a value someone saw.
    pub fn adopt(&self, other: &ChangeCounter) {
        let next = other.0.load(Ordering::Acquire);
        debug_assert!(next >> 1 >= self.peek(), "a change counter never goes back");
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                Some(match next >> 1 == cur >> 1 {
                    true => next | (cur & QUERIED),
                    false => next,
                })
            });
    }

    /// Bumps if `force` or queried since the last bump; returns whether it bumped.
    pub fn maybe_increment(&self, force: bool) -> bool {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            if !force && cur & QUERIED == 0 {
                return false;
            }
            let next = ((cur >> 1) + 1) << 1;
            match self
                .0
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn lazy_semantics() {
        let c = ChangeCounter::created(5);
        assert!(!c.maybe_increment(false), "nobody looked: no bump");
        assert_eq!(c.query(), 5);
        assert!(c.maybe_increment(false), "queried: bump");
        assert!(!c.maybe_increment(false), "not queried since");
        assert!(c.query() > 5);
        assert!(c.maybe_increment(true));
        assert_eq!(c.peek(), 7);
        let l = ChangeCounter::loaded(9);
        assert!(l.maybe_increment(false), "loaded inodes start queried");
    }

    /// A copy published over a counter queried since the copy was made: the query's mark
    /// stays unless the copy bumped past the value the query saw.
    #[test]
    fn adopting_a_copy_keeps_a_query_made_since() {
        let c = ChangeCounter::created(3);
        let copy = c.copy();
        assert_eq!(c.query(), 3);
        c.adopt(&copy);
        assert!(c.maybe_increment(false), "the query's mark was lost");
        let bumped = c.copy();
        assert!(bumped.maybe_increment(true));
        assert_eq!(c.query(), 4);
        c.adopt(&bumped);
        assert_eq!(c.peek(), 5);
        assert!(
            !c.maybe_increment(false),
            "a bump past the queried value clears the mark"
        );
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use std::sync::Arc;

    /// Two changes racing a query: no increment is lost, at least one change bumps (the counter
    /// was queried before both), and if the racing query saw the final value the next change
    /// still bumps: a query is never followed by a change that leaves the value unchanged.
    #[test]
    fn loom_change_counter_never_hides_a_change() {
        loom::model(|| {
            let c = Arc::new(ChangeCounter::created(0));
            let seen = c.query();
            let w = |c: &Arc<ChangeCounter>| {
                let c = Arc::clone(c);
                loom::thread::spawn(move || c.maybe_increment(false))
            };
            let w1 = w(&c);
            let w2 = w(&c);
            let c3 = Arc::clone(&c);
            let querier = loom::thread::spawn(move || c3.query());
            let b1 = w1.join().expect("writer");
            let b2 = w2.join().expect("writer");
            let q = querier.join().expect("querier");
            let bumps = u64::from(b1) + u64::from(b2);
            assert!(bumps >= 1);
            assert_eq!(c.peek(), seen + bumps, "no increment lost");
            assert!(q <= c.peek());
            if q == c.peek() {
                assert!(
                    c.maybe_increment(false),
                    "a seen value must change on the next change"
                );
            }
        });
    }
}
