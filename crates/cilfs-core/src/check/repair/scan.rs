//! Reading the old trees: a walk from a root that notes every subtree it cannot read as a lost
//! key range, and a scan of the whole data area for fs-tree leaves that fill those ranges.

use super::Area;
use super::{Img, Progress, RepairError};
use crate::fs::items::header::TREE_FS;
use crate::fs::tree::btree::Root;
use crate::fs::tree::node::{check_leaf_layout, Body, Key, Node, NODE_LSN_OFFSET, NODE_MAGIC};
use crate::log::stamp::read_lsn_stamp;
use crate::log::Lsn;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What a walk of one tree found.
#[derive(Debug, Default)]
pub(super) struct Walked {
    /// Items of the leaves that read, with their leaf's stamp: the newest wins a key.
    pub items: BTreeMap<Key, (Lsn, Vec<u8>)>,
    /// Key ranges `[lo, hi)` (hi None: to the end) under subtrees that did not read.
    pub lost: Vec<(Key, Option<Key>)>,
    /// Why each lost range was lost, by its low key.
    pub lost_why: HashMap<Key, String>,
    /// Every block the tree points at, read or not.
    pub referenced: BTreeSet<u64>,
    /// The nodes that read, verified and decoded.
    pub readable: Vec<u64>,
    /// Stamped fs-tree leaves the scan found outside the tree (`scan_leaves`): until the new
    /// header is written they may hold the only copy of what the repair keeps, so no new
    /// node may be written over them (a crash before the header would lose it for good).
    pub found_leaves: Vec<u64>,
    /// Problems of shape the checker reports in nodes that did read (keys outside their
    /// parent's range, empty leaves, unpacked values, a node reached twice): the tree must
    /// be rebuilt even when no item changes.
    pub shape: Vec<String>,
}

impl Walked {
    /// No tree to walk (the header is unreadable): everything is lost.
    pub fn all_lost() -> Self {
        let mut w = Walked::default();
        w.lost.push((Key::MIN, None));
        w.lost_why
            .insert(Key::MIN, "the header is unreadable".into());
        w
    }

    /// Whether the tree's shape is wrong though every item is there.
    pub fn unsound(&self) -> bool {
        !self.shape.is_empty()
    }

    fn in_lost(&self, k: Key) -> bool {
        self.lost
            .iter()
            .any(|(lo, hi)| k >= *lo && hi.is_none_or(|h| k < h))
    }
}

/// Reads block `blk` as a node of `tree`: the stamp must verify (this filesystem's UUID, the
/// block's CRC) and the node decode. Returns it with its stamp's LSN.
fn read_node(img: &Img, blk: u64, tree: u8) -> Result<(Node, Lsn, Vec<u8>), String> {
    let b = img.read(blk).map_err(|e| format!("block {blk}: {e}"))?;
    let lsn = read_lsn_stamp(&b, NODE_LSN_OFFSET, &img.uuid)
        .ok_or_else(|| format!("block {blk}: no valid stamp (checksum or UUID)"))?;
    let n = Node::decode(&b, blk, tree).map_err(|e| e.to_string())?;
    Ok((n, lsn, b.to_vec()))
}

/// Walks a tree from `root`, every node with the key range its parent allows.
pub(super) fn walk(
    img: &Img,
    area: &Area,
    root: Root,
    tree: u8,
    progress: &mut Progress,
) -> Result<Walked, RepairError> {
    let mut w = Walked::default();
    let mut stack = vec![(root.blkno, root.level, Key::MIN, None::<Key>)];
    while let Some((blk, level, lo, hi)) = stack.pop() {
        let lose = |w: &mut Walked, why: String| {
            w.lost.push((lo, hi));
            w.lost_why.insert(lo, why);
        };
        if !w.referenced.insert(blk) {
            // Its items are taken where it was met first; here its range is lost.
            w.shape.push(format!("block {blk} is reached twice"));
            lose(&mut w, format!("block {blk} is reached twice"));
            continue;
        }
        if !(area.start..area.end).contains(&blk) {
            lose(&mut w, format!("block {blk} outside the data area"));
            continue;
        }
        let (n, lsn, raw) = match read_node(img, blk, tree) {
            Ok(x) => x,
            Err(why) => {
                lose(&mut w, why);
                continue;
            }
        };
        if n.level != level {
            lose(
                &mut w,
                format!("block {blk} at level {} where {level} expected", n.level),
            );
            continue;
        }
        w.readable.push(blk);
        if w.readable.len() % 256 == 0 {
            progress.tell("walk", w.readable.len() as u64, 0);
        }
        let in_bounds = |k: Key| k >= lo && hi.is_none_or(|h| k < h);
        match n.body {
            Body::Leaf(items) => {
                if items.is_empty() && blk != root.blkno {
                    w.shape.push(format!("empty leaf {blk} below the root"));
                }
                if let Err(e) = check_leaf_layout(&raw, blk, tree) {
                    w.shape.push(e.to_string());
                }
                for (k, v) in items {
                    if !in_bounds(k) {
                        w.shape
                            .push(format!("key {k:?} in block {blk} outside its range"));
                    }
                    take(&mut w.items, k, lsn, &v);
                }
            }
            Body::Interior(items) => {
                for i in (0..items.len()).rev() {
                    let (k, child) = items[i];
                    if i > 0 && !in_bounds(k) {
                        w.shape
                            .push(format!("separator {k:?} in block {blk} outside its range"));
                    }
                    let child_lo = if i == 0 { lo } else { k };
                    let child_hi = items.get(i + 1).map(|e| e.0).or(hi);
                    stack.push((child, level - 1, child_lo, child_hi));
                }
            }
        }
    }
    w.lost.sort();
    Ok(w)
}

