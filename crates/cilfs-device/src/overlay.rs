//! A copy-on-write view of a device: writes stay in memory, reads see them over the base.
//! `cilfs check` recovers the log through one, so checking never writes to the image.

use crate::{Device, IoCounters, IoStats, Result, WriteFlags, SECTOR_SIZE};
use cilfs_sync::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug)]
pub struct OverlayDevice {
    base: Arc<dyn Device>,
    /// Sector number -> its overwritten contents.
    sectors: Mutex<HashMap<u64, Box<[u8]>>>,
    counters: IoCounters,
}

impl OverlayDevice {
    pub fn new(base: Arc<dyn Device>) -> Self {
        OverlayDevice {
            base,
            sectors: Mutex::new(HashMap::new()),
            counters: IoCounters::default(),
        }
    }

    /// Bytes written into the overlay.
    pub fn overlay_bytes(&self) -> u64 {
        self.sectors.lock().len() as u64 * u64::from(SECTOR_SIZE)
    }
}

impl Device for OverlayDevice {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.base.read(offset, buf)?;
        let ss = u64::from(SECTOR_SIZE);
        let sectors = self.sectors.lock();
        if sectors.is_empty() {
            return Ok(());
        }
        let first = offset / ss;
        let n = (buf.len() as u64).div_ceil(ss);
        for s in first..first + n {
            if let Some(data) = sectors.get(&s) {
                let at = (s * ss - offset) as usize;
                let len = (buf.len() - at).min(SECTOR_SIZE as usize);
                buf[at..at + len].copy_from_slice(&data[..len]);
            }
        }
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8], _flags: WriteFlags) -> Result<()> {
        let ss = u64::from(SECTOR_SIZE);
        crate::check_io(crate::IoKind::Write, offset, buf.len(), self.len())?;
        let mut sectors = self.sectors.lock();
        for (i, chunk) in buf.chunks(SECTOR_SIZE as usize).enumerate() {
            sectors.insert(offset / ss + i as u64, chunk.to_vec().into_boxed_slice());
        }
        self.counters.write(buf.len(), WriteFlags::NONE);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> u64 {
        self.base.len()
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}
