//! The CIL's two limits and the rules they make (docs/journal.md section 3): a context of S bytes
//! (`space_limit`) is due for a push, and one past 2S (`hard_limit`) blocks committers until
//! the push has switched contexts. The journal asks these when it commits and when it pushes.

use super::{late_bound, Cil};
use crate::buf::{Buf, BufData};
use crate::log::record::OP_HEADER_BYTES;
use crate::log::LogConfig;
use std::sync::Arc;

/// When the CIL is pushed in the background (`space_limit`, S) and when committers block
/// (`hard_limit`, 2S): docs/journal.md section 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CilLimits {
    pub space_limit: u64,
    pub hard_limit: u64,
}

impl CilLimits {
    /// S = min(log / 8, 16 x logbufs x logbsize), or `requested`; never more than a quarter of
    /// the log, so a checkpoint of 2S (where committers block; commits in flight may add a
    /// little more, as in XFS) stays near half of it. What keeps the log from overrunning is
    /// the charges, not this bound.
    pub fn new(log_bytes: u64, cfg: &LogConfig, requested: Option<u64>) -> Self {
        let default = (log_bytes / 8).min(16 * u64::from(cfg.logbufs) * u64::from(cfg.logbsize));
        let s = requested.unwrap_or(default).clamp(4096, log_bytes / 4);
        Self {
            space_limit: s,
            hard_limit: 2 * s,
        }
    }

    /// Whether a context of `bytes` is due for a push (S): the commit that brings it there
    /// pushes it (inline) or asks the push worker to (background), and a push with a
    /// checkpoint in flight writes it next instead of waiting for that one's commit.
    pub fn push_due(&self, bytes: u64) -> bool {
        bytes >= self.space_limit
    }

    /// Whether a context of `bytes` is past the hard limit (2S): the commit that took it there
    /// marks it (`ShardGuard::set_over_hard_limit`), and committers then wait for the push to
    /// switch contexts before they lock anything (`Cil::over_hard_limit`).
    pub fn past_hard(&self, bytes: u64) -> bool {
        bytes > self.hard_limit
    }

    /// Whether a committer adding `adding` bytes (`commit_bytes`) to the open context of `cil`
    /// waits for the push to switch contexts first: adding them would take a context that
    /// holds something past the hard limit. A transaction larger than 2S goes into an empty
    /// one.
    pub fn commit_waits(&self, cil: &Cil, adding: u64) -> bool {
        !cil.is_empty() && cil.stream_bytes() + adding > self.hard_limit
    }
}

/// The op-stream bytes a commit adds to a context, at most: an op for each of the logged
/// buffers `bufs`, and a late-written block (`late`) counted whole (`late_bound`).
pub fn commit_bytes(bufs: &[(&Arc<Buf>, &BufData)], late: bool, block_size: usize) -> u64 {
    bufs.iter()
        .map(|(_, g)| (OP_HEADER_BYTES + Buf::formatted_len(g)) as u64)
        .sum::<u64>()
        + if late { late_bound(block_size) } else { 0 }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A context is due for a push at S exactly, and past the hard limit only beyond 2S.
    #[test]
    fn due_at_s_and_past_hard_only_beyond_2s() {
        let l = CilLimits::new(1 << 30, &LogConfig::default(), Some(1 << 20));
        assert_eq!((l.space_limit, l.hard_limit), (1 << 20, 2 << 20));
        assert!(!l.push_due((1 << 20) - 1));
        assert!(l.push_due(1 << 20));
        assert!(!l.past_hard(2 << 20));
        assert!(l.past_hard((2 << 20) + 1));
    }

    /// S stays between 4 KiB and a quarter of the log, whatever is asked for.
    #[test]
    fn s_is_clamped_to_a_quarter_of_the_log() {
        let cfg = LogConfig::default();
        assert_eq!(
            CilLimits::new(1 << 20, &cfg, Some(1 << 30)).space_limit,
            1 << 18
        );
        assert_eq!(CilLimits::new(1 << 20, &cfg, Some(1)).space_limit, 4096);
    }
}
