//! Debug builds' routing checks: every leaf a commit changed is where a descent for its keys
//! leads.

use crate::fs::error::FsError;
use crate::fs::items::header::{Roots, TREE_FS};
use crate::fs::tree::btree::{self, NodeStore, Root};
use crate::fs::txn::api::FsTx;
use crate::fs::txn::view::ReadView;
use crate::journal::Journal;
use crate::trans::PublishLocks;

/// Debug builds, after a publish under the shared lock, its buffers still locked (`locks`):
/// `assert_leaves_routed` from the newest roots, read through its locks. A key whose descent
/// meets a block another commit holds is not checked.
#[cfg(debug_assertions)]
pub(crate) fn assert_published_keys_routed(
    journal: &Journal,
    roots: Roots,
    locks: &PublishLocks,
    changed: &[u64],
) {
    let mut v = ReadView {
        locked: Some(locks),
        ..ReadView::new(journal, roots)
    };
    assert_leaves_routed(&mut v, roots.root(TREE_FS), changed, true);
}

/// Debug builds: every fs tree leaf among `changed` holds only keys that a descent from
/// `root` through `s` leads to it, for its first and last key. `skip_held`: a descent that
/// meets a block another commit holds (`FsError::Retry`) is not checked.
#[cfg(debug_assertions)]
pub(super) fn assert_leaves_routed(
    s: &mut dyn NodeStore,
    root: Root,
    changed: &[u64],
    skip_held: bool,
) {
    for &b in changed {
        let Ok(n) = s.read_node(b, TREE_FS) else {
            continue;
        };
        let crate::fs::tree::node::Body::Leaf(items) = &n.body else {
            continue;
        };
        for k in [items.first(), items.last()]
            .into_iter()
            .flatten()
            .map(|e| e.0)
        {
            let got = btree::leaf_blkno(s, root, TREE_FS, k);
            if skip_held && matches!(got, Err(FsError::Retry(_))) {
                continue;
            }
            assert!(
                got.as_ref().is_ok_and(|&g| g == b),
                "leaf {b} holds {k:?} but a descent for it leads to {got:?}"
            );
        }
    }
}

impl FsTx<'_> {
    /// Debug builds: every leaf of the fs tree this optimistic transaction changes is where a
    /// descent from the newest root leads for its first and last key (a check that
    /// `still_current` let nothing through that misplaces a key).
    #[cfg(debug_assertions)]
    pub(crate) fn assert_keys_routed(&mut self) {
        let root = self.hdr.root(TREE_FS);
        let changed = self.tx.changed_blocks();
        assert_leaves_routed(self, root, &changed, false);
    }
}
