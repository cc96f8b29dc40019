use crate::cache_model::{CacheModel, Survival};
use crate::counters::{IoCounters, IoStats};
use crate::image::SparseImage;
use crate::rng::SimRng;
use crate::{check_io, Device, DeviceError, IoKind, Result, WriteFlags};
use cilfs_sync::Mutex;

/// How an injected fault behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// Only operation k fails.
    Once,
    /// Operation k and every later one fail (the device died).
    FromThenOn,
}

/// What a crash may do beyond losing volatile writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct CrashOptions {
    /// A volatile write may be torn: each of its sectors independently old or new.
    pub torn_writes: bool,
}

#[derive(Debug)]
struct SimState {
    live: SparseImage,
    cache: CacheModel,
    op_index: u64,
    fault: Option<(u64, FaultMode)>,
}

/// An in-memory device with a volatile write cache, deterministic from its seed.
///
/// Operations are atomic (one lock), so a write is either not started or completed. A completed
/// write without FUA is volatile until a flush or a later PREFLUSH; [`SimDevice::crash`] returns
/// the device a power cut would leave, chosen by the seed and the operation count.
#[derive(Debug)]
pub struct SimDevice {
    state: Mutex<SimState>,
    len: u64,
    seed: u64,
    counters: IoCounters,
}

impl SimDevice {
    pub fn new(len: u64, seed: u64) -> Self {
        Self::from_image(SparseImage::new(), len, seed)
    }

    /// A device whose stable contents are `image`.
    pub fn from_image(image: SparseImage, len: u64, seed: u64) -> Self {
        Self {
            state: Mutex::new(SimState {
                live: image.clone(),
                cache: CacheModel::new(image),
                op_index: 0,
                fault: None,
            }),
            len,
            seed,
            counters: IoCounters::default(),
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Makes operation number `op_index` (counting reads, writes and flushes from 0) fail.
    pub fn inject_fault(&self, op_index: u64, mode: FaultMode) {
        self.state.lock().fault = Some((op_index, mode));
    }

    pub fn clear_fault(&self) {
        self.state.lock().fault = None;
    }

    /// Operations performed so far (including failed ones).
    pub fn op_count(&self) -> u64 {
        self.state.lock().op_index
    }

    pub fn volatile_writes(&self) -> usize {
        self.state.lock().cache.volatile_count()
    }

    /// What a reader sees now.
    pub fn live_image(&self) -> SparseImage {
        self.state.lock().live.clone()
    }

    /// What is guaranteed to survive a crash now.
    pub fn stable_image(&self) -> SparseImage {
        self.state.lock().cache.stable.clone()
    }

    /// The device a power cut would leave now: every stable write, and a subset of the volatile
    /// ones chosen by the seed and the operation count, possibly torn.
    pub fn crash(&self, opts: CrashOptions) -> SimDevice {
        let st = self.state.lock();
        let mut rng = SimRng::derive(self.seed, st.op_index);
        let image = st
            .cache
            .crash_image(&mut |_, sectors| random_survival(&mut rng, sectors, opts));
        let next_seed = rng.next_u64();
        SimDevice::from_image(image, self.len, next_seed)
    }

    /// Like [`crash`](Self::crash) with the fate of each volatile write (oldest first) chosen by
    /// the caller.
    pub fn crash_with(&self, choose: &mut dyn FnMut(usize, usize) -> Survival) -> SimDevice {
        let st = self.state.lock();
        let image = st.cache.crash_image(choose);
        SimDevice::from_image(image, self.len, self.seed.wrapping_add(st.op_index))
    }

    fn begin_op(st: &mut SimState, kind: IoKind) -> Result<u64> {
        let index = st.op_index;
        st.op_index += 1;
        match st.fault {
            Some((k, FaultMode::Once)) if k == index => Err(DeviceError::Injected {
                kind,
                op_index: index,
            }),
            Some((k, FaultMode::FromThenOn)) if index >= k => Err(DeviceError::Injected {
                kind,
                op_index: index,
            }),
            _ => Ok(index),
        }
    }

    /// Returns whether anything was volatile (the flush was issued, not elided).
    fn flush_locked(&self, st: &mut SimState) -> bool {
        if st.cache.has_volatile() {
            st.cache.stabilize_all();
            self.counters.flush_issued();
            true
        } else {
            self.counters.flush_elided();
            false
        }
    }
}

/// A seeded fate for one volatile write: lost, kept or (if allowed) torn, equally likely.
pub(crate) fn random_survival(rng: &mut SimRng, sectors: usize, opts: CrashOptions) -> Survival {
    let outcomes = if opts.torn_writes { 3 } else { 2 };
    match rng.below(outcomes) {
        0 => Survival::Lost,
        1 => Survival::Kept,
        _ => Survival::Torn((0..sectors).map(|_| rng.bool()).collect()),
    }
}

impl Device for SimDevice {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_io(IoKind::Read, offset, buf.len(), self.len)?;
        let mut st = self.state.lock();
        Self::begin_op(&mut st, IoKind::Read)?;
        st.live.read(offset, buf);
        self.counters.read(buf.len());
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()> {
        check_io(IoKind::Write, offset, buf.len(), self.len)?;
        let mut st = self.state.lock();
        let tag = Self::begin_op(&mut st, IoKind::Write)?;
        if flags.preflush() {
            self.flush_locked(&mut st);
        }
        st.live.write(offset, buf);
        if flags.fua() {
            st.cache.write_stable(offset, buf);
        } else {
            st.cache.write_volatile(tag, offset, buf);
        }
        self.counters.write(buf.len(), flags);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.flush_reporting().map(drop)
    }

    fn flush_reporting(&self) -> Result<bool> {
        let mut st = self.state.lock();
        Self::begin_op(&mut st, IoKind::Flush)?;
        Ok(self.flush_locked(&mut st))
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }

    fn can_discard(&self) -> bool {
        true
    }

    /// Zeros, at once and stable (a punched hole): whatever the range held, cached or not,
    /// is gone, so a discard of a block in use shows as lost data or a bad checksum.
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let n = usize::try_from(len).unwrap_or(usize::MAX);
        check_io(IoKind::Discard, offset, n, self.len)?;
        let mut st = self.state.lock();
        Self::begin_op(&mut st, IoKind::Discard)?;
        let zeros = vec![0u8; 1 << 16];
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(zeros.len() as u64) as usize;
            st.live.write(at, &zeros[..n]);
            st.cache.write_stable(at, &zeros[..n]);
            at += n as u64;
        }
        Ok(())
    }
}
