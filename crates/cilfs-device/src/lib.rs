//! The device layer of cilfs.
//!
//! One trait, [`Device`], with the block layer's write semantics (PREFLUSH and FUA flags, explicit
//! flush), and its implementations:
//! - [`FileDevice`]: an image file or a block device, flags turned into fdatasync/RWF_DSYNC;
//! - [`SimDevice`]: in memory, with a volatile write cache and seeded crashes;
//! - [`RecordingDevice`]: records every IO so that a crash image can be built at any point;
//! - [`Throttle`]: per-tenant token buckets on top of any device;
//! - [`Gate`]: holds the writes of devices in memory until released (a mount writes nothing
//!   before the FUSE mount exists).
//!
//! All IO must be aligned to [`SECTOR_SIZE`]: that is the unit a crash may tear.

mod aligned;
mod cache_model;
mod counters;
mod error;
mod file;
mod flags;
mod gate;
mod image;
pub mod loopdev;
mod overlay;
mod queue;
mod recorder;
pub mod rng;
mod sim;
mod throttle;

use std::sync::Arc;

pub use aligned::AlignedBuf;
pub use cache_model::Survival;
pub use counters::{IoCounters, IoStats, VolatileTracker};
pub use error::{DeviceError, IoKind, Result};
pub use file::{DirectIo, FileDevice, FileDeviceOptions, FuaMode};
pub use flags::WriteFlags;
pub use gate::{Gate, GatedDevice};
pub use image::SparseImage;
pub use overlay::OverlayDevice;
pub use queue::{QueuedBuf, QueuedWrite, WriteQueue};
pub use recorder::{RecordedOp, RecordingDevice};
pub use sim::{CrashOptions, FaultMode, SimDevice};
pub use throttle::{
    Clock, DirStats, IoDir, SystemClock, TenantDevice, TenantId, TenantLimits, TenantStats,
    Throttle,
};

/// The unit of alignment of all device IO, and the unit a torn write tears at.
pub const SECTOR_SIZE: u32 = 512;

/// A block device as the journal sees it.
///
/// A write "completes" when `write` returns. A completed write without FUA sits in a volatile
/// cache until a later flush (or a later write's PREFLUSH) makes it stable; a crash may lose it.
pub trait Device: Send + Sync + std::fmt::Debug {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()>;
    /// Writes `bufs` back to back from `offset` as one IO where the device can (a merged
    /// request, as the block layer makes of adjacent bios); otherwise one write per buffer.
    /// Without flags only: its crash semantics are those of the separate writes.
    fn write_vectored(&self, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        write_one_by_one(self, offset, bufs)
    }
    /// Makes every write that had completed before this call stable.
    fn flush(&self) -> Result<()>;
    /// As [`Device::flush`], and says whether a cache flush was issued: `false` when it was
    /// elided, nothing being volatile. So a caller can count the flushes it cost (the journal
    /// tells its AIL's from its commit path's). Devices that cannot tell say `true`.
    fn flush_reporting(&self) -> Result<bool> {
        self.flush().map(|()| true)
    }
    /// A queue for up to `depth` unflagged writes in flight at once without a thread each
    /// (io_uring on file devices), where the device has one.
    fn write_queue(&self, depth: usize) -> Option<Box<dyn WriteQueue>> {
        let _ = depth;
        None
    }
    /// Size in bytes.
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn stats(&self) -> IoStats;
    /// Whether [`Device::discard`] can give blocks back here.
    fn can_discard(&self) -> bool {
        false
    }
    /// Tells the device that `[offset, offset+len)` holds nothing anyone will read: an image
    /// file punches a hole there, a block device unmaps or zeroes it. Afterwards the range
    /// reads as zeros, or (on a simulated device) as anything. Only for blocks no one uses.
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Err(DeviceError::Unsupported(IoKind::Discard))
    }
}

impl<D: Device + ?Sized> Device for Arc<D> {
    fn can_discard(&self) -> bool {
        (**self).can_discard()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        (**self).discard(offset, len)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()> {
        (**self).write(offset, buf, flags)
    }
    fn write_vectored(&self, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        (**self).write_vectored(offset, bufs)
    }
    fn flush(&self) -> Result<()> {
        (**self).flush()
    }
    fn flush_reporting(&self) -> Result<bool> {
        (**self).flush_reporting()
    }
    fn write_queue(&self, depth: usize) -> Option<Box<dyn WriteQueue>> {
        (**self).write_queue(depth)
    }
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn stats(&self) -> IoStats {
        (**self).stats()
    }
}

impl<D: Device + ?Sized> Device for Box<D> {
    fn can_discard(&self) -> bool {
        (**self).can_discard()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        (**self).discard(offset, len)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()> {
        (**self).write(offset, buf, flags)
    }
    fn write_vectored(&self, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        (**self).write_vectored(offset, bufs)
    }
    fn flush(&self) -> Result<()> {
        (**self).flush()
    }
    fn flush_reporting(&self) -> Result<bool> {
        (**self).flush_reporting()
    }
    fn write_queue(&self, depth: usize) -> Option<Box<dyn WriteQueue>> {
        (**self).write_queue(depth)
    }
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn stats(&self) -> IoStats {
        (**self).stats()
    }
}

/// `bufs` written back to back from `offset`, one unflagged write each: what
/// [`Device::write_vectored`] does where a device cannot merge them.
pub fn write_one_by_one<D: Device + ?Sized>(dev: &D, offset: u64, bufs: &[&[u8]]) -> Result<()> {
    let mut at = offset;
    for b in bufs {
        dev.write(at, b, WriteFlags::NONE)?;
        at += b.len() as u64;
    }
    Ok(())
}

/// Writes `len` bytes of zeros from `offset` in unflagged writes of up to 1 MiB, telling
/// `progress` the bytes written so far after each (mkfs's log, repair's log started again).
pub fn write_zeros<D: Device + ?Sized>(
    dev: &D,
    offset: u64,
    len: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeros = AlignedBuf::zeroed(CHUNK.min(len) as usize);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK);
        dev.write(offset + done, &zeros[..n as usize], WriteFlags::NONE)?;
        done += n;
        progress(done);
    }
    Ok(())
}

/// Checks that an IO is sector aligned and inside the device.
pub fn check_io(kind: IoKind, offset: u64, len: usize, device_len: u64) -> Result<()> {
    let align = u64::from(SECTOR_SIZE);
    if offset % align != 0 || len as u64 % align != 0 {
        return Err(DeviceError::Unaligned {
            kind,
            offset,
            len,
            align: SECTOR_SIZE,
        });
    }
    match offset.checked_add(len as u64) {
        Some(end) if end <= device_len => Ok(()),
        _ => Err(DeviceError::OutOfRange {
            kind,
            offset,
            len,
            device_len,
        }),
    }
}
