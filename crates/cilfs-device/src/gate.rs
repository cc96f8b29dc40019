//! Writes held in memory until a gate opens. `cilfs mount` recovers the log and opens the
//! filesystem before the FUSE mount exists (the FUSE session needs the filesystem), and a mount
//! that then fails (no access to /dev/fuse, `allow_other` refused, a bad mount point) must
//! leave the image as it found it: until [`Gate::release`], every write and flush to the
//! devices of one gate is kept, in order, and reads see the kept writes over the device.
//! Release issues them to the devices in that order, with their flags, so their crash
//! semantics are those of the original sequence; afterwards IO passes straight through.
//!
//! What is held is what recovery writes (the replayed blocks, at most what the log holds, which
//! replay has in memory anyway) and the superblock.

use crate::queue::{QueuedBuf, QueuedWrite, WriteQueue};
use crate::{check_io, AlignedBuf, Device, IoKind, IoStats, Result, WriteFlags, SECTOR_SIZE};
use cilfs_sync::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Holds the writes of every device wrapped by it, in one order across devices (a checkpoint
/// on an external log must not reach it before the data device flush that preceded it).
#[derive(Debug, Default)]
pub struct Gate {
    open: AtomicBool,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    devices: Vec<Arc<dyn Device>>,
    ops: Vec<HeldOp>,
    /// (device, sector) -> (op, byte offset in its data) of the newest held write of it.
    index: HashMap<(usize, u64), (usize, usize)>,
}

#[derive(Debug)]
enum HeldOp {
    Write {
        dev: usize,
        offset: u64,
        data: AlignedBuf,
        flags: WriteFlags,
    },
    Flush {
        dev: usize,
    },
}

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::new(Gate::default())
    }

    /// A device whose writes this gate holds until it opens.
    pub fn wrap(self: &Arc<Self>, inner: Arc<dyn Device>) -> GatedDevice {
        let mut h = self.held.lock();
        h.devices.push(Arc::clone(&inner));
        GatedDevice {
            inner,
            dev: h.devices.len() - 1,
            gate: Arc::clone(self),
        }
    }

    /// Issues every held write and flush to its device, in order, then lets IO through. On an
    /// error the gate stays shut and what was not issued stays held.
    pub fn release(&self) -> Result<()> {
        let mut h = self.held.lock();
        let devices = h.devices.clone();
        let ops = std::mem::take(&mut h.ops);
        h.index.clear();
        let mut ops = ops.into_iter();
        while let Some(op) = ops.next() {
            let r = match &op {
                HeldOp::Write {
                    dev,
                    offset,
                    data,
                    flags,
                } => devices[*dev].write(*offset, data, *flags),
                HeldOp::Flush { dev } => devices[*dev].flush(),
            };
            if let Err(e) = r {
                // Keep the failed op and the rest held (reads must still see them).
                let rest: Vec<HeldOp> = std::iter::once(op).chain(ops).collect();
                for o in rest {
                    h.push(o);
                }
                return Err(e);
            }
        }
        self.open.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether IO passes through.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Bytes of writes held.
    pub fn held_bytes(&self) -> u64 {
        self.held
            .lock()
            .ops
            .iter()
            .map(|o| match o {
                HeldOp::Write { data, .. } => data.len() as u64,
                HeldOp::Flush { .. } => 0,
            })
            .sum()
    }
}

impl Held {
    fn push(&mut self, op: HeldOp) {
        let at = self.ops.len();
        if let HeldOp::Write {
            dev, offset, data, ..
        } = &op
        {
            let ss = u64::from(SECTOR_SIZE);
            for i in 0..data.len() / SECTOR_SIZE as usize {
                self.index.insert(
                    (*dev, offset / ss + i as u64),
                    (at, i * SECTOR_SIZE as usize),
                );
            }
        }
        self.ops.push(op);
    }

