//! The salvage of items: whatever does not decode is dropped, items of inodes that do not
//! exist are removed, and every block an extent or an xattr value claims is owned once, the
//! first owner winning (the header and the old trees' nodes first, then items in key order).

use super::Area;
use super::{Img, RepairError};
use crate::fs::items::dir::{decode_slotted, encode_bucket, DirEntry};
use crate::fs::items::extent::Extent;
use crate::fs::items::header::HEADER_LSN_OFFSET;
use crate::fs::items::inode::{
    Inode, Timespec, INODE_ITEM_BYTES, INODE_ITEM_HINT_BYTES, INODE_KNOWN_FLAGS, ROOT_INO,
};
use crate::fs::items::xattr;
use crate::fs::rules::acl;
use crate::fs::tree::keys::{
    key, kind_of, name_hash, offset_of, KIND_DIRENT, KIND_EXTENT, KIND_INODE, KIND_ORPHAN,
    KIND_SYMLINK, KIND_XATTR, OFFSET_BITS, ORPHAN_OWNER,
};
use crate::fs::tree::node::{Key, NODE_LSN_OFFSET};
use crate::log::stamp::read_lsn_stamp;
use std::collections::{BTreeMap, BTreeSet};

/// The fs tree's items as repair edits them, and what it did.
pub(super) struct Model<'a> {
    pub items: BTreeMap<Key, Vec<u8>>,
    pub changes: Vec<String>,
    pub img: &'a Img,
    pub area: Area,
    /// The old header's next inode number (0 when it was unreadable).
    pub old_next_ino: u64,
    pub inodes_lost: BTreeSet<u64>,
    pub moved_to_lost_found: u64,
    /// Blocks extents and xattr values own once repaired.
    pub data_claims: Vec<(u64, u64)>,
    /// Blocks to write whole before the trees (value blocks with their tails zeroed).
    pub block_fixes: Vec<(u64, Vec<u8>)>,
}

/// Every key of one kind of an inode's items.
pub(super) fn kind_range(ino: u64, kind: u64) -> std::ops::RangeInclusive<Key> {
    Key::new(ino, kind << OFFSET_BITS)
        ..=Key::new(ino, (kind << OFFSET_BITS) | ((1 << OFFSET_BITS) - 1))
}

impl<'a> Model<'a> {
    pub fn new(
        items: BTreeMap<Key, Vec<u8>>,
        img: &'a Img,
        area: &Area,
        old_next_ino: u64,
    ) -> Self {
        Model {
            items,
            changes: Vec::new(),
            img,
            area: *area,
            old_next_ino,
            inodes_lost: BTreeSet::new(),
            moved_to_lost_found: 0,
            data_claims: Vec::new(),
            block_fixes: Vec::new(),
        }
    }

    pub fn change(&mut self, c: String) {
        self.changes.push(c);
    }

    pub fn inode(&self, ino: u64) -> Option<Inode> {
        self.items
            .get(&key(ino, KIND_INODE, 0))
            .and_then(|v| Inode::decode(ino, v, 0).ok())
    }

    pub fn put_inode(&mut self, i: &Inode) {
        self.items
            .insert(key(i.ino, KIND_INODE, 0), i.encode().to_vec());
    }

    /// The numbers of every inode, in order.
    pub fn inos(&self) -> Vec<u64> {
        self.items
            .keys()
            .filter(|k| k.a != ORPHAN_OWNER && kind_of(**k) == KIND_INODE)
            .map(|k| k.a)
            .collect()
    }

    /// A directory's buckets: (hash, entries with their slots).
    pub fn buckets(&self, dir: u64) -> Vec<(u64, Vec<(u8, DirEntry)>)> {
        self.items
            .range(kind_range(dir, KIND_DIRENT))
            .filter_map(|(k, v)| Some((offset_of(*k), decode_slotted(v, dir).ok()?)))
            .collect()
    }

