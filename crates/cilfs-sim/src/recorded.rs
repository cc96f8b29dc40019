//! One or two recorded devices with a global operation order, so that a crash can be taken at
//! the same instant on both (an external log lives on its own device); for the explorers'
//! background mode, devices with latency and a write queue, and the journal as a mount runs it.

use cilfs_core::journal::{CilSharding, JournalConfig, PushMode};
use cilfs_device::rng::SimRng;
use cilfs_device::{
    Device, DeviceError, IoKind, IoStats, QueuedBuf, QueuedWrite, RecordingDevice, Result,
    SimDevice, SparseImage, Survival, WriteFlags, WriteQueue,
};
use cilfs_sync::Mutex;
use std::sync::Arc;

/// An IO error the devices of a set are told to give: every write and flush from global
/// operation `at` on fails (the device died), or only the first of them (`once`). A failed
/// operation is not recorded: it never reached the medium. Reads never fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub at: usize,
    pub once: bool,
}

/// The set's fault, and whether an operation has failed by it.
#[derive(Debug, Default)]
struct FaultState {
    fault: Option<Fault>,
    hit: bool,
    /// The first operation it failed.
    first: Option<String>,
}

/// A recorded device that also appends its id to a shared completion order.
#[derive(Debug)]
pub struct Tagged {
    pub rec: Arc<RecordingDevice<SimDevice>>,
    id: usize,
    order: Arc<Mutex<Vec<usize>>>,
    fault: Arc<Mutex<FaultState>>,
    /// With threads: a random delay before some writes and flushes complete, and a write
    /// queue (`SimQueue`).
    jitter: Option<Mutex<SimRng>>,
}

/// Completes one operation issued when this device had completed `issued` of its own: it
/// and the shared order are appended under one hold of the order, so that the two agree on
/// the order of completions when threads write at once.
fn complete(
    rec: &RecordingDevice<SimDevice>,
    id: usize,
    order: &Mutex<Vec<usize>>,
    fault: &Mutex<FaultState>,
    issued: usize,
    write: Option<(u64, &[u8], WriteFlags)>,
) -> Result<()> {
    let mut order = order.lock();
    {
        let mut f = fault.lock();
        if let Some(x) = f.fault {
            if order.len() >= x.at && !(x.once && f.hit) {
                f.hit = true;
                if f.first.is_none() {
                    f.first = Some(match write {
                        Some((o, b, fl)) => format!(
                            "device {id} failed operation {}: a write of {} bytes at {o} ({fl:?})",
                            order.len(),
                            b.len()
                        ),
                        None => format!("device {id} failed operation {}: a flush", order.len()),
                    });
                }
                return Err(DeviceError::Injected {
                    kind: match write {
                        Some(_) => IoKind::Write,
                        None => IoKind::Flush,
                    },
                    op_index: order.len() as u64,
                });
            }
        }
    }
    match write {
        Some((offset, buf, flags)) => rec.write_issued(issued, offset, buf, flags)?,
        None => rec.flush_issued(issued)?,
    }
    order.push(id);
    Ok(())
}

/// A simulated write queue (what io_uring gives a file device): writes wait after their
/// submission until a `complete` call takes them, each in flight with even odds at every
/// call, so they complete in any order and late. Each is recorded when it completes, as issued
/// when it was submitted: a flush between the two does not cover it.
#[derive(Debug)]
struct SimQueue {
    rec: Arc<RecordingDevice<SimDevice>>,
    id: usize,
    order: Arc<Mutex<Vec<usize>>>,
    fault: Arc<Mutex<FaultState>>,
    rng: SimRng,
    /// (offset, buffers, operations of the device completed at submission).
    pending: Vec<(u64, Vec<QueuedBuf>, usize)>,
}

impl WriteQueue for SimQueue {
    fn submit(
        &mut self,
        offset: u64,
        parts: Vec<QueuedBuf>,
    ) -> std::result::Result<(), (Vec<QueuedBuf>, cilfs_device::DeviceError)> {
        self.pending.push((offset, parts, self.rec.op_count()));
        Ok(())
    }

