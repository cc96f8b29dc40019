//! B+tree node blocks: pure encode and decode (docs/on-disk-format.md "B+tree nodes").
//!
//! Layout: a 48-byte header (magic, level, tree, count, own block number, LSN stamp with the
//! block's CRC), then an array of entries. Leaf entries are a key and the offset and
//! length of a value stored at the end of the block, values growing downward; interior entries are
//! a key and a child block. The first key of an interior node is only a lower bound for its child.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::header::MAX_LEVELS;
use crate::fs::items::{arr4, arr8};
use std::rc::Rc;

pub const NODE_MAGIC: u32 = 0x4342_5431; // "CBT1"
pub const NODE_HEADER_BYTES: usize = 48;
/// Where each node keeps its LSN stamp (LSN and fs UUID, written at write back).
pub const NODE_LSN_OFFSET: u16 = 16;
pub const LEAF_ENTRY_BYTES: usize = 20;
pub const INTERIOR_ENTRY_BYTES: usize = 24;

/// A tree key: two words compared in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    pub a: u64,
    pub b: u64,
}

impl Key {
    pub const MIN: Key = Key { a: 0, b: 0 };
    pub const MAX: Key = Key {
        a: u64::MAX,
        b: u64::MAX,
    };

    pub const fn new(a: u64, b: u64) -> Self {
        Key { a, b }
    }

    /// The key just before this one, or None at the minimum.
    pub fn pred(self) -> Option<Key> {
        match self.b.checked_sub(1) {
            Some(b) => Some(Key { a: self.a, b }),
            None => self.a.checked_sub(1).map(|a| Key { a, b: u64::MAX }),
        }
    }

    /// The next key in order, or None at the maximum.
    pub fn succ(self) -> Option<Key> {
        match self.b.checked_add(1) {
            Some(b) => Some(Key { a: self.a, b }),
            None => self.a.checked_add(1).map(|a| Key { a, b: 0 }),
        }
    }
}

/// A leaf value: a range of one copy of its leaf's block, which decoding shares among the
/// leaf's values, or bytes of its own. Counted without atomics (`Rc`): a decoded node stays in
/// the thread that decoded it, and with `bytes::Bytes` the atomic count of every value slice
/// and drop was a fifth of a create's cycles (perf, `cilfs bench fs --workload create`).
#[derive(Clone, Default)]
pub struct Value {
    buf: Option<Rc<[u8]>>,
    start: u32,
    end: u32,
}

impl Value {
    pub fn new() -> Self {
        Value::default()
    }

    pub fn copy_from_slice(b: &[u8]) -> Self {
        if b.is_empty() {
            return Value::new();
        }
        Value::whole(Rc::from(b))
    }

    fn whole(buf: Rc<[u8]>) -> Self {
        let end = u32::try_from(buf.len()).expect("a value fits a block");
        Value {
            buf: Some(buf),
            start: 0,
            end,
        }
    }

    /// A part of this value, sharing its bytes.
    pub fn slice(&self, r: std::ops::Range<usize>) -> Self {
        assert!(
            r.start <= r.end && r.end <= self.len(),
            "value slice out of range"
        );
        if r.is_empty() {
            return Value::new();
        }
        Value {
            buf: self.buf.clone(),
            start: self.start + r.start as u32,
            end: self.start + r.end as u32,
        }
    }
}

impl std::ops::Deref for Value {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b[self.start as usize..self.end as usize],
            None => &[],
        }
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        if v.is_empty() {
            return Value::new();
        }
        Value::whole(Rc::from(v))
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Value {}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Value({:?})", &**self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Leaf(Vec<(Key, Value)>),
    Interior(Vec<(Key, u64)>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub tree: u8,
    pub level: u8,
    pub body: Body,
}

/// The largest value a leaf accepts: four of them always fit one block.
pub fn max_value_bytes(block_size: usize) -> usize {
    (block_size - NODE_HEADER_BYTES) / 4 - LEAF_ENTRY_BYTES
}

impl Node {
    pub fn leaf(tree: u8) -> Self {
        Node {
            tree,
            level: 0,
            body: Body::Leaf(Vec::new()),
        }
    }

