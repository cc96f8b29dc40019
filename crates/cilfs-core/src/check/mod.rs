//! The consistency checker (`cilfs check`, and the crash tests): walks every tree once and
//! checks every structure against every other: node key bounds, free space against all
//! owners (no block owned twice, none leaked), the two free-space trees against each other,
//! link counts, directory parents, hashes and sizes, extent maps, symlinks, orphans and the
//! header's counters. `repair` rebuilds what it finds wrong.
//!
//! Offline tools over an unmounted image, built on the filesystem layer: the filesystem never
//! calls them.

use crate::fs::error::FsResult;
use crate::fs::items::dir::decode_bucket;
use crate::fs::items::extent::Extent;
use crate::fs::items::header::HEADER_LSN_OFFSET;
use crate::fs::items::header::{Header, TREE_FREE_BY_BLOCK, TREE_FREE_BY_SIZE, TREE_FS};
use crate::fs::items::inode::{FileType, Inode, ROOT_INO};
use crate::fs::tree::btree::{NodeStore, Root};
use crate::fs::tree::keys::{
    kind_of, name_hash, offset_of, KIND_DIRENT, KIND_EXTENT, KIND_INODE, KIND_ORPHAN, KIND_SYMLINK,
    KIND_XATTR, ORPHAN_OWNER,
};
use crate::fs::tree::node::NODE_LSN_OFFSET;
use crate::fs::tree::node::{Body, Key};
use crate::fs::Fs;
use crate::journal::Journal;
use crate::log::stamp::read_lsn_stamp;
use facts::{FactTable, InodeSummary, Ref};
use readahead::{FinishOnDrop, ReadAhead};
use std::collections::BTreeSet;

mod facts;
mod readahead;
pub mod repair;

#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub problems: Vec<String>,
    pub inodes: u64,
    pub directories: u64,
    pub tree_nodes: u64,
    pub free_blocks: u64,
    pub data_blocks: u64,
    /// Every extent of the data area and what owns it, sorted by start (for tests that follow
    /// blocks as they change role).
    pub blocks: Vec<(u64, u64, Role)>,
    /// Blocks of xattr values read and checked.
    pub xattr_value_blocks: u64,
}

/// What a block of the data area is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Header,
    FreeList,
    TreeNode,
    Free,
    XattrValue,
    FileData,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Problems beyond this many are counted, not listed.
const MAX_PROBLEMS: usize = 1000;

struct Checker {
    report: CheckReport,
    dropped: u64,
    /// (start, len, role, owner) of every block claimed by something.
    owned: Vec<(u64, u64, Role, Owner)>,
}

/// Who claims an extent of the data area, said only when a problem is reported (a String
/// formatted for each of millions of claims cost more than the claims' checks).
#[derive(Debug, Clone, Copy)]
enum Owner {
    Start,
    Header,
    FreeList,
    Free,
    Node(&'static str),
    XattrValue(u64),
    /// (inode, file block)
    FileData(u64, u64),
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Start => f.write_str("the start of the area"),
            Owner::Header => f.write_str("header"),
            Owner::FreeList => f.write_str("free list"),
            Owner::Free => f.write_str("free space"),
            Owner::Node(tree) => write!(f, "{tree} node"),
            Owner::XattrValue(ino) => write!(f, "inode {ino} xattr value"),
            Owner::FileData(ino, file) => write!(f, "inode {ino} file block {file}"),
        }
    }
}

impl Checker {
    fn problem(&mut self, p: String) {
        if self.report.problems.len() < MAX_PROBLEMS {
            self.report.problems.push(p);
        } else {
            self.dropped += 1;
        }
    }
}

