//! Extended attribute items: fs-tree items keyed by (inode, name hash), each a bucket of
//! entries. A small value lives in the entry; a larger one (up to 64 KiB) in a run of blocks of
//! its own, which the entry names.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::{arr4, arr8};

pub const CHANGE_XATTR: &[u8] = b"user.cilfs.change";
pub const XATTR_NAME_MAX: usize = 255;
/// The largest value (Linux's XATTR_SIZE_MAX).
pub const XATTR_VALUE_MAX: usize = 65536;
const REMOTE: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Inline(Vec<u8>),
    /// `len` bytes in blocks `[start, start + blocks)`.
    Remote {
        start: u64,
        blocks: u64,
        len: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub value: Value,
}

/// Entry: name length u8, flags u8 (bit 0 remote), value length u32, name, then the value or
/// (start block u64, blocks u32).
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut v = Vec::new();
    for e in entries {
        v.push(e.name.len() as u8);
        match &e.value {
            Value::Inline(val) => {
                v.push(0);
                v.extend_from_slice(&(val.len() as u32).to_le_bytes());
                v.extend_from_slice(&e.name);
                v.extend_from_slice(val);
            }
            Value::Remote { start, blocks, len } => {
                v.push(REMOTE);
                v.extend_from_slice(&len.to_le_bytes());
                v.extend_from_slice(&e.name);
                v.extend_from_slice(&start.to_le_bytes());
                v.extend_from_slice(&(*blocks as u32).to_le_bytes());
            }
        }
    }
    v
}

pub fn decode(b: &[u8], ino: u64) -> FsResult<Vec<Entry>> {
    let bad = || FsError::corrupt(0, format!("inode {ino}: malformed xattr bucket"));
    let mut out = Vec::new();
    let mut p = 0;
    while p < b.len() {
        if p + 6 > b.len() {
            return Err(bad());
        }
        let n = usize::from(b[p]);
        let flags = b[p + 1];
        let len = u32::from_le_bytes(arr4(&b[p + 2..p + 6]));
        let body = if flags & REMOTE != 0 {
            12
        } else {
            len as usize
        };
        if n == 0
            || flags & !REMOTE != 0
            || len as usize > XATTR_VALUE_MAX
            || p + 6 + n + body > b.len()
        {
            return Err(bad());
        }
        let name = b[p + 6..p + 6 + n].to_vec();
        let at = p + 6 + n;
        let value = if flags & REMOTE != 0 {
            let blocks = u64::from(u32::from_le_bytes(arr4(&b[at + 8..at + 12])));
            if blocks == 0 {
                return Err(bad());
            }
            Value::Remote {
                start: u64::from_le_bytes(arr8(&b[at..at + 8])),
                blocks,
                len,
            }
        } else {
            Value::Inline(b[at..at + body].to_vec())
        };
        out.push(Entry { name, value });
        p = at + body;
    }
    Ok(out)
}

/// Blocks of `bs` bytes a remote value of `len` bytes is written in (`posix::xattr::put`).
pub fn remote_blocks(len: u32, bs: u64) -> u64 {
    u64::from(len).div_ceil(bs)
}

/// Refuses a remote value whose blocks are not all inside the data area `[first, end)` (the
/// header's `data_start..data_end`): a corrupt address never reads or frees the superblock,
/// the log, the header or blocks past the end. And one of more or fewer blocks than its `len`
/// takes in blocks of `bs` bytes: freeing it would free blocks it never owned, each cancelled
/// in one transaction past what the transaction reserved (a 700-byte value claiming 44 blocks).
pub(crate) fn remote_in_area(
    start: u64,
    blocks: u64,
    len: u32,
    bs: u64,
    (first, end): (u64, u64),
) -> FsResult<()> {
    if blocks != remote_blocks(len, bs) {
        return Err(FsError::corrupt(
            0,
            format!("xattr value of {len} bytes in {blocks} blocks of {bs} bytes"),
        ));
    }
    if start < first || start.checked_add(blocks).is_none_or(|e| e > end) {
        return Err(FsError::corrupt(
            0,
            format!("xattr value at blocks {start}+{blocks} outside the data area {first}..{end}"),
        ));
    }
    Ok(())
}
