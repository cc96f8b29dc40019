//! One B+tree implementation for every tree of the filesystem (the fs tree of inodes, directory
//! entries, extents and xattrs; free space by block and by size). Nodes are read and written
//! through a [`NodeStore`], which in a transaction logs every node it writes.
//!
//! Deletion frees empty nodes but does not merge underfull ones: simple, and the trees here
//! shrink by emptying ranges (a directory, a file's extents), which frees whole leaves.

use super::node::{Body, Key, KeyRange, Node, RawStep, Seek, Value};
use crate::fs::error::{FsError, FsResult};
pub use crate::fs::items::header::Root;
use crate::fs::items::header::MAX_LEVELS;

/// Block access for trees: a transaction (logging writes) or a read-only view.
pub trait NodeStore {
    fn block_size(&self) -> usize;
    fn read_node(&mut self, blkno: u64, tree: u8) -> FsResult<Node>;
    fn write_node(&mut self, blkno: u64, node: &Node) -> FsResult<()>;
    fn alloc_node(&mut self, tree: u8) -> FsResult<u64>;
    fn free_node(&mut self, tree: u8, blkno: u64) -> FsResult<()>;
    /// One step of a point lookup on the encoded block (no decoding of the whole node).
    fn raw_step(&mut self, blkno: u64, tree: u8, level: u8, key: Key) -> FsResult<RawStep> {
        let n = self.read_node(blkno, tree)?;
        if n.level != level {
            return Err(FsError::corrupt(blkno, "level out of sequence"));
        }
        Ok(match &n.body {
            Body::Leaf(items) => match items.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(i) => RawStep::Found(items[i].1.to_vec()),
                Err(_) => RawStep::Absent,
            },
            Body::Interior(items) => {
                let i = child_index(items, key);
                RawStep::Child(items[i].1, KeyRange::ALL.of_entry(items, i))
            }
        })
    }
    /// Puts `key` into leaf `blkno` in place on its encoded block (`node::leaf_put_raw`):
    /// the old value if it replaced one, or None when that does not apply and the caller
    /// decodes the leaf. A store that cannot (the default) always declines.
    fn leaf_put_in_place(
        &mut self,
        _blkno: u64,
        _tree: u8,
        _key: Key,
        _val: &[u8],
        _range: KeyRange,
    ) -> FsResult<Option<Option<Vec<u8>>>> {
        Ok(None)
    }
    /// Removes `key` from leaf `blkno` in place (`node::leaf_remove_raw`): the removed
    /// value, or None when that does not apply (the key absent, the leaf left empty) and the
    /// caller decodes the leaf. A store that cannot (the default) always declines.
    fn leaf_remove_in_place(
        &mut self,
        _blkno: u64,
        _tree: u8,
        _key: Key,
        _range: KeyRange,
    ) -> FsResult<Option<Vec<u8>>> {
        Ok(None)
    }
    /// A seek within leaf `blkno` on its encoded block (`node::raw_seek`): the entry found, or
    /// None when the leaf has none on that side of `key`. The leaf counts as read whole.
    fn raw_seek(
        &mut self,
        blkno: u64,
        tree: u8,
        key: Key,
        seek: Seek,
    ) -> FsResult<Option<(Key, Vec<u8>)>> {
        let n = self.read_node(blkno, tree)?;
        if n.level != 0 {
            return Err(FsError::corrupt(blkno, "leaf expected"));
        }
        let items = leaf_items(&n);
        let e = match seek {
            Seek::AtOrAfter => items.get(items.partition_point(|(k, _)| *k < key)),
            Seek::AtOrBefore => items[..items.partition_point(|(k, _)| *k <= key)].last(),
        };
        Ok(e.map(owned))
    }
    /// Checks that leaf `blkno` is laid out as the in-place edits need
    /// (`node::check_leaf_layout`), for the checker. A store that cannot (the default) finds
    /// nothing.
    fn check_leaf_layout(&mut self, _blkno: u64, _tree: u8) -> FsResult<()> {
        Ok(())
    }
    /// A descent for `key` ended at leaf `leaf`, which the caller decodes whole. An optimistic
    /// transaction checks at commit that it still would (`FsTx::still_current`), instead of
    /// asking that no interior node on the way changed. (Point lookups through `raw_step` are
    /// checked by their answer instead.)
    fn descended(&mut self, _tree: u8, _key: Key, _leaf: u64) {}
    /// A traversal went from one leaf to the next through interior nodes: those must be
    /// unchanged at commit, since a re-descent for one key does not retrace it.
    fn sideways(&mut self) {}
}

/// The leaf a point descent for `key` reaches.
pub fn leaf_blkno(s: &mut dyn NodeStore, root: Root, tree: u8, key: Key) -> FsResult<u64> {
    step_to_leaf(s, root, tree, key, |_| ()).map(|(leaf, _)| leaf)
}