    pub fn put_bucket(&mut self, dir: u64, hash: u64, entries: &[(u8, DirEntry)]) {
        let k = key(dir, KIND_DIRENT, hash);
        if entries.is_empty() {
            self.items.remove(&k);
        } else {
            self.items.insert(k, encode_bucket(entries));
        }
    }

    /// The inode item of `ino`, and whether it was changed to decode: a long item whose
    /// extent size hint alone is damaged keeps the inode without the hint (as XFS's repair
    /// clears a bad hint), since the short item is all the inode needs.
    fn decode_inode(&mut self, ino: u64, v: &[u8]) -> Result<(Inode, bool), String> {
        let e = match Inode::decode(ino, v, 0) {
            Ok(i) => return Ok((i, false)),
            Err(e) => e,
        };
        if v.len() != INODE_ITEM_HINT_BYTES {
            return Err(e.to_string());
        }
        let i = Inode::decode(ino, &v[..INODE_ITEM_BYTES], 0).map_err(|_| e.to_string())?;
        self.change(format!("inode {ino}: extent size hint cleared ({e})"));
        Ok((i, true))
    }

    /// Drops what does not decode, or decodes to what the checker refuses.
    pub fn salvage(&mut self) {
        let keys: Vec<Key> = self.items.keys().copied().collect();
        for k in keys {
            let v = self.items[&k].clone();
            let (ino, off) = (k.a, offset_of(k));
            let drop = match (ino, kind_of(k)) {
                (ORPHAN_OWNER, KIND_ORPHAN) if off == 0 || !v.is_empty() => {
                    Some("malformed orphan item".to_string())
                }
                (ORPHAN_OWNER, KIND_ORPHAN) => None,
                (ORPHAN_OWNER, kind) => Some(format!("item of unknown kind {kind} under owner 0")),
                // No inode is numbered there (`items::inode::INO_LIMIT`): a damaged key.
                (_, _) if ino >= crate::fs::items::inode::INO_LIMIT => {
                    Some(format!("item of inode {ino}, past the last inode number"))
                }
                (_, KIND_INODE) if off != 0 => Some(format!("inode item at offset {off:#x}")),
                (_, KIND_INODE) => match self.decode_inode(ino, &v) {
                    Err(e) => Some(e),
                    Ok((mut i, mut changed)) => {
                        if i.flags & !INODE_KNOWN_FLAGS != 0 {
                            self.change(format!(
                                "inode {ino}: unknown flags {:#x} cleared",
                                i.flags & !INODE_KNOWN_FLAGS
                            ));
                            i.flags &= INODE_KNOWN_FLAGS;
                            changed = true;
                        }
                        if changed {
                            self.put_inode(&i);
                        }
                        None
                    }
                },
                (_, KIND_DIRENT) => match decode_slotted(&v, ino) {
                    Err(e) => Some(e.to_string()),
                    Ok(entries) => {
                        let (keep, wrong): (Vec<_>, Vec<_>) = entries
                            .into_iter()
                            .partition(|(_, e)| name_hash(&e.name) == off);
                        if !wrong.is_empty() {
                            self.put_bucket(ino, off, &keep);
                        }
                        // Filed again under the hash of the name (a damaged key or hash,
                        // not a damaged name, is what a CRC-valid mismatch most often is).
                        for (_, e) in wrong {
                            let name = String::from_utf8_lossy(&e.name).into_owned();
                            if self.add_entry(ino, e) {
                                self.change(format!(
                                    "directory {ino}: entry {name:?} under the wrong hash \
                                     filed under its own"
                                ));
                            } else {
                                self.change(format!(
                                    "directory {ino}: entry {name:?} under the wrong hash \
                                     removed (its name is taken or its bucket full)"
                                ));
                            }
                        }
                        None
                    }
                },
                (_, KIND_EXTENT) => Extent::decode(off, &v).err().map(|e| e.to_string()),
                (_, KIND_XATTR) => match xattr::decode(&v, ino) {
                    Err(e) => Some(e.to_string()),
                    Ok(entries) if entries.is_empty() => Some("empty xattr bucket".into()),
                    Ok(entries) => {
                        let bs = self.img.bs as u64;
                        let n = entries.len();
                        let keep: Vec<xattr::Entry> = entries
                            .into_iter()
                            .filter(|e| {
                                let ok = name_hash(&e.name) == off
                                    && match e.value {
                                        xattr::Value::Remote { blocks, len, .. } => {
                                            blocks == xattr::remote_blocks(len, bs)
                                        }
                                        xattr::Value::Inline(_) => true,
                                    };
                                if !ok {
                                    self.changes.push(format!(
                                        "inode {ino}: xattr {:?} malformed or under the wrong \
                                         hash, removed",
                                        String::from_utf8_lossy(&e.name)
                                    ));
                                }
                                ok
                            })
                            .collect();
                        if keep.len() != n {
                            self.put_xattrs(ino, off, &keep);
                        }
                        None
                    }
                },
                (_, KIND_SYMLINK) => None,
                (_, kind) => Some(format!("unknown item kind {kind}")),
            };
            if let Some(why) = drop {
                self.items.remove(&k);
                self.change(format!("item {k:?} of inode {ino} removed: {why}"));
            }
        }

        if self.inode(ROOT_INO).is_none_or(|i| !i.is_dir()) {
            let now = Timespec::now();
            self.put_inode(&Inode::empty_dir(ROOT_INO, 0o755, 0, 0, ROOT_INO, now));
            self.change("the root directory was missing: made anew".into());
        }

        self.recreate_lost_inodes();
        // Items of inodes that do not exist.
        let inos: BTreeSet<u64> = self.inos().into_iter().collect();
        let orphans: Vec<Key> = self
            .items
            .range(kind_range(ORPHAN_OWNER, KIND_ORPHAN))
            .map(|(k, _)| *k)
            .collect();
        for k in orphans {
            if !inos.contains(&offset_of(k)) {
                self.items.remove(&k);
                self.change(format!(
                    "orphan item of inode {}, which does not exist, removed",
                    offset_of(k)
                ));
            }
        }
        let strays: Vec<Key> = self
            .items
            .keys()
            .filter(|k| k.a != ORPHAN_OWNER && !inos.contains(&k.a))
            .copied()
            .collect();
        let mut last = None;
        for k in strays {
            self.items.remove(&k);
            self.inodes_lost.insert(k.a);
            if last != Some(k.a) {
                self.change(format!(
                    "items of inode {}, which does not exist, removed",
                    k.a
                ));
                last = Some(k.a);
            }
        }
    }