/// Visits every node with the key range its parent allows, items in key order.
fn walk_bounded(
    s: &mut dyn NodeStore,
    root: Root,
    tree: u8,
    c: &mut Checker,
    owner: &'static str,
    ra: Option<(&ReadAhead, &Journal)>,
    f: &mut dyn FnMut(&mut Checker, Key, &[u8]),
) -> FsResult<()> {
    // (block, level, low bound inclusive, high bound exclusive or None)
    let mut stack = vec![(root.blkno, root.level, Key::MIN, None::<Key>)];
    let mut children = Vec::new();
    while let Some((blk, level, lo, hi)) = stack.pop() {
        c.owned.push((blk, 1, Role::TreeNode, Owner::Node(owner)));
        c.report.tree_nodes += 1;
        if let Some((ra, _)) = ra {
            ra.wait(blk);
        }
        let n = match s.read_node(blk, tree) {
            Ok(n) => n,
            Err(e) => {
                c.problem(format!("{owner}: {e}"));
                continue;
            }
        };
        if n.level != level {
            c.problem(format!(
                "{owner}: block {blk} at level {} where {level} expected",
                n.level
            ));
            continue;
        }
        let in_bounds = |k: Key| k >= lo && hi.is_none_or(|h| k < h);
        match &n.body {
            Body::Leaf(items) => {
                if items.is_empty() && blk != root.blkno {
                    c.problem(format!("{owner}: empty leaf {blk} below the root"));
                }
                // What an edit in place would refuse as corrupt, decoding accepts: a leaf
                // whose values are not packed.
                if let Err(e) = s.check_leaf_layout(blk, tree) {
                    c.problem(format!("{owner}: {e}"));
                }
                for (k, v) in items {
                    if !in_bounds(*k) {
                        c.problem(format!(
                            "{owner}: key {k:?} in block {blk} outside its parent's range"
                        ));
                    }
                    f(c, *k, v);
                }
            }
            Body::Interior(items) => {
                // Push right to left so the left subtree is visited first.
                for i in (0..items.len()).rev() {
                    let (k, child) = items[i];
                    if i > 0 && !in_bounds(k) {
                        c.problem(format!(
                            "{owner}: separator {k:?} in block {blk} outside its range"
                        ));
                    }
                    let child_lo = if i == 0 { lo } else { k };
                    let child_hi = items.get(i + 1).map(|e| e.0).or(hi);
                    if level == 0 {
                        continue;
                    }
                    stack.push((child, level - 1, child_lo, child_hi));
                    children.push(child);
                }
                if let Some((ra, journal)) = ra {
                    ra.want(journal, &mut children);
                }
                children.clear();
            }
        }
    }
    Ok(())
}

/// Whether the checker reads tree nodes ahead of its walk (`readahead.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadAheadMode {
    /// When the tree is large enough for it to pay (`READ_AHEAD_FROM`).
    #[default]
    Auto,
    Always,
    Never,
}

/// Blocks in use from which `Auto` reads ahead: below it the walk takes milliseconds, and
/// the small filesystems of the tests and the crash explorer keep their one-thread order of
/// device operations (which fault injection counts).
const READ_AHEAD_FROM: u64 = 16_384;

/// Checks the mounted (or read-only opened) filesystem.
pub fn check(fs: &Fs) -> FsResult<CheckReport> {
    check_with(fs, ReadAheadMode::Auto)
}

/// `check`, saying whether to read ahead.
pub fn check_with(fs: &Fs, mode: ReadAheadMode) -> FsResult<CheckReport> {
    // Exclusive: commits publish side by side under the shared lock, and a walk of the whole
    // tree must not see one of them half done.
    let st = fs.write_state();
    let hdr: Header = fs.hdr(&st).clone();
    // Under the deterministic scheduler the walk reads for itself: every task spawned lives
    // until the end of its run there, and the checker runs after every operation.
    let read_ahead = !cilfs_sync::SCHEDULED
        && match mode {
            ReadAheadMode::Always => true,
            ReadAheadMode::Never => false,
            ReadAheadMode::Auto => hdr.data_end.saturating_sub(hdr.free_blocks) >= READ_AHEAD_FROM,
        };
    let journal: &Journal = &fs.journal;
    let ra = ReadAhead::default();
    cilfs_sync::thread::scope(|s| {
        if read_ahead {
            for _ in 0..readahead::THREADS {
                s.spawn(|| ra.worker(journal));
            }
        }
        let _finish = FinishOnDrop(&ra);
        check_locked(fs, &st, hdr, read_ahead.then_some((&ra, journal)))
    })
}

