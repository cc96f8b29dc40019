//! Reading trees: the `Trees` and `TreeRead` traits both a transaction and a read view
//! implement, and `ReadView`, tree access without a transaction (the newest in-memory version
//! of each block), checked against reshapes by commits beside it.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::Roots;
use crate::fs::tree::btree::{self, NodeStore, Root};
use crate::fs::tree::node::{Key, Node, RawStep, Seek, NODE_LSN_OFFSET};
use crate::journal::Journal;
use crate::trans::PublishLocks;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Tree access without a transaction: the newest in-memory version of each block.
#[derive(Debug)]
pub struct ReadView<'a> {
    pub(crate) journal: &'a Journal,
    pub(crate) roots: Roots,
    /// Read by a commit that holds these blocks locked (a publish under the shared state
    /// lock, `shared_tx.rs`): it reads them through its own locks, and never waits for
    /// another block's lock or reads one from the device: such a block fails the read (the
    /// commit is then refused and runs again).
    pub(crate) locked: Option<&'a PublishLocks>,
    /// Read under the shared state lock while commits publish beside it (`Fs::view`).
    pub(crate) reshape: Option<Reshape<'a>>,
}

/// What a reader under the shared state lock checks so that no change of the tree's shape
/// that commits publish beside it (a split, a root that moves) makes it miss keys: a leaf it
/// reached is only trusted if every interior node that led to it still has the version it
/// read, and no root moved since it copied the roots. Changes to leaves alone need no check:
/// a reader sees each leaf whole, before or after a commit. An interior node read again at
/// another version fails the check at once.
#[derive(Debug)]
pub(crate) struct Reshape<'a> {
    /// `Fs::roots_moved`, and its value when the roots were copied.
    pub roots_moved: &'a AtomicU64,
    pub seen: u64,
    /// The interior nodes it read, with their versions: all of them, since a scan goes on
    /// from leaf to leaf through the copies it decoded.
    pub path: Vec<(Arc<crate::buf::Buf>, u64)>,
}

impl Reshape<'_> {
    /// No root moved and no interior node on the path changed since they were read.
    fn unmoved(&self) -> bool {
        self.roots_moved.load(Ordering::Acquire) == self.seen
            && self.path.iter().all(|(b, v)| b.version() == *v)
    }
}

fn reshaped() -> FsError {
    debug_assert!(
        crate::fs::txn::retry::may_retry(),
        "a reader under the shared lock outside Fs::retrying"
    );
    FsError::Retry(crate::fs::txn::retry::Retry::Reshaped)
}

impl<'a> ReadView<'a> {
    pub(crate) fn new(journal: &'a Journal, roots: Roots) -> Self {
        ReadView {
            journal,
            roots,
            locked: None,
            reshape: None,
        }
    }

    /// After a block was read: an interior node joins the path; a leaf is checked against
    /// it (`Reshape`).
    fn after_read(
        &mut self,
        buf: Arc<crate::buf::Buf>,
        version: u64,
        interior: bool,
    ) -> FsResult<()> {
        let Some(r) = &mut self.reshape else {
            return Ok(());
        };
        if interior {
            match r.path.iter().find(|(b, _)| Arc::ptr_eq(b, &buf)) {
                Some(&(_, v)) if v != version => {}
                Some(_) => return Ok(()),
                None => {
                    r.path.push((buf, version));
                    return Ok(());
                }
            }
        } else if r.unmoved() {
            return Ok(());
        }
        Err(reshaped())
    }

    /// `e`, met reading a block, unless a commit beside this reader reshaped its way there
    /// since (a root or a node on the path changed): the block may then be one that commit
    /// freed and another reused (a leaf where an interior node was), and the reader runs
    /// again instead of failing on a state that is not the tree's.
    fn unless_reshaped(&self, e: FsError) -> FsError {
        match &self.reshape {
            Some(r) if !matches!(e, FsError::Retry(_)) && !r.unmoved() => reshaped(),
            _ => e,
        }
    }

    /// A metadata block not in the buffer cache is read outside the filesystem lock when the
    /// operation can still give up (`retry::may_read_later`).
    fn buf(&self, blkno: u64) -> FsResult<std::sync::Arc<crate::buf::Buf>> {
        if let Some(b) = self.journal.cached_buf(blkno) {
            return Ok(b);
        }
        if self.locked.is_some() || crate::fs::txn::retry::may_read_later() {
            return Err(FsError::Retry(crate::fs::txn::retry::Retry::Read(blkno)));
        }
        Ok(self.journal.buf(blkno)?)
    }

    /// Runs `f` on block `blkno` as it is published now; `interior`: whether the block is
    /// an interior node, told from what `f` returns.
    fn with_block<R>(
        &mut self,
        blkno: u64,
        f: impl FnOnce(&[u8]) -> FsResult<R>,
        interior: impl FnOnce(&R) -> bool,
    ) -> FsResult<R> {
        if let Some(locks) = self.locked {
            // Blocks this commit holds were read, checked and changed by it.
            if let Some(g) = locks.get(blkno) {
                return f(&g.data);
            }
            let buf = self.buf(blkno)?;
            let Some(g) = buf.try_read() else {
                return Err(FsError::Retry(crate::fs::txn::retry::Retry::Read(blkno)));
            };
            self.journal.verify_read(&buf, &g, NODE_LSN_OFFSET)?;
            return f(&g.data);
        }
        let buf = self.buf(blkno)?;
        let read = {
            let g = buf.read();
            self.journal
                .verify_read(&buf, &g, NODE_LSN_OFFSET)
                .map_err(FsError::from)
                .and_then(|()| f(&g.data))
                .map(|r| (r, g.version))
        };
        let (r, version) = read.map_err(|e| self.unless_reshaped(e))?;
        let is_interior = interior(&r);
        self.after_read(buf, version, is_interior)?;
        Ok(r)
    }
}