    /// Adds `e` to directory `dir` under its name's hash: false if the name is there already,
    /// the bucket has no free slot, or it does not decode (salvage drops it).
    pub fn add_entry(&mut self, dir: u64, e: DirEntry) -> bool {
        let hash = name_hash(&e.name);
        let k = key(dir, KIND_DIRENT, hash);
        let mut es = match self.items.get(&k).map(|v| decode_slotted(v, dir)) {
            None => Vec::new(),
            Some(Ok(es)) => es,
            Some(Err(_)) => return false,
        };
        if es.iter().any(|(_, x)| x.name == e.name) {
            return false;
        }
        let Some(slot) = crate::fs::items::dir::free_slot(&es) else {
            return false;
        };
        es.push((slot, e));
        es.sort_by_key(|(s, _)| *s);
        self.put_bucket(dir, hash, &es);
        true
    }

    /// An inode whose own item is lost but whose names, data or link target survive is made
    /// again (owner root, mode 0700/0600, times now), so that what it held is kept: a
    /// directory keeps its entries (and so its subtree's names), a file its data. Link counts,
    /// sizes and parents are recomputed later (`fixup`), and one that no name reaches goes to
    /// /lost+found. Items of other kinds alone (xattrs) are not enough to make an inode of.
    fn recreate_lost_inodes(&mut self) {
        let inos: BTreeSet<u64> = self.inos().into_iter().collect();
        let mut kinds: BTreeMap<u64, (bool, Option<u64>, bool)> = BTreeMap::new();
        for (k, v) in &self.items {
            if k.a == ORPHAN_OWNER || inos.contains(&k.a) {
                continue;
            }
            let e = kinds.entry(k.a).or_default();
            match kind_of(*k) {
                KIND_DIRENT => e.0 = true,
                KIND_EXTENT => {
                    if let Ok(x) = Extent::decode(offset_of(*k), v) {
                        let end = x.file.saturating_add(x.len);
                        e.1 = Some(e.1.unwrap_or(0).max(end));
                    }
                }
                KIND_SYMLINK => e.2 = true,
                _ => {}
            }
        }
        let now = Timespec::now();
        let bs = self.img.bs as u64;
        for (ino, (dir, extent_end, symlink)) in kinds {
            let (inode, what) = if dir {
                (
                    Inode::empty_dir(ino, 0o700, 0, 0, ROOT_INO, now),
                    "directory",
                )
            } else if symlink {
                let i = Inode::empty(ino, crate::fs::items::inode::S_IFLNK | 0o777, 0, 0, now);
                (i, "symbolic link")
            } else if let Some(end) = extent_end {
                let mut i = Inode::empty(ino, crate::fs::items::inode::S_IFREG | 0o600, 0, 0, now);
                i.size = end.saturating_mul(bs);
                i.disk_size = i.size;
                (i, "file")
            } else {
                continue;
            };
            self.put_inode(&inode);
            self.change(format!(
                "inode {ino}: its inode item is lost; made again as a {what}, to keep what it \
                 held"
            ));
        }
    }