/// The checks, under the exclusive lock `st`.
fn check_locked(
    fs: &Fs,
    st: &crate::fs::FsState,
    hdr: Header,
    ra: Option<(&ReadAhead, &Journal)>,
) -> FsResult<CheckReport> {
    let mut c = Checker {
        report: CheckReport::default(),
        dropped: 0,
        owned: Vec::new(),
    };
    let mut view = fs.view(st);
    c.owned.push((fs.hdr_blk, 1, Role::Header, Owner::Header));
    for &b in &hdr.freelist {
        c.owned.push((b, 1, Role::FreeList, Owner::FreeList));
    }
    check_free_space(&mut view, &hdr, &mut c, ra)?;
    let FsItems {
        facts,
        mut refs,
        mut orphans,
        file_extents,
        remote,
        acls,
    } = walk_fs_tree(fs, &mut view, &hdr, &mut c, ra)?;
    own_data(fs, &mut c, &hdr, &remote, &file_extents);
    let facts = facts.finish();
    // Stable: each inode's names stay in the order the walk found them.
    refs.sort_by_key(|r| r.0);
    orphans.sort_unstable();
    orphans.dedup();
    check_acls(fs, &mut c, &acls, &facts);
    check_inodes(&mut c, &hdr, &facts, &refs, &orphans);
    check_ownership(fs, &mut c, &hdr);
    if c.dropped > 0 {
        let n = c.dropped;
        c.problem(format!("... and {n} more problems"));
    }
    Ok(c.report)
}

/// The free-space trees: each other's mirror, extents merged, the header's count; their
/// extents are owned as free.
fn check_free_space(
    view: &mut dyn NodeStore,
    hdr: &Header,
    c: &mut Checker,
    ra: Option<(&ReadAhead, &Journal)>,
) -> FsResult<()> {
    let mut by_block: BTreeSet<(u64, u64)> = BTreeSet::new();
    walk_bounded(
        view,
        hdr.bno_root,
        TREE_FREE_BY_BLOCK,
        c,
        "free-by-block",
        ra,
        &mut |c, k, v| {
            if !v.is_empty() || k.b == 0 {
                c.problem(format!("free-by-block: malformed item {k:?}"));
            }
            by_block.insert((k.a, k.b));
        },
    )?;
    let mut by_size: BTreeSet<(u64, u64)> = BTreeSet::new();
    walk_bounded(
        view,
        hdr.size_root,
        TREE_FREE_BY_SIZE,
        c,
        "free-by-size",
        ra,
        &mut |_, k, _| {
            by_size.insert((k.b, k.a));
        },
    )?;
    if by_block != by_size {
        let a: Vec<_> = by_block.symmetric_difference(&by_size).take(5).collect();
        c.problem(format!("the free-space trees disagree, e.g. on {a:?}"));
    }
    let mut free_total = 0;
    let mut prev_end = None;
    for &(s, l) in &by_block {
        // Saturating and checked: the keys are read from disk, and check reports them.
        free_total = u64::saturating_add(free_total, l);
        if prev_end == Some(s) {
            c.problem(format!("free extents meeting at block {s} are not merged"));
        }
        prev_end = s.checked_add(l);
        c.owned.push((s, l, Role::Free, Owner::Free));
    }
    if free_total != hdr.free_blocks {
        c.problem(format!(
            "header counts {} free blocks, the free-space trees hold {free_total}",
            hdr.free_blocks
        ));
    }
    c.report.free_blocks = free_total;

    Ok(())
}

/// What the walk of the fs tree gathers for the checks after it.
#[derive(Default)]
struct FsItems {
    facts: FactTable,
    /// Names and orphan items, by the inode they name: apart from `facts`, as they come in
    /// the order of the directory or the orphan list, not of the inode.
    refs: Vec<Ref>,
    orphans: Vec<u64>,
    file_extents: Vec<(u64, Extent)>,
    /// (inode, start, blocks, length) of each xattr value in blocks of its own.
    remote: Vec<(u64, u64, u64, u32)>,
    acls: Vec<(u64, Vec<u8>, crate::fs::items::xattr::Value)>,
}

/// Walks the fs tree, checking each item alone and gathering what the later checks need.
fn walk_fs_tree(
    fs: &Fs,
    view: &mut dyn NodeStore,
    hdr: &Header,
    c: &mut Checker,
    ra: Option<(&ReadAhead, &Journal)>,
) -> FsResult<FsItems> {
    let mut items = FsItems::default();
    // As many as the header counts inodes (each has a name, bar the root): a header that
    // says more than the tree holds costs address space, not memory.
    let expect = hdr.inode_count.min(1 << 26) as usize;
    items.facts.reserve(expect);
    let _ = items.refs.try_reserve_exact(expect);
    walk_bounded(
        view,
        hdr.fs_root,
        TREE_FS,
        c,
        "fs tree",
        ra,
        &mut |c, k, v| fs_tree_item(fs, c, &mut items, k, v),
    )?;
    Ok(items)
}