/// A point descent for `key` through the interior nodes, stepped through on their encoded
/// blocks (`NodeStore::raw_step`), each passed to `passed` (root first); the leaf it reaches
/// and the keys the separators on the way let it hold, which an edit of it checks.
fn step_to_leaf(
    s: &mut dyn NodeStore,
    root: Root,
    tree: u8,
    key: Key,
    mut passed: impl FnMut(u64),
) -> FsResult<(u64, KeyRange)> {
    let mut blk = root.blkno;
    let mut level = root.level;
    let mut range = KeyRange::ALL;
    while level > 0 {
        match s.raw_step(blk, tree, level, key)? {
            RawStep::Child(c, r) => {
                passed(blk);
                range = range.of_child(Some(r.lo), r.hi);
                blk = c;
                level -= 1;
            }
            _ => return Err(FsError::corrupt(blk, "interior node without children")),
        }
    }
    Ok((blk, range))
}

struct Step {
    blkno: u64,
    node: Node,
    idx: usize,
}

fn child_index(items: &[(Key, u64)], key: Key) -> usize {
    // The last entry whose key is <= key; the first entry bounds everything below it.
    items.partition_point(|(k, _)| *k <= key).saturating_sub(1)
}

/// A descent for `key` that decodes every node on the way, for edits that change more than
/// one leaf in place: each node is checked against the range its parents give it.
fn descend(s: &mut dyn NodeStore, root: Root, tree: u8, key: Key) -> FsResult<Vec<Step>> {
    let mut path: Vec<Step> = Vec::with_capacity(usize::from(root.level) + 1);
    let mut blkno = root.blkno;
    let mut want_level = root.level;
    let mut range = KeyRange::ALL;
    loop {
        let node = s.read_node(blkno, tree)?;
        if node.level != want_level {
            return Err(FsError::corrupt(
                blkno,
                format!("node at level {} where {want_level} expected", node.level),
            ));
        }
        match &node.body {
            Body::Leaf(items) => {
                range.check(blkno, items.first().map(|e| e.0), items.last().map(|e| e.0))?;
                let idx = items.partition_point(|(k, _)| *k < key);
                path.push(Step { blkno, node, idx });
                s.descended(tree, key, blkno);
                return Ok(path);
            }
            Body::Interior(items) => {
                // The first key bounds nothing (a stale one may stand above its child's).
                range.check(
                    blkno,
                    items.get(1).map(|e| e.0),
                    items.get(1).and(items.last()).map(|e| e.0),
                )?;
                let idx = child_index(items, key);
                let child = items[idx].1;
                range = range.of_entry(items, idx);
                path.push(Step { blkno, node, idx });
                blkno = child;
                want_level -= 1;
            }
        }
    }
}

/// Descends from `blkno` (at `level`) to its leftmost or rightmost leaf.
fn descend_edge(
    s: &mut dyn NodeStore,
    tree: u8,
    mut blkno: u64,
    mut level: u8,
    rightmost: bool,
) -> FsResult<Node> {
    s.sideways();
    loop {
        let node = s.read_node(blkno, tree)?;
        if node.level != level {
            return Err(FsError::corrupt(blkno, "level out of sequence"));
        }
        match &node.body {
            Body::Leaf(_) => return Ok(node),
            Body::Interior(items) => {
                let e = if rightmost {
                    items.last()
                } else {
                    items.first()
                };
                let Some(&(_, c)) = e else {
                    return Err(FsError::corrupt(blkno, "empty interior node"));
                };
                blkno = c;
                level -= 1;
            }
        }
    }
}

/// A leaf entry as callers get it: the value copied out of the node's block.
fn owned(e: &(Key, Value)) -> (Key, Vec<u8>) {
    (e.0, e.1.to_vec())
}

fn leaf_items(n: &Node) -> &[(Key, Value)] {
    match &n.body {
        Body::Leaf(v) => v,
        Body::Interior(_) => &[],
    }
}

fn interior_items(n: &Node) -> &[(Key, u64)] {
    match &n.body {
        Body::Interior(v) => v,
        Body::Leaf(_) => &[],
    }
}

/// A point lookup: binary search in each encoded node on the way down.
pub fn get(s: &mut dyn NodeStore, root: Root, tree: u8, key: Key) -> FsResult<Option<Vec<u8>>> {
    let mut blk = root.blkno;
    let mut level = root.level;
    loop {
        match s.raw_step(blk, tree, level, key)? {
            RawStep::Found(v) => return Ok(Some(v)),
            RawStep::Absent => return Ok(None),
            RawStep::Child(c, _) if level > 0 => {
                blk = c;
                level -= 1;
            }
            RawStep::Child(..) => return Err(FsError::corrupt(blk, "leaf with children")),
        }
    }
}