    pub fn len(&self) -> usize {
        match &self.body {
            Body::Leaf(v) => v.len(),
            Body::Interior(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the node needs when encoded.
    pub fn encoded_bytes(&self) -> usize {
        NODE_HEADER_BYTES
            + match &self.body {
                Body::Leaf(v) => v
                    .iter()
                    .map(|(_, val)| LEAF_ENTRY_BYTES + val.len())
                    .sum::<usize>(),
                Body::Interior(v) => v.len() * INTERIOR_ENTRY_BYTES,
            }
    }

    /// The byte ranges `[start, end)` of a block of `bs` bytes that `encode_into` gives a
    /// meaning: the header and entries, and a leaf's values packed at the block's end. The
    /// stretch between them is zero in memory but read by no one, so a node written whole
    /// logs only these (`FsTx::write_node`): after a replay that stretch holds whatever the
    /// block held before, which the block's CRC, computed over the whole block at write-back
    /// and at replay, covers as it is.
    pub fn used_ranges(&self, bs: usize) -> Vec<(usize, usize)> {
        let entries_end = NODE_HEADER_BYTES
            + self.len()
                * match self.body {
                    Body::Leaf(_) => LEAF_ENTRY_BYTES,
                    Body::Interior(_) => INTERIOR_ENTRY_BYTES,
                };
        let values_start = bs - (self.encoded_bytes() - entries_end);
        debug_assert!(entries_end <= values_start && values_start <= bs);
        used_of(entries_end, values_start, bs)
    }

    /// Encodes into `out` (a whole block), keeping the LSN stamp bytes already there.
    pub fn encode_into(&self, blkno: u64, out: &mut [u8]) {
        let bs = out.len();
        assert!(
            self.encoded_bytes() <= bs,
            "node of {} bytes does not fit a block",
            self.encoded_bytes()
        );
        out[0..4].copy_from_slice(&NODE_MAGIC.to_le_bytes());
        out[4] = self.level;
        out[5] = self.tree;
        out[6..8].copy_from_slice(&(self.len() as u16).to_le_bytes());
        out[8..16].copy_from_slice(&blkno.to_le_bytes());
        // 16..44 LSN stamp (LSN, UUID, CRC: written at write back), 44..48 reserved.
        out[44..48].fill(0);
        let mut p = NODE_HEADER_BYTES;
        match &self.body {
            Body::Leaf(items) => {
                let mut vend = bs;
                for (k, v) in items {
                    vend -= v.len();
                    out[vend..vend + v.len()].copy_from_slice(v);
                    put_key(&mut out[p..], *k);
                    let off = if v.is_empty() {
                        empty_value_offset(bs)
                    } else {
                        vend
                    };
                    out[p + 16..p + 18].copy_from_slice(&(off as u16).to_le_bytes());
                    out[p + 18..p + 20].copy_from_slice(&(v.len() as u16).to_le_bytes());
                    p += LEAF_ENTRY_BYTES;
                }
                out[p..vend].fill(0);
            }
            Body::Interior(items) => {
                for (k, c) in items {
                    put_key(&mut out[p..], *k);
                    out[p + 16..p + 24].copy_from_slice(&c.to_le_bytes());
                    p += INTERIOR_ENTRY_BYTES;
                }
                out[p..].fill(0);
            }
        }
    }

    /// Decodes and validates a node read from block `blkno` of tree `tree`.
    pub fn decode(block: &[u8], blkno: u64, tree: u8) -> FsResult<Node> {
        let bs = block.len();
        let bad = |what: String| FsError::corrupt(blkno, what);
        if bs < NODE_HEADER_BYTES + 4 * LEAF_ENTRY_BYTES {
            return Err(bad("block too small for a node".into()));
        }
        let magic = u32::from_le_bytes(arr4(&block[0..4]));
        if magic != NODE_MAGIC {
            return Err(bad(format!("bad node magic {magic:#010x}")));
        }
        let level = block[4];
        let t = block[5];
        let count = usize::from(u16::from_le_bytes([block[6], block[7]]));
        let self_blk = u64::from_le_bytes(arr8(&block[8..16]));
        if t != tree {
            return Err(bad(format!("node of tree {t}, expected tree {tree}")));
        }
        if self_blk != blkno {
            return Err(bad(format!("node claims to be block {self_blk}")));
        }
        if level >= MAX_LEVELS {
            return Err(bad(format!("impossible level {level}")));
        }
        let body = if level == 0 {
            if NODE_HEADER_BYTES + count * LEAF_ENTRY_BYTES > bs {
                return Err(bad(format!("{count} leaf entries overflow the block")));
            }
            let entries_end = NODE_HEADER_BYTES + count * LEAF_ENTRY_BYTES;
            let shared = Value::copy_from_slice(block);
            let mut items = Vec::with_capacity(count);
            for i in 0..count {
                let p = NODE_HEADER_BYTES + i * LEAF_ENTRY_BYTES;
                let k = get_key(&block[p..]);
                let at = value_span(&block[p..], entries_end, bs).map_err(|(off, len)| {
                    bad(format!("value {i} at {off}+{len} outside the block"))
                })?;
                items.push((k, shared.slice(at)));
            }
            Body::Leaf(items)
        } else {
            if NODE_HEADER_BYTES + count * INTERIOR_ENTRY_BYTES > bs || count == 0 {
                return Err(bad(format!("{count} interior entries")));
            }
            let mut items = Vec::with_capacity(count);
            for i in 0..count {
                let p = NODE_HEADER_BYTES + i * INTERIOR_ENTRY_BYTES;
                let k = get_key(&block[p..]);
                let c = u64::from_le_bytes(arr8(&block[p + 16..p + 24]));
                items.push((k, c));
            }
            Body::Interior(items)
        };
        let sorted = match &body {
            Body::Leaf(v) => v.windows(2).all(|w| w[0].0 < w[1].0),
            Body::Interior(v) => v.windows(2).all(|w| w[0].0 < w[1].0),
        };
        if !sorted {
            return Err(bad("keys out of order".into()));
        }
        Ok(Node { tree, level, body })
    }
}

/// Where an empty value points: the end of the block, which a u16 holds up to 32 KiB blocks,
/// and one byte short of it in a 64 KiB block (entries end at 65,528 there at most). Its
/// offset says nothing (no byte is read), so decoding accepts any: 64 KiB filesystems made
/// before this stored 65,536 as 0, and every value of the free-space trees is empty.
fn empty_value_offset(bs: usize) -> usize {
    bs.min(usize::from(u16::MAX))
}

/// Where the value of the leaf entry encoded at the start of `entry` lies in its block of `bs`
/// bytes whose entries end at `entries_end`; its offset and length when that is outside the
/// value area. An empty value is an empty range, whatever its offset says
/// (`empty_value_offset`).
fn value_span(
    entry: &[u8],
    entries_end: usize,
    bs: usize,
) -> Result<std::ops::Range<usize>, (usize, usize)> {
    let off = usize::from(u16::from_le_bytes([entry[16], entry[17]]));
    let len = usize::from(u16::from_le_bytes([entry[18], entry[19]]));
    if len == 0 {
        return Ok(0..0);
    }
    if off < entries_end || off + len > bs {
        return Err((off, len));
    }
    Ok(off..off + len)
}

/// The stretch of an encoded node that means nothing: between a leaf's entries and its lowest
/// value (the last entry's, as a leaf is packed), or after an interior node's entries. A node
/// written whole does not log it (`Node::used_ranges`), so after a replay it holds whatever the
/// block held before, and a byte of it that comes into use must be logged even where memory
/// holds the same value already (`FsTx::write_node`). Errs towards a longer stretch: a block
/// that is no node is unused whole, and a leaf whose last value is empty is unused to its end.
pub fn unused_stretch(block: &[u8]) -> (usize, usize) {
    let bs = block.len();
    let Some(header) = block.get(..NODE_HEADER_BYTES) else {
        return (0, bs);
    };
    if arr4(&header[0..4]) != NODE_MAGIC.to_le_bytes() {
        return (0, bs);
    }
    let count = usize::from(u16::from_le_bytes([header[6], header[7]]));
    if header[4] != 0 {
        return (
            (NODE_HEADER_BYTES + count * INTERIOR_ENTRY_BYTES).min(bs),
            bs,
        );
    }
    let end = (NODE_HEADER_BYTES + count * LEAF_ENTRY_BYTES).min(bs);
    let low = match count.checked_sub(1) {
        Some(last) => {
            let p = NODE_HEADER_BYTES + last * LEAF_ENTRY_BYTES;
            match block.get(p + 16..p + 20) {
                Some(e) if u16::from_le_bytes([e[2], e[3]]) > 0 => {
                    usize::from(u16::from_le_bytes([e[0], e[1]])).clamp(end, bs)
                }
                _ => bs,
            }
        }
        None => bs,
    };
    (end, low)
}

/// The keys a node may hold, as the separators on the way down to it bound them: `[lo, hi)`,
/// no upper bound for `hi` None. A node holding a key outside is misrouted: a lookup for that
/// key never reaches it, and an edit of it would write what a damaged parent made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRange {
    pub lo: Key,
    pub hi: Option<Key>,
}

impl KeyRange {
    pub const ALL: KeyRange = KeyRange {
        lo: Key::MIN,
        hi: None,
    };

    pub fn holds(&self, k: Key) -> bool {
        k >= self.lo && self.hi.is_none_or(|h| k < h)
    }

    /// The part of this range that entry `i` of an interior node's `keys` leads to (the first
    /// entry bounds nothing: its range starts where its parent's does).
    pub fn of_child(&self, lo: Option<Key>, hi: Option<Key>) -> KeyRange {
        KeyRange {
            lo: lo.map_or(self.lo, |l| l.max(self.lo)),
            hi: match (hi, self.hi) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }

    /// The part of this range that child `i` of the decoded interior entries `items` leads to.
    pub fn of_entry(&self, items: &[(Key, u64)], i: usize) -> KeyRange {
        self.of_child((i > 0).then(|| items[i].0), items.get(i + 1).map(|e| e.0))
    }

    /// Err(corrupt) unless a sorted node whose first and last keys are given lies inside.
    pub fn check(&self, blkno: u64, first: Option<Key>, last: Option<Key>) -> FsResult<()> {
        for k in [first, last].into_iter().flatten() {
            if !self.holds(k) {
                return Err(FsError::corrupt(
                    blkno,
                    format!("key {k:?} outside the range {self:?} its parents give the node"),
                ));
            }
        }
        Ok(())
    }
}

/// What one step of a point lookup finds in an encoded node, without decoding all of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawStep {
    /// The child to descend into, and the keys its parent lets it hold.
    Child(u64, KeyRange),
    Found(Vec<u8>),
    Absent,
}

/// An encoded node whose header was checked (magic, tree, block, level, entry count within the
/// block), read entry by entry without decoding the rest: what binary searches on a node need.
struct RawNode<'b> {
    block: &'b [u8],
    blkno: u64,
    count: usize,
    esize: usize,
}

impl<'b> RawNode<'b> {
    fn open(block: &'b [u8], blkno: u64, tree: u8, level: u8) -> FsResult<Self> {
        let bs = block.len();
        let bad = |what: String| FsError::corrupt(blkno, what);
        if bs < NODE_HEADER_BYTES || u32::from_le_bytes(arr4(&block[0..4])) != NODE_MAGIC {
            return Err(bad("bad node magic".into()));
        }
        if block[5] != tree || u64::from_le_bytes(arr8(&block[8..16])) != blkno {
            return Err(bad("node of another tree or block".into()));
        }
        if block[4] != level {
            return Err(bad(format!(
                "node at level {} where {level} expected",
                block[4]
            )));
        }
        let count = usize::from(u16::from_le_bytes([block[6], block[7]]));
        let esize = if level == 0 {
            LEAF_ENTRY_BYTES
        } else {
            INTERIOR_ENTRY_BYTES
        };
        if NODE_HEADER_BYTES + count * esize > bs || (level > 0 && count == 0) {
            return Err(bad(format!("{count} entries overflow the block")));
        }
        Ok(RawNode {
            block,
            blkno,
            count,
            esize,
        })
    }