/// Checks one item of the fs tree and notes it in `items`.
fn fs_tree_item(fs: &Fs, c: &mut Checker, items: &mut FsItems, k: Key, v: &[u8]) {
    let FsItems {
        facts,
        refs,
        orphans,
        file_extents,
        remote,
        acls,
    } = items;
    let ino = k.a;
    let off = offset_of(k);
    match (ino, kind_of(k)) {
        (ORPHAN_OWNER, KIND_ORPHAN) if off == 0 || !v.is_empty() => {
            c.problem(format!("malformed orphan item {k:?}"))
        }
        (ORPHAN_OWNER, KIND_ORPHAN) => orphans.push(off),
        (ORPHAN_OWNER, kind) => c.problem(format!("unknown item kind {kind} under owner 0")),
        (_, _) if ino >= crate::fs::items::inode::INO_LIMIT => c.problem(format!(
            "item {k:?} of inode {ino}, past the last inode number"
        )),
        // Lookups ask for offset 0: an inode item anywhere else is unreachable.
        (_, KIND_INODE) if off != 0 => c.problem(format!(
            "inode {ino}: inode item at offset {off:#x}, not 0 (unreachable)"
        )),
        (_, KIND_INODE) => match Inode::decode(ino, v, 0) {
            Ok(i) => facts.entry(ino).inode = Some(InodeSummary::of(&i)),
            Err(e) => c.problem(format!("inode {ino}: {e}")),
        },
        (_, KIND_DIRENT) => match decode_bucket(v, ino) {
            Ok(entries) => {
                for e in entries {
                    if name_hash(&e.name) != off {
                        c.problem(format!(
                            "directory {ino}: entry {:?} under the wrong hash",
                            String::from_utf8_lossy(&e.name)
                        ));
                    }
                    let d = facts.entry(ino);
                    d.entries += 1;
                    if e.kind == FileType::Directory {
                        d.subdirs += 1;
                    }
                    refs.push((e.ino, ino, e.kind));
                }
            }
            Err(e) => c.problem(format!("{e}")),
        },
        (_, KIND_EXTENT) => match Extent::decode(off, v) {
            Ok(e) => {
                let f = facts.entry(ino);
                if e.file < f.last_ext_end {
                    c.problem(format!(
                        "inode {ino}: extents overlap at file block {}",
                        e.file
                    ));
                }
                // No file reaches 2^63 bytes (`Inode::decode`): nor does its map, whose last
                // block may hold the byte at 2^63 - 2 and so end at 2^63 (a block size is a
                // power of two).
                if e.end() > (1u64 << 63) / u64::from(fs.bs) {
                    c.problem(format!(
                        "inode {ino}: extent at file block {} maps past the largest file",
                        e.file
                    ));
                }
                f.last_ext_end = e.end();
                f.ext_blocks = f.ext_blocks.saturating_add(e.len);
                file_extents.push((ino, e));
            }
            Err(e) => c.problem(format!("inode {ino}: {e}")),
        },
        (_, KIND_XATTR) => match crate::fs::items::xattr::decode(v, ino) {
            Ok(entries) if entries.is_empty() => {
                c.problem(format!("inode {ino}: empty xattr bucket"))
            }
            Ok(entries) => {
                for e in entries {
                    if name_hash(&e.name) != off {
                        c.problem(format!(
                            "inode {ino}: xattr {:?} under the wrong hash",
                            String::from_utf8_lossy(&e.name)
                        ));
                    }
                    if crate::fs::rules::acl::kind_of(&e.name).is_some() {
                        acls.push((ino, e.name.clone(), e.value.clone()));
                    }
                    if let crate::fs::items::xattr::Value::Remote { start, blocks, len } = e.value {
                        let bs = u64::from(fs.bs);
                        if blocks != crate::fs::items::xattr::remote_blocks(len, bs) {
                            c.problem(format!(
                                "inode {ino}: xattr value of {len} bytes in {blocks} blocks"
                            ));
                        }
                        remote.push((ino, start, blocks, len));
                    }
                }
            }
            Err(e) => c.problem(format!("{e}")),
        },
        (_, KIND_SYMLINK) => facts.entry(ino).symlink_bytes += v.len() as u64,
        (_, kind) => c.problem(format!("inode {ino}: unknown item kind {kind}")),
    }
}

