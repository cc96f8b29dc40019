//! A loom model of how optimistic commits publish side by side under the shared state lock.
//! The order of the steps is the production code's, run here on loom's locks:
//! - `fs::txn::publish::retry`: optimistic runs, then, after conflicts in a row, one under the
//!   state lock exclusive (`Fs::with_shared_tx`);
//! - `fs::txn::publish::publish`: the turn first and only tries under it for a structural
//!   commit, falling back to the locks first and the turn after; the read-set check with the
//!   locks held; a commit of leaves publishing before it inserts, without the turn
//!   (`shared_tx.rs::publish_shared`);
//! - `trans::publish::lock_in_block_order` and `read_set_locked`: the blocks written locked
//!   in block order at the versions seen, the blocks only read looked at, never waited for,
//!   after a full fence (`Transaction::lock_changed`, `read_set_locked`).
//!
//! What the model stands in for: a block (its lock, value and published version, in place
//! of `Buf`, whose parking_lot lock loom cannot see into), the header's count and the CIL
//! (`FsTx::insert_shared`: the header's lock, then the CIL's, two holds), and a transaction's
//! build (each block read under its lock for a moment, its version noted, and what it
//! writes computed from what it read).
//!
//! What must hold (what recovery needs): every prefix of the CIL, the state a checkpoint
//! boundary could leave after a crash, is the state some serial run of the transactions in it
//! would leave, and the header's count in it, replayed as the push does (bytes a commit wrote
//! set it unless they list it; each commit's change moves it), counts exactly them. A commit
//! adds its count to the header in memory and inserts into the CIL in two holds, as the real
//! one does, so one that writes the header's bytes may encode a count whose insert comes
//! after its own: the model whose bytes do not list the count must fail. The model without the
//! read-set lock check lets two commits each miss the other's write (write skew): its test
//! expects loom to find that.

use crate::fs::txn::publish::{publish, retry, Publish};
use crate::trans::publish::{lock_in_block_order, read_set_locked, PublishBlock, Wanted};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::convert::Infallible;

/// Conflicts in a row before a transaction runs under the exclusive state lock: fewer than
/// the filesystem's (`shared_tx.rs`), which loom's search would not get through.
const CONFLICTS_MAX: u32 = 2;

struct Block {
    /// The block's lock (`Buf`'s reader-writer lock): 0 free, `WRITER` held exclusively, else
    /// the number of readers. A count under a mutex rather than loom's `RwLock`, which takes a
    /// thread whose next step is a `try_write` as blocked once another thread locks it, and so
    /// reports a deadlock where the real `try_write` would have returned at once. Waiters
    /// sleep on `freed` (no spinning, which loom cannot bound): a cycle of waits is a deadlock
    /// loom reports.
    lock: Mutex<u64>,
    freed: Condvar,
    /// The value, read and written under `lock` (the mutex is only held for the access).
    data: Mutex<u64>,
    /// The published version, readable without the lock (`Buf::version`).
    version: AtomicU64,
}

const WRITER: u64 = u64::MAX;

impl Block {
    fn new() -> Self {
        Block {
            lock: Mutex::new(0),
            freed: Condvar::new(),
            data: Mutex::new(0),
            version: AtomicU64::new(0),
        }
    }

    /// The count after taking the lock from `cur`, if it can be taken now.
    fn taken(write: bool, cur: u64) -> Option<u64> {
        match (write, cur) {
            (true, 0) => Some(WRITER),
            (false, n) if n != WRITER => Some(n + 1),
            _ => None,
        }
    }

    fn try_lock(&self, write: bool) -> Option<Held<'_>> {
        let mut cur = self.lock.lock().unwrap();
        *cur = Self::taken(write, *cur)?;
        Some(Held { block: self, write })
    }

    fn lock(&self, write: bool) -> Held<'_> {
        let mut cur = self.lock.lock().unwrap();
        loop {
            if let Some(next) = Self::taken(write, *cur) {
                *cur = next;
                return Held { block: self, write };
            }
            cur = self.freed.wait(cur).unwrap();
        }
    }
}

/// A loom guard not dropped while its thread unwinds: loom panics in the drop of a guard
/// after it found a deadlock, and a panic in a destructor during unwinding aborts every test.
struct Quiet<G>(Option<G>);

impl<G> Quiet<G> {
    fn new(g: G) -> Self {
        Quiet(Some(g))
    }
}

