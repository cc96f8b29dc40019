//! How the log writes: its flush policy, and the iclog ring's size (`LogConfig`), checked
//! against the log it is for.

use crate::log::record::{OP_HEADER_BYTES, SECTOR, SECTOR_PAYLOAD};
use thiserror::Error;

/// Which cache flushes the log issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// One data-device flush before a checkpoint, PREFLUSH+FUA only on its commit iclog (FUA
    /// alone when the checkpoint fits in one iclog). Linux 5.14 and later.
    #[default]
    Reduced,
    /// PREFLUSH+FUA on every iclog (and a data-device flush before each when the log is
    /// external), as XFS did before Linux 5.14.
    Legacy,
    /// The tail's flush off the commit path: the AIL lets the tail pass what it wrote back
    /// only once a data-device flush covered it (its own, or the commit path's since), so a
    /// checkpoint flushes only to order its body and the file data before its commit record:
    /// PREFLUSH+FUA on the commit iclog (on an external log, a data flush first), the PREFLUSH
    /// elided where nothing is volatile.
    AilFlush,
}

impl FlushPolicy {
    /// Every policy, for tests and explorers that run each.
    pub const ALL: [FlushPolicy; 3] = [Self::Reduced, Self::Legacy, Self::AilFlush];
}

impl std::str::FromStr for FlushPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reduced" => Ok(Self::Reduced),
            "legacy" => Ok(Self::Legacy),
            "ail" => Ok(Self::AilFlush),
            _ => Err(format!(
                "flush policy '{s}': expected reduced, legacy or ail"
            )),
        }
    }
}

impl std::fmt::Display for FlushPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Reduced => "reduced",
            Self::Legacy => "legacy",
            Self::AilFlush => "ail",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    pub logbufs: u32,
    pub logbsize: u32,
    pub policy: FlushPolicy,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            logbufs: 8,
            logbsize: 256 * 1024,
            policy: FlushPolicy::Reduced,
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    #[error("logbufs {0} is not in 2..8")]
    Logbufs(u32),
    #[error("logbsize {0} is not a power of two in 16k..256k")]
    Logbsize(u32),
    #[error("the log ({log_bytes} bytes) is too small for {logbufs} iclogs of {logbsize} bytes: it needs at least 4 rings")]
    LogTooSmall {
        log_bytes: u64,
        logbufs: u32,
        logbsize: u32,
    },
}

impl LogConfig {
    pub fn validate(&self, log_bytes: u64) -> Result<(), ConfigError> {
        if !(2..=8).contains(&self.logbufs) {
            return Err(ConfigError::Logbufs(self.logbufs));
        }
        if !self.logbsize.is_power_of_two() || !(16 * 1024..=256 * 1024).contains(&self.logbsize) {
            return Err(ConfigError::Logbsize(self.logbsize));
        }
        if log_bytes < 4 * u64::from(self.logbufs) * u64::from(self.logbsize) {
            return Err(ConfigError::LogTooSmall {
                log_bytes,
                logbufs: self.logbufs,
                logbsize: self.logbsize,
            });
        }
        Ok(())
    }

    /// This configuration, shrunk (logbsize first, then logbufs) until the log holds four rings
    /// of iclogs: what the defaults become on a small log.
    pub fn fitted_to(mut self, log_bytes: u64) -> Self {
        while self.validate(log_bytes).is_err() {
            if self.logbsize > 16 * 1024 {
                self.logbsize /= 2;
            } else if self.logbufs > 2 {
                self.logbufs -= 1;
            } else {
                break;
            }
        }
        self
    }

    /// Stream bytes one iclog carries.
    pub fn iclog_payload(&self) -> usize {
        (self.logbsize as usize / SECTOR - 1) * SECTOR_PAYLOAD
    }

    /// An upper bound on the log sectors a checkpoint whose op stream is `stream` bytes occupies.
    pub fn sectors_bound(&self, stream: u64) -> u64 {
        let p = self.iclog_payload() as u64;
        // Each record may hold a continuation op header and leave up to one op header unused.
        let records = stream / (p - 2 * OP_HEADER_BYTES as u64) + 1;
        let payload = stream + records * 2 * OP_HEADER_BYTES as u64;
        records * 2 + payload / SECTOR_PAYLOAD as u64 + 1
    }
}
