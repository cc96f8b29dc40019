//! Diff logging of tree nodes: what a new image of a node logs over the block as the
//! transaction sees it (the bytes that differ, and the used bytes of its old unused stretch).

use crate::fs::tree::node::unused_stretch;
use crate::journal::Transaction;

/// Logs a new image of a node's block: for a block whose old contents do not count (a node
/// this transaction allocated), the `used` ranges, every byte that means something; else the
/// bytes that differ from the block as the transaction sees it, and the `used` bytes that were
/// in its unused stretch, whatever they hold: those may never have been logged, so the block a
/// replay rebuilds may hold anything there (`node::unused_stretch`).
pub(super) fn write_diff(
    tx: &mut Transaction<'_>,
    b: crate::trans::BufRef,
    block: Vec<u8>,
    used: Vec<(usize, usize)>,
    whole: bool,
) {
    // The free middle between the two used ranges holds nothing and is never logged.
    let unlogged = (
        used.first().map_or(0, |r| r.1),
        used.get(1).map_or(block.len(), |r| r.0),
    );
    let unlogged = (unlogged.0 <= unlogged.1).then_some(unlogged);
    let ranges = if whole {
        used
    } else {
        tx.read(b, |cur| ranges_to_log(cur, &block, &used))
    };
    if !ranges.is_empty() {
        tx.replace(b, block, &ranges, unlogged);
    }
}

/// What a new image `new` of a node, whose meaningful bytes are `used`, logs over `cur`, the
/// block as the transaction sees it: the bytes that differ, and the used bytes that were in
/// `cur`'s unused stretch (`node::unused_stretch`), whatever they hold.
fn ranges_to_log(cur: &[u8], new: &[u8], used: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let (g0, g1) = unused_stretch(cur);
    // `new`'s unused stretch is what `used` leaves between its two ranges; where it meets
    // `cur`'s, the diff need not look (it checks the bytes equal before it trusts that).
    let n0 = used.first().map_or(0, |r| r.1);
    let n1 = used.get(1).map_or(new.len(), |r| r.0);
    let (h0, h1) = (g0.max(n0), g1.min(n1));
    let mut r = differing_ranges(cur, new, (h0 < h1).then_some((h0, h1)));
    r.extend(
        used.iter()
            .map(|&(s, e)| (s.max(g0), e.min(g1)))
            .filter(|&(s, e)| s < e),
    );
    r
}

/// Bytes compared at once by `differing_range` (slice equality is a vectorised memcmp).
const DIFF_CHUNK: usize = 64;

/// The byte ranges `[start, end)` where `a` and `b` (of one length) differ, in order, each
/// beginning and ending with a differing byte. With `hole`, a stretch expected equal (the free
/// middle of a leaf, between the entries and the values), checked equal here: the changes on
/// either side of it are two ranges. A leaf insert changes the count in the header, the entries
/// after the new one and the values that moved, with the free middle unchanged between them:
/// one range from the first change to the last logged that middle too, for every leaf of every
/// create. Without a hole, or one that differs, one range from the first change to the last.
fn differing_ranges(a: &[u8], b: &[u8], hole: Option<(usize, usize)>) -> Vec<(usize, usize)> {
    // A shorter `b` would make a range run past it, or miss a difference.
    assert_eq!(a.len(), b.len(), "diffing blocks of different sizes");
    let around =
        hole.filter(|&(h0, h1)| h0 + DIFF_CHUNK <= h1 && h1 <= a.len() && a[h0..h1] == b[h0..h1]);
    let Some((h0, h1)) = around else {
        return differing_range(a, b)
            .map(|(f, l)| vec![(f, l + 1)])
            .unwrap_or_default();
    };
    let below = differing_range(&a[..h0], &b[..h0]).map(|(f, l)| (f, l + 1));
    let above = differing_range(&a[h1..], &b[h1..]).map(|(f, l)| (h1 + f, h1 + l + 1));
    below.into_iter().chain(above).collect()
}

/// The first and last index at which `a` and `b` (of one length) differ, or None if they are
/// equal. Runs on every tree node a transaction writes: compared a byte at a time it took a
/// fifth of the CPU of creating and unlinking a million names, so whole chunks are compared
/// first and only a differing chunk is searched byte by byte.
fn differing_range(a: &[u8], b: &[u8]) -> Option<(usize, usize)> {
    // A shorter `b` would make the range run past it, or miss a difference.
    assert_eq!(a.len(), b.len(), "diffing blocks of different sizes");
    let first = a
        .chunks(DIFF_CHUNK)
        .zip(b.chunks(DIFF_CHUNK))
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .and_then(|(k, (x, y))| {
            let i = x.iter().zip(y.iter()).position(|(p, q)| p != q)?;
            Some(k * DIFF_CHUNK + i)
        })?;
    let mut end = a.len();
    for (x, y) in a.rchunks(DIFF_CHUNK).zip(b.rchunks(DIFF_CHUNK)) {
        let start = end - x.len();
        if x != y {
            let i = x.iter().zip(y).rposition(|(p, q)| p != q)?;
            return Some((first, start + i));
        }
        end = start;
    }
    None
}

