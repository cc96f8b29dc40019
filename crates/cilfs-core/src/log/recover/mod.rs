//! Reading the log back: head and tail discovery by cycle stamps, a walk over the valid records
//! from the tail, checkpoint assembly (`scan`), and replay of committed checkpoints onto the
//! data device (`replay`).
//!
//! The walk trusts a record only if its sector stamps carry the cycle of their position, its
//! header names its own LSN, its CRC matches, and its mount generation and tail do not go back.
//! The first record that fails ends the log: a torn or lost write (holes can only follow the last
//! stable commit record, because every commit iclog is PREFLUSH+FUA) or the old end of the log.
//! Unless valid records chain on past it up to a commit or unmount record: those were written
//! after everything before them was stable, so the failed record was stable too and is damage,
//! not a crash's torn write (`LogEnd::Damaged`, which refuses a mount).
//! Records of an older mount generation beyond the head can never be chained on later, because
//! every mount raises the generation in the superblock before it writes the log.

mod replay;
mod scan;

pub use replay::{replay, DamagedBlock, ReplayStats, ReplayTarget};
pub use scan::{scan_log, Checkpoint, LogEnd, LogScan, OpSummary, RecordInfo};

use super::lsn::{LogSpace, Lsn, LOG_SECTOR};
use super::record::{stamp_of, SECTOR};
use cilfs_device::{Device, DeviceError};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RecoveryError {
    #[error("reading the log at byte {offset}: {source}")]
    Device { offset: u64, source: DeviceError },
    #[error("corrupt log record at lsn {lsn} (log byte {offset}): {reason}")]
    Corrupt {
        lsn: Lsn,
        offset: u64,
        reason: String,
    },
    #[error("replaying onto the data device: {0}")]
    Replay(DeviceError),
}

/// Reads sectors of the log region of a device.
#[derive(Debug, Clone, Copy)]
pub struct LogRegion<'a> {
    pub dev: &'a dyn Device,
    pub offset: u64,
    pub space: LogSpace,
}

impl LogRegion<'_> {
    fn read(&self, block: u32, buf: &mut [u8]) -> Result<(), RecoveryError> {
        let offset = self.offset + u64::from(block) * LOG_SECTOR;
        self.dev
            .read(offset, buf)
            .map_err(|source| RecoveryError::Device { offset, source })
    }

    fn stamp(&self, block: u32) -> Result<u32, RecoveryError> {
        let mut s = [0u8; SECTOR];
        self.read(block, &mut s)?;
        Ok(stamp_of(&s))
    }

    /// Reads `n` sectors starting at `lsn`, wrapping at the end of the log.
    fn read_wrapping(&self, lsn: Lsn, n: usize) -> Result<Vec<u8>, RecoveryError> {
        let mut buf = vec![0u8; n * SECTOR];
        let to_end = (self.space.sectors - lsn.block()) as usize;
        if n <= to_end {
            self.read(lsn.block(), &mut buf)?;
        } else {
            let (a, b) = buf.split_at_mut(to_end * SECTOR);
            self.read(lsn.block(), a)?;
            self.read(0, b)?;
        }
        Ok(buf)
    }

    fn byte_offset(&self, lsn: Lsn) -> u64 {
        self.space.offset(lsn)
    }
}

#[cfg(test)]
mod corruption_tests;

#[cfg(test)]
mod replay_damage_tests;