    pub fn put_xattrs(&mut self, ino: u64, hash: u64, entries: &[xattr::Entry]) {
        let k = key(ino, KIND_XATTR, hash);
        if entries.is_empty() {
            self.items.remove(&k);
        } else {
            self.items.insert(k, xattr::encode(entries));
        }
    }

    /// Owns the blocks of every extent and xattr value once, after the header and the old
    /// trees' nodes (`old_nodes`): an extent is cut to the blocks it may have, a value that
    /// may not have all of its blocks is dropped. ACLs are checked here too, as their values
    /// may be remote.
    pub fn claim_blocks(&mut self, old_nodes: &[u64]) -> Result<(), RepairError> {
        let mut claims = Claims::default();
        claims.claim(self.area.hdr_blk, 1);
        for &b in old_nodes {
            claims.claim(b, 1);
        }
        let keys: Vec<Key> = self
            .items
            .keys()
            .filter(|k| matches!(kind_of(**k), KIND_EXTENT | KIND_XATTR) && k.a != ORPHAN_OWNER)
            .copied()
            .collect();
        let (mut cur, mut last_end) = (0, 0);
        for k in keys {
            if k.a != cur {
                (cur, last_end) = (k.a, 0);
            }
            if kind_of(k) == KIND_EXTENT {
                self.claim_extent(&mut claims, k, &mut last_end);
            } else {
                self.claim_xattrs(&mut claims, k)?;
            }
        }
        Ok(())
    }

