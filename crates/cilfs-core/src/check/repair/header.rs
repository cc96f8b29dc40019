//! The header: read and verified, or rebuilt from the superblock's geometry; the plan of what
//! to rebuild (the fs tree, the free-space trees and free list) and where; and the writes, the
//! header last.

use super::build::{build, complement, merged, nodes_for_empty_values, take_front, Shape};
use super::salvage::Model;
use super::scan::Walked;
use super::{Area, Img, Progress, RepairError};
use crate::fs::items::header::{
    freelist_capacity, Header, HEADER_LSN_OFFSET, TREE_FREE_BY_BLOCK, TREE_FREE_BY_SIZE, TREE_FS,
};
use crate::fs::items::inode::INO_LIMIT;
use crate::fs::tree::keys::{kind_of, KIND_INODE, ORPHAN_OWNER};
use crate::fs::tree::node::{Key, Node, NODE_LSN_OFFSET};
use crate::fs::txn::freelist_band;
use crate::log::stamp::{read_lsn_stamp, write_lsn_stamp};
use crate::log::Lsn;
use std::collections::BTreeSet;

/// The header, if it reads, verifies and agrees with the superblock on the data area.
pub(super) fn read(
    img: &Img,
    area: &Area,
    changes: &mut Vec<String>,
) -> Result<Option<Header>, RepairError> {
    let b = img.read(area.hdr_blk)?;
    let why = if read_lsn_stamp(&b, HEADER_LSN_OFFSET, &img.uuid).is_none() {
        "no valid stamp (checksum or UUID)".to_string()
    } else {
        match Header::decode(&b, area.hdr_blk) {
            Err(e) => e.to_string(),
            Ok(h) if h.data_start != area.start || h.data_end != area.end => format!(
                "its data area {}..{} is not the superblock's {}..{}",
                h.data_start, h.data_end, area.start, area.end
            ),
            Ok(h) => return Ok(Some(h)),
        }
    };
    changes.push(format!(
        "header (block {}): {why}; rebuilt from the superblock and a scan of the data area",
        area.hdr_blk
    ));
    Ok(None)
}

/// What repair writes.
pub(super) struct Plan {
    pub rebuild_fs: bool,
    pub rebuild_free: bool,
    pub nodes: Vec<(u64, Node)>,
    pub header: Option<Header>,
}

/// The free extents a free-space tree's items say, as (start, len), and whether they are
/// well formed.
fn free_items(w: &Walked, by_size: bool) -> (BTreeSet<(u64, u64)>, bool) {
    let mut ok = true;
    let set = w
        .items
        .iter()
        .map(|(k, (_, v))| {
            ok &= v.is_empty() && (if by_size { k.a } else { k.b }) != 0;
            if by_size {
                (k.b, k.a)
            } else {
                (k.a, k.b)
            }
        })
        .collect();
    (set, ok)
}

/// Decides what to rebuild and lays it out: new nodes go only into blocks free in the
/// repaired image and unused by the old one's trees, so the old image stays whole until the
/// header is written.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan(
    img: &Img,
    area: &Area,
    old: Option<&Header>,
    fs_walk: &Walked,
    free_walks: Option<&(Walked, Walked)>,
    m: &Model<'_>,
    rebuild_fs: bool,
    changes: &mut Vec<String>,
) -> Result<Plan, RepairError> {
    let bs = img.bs;
    let items: Vec<(Key, Vec<u8>)> = m.items.iter().map(|(k, v)| (*k, v.clone())).collect();
    let (inode_count, next_ino) = inode_numbers(&items, old);

    // The free space with the old trees and free list kept, and whether the free-space trees
    // and free list say just that.
    let mut rebuild_free = rebuild_fs;
    if let (Some(h), Some((bno, size)), false) = (old, free_walks, rebuild_fs) {
        match kept_free_space(area, h, fs_walk, (bno, size), m) {
            Err(why) => {
                changes.push(format!("free space: {why}: both trees rebuilt"));
                rebuild_free = true;
            }
            Ok(free) => {
                let free_blocks = free.iter().map(|f| f.1).sum();
                let hdr = Header {
                    next_ino,
                    inode_count,
                    free_blocks,
                    ..h.clone()
                };
                return Ok(Plan {
                    rebuild_fs: false,
                    rebuild_free: false,
                    nodes: Vec::new(),
                    header: header_change(old, hdr, changes),
                });
            }
        }
    }
    if rebuild_fs {
        changes.push(format!("fs tree rebuilt: {} items", items.len()));
    }
    if old.is_none() {
        rebuild_free = true;
    }
    debug_assert!(rebuild_free);
    let n_fs = if rebuild_fs {
        Shape::new(items.iter().map(|(_, v)| v.len()), bs).nodes()
    } else {
        0
    };
    let Layout { taken, free, need } = lay_out(bs, area, fs_walk, free_walks, m, rebuild_fs, n_fs)?;
    let fs_blocks = &taken[..n_fs];
    let bno_blocks = &taken[n_fs..n_fs + need];
    let size_blocks = &taken[n_fs + need..n_fs + 2 * need];
    let mut freelist: Vec<u64> = taken[n_fs + 2 * need..].to_vec();
    let high = freelist_band(freelist_capacity(bs)).1;
    if freelist.len() > high {
        // Cannot happen with a few spare nodes; keep the header encodable all the same.
        freelist.truncate(high);
    }

    let mut nodes = Vec::new();
    let fs_root = if rebuild_fs {
        let (root, n) = build(&items, TREE_FS, fs_blocks, bs);
        nodes.extend(n);
        root
    } else {
        old.map(|h| h.fs_root).ok_or(RepairError::NoSpace {
            start: area.start,
            end: area.end,
        })?
    };
    let by_block: Vec<(Key, Vec<u8>)> = free
        .iter()
        .map(|&(s, l)| (Key::new(s, l), Vec::new()))
        .collect();
    let mut by_size: Vec<(Key, Vec<u8>)> = free
        .iter()
        .map(|&(s, l)| (Key::new(l, s), Vec::new()))
        .collect();
    by_size.sort_by_key(|(k, _)| *k);
    let (bno_root, n) = build(&by_block, TREE_FREE_BY_BLOCK, bno_blocks, bs);
    nodes.extend(n);
    let (size_root, n) = build(&by_size, TREE_FREE_BY_SIZE, size_blocks, bs);
    nodes.extend(n);
    changes.push(format!(
        "free-space trees rebuilt: {} free extents, {} blocks; free list of {}",
        free.len(),
        free.iter().map(|f| f.1).sum::<u64>(),
        freelist.len()
    ));
    let hdr = Header {
        fs_root,
        bno_root,
        size_root,
        next_ino,
        free_blocks: free.iter().map(|f| f.1).sum(),
        inode_count,
        data_start: area.start,
        data_end: area.end,
        freelist,
    };
    let header = header_change(old, hdr, changes);
    Ok(Plan {
        rebuild_fs,
        rebuild_free: true,
        nodes,
        header,
    })
}

