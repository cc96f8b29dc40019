//! Fix-ups of the namespace and the counts: names that point nowhere or say the wrong type,
//! directories with two names, inodes nothing reaches (into `/lost+found`, as e2fsck does),
//! then link counts, sizes, parents, block counts and orphan items recomputed from the items.

use super::salvage::{kind_range, Model};
use super::RepairError;
use crate::fs::items::dir::DirEntry;
use crate::fs::items::extent::Extent;
use crate::fs::items::inode::{FileType, Inode, Timespec, ROOT_INO};
use crate::fs::tree::keys::{
    key, kind_of, name_hash, offset_of, KIND_DIRENT, KIND_EXTENT, KIND_INODE, KIND_ORPHAN,
    KIND_SYMLINK, ORPHAN_OWNER,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

pub(super) const LOST_FOUND: &[u8] = b"lost+found";

pub(super) fn fix(m: &mut Model<'_>) -> Result<(), RepairError> {
    names(m);
    graph(m);
    counts(m);
    Ok(())
}

fn kinds(m: &Model<'_>) -> HashMap<u64, FileType> {
    m.items
        .iter()
        .filter(|(k, _)| k.a != ORPHAN_OWNER && kind_of(**k) == KIND_INODE)
        .filter_map(|(k, v)| Inode::decode(k.a, v, 0).ok()?.kind().map(|t| (k.a, t)))
        .collect()
}

/// Entries of non-directories, names of inodes that do not exist, and wrong types.
fn names(m: &mut Model<'_>) {
    let kinds = kinds(m);
    let dirs: BTreeSet<u64> = m
        .items
        .keys()
        .filter(|k| k.a != ORPHAN_OWNER && kind_of(**k) == KIND_DIRENT)
        .map(|k| k.a)
        .collect();
    for dir in dirs {
        if kinds.get(&dir) != Some(&FileType::Directory) {
            let keys: Vec<_> = m
                .items
                .range(kind_range(dir, KIND_DIRENT))
                .map(|(k, _)| *k)
                .collect();
            for k in keys {
                m.items.remove(&k);
            }
            m.change(format!(
                "inode {dir} is not a directory: its directory entries removed"
            ));
            continue;
        }
        for (hash, entries) in m.buckets(dir) {
            let mut out = Vec::with_capacity(entries.len());
            let mut changed = false;
            for (slot, mut e) in entries {
                let name = String::from_utf8_lossy(&e.name).into_owned();
                match kinds.get(&e.ino) {
                    None => {
                        m.inodes_lost.insert(e.ino);
                        m.changes.push(format!(
                            "directory {dir}: entry {name:?} names inode {}, which does not \
                             exist: removed",
                            e.ino
                        ));
                        changed = true;
                        continue;
                    }
                    Some(t) if *t != e.kind => {
                        m.changes.push(format!(
                            "directory {dir}: entry {name:?} says {:?}, inode {} is a {t:?}: \
                             fixed",
                            e.kind, e.ino
                        ));
                        e.kind = *t;
                        changed = true;
                    }
                    Some(_) => {}
                }
                out.push((slot, e));
            }
            if changed {
                m.put_bucket(dir, hash, &out);
            }
        }
    }
}

/// Each directory's entries in key order: (hash, slot, entry).
fn entries(m: &Model<'_>, dir: u64) -> Vec<(u64, u8, DirEntry)> {
    m.buckets(dir)
        .into_iter()
        .flat_map(|(h, es)| es.into_iter().map(move |(s, e)| (h, s, e)))
        .collect()
}

fn remove_entry(m: &mut Model<'_>, dir: u64, hash: u64, slot: u8) {
    if let Some((_, es)) = m.buckets(dir).into_iter().find(|(h, _)| *h == hash) {
        let kept: Vec<_> = es.into_iter().filter(|(s, _)| *s != slot).collect();
        m.put_bucket(dir, hash, &kept);
    }
}

fn has_name(m: &Model<'_>, dir: u64, name: &[u8]) -> Option<DirEntry> {
    m.buckets(dir)
        .into_iter()
        .find(|(h, _)| *h == name_hash(name))
        .and_then(|(_, es)| es.into_iter().map(|(_, e)| e).find(|e| e.name == name))
}

/// What the walk of the namespace has reached.
#[derive(Default)]
struct Reach {
    dirs: BTreeSet<u64>,
    others: BTreeSet<u64>,
    lost_found: Option<u64>,
}

/// Visits the directories under `top` (reached already), keeping the first name of each
/// directory met and removing later ones, and any name of the root.
fn visit(m: &mut Model<'_>, r: &mut Reach, top: u64) {
    let mut queue = VecDeque::from([top]);
    while let Some(dir) = queue.pop_front() {
        for (hash, slot, e) in entries(m, dir) {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            if e.ino == ROOT_INO {
                remove_entry(m, dir, hash, slot);
                m.change(format!(
                    "directory {dir}: entry {name:?} names the root directory: removed"
                ));
            } else if e.kind == FileType::Directory {
                if r.dirs.insert(e.ino) {
                    queue.push_back(e.ino);
                } else {
                    remove_entry(m, dir, hash, slot);
                    m.change(format!(
                        "directory {} has more than one name: {name:?} in directory {dir} \
                         removed",
                        e.ino
                    ));
                }
            } else {
                r.others.insert(e.ino);
            }
        }
    }
}

/// `/lost+found`, made (mode 0700) if missing; None if no name for it can be had.
fn lost_found(m: &mut Model<'_>, r: &mut Reach) -> Option<u64> {
    if let Some(l) = r.lost_found {
        return Some(l);
    }
    let mut name = LOST_FOUND.to_vec();
    for n in 1..100 {
        match has_name(m, ROOT_INO, &name) {
            Some(e) if e.kind == FileType::Directory => {
                r.lost_found = Some(e.ino);
                return r.lost_found;
            }
            Some(_) => name = format!("lost+found.{n}").into_bytes(),
            None => break,
        }
    }
    let max = m.inos().last().copied().unwrap_or(ROOT_INO);
    let ino = if m.old_next_ino > max && m.old_next_ino < crate::fs::items::inode::INO_LIMIT {
        m.old_next_ino
    } else {
        max + 1
    };
    let now = Timespec::now();
    let dir = Inode::empty_dir(ino, 0o700, 0, 0, ROOT_INO, now);
    let e = DirEntry {
        ino,
        kind: FileType::Directory,
        name: name.clone(),
    };
    if !m.add_entry(ROOT_INO, e) {
        return None;
    }
    m.put_inode(&dir);
    m.change(format!(
        "/{} made (inode {ino})",
        String::from_utf8_lossy(&name)
    ));
    r.dirs.insert(ino);
    r.lost_found = Some(ino);
    Some(ino)
}

/// Names `ino` `#<ino>` in `/lost+found`.
fn to_lost_found(m: &mut Model<'_>, r: &mut Reach, ino: u64, kind: FileType) -> bool {
    let Some(lf) = lost_found(m, r) else {
        return false;
    };
    let base = format!("#{ino}");
    let mut name = base.clone().into_bytes();
    for n in 1..100 {
        if has_name(m, lf, &name).is_none() {
            break;
        }
        name = format!("{base}.{n}").into_bytes();
    }
    let e = DirEntry {
        ino,
        kind,
        name: name.clone(),
    };
    if !m.add_entry(lf, e) {
        return false;
    }
    m.moved_to_lost_found += 1;
    m.change(format!(
        "inode {ino} ({kind:?}) reached by no name: put in /lost+found as {:?}",
        String::from_utf8_lossy(&name)
    ));
    true
}

/// Every inode reachable from the root by exactly its names: unreachable directory trees and
/// files go into `/lost+found`; a removed directory (no link) loses its entries.
fn graph(m: &mut Model<'_>) {
    let mut r = Reach::default();
    r.dirs.insert(ROOT_INO);
    visit(m, &mut r, ROOT_INO);
    if let Some(e) = has_name(m, ROOT_INO, LOST_FOUND) {
        if e.kind == FileType::Directory {
            r.lost_found = Some(e.ino);
        }
    }
    let kinds = kinds(m);
    let nlink = |m: &Model<'_>, ino: u64| m.inode(ino).map_or(0, |i| i.nlink);
    // Unreached directories, each from the top of its unreached tree.
    let mut named_in: HashMap<u64, Vec<u64>> = HashMap::new();
    for (&d, t) in &kinds {
        if *t == FileType::Directory && !r.dirs.contains(&d) {
            for (_, _, e) in entries(m, d) {
                named_in.entry(e.ino).or_default().push(d);
            }
        }
    }
    let mut dirs: Vec<u64> = kinds
        .iter()
        .filter(|(_, t)| **t == FileType::Directory)
        .map(|(d, _)| *d)
        .collect();
    dirs.sort_unstable();
    for d in dirs {
        if r.dirs.contains(&d) {
            continue;
        }
        let mut top = d;
        let mut seen = BTreeSet::from([d]);
        while let Some(&up) = named_in.get(&top).and_then(|v| {
            v.iter()
                .find(|u| !r.dirs.contains(*u) && !seen.contains(*u))
        }) {
            seen.insert(up);
            top = up;
        }
        r.dirs.insert(top);
        if nlink(m, top) == 0 {
            // A removed directory, open when the filesystem went down: it keeps no entries.
            let es = entries(m, top);
            if !es.is_empty() {
                for (h, s, _) in es {
                    remove_entry(m, top, h, s);
                }
                m.change(format!(
                    "removed directory {top} still had entries: removed"
                ));
            }
            continue;
        }
        if to_lost_found(m, &mut r, top, FileType::Directory) {
            visit(m, &mut r, top);
        }
    }
    // Unreached files: a link count of 0 is an orphan, which the next mount frees.
    let mut others: Vec<(u64, FileType)> = kinds
        .iter()
        .filter(|(i, t)| **t != FileType::Directory && !r.others.contains(*i))
        .map(|(i, t)| (*i, *t))
        .collect();
    others.sort_unstable_by_key(|(i, _)| *i);
    for (ino, t) in others {
        if nlink(m, ino) > 0 {
            to_lost_found(m, &mut r, ino, t);
        }
    }
}

#[derive(Default)]
struct Facts {
    refs: u64,
    first_parent: Option<u64>,
    entries: u64,
    subdirs: u64,
    ext_blocks: u64,
    symlink_bytes: u64,
    orphan: bool,
}

/// Link counts, sizes, parents, block counts and orphan items, from the items.
fn counts(m: &mut Model<'_>) {
    let mut f: BTreeMap<u64, Facts> = BTreeMap::new();
    for (k, v) in &m.items {
        match (k.a, kind_of(*k)) {
            (ORPHAN_OWNER, KIND_ORPHAN) => f.entry(offset_of(*k)).or_default().orphan = true,
            (dir, KIND_DIRENT) => {
                for (_, e) in crate::fs::items::dir::decode_slotted(v, dir).unwrap_or_default() {
                    let d = f.entry(dir).or_default();
                    d.entries += 1;
                    d.subdirs += u64::from(e.kind == FileType::Directory);
                    let c = f.entry(e.ino).or_default();
                    c.refs += 1;
                    c.first_parent.get_or_insert(dir);
                }
            }
            (ino, KIND_EXTENT) => {
                if let Ok(e) = Extent::decode(offset_of(*k), v) {
                    f.entry(ino).or_default().ext_blocks += e.len;
                }
            }
            (ino, KIND_SYMLINK) => f.entry(ino).or_default().symlink_bytes += v.len() as u64,
            _ => {}
        }
    }
    for ino in m.inos() {
        let Some(old) = m.inode(ino) else { continue };
        let x = f.remove(&ino).unwrap_or_default();
        let mut i = old.clone();
        if i.is_dir() {
            if x.refs > 0 || ino == ROOT_INO {
                i.nlink = u32::try_from(2 + x.subdirs).unwrap_or(u32::MAX);
                i.parent = if ino == ROOT_INO {
                    ROOT_INO
                } else {
                    x.first_parent.unwrap_or(ROOT_INO)
                };
            } else {
                i.nlink = 0;
            }
            i.size = x.entries;
        } else {
            i.nlink = u32::try_from(x.refs).unwrap_or(u32::MAX);
        }
        if i.kind() == Some(FileType::Symlink) {
            i.size = x.symlink_bytes;
        }
        i.blocks = x.ext_blocks;
        i.disk_size = i.size;
        if i != old {
            let mut what = Vec::new();
            if i.nlink != old.nlink {
                what.push(format!("link count {} -> {}", old.nlink, i.nlink));
            }
            if i.size != old.size {
                what.push(format!("size {} -> {}", old.size, i.size));
            }
            if i.parent != old.parent {
                what.push(format!("parent {} -> {}", old.parent, i.parent));
            }
            if i.blocks != old.blocks {
                what.push(format!("blocks {} -> {}", old.blocks, i.blocks));
            }
            m.put_inode(&i);
            m.change(format!("inode {ino}: {}", what.join(", ")));
        }
        let ok = key(ORPHAN_OWNER, KIND_ORPHAN, ino);
        if i.nlink == 0 && !x.orphan {
            m.items.insert(ok, Vec::new());
            m.change(format!("inode {ino}: no link, orphan item added"));
        } else if i.nlink > 0 && x.orphan {
            m.items.remove(&ok);
            m.change(format!("inode {ino}: linked, orphan item removed"));
        }
    }
}
