//! The order of an optimistic commit's publish (docs/concurrency.md, "The publish protocol"),
//! written once over its steps so that the loom model (`fs/tests/publish_model.rs`) runs this
//! code with loom's locks, and `shared_tx.rs` runs it with the filesystem's:
//! - a commit that changes interior nodes or the header's structure takes the publish turn
//!   first and under it only tries its blocks' locks; if one is held it lets the turn go and
//!   locks as leaf commits do, taking the turn again after. No thread holding the turn ever
//!   waits for a block, so no cycle with a commit holding blocks and waiting for the turn can
//!   form;
//! - a commit of leaves locks its blocks (in block order), checks its reads, publishes into
//!   its buffers, and inserts into the CIL without the turn;
//! - an operation whose optimistic runs conflicted a number of times in a row runs under the
//!   exclusive state lock (`retry`).

/// A commit's publish, step by step. Every step that returns `None` (or false) found a
/// conflict: the caller lets everything go and runs the operation again.
pub(crate) trait Publish {
    /// A hold of the publish turn.
    type Turn;
    /// The locks of the blocks the commit changes, in block order.
    type Locks;
    /// What `check` found and the end of the publish needs.
    type Checked;
    /// What a finished publish gives its caller.
    type Done;
    type Error;

    /// Whether the commit changes leaves alone (and so takes no turn).
    fn leaves_only(&self) -> bool;
    /// Waits for the publish turn.
    fn take_turn(&self) -> Self::Turn;
    /// Locks the changed blocks in block order (`trans::publish::lock_in_block_order`):
    /// `wait` false only tries them (None if one is held). Err: one changed since it was seen.
    fn lock_changed(&mut self, wait: bool) -> Result<Option<Self::Locks>, ()>;
    /// With the changed blocks locked: whether everything the commit read is as it saw it
    /// (`trans::publish::read_set_locked` first). None: a conflict.
    fn check(&mut self, locks: &Self::Locks) -> Result<Option<Self::Checked>, Self::Error>;
    /// A commit of leaves: copies its changes into its locked buffers, before any turn.
    fn publish_leaves(&mut self, locks: &mut Self::Locks);
    /// Inserts into the CIL (publishing first when it changes structure), under `turn` when it
    /// changes structure. None: a conflict found at the header's merge.
    fn insert(
        self,
        locks: Self::Locks,
        turn: Option<Self::Turn>,
        checked: Self::Checked,
    ) -> Result<Option<Self::Done>, Self::Error>;
}

/// Publishes `p`, in the protocol's order. None: a conflict, nothing published.
pub(crate) fn publish<P: Publish>(mut p: P) -> Result<Option<P::Done>, P::Error> {
    let leaves_only = p.leaves_only();
    let mut under_turn = None;
    if !leaves_only {
        let turn = p.take_turn();
        match p.lock_changed(false) {
            Ok(Some(locks)) => under_turn = Some((turn, locks)),
            // A block held: the turn goes, and it locks as a commit of leaves does.
            Ok(None) => drop(turn),
            Err(()) => return Ok(None),
        }
    }
    let (turn, mut locks) = match under_turn {
        Some((turn, locks)) => (Some(turn), locks),
        None => match p.lock_changed(true) {
            Ok(Some(locks)) => (None, locks),
            Ok(None) => unreachable!("waited for every lock"),
            Err(()) => return Ok(None),
        },
    };
    let Some(checked) = p.check(&locks)? else {
        return Ok(None);
    };
    if leaves_only {
        p.publish_leaves(&mut locks);
    }
    let turn = match turn {
        Some(turn) => Some(turn),
        None if !leaves_only => Some(p.take_turn()),
        None => None,
    };
    p.insert(locks, turn, checked)
}

/// Runs an operation until it commits: `attempt(false)` optimistically (None on a conflict),
/// and after `conflicts_max` conflicts in a row `attempt(true)`, under the exclusive state
/// lock (None when what that lock does not keep out moved). `conflicted` counts each conflict.
pub(crate) fn retry<R, E>(
    conflicts_max: u32,
    mut attempt: impl FnMut(bool) -> Result<Option<R>, E>,
    mut conflicted: impl FnMut(),
) -> Result<R, E> {
    let mut conflicts = 0;
    loop {
        let exclusive = conflicts >= conflicts_max;
        if let Some(r) = attempt(exclusive)? {
            return Ok(r);
        }
        conflicts += 1;
        conflicted();
    }
}