#[cfg(test)]
mod diff_tests {
    use super::ranges_to_log;
    use super::{differing_range, differing_ranges, DIFF_CHUNK};
    use crate::fs::tree::node::{Body, Key, Node};
    use proptest::prelude::*;

    /// `a`, and a copy of it with `changes` (position, nonzero delta) added.
    fn changed<'a>(a: &'a [u8], changes: &[(prop::sample::Index, u8)]) -> (&'a [u8], Vec<u8>) {
        let mut b = a.to_vec();
        if !a.is_empty() {
            for (at, delta) in changes {
                let i = at.index(a.len());
                b[i] = b[i].wrapping_add(*delta);
            }
        }
        (a, b)
    }

    /// The range a byte-by-byte comparison finds.
    fn bytewise(a: &[u8], b: &[u8]) -> Option<(usize, usize)> {
        let first = a.iter().zip(b).position(|(x, y)| x != y)?;
        let last = a.iter().zip(b).rposition(|(x, y)| x != y)?;
        Some((first, last))
    }

    proptest! {
        /// Same answer as the byte loop for any block length (chunk boundaries or not) and any
        /// set of changed bytes, including none, one, and the first and last byte.
        #[test]
        fn differing_range_matches_a_bytewise_search(
            len in 0usize..600,
            seed in proptest::collection::vec(any::<u8>(), 600),
            changes in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..4),
        ) {
            let (a, b) = changed(&seed[..len], &changes);
            prop_assert_eq!(differing_range(a, &b), bytewise(a, &b));
        }

        /// With any hole, right or wrong: every differing byte is in a range and every byte
        /// outside them is equal; each range begins and ends with a differing byte; ranges
        /// are in order.
        #[test]
        fn differing_ranges_cover_exactly_the_changes(
            len in 0usize..600,
            seed in proptest::collection::vec(any::<u8>(), 600),
            changes in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..6),
            hole in proptest::option::of((0usize..700, 0usize..700)),
        ) {
            let (a, b) = changed(&seed[..len], &changes);
            let r = differing_ranges(a, &b, hole);
            let inside = |i: usize| r.iter().any(|&(s, e)| s <= i && i < e);
            for i in 0..len {
                prop_assert!(a[i] == b[i] || inside(i), "byte {} differs outside {:?}", i, r);
            }
            for &(s, e) in &r {
                prop_assert!(s < e && a[s] != b[s] && a[e - 1] != b[e - 1], "{:?}", r);
            }
            for w in r.windows(2) {
                prop_assert!(w[1].0 > w[0].1, "{:?}", r);
            }
        }
    }

    #[test]
    fn edges_of_a_block() {
        let a = vec![0u8; 4096];
        let mut b = a.clone();
        assert_eq!(differing_range(&a, &b), None);
        b[0] = 1;
        assert_eq!(differing_range(&a, &b), Some((0, 0)));
        b[4095] = 1;
        assert_eq!(differing_range(&a, &b), Some((0, 4095)));
        b[0] = 0;
        b[63] = 2;
        b[64] = 2;
        assert_eq!(differing_range(&a, &b), Some((63, 4095)));
        assert_eq!(differing_ranges(&a, &b, None), vec![(63, 4096)]);
        assert_eq!(
            differing_ranges(&a, &b, Some((100, 4000))),
            vec![(63, 65), (4095, 4096)]
        );
        // A hole that is not equal is not trusted.
        assert_eq!(differing_ranges(&a, &b, Some((0, 4000))), vec![(63, 4096)]);
    }

    /// An insert into the middle of a leaf logs two ranges around its free middle.
    #[test]
    fn a_leaf_insert_leaves_the_free_middle_out() {
        let node = |n: u64| Node {
            tree: 1,
            level: 0,
            body: Body::Leaf(
                (0..n)
                    .map(|i| (Key::new(1, i * 2), vec![i as u8; 30].into()))
                    .collect(),
            ),
        };
        let mut a = vec![0u8; 4096];
        node(40).encode_into(5, &mut a);
        let mut grown = node(40);
        if let Body::Leaf(items) = &mut grown.body {
            items.insert(20, (Key::new(1, 39), vec![0xEE; 30].into()));
        }
        let mut b = a.clone();
        grown.encode_into(5, &mut b);
        let used = grown.used_ranges(4096);
        let hole = (used[0].1, used[1].0);
        let mut r = crate::buf::RangeSet::default();
        for (s, e) in ranges_to_log(&a, &b, &used) {
            r.insert(s as u32, (e - s) as u32);
        }
        assert_eq!(r.ranges().len(), 2, "{r:?}");
        let logged = r.bytes() as usize;
        assert!(
            logged < 4096 - (hole.1 - hole.0) + DIFF_CHUNK,
            "{logged} bytes"
        );
    }
}

