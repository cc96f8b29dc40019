//! Metadata buffers: blocks of the data device with the byte ranges changed since they were last
//! written back, and the cache that hands out the newest in-memory version of each block.

mod ranges;

pub use ranges::RangeSet;

use crate::log::item_format::encode_buf_item;
use crate::log::recover::write_lsn_stamp;
use crate::log::Lsn;
use crate::trans::item::{ItemKey, LogItem, WriteBack};
use cilfs_device::{AlignedBuf, Device, DeviceError, WriteFlags};
use parking_lot::{Mutex, RawMutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

pub type BufGuard = parking_lot::lock_api::ArcMutexGuard<RawMutex, BufData>;

/// The contents and log state of one block.
#[derive(Debug)]
pub struct BufData {
    pub data: AlignedBuf,
    /// Ranges changed since the last write back: every checkpoint that logs this block logs all
    /// of them, so that moving the item forward in the AIL never drops an older change.
    pub dirty: RangeSet,
    /// The block keeps an LSN stamp (and the fs UUID) at this offset.
    pub lsn_offset: Option<u16>,
    /// Freed in a transaction: logged as a cancel record, never written back.
    pub cancelled: bool,
}

#[derive(Debug)]
pub struct Buf {
    blkno: u64,
    state: Arc<Mutex<BufData>>,
    pins: AtomicU32,
}

impl Buf {
    pub fn blkno(&self) -> u64 {
        self.blkno
    }

    pub fn lock(&self) -> BufGuard {
        self.state.lock_arc()
    }

    /// The item payload a checkpoint logs for this block now.
    pub fn format(&self, g: &BufData) -> Vec<u8> {
        encode_buf_item(
            self.blkno,
            g.cancelled,
            g.lsn_offset,
            &g.data,
            g.dirty.ranges(),
        )
    }
}

impl LogItem for Buf {
    fn key(&self) -> ItemKey {
        self.blkno
    }

    fn pins(&self) -> &AtomicU32 {
        &self.pins
    }

    fn write_back(
        &self,
        dev: &dyn Device,
        lsn: Lsn,
        uuid: &[u8; 16],
    ) -> Result<WriteBack, DeviceError> {
        let Some(mut g) = self.state.try_lock() else {
            return Ok(WriteBack::Busy);
        };
        if self.pins.load(Ordering::Acquire) > 0 {
            return Ok(WriteBack::Pinned);
        }
        if g.cancelled {
            g.dirty.clear();
            return Ok(WriteBack::Stale);
        }
        if let Some(off) = g.lsn_offset {
            write_lsn_stamp(&mut g.data, off, lsn, uuid);
        }
        let bytes = g.data.len() as u64;
        dev.write(self.blkno * bytes, &g.data, WriteFlags::NONE)?;
        g.dirty.clear();
        Ok(WriteBack::Written { bytes })
    }
}

/// All buffers in memory. Dirty, pinned and AIL-resident buffers must stay; clean ones could be
/// evicted (not yet done: the cache grows with the set of blocks touched).
#[derive(Debug)]
pub struct BufCache {
    dev: Arc<dyn Device>,
    block_size: u32,
    bufs: Mutex<HashMap<u64, Arc<Buf>>>,
}

impl BufCache {
    pub fn new(dev: Arc<dyn Device>, block_size: u32) -> Self {
        Self {
            dev,
            block_size,
            bufs: Mutex::new(HashMap::new()),
        }
    }

    /// The buffer of `blkno`, read from the device on first use.
    pub fn get(&self, blkno: u64) -> Result<Arc<Buf>, DeviceError> {
        if let Some(b) = self.bufs.lock().get(&blkno) {
            return Ok(Arc::clone(b));
        }
        let mut data = AlignedBuf::zeroed(self.block_size as usize);
        self.dev
            .read(blkno * u64::from(self.block_size), &mut data)?;
        let mut bufs = self.bufs.lock();
        // Another thread may have read it meanwhile: its copy (perhaps already modified) wins.
        let b = bufs.entry(blkno).or_insert_with(|| {
            Arc::new(Buf {
                blkno,
                state: Arc::new(Mutex::new(BufData {
                    data,
                    dirty: RangeSet::default(),
                    lsn_offset: None,
                    cancelled: false,
                })),
                pins: AtomicU32::new(0),
            })
        });
        Ok(Arc::clone(b))
    }

    pub fn len(&self) -> usize {
        self.bufs.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