    fn write(&mut self, dev: usize, offset: u64, parts: &[&[u8]], flags: WriteFlags) {
        let len = parts.iter().map(|p| p.len()).sum();
        let mut data = AlignedBuf::zeroed(len);
        let mut at = 0;
        for p in parts {
            data[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        self.push(HeldOp::Write {
            dev,
            offset,
            data,
            flags,
        });
    }

    /// Lays the held writes of `dev` over `buf`, read from the device at `offset`.
    fn overlay(&self, dev: usize, offset: u64, buf: &mut [u8]) {
        if self.index.is_empty() {
            return;
        }
        let ss = u64::from(SECTOR_SIZE);
        let first = offset / ss;
        for s in first..first + (buf.len() as u64).div_ceil(ss) {
            if let Some(&(op, from)) = self.index.get(&(dev, s)) {
                if let HeldOp::Write { data, .. } = &self.ops[op] {
                    let at = (s * ss - offset) as usize;
                    let len = (buf.len() - at).min(SECTOR_SIZE as usize);
                    buf[at..at + len].copy_from_slice(&data[from..from + len]);
                }
            }
        }
    }
}

/// One device behind a [`Gate`].
#[derive(Debug)]
pub struct GatedDevice {
    inner: Arc<dyn Device>,
    dev: usize,
    gate: Arc<Gate>,
}

impl GatedDevice {
    /// Holds `parts` (one write, back to back from `offset`) unless the gate is open; returns
    /// whether it did.
    fn hold(&self, offset: u64, parts: &[&[u8]], flags: WriteFlags) -> Result<bool> {
        if self.gate.is_open() {
            return Ok(false);
        }
        let mut h = self.gate.held.lock();
        // Opened while we waited for the lock: what was held is out, so write through.
        if self.gate.is_open() {
            return Ok(false);
        }
        let len = parts.iter().map(|p| p.len()).sum();
        check_io(IoKind::Write, offset, len, self.inner.len())?;
        h.write(self.dev, offset, parts, flags);
        Ok(true)
    }
}

impl Device for GatedDevice {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if self.gate.is_open() {
            return self.inner.read(offset, buf);
        }
        let h = self.gate.held.lock();
        self.inner.read(offset, buf)?;
        if !self.gate.is_open() {
            h.overlay(self.dev, offset, buf);
        }
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()> {
        if self.hold(offset, &[buf], flags)? {
            return Ok(());
        }
        self.inner.write(offset, buf, flags)
    }

    fn write_vectored(&self, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        if self.hold(offset, bufs, WriteFlags::NONE)? {
            return Ok(());
        }
        self.inner.write_vectored(offset, bufs)
    }

    fn flush(&self) -> Result<()> {
        self.flush_reporting().map(drop)
    }

    fn flush_reporting(&self) -> Result<bool> {
        if !self.gate.is_open() {
            let mut h = self.gate.held.lock();
            if !self.gate.is_open() {
                h.ops.push(HeldOp::Flush { dev: self.dev });
                return Ok(true);
            }
        }
        self.inner.flush_reporting()
    }

    fn write_queue(&self, depth: usize) -> Option<Box<dyn WriteQueue>> {
        let inner = self.inner.write_queue(depth)?;
        Some(Box::new(GatedQueue {
            inner,
            device: GatedDevice {
                inner: Arc::clone(&self.inner),
                dev: self.dev,
                gate: Arc::clone(&self.gate),
            },
            done: Vec::new(),
        }))
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn stats(&self) -> IoStats {
        self.inner.stats()
    }

    fn can_discard(&self) -> bool {
        self.inner.can_discard()
    }

    /// Only once the gate is open: a discard cannot be held back with the writes, and one
    /// let through before them could land under a write that was held.
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if !self.gate.is_open() {
            return Err(crate::DeviceError::Unsupported(IoKind::Discard));
        }
        self.inner.discard(offset, len)
    }
}

/// The device's write queue behind the gate: a write submitted while the gate is shut is held
/// and completes at once.
#[derive(Debug)]
struct GatedQueue {
    inner: Box<dyn WriteQueue>,
    device: GatedDevice,
    done: Vec<QueuedWrite>,
}

impl WriteQueue for GatedQueue {
    fn submit(
        &mut self,
        offset: u64,
        parts: Vec<QueuedBuf>,
    ) -> std::result::Result<(), (Vec<QueuedBuf>, crate::DeviceError)> {
        if self.device.gate.is_open() {
            return self.inner.submit(offset, parts);
        }
        let slices: Vec<&[u8]> = parts.iter().map(|p| &p.buf[p.range.clone()]).collect();
        match self.device.hold(offset, &slices, WriteFlags::NONE) {
            Ok(true) => {
                self.done.extend(parts.into_iter().map(|p| QueuedWrite {
                    tag: p.tag,
                    buf: p.buf,
                    result: Ok(()),
                }));
                Ok(())
            }
            Ok(false) => self.inner.submit(offset, parts),
            Err(e) => Err((parts, e)),
        }
    }

    fn complete(&mut self, wait: bool) -> Result<Vec<QueuedWrite>> {
        if !self.done.is_empty() {
            let mut out = std::mem::take(&mut self.done);
            out.extend(self.inner.complete(false)?);
            return Ok(out);
        }
        self.inner.complete(wait)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.done.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RecordedOp, RecordingDevice, SimDevice, SparseImage};

    fn recording(len: u64) -> Arc<RecordingDevice<SimDevice>> {
        Arc::new(RecordingDevice::new(
            SimDevice::new(len, 1),
            SparseImage::new(),
        ))
    }

    #[test]
    fn writes_are_held_in_order_across_devices_until_release() {
        let (a, b) = (recording(1 << 20), recording(1 << 20));
        let gate = Gate::new();
        let ga = gate.wrap(Arc::clone(&a) as Arc<dyn Device>);
        let gb = gate.wrap(Arc::clone(&b) as Arc<dyn Device>);
        ga.write(4096, &[1u8; 1024], WriteFlags::NONE).unwrap();
        gb.flush().unwrap();
        gb.write(0, &[2u8; 512], WriteFlags::FUA).unwrap();
        ga.write_vectored(4608, &[&[3u8; 512], &[4u8; 512]])
            .unwrap();
        ga.write(0, &[5u8; 512], WriteFlags::PREFLUSH | WriteFlags::FUA)
            .unwrap();
        // Nothing reached either device, and reads see the held writes over them.
        assert_eq!((a.op_count(), b.op_count()), (0, 0));
        let mut buf = vec![9u8; 2048];
        ga.read(4096, &mut buf).unwrap();
        assert_eq!(&buf[..512], &[1u8; 512][..]);
        assert_eq!(&buf[512..1024], &[3u8; 512][..], "the newer write wins");
        assert_eq!(&buf[1024..1536], &[4u8; 512][..]);
        assert_eq!(&buf[1536..], &[0u8; 512][..], "the device shows through");
        let mut one = vec![0u8; 512];
        gb.read(0, &mut one).unwrap();
        assert_eq!(one, [2u8; 512]);
        ga.read(0, &mut one).unwrap();
        assert_eq!(one, [5u8; 512], "each device sees its own writes only");
        assert_eq!(gate.held_bytes(), 1024 + 512 + 1024 + 512);
        gate.release().unwrap();
        assert!(gate.is_open());
        let kinds = |d: &RecordingDevice<SimDevice>| -> Vec<(Option<u64>, u8)> {
            d.ops()
                .iter()
                .map(|o| match o {
                    RecordedOp::Write { offset, flags, .. } => (Some(*offset), flags.bits()),
                    RecordedOp::Flush { .. } => (None, 0),
                })
                .collect()
        };
        assert_eq!(
            kinds(&a),
            vec![
                (Some(4096), 0),
                (Some(4608), 0),
                (Some(0), (WriteFlags::PREFLUSH | WriteFlags::FUA).bits())
            ]
        );
        assert_eq!(
            kinds(&b),
            vec![(None, 0), (Some(0), WriteFlags::FUA.bits())]
        );
        // The devices now hold what the reads showed, and IO passes straight through.
        a.read(4096, &mut buf).unwrap();
        assert_eq!(&buf[512..1024], &[3u8; 512][..]);
        ga.write(8192, &[6u8; 512], WriteFlags::NONE).unwrap();
        assert_eq!(a.op_count(), 4);
        assert_eq!(gate.held_bytes(), 0);
    }

    #[test]
    fn a_queued_write_is_held_and_completes_at_once_until_release() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let file =
            Arc::new(crate::FileDevice::open(&path, crate::FileDeviceOptions::default()).unwrap());
        let gate = Gate::new();
        let g = gate.wrap(Arc::clone(&file) as Arc<dyn Device>);
        let Some(mut q) = g.write_queue(4) else {
            // No io_uring here: the log and AIL then write through `write`, tested above.
            return;
        };
        let part = |tag, byte| {
            let mut buf = AlignedBuf::zeroed(4096);
            buf.fill(byte);
            QueuedBuf {
                tag,
                buf,
                range: 0..4096,
            }
        };
        q.submit(8192, vec![part(1, 7), part(2, 8)]).unwrap();
        assert_eq!(q.in_flight(), 2);
        let done = q.complete(true).unwrap();
        assert_eq!(done.iter().map(|w| w.tag).collect::<Vec<_>>(), vec![1, 2]);
        assert!(done.iter().all(|w| w.result.is_ok()));
        assert_eq!(std::fs::read(&path).unwrap(), vec![0u8; 1 << 20]);
        gate.release().unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert!(on_disk[8192..12288].iter().all(|&b| b == 7));
        assert!(on_disk[12288..16384].iter().all(|&b| b == 8));
        // Open: the queue writes through.
        q.submit(0, vec![part(3, 9)]).unwrap();
        let mut got = Vec::new();
        while got.is_empty() {
            got = q.complete(true).unwrap();
        }
        assert_eq!(got[0].tag, 3);
        assert!(std::fs::read(&path).unwrap()[..4096]
            .iter()
            .all(|&b| b == 9));
    }

    #[test]
    fn a_gate_never_released_writes_nothing() {
        let a = recording(1 << 20);
        let gate = Gate::new();
        let ga = gate.wrap(Arc::clone(&a) as Arc<dyn Device>);
        ga.write(0, &[1u8; 4096], WriteFlags::FUA).unwrap();
        ga.flush().unwrap();
        assert!(
            ga.write(100, &[1u8; 512], WriteFlags::NONE).is_err(),
            "unaligned"
        );
        drop(ga);
        drop(gate);
        assert_eq!(a.op_count(), 0);
        let mut buf = vec![7u8; 4096];
        a.read(0, &mut buf).unwrap();
        assert_eq!(buf, vec![0u8; 4096]);
    }
}