/// The blocks of xattr values and file data, owned by their inodes; the values' blocks read.
fn own_data(
    fs: &Fs,
    c: &mut Checker,
    hdr: &Header,
    remote: &[(u64, u64, u64, u32)],
    file_extents: &[(u64, Extent)],
) {
    let uuid = fs.journal.geometry().sb.uuid;
    for &(ino, start, blocks, len) in remote {
        c.owned
            .push((start, blocks, Role::XattrValue, Owner::XattrValue(ino)));
        check_value_blocks(fs, c, &uuid, hdr.data_end, (ino, start, blocks, len));
    }
    for (ino, e) in file_extents {
        c.owned
            .push((e.disk, e.len, Role::FileData, Owner::FileData(*ino, e.file)));
        c.report.data_blocks += e.len;
    }
}

/// ACLs: valid, the access ACL saying what the mode says, default ACLs on directories.
fn check_acls(
    fs: &Fs,
    c: &mut Checker,
    acls: &[(u64, Vec<u8>, crate::fs::items::xattr::Value)],
    facts: &facts::Facts,
) {
    for (ino, name, value) in acls {
        let what = String::from_utf8_lossy(name);
        let acl = match fs
            .value_of(value)
            .map(|v| crate::fs::rules::acl::Acl::parse(&v))
        {
            Ok(Ok(Some(a))) => a,
            Ok(Ok(None)) => {
                c.problem(format!("inode {ino}: empty {what}"));
                continue;
            }
            Ok(Err(e)) => {
                c.problem(format!("inode {ino}: malformed {what}: {e}"));
                continue;
            }
            Err(e) => {
                c.problem(format!("inode {ino}: {what} unreadable: {e}"));
                continue;
            }
        };
        let Some(inode) = facts.inode(*ino) else {
            continue;
        };
        match crate::fs::rules::acl::kind_of(name) {
            Some(crate::fs::rules::acl::Kind::Access) if acl.mode_bits() != inode.mode & 0o777 => c
                .problem(format!(
                    "inode {ino}: mode {:o} but its access ACL gives {:o}",
                    inode.mode & 0o777,
                    acl.mode_bits()
                )),
            Some(crate::fs::rules::acl::Kind::Default) if !inode.is_dir() => {
                c.problem(format!("inode {ino}: a default ACL on a non-directory"))
            }
            _ => {}
        }
    }
}

/// Inodes against their names and orphan items, and the header's inode counters.
fn check_inodes(
    c: &mut Checker,
    hdr: &Header,
    facts: &facts::Facts,
    refs: &[Ref],
    orphans: &[u64],
) {
    let mut inode_count = 0;
    let mut max_ino = 0;
    // The last directory a name was looked up in: an inode's names are mostly in one.
    let mut last_dir: Option<(u64, bool)> = None;
    let no_facts = facts::InodeFacts::default();
    for (ino, own, names, orphan) in facts::join(facts, refs, orphans) {
        let f = own.unwrap_or(&no_facts);
        let Some(i) = &f.inode else {
            if let Some(first) = names.first() {
                c.problem(format!(
                    "directory {} names inode {ino}, which does not exist",
                    first.1
                ));
            } else {
                c.problem(format!("items of inode {ino}, which does not exist"));
            }
            continue;
        };
        inode_count += 1;
        max_ino = max_ino.max(ino);
        let kind = i.kind().unwrap_or(FileType::Regular);
        check_names(c, facts, &mut last_dir, ino, kind, names);
        check_inode(c, ino, i, f, kind, names, orphan);
    }
    c.report.inodes = inode_count;
    if facts.inode(ROOT_INO).is_none() {
        c.problem("the root directory is missing".into());
    }
    if inode_count != hdr.inode_count {
        c.problem(format!(
            "header counts {} inodes, the tree holds {inode_count}",
            hdr.inode_count
        ));
    }
    if hdr.next_ino > crate::fs::items::inode::INO_LIMIT {
        c.problem(format!(
            "next inode number {} is past the limit {}",
            hdr.next_ino,
            crate::fs::items::inode::INO_LIMIT
        ));
    }
    if hdr.next_ino <= max_ino {
        c.problem(format!(
            "next inode number {} is not above inode {max_ino}",
            hdr.next_ino
        ));
    }
}

