//! Extent items: a run of a file's blocks, keyed by its first file block, holding where the
//! run lies on disk (docs/on-disk-format.md "The fs tree").

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::arr8;

/// A run of blocks: file block `file`, `len` blocks at disk block `disk`. An unwritten run is
/// allocated but holds no data of the file: it reads as zeros whatever its blocks hold, and
/// becomes written in the transaction after the data IO that fills it (as XFS's unwritten
/// extents), so preallocation costs no IO and a crash never shows a block's old contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub file: u64,
    pub disk: u64,
    pub len: u64,
    pub unwritten: bool,
}

/// Bit of an extent item's flags word: the run is unwritten.
const EXTENT_UNWRITTEN: u32 = 1;

/// Bits of a key's offset (`tree::keys`): a file block is one, so file blocks stay below
/// `OFFSET_MAX`.
pub const OFFSET_BITS: u32 = 56;
pub const OFFSET_MAX: u64 = (1 << OFFSET_BITS) - 1;

pub const EXTENT_VALUE_BYTES: usize = 16;
/// The longest extent one item describes.
pub const EXTENT_LEN_MAX: u64 = u32::MAX as u64;
/// Largest file size: file blocks must fit the key's 56-bit offset; capped at 8 EiB - 1.
pub fn max_file_size(bs: u32) -> u64 {
    (OFFSET_MAX.saturating_mul(u64::from(bs))).min(i64::MAX as u64)
}

impl Extent {
    pub fn encode(&self) -> [u8; EXTENT_VALUE_BYTES] {
        let mut b = [0u8; EXTENT_VALUE_BYTES];
        b[0..8].copy_from_slice(&self.disk.to_le_bytes());
        b[8..12].copy_from_slice(&(self.len as u32).to_le_bytes());
        let flags = if self.unwritten { EXTENT_UNWRITTEN } else { 0 };
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        b
    }

    pub fn decode(file: u64, v: &[u8]) -> FsResult<Extent> {
        if v.len() != EXTENT_VALUE_BYTES {
            return Err(FsError::corrupt(
                0,
                format!("extent item of {} bytes", v.len()),
            ));
        }
        let len = u64::from(u32::from_le_bytes([v[8], v[9], v[10], v[11]]));
        if len == 0 {
            return Err(FsError::corrupt(0, "empty extent"));
        }
        let flags = u32::from_le_bytes([v[12], v[13], v[14], v[15]]);
        if flags & !EXTENT_UNWRITTEN != 0 {
            return Err(FsError::corrupt(
                0,
                format!("extent with unknown flags {flags:#x}"),
            ));
        }
        let disk = u64::from_le_bytes(arr8(&v[0..8]));
        // Block arithmetic within the extent (`disk + k`, k < len) must not overflow.
        if disk.checked_add(len).is_none() {
            return Err(FsError::corrupt(
                0,
                format!("extent of {len} blocks at block {disk}"),
            ));
        }
        Ok(Extent {
            file,
            disk,
            len,
            unwritten: flags & EXTENT_UNWRITTEN != 0,
        })
    }

    pub fn end(&self) -> u64 {
        self.file + self.len
    }

    /// Blocks `[from, to)` of this run (which it covers), as a run of their own.
    pub fn slice(&self, from: u64, to: u64) -> Extent {
        debug_assert!(self.file <= from && from < to && to <= self.end());
        Extent {
            file: from,
            disk: self.disk + (from - self.file),
            len: to - from,
            unwritten: self.unwritten,
        }
    }

    /// `decode`, then the disk blocks checked against the data area `[start, end)`: an extent
    /// that maps the superblock, the log, the header or blocks past the data area is corrupt
    /// before any read, write or free uses it.
    pub fn decode_in(file: u64, v: &[u8], ino: u64, (start, end): (u64, u64)) -> FsResult<Extent> {
        let e = Extent::decode(file, v)?;
        if e.disk < start || e.disk.checked_add(e.len).is_none_or(|x| x > end) {
            return Err(FsError::corrupt(
                0,
                format!(
                    "inode {ino}: extent at file block {file} maps disk blocks {}+{} outside \
                     the data area {start}..{end}",
                    e.disk, e.len
                ),
            ));
        }
        Ok(e)
    }
}
