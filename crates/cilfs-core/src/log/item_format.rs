//! The payload of an ITEM op. Version 1 knows one kind, the metadata buffer: a block of the data
//! device with the byte ranges that changed since it was last written back.

use crate::format::{Decoder, FormatError};

pub const ITEM_BUF: u16 = 1;
/// The block was freed in this checkpoint: earlier logged images of it must not be replayed.
pub const BUF_CANCEL: u16 = 1;
/// The block carries, at `lsn_offset`, the LSN it was last written back at, the fs UUID and its
/// CRC (see `stamp::write_lsn_stamp`).
pub const BUF_LSN_STAMP: u16 = 2;
/// The header carries the CRC32C of the block as this item leaves it (`stamp::content_crc`),
/// leaving out its LSN stamp and a stretch whose bytes mean nothing (a node's free middle,
/// never logged), and that stretch. Replay compares the block it rebuilt with it: a block
/// damaged on disk outside the logged ranges would otherwise be resealed with a valid stamp.
pub const BUF_CONTENT_CRC: u16 = 4;
const BUF_HEADER_BYTES: usize = 16;
/// The CRC, and the stretch's start and end (equal when there is none).
const CONTENT_CRC_BYTES: usize = 12;
const WHAT: &str = "buffer log item";

/// A logged image of part of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufImage {
    pub blkno: u64,
    pub cancel: bool,
    pub lsn_offset: Option<u16>,
    /// `BUF_CONTENT_CRC`: absent in items written before it existed.
    pub content_crc: Option<u32>,
    /// `[start, end)` the content CRC leaves out (`BufData::unlogged`).
    pub unlogged: Option<(u32, u32)>,
    /// (offset in block, bytes) of each logged range, sorted and disjoint.
    pub ranges: Vec<(u32, Vec<u8>)>,
}

/// Encoded size of a buffer item with these range lengths.
pub fn buf_item_len(range_lens: impl Iterator<Item = usize>) -> usize {
    range_lens.map(|l| 8 + l).sum::<usize>() + BUF_HEADER_BYTES + CONTENT_CRC_BYTES
}

/// Encodes a buffer item from a block's data and its dirty ranges.
pub fn encode_buf_item(
    blkno: u64,
    cancel: bool,
    lsn_offset: Option<u16>,
    data: &[u8],
    ranges: &[(u32, u32)],
) -> Vec<u8> {
    let mut out = Vec::new();
    encode_buf_item_into(&mut out, blkno, cancel, lsn_offset, data, ranges, None);
    out
}

/// `encode_buf_item` into `out`, replacing what it held: a relogged item's image is formatted
/// into the vector of the image it replaces, under the CIL lock, with no allocation when it
/// fits (every changed block of every commit comes through here; allocating and zeroing a
/// new image each time cost a tenth of a create, page faults on fresh memory included).
pub fn encode_buf_item_into(
    out: &mut Vec<u8>,
    blkno: u64,
    cancel: bool,
    lsn_offset: Option<u16>,
    data: &[u8],
    ranges: &[(u32, u32)],
    unlogged: Option<(u32, u32)>,
) {
    assert!(
        ranges.len() <= usize::from(u16::MAX),
        "too many ranges in one buffer"
    );
    let len = buf_item_len(ranges.iter().map(|r| r.1 as usize));
    let mut flags = 0;
    if cancel {
        flags |= BUF_CANCEL;
    }
    if lsn_offset.is_some() {
        flags |= BUF_LSN_STAMP;
    }
    flags |= BUF_CONTENT_CRC;
    out.clear();
    if out.capacity() < len {
        // Not `reserve`: a reallocation would copy the old capacity's bytes, all stale.
        *out = Vec::with_capacity(len);
    }
    out.extend_from_slice(&ITEM_BUF.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&lsn_offset.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&(ranges.len() as u16).to_le_bytes());
    out.extend_from_slice(&blkno.to_le_bytes());
    let crc = super::stamp::content_crc(data, lsn_offset, unlogged);
    let (skip_start, skip_end) = unlogged.unwrap_or((0, 0));
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&skip_start.to_le_bytes());
    out.extend_from_slice(&skip_end.to_le_bytes());
    for &(off, n) in ranges {
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    for &(off, n) in ranges {
        out.extend_from_slice(&data[off as usize..(off + n) as usize]);
    }
    debug_assert_eq!(out.len(), len);
}