/// The directories naming inode `ino` of type `kind`: each says that type and is a directory.
fn check_names(
    c: &mut Checker,
    facts: &facts::Facts,
    last_dir: &mut Option<(u64, bool)>,
    ino: u64,
    kind: FileType,
    names: &[Ref],
) {
    for &(_, d, k) in names {
        if k != kind {
            c.problem(format!(
                "directory {d} says inode {ino} is a {k:?}, it is a {kind:?}"
            ));
        }
        let is_dir = match *last_dir {
            Some((at, is)) if at == d => is,
            _ => {
                let is = facts.inode(d).is_some_and(|di| di.is_dir());
                *last_dir = Some((d, is));
                is
            }
        };
        if !is_dir {
            c.problem(format!(
                "inode {ino} is named in {d}, which is not a directory"
            ));
        }
    }
}

/// One inode's own figures against what the tree holds for it: flags, link count, parent,
/// size, orphan item, blocks.
fn check_inode(
    c: &mut Checker,
    ino: u64,
    i: &InodeSummary,
    f: &facts::InodeFacts,
    kind: FileType,
    names: &[Ref],
    orphan: bool,
) {
    if i.flags & !crate::fs::items::inode::INODE_KNOWN_FLAGS != 0 {
        c.problem(format!("inode {ino} has unknown flags {:#x}", i.flags));
    }
    if i.is_dir() {
        c.report.directories += 1;
        let want_refs = usize::from(ino != ROOT_INO && i.nlink > 0);
        if names.len() != want_refs {
            c.problem(format!("directory {ino} has {} names", names.len()));
        }
        if i.nlink > 0 {
            if u64::from(i.nlink) != 2 + f.subdirs {
                c.problem(format!(
                    "directory {ino}: link count {} but {} subdirectories",
                    i.nlink, f.subdirs
                ));
            }
            let parent = if ino == ROOT_INO {
                ROOT_INO
            } else {
                names.first().map_or(0, |r| r.1)
            };
            if i.parent != parent {
                c.problem(format!(
                    "directory {ino}: parent {} but named in {parent}",
                    i.parent
                ));
            }
        } else if f.entries > 0 {
            c.problem(format!("removed directory {ino} still has entries"));
        }
        if i.size != f.entries {
            c.problem(format!(
                "directory {ino}: size {} but {} entries",
                i.size, f.entries
            ));
        }
    } else if u64::from(i.nlink) != names.len() as u64 {
        c.problem(format!(
            "inode {ino}: link count {} but {} names",
            i.nlink,
            names.len()
        ));
    }
    if (i.nlink == 0) != orphan {
        c.problem(format!(
            "inode {ino}: link count {} but orphan item {}",
            i.nlink,
            if orphan { "present" } else { "missing" }
        ));
    }
    if i.blocks != f.ext_blocks {
        c.problem(format!(
            "inode {ino}: {} blocks recorded, extents map {}",
            i.blocks, f.ext_blocks
        ));
    }
    if kind == FileType::Symlink && f.symlink_bytes != i.size {
        c.problem(format!(
            "symlink {ino}: size {} but target of {} bytes",
            i.size, f.symlink_bytes
        ));
    }
}

/// Every block of the data area owned exactly once.
fn check_ownership(fs: &Fs, c: &mut Checker, hdr: &Header) {
    // Every block of the data area owned exactly once.
    let mut owned = std::mem::take(&mut c.owned);
    owned.sort_by_key(|(s, _, _, _)| *s);
    let mut at = fs.hdr_blk;
    let mut last_owner = Owner::Start;
    for (s, l, _, who) in &owned {
        if *s < at {
            c.problem(format!(
                "block {s} is owned twice: by {last_owner} and by {who}"
            ));
        } else if *s > at {
            c.problem(format!(
                "blocks {at}..{s} are neither free nor used (leaked)"
            ));
        }
        // Saturating: a damaged free-space or extent item may claim blocks past 2^64.
        let end = s.saturating_add(*l);
        if end > at {
            at = end;
            last_owner = *who;
        }
    }
    if at < hdr.data_end {
        c.problem(format!(
            "blocks {at}..{} are neither free nor used (leaked)",
            hdr.data_end
        ));
    } else if at > hdr.data_end {
        c.problem(format!(
            "{last_owner} reaches past the end of the data area ({})",
            hdr.data_end
        ));
    }
    c.report.blocks = owned.into_iter().map(|(s, l, r, _)| (s, l, r)).collect();
}