    fn entry(&self, i: usize) -> &'b [u8] {
        &self.block[NODE_HEADER_BYTES + i * self.esize..]
    }

    fn key_at(&self, i: usize) -> Key {
        get_key(self.entry(i))
    }

    /// Entries with a key <= `key`: a binary search touching only the entries it probes.
    fn count_le(&self, key: Key) -> usize {
        let (mut lo, mut hi) = (0, self.count);
        let touch = |i: usize| {
            std::hint::black_box(self.block[NODE_HEADER_BYTES + i * self.esize]);
        };
        while lo < hi {
            let mid = (lo + hi) / 2;
            // Load the next probe of either outcome now, so its cache miss overlaps this one's
            // (a prefetch without unsafe code): at a million names the search's misses dominate.
            touch((lo + mid) / 2);
            touch(((mid + 1 + hi) / 2).min(self.count - 1));
            if self.key_at(mid) <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Err(corrupt) if the node holds a key outside `range` (its first or last: keys are
    /// sorted, which binary searches rely on and `decode` checks).
    fn check_range(&self, range: KeyRange) -> FsResult<()> {
        if range == KeyRange::ALL || self.count == 0 {
            return Ok(());
        }
        range.check(
            self.blkno,
            Some(self.key_at(0)),
            Some(self.key_at(self.count - 1)),
        )
    }

    fn child_at(&self, i: usize) -> u64 {
        u64::from_le_bytes(arr8(&self.entry(i)[16..24]))
    }

    /// The value of leaf entry `i`, bounds checked as in `Node::decode`.
    fn value_at(&self, i: usize) -> FsResult<Vec<u8>> {
        debug_assert_eq!(self.esize, LEAF_ENTRY_BYTES, "a value of an interior node");
        let entries_end = NODE_HEADER_BYTES + self.count * self.esize;
        Ok(self.block[value_of(self.block, self.blkno, i, entries_end)?].to_vec())
    }
}

/// One step of a point lookup on an encoded node: the child to descend into, or the value. Only
/// the header and the entries binary search touches are read; bounds are checked as in `decode`.
pub fn raw_step(block: &[u8], blkno: u64, tree: u8, level: u8, key: Key) -> FsResult<RawStep> {
    let n = RawNode::open(block, blkno, tree, level)?;
    let le = n.count_le(key);
    if level > 0 {
        let i = le.saturating_sub(1);
        let lo = (i > 0).then(|| n.key_at(i));
        let hi = (i + 1 < n.count).then(|| n.key_at(i + 1));
        return Ok(RawStep::Child(
            n.child_at(i),
            KeyRange::ALL.of_child(lo, hi),
        ));
    }
    if le == 0 || n.key_at(le - 1) != key {
        return Ok(RawStep::Absent);
    }
    Ok(RawStep::Found(n.value_at(le - 1)?))
}

/// Which side of a key a seek looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// The first entry with a key >= the one sought.
    AtOrAfter,
    /// The last entry with a key <= the one sought.
    AtOrBefore,
}

/// A seek within one encoded leaf, read as `raw_step` reads it: the entry it finds, or None
/// when the leaf has none on that side of `key` (the answer is then in a neighbouring leaf).
pub fn raw_seek(
    block: &[u8],
    blkno: u64,
    tree: u8,
    key: Key,
    seek: Seek,
) -> FsResult<Option<(Key, Vec<u8>)>> {
    let n = RawNode::open(block, blkno, tree, 0)?;
    let i = match seek {
        Seek::AtOrBefore => match n.count_le(key).checked_sub(1) {
            Some(i) => i,
            None => return Ok(None),
        },
        Seek::AtOrAfter => {
            let le = n.count_le(key);
            if le > 0 && n.key_at(le - 1) == key {
                le - 1
            } else if le < n.count {
                le
            } else {
                return Ok(None);
            }
        }
    };
    Ok(Some((n.key_at(i), n.value_at(i)?)))
}

/// What `leaf_put_raw` did: the old value when it replaced one, and the byte ranges of the
/// leaf that now mean something (as `Node::used_ranges` gives them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPut {
    pub old: Option<Vec<u8>>,
    pub used: Vec<(usize, usize)>,
}

/// Inserts `key` with `val` into the encoded leaf `block`, or replaces the value of `key`
/// when the new one has the old one's length, in place and without decoding the leaf: the
/// result is what decoding, changing and encoding it would give (the unused stretch aside).
/// Ok(None) when it does not apply (the leaf is full, or a replace changes a value's length):
/// the caller goes the decoding way. A leaf not packed as `encode_into` packs one is refused
/// as corrupt, so an edit never moves bytes that belong to another value.
pub fn leaf_put_raw(
    block: &mut [u8],
    blkno: u64,
    tree: u8,
    key: Key,
    val: &[u8],
    range: KeyRange,
) -> FsResult<Option<RawPut>> {
    let bs = block.len();
    let (count, le) = {
        let n = RawNode::open(block, blkno, tree, 0)?;
        n.check_range(range)?;
        (n.count, n.count_le(key))
    };
    let entries_end = NODE_HEADER_BYTES + count * LEAF_ENTRY_BYTES;
    let (low, vtop) = packed(block, blkno, count, le)?;
    if le > 0 && get_key(&block[entry_at(le - 1)..]) == key {
        let r = value_of(block, blkno, le - 1, entries_end)?;
        if r.len() != val.len() {
            return Ok(None);
        }
        let old = block[r.clone()].to_vec();
        block[r].copy_from_slice(val);
        return Ok(Some(RawPut {
            old: Some(old),
            used: used_of(entries_end, low, bs),
        }));
    }
    let i = le;
    let len = val.len();
    let new_end = entries_end + LEAF_ENTRY_BYTES;
    if count + 1 > usize::from(u16::MAX) || new_end + len > low {
        return Ok(None);
    }
    // Values of entries i.. move down by `len`; the new value goes where theirs began.
    block.copy_within(low..vtop, low - len);
    block[vtop - len..vtop].copy_from_slice(val);
    // Entries i.. move up by one; their values' offsets drop by `len`.
    block.copy_within(entry_at(i)..entries_end, entry_at(i + 1));
    move_offsets(block, i + 1..count + 1, |off| off - len);
    let e = &mut block[entry_at(i)..entry_at(i + 1)];
    put_key(e, key);
    let off = if len == 0 {
        empty_value_offset(bs)
    } else {
        vtop - len
    };
    e[16..18].copy_from_slice(&(off as u16).to_le_bytes());
    e[18..20].copy_from_slice(&(len as u16).to_le_bytes());
    block[6..8].copy_from_slice(&((count + 1) as u16).to_le_bytes());
    Ok(Some(RawPut {
        old: None,
        used: used_of(new_end, low - len, bs),
    }))
}

/// Removes `key` from the encoded leaf `block` in place, as `leaf_put_raw` puts: the removed
/// value, and the ranges that mean something after. Ok(None) when the leaf lacks the key or
/// would be left empty (the caller goes the decoding way, which frees an empty leaf). The
/// bytes given up join the unused stretch as they are.
pub fn leaf_remove_raw(
    block: &mut [u8],
    blkno: u64,
    tree: u8,
    key: Key,
    range: KeyRange,
) -> FsResult<Option<RawPut>> {
    let bs = block.len();
    let (count, le) = {
        let n = RawNode::open(block, blkno, tree, 0)?;
        n.check_range(range)?;
        (n.count, n.count_le(key))
    };
    if count < 2 || le == 0 || get_key(&block[entry_at(le - 1)..]) != key {
        return Ok(None);
    }
    let i = le - 1;
    let entries_end = NODE_HEADER_BYTES + count * LEAF_ENTRY_BYTES;
    let (low, _) = packed(block, blkno, count, i)?;
    let r = value_of(block, blkno, i, entries_end)?;
    let old = block[r.clone()].to_vec();
    let len = r.len();
    // Values of entries i+1.. (all below this one's) move up by its length.
    if len > 0 {
        block.copy_within(low..r.start, low + len);
    }
    block.copy_within(entry_at(i + 1)..entries_end, entry_at(i));
    move_offsets(block, i..count - 1, |off| off + len);
    block[6..8].copy_from_slice(&((count - 1) as u16).to_le_bytes());
    // What was given up is zeroed, as `encode_into` leaves a middle: a later write of the
    // leaf through the decoding way then finds its middle unchanged and logs around it.
    block[entries_end - LEAF_ENTRY_BYTES..entries_end].fill(0);
    block[low..low + len].fill(0);
    Ok(Some(RawPut {
        old: Some(old),
        used: used_of(entries_end - LEAF_ENTRY_BYTES, low + len, bs),
    }))
}

/// Checks that encoded leaf `blkno` of `tree` is one the in-place edits accept
/// (`leaf_put_raw`, `leaf_remove_raw`): its keys ascend and its values are packed as
/// `encode_into` packs them. `Node::decode` accepts values anywhere in the value area, so a
/// leaf that decodes may still be refused, as corrupt, by the next edit in place: the checker
/// asks this of every leaf too.
pub fn check_leaf_layout(block: &[u8], blkno: u64, tree: u8) -> FsResult<()> {
    let n = RawNode::open(block, blkno, tree, 0)?;
    packed(block, blkno, n.count, n.count).map(|_| ())
}

/// The structure check of a tree node block, for the journal's read and write verifiers
/// (`crate::log::item::BlockCheck`): what holds of every node whatever its parent
/// expects. Magic, a tree the filesystem has, its own block number, a possible level, the
/// entries within the block, keys in ascending order, and a leaf's values inside the block and
/// packed as `encode_into` packs them (what edits in place rely on). The tree and level
/// its parent expects are checked by each access (`Node::decode`, `RawNode::open`).
pub fn verify_node(block: &[u8], blkno: u64) -> Result<(), String> {
    let what = |e: FsError| match e {
        FsError::Corrupt { what, .. } => what,
        e => e.to_string(),
    };
    if block.len() < NODE_HEADER_BYTES + 4 * LEAF_ENTRY_BYTES {
        return Err("block too small for a node".into());
    }
    let (level, tree) = (block[4], block[5]);
    if !(crate::fs::items::header::TREE_FS..=crate::fs::items::header::TREE_FREE_BY_SIZE)
        .contains(&tree)
    {
        if u32::from_le_bytes(arr4(&block[0..4])) != NODE_MAGIC {
            return Err("bad node magic".into());
        }
        return Err(format!("node of unknown tree {tree}"));
    }
    if level >= MAX_LEVELS {
        return Err(format!("impossible level {level}"));
    }
    let n = RawNode::open(block, blkno, tree, level).map_err(what)?;
    if level == 0 {
        packed(block, blkno, n.count, n.count).map_err(what)?;
    } else if (1..n.count).any(|i| n.key_at(i) <= n.key_at(i - 1)) {
        return Err("keys out of order".into());
    }
    Ok(())
}

fn entry_at(i: usize) -> usize {
    NODE_HEADER_BYTES + i * LEAF_ENTRY_BYTES
}

/// Where the value of leaf entry `i` lies, bounds checked as `Node::decode` checks them.
fn value_of(
    block: &[u8],
    blkno: u64,
    i: usize,
    entries_end: usize,
) -> FsResult<std::ops::Range<usize>> {
    value_span(&block[entry_at(i)..], entries_end, block.len())
        .map_err(|(o, l)| FsError::corrupt(blkno, format!("value at {o}+{l} outside the block")))
}

/// Checks that the `count` values of an encoded leaf are packed as `encode_into` packs them,
/// each right below the one before (empty ones aside), so that an edit moves no byte of
/// another value, and that its keys ascend, as `Node::decode` checks (a binary search of
/// keys out of order could add a second entry of one key). Returns where the values begin,
/// and where those of entries `i..` begin.
fn packed(block: &[u8], blkno: u64, count: usize, i: usize) -> FsResult<(usize, usize)> {
    let bs = block.len();
    let entries_end = NODE_HEADER_BYTES + count * LEAF_ENTRY_BYTES;
    let (mut top, mut vtop) = (bs, bs);
    for j in 0..count {
        if j == i {
            vtop = top;
        }
        if j > 0 && get_key(&block[entry_at(j)..]) <= get_key(&block[entry_at(j - 1)..]) {
            return Err(FsError::corrupt(
                blkno,
                format!("leaf key {j} out of order"),
            ));
        }
        let r = value_of(block, blkno, j, entries_end)?;
        if r.is_empty() {
            continue;
        }
        if r.end != top {
            return Err(FsError::corrupt(
                blkno,
                format!("leaf value {j} not packed"),
            ));
        }
        top = r.start;
    }
    if i >= count {
        vtop = top;
    }
    Ok((top, vtop))
}

/// Moves the value offsets of entries `range` (those with a value) by `by`.
fn move_offsets(block: &mut [u8], range: std::ops::Range<usize>, by: impl Fn(usize) -> usize) {
    for j in range {
        let e = &mut block[entry_at(j)..entry_at(j + 1)];
        if u16::from_le_bytes([e[18], e[19]]) > 0 {
            let off = by(usize::from(u16::from_le_bytes([e[16], e[17]])));
            e[16..18].copy_from_slice(&(off as u16).to_le_bytes());
        }
    }
}

fn used_of(entries_end: usize, values_start: usize, bs: usize) -> Vec<(usize, usize)> {
    [(0, entries_end), (values_start, bs)]
        .into_iter()
        .filter(|&(s, e)| s < e)
        .collect()
}

fn put_key(out: &mut [u8], k: Key) {
    out[0..8].copy_from_slice(&k.a.to_le_bytes());
    out[8..16].copy_from_slice(&k.b.to_le_bytes());
}

fn get_key(b: &[u8]) -> Key {
    Key {
        a: u64::from_le_bytes(arr8(&b[0..8])),
        b: u64::from_le_bytes(arr8(&b[8..16])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn values_share_their_block_and_compare_by_bytes() {
        let block = Value::copy_from_slice(b"0123456789");
        let part = block.slice(2..5);
        assert_eq!(&*part, b"234");
        assert_eq!(&*part.slice(1..3), b"34", "a slice of a slice");
        assert_eq!(
            part,
            Value::from(b"234".to_vec()),
            "equal bytes, different buffers"
        );
        assert_ne!(part, block.slice(3..6));
        assert!(block.slice(4..4).is_empty());
        assert_eq!(Value::new(), Value::from(Vec::new()));
        assert_eq!(Value::copy_from_slice(&[]).len(), 0);
    }

    #[test]
    #[should_panic(expected = "value slice out of range")]
    fn a_value_slice_past_its_end_is_refused() {
        let _ = Value::copy_from_slice(b"abc").slice(2..4);
    }

    #[test]
    fn leaf_and_interior_round_trip() {
        let mut block = vec![0xAAu8; 4096];
        let n = Node {
            tree: 2,
            level: 0,
            body: Body::Leaf(vec![
                (Key::new(1, 2), b"hello".to_vec().into()),
                (Key::new(1, 3), vec![].into()),
                (Key::new(9, 0), vec![7; 900].into()),
            ]),
        };
        n.encode_into(77, &mut block);
        assert_eq!(Node::decode(&block, 77, 2).expect("decodes"), n);
        assert!(Node::decode(&block, 78, 2).is_err(), "wrong block number");
        assert!(Node::decode(&block, 77, 3).is_err(), "wrong tree");
        let i = Node {
            tree: 1,
            level: 3,
            body: Body::Interior(vec![(Key::MIN, 10), (Key::new(5, 5), 11)]),
        };
        i.encode_into(5, &mut block);
        assert_eq!(Node::decode(&block, 5, 1).expect("decodes"), i);
    }

    /// Empty values (every value of the free-space trees) encode and decode in blocks of every
    /// size, 64 KiB included, where the end of the block does not fit an offset's u16.
    #[test]
    fn empty_values_round_trip_in_every_block_size() {
        for bs in [512usize, 2048, 32768, 65536] {
            let mut block = vec![0u8; bs];
            let n = Node {
                tree: 2,
                level: 0,
                body: Body::Leaf(vec![
                    (Key::new(1, 1), vec![].into()),
                    (Key::new(2, 2), vec![3; 10].into()),
                    (Key::new(3, 3), vec![].into()),
                ]),
            };
            n.encode_into(4, &mut block);
            assert_eq!(Node::decode(&block, 4, 2).expect("decodes"), n, "{bs}");
            assert_eq!(
                raw_step(&block, 4, 2, 0, Key::new(1, 1)).expect("steps"),
                RawStep::Found(vec![])
            );
        }
    }

    /// An empty value's offset is never read, whatever it holds: one past the end of the block
    /// (a 64 KiB filesystem's 65,535 read in a smaller block, or garbage) decodes and steps as
    /// an empty value instead of slicing outside the block.
    #[test]
    fn an_empty_value_pointing_past_the_block_is_read_as_empty() {
        let mut block = vec![0u8; 4096];
        let n = Node {
            tree: 2,
            level: 0,
            body: Body::Leaf(vec![(Key::new(1, 1), vec![].into())]),
        };
        n.encode_into(4, &mut block);
        let p = NODE_HEADER_BYTES;
        block[p + 16..p + 18].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(Node::decode(&block, 4, 2).expect("decodes"), n);
        assert_eq!(
            raw_step(&block, 4, 2, 0, Key::new(1, 1)).expect("steps"),
            RawStep::Found(vec![])
        );
    }

    /// Sorted keys drawn from a few owners, some with offsets spread over the whole range
    /// (hashes), some bunched (sequential numbers), so searches meet even and uneven nodes.
    fn sorted_keys() -> impl Strategy<Value = Vec<Key>> {
        proptest::collection::vec((0u64..4, any::<bool>(), any::<u64>(), 0u64..64), 0..160)
            .prop_map(|raw| {
                let mut keys: Vec<Key> = raw
                    .into_iter()
                    .map(|(a, spread, h, n)| Key::new(a * 1000, if spread { h } else { n }))
                    .collect();
                keys.sort();
                keys.dedup();
                keys
            })
    }

    /// A leaf of `items` (keys (k, 9)) encoded into a block of `bs` bytes whose middle was junk
    /// before, or None if it does not fit.
    fn encoded_leaf(
        items: &std::collections::BTreeMap<u64, Vec<u8>>,
        bs: usize,
    ) -> Option<(Node, Vec<u8>)> {
        let leaf = items
            .iter()
            .map(|(&k, v)| (Key::new(k, 9), v.clone().into()))
            .collect();
        let node = Node {
            tree: 1,
            level: 0,
            body: Body::Leaf(leaf),
        };
        if node.encoded_bytes() > bs {
            return None;
        }
        let mut block = vec![0xA5u8; bs];
        node.encode_into(3, &mut block);
        Some((node, block))
    }

    /// What an in-place edit of `block` into `raw` must be, against `want`, the leaf decoding,
    /// changing and encoding gives: declined exactly when it does not `apply` (the block then
    /// untouched), else the same old value, node and used ranges, and the same bytes in those.
    fn like_decoded(
        block: &[u8],
        raw: &[u8],
        got: Option<RawPut>,
        applies: bool,
        want: &Node,
        old: Option<Vec<u8>>,
    ) -> Result<Option<RawPut>, TestCaseError> {
        prop_assert_eq!(got.is_some(), applies);
        let Some(got) = got else {
            prop_assert_eq!(raw, block, "declined, the block is untouched");
            return Ok(None);
        };
        let bs = block.len();
        prop_assert_eq!(&got.old, &old);
        prop_assert_eq!(&Node::decode(raw, 3, 1).expect("decodes"), want);
        prop_assert_eq!(&got.used, &want.used_ranges(bs));
        let mut encoded = block.to_vec();
        want.encode_into(3, &mut encoded);
        for &(s, e) in &got.used {
            prop_assert_eq!(&raw[s..e], &encoded[s..e], "bytes {}..{}", s, e);
        }
        Ok(Some(got))
    }

    proptest! {
        /// An in-place put gives the leaf that decoding, changing and encoding gives: the same
        /// node decoded, the same bytes in every range that means something, those ranges as
        /// `used_ranges` says. It declines exactly when the change does not fit or a replace
        /// changes a value's length. The block starts as junk, as a replayed leaf's middle may.
        #[test]
        fn a_raw_put_is_a_decoded_put(
            items in proptest::collection::btree_map(0u64..40, proptest::collection::vec(any::<u8>(), 0..70), 0..30),
            key in 0u64..40,
            val in proptest::collection::vec(any::<u8>(), 0..70),
            bs in prop::sample::select(vec![512usize, 1024, 2048]),
        ) {
            let Some((node, mut block)) = encoded_leaf(&items, bs) else { return Ok(()) };
            block[16..44].fill(0x5A);
            let k = Key::new(key, 9);
            let mut want = node.clone();
            let Body::Leaf(w) = &mut want.body else { unreachable!() };
            let (old, same_len) = match w.binary_search_by(|(x, _)| x.cmp(&k)) {
                Ok(i) => {
                    let same = w[i].1.len() == val.len();
                    (Some(std::mem::replace(&mut w[i].1, val.clone().into()).to_vec()), same)
                }
                Err(i) => {
                    w.insert(i, (k, val.clone().into()));
                    (None, true)
                }
            };
            let applies = same_len && want.encoded_bytes() <= bs;
            let mut raw = block.clone();
            let got = leaf_put_raw(&mut raw, 3, 1, k, &val, KeyRange::ALL).expect("a valid leaf");
            like_decoded(&block, &raw, got, applies, &want, old)?;
        }

        /// An in-place removal gives the leaf that decoding, removing and encoding gives, as
        /// a put does; it declines exactly when the key is absent or the leaf would be empty.
        #[test]
        fn a_raw_remove_is_a_decoded_remove(
            items in proptest::collection::btree_map(0u64..40, proptest::collection::vec(any::<u8>(), 0..70), 0..30),
            key in 0u64..40,
            bs in prop::sample::select(vec![512usize, 1024, 2048]),
        ) {
            let Some((node, block)) = encoded_leaf(&items, bs) else { return Ok(()) };
            let k = Key::new(key, 9);
            let mut want = node.clone();
            let Body::Leaf(w) = &mut want.body else { unreachable!() };
            let old = w.binary_search_by(|(x, _)| x.cmp(&k)).ok().map(|i| w.remove(i).1.to_vec());
            let applies = old.is_some() && !w.is_empty();
            let mut raw = block.clone();
            let got = leaf_remove_raw(&mut raw, 3, 1, k, KeyRange::ALL).expect("a valid leaf");
            let Some(got) = like_decoded(&block, &raw, got, applies, &want, old)? else {
                return Ok(());
            };
            // The middle was zero (as encoded) and stays so, with what was given up.
            let in_use = |i: usize| got.used.iter().any(|&(s, e)| s <= i && i < e);
            prop_assert!((0..bs).all(|i| in_use(i) || raw[i] == 0), "the middle is not zero");
        }

        /// A leaf whose keys are out of order is refused, not edited.
        #[test]
        fn a_raw_edit_refuses_keys_out_of_order(k in 0u64..4) {
            let node = Node { tree: 1, level: 0, body: Body::Leaf(vec![
                (Key::new(1, 0), vec![1; 10].into()),
                (Key::new(2, 0), vec![2; 10].into()),
                (Key::new(3, 0), vec![3; 10].into()),
            ]) };
            let mut block = vec![0u8; 512];
            node.encode_into(3, &mut block);
            // The second key made the largest.
            let p = NODE_HEADER_BYTES + LEAF_ENTRY_BYTES;
            put_key(&mut block[p..], Key::new(9, 0));
            prop_assert!(leaf_put_raw(&mut block.clone(), 3, 1, Key::new(k, 1), b"x", KeyRange::ALL).is_err());
            prop_assert!(leaf_remove_raw(&mut block.clone(), 3, 1, Key::new(1, 0), KeyRange::ALL).is_err());
        }

        /// A leaf whose values are not packed is refused, not edited.
        #[test]
        fn a_raw_edit_refuses_an_unpacked_leaf(gap in 1usize..8) {
            let node = Node { tree: 1, level: 0, body: Body::Leaf(vec![
                (Key::new(1, 0), vec![1; 10].into()),
                (Key::new(2, 0), vec![2; 10].into()),
            ]) };
            let mut block = vec![0u8; 512];
            node.encode_into(3, &mut block);
            // The second value moved down by `gap`, leaving a hole above it.
            let p = NODE_HEADER_BYTES + LEAF_ENTRY_BYTES;
            let off = usize::from(u16::from_le_bytes([block[p + 16], block[p + 17]])) - gap;
            block[p + 16..p + 18].copy_from_slice(&(off as u16).to_le_bytes());
            prop_assert!(leaf_put_raw(&mut block.clone(), 3, 1, Key::new(0, 0), b"x", KeyRange::ALL).is_err());
            prop_assert!(leaf_remove_raw(&mut block.clone(), 3, 1, Key::new(1, 0), KeyRange::ALL).is_err());
        }

        /// A point lookup step on the encoded node finds what a binary search of the decoded
        /// node finds, for keys present, absent, and beyond either end.
        #[test]
        fn raw_step_agrees_with_the_decoded_node(keys in sorted_keys(), probes in proptest::collection::vec((0u64..4, any::<u64>(), 0u64..64, any::<bool>()), 1..40), interior in any::<bool>()) {
            let mut block = vec![0u8; 4096];
            let node = if interior {
                let mut items: Vec<(Key, u64)> = keys.iter().enumerate().map(|(i, &k)| (k, 100 + i as u64)).collect();
                if items.is_empty() {
                    items.push((Key::MIN, 99));
                }
                Node { tree: 1, level: 1, body: Body::Interior(items) }
            } else {
                Node { tree: 1, level: 0, body: Body::Leaf(keys.iter().map(|&k| (k, k.b.to_le_bytes()[..2].to_vec().into())).collect()) }
            };
            node.encode_into(7, &mut block);
            let mut wanted: Vec<Key> = probes.iter().map(|&(a, h, n, spread)| Key::new(a * 1000 + u64::from(!spread && n == 0), if spread { h } else { n })).collect();
            wanted.extend(keys.iter().copied().step_by(7));
            wanted.extend([Key::MIN, Key::MAX]);
            for k in wanted {
                let got = raw_step(&block, 7, 1, node.level, k).expect("valid node");
                let expect = match &node.body {
                    Body::Leaf(items) => match items.binary_search_by(|(x, _)| x.cmp(&k)) {
                        Ok(i) => RawStep::Found(items[i].1.to_vec()),
                        Err(_) => RawStep::Absent,
                    },
                    Body::Interior(items) => {
                        let i = items.partition_point(|(x, _)| *x <= k).saturating_sub(1);
                        RawStep::Child(items[i].1, KeyRange::ALL.of_entry(items, i))
                    }
                };
                prop_assert_eq!(got, expect, "key {:?}", k);
            }
        }

        /// A seek on the encoded leaf finds what a partition of the decoded leaf finds, both
        /// ways, for keys present, absent, and beyond either end.
        #[test]
        fn raw_seek_agrees_with_the_decoded_leaf(keys in sorted_keys(), probes in proptest::collection::vec((0u64..4, any::<u64>(), 0u64..64, any::<bool>()), 1..40)) {
            let mut block = vec![0u8; 4096];
            let items: Vec<(Key, Value)> = keys.iter().map(|&k| (k, k.b.to_le_bytes()[..(k.b % 3) as usize].to_vec().into())).collect();
            let node = Node { tree: 1, level: 0, body: Body::Leaf(items.clone()) };
            node.encode_into(7, &mut block);
            let mut wanted: Vec<Key> = probes.iter().map(|&(a, h, n, spread)| Key::new(a * 1000 + u64::from(!spread && n == 0), if spread { h } else { n })).collect();
            wanted.extend(keys.iter().copied().step_by(5));
            wanted.extend([Key::MIN, Key::MAX]);
            let owned = |e: &(Key, Value)| (e.0, e.1.to_vec());
            for k in wanted {
                let ge = items.get(items.partition_point(|(x, _)| *x < k)).map(owned);
                let le = items[..items.partition_point(|(x, _)| *x <= k)].last().map(owned);
                prop_assert_eq!(raw_seek(&block, 7, 1, k, Seek::AtOrAfter).expect("valid leaf"), ge, "key {:?}", k);
                prop_assert_eq!(raw_seek(&block, 7, 1, k, Seek::AtOrBefore).expect("valid leaf"), le, "key {:?}", k);
            }
        }

        /// A lookup step on a node whose keys are garbage (out of order) returns something or an
        /// error, never panics.
        #[test]
        fn raw_step_on_garbage_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 4096), count in 0u16..300, level in 0u8..2, a in any::<u64>(), b in any::<u64>()) {
            bytes[0..4].copy_from_slice(&NODE_MAGIC.to_le_bytes());
            bytes[4] = level;
            bytes[5] = 1;
            bytes[6..8].copy_from_slice(&count.to_le_bytes());
            bytes[8..16].copy_from_slice(&9u64.to_le_bytes());
            let _ = raw_step(&bytes, 9, 1, level, Key::new(a, b));
            let _ = raw_seek(&bytes, 9, 1, Key::new(a, b), Seek::AtOrAfter);
            let _ = raw_seek(&bytes, 9, 1, Key::new(a, b), Seek::AtOrBefore);
        }

        /// Arbitrary bytes decode to an error or a node, never a panic.
        #[test]
        fn garbage_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 4096), count in 0u16..300, level in 0u8..3) {
            bytes[0..4].copy_from_slice(&NODE_MAGIC.to_le_bytes());
            bytes[4] = level;
            bytes[5] = 1;
            bytes[6..8].copy_from_slice(&count.to_le_bytes());
            bytes[8..16].copy_from_slice(&9u64.to_le_bytes());
            let _ = Node::decode(&bytes, 9, 1);
        }
    }
}