impl<G> Drop for Quiet<G> {
    fn drop(&mut self) {
        if let Some(g) = self.0.take() {
            if std::thread::panicking() {
                std::mem::forget(g);
            }
        }
    }
}

/// A hold of a block's lock, let go when dropped.
struct Held<'a> {
    block: &'a Block,
    write: bool,
}

impl Held<'_> {
    fn get(&self) -> u64 {
        *self.block.data.lock().unwrap()
    }

    fn set(&self, v: u64) {
        assert!(self.write);
        *self.block.data.lock().unwrap() = v;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Unwinding from a deadlock loom found, its locks must not be touched (`Quiet`).
        if std::thread::panicking() {
            return;
        }
        let mut cur = self.block.lock.lock().unwrap();
        *cur = if self.write { 0 } else { *cur - 1 };
        self.block.freed.notify_all();
    }
}

struct Store {
    state: RwLock<()>,
    blocks: Vec<Block>,
    /// The publish turn, which structural commits alone take.
    turn: Mutex<()>,
    /// The header's count in memory (`FsState.hdr`): what a commit adds to it, and what a
    /// commit writing the header's bytes encodes.
    hdr: Mutex<u64>,
    /// The CIL in insert order, under its lock.
    cil: Mutex<Vec<Entry>>,
    /// Whether a write of the header's bytes lists the count (`Header::counter_changes`);
    /// false is the model of the bug a review found, for the test that shows the model
    /// finds it.
    bytes_list_the_count: bool,
    /// Each transaction's reads as it saw them when it committed: (block, value).
    seen: Mutex<Vec<(usize, Vec<(usize, u64)>)>>,
}

/// A commit in the CIL, with its late write of the header: its change of the count, and,
/// for one that writes the header's bytes, the count they carry and whether it lists the
/// count (then the push keeps the count around the bytes).
#[derive(Clone, Copy, Debug)]
struct Entry {
    id: usize,
    delta: u64,
    bytes: Option<u64>,
    listed: bool,
}

/// A transaction: reads `reads`, writes `writes`, each written block getting a value made from
/// everything it read and its id (so a stale read shows in the result).
#[derive(Clone)]
struct Txn {
    id: usize,
    reads: Vec<usize>,
    writes: Vec<usize>,
    /// Takes the turn before its blocks (`publish_shared`'s commits that are not leaves only).
    structural: bool,
    /// The model of a wrong order, for the test that shows the model finds it: a structural
    /// commit that waits for its blocks under the turn instead of trying them.
    waits_under_turn: bool,
}

impl Txn {
    /// A commit of leaves only: its blocks, then the CIL, no turn.
    fn leaf(id: usize, reads: Vec<usize>, writes: Vec<usize>) -> Self {
        Txn {
            id,
            reads,
            writes,
            structural: false,
            waits_under_turn: false,
        }
    }

    fn value(&self, seen: &[(usize, u64)]) -> u64 {
        seen.iter().fold((self.id as u64 + 1) * 1000, |a, &(b, v)| {
            a * 31 + v * 7 + b as u64 + 1
        })
    }

    fn touched(&self) -> Vec<usize> {
        let mut t: Vec<usize> = self.reads.iter().chain(&self.writes).copied().collect();
        t.sort_unstable();
        t.dedup();
        t
    }
}

/// A model block as the production lock rules see it (`trans::publish::PublishBlock`).
struct ModelLock<'s> {
    block: &'s Block,
    blkno: u64,
    /// The model of a wrong order: a try that waits (`Txn::waits_under_turn`).
    try_waits: bool,
    /// False: the model of a commit that does not look at its read set's locks.
    read_locks_seen: bool,
}

impl<'s> PublishBlock for ModelLock<'s> {
    type Guard = Held<'s>;

    fn blkno(&self) -> u64 {
        self.blkno
    }

    fn lock(&self) -> Held<'s> {
        self.block.lock(true)
    }

    fn try_lock(&self) -> Option<Held<'s>> {
        match self.try_waits {
            true => Some(self.block.lock(true)),
            false => self.block.try_lock(true),
        }
    }

    fn version(g: &Held<'s>) -> u64 {
        g.block.version.load(Ordering::Acquire)
    }

    fn locked_exclusive(&self) -> bool {
        self.read_locks_seen && *self.block.lock.lock().unwrap() == WRITER
    }
}

