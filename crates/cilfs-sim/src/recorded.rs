//! One or two recorded devices with a global operation order, so that a crash can be taken at
//! the same instant on both (an external log lives on its own device).

use cilfs_device::rng::SimRng;
use cilfs_device::{
    Device, IoStats, RecordingDevice, Result, SimDevice, SparseImage, Survival, WriteFlags,
};
use parking_lot::Mutex;
use std::sync::Arc;

/// A recorded device that also appends its id to a shared completion order.
#[derive(Debug)]
pub struct Tagged {
    pub rec: RecordingDevice<SimDevice>,
    id: usize,
    order: Arc<Mutex<Vec<usize>>>,
}

impl Device for Tagged {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.rec.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()> {
        self.rec.write(offset, buf, flags)?;
        self.order.lock().push(self.id);
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.rec.flush()?;
        self.order.lock().push(self.id);
        Ok(())
    }
    fn len(&self) -> u64 {
        self.rec.len()
    }
    fn stats(&self) -> IoStats {
        self.rec.stats()
    }
}

/// The devices of one run.
#[derive(Debug)]
pub struct RecordedSet {
    pub devs: Vec<Arc<Tagged>>,
    order: Arc<Mutex<Vec<usize>>>,
}

impl RecordedSet {
    /// Starts recording on devices whose contents are `bases`.
    pub fn new(bases: Vec<(SparseImage, u64)>, seed: u64) -> Self {
        let order = Arc::new(Mutex::new(Vec::new()));
        let devs = bases
            .into_iter()
            .enumerate()
            .map(|(id, (img, len))| {
                let sim = SimDevice::from_image(img.clone(), len, seed.wrapping_add(id as u64));
                Arc::new(Tagged {
                    rec: RecordingDevice::new(sim, img),
                    id,
                    order: Arc::clone(&order),
                })
            })
            .collect();
        Self { devs, order }
    }

    /// Operations completed so far, over all devices.
    pub fn op_count(&self) -> usize {
        self.order.lock().len()
    }

    /// Whether global operation `i` made something stable.
    pub fn is_durability_point(&self, i: usize) -> bool {
        let order = self.order.lock();
        let id = order[i];
        let nth = order[..i].iter().filter(|&&d| d == id).count();
        self.devs[id].rec.ops()[nth].is_durability_point()
    }

    /// The global operations that made something stable.
    pub fn durability_points(&self) -> Vec<usize> {
        (0..self.op_count())
            .filter(|&i| self.is_durability_point(i))
            .collect()
    }

    /// Crash images of every device after the first `g` global operations; `choose` decides the
    /// fate of each volatile write, device by device.
    pub fn crash_images(
        &self,
        g: usize,
        choose: &mut dyn FnMut(usize, usize) -> Survival,
    ) -> Vec<SparseImage> {
        let order = self.order.lock();
        self.devs
            .iter()
            .enumerate()
            .map(|(id, d)| {
                let n = order[..g].iter().filter(|&&x| x == id).count();
                d.rec.crash_image(n, choose)
            })
            .collect()
    }
}

/// A crash point among `n` operations: half the time just after a flush/FUA point or just
/// before it, otherwise anywhere.
pub fn pick_crash_point(rng: &mut SimRng, durability: &[usize], n: usize) -> usize {
    if !durability.is_empty() && rng.bool() {
        let d = durability[rng.below(durability.len() as u64) as usize];
        d + usize::from(rng.bool())
    } else {
        rng.below(n as u64 + 1) as usize
    }
}
