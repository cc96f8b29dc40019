//! Making a filesystem: choosing a layout ([`layout`]), checking the target files ([`target`]),
//! and writing the superblock and the zeroed log onto devices ([`write_filesystem`]).

pub mod layout;
pub mod target;

pub use layout::{default_log_bytes, min_log_bytes, Layout, LayoutError};
pub use target::{plan, MkfsError, MkfsPlan, MkfsReport, MkfsRequest};

use crate::format::superblock::{SbLog, FRONT_BACKUP_BYTES};
use crate::format::{LogDeviceHeader, Superblock};
use cilfs_device::{AlignedBuf, Device, DeviceError, WriteFlags};

/// Writes a new filesystem onto `data` (and `logdev` for an external log).
///
/// Order: the old superblock (and log header) are zeroed first with FUA, so that a crash part way
/// leaves no valid superblock pointing at a half-written log; then the whole log region is written
/// once (later log writes are overwrites, docs/journal.md section 2); last the superblock, PREFLUSH+FUA,
/// so it becomes valid only once everything before it is stable.
pub fn write_filesystem(
    data: &dyn Device,
    logdev: Option<&dyn Device>,
    layout: &Layout,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), DeviceError> {
    let bs = u64::from(layout.block_size);
    let block = AlignedBuf::zeroed(layout.block_size as usize);
    zero_old_backups(data)?;
    data.write(0, &block, WriteFlags::FUA)?;
    let (log_dev, log_offset): (&dyn Device, u64) = match (&layout.log, logdev) {
        (SbLog::Internal { start }, _) => (data, start * bs),
        (SbLog::External { .. }, Some(dev)) => {
            dev.write(0, &block, WriteFlags::FUA)?;
            (dev, bs)
        }
        (SbLog::External { .. }, None) => {
            panic!("external log layout written without a log device")
        }
    };
    let log_bytes = layout.log_blocks * bs;
    cilfs_device::write_zeros(log_dev, log_offset, log_bytes, &mut |done| {
        progress(done, log_bytes)
    })?;
    if let (SbLog::External { log_uuid }, Some(dev)) = (&layout.log, logdev) {
        let header = LogDeviceHeader {
            log_uuid: *log_uuid,
            fs_uuid: layout.uuid,
            block_size: layout.block_size,
            log_blocks: layout.log_blocks,
        };
        let mut buf = AlignedBuf::zeroed(layout.block_size as usize);
        buf[..512].copy_from_slice(&header.encode());
        dev.write(0, &buf, WriteFlags::PREFLUSH | WriteFlags::FUA)?;
    }
    crate::format::geometry::write_superblock(
        data,
        &layout.superblock(),
        WriteFlags::PREFLUSH | WriteFlags::FUA,
    )?;
    Ok(())
}

/// Zeroes every place an earlier filesystem may have left a backup superblock, FUA, before
/// the old primary goes: a copy left behind would be found by the search when the new primary
/// is lost, and would name a filesystem that is no longer there. Those places are its own
/// backups (wherever its superblock says), byte 1 MiB, and the device's last 64 KiB (its last
/// block, whatever the block size).
fn zero_old_backups(data: &dyn Device) -> Result<(), DeviceError> {
    let mut at: Vec<(u64, u64)> = Vec::new();
    let mut s = AlignedBuf::zeroed(512);
    let old = [0, FRONT_BACKUP_BYTES].into_iter().find_map(|off| {
        data.read(off, &mut s).ok()?;
        Superblock::decode_copy(&s).ok().map(|(sb, _)| sb)
    });
    if let Some(sb) = old {
        let bs = u64::from(sb.block_size);
        at.extend(sb.backup_blocks().iter().map(|b| (b * bs, bs)));
    }
    const TAIL_BYTES: u64 = 64 << 10;
    at.push((FRONT_BACKUP_BYTES, TAIL_BYTES));
    let end = data.len() / 512 * 512;
    at.push((end.saturating_sub(TAIL_BYTES), end.min(TAIL_BYTES)));
    let zeros = AlignedBuf::zeroed(TAIL_BYTES as usize);
    for (off, len) in at {
        let len = len.min(data.len().saturating_sub(off)) / 512 * 512;
        if len > 0 {
            data.write(off, &zeros[..len as usize], WriteFlags::FUA)?;
        }
    }
    Ok(())
}