    fn claim_extent(&mut self, claims: &mut Claims, k: Key, last_end: &mut u64) {
        let ino = k.a;
        let Some(Ok(mut e)) = self.items.get(&k).map(|v| Extent::decode(offset_of(k), v)) else {
            return;
        };
        let orig = e;
        // An address or length that leaves the data area is damage in the extent itself:
        // none of it is trusted (cut to what lies inside, a wild length would claim every
        // other file's blocks after it).
        if e.disk < self.area.start || e.disk.checked_add(e.len).is_none_or(|x| x > self.area.end) {
            self.items.remove(&k);
            self.change(format!(
                "inode {ino}: extent at file block {} (disk {}+{}) leaves the data area, removed",
                e.file, e.disk, e.len
            ));
            return;
        }
        // Overlapping the extent before it in the file: the earlier one keeps the file blocks.
        if e.file < *last_end {
            let d = *last_end - e.file;
            if d >= e.len {
                self.items.remove(&k);
                self.change(format!(
                    "inode {ino}: extent at file block {} inside the one before it, removed",
                    orig.file
                ));
                return;
            }
            e = Extent {
                file: e.file + d,
                disk: e.disk.saturating_add(d),
                len: e.len - d,
                unwritten: e.unwritten,
            };
        }
        let parts = match e.disk.checked_add(e.len) {
            Some(end) => claims.take_free(e.disk, end, &self.area),
            None => Vec::new(),
        };
        if e == orig && parts == [(e.disk, e.len)] {
            *last_end = e.end();
            self.data_claims.push((e.disk, e.len));
            return;
        }
        self.items.remove(&k);
        let mut kept = Vec::new();
        for &(s, l) in &parts {
            let piece = Extent {
                file: e.file + (s - e.disk),
                disk: s,
                len: l,
                unwritten: e.unwritten,
            };
            self.items
                .insert(key(ino, KIND_EXTENT, piece.file), piece.encode().to_vec());
            self.data_claims.push((s, l));
            *last_end = (*last_end).max(piece.end());
            kept.push(format!("{s}+{l}"));
        }
        self.change(format!(
            "inode {ino}: extent at file block {} (disk {}+{}) overlaps blocks outside the data \
             area or owned already: cut to [{}]",
            orig.file,
            orig.disk,
            orig.len,
            kept.join(", ")
        ));
    }

    fn claim_xattrs(&mut self, claims: &mut Claims, k: Key) -> Result<(), RepairError> {
        let ino = k.a;
        let Some(Ok(entries)) = self.items.get(&k).map(|v| xattr::decode(v, ino)) else {
            return Ok(());
        };
        let n = entries.len();
        let mut keep = Vec::with_capacity(n);
        for e in entries {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            if let xattr::Value::Remote { start, blocks, len } = e.value {
                let free = start
                    .checked_add(blocks)
                    .is_some_and(|end| claims.is_free(start, end, &self.area));
                if !free {
                    self.change(format!(
                        "inode {ino}: xattr {name:?} has its value in blocks outside the data \
                         area or owned already: removed"
                    ));
                    continue;
                }
                match self.check_value_blocks(start, blocks, len)? {
                    Ok(fixes) => {
                        for (b, bytes) in fixes {
                            self.change(format!(
                                "inode {ino}: xattr {name:?}: bytes past the value's end in \
                                 block {b} zeroed"
                            ));
                            self.block_fixes.push((b, bytes));
                        }
                    }
                    Err(why) => {
                        self.change(format!("inode {ino}: xattr {name:?} removed: {why}"));
                        continue;
                    }
                }
                claims.claim(start, blocks);
                self.data_claims.push((start, blocks));
            }
            if let Some(kind) = acl::kind_of(&e.name) {
                if !self.acl_ok(ino, kind, &e.value, &name)? {
                    if let xattr::Value::Remote { start, blocks, .. } = e.value {
                        claims.release(start, blocks);
                        self.data_claims.retain(|c| *c != (start, blocks));
                    }
                    continue;
                }
            }
            keep.push(e);
        }
        if keep.len() != n {
            self.put_xattrs(ino, offset_of(k), &keep);
        }
        Ok(())
    }

