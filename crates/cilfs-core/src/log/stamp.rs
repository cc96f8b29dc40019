//! The LSN stamp of a metadata block: the LSN of the checkpoint that last logged it, the
//! filesystem's UUID and a CRC32C of the whole block, written by write back and by replay and
//! checked by every read of the block; and the CRC of what a block means, outside its stamp,
//! which buffer items carry (`item_format::BUF_CONTENT_CRC`).

use super::Lsn;

/// Bytes at a block's LSN stamp: the LSN, the filesystem UUID and a CRC32C of the whole block
/// (taken with the CRC field zeroed).
pub const LSN_STAMP_BYTES: usize = 28;

/// CRC32C of `block` with the 4 bytes at `crc_at` taken as zero.
fn block_crc(block: &[u8], crc_at: usize) -> u32 {
    let mut c = crate::util::crc::Crc32c::new();
    c.update(&block[..crc_at]);
    c.update(&[0u8; 4]);
    c.update(&block[crc_at + 4..]);
    c.value()
}

/// CRC32C of the bytes of `block` outside its LSN stamp (at `lsn_offset`, if any) and outside
/// `unlogged`, in order: what the block means, whatever LSN write back or replay stamps on it
/// and whatever its unlogged stretch holds (`item_format::BUF_CONTENT_CRC`).
pub fn content_crc(block: &[u8], lsn_offset: Option<u16>, unlogged: Option<(u32, u32)>) -> u32 {
    let len = block.len();
    let mut skips = [(len, len); 2];
    if let Some(o) = lsn_offset.map(usize::from) {
        skips[0] = (o.min(len), (o + LSN_STAMP_BYTES).min(len));
    }
    if let Some((a, z)) = unlogged {
        skips[1] = ((a as usize).min(len), (z as usize).min(len));
    }
    skips.sort_unstable();
    let mut crc = crate::util::crc::Crc32c::new();
    let mut at = 0;
    for (a, z) in skips {
        if a > at {
            crc.update(&block[at..a]);
        }
        at = at.max(z);
    }
    if at < len {
        crc.update(&block[at..]);
    }
    crc.value()
}

/// Reads the LSN stamped into a block at `offset`, if the stamp carries this filesystem's UUID
/// and the block's CRC matches. A torn write (some sectors new, some old) fails the CRC, so a
/// stamp that made it to disk never hides a block whose other sectors did not.
pub fn read_lsn_stamp(block: &[u8], offset: u16, uuid: &[u8; 16]) -> Option<Lsn> {
    check_lsn_stamp(block, offset, uuid).ok()
}

/// `read_lsn_stamp`, saying what is wrong with a stamp it does not accept (the read
/// verifiers log and return it).
pub fn check_lsn_stamp(block: &[u8], offset: u16, uuid: &[u8; 16]) -> Result<Lsn, String> {
    let o = usize::from(offset);
    let s = block
        .get(o..o + LSN_STAMP_BYTES)
        .ok_or_else(|| format!("no room for an LSN stamp at byte {o}"))?;
    if s[8..24] != uuid[..] {
        if s.iter().all(|&b| b == 0) {
            return Err(format!("no LSN stamp (28 zero bytes at byte {o})"));
        }
        return Err(format!(
            "LSN stamp of another filesystem (UUID {})",
            s[8..24]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ));
    }
    let stored = u32::from_le_bytes(s[24..28].try_into().unwrap_or_default());
    let crc = block_crc(block, o + 24);
    if crc != stored {
        return Err(format!(
            "CRC32C {crc:#010x} of the block does not match its stamp's {stored:#010x}"
        ));
    }
    Ok(Lsn::from_raw(u64::from_le_bytes(
        s[..8].try_into().unwrap_or_default(),
    )))
}

/// Breaks the CRC of a sealed stamp, so the block fails every read check.
pub(super) fn poison_stamp(block: &mut [u8], offset: u16) {
    let at = usize::from(offset) + 24;
    if let Some(crc) = block.get_mut(at..at + 4) {
        for b in crc {
            *b = !*b;
        }
    }
}

/// Stamps the LSN and UUID at `offset` and seals the block with its CRC.
pub fn write_lsn_stamp(block: &mut [u8], offset: u16, lsn: Lsn, uuid: &[u8; 16]) {
    let o = usize::from(offset);
    block[o..o + 8].copy_from_slice(&lsn.raw().to_le_bytes());
    block[o + 8..o + 24].copy_from_slice(uuid);
    let crc = block_crc(block, o + 24);
    block[o + 24..o + 28].copy_from_slice(&crc.to_le_bytes());
}