/// A seek in the leaf that holds (or would hold) `key`, found with binary searches in the
/// encoded nodes: nothing is decoded.
fn seek_in_leaf(
    s: &mut dyn NodeStore,
    root: Root,
    tree: u8,
    key: Key,
    seek: Seek,
) -> FsResult<Option<(Key, Vec<u8>)>> {
    let blk = leaf_blkno(s, root, tree, key)?;
    let found = s.raw_seek(blk, tree, key, seek)?;
    s.descended(tree, key, blk);
    Ok(found)
}

/// The first item with a key >= `key`.
pub fn seek_ge(
    s: &mut dyn NodeStore,
    root: Root,
    tree: u8,
    key: Key,
) -> FsResult<Option<(Key, Vec<u8>)>> {
    // Most answers are in the key's own leaf, found on its encoded block (an allocation seeks
    // the free-space trees up to 64 times); only past its end is the whole path needed.
    if let Some(found) = seek_in_leaf(s, root, tree, key, Seek::AtOrAfter)? {
        return Ok(Some(found));
    }
    let path = descend(s, root, tree, key)?;
    let Some(leaf) = path.last() else {
        return Ok(None);
    };
    if let Some(item) = leaf_items(&leaf.node).get(leaf.idx) {
        return Ok(Some(owned(item)));
    }
    // Past this leaf: the leftmost item of the next subtree up the path.
    for d in (0..path.len() - 1).rev() {
        let items = interior_items(&path[d].node);
        let next = path[d].idx + 1;
        if next < items.len() {
            let blk = items[next].1;
            let leaf = descend_edge(s, tree, blk, path[d].node.level - 1, false)?;
            // Leaves below the root are never empty.
            return match leaf_items(&leaf).first() {
                // A key behind the one sought means keys out of order across nodes: an
                // error, never an answer that sends a caller's scan backwards for ever.
                Some(first) if first.0 < key => Err(FsError::corrupt(
                    blk,
                    format!(
                        "subtree after key {key:?} begins at {:?}, before it",
                        first.0
                    ),
                )),
                Some(first) => Ok(Some(owned(first))),
                None => Err(FsError::corrupt(blk, "empty leaf below the root")),
            };
        }
    }
    Ok(None)
}

/// The last item with a key <= `key`.
pub fn seek_le(
    s: &mut dyn NodeStore,
    root: Root,
    tree: u8,
    key: Key,
) -> FsResult<Option<(Key, Vec<u8>)>> {
    if let Some(found) = seek_in_leaf(s, root, tree, key, Seek::AtOrBefore)? {
        return Ok(Some(found));
    }
    let path = descend(s, root, tree, key)?;
    let Some(leaf) = path.last() else {
        return Ok(None);
    };
    let items = leaf_items(&leaf.node);
    let mut i = leaf.idx;
    if items.get(i).is_some_and(|(k, _)| *k == key) {
        return Ok(Some(owned(&items[i])));
    }
    if i > 0 {
        i -= 1;
        return Ok(Some(owned(&items[i])));
    }
    for d in (0..path.len() - 1).rev() {
        let items = interior_items(&path[d].node);
        if path[d].idx > 0 {
            let blk = items[path[d].idx - 1].1;
            let leaf = descend_edge(s, tree, blk, path[d].node.level - 1, true)?;
            return match leaf_items(&leaf).last() {
                Some(last) if last.0 > key => Err(FsError::corrupt(
                    blk,
                    format!("subtree before key {key:?} ends at {:?}, after it", last.0),
                )),
                Some(last) => Ok(Some(owned(last))),
                None => Err(FsError::corrupt(blk, "empty leaf below the root")),
            };
        }
    }
    Ok(None)
}

/// Leaf `blkno`, which a descent for `key` reached, decoded. The interior nodes the descent
/// passed are only stepped through (`step_to_leaf`), not decoded: an insert needs one whole
/// only when a split below it carries a new entry up, and decoding the two or three a create's
/// descents pass was a fifth of its instructions.
fn read_leaf(
    s: &mut dyn NodeStore,
    tree: u8,
    key: Key,
    blkno: u64,
    range: KeyRange,
) -> FsResult<Step> {
    let node = s.read_node(blkno, tree)?;
    let Body::Leaf(items) = &node.body else {
        return Err(FsError::corrupt(
            blkno,
            format!("node at level {} where a leaf expected", node.level),
        ));
    };
    range.check(blkno, items.first().map(|e| e.0), items.last().map(|e| e.0))?;
    let idx = items.partition_point(|(k, _)| *k < key);
    s.descended(tree, key, blkno);
    Ok(Step { blkno, node, idx })
}

