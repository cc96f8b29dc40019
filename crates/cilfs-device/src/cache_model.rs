//! The model of a disk with a volatile write cache, shared by the simulated device and by the
//! recording device's crash-image builder, so both crash the same way.

use crate::image::SparseImage;
use crate::SECTOR_SIZE;
use std::collections::VecDeque;

const SECTOR: usize = SECTOR_SIZE as usize;

/// What became of one volatile write in a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Survival {
    Lost,
    Kept,
    /// Each 512-byte sector independently: `true` = new data reached the disk.
    Torn(Vec<bool>),
}

/// A completed write not yet covered by a flush. `sectors[i]` is `None` once a later stable write
/// has overwritten that sector: the older cached data can no longer land on top of it.
#[derive(Debug, Clone)]
pub(crate) struct VolatileWrite {
    /// Position of the write in the device's operation sequence.
    pub tag: u64,
    pub offset: u64,
    pub sectors: Vec<Option<Box<[u8]>>>,
}

impl VolatileWrite {
    fn end(&self) -> u64 {
        self.offset + (self.sectors.len() * SECTOR) as u64
    }

    fn apply(&self, image: &mut SparseImage, keep_sector: impl Fn(usize) -> bool) {
        for (i, s) in self.sectors.iter().enumerate() {
            if let Some(data) = s {
                if keep_sector(i) {
                    image.write(self.offset + (i * SECTOR) as u64, data);
                }
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct CacheModel {
    pub stable: SparseImage,
    volatile: VecDeque<VolatileWrite>,
}

impl CacheModel {
    pub fn new(stable: SparseImage) -> Self {
        Self {
            stable,
            volatile: VecDeque::new(),
        }
    }

    pub fn has_volatile(&self) -> bool {
        !self.volatile.is_empty()
    }

    pub fn volatile_count(&self) -> usize {
        self.volatile.len()
    }

    /// Sector counts of the outstanding volatile writes, oldest first.
    pub fn volatile_sector_counts(&self) -> Vec<usize> {
        self.volatile.iter().map(|w| w.sectors.len()).collect()
    }

    pub fn write_volatile(&mut self, tag: u64, offset: u64, data: &[u8]) {
        debug_assert!(self.volatile.back().is_none_or(|w| w.tag < tag));
        let sectors = data
            .chunks(SECTOR)
            .map(|c| Some(c.to_vec().into_boxed_slice()))
            .collect();
        self.volatile.push_back(VolatileWrite {
            tag,
            offset,
            sectors,
        });
    }

    /// A FUA write: stable at once, and it supersedes older cached data for the same sectors.
    pub fn write_stable(&mut self, offset: u64, data: &[u8]) {
        self.stable.write(offset, data);
        let end = offset + data.len() as u64;
        for w in &mut self.volatile {
            if w.offset < end && offset < w.end() {
                for (i, s) in w.sectors.iter_mut().enumerate() {
                    let pos = w.offset + (i * SECTOR) as u64;
                    if pos >= offset && pos < end {
                        *s = None;
                    }
                }
            }
        }
    }

    /// Makes stable every volatile write whose tag is below `tag` (those completed before a flush
    /// with that issue position).
    pub fn stabilize_before(&mut self, tag: u64) {
        while self.volatile.front().is_some_and(|w| w.tag < tag) {
            if let Some(w) = self.volatile.pop_front() {
                w.apply(&mut self.stable, |_| true);
            }
        }
    }

    pub fn stabilize_all(&mut self) {
        self.stabilize_before(u64::MAX);
    }

    /// The image a power cut would leave, with `choose(i, sector_count)` deciding the fate of the
    /// i-th outstanding volatile write (oldest first). Survivors land in their original order.
    pub fn crash_image(&self, choose: &mut dyn FnMut(usize, usize) -> Survival) -> SparseImage {
        let mut image = self.stable.clone();
        for (i, w) in self.volatile.iter().enumerate() {
            match choose(i, w.sectors.len()) {
                Survival::Lost => {}
                Survival::Kept => w.apply(&mut image, |_| true),
                Survival::Torn(mask) => {
                    assert_eq!(
                        mask.len(),
                        w.sectors.len(),
                        "torn mask must cover every sector"
                    );
                    w.apply(&mut image, |s| mask[s]);
                }
            }
        }
        image
    }
}