/// The logging rule of tree nodes end to end: a leaf changed again and again, in place
/// (`leaf_put_raw`, `leaf_remove_raw`) or the decoding way (`encode_into`, as `write_node`),
/// with a "disk" that receives only what `ranges_to_log` logs, starting from junk as a block a
/// new node replays onto. (Written by a review of the in-place edits, 2026-11-27.)
#[cfg(test)]
mod logged_leaf_tests {
    use super::ranges_to_log;
    use crate::fs::tree::node::{
        leaf_put_raw, leaf_remove_raw, max_value_bytes, Body, Key, KeyRange, Node,
    };
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Put(u64, usize, u8),
        Remove(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..60, 0usize..400, any::<u8>()).prop_map(|(k, l, b)| Op::Put(k, l, b)),
            (0u64..60, 0usize..3, any::<u8>()).prop_map(|(k, l, b)| Op::Put(k, l, b)),
            (0u64..60, prop::sample::select(vec![112usize]), any::<u8>())
                .prop_map(|(k, l, b)| Op::Put(k, l, b)),
            (0u64..60).prop_map(Op::Remove),
        ]
    }

    fn leaf(model: &BTreeMap<u64, Vec<u8>>) -> Node {
        let items = model
            .iter()
            .map(|(&k, v)| (Key::new(k, 0), v.clone().into()))
            .collect();
        Node {
            tree: 1,
            level: 0,
            body: Body::Leaf(items),
        }
    }

    fn apply(disk: &mut [u8], new: &[u8], ranges: &[(usize, usize)]) {
        for &(s, e) in ranges {
            disk[s..e].copy_from_slice(&new[s..e]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn a_leaf_replays_to_what_memory_holds(
            ops in proptest::collection::vec(op(), 1..120),
            bs in prop::sample::select(vec![512usize, 4096, 65536]),
            junk in any::<u8>(),
        ) {
            let blk = 7;
            let mut mem = vec![junk; bs];
            let mut disk = vec![junk ^ 0x5A; bs];
            let mut model = BTreeMap::new();
            // A new node: written whole, its used ranges logged.
            leaf(&model).encode_into(blk, &mut mem);
            apply(&mut disk, &mem, &leaf(&model).used_ranges(bs));
            for o in ops {
                let cur = mem.clone();
                let mut new = mem.clone();
                let used = match o {
                    Op::Put(k, l, b) => {
                        let v = vec![b; l.min(max_value_bytes(bs))];
                        match leaf_put_raw(&mut new, blk, 1, Key::new(k, 0), &v, KeyRange::ALL).unwrap() {
                            Some(p) => {
                                prop_assert_eq!(p.old, model.insert(k, v));
                                p.used
                            }
                            None => {
                                let mut m = model.clone();
                                m.insert(k, v);
                                if leaf(&m).encoded_bytes() > bs {
                                    continue;
                                }
                                model = m;
                                leaf(&model).encode_into(blk, &mut new);
                                leaf(&model).used_ranges(bs)
                            }
                        }
                    }
                    Op::Remove(k) => match leaf_remove_raw(&mut new, blk, 1, Key::new(k, 0), KeyRange::ALL).unwrap() {
                        Some(p) => {
                            prop_assert_eq!(p.old, model.remove(&k));
                            p.used
                        }
                        None => {
                            if model.remove(&k).is_none() {
                                continue;
                            }
                            leaf(&model).encode_into(blk, &mut new);
                            leaf(&model).used_ranges(bs)
                        }
                    },
                };
                apply(&mut disk, &new, &ranges_to_log(&cur, &new, &used));
                mem = new;
                let want = leaf(&model);
                prop_assert_eq!(&Node::decode(&mem, blk, 1).unwrap(), &want);
                prop_assert_eq!(&Node::decode(&disk, blk, 1).unwrap(), &want, "the replayed block");
                for (s, e) in want.used_ranges(bs) {
                    prop_assert_eq!(&mem[s..e], &disk[s..e], "used bytes {}..{}", s, e);
                }
            }
        }
    }
}