/// Inodes the items hold, and the next inode number: the old header's if it is past every
/// inode and within the limit.
fn inode_numbers(items: &[(Key, Vec<u8>)], old: Option<&Header>) -> (u64, u64) {
    let inode_count = items
        .iter()
        .filter(|(k, _)| k.a != ORPHAN_OWNER && kind_of(*k) == KIND_INODE)
        .count() as u64;
    let max_ino = items
        .iter()
        .filter(|(k, _)| k.a != ORPHAN_OWNER && kind_of(*k) == KIND_INODE)
        .map(|(k, _)| k.a)
        .max()
        .unwrap_or(0);
    let next_ino = match old.map(|h| h.next_ino) {
        Some(n) if n > max_ino && n <= INO_LIMIT => n,
        _ => max_ino + 1,
    };
    (inode_count, next_ino)
}

/// The blocks of a walked tree's nodes, as claims.
fn old_nodes(w: &Walked) -> Vec<(u64, u64)> {
    w.referenced.iter().map(|b| (*b, 1)).collect()
}

/// The free space with the old trees and free list kept, if the free-space trees and free
/// list say just that; else why not.
fn kept_free_space(
    area: &Area,
    h: &Header,
    fs_walk: &Walked,
    (bno, size): (&Walked, &Walked),
    m: &Model<'_>,
) -> Result<BTreeSet<(u64, u64)>, &'static str> {
    let mut owners = vec![(area.hdr_blk, 1)];
    owners.extend(old_nodes(fs_walk));
    owners.extend(old_nodes(bno));
    owners.extend(old_nodes(size));
    owners.extend(h.freelist.iter().map(|b| (*b, 1)));
    owners.extend(&m.data_claims);
    let total: u64 = owners.iter().map(|o| o.1).sum();
    let overlap = merged(owners.clone()).iter().map(|o| o.1).sum::<u64>() != total;
    let outside = owners
        .iter()
        .any(|&(s, l)| s < area.hdr_blk || s.saturating_add(l) > area.end);
    let free: BTreeSet<(u64, u64)> = complement(owners, area.start, area.end)
        .into_iter()
        .collect();
    let (by_block, ok_b) = free_items(bno, false);
    let (by_size, ok_s) = free_items(size, true);
    let why = if overlap || outside {
        Some("the free list holds blocks owned by something else")
    } else if !bno.lost.is_empty() || !size.lost.is_empty() {
        Some("a free-space tree is unreadable")
    } else if bno.unsound() || size.unsound() || !ok_b || !ok_s {
        Some("a free-space tree is malformed")
    } else if by_block != free || by_size != free {
        Some("the free-space trees do not hold the free space")
    } else {
        None
    };
    match why {
        Some(why) => Err(why),
        None => Ok(free),
    }
}

