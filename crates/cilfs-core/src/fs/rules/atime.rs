//! Access times: when a read or a readdir moves atime (`FsOptions::atime`: Linux's noatime,
//! relatime, strictatime) and how the new atime is kept. The kernel never sets atime on a FUSE
//! mount itself (its FUSE inodes are S_NOATIME); after a read it only marks its cached atime
//! stale, so the next stat asks us.

use crate::fs::items::inode::{Inode, Timespec, INODE_NOATIME};
use crate::fs::stats::bump;
use crate::fs::{log_inode, AtimeMode, Fs};

/// relatime's bound: an atime older than this moves on the next read whatever mtime says.
const RELATIME_MAX_AGE_SECS: i64 = 24 * 60 * 60;

impl Fs {
    /// Whether a read at `now` moves `i`'s atime (Linux's `atime_needs_update` with
    /// `relatime_need_update`).
    pub(crate) fn atime_needs_update(&self, i: &Inode, now: Timespec) -> bool {
        if self.is_read_only() || i.atime == now || i.flags & INODE_NOATIME != 0 {
            return false;
        }
        match self.opts.atime {
            AtimeMode::Never => false,
            AtimeMode::Strict => true,
            AtimeMode::Relative => {
                i.atime <= i.mtime
                    || i.atime <= i.ctime
                    || now.sec.saturating_sub(i.atime.sec) >= RELATIME_MAX_AGE_SECS
            }
        }
    }

    /// Moves `ino`'s atime to now after a read. Not a change: ctime and the change counter stay
    /// as they are. Logged in a transaction of its own, never forced (durable with the next
    /// checkpoint, as any change), or with lazytime kept in memory like a size grown by a
    /// write, until the inode is logged anyway, fsync, write back or unmount. A failure is not
    /// the reader's: the data was read (Linux's touch_atime reports none either).
    pub(crate) fn touch_atime(&self, ino: u64) {
        let now = self.now();
        // Through `retrying`: the inode's item, if it left the buffer cache since the read,
        // is read with no lock held, and a wait for log space happens outside the lock too.
        let _ = self.retrying(|| {
            let mut st = self.write_state();
            let m = self.load(&mut st, ino)?;
            // Another reader may have moved it since the shared-lock look.
            if !self.atime_needs_update(&m.inode, now) {
                return Ok(());
            }
            if self.opts.lazytime {
                bump(&self.stats.atime_updates);
                m.inode.atime = now;
                m.unlogged = true;
                crate::fs::txn::retry::changed_memory();
                return Ok(());
            }
            self.with_tx_sync(&mut st, false, |t, inodes| {
                let m = Fs::inode_mut(t, inodes, ino)?;
                m.inode.atime = now;
                log_inode(t, m, &self.stats)?;
                Ok(((), vec![ino]))
            })?;
            bump(&self.stats.atime_updates);
            Ok(())
        });
    }
}