/// Inserts or replaces; returns the old value.
pub fn insert(
    s: &mut dyn NodeStore,
    root: &mut Root,
    tree: u8,
    key: Key,
    val: &[u8],
) -> FsResult<Option<Vec<u8>>> {
    let bs = s.block_size();
    assert!(
        val.len() <= super::node::max_value_bytes(bs),
        "tree value of {} bytes",
        val.len()
    );
    let mut interiors = Vec::with_capacity(usize::from(root.level));
    let (leaf, range) = step_to_leaf(s, *root, tree, key, |b| interiors.push(b))?;
    // Most puts fit their leaf: made in place, without decoding and encoding it.
    if let Some(old) = s.leaf_put_in_place(leaf, tree, key, val, range)? {
        s.descended(tree, key, leaf);
        return Ok(old);
    }
    let mut step = read_leaf(s, tree, key, leaf, range)?;
    let old;
    // The new key goes past every key of its leaf: a run of ascending keys (inode numbers
    // handed out in runs, file blocks) is being appended, and a split keeps the full leaf as
    // it is instead of leaving two halves the run never comes back to fill.
    let mut appending = false;
    {
        let idx = step.idx;
        let Body::Leaf(items) = &mut step.node.body else {
            return Err(FsError::corrupt(step.blkno, "leaf expected"));
        };
        if items.get(idx).is_some_and(|(k, _)| *k == key) {
            old = Some(std::mem::replace(&mut items[idx].1, Value::copy_from_slice(val)).to_vec());
        } else {
            old = None;
            appending = idx == items.len();
            items.insert(idx, (key, Value::copy_from_slice(val)));
        }
    }
    // Walk up: write the node if it fits, else split it and carry the new half's first key
    // into its parent.
    loop {
        if step.node.encoded_bytes() <= bs {
            s.write_node(step.blkno, &step.node)?;
            return Ok(old);
        }
        let right = if appending {
            split_last(&mut step.node)
        } else {
            split(&mut step.node)
        };
        let right_blk = s.alloc_node(tree)?;
        s.write_node(step.blkno, &step.node)?;
        s.write_node(right_blk, &right)?;
        let entry = (first_key(&right), right_blk);
        let Some(parent) = interiors.pop() else {
            // The root split: a new root above the two halves.
            if root.level + 1 >= MAX_LEVELS {
                return Err(FsError::corrupt(root.blkno, "tree too tall"));
            }
            let new_root = s.alloc_node(tree)?;
            let node = Node {
                tree,
                level: root.level + 1,
                body: Body::Interior(vec![(Key::MIN, root.blkno), entry]),
            };
            s.write_node(new_root, &node)?;
            *root = Root {
                blkno: new_root,
                level: root.level + 1,
            };
            return Ok(old);
        };
        let mut node = s.read_node(parent, tree)?;
        if node.level != step.node.level + 1 {
            return Err(FsError::corrupt(parent, "level out of sequence"));
        }
        let Body::Interior(items) = &mut node.body else {
            return Err(FsError::corrupt(parent, "interior node expected"));
        };
        // The child the descent took: this transaction has not changed the parent since.
        let idx = child_index(items, key);
        if items[idx].1 != step.blkno {
            return Err(FsError::corrupt(parent, "child moved under a descent"));
        }
        appending = idx + 1 == items.len();
        // A first key bounds nothing (the parent's entry does), and may stand above keys that
        // reach the first child: emptying a first child leaves the next one's own first key
        // as it was, and a collapsed root keeps its child's. The separator of a split below
        // it would then follow a greater key; the first key takes the left half's instead,
        // which comes before the separator and routes every key as before.
        if idx == 0 && items[0].0 >= entry.0 {
            items[0].0 = first_key(&step.node);
        }
        items.insert(idx + 1, entry);
        step = Step {
            blkno: parent,
            node,
            idx,
        };
    }
}

fn first_key(n: &Node) -> Key {
    match &n.body {
        Body::Leaf(v) => v.first().map(|e| e.0),
        Body::Interior(v) => v.first().map(|e| e.0),
    }
    .unwrap_or(Key::MIN)
}

/// Splits an overfull node whose last entry was just appended: the rest, which fitted before,
/// stays; returns a node of that entry alone.
fn split_last(n: &mut Node) -> Node {
    let body = match &mut n.body {
        Body::Leaf(items) => Body::Leaf(items.split_off(items.len() - 1)),
        Body::Interior(items) => Body::Interior(items.split_off(items.len() - 1)),
    };
    Node {
        tree: n.tree,
        level: n.level,
        body,
    }
}

/// Keys whose first parts lie this far apart belong to different objects' runs (inode numbers
/// come in runs per directory and lanes of runs, `fs/space/ino_alloc.rs`): a split between them
/// gives each side's inserts a node of their own.
const SPLIT_GAP: u64 = 4096;

/// Splits an overfull node in two near its middle by bytes; returns the right half. Within its
/// middle third, a split falls where the keys' first parts jump by `SPLIT_GAP` or more (the
/// widest such jump) rather than at the middle: split at the middle, a leaf holding the end of
/// one directory's run of inode items and the start of the next (that directory's own inode)
/// kept both in its right half at every split, so two threads creating in two directories
/// went on changing one leaf, one waiting for the other's lock or running again.
fn split(n: &mut Node) -> Node {
    let body = match &mut n.body {
        Body::Leaf(items) => {
            let sizes: Vec<usize> = items.iter().map(|(_, v)| v.len() + 20).collect();
            let at = split_point(items.iter().map(|e| e.0), &sizes);
            Body::Leaf(items.split_off(at))
        }
        Body::Interior(items) => {
            let sizes = vec![1; items.len()];
            let at = split_point(items.iter().map(|e| e.0), &sizes);
            Body::Interior(items.split_off(at))
        }
    };
    Node {
        tree: n.tree,
        level: n.level,
        body,
    }
}