    fn complete(&mut self, wait: bool) -> Result<Vec<QueuedWrite>> {
        let mut done = Vec::new();
        let must = (wait && !self.pending.is_empty())
            .then(|| self.rng.below(self.pending.len() as u64) as usize);
        let mut i = 0;
        let mut k = 0;
        while i < self.pending.len() {
            if Some(k) == must || self.rng.bool() {
                let (offset, parts, issued) = self.pending.remove(i);
                let bytes: Vec<u8> = parts
                    .iter()
                    .flat_map(|p| p.buf[p.range.clone()].iter().copied())
                    .collect();
                // A simulated device fails only where told to (`RecordedSet::inject`): then
                // each part of the write carries the error.
                let result = complete(
                    &self.rec,
                    self.id,
                    &self.order,
                    &self.fault,
                    issued,
                    Some((offset, &bytes, WriteFlags::NONE)),
                );
                let failed = match result {
                    Ok(()) => None,
                    Err(DeviceError::Injected { op_index, .. }) => Some(op_index),
                    Err(e) => return Err(e),
                };
                done.extend(parts.into_iter().map(|p| QueuedWrite {
                    tag: p.tag,
                    buf: p.buf,
                    result: failed.map_or(Ok(()), |op_index| {
                        Err(DeviceError::Injected {
                            kind: IoKind::Write,
                            op_index,
                        })
                    }),
                }));
            } else {
                i += 1;
            }
            k += 1;
        }
        Ok(done)
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

impl Tagged {
    /// Holds the calling thread for up to 200 us one time in three, between an operation's
    /// issue and its completion, while the other threads go on: a flush then misses a write
    /// issued before it that completes after it, and what threads do while an IO is in flight
    /// meets crashes, as on a device with latency.
    fn delay(&self) {
        let Some(rng) = &self.jitter else { return };
        let us = {
            let mut r = rng.lock();
            if !r.chance(1, 3) {
                return;
            }
            r.below(200)
        };
        cilfs_sync::thread::sleep(std::time::Duration::from_micros(us));
    }
}

impl Device for Tagged {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.rec.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()> {
        let issued = self.rec.op_count();
        self.delay();
        complete(
            &self.rec,
            self.id,
            &self.order,
            &self.fault,
            issued,
            Some((offset, buf, flags)),
        )
    }
    fn flush(&self) -> Result<()> {
        let issued = self.rec.op_count();
        self.delay();
        complete(&self.rec, self.id, &self.order, &self.fault, issued, None)
    }
    fn write_queue(&self, _depth: usize) -> Option<Box<dyn WriteQueue>> {
        let seed = self.jitter.as_ref()?.lock().next_u64();
        Some(Box::new(SimQueue {
            rec: Arc::clone(&self.rec),
            id: self.id,
            order: Arc::clone(&self.order),
            fault: Arc::clone(&self.fault),
            rng: SimRng::new(seed),
            pending: Vec::new(),
        }))
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
    fault: Arc<Mutex<FaultState>>,
}

impl RecordedSet {
    /// Starts recording on devices whose contents are `bases`.
    pub fn new(bases: Vec<(SparseImage, u64)>, seed: u64) -> Self {
        Self::recording(bases, seed, false)
    }

    /// Starts recording, with delays before some writes and flushes complete (`Tagged::delay`)
    /// for workloads that run threads.
    pub fn with_jitter(bases: Vec<(SparseImage, u64)>, seed: u64) -> Self {
        Self::recording(bases, seed, true)
    }

    fn recording(bases: Vec<(SparseImage, u64)>, seed: u64, jitter: bool) -> Self {
        let order = Arc::new(Mutex::new(Vec::new()));
        let fault = Arc::new(Mutex::new(FaultState::default()));
        let devs = bases
            .into_iter()
            .enumerate()
            .map(|(id, (img, len))| {
                let sim = SimDevice::from_image(img.clone(), len, seed.wrapping_add(id as u64));
                Arc::new(Tagged {
                    rec: Arc::new(RecordingDevice::new(sim, img)),
                    id,
                    order: Arc::clone(&order),
                    fault: Arc::clone(&fault),
                    jitter: jitter.then(|| Mutex::new(SimRng::derive(seed, 0x6a17 + id as u64))),
                })
            })
            .collect();
        Self { devs, order, fault }
    }

    /// From now on the devices give `fault`'s IO errors.
    pub fn inject(&self, fault: Fault) {
        *self.fault.lock() = FaultState {
            fault: Some(fault),
            ..FaultState::default()
        };
    }

    /// The devices work again (replaced, or the error passed); returns the first operation
    /// that failed, if one did.
    pub fn clear_fault(&self) -> Option<String> {
        std::mem::take(&mut *self.fault.lock()).first
    }

    /// Whether an operation has failed by the injected fault.
    pub fn fault_hit(&self) -> bool {
        self.fault.lock().hit
    }

    /// A fingerprint of everything the devices were asked to do, in the order it completed:
    /// every write (device, offset, flags, bytes, when it was issued) and flush. Two runs with
    /// the same trace have the same fingerprint.
    pub fn fingerprint(&self) -> u64 {
        use cilfs_device::RecordedOp;
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: the same on every run and in every process.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.order.lock().hash(&mut h);
        for d in &self.devs {
            for op in d.rec.ops() {
                match op {
                    RecordedOp::Write {
                        offset,
                        data,
                        flags,
                        issued_at,
                    } => (0u8, offset, &data[..], flags.bits(), issued_at).hash(&mut h),
                    RecordedOp::Flush { issued_at } => (1u8, issued_at).hash(&mut h),
                }
            }
        }
        h.finish()
    }

    /// Operations completed so far, over all devices.
    pub fn op_count(&self) -> usize {
        self.order.lock().len()
    }

    /// The global operations that made something stable: one pass over the order, each
    /// device's record copied once.
    pub fn durability_points(&self) -> Vec<usize> {
        let order = self.order.lock();
        let ops: Vec<_> = self.devs.iter().map(|d| d.rec.ops()).collect();
        let mut nth = vec![0usize; ops.len()];
        let mut points = Vec::new();
        for (i, &id) in order.iter().enumerate() {
            if ops[id][nth[id]].is_durability_point() {
                points.push(i);
            }
            nth[id] += 1;
        }
        points
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

/// Sets its flag when dropped, unwinding included: the workload's thread holds one for the
/// threads beside it, so a panic in it fails the run instead of leaving the explorer's scope
/// waiting for threads that wait for the workload (a remount, the end of the run).
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `cfg` as a mount runs the journal, for the explorers' background mode: the push worker
/// (idle pushes and covers as often as it allows, meeting the workload), the AIL worker with
/// its queued write back, concurrent iclog IO, and CIL shards per thread.
pub fn with_mount_threads(cfg: JournalConfig) -> JournalConfig {
    JournalConfig {
        push_mode: PushMode::Background,
        log_force_interval: Some(std::time::Duration::from_millis(10)),
        cil_sharding: CilSharding::ByThread,
        ..cfg
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

/// Runs one run of an explorer (its workload and its crash points) and returns what `f`
/// returns. In every build that runs, `f` runs on this thread and the run's threads are the
/// machine's. Under `--cfg shuttle` (`scripts/sched-crashtest`) `f` is the main task of a run
/// of shuttle's scheduler seeded with `seed`: every thread the run starts (the mount's push
/// worker, iclog IO, AIL worker and flusher, the other operation threads) is a task it
/// interleaves at every lock, wait and yield, so the same seed gives the same interleaving and
/// the same IO. A panic in any task is then returned as an error.
pub fn scheduled<T: Send + 'static>(
    seed: u64,
    f: impl Fn() -> T + Send + Sync + 'static,
) -> std::result::Result<T, String> {
    #[cfg(not(shuttle))]
    {
        let _ = seed;
        Ok(f())
    }
    #[cfg(shuttle)]
    {
        use std::sync::PoisonError;
        let slot = Arc::new(std::sync::Mutex::new(None));
        let out = Arc::clone(&slot);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cilfs_sync::run_scheduled(seed, move || {
                let v = f();
                *out.lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
            })
        }));
        if let Err(p) = r {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a task panicked".into());
            return Err(format!("scheduled run panicked: {what}"));
        }
        let v = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        v.ok_or_else(|| "the scheduled run returned nothing".into())
    }
}
