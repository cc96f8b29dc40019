//! Late writes of the header block: its bytes and counter changes handed to the transaction
//! at commit (`LateWrite`), so concurrent commits sum their counters instead of ordering them.

use crate::buf::{CounterChange, LateWrite};
use crate::fs::error::FsResult;
use crate::fs::items::header::{Header, HEADER_ENCODED_BYTES, HEADER_LSN_OFFSET};
use crate::journal::Transaction;

/// Hands `h`, encoded, to `tx` as the late write of the header block `hdr_blk`
/// (`LateWrite`): the whole block when `whole` (mkfs, `force_header_write`), else the bytes an
/// encoding sets. Its counters go as their changes from `before`, the header it started from
/// (the push sums a context's changes); only the whole block, written by mkfs, sets them.
pub(super) fn write_header_late(
    tx: &mut Transaction<'_>,
    hdr_blk: u64,
    whole: bool,
    h: &Header,
    before: &Header,
) -> FsResult<()> {
    let len = if whole {
        tx.journal.block_size() as usize
    } else {
        HEADER_ENCODED_BYTES
    };
    let mut bytes = vec![0u8; len];
    if whole {
        // mkfs's counters start from `before`'s, and move by its own changes.
        Header {
            next_ino: before.next_ino,
            free_blocks: before.free_blocks,
            inode_count: before.inode_count,
            ..h.clone()
        }
        .encode_into(&mut bytes);
    } else {
        h.encode_into(&mut bytes);
    }
    tx.write_late(
        hdr_blk,
        LateWrite {
            offset: 0,
            bytes,
            lsn_offset: HEADER_LSN_OFFSET,
            // Every counter, moved or not: the bytes cover them all (`counter_changes`).
            counters: h.counter_changes(before).to_vec(),
            counters_set: whole,
        },
    )?;
    Ok(())
}

/// A late write of the header that only moves its counters.
pub(super) fn counters_late(changes: Vec<(usize, CounterChange)>) -> LateWrite {
    LateWrite {
        offset: 0,
        bytes: Vec::new(),
        lsn_offset: HEADER_LSN_OFFSET,
        counters: changes,
        counters_set: false,
    }
}
