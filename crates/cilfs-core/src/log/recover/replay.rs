//! Replay: the items of committed checkpoints written onto the data device in order, each
//! block only if its stamp shows it older than the checkpoint, and checked against the content
//! CRC its last item recorded.

use super::{Checkpoint, RecoveryError};
use crate::log::stamp::{content_crc, poison_stamp, read_lsn_stamp, write_lsn_stamp};
use cilfs_device::{Device, WriteFlags};
use std::collections::HashMap;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayStats {
    pub checkpoints: u64,
    pub items_replayed: u64,
    pub items_cancelled: u64,
    pub items_newer_on_disk: u64,
    pub blocks_written: u64,
    /// Blocks that replay rebuilt into something other than what their last logged item
    /// recorded (`BUF_CONTENT_CRC`): damaged on disk outside the ranges the log holds. Written
    /// with a stamp whose CRC fails, so every read and check sees the damage.
    pub damaged: Vec<DamagedBlock>,
}

/// A block replay found damaged (`ReplayStats::damaged`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedBlock {
    pub blkno: u64,
    /// The checkpoint whose item the rebuilt block did not match.
    pub checkpoint: u64,
    /// CRC32C (`content_crc`) the item recorded and the rebuilt block's.
    pub logged_crc: u32,
    pub rebuilt_crc: u32,
}

impl std::fmt::Display for DamagedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "metadata block {}: damaged on disk outside the ranges the log holds for it (the \
             block rebuilt from checkpoint {} has CRC32C {:#010x}, the log recorded {:#010x})",
            self.blkno, self.checkpoint, self.rebuilt_crc, self.logged_crc
        )
    }
}

/// Where replay may write: blocks `[first, end)` of the data device.
#[derive(Debug, Clone, Copy)]
pub struct ReplayTarget<'a> {
    pub dev: &'a dyn Device,
    pub block_size: u32,
    pub first_block: u64,
    pub end_block: u64,
    pub uuid: [u8; 16],
}

/// Replays committed checkpoints in order and makes the result stable. Every item is checked
/// before anything is written, so a log that cannot be replayed leaves the device untouched.
pub fn replay(
    checkpoints: &[Checkpoint],
    t: &ReplayTarget<'_>,
) -> Result<ReplayStats, RecoveryError> {
    let mut stats = ReplayStats::default();
    let mut cancelled_at: HashMap<u64, usize> = HashMap::new();
    for (k, ck) in checkpoints.iter().enumerate() {
        for img in &ck.items {
            if img.blkno < t.first_block || img.blkno >= t.end_block {
                return Err(RecoveryError::Corrupt {
                    lsn: ck.start,
                    offset: 0,
                    reason: format!(
                        "checkpoint {} logs block {} outside the metadata area {}..{}",
                        ck.seq, img.blkno, t.first_block, t.end_block
                    ),
                });
            }
            if img.cancel {
                cancelled_at.insert(img.blkno, k);
            }
        }
    }
    let bs = t.block_size as usize;
    // Per block, the last applied item's recorded content CRC when the block did not match it.
    let mut mismatch: HashMap<u64, Option<(DamagedBlock, Option<u16>)>> = HashMap::new();
    let mut blocks: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut order: Vec<u64> = Vec::new();
    for (k, ck) in checkpoints.iter().enumerate() {
        stats.checkpoints += 1;
        for img in &ck.items {
            if img.cancel || cancelled_at.get(&img.blkno).is_some_and(|&c| c >= k) {
                stats.items_cancelled += 1;
                continue;
            }
            let block = match blocks.entry(img.blkno) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let mut b = vec![0u8; bs];
                    t.dev
                        .read(img.blkno * bs as u64, &mut b)
                        .map_err(RecoveryError::Replay)?;
                    order.push(img.blkno);
                    v.insert(b)
                }
            };
            if let Some(off) = img.lsn_offset {
                if read_lsn_stamp(block, off, &t.uuid).is_some_and(|l| l >= ck.start) {
                    stats.items_newer_on_disk += 1;
                    continue;
                }
            }
            for (off, data) in &img.ranges {
                let o = *off as usize;
                block[o..o + data.len()].copy_from_slice(data);
            }
            // Only the last applied item of a block must match: a torn write back leaves
            // sectors of a later image, which the later items' ranges cover.
            let rebuilt_crc = content_crc(block, img.lsn_offset, img.unlogged);
            mismatch.insert(
                img.blkno,
                img.content_crc
                    .filter(|&c| c != rebuilt_crc)
                    .map(|logged_crc| {
                        let d = DamagedBlock {
                            blkno: img.blkno,
                            checkpoint: ck.seq,
                            logged_crc,
                            rebuilt_crc,
                        };
                        (d, img.lsn_offset)
                    }),
            );
            if let Some(off) = img.lsn_offset {
                write_lsn_stamp(block, off, ck.start, &t.uuid);
            }
            stats.items_replayed += 1;
        }
    }
    order.sort_unstable();
    for blkno in order {
        if let Some((d, stamp)) = mismatch.remove(&blkno).flatten() {
            if let (Some(b), Some(off)) = (blocks.get_mut(&blkno), stamp) {
                poison_stamp(b, off);
            }
            stats.damaged.push(d);
        }
        if let Some(b) = blocks.get(&blkno) {
            t.dev
                .write(blkno * bs as u64, b, WriteFlags::NONE)
                .map_err(RecoveryError::Replay)?;
            stats.blocks_written += 1;
        }
    }
    if stats.blocks_written > 0 {
        t.dev.flush().map_err(RecoveryError::Replay)?;
    }
    Ok(stats)
}
