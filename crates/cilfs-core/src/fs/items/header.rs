//! The filesystem header block (the first block of the metadata area): tree roots, counters and
//! the free list that feeds the free-space trees' own node allocations
//! (docs/on-disk-format.md "Filesystem header").

use crate::buf::CounterChange;
use crate::fs::error::{FsError, FsResult};
use crate::fs::items::inode::INO_LIMIT;
use crate::fs::items::{arr4, arr8};

pub const HEADER_MAGIC: u32 = 0x4346_5348; // "CFSH"
pub const HEADER_VERSION: u32 = 1;
pub const HEADER_LSN_OFFSET: u16 = 8;
const FREELIST_OFFSET: usize = 136;
/// The smallest block size the filesystem layer accepts: a tree value is at most a quarter of a
/// leaf, and a directory entry with a 255-byte name must fit one.
pub const MIN_FS_BLOCK_SIZE: u32 = 2048;

/// The tallest tree accepted: far beyond what a 2^64-block device needs at fanout >= 40.
pub const MAX_LEVELS: u8 = 12;

/// Where a tree's root is, and its level (0: the root is a leaf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Root {
    pub blkno: u64,
    pub level: u8,
}

/// Tree identifiers, stored in every node.
pub const TREE_FS: u8 = 1;
pub const TREE_FREE_BY_BLOCK: u8 = 2;
pub const TREE_FREE_BY_SIZE: u8 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub fs_root: Root,
    pub bno_root: Root,
    pub size_root: Root,
    pub next_ino: u64,
    /// Blocks in the free-space trees (the free list not counted).
    pub free_blocks: u64,
    pub inode_count: u64,
    /// Blocks `[data_start, data_end)` are managed by the allocator.
    pub data_start: u64,
    pub data_end: u64,
    /// Blocks kept for the free-space trees' nodes.
    pub freelist: Vec<u64>,
}

/// The roots of the three trees: what a reader needs of the header, copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roots {
    pub fs: Root,
    pub bno: Root,
    pub size: Root,
}

impl Roots {
    pub fn root(&self, tree: u8) -> Root {
        match tree {
            TREE_FREE_BY_BLOCK => self.bno,
            TREE_FREE_BY_SIZE => self.size,
            _ => self.fs,
        }
    }
}

/// Where `encode_into` puts next_ino, free_blocks and inode_count, one after another.
const COUNTERS: std::ops::Range<usize> = 88..112;

/// The most entries the free list holds.
const FREELIST_MAX: usize = 128;
/// The bytes of the header block an encoding sets: past them the block is zero.
pub const HEADER_ENCODED_BYTES: usize = FREELIST_OFFSET + 8 * FREELIST_MAX;

/// Entries the free list holds in a block of `bs` bytes.
pub fn freelist_capacity(bs: usize) -> usize {
    ((bs - FREELIST_OFFSET) / 8).min(FREELIST_MAX)
}

fn put_root(out: &mut [u8], r: Root) {
    out[0..8].copy_from_slice(&r.blkno.to_le_bytes());
    out[8] = r.level;
    out[9..16].fill(0);
}

fn get_root(b: &[u8]) -> Root {
    Root {
        blkno: u64::from_le_bytes(arr8(&b[0..8])),
        level: b[8],
    }
}

impl Header {
    pub fn encode_into(&self, out: &mut [u8]) {
        assert!(self.freelist.len() <= freelist_capacity(out.len()));
        out[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&HEADER_VERSION.to_le_bytes());
        // 8..36: LSN stamp (LSN, UUID, CRC), 36..40 reserved.
        put_root(&mut out[40..56], self.fs_root);
        put_root(&mut out[56..72], self.bno_root);
        put_root(&mut out[72..88], self.size_root);
        out[COUNTERS].copy_from_slice(&self.counters());
        out[112..120].copy_from_slice(&self.data_start.to_le_bytes());
        out[120..128].copy_from_slice(&self.data_end.to_le_bytes());
        out[128..132].copy_from_slice(&(self.freelist.len() as u32).to_le_bytes());
        out[36..40].fill(0);
        out[132..136].fill(0);
        let mut p = FREELIST_OFFSET;
        for b in &self.freelist {
            out[p..p + 8].copy_from_slice(&b.to_le_bytes());
            p += 8;
        }
        out[p..].fill(0);
    }