/// Decodes an item payload; `block_size` bounds the ranges.
pub fn decode_item(payload: &[u8], block_size: u32) -> Result<BufImage, FormatError> {
    let mut d = Decoder::new(payload, WHAT);
    let kind = d.u16()?;
    if kind != ITEM_BUF {
        return Err(d.invalid("item type", format!("{kind}")));
    }
    let flags = d.u16()?;
    if flags & !(BUF_CANCEL | BUF_LSN_STAMP | BUF_CONTENT_CRC) != 0 {
        return Err(d.invalid("flags", format!("{flags:#x}")));
    }
    let lsn_off = d.u16()?;
    let n = d.u16()?;
    let blkno = d.u64()?;
    let (content_crc, unlogged) = if flags & BUF_CONTENT_CRC != 0 {
        let crc = d.u32()?;
        let (start, end) = (d.u32()?, d.u32()?);
        if start > end || end > block_size {
            return Err(d.invalid(
                "unlogged stretch",
                format!("{start}..{end} in a {block_size}-byte block"),
            ));
        }
        (Some(crc), (start < end).then_some((start, end)))
    } else {
        (None, None)
    };
    let lsn_offset = (flags & BUF_LSN_STAMP != 0).then_some(lsn_off);
    if lsn_offset.is_some_and(|o| u32::from(o) + super::stamp::LSN_STAMP_BYTES as u32 > block_size)
    {
        return Err(d.invalid(
            "lsn offset",
            format!("{lsn_off} in a {block_size}-byte block"),
        ));
    }
    let mut spans = Vec::with_capacity(usize::from(n));
    let mut end_prev = 0u64;
    for _ in 0..n {
        let off = d.u32()?;
        let len = d.u32()?;
        let end = u64::from(off) + u64::from(len);
        if end > u64::from(block_size) || len == 0 || u64::from(off) < end_prev {
            return Err(d.invalid("range", format!("{off}+{len} in a {block_size}-byte block")));
        }
        end_prev = end;
        spans.push((off, len));
    }
    let mut ranges = Vec::with_capacity(spans.len());
    for (off, len) in spans {
        ranges.push((off, d.bytes(len as usize)?.to_vec()));
    }
    if d.remaining() != 0 {
        return Err(d.invalid("length", format!("{} trailing bytes", d.remaining())));
    }
    Ok(BufImage {
        blkno,
        cancel: flags & BUF_CANCEL != 0,
        lsn_offset,
        content_crc,
        unlogged,
        ranges,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip() {
        let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let enc = encode_buf_item(42, false, Some(8), &data, &[(0, 16), (100, 50)]);
        assert_eq!(enc.len(), buf_item_len([16usize, 50].into_iter()));
        let img = decode_item(&enc, 4096).unwrap();
        assert_eq!(img.blkno, 42);
        assert_eq!(img.lsn_offset, Some(8));
        assert_eq!(img.ranges[1], (100, data[100..150].to_vec()));
        assert_eq!(
            img.content_crc,
            Some(crate::log::stamp::content_crc(&data, Some(8), None))
        );
        assert!(decode_item(&enc, 128).is_err());
    }

    /// Items written before the content CRC existed still decode (a log left dirty by an
    /// older binary replays).
    #[test]
    fn decodes_items_without_content_crc() {
        let data = [7u8; 4096];
        let mut enc = encode_buf_item(42, false, None, &data, &[(0, 16)]);
        let flags = u16::from_le_bytes([enc[2], enc[3]]) & !BUF_CONTENT_CRC;
        enc[2..4].copy_from_slice(&flags.to_le_bytes());
        enc.drain(BUF_HEADER_BYTES..BUF_HEADER_BYTES + CONTENT_CRC_BYTES);
        let img = decode_item(&enc, 4096).unwrap();
        assert_eq!(img.content_crc, None);
        assert_eq!(img.ranges, vec![(0, vec![7u8; 16])]);
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_item(&bytes, 4096);
        }
    }
}