impl Layout {
    /// The superblock of a freshly made filesystem.
    pub fn superblock(&self) -> Superblock {
        Superblock {
            uuid: self.uuid,
            block_size: self.block_size,
            data_blocks: self.data_blocks,
            log: self.log,
            log_blocks: self.log_blocks,
            clean: true,
            unclean_epoch: 0,
            log_generation: 0,
            needs_check: false,
            backups: self.backups,
            label: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::format::geometry::{Geometry, LogLocation};
    use cilfs_device::{CrashOptions, SimDevice};

    #[test]
    fn made_filesystem_reads_back_and_survives_any_crash_after() {
        let layout = Layout::new(64 << 20, 4096, None, None).unwrap();
        let dev = SimDevice::new(64 << 20, 1);
        write_filesystem(&dev, None, &layout, &mut |_, _| {}).unwrap();
        for seed in 0..20 {
            let crashed = dev.crash(CrashOptions { torn_writes: true });
            let g = Geometry::read(&crashed, None).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(g.log, LogLocation::Internal);
            assert_eq!(g.log_offset, 257 * 4096, "past the front backup at 1 MiB");
            assert_eq!(g.sb.backup_blocks(), vec![256, (64 << 20) / 4096 - 1]);
            assert_eq!(g.sb, layout.superblock());
        }
    }

    #[test]
    fn crash_midway_never_leaves_a_valid_old_superblock() {
        // An old filesystem with a different uuid sits on the device.
        let old = Layout::new(32 << 20, 4096, None, None).unwrap();
        let base = SimDevice::new(32 << 20, 0);
        write_filesystem(&base, None, &old, &mut |_, _| {}).unwrap();
        let rec = cilfs_device::RecordingDevice::new(
            SimDevice::from_image(base.stable_image(), 32 << 20, 0),
            base.stable_image(),
        );
        let new = Layout::new(32 << 20, 4096, None, None).unwrap();
        write_filesystem(&rec, None, &new, &mut |_, _| {}).unwrap();
        let n = rec.op_count();
        // The last three writes are the new copies: the front backup, the end one, the primary.
        let first_copy = n - 2;
        for point in 1..n {
            let img = rec.crash_image(point, &mut |_, _| cilfs_device::Survival::Kept);
            let dev = SimDevice::from_image(img, 32 << 20, 0);
            let Ok(g) = Geometry::read(&dev, None) else {
                continue;
            };
            if g.sb.uuid == new.uuid {
                assert!(
                    point >= first_copy,
                    "crash at op {point}: new superblock before log zeroed"
                );
                continue;
            }
            // The old filesystem may be found only while its primary is whole, which mkfs
            // zeroes after the old backups and before it touches the log: it is then intact.
            assert_eq!(g.sb.uuid, old.uuid);
            assert_eq!(
                g.from_backup, None,
                "crash at op {point}: an old backup found after the old primary was zeroed"
            );
            let mut s = AlignedBuf::zeroed(512);
            dev.read(0, &mut s).unwrap();
            assert_eq!(Superblock::decode(&s).unwrap().uuid, old.uuid);
        }
        let dev = SimDevice::from_image(rec.image_at(n), 32 << 20, 0);
        assert_eq!(Geometry::read(&dev, None).unwrap().sb.uuid, new.uuid);
    }

    #[test]
    fn external_log_checks_pairing() {
        let layout = Layout::new(32 << 20, 4096, Some(4 << 20), Some(4 << 20)).unwrap();
        let data = SimDevice::new(32 << 20, 1);
        let log = SimDevice::new((4 << 20) + 4096, 1);
        write_filesystem(&data, Some(&log), &layout, &mut |_, _| {}).unwrap();
        let g = Geometry::read(&data, Some(&log)).unwrap();
        assert_eq!((g.log_offset, g.log_bytes), (4096, 4 << 20));
        assert!(Geometry::read(&data, None).is_err());
        // A log device of another filesystem is refused.
        let other = Layout::new(32 << 20, 4096, Some(4 << 20), Some(4 << 20)).unwrap();
        let data2 = SimDevice::new(32 << 20, 1);
        let log2 = SimDevice::new((4 << 20) + 4096, 1);
        write_filesystem(&data2, Some(&log2), &other, &mut |_, _| {}).unwrap();
        let err = Geometry::read(&data, Some(&log2)).unwrap_err();
        assert!(err.to_string().contains("another filesystem"), "{err}");
    }
}