/// Reads the blocks of an xattr value: none may carry a metadata LSN stamp (a value block is
/// never stamped, so a stamp means write-back or replay took it for a tree node or the header
/// and overwrote part of the value), and the last block is zero past the value's end.
fn check_value_blocks(
    fs: &Fs,
    c: &mut Checker,
    uuid: &[u8; 16],
    data_end: u64,
    (ino, start, blocks, len): (u64, u64, u64, u32),
) {
    let bs = u64::from(fs.bs);
    for b in start..start.saturating_add(blocks) {
        if b <= fs.hdr_blk || b >= data_end {
            c.problem(format!(
                "inode {ino}: xattr value block {b} outside the data area"
            ));
            return;
        }
        let buf = match fs.journal.buf(b) {
            Ok(buf) => buf,
            Err(e) => {
                c.problem(format!("inode {ino}: xattr value block {b}: {e}"));
                continue;
            }
        };
        c.report.xattr_value_blocks += 1;
        let g = buf.read();
        for off in [NODE_LSN_OFFSET, HEADER_LSN_OFFSET] {
            if read_lsn_stamp(&g.data, off, uuid).is_some() {
                c.problem(format!(
                    "inode {ino}: xattr value block {b} carries a metadata LSN stamp at \
                     byte {off} (value overwritten)"
                ));
            }
        }
        let used = u64::from(len).saturating_sub((b - start) * bs).min(bs) as usize;
        if g.data[used..].iter().any(|&x| x != 0) {
            c.problem(format!(
                "inode {ino}: xattr value block {b} holds bytes past the value's end"
            ));
        }
    }
}

/// Why an image could not be checked at all (exit 2 in `cilfs check`).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{0}")]
    Journal(#[from] crate::journal::JournalError),
    #[error("{0}")]
    Fs(#[from] crate::fs::FsError),
}

/// Checks an image without writing to it: the log is replayed into an in-memory overlay, then
/// the filesystem is opened read-only and checked.
pub fn check_image(
    data: std::sync::Arc<dyn cilfs_device::Device>,
    logdev: Option<std::sync::Arc<dyn cilfs_device::Device>>,
) -> Result<(CheckReport, crate::journal::RecoveryReport), CheckError> {
    use cilfs_device::OverlayDevice;
    use std::sync::Arc;
    // Before the mount below, which rewrites every copy (in memory): what the disk holds.
    let copies = crate::format::geometry::Geometry::read(&*data, logdev.as_deref())
        .map(|g| g.copy_problems(&*data))
        .unwrap_or_default();
    let data: Arc<dyn cilfs_device::Device> = Arc::new(OverlayDevice::new(data));
    let logdev = logdev.map(|l| Arc::new(OverlayDevice::new(l)) as Arc<dyn cilfs_device::Device>);
    // Salvage: a damaged log is one problem, and the rest is checked as the log up to the
    // damage leaves it (what `cilfs repair` would keep).
    let j = crate::journal::Journal::open_salvage(
        data,
        logdev,
        crate::journal::JournalConfig::default(),
    )?;
    let recovery = j.recovery_report().clone();
    let opened = Fs::open(
        j,
        crate::fs::FsOptions {
            read_only: true,
            ..crate::fs::FsOptions::default()
        },
    );
    let mut report = match opened {
        Ok(fs) => check(&fs)?,
        // The header is one block: damaged, the trees cannot be found from it. That is one
        // problem found, not a check that could not run (repair finds them by a scan).
        Err(e @ (crate::fs::FsError::Corrupt { .. } | crate::fs::FsError::NotFormatted(_))) => {
            CheckReport {
                problems: vec![format!(
                "{e}: the trees cannot be walked from it (cilfs repair rebuilds it from a scan)"
            )],
                ..CheckReport::default()
            }
        }
        Err(e) => return Err(e.into()),
    };
    for d in recovery.replay.damaged.iter().rev() {
        report.problems.insert(0, format!("log replay: {d}"));
    }
    if recovery.damaged {
        let what = recovery.torn.as_deref().unwrap_or("damaged");
        report.problems.insert(0, format!("log: {what}"));
    }
    report.problems.splice(0..0, copies);
    Ok((report, recovery))
}

#[cfg(test)]
mod tests;