impl NodeStore for ReadView<'_> {
    fn block_size(&self) -> usize {
        self.journal.block_size() as usize
    }

    fn read_node(&mut self, blkno: u64, tree: u8) -> FsResult<Node> {
        self.with_block(blkno, |d| Node::decode(d, blkno, tree), |n| n.level > 0)
    }

    fn raw_step(&mut self, blkno: u64, tree: u8, level: u8, key: Key) -> FsResult<RawStep> {
        self.with_block(
            blkno,
            |d| crate::fs::tree::node::raw_step(d, blkno, tree, level, key),
            |_| level > 0,
        )
    }

    fn raw_seek(
        &mut self,
        blkno: u64,
        tree: u8,
        key: Key,
        seek: Seek,
    ) -> FsResult<Option<(Key, Vec<u8>)>> {
        self.with_block(
            blkno,
            |d| crate::fs::tree::node::raw_seek(d, blkno, tree, key, seek),
            |_| false,
        )
    }

    fn check_leaf_layout(&mut self, blkno: u64, tree: u8) -> FsResult<()> {
        self.with_block(
            blkno,
            |d| crate::fs::tree::node::check_leaf_layout(d, blkno, tree),
            |_| false,
        )
    }

    fn write_node(&mut self, _blkno: u64, _node: &Node) -> FsResult<()> {
        Err(FsError::ReadOnly)
    }

    fn alloc_node(&mut self, _tree: u8) -> FsResult<u64> {
        Err(FsError::ReadOnly)
    }

    fn free_node(&mut self, _tree: u8, _blkno: u64) -> FsResult<()> {
        Err(FsError::ReadOnly)
    }
}

/// Tree reads shared by transactions and read views.
pub trait TreeRead {
    fn t_get(&mut self, tree: u8, key: Key) -> FsResult<Option<Vec<u8>>>;
    fn t_seek_ge(&mut self, tree: u8, key: Key) -> FsResult<Option<(Key, Vec<u8>)>>;
    fn t_seek_le(&mut self, tree: u8, key: Key) -> FsResult<Option<(Key, Vec<u8>)>>;
    /// The data area `[data_start, data_end)`: every block an extent maps lies in it.
    fn t_data_area(&self) -> (u64, u64);
}

/// Tree reads through a node store that knows the roots: transactions and read views alike.
pub trait Trees: NodeStore + Sized {
    fn root_of(&self, tree: u8) -> Root;

    /// The header's data area `[data_start, data_end)`.
    fn data_area(&self) -> (u64, u64);

    fn get(&mut self, tree: u8, key: Key) -> FsResult<Option<Vec<u8>>> {
        let root = self.root_of(tree);
        btree::get(self, root, tree, key)
    }

    fn seek_ge(&mut self, tree: u8, key: Key) -> FsResult<Option<(Key, Vec<u8>)>> {
        let root = self.root_of(tree);
        btree::seek_ge(self, root, tree, key)
    }

    fn seek_le(&mut self, tree: u8, key: Key) -> FsResult<Option<(Key, Vec<u8>)>> {
        let root = self.root_of(tree);
        btree::seek_le(self, root, tree, key)
    }

    fn scan(
        &mut self,
        tree: u8,
        from: Key,
        to: Key,
        limit: usize,
    ) -> FsResult<Vec<(Key, Vec<u8>)>> {
        let root = self.root_of(tree);
        btree::scan(self, root, tree, from, to, limit)
    }
}

impl Trees for ReadView<'_> {
    fn root_of(&self, tree: u8) -> Root {
        self.roots.root(tree)
    }

    /// The header's, which `Fs::open` found equal to the superblock's metadata area past the
    /// header block.
    fn data_area(&self) -> (u64, u64) {
        let (first, end) = self.journal.metadata_area();
        (first + 1, end)
    }
}

/// The object-safe view of `Trees` that shared code (directory lookups, inode reads) takes.
impl<T: Trees> TreeRead for T {
    fn t_get(&mut self, tree: u8, key: Key) -> FsResult<Option<Vec<u8>>> {
        Trees::get(self, tree, key)
    }
    fn t_seek_ge(&mut self, tree: u8, key: Key) -> FsResult<Option<(Key, Vec<u8>)>> {
        Trees::seek_ge(self, tree, key)
    }
    fn t_seek_le(&mut self, tree: u8, key: Key) -> FsResult<Option<(Key, Vec<u8>)>> {
        Trees::seek_le(self, tree, key)
    }
    fn t_data_area(&self) -> (u64, u64) {
        Trees::data_area(self)
    }
}