/// Where the rebuilt trees and the free list go: blocks free in the repaired image and unused
/// by the old one's trees, `n_fs` for the fs tree first. The free-space trees' size depends on
/// the free extents, which depend on where their nodes go: grown until they fit.
fn lay_out(
    bs: usize,
    area: &Area,
    fs_walk: &Walked,
    free_walks: Option<&(Walked, Walked)>,
    m: &Model<'_>,
    rebuild_fs: bool,
    n_fs: usize,
) -> Result<Layout, RepairError> {
    // Blocks new nodes and the free list may take.
    let hdr_claim = (area.hdr_blk, 1);
    let mut unavailable = vec![hdr_claim];
    unavailable.extend(old_nodes(fs_walk));
    unavailable.extend(fs_walk.found_leaves.iter().map(|b| (*b, 1)));
    if let Some((bno, size)) = free_walks {
        unavailable.extend(old_nodes(bno));
        unavailable.extend(old_nodes(size));
    }
    unavailable.extend(&m.data_claims);
    let candidates = complement(unavailable, area.start, area.end);
    let cap = freelist_capacity(bs);
    let fl_target = cap / 2;
    // The free-space trees' size depends on the free extents, which depend on where their
    // nodes go: grow until they fit, and give any node to spare to the free list.
    let final_free = |taken: &[u64]| -> Vec<(u64, u64)> {
        let mut owners = vec![hdr_claim];
        owners.extend(taken.iter().map(|b| (*b, 1)));
        if !rebuild_fs {
            owners.extend(old_nodes(fs_walk));
        }
        owners.extend(&m.data_claims);
        complement(owners, area.start, area.end)
    };
    let no_space = RepairError::NoSpace {
        start: area.start,
        end: area.end,
    };
    let mut per_tree = 1;
    let (taken, free) = loop {
        let t = n_fs + 2 * per_tree + fl_target;
        let taken = take_front(&candidates, t).ok_or(RepairError::NoSpace {
            start: area.start,
            end: area.end,
        })?;
        let free = final_free(&taken);
        let need = nodes_for_empty_values(free.len(), bs);
        if need <= per_tree {
            break (taken, free);
        }
        per_tree = need;
        if per_tree > (area.end - area.start) as usize {
            return Err(no_space);
        }
    };
    let need = nodes_for_empty_values(free.len(), bs);
    Ok(Layout { taken, free, need })
}

/// Where `lay_out` puts the new trees and the free list.
struct Layout {
    /// The blocks taken: the fs tree's nodes, each free-space tree's, the free list.
    taken: Vec<u64>,
    /// The free extents left.
    free: Vec<(u64, u64)>,
    /// Nodes of each free-space tree.
    need: usize,
}

/// The header to write, if it differs from the old one, each counter's change said.
fn header_change(old: Option<&Header>, new: Header, changes: &mut Vec<String>) -> Option<Header> {
    let Some(o) = old else {
        return Some(new);
    };
    if *o == new {
        return None;
    }
    for (what, a, b) in [
        ("next inode number", o.next_ino, new.next_ino),
        ("inode count", o.inode_count, new.inode_count),
        ("free block count", o.free_blocks, new.free_blocks),
    ] {
        if a != b {
            changes.push(format!("header: {what} {a} -> {b}"));
        }
    }
    Some(new)
}

/// Writes the new nodes, flushes, then the header, and flushes again: a crash before the
/// header is stable leaves the old image, whose blocks nothing here touched.
pub(super) fn write(
    img: &Img,
    area: &Area,
    plan: &Plan,
    stamp: Lsn,
    progress: &mut Progress,
) -> Result<(), RepairError> {
    let total = plan.nodes.len() as u64 + 1;
    // Runs of neighbouring blocks go out as one write each: new nodes mostly fill free
    // extents in order, and one 4 KiB write per node was most of a large rebuild's time.
    const RUN_MAX: usize = 256;
    let mut order: Vec<usize> = (0..plan.nodes.len()).collect();
    order.sort_unstable_by_key(|&i| plan.nodes[i].0);
    let mut run: Vec<u8> = Vec::with_capacity(RUN_MAX * img.bs);
    let mut run_start = 0;
    for (done, &i) in order.iter().enumerate() {
        let (blk, node) = &plan.nodes[i];
        let n = run.len() / img.bs;
        if n > 0 && (run_start + n as u64 != *blk || n == RUN_MAX) {
            img.write(run_start, &run)?;
            run.clear();
        }
        if run.is_empty() {
            run_start = *blk;
        }
        let at = run.len();
        run.resize(at + img.bs, 0);
        node.encode_into(*blk, &mut run[at..]);
        write_lsn_stamp(&mut run[at..], NODE_LSN_OFFSET, stamp, &img.uuid);
        if done % 256 == 0 {
            progress.tell("write", done as u64, total);
        }
    }
    if !run.is_empty() {
        img.write(run_start, &run)?;
    }
    img.dev.flush()?;
    if let Some(h) = &plan.header {
        let mut b = vec![0u8; img.bs];
        h.encode_into(&mut b);
        write_lsn_stamp(&mut b, HEADER_LSN_OFFSET, stamp, &img.uuid);
        img.write(area.hdr_blk, &b)?;
        img.dev.flush()?;
    }
    progress.tell("write", total, total);
    Ok(())
}