    /// How the counters moved from `before` to `self`, as a commit writes them late
    /// (`LateWrite::counters`): next_ino raised, free_blocks and inode_count moved by the
    /// difference; all three, a counter that did not move with a change of nothing. A late
    /// write of the header's bytes must list every counter they cover: the push keeps only
    /// the counters a context's writes list where the checkpoints before left them, and the
    /// values the bytes carry may count commits of another context (a commit of leaves adds
    /// its counters to the header in memory before its insert, with no turn).
    pub fn counter_changes(&self, before: &Header) -> [(usize, CounterChange); 3] {
        let (now, was) = (self.counter_values(), before.counter_values());
        let at = |i: usize| COUNTERS.start + 8 * i;
        [
            (
                at(0),
                CounterChange::Max(if now[0] > was[0] { now[0] } else { 0 }),
            ),
            (at(1), CounterChange::Add(now[1].wrapping_sub(was[1]))),
            (at(2), CounterChange::Add(now[2].wrapping_sub(was[2]))),
        ]
    }

    /// Moves the counters by `changes` (`counter_changes` of another header): what the push
    /// does to the encoded ones.
    pub fn apply_counter_changes(&mut self, changes: &[(usize, CounterChange)]) {
        let mut fields = self.counter_fields();
        for &(at, change) in changes {
            let field = &mut fields[(at - COUNTERS.start) / 8];
            **field = change.apply(**field);
        }
    }