/// Where to split entries of these keys and sizes (at least two): the index of the right
/// half's first entry, in `1..len`. The middle by size, or the widest jump of `SPLIT_GAP` or
/// more between neighbouring keys' first parts whose left side holds a third to two thirds of
/// the bytes (each side then fits a block: an overfull node holds at most a block and a value
/// of a quarter of one).
fn split_point(keys: impl Iterator<Item = Key>, sizes: &[usize]) -> usize {
    let n = sizes.len();
    debug_assert!(n >= 2, "splitting a node of {n} entries");
    let total: usize = sizes.iter().sum();
    let mut mid = None;
    let mut best: Option<(u64, usize)> = None;
    let (mut acc, mut prev) = (0, None::<Key>);
    for (i, k) in keys.enumerate() {
        // `acc`: the bytes left of a split before entry i.
        if i > 0 {
            if mid.is_none() && acc >= total / 2 {
                mid = Some(i);
            }
            let gap = k.a.saturating_sub(prev.map_or(0, |p| p.a));
            if gap >= SPLIT_GAP
                && acc * 3 >= total
                && acc * 3 <= total * 2
                && best.is_none_or(|(g, _)| gap > g)
            {
                best = Some((gap, i));
            }
        }
        acc += sizes[i];
        prev = Some(k);
    }
    let at = best.map_or(mid.unwrap_or(n - 1), |(_, i)| i);
    at.clamp(1, n - 1)
}

/// Removes `key`; returns its value. Empty nodes are freed and an interior root with one child
/// gives way to the child.
pub fn remove(
    s: &mut dyn NodeStore,
    root: &mut Root,
    tree: u8,
    key: Key,
) -> FsResult<Option<Vec<u8>>> {
    // Most removals leave their leaf with entries: made in place, nothing decoded. (A root
    // with one child comes only from a leaf emptied, below, which collapses it then.)
    let (leaf, range) = step_to_leaf(s, *root, tree, key, |_| {})?;
    if let Some(old) = s.leaf_remove_in_place(leaf, tree, key, range)? {
        s.descended(tree, key, leaf);
        return Ok(Some(old));
    }
    let mut path = descend(s, *root, tree, key)?;
    let Some(mut leaf) = path.pop() else {
        return Ok(None);
    };
    let Body::Leaf(items) = &mut leaf.node.body else {
        return Err(FsError::corrupt(
            leaf.blkno,
            "path ends in an interior node",
        ));
    };
    if items.get(leaf.idx).is_none_or(|(k, _)| *k != key) {
        return Ok(None);
    }
    let (_, old) = items.remove(leaf.idx);
    let mut node = leaf;
    loop {
        if !node.node.is_empty() {
            s.write_node(node.blkno, &node.node)?;
            break;
        }
        let Some(mut parent) = path.pop() else {
            // The root emptied: it becomes an empty leaf.
            s.write_node(node.blkno, &Node::leaf(tree))?;
            *root = Root {
                blkno: node.blkno,
                level: 0,
            };
            return Ok(Some(old.to_vec()));
        };
        s.free_node(tree, node.blkno)?;
        if let Body::Interior(pitems) = &mut parent.node.body {
            let (lower, _) = pitems.remove(parent.idx);
            // Each entry's key bounds its whole subtree from below; the new first child takes
            // over the removed one's bound, so keys below its own first key still route to it
            // without ever landing below a separator.
            if parent.idx == 0 {
                if let Some(first) = pitems.first_mut() {
                    first.0 = lower;
                }
            }
        }
        node = parent;
    }
    // Collapse a root with a single child.
    loop {
        if root.level == 0 {
            break;
        }
        let r = s.read_node(root.blkno, tree)?;
        let items = interior_items(&r);
        if items.len() != 1 {
            break;
        }
        let child = items[0].1;
        s.free_node(tree, root.blkno)?;
        *root = Root {
            blkno: child,
            level: root.level - 1,
        };
    }
    Ok(Some(old.to_vec()))
}