/// Keeps `v` for `k` unless a newer stamp gave one already.
fn take(items: &mut BTreeMap<Key, (Lsn, Vec<u8>)>, k: Key, lsn: Lsn, v: &[u8]) -> bool {
    match items.get(&k) {
        Some((l, _)) if *l >= lsn => false,
        _ => {
            items.insert(k, (lsn, v.to_vec()));
            true
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct ScanStats {
    pub blocks: u64,
    pub leaves: u64,
    pub items: u64,
}

/// Blocks read at once by the scan.
const SCAN_RUN_BLOCKS: u64 = 256;

/// Reads every block of the data area the walk did not read already, and takes from each
/// stamped fs-tree leaf its items in the walk's lost ranges, the newest stamp winning a key.
/// `free`: the free extents, when both free-space trees read whole and agree: no leaf lies
/// there (a leaf freed since, which would bring back what was removed, least of all), and on
/// a large filesystem most blocks are free. None scans the whole area.
pub(super) fn scan_leaves(
    img: &Img,
    area: &Area,
    w: &mut Walked,
    free: Option<Vec<(u64, u64)>>,
    progress: &mut Progress,
) -> Result<ScanStats, RepairError> {
    let mut st = ScanStats::default();
    let known: BTreeSet<u64> = w.readable.iter().copied().collect();
    let runs = match free {
        Some(f) => super::build::complement(f, area.start, area.end),
        None => vec![(area.start, area.end - area.start)],
    };
    let total: u64 = runs.iter().map(|r| r.1).sum();
    let mut found: BTreeMap<Key, (Lsn, Vec<u8>)> = BTreeMap::new();
    let mut done = 0;
    for (at, end) in runs.into_iter().map(|(s, l)| (s, s + l)) {
        scan_run(
            img, at, end, &known, w, &mut found, &mut st, &mut done, total, progress,
        )?;
    }
    for (k, (lsn, v)) in found {
        if take(&mut w.items, k, lsn, &v) {
            st.items += 1;
        }
    }
    Ok(st)
}

/// Scans blocks `[at, end)` for fs-tree leaves (see `scan_leaves`).
#[allow(clippy::too_many_arguments)]
fn scan_run(
    img: &Img,
    mut at: u64,
    end: u64,
    known: &BTreeSet<u64>,
    w: &mut Walked,
    found: &mut BTreeMap<Key, (Lsn, Vec<u8>)>,
    st: &mut ScanStats,
    done: &mut u64,
    total: u64,
    progress: &mut Progress,
) -> Result<(), RepairError> {
    while at < end {
        let n = SCAN_RUN_BLOCKS.min(end - at);
        let run = img.read_blocks(at, n as usize)?;
        for (i, b) in run.chunks_exact(img.bs).enumerate() {
            let blk = at + i as u64;
            st.blocks += 1;
            // Cheap tests first: most blocks are file data.
            if known.contains(&blk)
                || b[0..4] != NODE_MAGIC.to_le_bytes()
                || b[4] != 0
                || b[5] != TREE_FS
            {
                continue;
            }
            let Some(lsn) = read_lsn_stamp(b, NODE_LSN_OFFSET, &img.uuid) else {
                continue;
            };
            let Ok(node) = Node::decode(b, blk, TREE_FS) else {
                continue;
            };
            st.leaves += 1;
            w.found_leaves.push(blk);
            if let Body::Leaf(items) = node.body {
                for (k, v) in items {
                    if w.in_lost(k) {
                        take(found, k, lsn, &v);
                    }
                }
            }
        }
        at += n;
        *done += n;
        progress.tell("scan", *done, total);
    }
    Ok(())
}