    /// next_ino, free_blocks and inode_count, encoded one after another (`COUNTERS`).
    fn counters(&self) -> [u8; COUNTERS.end - COUNTERS.start] {
        let mut out = [0u8; COUNTERS.end - COUNTERS.start];
        for (slot, v) in out.chunks_exact_mut(8).zip(self.counter_values()) {
            slot.copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// The counters in the order `COUNTERS` holds them.
    fn counter_values(&self) -> [u64; 3] {
        [self.next_ino, self.free_blocks, self.inode_count]
    }

    /// The counters in the order `COUNTERS` holds them, to change.
    fn counter_fields(&mut self) -> [&mut u64; 3] {
        [
            &mut self.next_ino,
            &mut self.free_blocks,
            &mut self.inode_count,
        ]
    }

    pub fn decode(b: &[u8], blkno: u64) -> FsResult<Header> {
        if b.len() < FREELIST_OFFSET {
            return Err(FsError::corrupt(
                blkno,
                format!("header block of {} bytes", b.len()),
            ));
        }
        let magic = u32::from_le_bytes(arr4(&b[0..4]));
        if magic != HEADER_MAGIC {
            return Err(FsError::NotFormatted(format!(
                "no filesystem header at block {blkno} (magic {magic:#010x}); was mkfs interrupted?"
            )));
        }
        let version = u32::from_le_bytes(arr4(&b[4..8]));
        if version != HEADER_VERSION {
            return Err(FsError::corrupt(
                blkno,
                format!("header version {version}, this cilfs knows {HEADER_VERSION}"),
            ));
        }
        let n = u32::from_le_bytes(arr4(&b[128..132])) as usize;
        if n > freelist_capacity(b.len()) {
            return Err(FsError::corrupt(blkno, format!("free list of {n} entries")));
        }
        let freelist = (0..n)
            .map(|i| u64::from_le_bytes(arr8(&b[FREELIST_OFFSET + 8 * i..])))
            .collect();
        let h = Header {
            fs_root: get_root(&b[40..56]),
            bno_root: get_root(&b[56..72]),
            size_root: get_root(&b[72..88]),
            next_ino: u64::from_le_bytes(arr8(&b[88..96])),
            free_blocks: u64::from_le_bytes(arr8(&b[96..104])),
            inode_count: u64::from_le_bytes(arr8(&b[104..112])),
            data_start: u64::from_le_bytes(arr8(&b[112..120])),
            data_end: u64::from_le_bytes(arr8(&b[120..128])),
            freelist,
        };
        let in_area = |x: u64| x >= h.data_start && x < h.data_end;
        if h.data_start > h.data_end
            || ![h.fs_root.blkno, h.bno_root.blkno, h.size_root.blkno]
                .into_iter()
                .all(in_area)
            || !h.freelist.iter().all(|&x| in_area(x))
        {
            return Err(FsError::corrupt(
                blkno,
                "header points outside the data area",
            ));
        }
        // Counters no filesystem can reach: a crafted value under a valid CRC, which every
        // later count would overflow from. (A next inode number past the last one fails
        // only creates, `ino_alloc`.)
        let area = h.data_end - h.data_start;
        let levels = [h.fs_root.level, h.bno_root.level, h.size_root.level];
        if let Some(why) = [
            (
                levels.iter().any(|&l| l >= MAX_LEVELS),
                "a root level past the tallest tree",
            ),
            (
                h.free_blocks > area,
                "more free blocks than the data area holds",
            ),
            (
                h.inode_count > INO_LIMIT,
                "more inodes than can be numbered",
            ),
        ]
        .into_iter()
        .find_map(|(bad, why)| bad.then_some(why))
        {
            return Err(FsError::corrupt(blkno, format!("header: {why}")));
        }
        Ok(h)
    }

    /// The three roots, as a reader copies them (`ReadView`).
    pub fn roots(&self) -> Roots {
        Roots {
            fs: self.fs_root,
            bno: self.bno_root,
            size: self.size_root,
        }
    }

    pub fn root(&self, tree: u8) -> Root {
        match tree {
            TREE_FREE_BY_BLOCK => self.bno_root,
            TREE_FREE_BY_SIZE => self.size_root,
            _ => self.fs_root,
        }
    }

    pub fn set_root(&mut self, tree: u8, r: Root) {
        match tree {
            TREE_FREE_BY_BLOCK => self.bno_root = r,
            TREE_FREE_BY_SIZE => self.size_root = r,
            _ => self.fs_root = r,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sample() -> Header {
        let root = |blkno| Root { blkno, level: 1 };
        Header {
            fs_root: root(40),
            bno_root: root(41),
            size_root: root(42),
            next_ino: 0x0102_0304_0506_0708,
            // Distinct bytes, and within what the data area holds (`decode` checks).
            free_blocks: 0x000E_1718,
            inode_count: 0x2122_2324_2526_2728,
            data_start: 16,
            data_end: 1 << 20,
            freelist: vec![50, 51, 52],
        }
    }

    /// A header's counter changes, applied to the bytes of the header before them, give the
    /// bytes of the header after them, and touch nothing else: what a push does with a
    /// commit's late counters.
    #[test]
    fn counter_changes_move_the_encoded_counters_alone() {
        let before = sample();
        let mut after = before.clone();
        after.next_ino += 5;
        after.free_blocks -= 3;
        after.inode_count += 1;
        let mut bytes = vec![0u8; 4096];
        before.encode_into(&mut bytes);
        let changes = after.counter_changes(&before);
        for &(at, change) in &changes {
            let v = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            bytes[at..at + 8].copy_from_slice(&change.apply(v).to_le_bytes());
        }
        let mut want = vec![0u8; 4096];
        after.encode_into(&mut want);
        assert_eq!(bytes, want);
        assert_eq!(Header::decode(&bytes, 0).unwrap(), after);
        let mut moved = before.clone();
        moved.apply_counter_changes(&changes);
        assert_eq!(moved, after);
        // A lower next_ino is no change (numbers are only ever raised), nor are equal counts.
        let mut lower = before.clone();
        lower.next_ino -= 1;
        assert!(lower
            .counter_changes(&before)
            .iter()
            .all(|(_, c)| c.is_nothing()));
    }
}
