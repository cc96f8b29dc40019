//! Bulk-loading a tree from sorted items into given blocks, and the block ranges arithmetic
//! that says which blocks are free.

use crate::fs::tree::btree::Root;
use crate::fs::tree::node::{
    Body, Key, Node, Value, INTERIOR_ENTRY_BYTES, LEAF_ENTRY_BYTES, NODE_HEADER_BYTES,
};
use std::ops::Range;

/// Nodes are filled to three quarters, so that the first inserts after a repair do not split
/// every node they touch.
fn leaf_room(bs: usize) -> usize {
    (bs - NODE_HEADER_BYTES) * 3 / 4
}

fn fanout(bs: usize) -> usize {
    ((bs - NODE_HEADER_BYTES) / INTERIOR_ENTRY_BYTES * 3 / 4).max(2)
}

/// How items of the given value sizes fall into leaves, and the interior nodes above them.
pub(super) struct Shape {
    pub leaves: Vec<Range<usize>>,
    /// Nodes at each interior level, bottom up.
    pub interior: Vec<usize>,
}

impl Shape {
    pub fn new(sizes: impl Iterator<Item = usize>, bs: usize) -> Shape {
        let room = leaf_room(bs);
        let mut leaves = Vec::new();
        let (mut start, mut used, mut n) = (0, 0, 0);
        for len in sizes {
            let need = LEAF_ENTRY_BYTES + len;
            if used + need > room && n > start {
                leaves.push(start..n);
                start = n;
                used = 0;
            }
            used += need;
            n += 1;
        }
        // An empty tree is one empty leaf, its root.
        if n > start || leaves.is_empty() {
            leaves.push(start..n);
        }
        let mut interior = Vec::new();
        let mut width = leaves.len();
        while width > 1 {
            width = width.div_ceil(fanout(bs));
            interior.push(width);
        }
        Shape { leaves, interior }
    }

    pub fn nodes(&self) -> usize {
        self.leaves.len() + self.interior.iter().sum::<usize>()
    }
}

/// Nodes a tree of `n` items with empty values needs (the free-space trees).
pub(super) fn nodes_for_empty_values(n: usize, bs: usize) -> usize {
    Shape::new(std::iter::repeat_n(0, n), bs).nodes()
}

/// Builds tree `tree` of `items` (sorted, unique keys) in `blocks` (exactly
/// `Shape::nodes` of them): its root and every node with its block.
pub(super) fn build(
    items: &[(Key, Vec<u8>)],
    tree: u8,
    blocks: &[u64],
    bs: usize,
) -> (Root, Vec<(u64, Node)>) {
    let shape = Shape::new(items.iter().map(|(_, v)| v.len()), bs);
    assert_eq!(blocks.len(), shape.nodes(), "blocks for every node");
    let mut next = blocks.iter().copied();
    let mut out = Vec::with_capacity(blocks.len());
    // (first key, block) of each node of the level below.
    let mut below: Vec<(Key, u64)> = Vec::with_capacity(shape.leaves.len());
    for r in &shape.leaves {
        let blk = next.next().expect("counted");
        let leaf: Vec<(Key, Value)> = items[r.clone()]
            .iter()
            .map(|(k, v)| (*k, Value::copy_from_slice(v)))
            .collect();
        below.push((leaf.first().map_or(Key::MIN, |e| e.0), blk));
        out.push((
            blk,
            Node {
                tree,
                level: 0,
                body: Body::Leaf(leaf),
            },
        ));
    }
    let mut level = 0u8;
    while below.len() > 1 {
        level += 1;
        let mut up = Vec::with_capacity(below.len().div_ceil(fanout(bs)));
        for (i, chunk) in below.chunks(fanout(bs)).enumerate() {
            let blk = next.next().expect("counted");
            let mut entries = chunk.to_vec();
            // The leftmost node of a level takes every key below its first, as a root split
            // makes it (`btree.rs`).
            if i == 0 {
                entries[0].0 = Key::MIN;
            }
            up.push((chunk[0].0, blk));
            out.push((
                blk,
                Node {
                    tree,
                    level,
                    body: Body::Interior(entries),
                },
            ));
        }
        below = up;
    }
    let root = Root {
        blkno: below.first().map_or(blocks[0], |e| e.1),
        level,
    };
    (root, out)
}

/// Disjoint sorted block ranges `(start, len)`, merged where they meet.
pub(super) fn merged(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.retain(|r| r.1 > 0);
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, l) in v {
        match out.last_mut() {
            Some(last) if s <= last.0.saturating_add(last.1) => {
                last.1 = last.1.max(s.saturating_add(l) - last.0);
            }
            _ => out.push((s, l)),
        }
    }
    out
}

/// The blocks of `[start, end)` in none of `used`.
pub(super) fn complement(used: Vec<(u64, u64)>, start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = start;
    for (s, l) in merged(used) {
        // Saturating: a damaged tree's extent may run past the numbers.
        let e = s.saturating_add(l).min(end);
        if s > at && at < end {
            out.push((at, s.min(end) - at));
        }
        at = at.max(e);
    }
    if at < end {
        out.push((at, end - at));
    }
    out
}

/// The first `n` blocks of `runs`, or None if they hold fewer.
pub(super) fn take_front(runs: &[(u64, u64)], n: usize) -> Option<Vec<u64>> {
    let mut out = Vec::with_capacity(n);
    for &(s, l) in runs {
        for b in s..s + l {
            if out.len() == n {
                return Some(out);
            }
            out.push(b);
        }
    }
    (out.len() == n).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_complement() {
        assert_eq!(
            merged(vec![(5, 2), (1, 2), (3, 1), (7, 0)]),
            vec![(1, 3), (5, 2)]
        );
        assert_eq!(
            complement(vec![(5, 2), (1, 2)], 0, 10),
            vec![(0, 1), (3, 2), (7, 3)]
        );
        assert_eq!(complement(vec![(0, 10)], 0, 10), vec![]);
        assert_eq!(take_front(&[(3, 2), (9, 3)], 4), Some(vec![3, 4, 9, 10]));
        assert_eq!(take_front(&[(3, 2)], 3), None);
    }

    #[test]
    fn a_bulk_load_decodes_and_holds_every_item_in_order() {
        let bs = 2048;
        let items: Vec<(Key, Vec<u8>)> = (0..3000u64)
            .map(|i| (Key::new(i, i * 7), vec![i as u8; (i % 40) as usize]))
            .collect();
        let shape = Shape::new(items.iter().map(|(_, v)| v.len()), bs);
        assert!(shape.interior.len() >= 2, "three levels");
        let blocks: Vec<u64> = (100..100 + shape.nodes() as u64).collect();
        let (root, nodes) = build(&items, 1, &blocks, bs);
        let mut got = Vec::new();
        let by_blk: std::collections::HashMap<u64, Node> = nodes
            .into_iter()
            .map(|(b, n)| {
                let mut raw = vec![0u8; bs];
                n.encode_into(b, &mut raw);
                (b, Node::decode(&raw, b, 1).unwrap())
            })
            .collect();
        let mut stack = vec![(root.blkno, root.level)];
        while let Some((b, lvl)) = stack.pop() {
            let n = &by_blk[&b];
            assert_eq!(n.level, lvl);
            match &n.body {
                Body::Leaf(v) => got.extend(v.iter().map(|(k, v)| (*k, v.to_vec()))),
                Body::Interior(v) => stack.extend(v.iter().rev().map(|(_, c)| (*c, lvl - 1))),
            }
        }
        assert_eq!(got, items);
        let empty = Shape::new(std::iter::empty(), bs);
        assert_eq!(empty.nodes(), 1);
    }
}