    /// Whether a value's blocks are its own: none carries a metadata stamp (written over by a
    /// node or the header), and the tail past the value is zero (else: the blocks to write,
    /// zeroed there).
    #[allow(clippy::type_complexity)]
    fn check_value_blocks(
        &self,
        start: u64,
        blocks: u64,
        len: u32,
    ) -> Result<Result<Vec<(u64, Vec<u8>)>, String>, RepairError> {
        let bs = self.img.bs;
        let mut fixes = Vec::new();
        for b in start..start + blocks {
            let mut data = self.img.read(b)?.to_vec();
            for off in [NODE_LSN_OFFSET, HEADER_LSN_OFFSET] {
                if read_lsn_stamp(&data, off, &self.img.uuid).is_some() {
                    return Ok(Err(format!(
                        "value block {b} carries a metadata stamp (overwritten)"
                    )));
                }
            }
            let used = u64::from(len)
                .saturating_sub((b - start) * bs as u64)
                .min(bs as u64) as usize;
            if data[used..].iter().any(|&x| x != 0) {
                data[used..].fill(0);
                fixes.push((b, data));
            }
        }
        Ok(Ok(fixes))
    }

    /// Checks an ACL as the checker does; a bad one is removed, an access ACL the mode
    /// disagrees with sets the mode's permission bits. Whether to keep the entry.
    fn acl_ok(
        &mut self,
        ino: u64,
        kind: acl::Kind,
        v: &xattr::Value,
        name: &str,
    ) -> Result<bool, RepairError> {
        let bytes = match v {
            xattr::Value::Inline(b) => b.clone(),
            xattr::Value::Remote { start, blocks, len } => {
                let raw = self.img.read_blocks(*start, *blocks as usize)?;
                raw[..(*len as usize).min(raw.len())].to_vec()
            }
        };
        let Some(mut inode) = self.inode(ino) else {
            return Ok(true);
        };
        let acl = match acl::Acl::parse(&bytes) {
            Ok(Some(a)) => a,
            _ => {
                self.change(format!("inode {ino}: malformed or empty {name} removed"));
                return Ok(false);
            }
        };
        match kind {
            acl::Kind::Default if !inode.is_dir() => {
                self.change(format!(
                    "inode {ino}: default ACL on a non-directory removed"
                ));
                Ok(false)
            }
            acl::Kind::Access if acl.mode_bits() != inode.mode & 0o777 => {
                self.change(format!(
                    "inode {ino}: mode {:o} set to {:o}, as its access ACL says",
                    inode.mode & 0o777,
                    acl.mode_bits()
                ));
                inode.mode = (inode.mode & !0o777) | acl.mode_bits();
                self.put_inode(&inode);
                Ok(true)
            }
            _ => Ok(true),
        }
    }
}

/// Blocks owned so far: disjoint ranges, start -> end.
#[derive(Default)]
struct Claims(BTreeMap<u64, u64>);

impl Claims {
    fn claim(&mut self, s: u64, l: u64) {
        self.0.insert(s, s + l);
    }

    fn release(&mut self, s: u64, l: u64) {
        if self.0.get(&s) == Some(&(s + l)) {
            self.0.remove(&s);
        }
    }

    /// The parts of `[s, e)` inside the data area that nobody owns, owned now.
    fn take_free(&mut self, s: u64, e: u64, area: &Area) -> Vec<(u64, u64)> {
        let (s, e) = (s.max(area.start), e.min(area.end));
        if s >= e {
            return Vec::new();
        }
        let mut owned: Vec<(u64, u64)> = self
            .0
            .range(..s)
            .next_back()
            .filter(|(_, end)| **end > s)
            .map(|(a, b)| (*a, *b))
            .into_iter()
            .collect();
        owned.extend(self.0.range(s..e).map(|(a, b)| (*a, *b)));
        let mut out = Vec::new();
        let mut at = s;
        for (os, oe) in owned {
            if os > at {
                out.push((at, os - at));
            }
            at = at.max(oe);
        }
        if at < e {
            out.push((at, e - at));
        }
        for &(ps, pl) in &out {
            self.claim(ps, pl);
        }
        out
    }

    /// Whether `[s, e)` lies in the data area and nobody owns any of it.
    fn is_free(&self, s: u64, e: u64, area: &Area) -> bool {
        s >= area.start
            && e <= area.end
            && s < e
            && self
                .0
                .range(..e)
                .next_back()
                .is_none_or(|(_, end)| *end <= s)
    }
}