/// Items with a key in `[from, to]`, in order, at most `limit`: one descent, then leaf after
/// leaf (each node decoded once), for readdir and listings.
pub fn scan(
    s: &mut dyn NodeStore,
    root: Root,
    tree: u8,
    from: Key,
    to: Key,
    limit: usize,
) -> FsResult<Vec<(Key, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut path = descend(s, root, tree, from)?;
    loop {
        let Some(leaf) = path.last() else {
            return Ok(out);
        };
        for (k, v) in leaf_items(&leaf.node).iter().skip(leaf.idx) {
            if *k > to || out.len() >= limit {
                return Ok(out);
            }
            out.push((*k, v.to_vec()));
        }
        // The next leaf: up to the first ancestor with a right sibling, then down its left edge.
        path.pop();
        loop {
            let Some(step) = path.last_mut() else {
                return Ok(out);
            };
            step.idx += 1;
            let items = interior_items(&step.node);
            if step.idx < items.len() {
                s.sideways();
                let mut blk = items[step.idx].1;
                let mut level = step.node.level - 1;
                loop {
                    let node = s.read_node(blk, tree)?;
                    if node.level != level {
                        return Err(FsError::corrupt(blk, "level out of sequence"));
                    }
                    let first_child = interior_items(&node).first().map(|e| e.1);
                    path.push(Step {
                        blkno: blk,
                        node,
                        idx: 0,
                    });
                    match first_child {
                        Some(c) if level > 0 => {
                            blk = c;
                            level -= 1;
                        }
                        _ => break,
                    }
                }
                break;
            }
            path.pop();
        }
    }
}

/// Every item with a key in `[from, to]`, in order (for checks, readdir and tests).
pub fn range(
    s: &mut dyn NodeStore,
    root: Root,
    tree: u8,
    from: Key,
    to: Key,
    limit: usize,
) -> FsResult<Vec<(Key, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut at = from;
    while out.len() < limit {
        let Some((k, v)) = seek_ge(s, root, tree, at)? else {
            break;
        };
        if k > to {
            break;
        }
        out.push((k, v));
        match k.succ() {
            Some(n) => at = n,
            None => break,
        }
    }
    Ok(out)
}

