//! Choosing sizes: defaults and limits of a new filesystem's layout.

use crate::format::superblock::{front_backup_block, is_valid_block_size, SbLog};
use thiserror::Error;

pub const DEFAULT_FS_BYTES: u64 = 1 << 30;
pub const MIN_FS_BYTES: u64 = 16 << 20;
/// The smallest log mkfs accepts: room for a few full iclog rings at the largest logbsize
/// (more on large blocks: `crate::fs::min_log_bytes`).
pub const MIN_LOG_BYTES: u64 = 1 << 20;
const DEFAULT_LOG_MIN_BYTES: u64 = 64 << 20;
const DEFAULT_LOG_MAX_BYTES: u64 = 2 << 30;

/// The default log size for a filesystem of `fs_bytes`: like XFS, a 2048th of the device, at
/// least 64 MiB and at most 2 GiB; on small devices at most a quarter of the device.
pub fn default_log_bytes(fs_bytes: u64, block_size: u32) -> u64 {
    let log = (fs_bytes / 2048)
        .clamp(DEFAULT_LOG_MIN_BYTES, DEFAULT_LOG_MAX_BYTES)
        .min(fs_bytes / 4)
        .max(min_log_bytes(block_size));
    log / u64::from(block_size) * u64::from(block_size)
}

/// The smallest log for `block_size`-byte blocks: `MIN_LOG_BYTES`, or what the largest
/// transaction needs where that is more (`crate::fs::min_log_bytes`), in whole blocks.
pub fn min_log_bytes(block_size: u32) -> u64 {
    MIN_LOG_BYTES
        .max(crate::fs::min_log_bytes(block_size))
        .next_multiple_of(u64::from(block_size))
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LayoutError {
    #[error("block size {0} is not a power of two in 512..65536")]
    BadBlockSize(u64),
    #[error("size {size} is too small: the minimum is {min}")]
    SizeTooSmall { size: String, min: String },
    #[error("log size {log} is too small: the minimum is {min}")]
    LogTooSmall { log: String, min: String },
    #[error("log size {log} is larger than half the device ({half})")]
    LogTooLarge { log: String, half: String },
    #[error("log device too small: {available} available after its header, log needs {needed}")]
    LogDeviceTooSmall { available: String, needed: String },
}

pub(crate) fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024 && v % 1024 == 0 && u < units.len() - 1 {
        v /= 1024;
        u += 1;
    }
    if u == 0 && bytes >= 1024 {
        return format!("{bytes} bytes");
    }
    format!("{v} {}", units[u])
}

/// A validated layout, ready to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub uuid: [u8; 16],
    pub block_size: u32,
    pub data_blocks: u64,
    pub log: SbLog,
    pub log_blocks: u64,
    /// Backup superblocks at byte 1 MiB and in the last block (always, for a new filesystem;
    /// off only to make images as binaries before backups did).
    pub backups: bool,
}

impl Layout {
    /// `log_bytes` None picks the default. `logdev_bytes` is the usable space after the log
    /// device's header block (Some only for an external log); an external log defaults to all of it.
    pub fn new(
        fs_bytes: u64,
        block_size: u64,
        log_bytes: Option<u64>,
        logdev_bytes: Option<u64>,
    ) -> Result<Self, LayoutError> {
        let bs32 = u32::try_from(block_size)
            .ok()
            .filter(|&b| is_valid_block_size(b))
            .ok_or(LayoutError::BadBlockSize(block_size))?;
        let bs = block_size;
        let fs_bytes = fs_bytes / bs * bs;
        if fs_bytes < MIN_FS_BYTES {
            return Err(LayoutError::SizeTooSmall {
                size: human(fs_bytes),
                min: human(MIN_FS_BYTES),
            });
        }
        let log = match (log_bytes, logdev_bytes) {
            (Some(l), _) => l / bs * bs,
            (None, Some(avail)) => avail / bs * bs,
            (None, None) => default_log_bytes(fs_bytes, bs32),
        };
        let min_log = min_log_bytes(bs32);
        if log < min_log {
            if let (None, Some(avail)) = (log_bytes, logdev_bytes) {
                return Err(LayoutError::LogDeviceTooSmall {
                    available: human(avail),
                    needed: human(min_log),
                });
            }
            return Err(LayoutError::LogTooSmall {
                log: human(log),
                min: human(min_log),
            });
        }
        let log_location = match logdev_bytes {
            Some(avail) => {
                if log > avail {
                    return Err(LayoutError::LogDeviceTooSmall {
                        available: human(avail),
                        needed: human(log),
                    });
                }
                SbLog::External {
                    log_uuid: *uuid::Uuid::new_v4().as_bytes(),
                }
            }
            None => {
                if log > fs_bytes / 2 {
                    if log_bytes.is_none() {
                        // Only the smallest log large blocks need makes the default this large.
                        return Err(LayoutError::SizeTooSmall {
                            size: human(fs_bytes),
                            min: human(2 * log),
                        });
                    }
                    return Err(LayoutError::LogTooLarge {
                        log: human(log),
                        half: human(fs_bytes / 2),
                    });
                }
                // Past the front backup; the blocks between it and the superblock stay unused.
                SbLog::Internal {
                    start: front_backup_block(bs32) + 1,
                }
            }
        };
        Ok(Self {
            uuid: *uuid::Uuid::new_v4().as_bytes(),
            block_size: bs32,
            data_blocks: fs_bytes / bs,
            log: log_location,
            log_blocks: log / bs,
            backups: true,
        })
    }

    pub fn fs_bytes(&self) -> u64 {
        self.data_blocks * u64::from(self.block_size)
    }

    pub fn log_bytes(&self) -> u64 {
        self.log_blocks * u64::from(self.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_log_sizes() {
        assert_eq!(default_log_bytes(1 << 30, 4096), 64 << 20);
        assert_eq!(default_log_bytes(16 << 20, 4096), 4 << 20);
        assert_eq!(default_log_bytes(1 << 40, 4096), 512 << 20);
        assert_eq!(default_log_bytes(8 << 40, 4096), 2 << 30);
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(1500), "1500 bytes");
    }
}