/// One optimistic commit of a model transaction, published by the production sequence
/// (`fs::txn::publish::publish`).
struct ModelPublish<'s> {
    store: &'s Store,
    t: &'s Txn,
    /// (block, value, version) of every block it touched, as its build saw them.
    noted: Vec<(usize, u64, u64)>,
    check_read_locks: bool,
}

impl<'s> ModelPublish<'s> {
    fn lock_of(&self, b: usize) -> ModelLock<'s> {
        ModelLock {
            block: &self.store.blocks[b],
            blkno: b as u64,
            try_waits: self.t.waits_under_turn,
            read_locks_seen: self.check_read_locks,
        }
    }

    fn version_of(&self, b: usize) -> u64 {
        self.noted
            .iter()
            .find(|n| n.0 == b)
            .map_or(u64::MAX, |n| n.2)
    }

    fn seen(&self) -> Vec<(usize, u64)> {
        (self.noted.iter())
            .filter(|(b, _, _)| self.t.reads.contains(b))
            .map(|&(b, v, _)| (b, v))
            .collect()
    }

    fn write(&self, locks: &[(usize, u64, Held<'s>)]) {
        let v = self.t.value(&self.seen());
        for (_, _, g) in locks {
            g.set(v);
            g.block.version.fetch_add(1, Ordering::Release);
        }
    }
}

impl<'s> Publish for ModelPublish<'s> {
    type Turn = Quiet<MutexGuard<'s, ()>>;
    type Locks = Vec<(usize, u64, Held<'s>)>;
    type Checked = ();
    type Done = ();
    type Error = Infallible;

    fn leaves_only(&self) -> bool {
        !self.t.structural
    }

    fn take_turn(&self) -> Self::Turn {
        Quiet::new(self.store.turn.lock().unwrap())
    }

    fn lock_changed(&mut self, wait: bool) -> Result<Option<Self::Locks>, ()> {
        let wanted = (self.t.writes.iter())
            .map(|&b| Wanted {
                index: b,
                block: self.lock_of(b),
                version: self.version_of(b),
            })
            .collect();
        lock_in_block_order(wanted, wait).map_err(|_| ())
    }

    fn check(&mut self, _: &Self::Locks) -> Result<Option<()>, Infallible> {
        let read_only: Vec<usize> = (self.t.reads.iter())
            .filter(|b| !self.t.writes.contains(b))
            .copied()
            .collect();
        if read_set_locked(read_only.iter().map(|&b| self.lock_of(b))) {
            return Ok(None);
        }
        let moved = (read_only.iter())
            .any(|&b| self.store.blocks[b].version.load(Ordering::Acquire) != self.version_of(b));
        Ok((!moved).then_some(()))
    }

    fn publish_leaves(&mut self, locks: &mut Self::Locks) {
        self.write(locks);
    }

    fn insert(
        self,
        locks: Self::Locks,
        turn: Option<Self::Turn>,
        (): (),
    ) -> Result<Option<()>, Infallible> {
        if self.t.structural {
            self.write(&locks);
        }
        self.store
            .seen
            .lock()
            .unwrap()
            .push((self.t.id, self.seen()));
        insert(self.store, self.t, self.t.structural);
        drop(turn);
        drop(locks);
        Ok(Some(()))
    }
}

/// Runs `t` to its commit as `Fs::with_shared_tx` does, through the production retry and
/// publish sequence.
fn run(store: &Store, t: &Txn, check_read_locks: bool) {
    let attempt = |exclusive: bool| -> Result<Option<()>, Infallible> {
        if exclusive {
            run_exclusive(store, t);
            return Ok(Some(()));
        }
        // Build: each block read under its lock for a moment, its version noted.
        let noted = (t.touched().into_iter())
            .map(|b| {
                let g = store.blocks[b].lock(false);
                (b, g.get(), store.blocks[b].version.load(Ordering::Acquire))
            })
            .collect();
        // Publish, under the state lock shared.
        let _st = Quiet::new(store.state.read().unwrap());
        publish(ModelPublish {
            store,
            t,
            noted,
            check_read_locks,
        })
    };
    let Ok(()) = retry(CONFLICTS_MAX, attempt, || {});
}

/// The exclusive path: every block read and written under the state lock held exclusive.
fn run_exclusive(store: &Store, t: &Txn) {
    let _st = Quiet::new(store.state.write().unwrap());
    let seen: Vec<(usize, u64)> = (t.reads.iter())
        .map(|&b| (b, store.blocks[b].lock(false).get()))
        .collect();
    let v = t.value(&seen);
    for &b in &t.writes {
        store.blocks[b].lock(true).set(v);
        store.blocks[b].version.fetch_add(1, Ordering::Release);
    }
    commit_turn(store, t, seen);
}

/// The exclusive path's commit: it writes the header's bytes, as `FsTx::commit` does.
fn commit_turn(store: &Store, t: &Txn, seen: Vec<(usize, u64)>) {
    store.seen.lock().unwrap().push((t.id, seen));
    let _turn = Quiet::new(store.turn.lock().unwrap());
    insert(store, t, true);
}

/// Adds its count (a commit of leaves is a create: 1; one changing structure: 0) to the
/// header in memory, then inserts into the CIL: two holds, as `insert_shared` (the header's
/// lock, then the CIL's), so another commit may merge the header between them. One that
/// `writes_bytes` (holding the turn or the exclusive lock) encodes the count as it is then.
fn insert(store: &Store, t: &Txn, writes_bytes: bool) {
    let delta = u64::from(!t.structural);
    let bytes = {
        let mut h = store.hdr.lock().unwrap();
        *h += delta;
        writes_bytes.then_some(*h)
    };
    store.cil.lock().unwrap().push(Entry {
        id: t.id,
        delta,
        bytes,
        listed: store.bytes_list_the_count,
    });
}

/// The count a checkpoint holding `prefix` writes, replayed as the push does: bytes set it
/// unless they list it, then each change moves it.
fn replayed_count(prefix: &[Entry]) -> u64 {
    prefix.iter().fold(0, |c, e| match e.bytes {
        Some(v) if !e.listed => v,
        _ => c + e.delta,
    })
}

/// The blocks after running `order` serially from zeros.
fn serial(txns: &[Txn], order: &[usize], nblocks: usize) -> Vec<u64> {
    let mut s = vec![0u64; nblocks];
    for &id in order {
        let t = &txns[id];
        let seen: Vec<(usize, u64)> = t.reads.iter().map(|&b| (b, s[b])).collect();
        let v = t.value(&seen);
        for &b in &t.writes {
            s[b] = v;
        }
    }
    s
}

fn permutations(ids: &[usize]) -> Vec<Vec<usize>> {
    if ids.len() <= 1 {
        return vec![ids.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..ids.len() {
        let mut rest = ids.to_vec();
        let first = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, first);
            out.push(p);
        }
    }
    out
}

/// Runs the transactions on threads of their own and checks every prefix of the CIL.
fn check(txns: Vec<Txn>, nblocks: usize, check_read_locks: bool) {
    check_with(txns, nblocks, check_read_locks, true);
}

fn check_with(txns: Vec<Txn>, nblocks: usize, check_read_locks: bool, bytes_list_the_count: bool) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(move || {
        let store = Arc::new(Store {
            state: RwLock::new(()),
            blocks: (0..nblocks).map(|_| Block::new()).collect(),
            turn: Mutex::new(()),
            hdr: Mutex::new(0),
            cil: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
            bytes_list_the_count,
        });
        let threads: Vec<_> = txns
            .iter()
            .cloned()
            .map(|t| {
                let store = Quiet::new(Arc::clone(&store));
                loom::thread::spawn(move || {
                    if let Some(store) = &store.0 {
                        run(store, &t, check_read_locks)
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let entries = store.cil.lock().unwrap().clone();
        let cil: Vec<usize> = entries.iter().map(|e| e.id).collect();
        assert_eq!(cil.len(), txns.len());
        // Each prefix, replayed as the CIL holds it (each block's newest image), must be
        // what some serial run of the same transactions leaves.
        let seen = store.seen.lock().unwrap().clone();
        for n in 1..=cil.len() {
            let prefix = &cil[..n];
            let mut replay = vec![0u64; nblocks];
            for &id in prefix {
                let t = &txns[id];
                let reads = &seen.iter().find(|s| s.0 == id).unwrap().1;
                let v = t.value(reads);
                for &b in &t.writes {
                    replay[b] = v;
                }
            }
            // The header's count in that checkpoint: exactly its creates.
            let creates = prefix.iter().filter(|&&id| !txns[id].structural).count() as u64;
            assert_eq!(
                replayed_count(&entries[..n]),
                creates,
                "the CIL's first {n} commits {prefix:?} count {creates} creates"
            );
            let serializable = permutations(prefix)
                .iter()
                .any(|order| serial(&txns, order, nblocks) == replay);
            assert!(
                serializable,
                "the CIL's first {n} commits {prefix:?} leave {replay:?}, which no serial run does"
            );
        }
        let final_state: Vec<u64> = store.blocks.iter().map(|b| b.lock(false).get()).collect();
        let all: Vec<usize> = (0..txns.len()).collect();
        assert!(permutations(&all)
            .iter()
            .any(|o| serial(&txns, o, nblocks) == final_state));
    });
}

fn write_skew() -> Vec<Txn> {
    vec![
        Txn::leaf(0, vec![0], vec![1]),
        Txn::leaf(1, vec![1], vec![0]),
    ]
}

#[test]
fn loom_shared_publishes_are_serializable_in_every_cil_prefix() {
    check(write_skew(), 2, true);
}

#[test]
fn loom_shared_publishes_of_overlapping_blocks_order_in_the_cil() {
    // Two commits writing one block each and reading the other's, one writing both.
    check(
        vec![
            Txn::leaf(0, vec![0, 1], vec![0, 1]),
            Txn::leaf(1, vec![1], vec![1]),
        ],
        2,
        true,
    );
}

#[test]
#[should_panic(expected = "no serial run")]
fn loom_shared_publishes_without_the_read_lock_check_miss_each_others_writes() {
    check(write_skew(), 2, false);
}

/// A split (writes a leaf and its parent) and a leaf commit (reads the leaf's sibling
/// entry, writes the parent's other child).
fn split_beside_leaf() -> Vec<Txn> {
    vec![
        Txn {
            structural: true,
            ..Txn::leaf(0, vec![0, 1], vec![0, 1])
        },
        Txn::leaf(1, vec![0], vec![1]),
    ]
}

/// A structural commit (turn first, blocks tried) beside a leaf commit that holds a block
/// (and takes no turn): no deadlock, and every CIL prefix serializable.
#[test]
fn loom_a_structural_commit_beside_a_leaf_commit_neither_deadlocks_nor_skews() {
    check(split_beside_leaf(), 2, true);
}

/// Two structural commits and a leaf commit, one structural commit finding a block held by
/// the leaf commit and so locking its blocks before it waits for the turn (`waits_under_turn`
/// for the other's order).
fn structural_fallback(waits_under_turn: bool) -> Vec<Txn> {
    vec![
        Txn {
            structural: true,
            waits_under_turn,
            ..Txn::leaf(0, vec![], vec![0])
        },
        Txn {
            structural: true,
            ..Txn::leaf(1, vec![], vec![0, 1])
        },
        Txn::leaf(2, vec![], vec![1]),
    ]
}

/// A structural commit that falls back (its blocks, then the turn) beside one that tries its
/// blocks under the turn: no deadlock, and every CIL prefix serializable.
#[test]
fn loom_a_structural_commit_that_falls_back_neither_deadlocks_nor_skews() {
    check(structural_fallback(false), 2, true);
}

/// The same, the other structural commit waiting for its blocks under the turn: each holds
/// what the other waits for, a cycle the model must find: loom reports the deadlock.
#[test]
#[should_panic(expected = "deadlock")]
fn loom_a_structural_commit_waiting_for_blocks_under_the_turn_deadlocks() {
    check(structural_fallback(true), 2, true);
}

/// A commit of leaves (a create) and one changing structure on other blocks: the create's
/// count may reach the header in memory before the other merges it and its insert after.
fn create_beside_split() -> Vec<Txn> {
    vec![
        Txn {
            structural: true,
            ..Txn::leaf(0, vec![], vec![0])
        },
        Txn::leaf(1, vec![], vec![1]),
    ]
}

/// Every checkpoint's header counts exactly its creates: the structural commit's bytes list
/// the count, so the push keeps it around them.
#[test]
fn loom_a_header_written_beside_a_create_counts_exactly_the_creates_before_it() {
    check(create_beside_split(), 2, true);
}

/// The same with the bytes not listing the count (the bug a review found): a checkpoint
/// holding the structural commit alone counts the create whose insert comes after.
#[test]
#[should_panic(expected = "creates")]
fn loom_header_bytes_that_do_not_list_the_count_count_a_create_too_early() {
    check_with(create_beside_split(), 2, true, false);
}

/// Two structural commits in write skew: each falls back or conflicts, never both publish a
/// stale read.
#[test]
fn loom_structural_commits_in_write_skew_stay_serializable() {
    let mut txns = write_skew();
    for t in &mut txns {
        t.structural = true;
    }
    check(txns, 2, true);
}