/// Visits every node of the tree (for the checker): `f(blkno, node)`.
pub fn walk(
    s: &mut dyn NodeStore,
    root: Root,
    tree: u8,
    f: &mut dyn FnMut(u64, &Node) -> FsResult<()>,
) -> FsResult<()> {
    s.sideways();
    let mut stack = vec![(root.blkno, root.level)];
    while let Some((blk, level)) = stack.pop() {
        let n = s.read_node(blk, tree)?;
        if n.level != level {
            return Err(FsError::corrupt(blk, "level out of sequence"));
        }
        f(blk, &n)?;
        for &(_, c) in interior_items(&n).iter().rev() {
            stack.push((c, level - 1));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashMap};

    fn keys_of(a: &[u64]) -> Vec<Key> {
        a.iter().map(|&a| Key::new(a, 0)).collect()
    }

    /// A split falls between two runs of keys far apart when that leaves each side a third to
    /// two thirds of the bytes; otherwise at the middle by bytes, as before.
    #[test]
    fn a_split_falls_between_runs_of_keys_far_apart() {
        let run = |from: u64, n: u64| (from..from + n).collect::<Vec<_>>();
        // Twelve keys of one run, then eight of a run a lane away: split between them.
        let mut a = run(100, 12);
        a.extend(run(100 + (1 << 20), 8));
        let sizes = vec![40; a.len()];
        assert_eq!(split_point(keys_of(&a).into_iter(), &sizes), 12);
        // Keys of one run (small gaps, as numbers skipped by runs again): the middle.
        let b: Vec<u64> = (0..20).map(|i| 100 + i * 3).collect();
        assert_eq!(split_point(keys_of(&b).into_iter(), &[40; 20]), 10);
        // The jump too near an end (two keys of twenty on its left): the middle.
        let mut c = run(100, 2);
        c.extend(run(1 << 30, 18));
        assert_eq!(split_point(keys_of(&c).into_iter(), &[40; 20]), 10);
        // Of two jumps in the middle third, the wider.
        let mut d = run(100, 8);
        d.extend(run(100_000, 4));
        d.extend(run(10_000_000, 8));
        assert_eq!(split_point(keys_of(&d).into_iter(), &[40; 20]), 12);
        // Sizes count, not entries: a big value on the left moves the middle left.
        let mut sizes = vec![40; 20];
        sizes[0] = 40 * 19;
        assert_eq!(split_point(keys_of(&b).into_iter(), &sizes), 1);
    }

    /// Blocks in a map, for testing the tree alone.
    #[derive(Default)]
    pub struct MemStore {
        pub blocks: HashMap<u64, Vec<u8>>,
        pub next: u64,
        pub freed: Vec<u64>,
        pub bs: usize,
    }

    impl NodeStore for MemStore {
        fn block_size(&self) -> usize {
            self.bs
        }
        fn read_node(&mut self, blkno: u64, tree: u8) -> FsResult<Node> {
            let b = self
                .blocks
                .get(&blkno)
                .ok_or_else(|| FsError::corrupt(blkno, "unallocated"))?;
            Node::decode(b, blkno, tree)
        }
        fn write_node(&mut self, blkno: u64, node: &Node) -> FsResult<()> {
            let mut b = vec![0; self.bs];
            node.encode_into(blkno, &mut b);
            self.blocks.insert(blkno, b);
            Ok(())
        }
        fn alloc_node(&mut self, _tree: u8) -> FsResult<u64> {
            self.next += 1;
            Ok(self.next)
        }
        fn free_node(&mut self, _tree: u8, blkno: u64) -> FsResult<()> {
            assert!(self.blocks.remove(&blkno).is_some(), "double free");
            self.freed.push(blkno);
            Ok(())
        }
    }

    fn new_tree(bs: usize) -> (MemStore, Root) {
        let mut s = MemStore {
            bs,
            ..Default::default()
        };
        let blk = s.alloc_node(1).expect("alloc");
        s.write_node(blk, &Node::leaf(1)).expect("write");
        (
            s,
            Root {
                blkno: blk,
                level: 0,
            },
        )
    }

    /// A separator of the root raised past keys of the child it leads to (a crafted value under
    /// a valid CRC): edits of that child are refused as corrupt instead of writing a leaf whose
    /// keys no lookup reaches, and edits elsewhere go on.
    #[test]
    fn an_edit_of_a_leaf_holding_keys_outside_its_parents_range_is_corrupt() {
        let (mut s, mut root) = new_tree(512);
        for k in 0..200u64 {
            insert(&mut s, &mut root, 1, Key::new(k, 0), &[1; 8]).expect("insert");
        }
        assert_eq!(root.level, 1, "a root above leaves");
        let mut top = s.read_node(root.blkno, 1).expect("root");
        let Body::Interior(items) = &mut top.body else {
            panic!("interior root")
        };
        assert!(items.len() >= 3);
        // Child 1's range starts at its separator: move that up to child 1's third key.
        let third = {
            let c = s.read_node(items[1].1, 1).expect("child");
            leaf_items(&c)[2].0
        };
        items[1].0 = third;
        s.write_node(root.blkno, &top).expect("write");
        let before = s.blocks.clone();
        // A key at the new separator goes to child 1, whose first keys lie below it now.
        let got = insert(&mut s, &mut root, 1, Key::new(third.a, 1), &[2; 8]);
        assert!(matches!(got, Err(FsError::Corrupt { .. })), "{got:?}");
        let got = remove(&mut s, &mut root, 1, third);
        assert!(matches!(got, Err(FsError::Corrupt { .. })), "{got:?}");
        assert_eq!(s.blocks, before, "nothing written");
        // The last child is in range: edits there work.
        insert(&mut s, &mut root, 1, Key::new(1000, 0), &[3; 8]).expect("insert elsewhere");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, usize),
        Remove(u64),
        Ge(u64),
        Le(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..600, 0usize..200).prop_map(|(k, l)| Op::Insert(k, l)),
            3 => (0u64..600).prop_map(Op::Remove),
            1 => (0u64..600).prop_map(Op::Ge),
            1 => (0u64..600).prop_map(Op::Le),
        ]
    }

    /// First key parts of `matches_btreemap`'s seven objects: apart by more than `SPLIT_GAP`,
    /// so that splits fall between objects as well as at the middle.
    const OBJECTS_APART: u64 = SPLIT_GAP + 1;

    proptest! {
        /// The tree behaves as an ordered map, and never leaks nor double-frees a node.
        #[test]
        fn matches_btreemap(ops in proptest::collection::vec(op(), 1..1500)) {
            let (mut s, mut root) = new_tree(512);
            let mut model: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, l) => {
                        let key = Key::new(k % 7 * OBJECTS_APART, k);
                        let l = l.min(crate::fs::tree::node::max_value_bytes(512));
                        let v = vec![(k % 251) as u8; l];
                        let old = insert(&mut s, &mut root, 1, key, &v).expect("insert");
                        prop_assert_eq!(old, model.insert(key, v));
                    }
                    Op::Remove(k) => {
                        let key = Key::new(k % 7 * OBJECTS_APART, k);
                        let old = remove(&mut s, &mut root, 1, key).expect("remove");
                        prop_assert_eq!(old, model.remove(&key));
                    }
                    Op::Ge(k) => {
                        let key = Key::new(k % 7 * OBJECTS_APART, k);
                        let got = seek_ge(&mut s, root, 1, key).expect("ge");
                        let want = model.range(key..).next().map(|(k, v)| (*k, v.clone()));
                        prop_assert_eq!(got, want);
                    }
                    Op::Le(k) => {
                        let key = Key::new(k % 7 * OBJECTS_APART, k);
                        let got = seek_le(&mut s, root, 1, key).expect("le");
                        let want = model.range(..=key).next_back().map(|(k, v)| (*k, v.clone()));
                        prop_assert_eq!(got, want);
                    }
                }
            }
            let all = range(&mut s, root, 1, Key::MIN, Key::MAX, usize::MAX).expect("range");
            let want: Vec<_> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
            prop_assert_eq!(&all, &want);
            let scanned = scan(&mut s, root, 1, Key::MIN, Key::MAX, usize::MAX).expect("scan");
            prop_assert_eq!(&scanned, &want);
            let from = Key::new(3 * OBJECTS_APART, 0);
            let to = Key::new(5 * OBJECTS_APART, u64::MAX);
            let part = scan(&mut s, root, 1, from, to, 17).expect("scan");
            let want_part: Vec<_> = model.range(from..=to).take(17).map(|(k, v)| (*k, v.clone())).collect();
            prop_assert_eq!(part, want_part);
            let mut reachable = 0;
            walk(&mut s, root, 1, &mut |_, _| { reachable += 1; Ok(()) }).expect("walk");
            prop_assert_eq!(reachable, s.blocks.len(), "every allocated node is reachable");
        }
    }

    /// Ascending keys (inode numbers in a run, file blocks) fill each node before the next:
    /// halves left behind by splits would never be filled again.
    #[test]
    fn appended_keys_fill_their_nodes() {
        let (mut s, mut root) = new_tree(4096);
        use crate::fs::tree::node::{LEAF_ENTRY_BYTES, NODE_HEADER_BYTES};
        let per_leaf = (4096 - NODE_HEADER_BYTES) / (LEAF_ENTRY_BYTES + 8);
        let n = 100 * per_leaf as u64;
        for i in 0..n {
            insert(&mut s, &mut root, 1, Key::new(1, i), &i.to_le_bytes()).expect("insert");
        }
        let mut leaves = 0;
        walk(&mut s, root, 1, &mut |_, node| {
            leaves += usize::from(node.level == 0);
            Ok(())
        })
        .expect("walk");
        assert_eq!(leaves, 100, "{n} items of {per_leaf} a leaf");
        // A full leaf growing inside still splits in halves.
        insert(&mut s, &mut root, 1, Key::new(1, 10), &[7; 64]).expect("insert");
        let mut leaves = 0;
        walk(&mut s, root, 1, &mut |_, node| {
            leaves += usize::from(node.level == 0);
            Ok(())
        })
        .expect("walk");
        assert_eq!(leaves, 101);
    }

    /// An interior node's first key bounds nothing (its bound is inherited from the parent),
    /// and it can stand above keys that reach its first child: when a removal empties the
    /// first child of a node above the leaves, the next child's own first key stays what it
    /// was, and a root that collapses onto its child keeps the child's. A split of that first
    /// child below the key puts its separator after it: the node's keys, written out of order,
    /// were refused as corrupt by the next read (generic/074, the free-by-size tree).
    #[test]
    fn a_split_below_a_first_key_that_bounds_nothing_keeps_the_keys_in_order() {
        let (mut s, mut root) = new_tree(512);
        let key = |i: u64| Key::new(1, i);
        for i in 0..2000 {
            insert(&mut s, &mut root, 1, key(i), &[]).expect("insert");
        }
        assert!(
            root.level >= 2,
            "a tree of three levels, not {}",
            root.level
        );
        // Empty the root's first child: the next one's first key now stands above the keys
        // that reach it.
        let first = match s.read_node(root.blkno, 1).expect("root").body {
            Body::Interior(items) => items[1].0,
            Body::Leaf(_) => unreachable!("the root is interior"),
        };
        for i in 0..first.b {
            assert!(remove(&mut s, &mut root, 1, key(i))
                .expect("remove")
                .is_some());
        }
        // Keys below it again, enough that its first leaf splits below it.
        for i in (0..first.b).rev() {
            insert(&mut s, &mut root, 1, key(i), &[]).expect("insert below the first key");
        }
        let all = range(&mut s, root, 1, Key::MIN, Key::MAX, usize::MAX).expect("range");
        assert_eq!(all.len(), 2000);
        assert!(all
            .iter()
            .enumerate()
            .all(|(i, (k, _))| *k == key(i as u64)));
        walk(&mut s, root, 1, &mut |_, _| Ok(())).expect("every node decodes");
    }

    #[test]
    fn grows_and_shrinks_back_to_one_leaf() {
        let (mut s, mut root) = new_tree(4096);
        for i in 0..50_000u64 {
            insert(&mut s, &mut root, 1, Key::new(1, i), &i.to_le_bytes()).expect("insert");
        }
        assert!(root.level >= 2, "50k items make a tree of height 3");
        for i in 0..50_000u64 {
            let v = get(&mut s, root, 1, Key::new(1, i)).expect("get");
            assert_eq!(v, Some(i.to_le_bytes().to_vec()));
        }
        for i in 0..50_000u64 {
            assert!(remove(&mut s, &mut root, 1, Key::new(1, i))
                .expect("remove")
                .is_some());
        }
        assert_eq!(root.level, 0);
        assert_eq!(s.blocks.len(), 1, "only the root leaf is left");
    }
}
