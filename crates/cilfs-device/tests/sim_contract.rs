//! The simulated device's crash contract (docs/journal.md section 2): what a power cut may and may not
//! do to completed writes.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

use cilfs_device::{CrashOptions, Device, SimDevice, SparseImage, Survival, WriteFlags};
use proptest::prelude::*;

const LEN: u64 = 1 << 20;
const SECTOR: usize = 512;

fn pattern(byte: u8, sectors: usize) -> Vec<u8> {
    vec![byte; sectors * SECTOR]
}

fn read(img: &SparseImage, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    img.read(offset, &mut buf);
    buf
}

fn torn() -> CrashOptions {
    CrashOptions { torn_writes: true }
}

#[test]
fn unflushed_write_may_vanish() {
    let mut lost = 0;
    let mut kept = 0;
    for seed in 0..64 {
        let dev = SimDevice::new(LEN, seed);
        dev.write(4096, &pattern(7, 8), WriteFlags::NONE).unwrap();
        let crashed = dev.crash(CrashOptions::default()).live_image();
        match read(&crashed, 4096, 4096) {
            d if d == pattern(7, 8) => kept += 1,
            d if d == vec![0; 4096] => lost += 1,
            d => panic!("seed {seed}: neither old nor new data: {:?}", &d[..8]),
        }
    }
    assert!(lost > 0, "no seed lost the unflushed write");
    assert!(kept > 0, "no seed kept the unflushed write");
    // And an explicit choice can always drop it.
    let dev = SimDevice::new(LEN, 1);
    dev.write(0, &pattern(9, 1), WriteFlags::NONE).unwrap();
    let img = dev.crash_with(&mut |_, _| Survival::Lost).live_image();
    assert_eq!(img, SparseImage::new());
}

#[test]
fn flushed_and_fua_writes_never_vanish() {
    for seed in 0..200 {
        let dev = SimDevice::new(LEN, seed);
        dev.write(0, &pattern(1, 8), WriteFlags::NONE).unwrap();
        dev.flush().unwrap();
        dev.write(8192, &pattern(2, 4), WriteFlags::FUA).unwrap();
        // Volatile noise around them.
        dev.write(16384, &pattern(3, 8), WriteFlags::NONE).unwrap();
        let img = dev.crash(torn()).live_image();
        assert_eq!(
            read(&img, 0, 4096),
            pattern(1, 8),
            "seed {seed}: flushed write lost"
        );
        assert_eq!(
            read(&img, 8192, 2048),
            pattern(2, 4),
            "seed {seed}: FUA write lost"
        );
    }
}

#[test]
fn preflush_write_makes_earlier_completed_writes_stable() {
    let dev = SimDevice::new(LEN, 5);
    dev.write(0, &pattern(1, 8), WriteFlags::NONE).unwrap();
    dev.write(4096, &pattern(2, 8), WriteFlags::NONE).unwrap();
    // PREFLUSH without FUA: the earlier writes become stable, this one stays volatile.
    dev.write(8192, &pattern(3, 8), WriteFlags::PREFLUSH)
        .unwrap();
    assert_eq!(dev.volatile_writes(), 1);
    let img = dev.crash_with(&mut |_, _| Survival::Lost).live_image();
    assert_eq!(read(&img, 0, 4096), pattern(1, 8));
    assert_eq!(read(&img, 4096, 4096), pattern(2, 8));
    assert_eq!(read(&img, 8192, 4096), vec![0; 4096]);
    assert_eq!(dev.stats().flushes_issued, 1);
    assert_eq!(dev.stats().preflush_writes, 1);
}

#[test]
fn flush_with_nothing_volatile_is_elided() {
    let dev = SimDevice::new(LEN, 5);
    dev.flush().unwrap();
    dev.write(0, &pattern(1, 1), WriteFlags::FUA).unwrap();
    dev.write(512, &pattern(1, 1), WriteFlags::PREFLUSH | WriteFlags::FUA)
        .unwrap();
    dev.write(1024, &pattern(1, 1), WriteFlags::NONE).unwrap();
    dev.flush().unwrap();
    let s = dev.stats();
    assert_eq!((s.flushes_issued, s.flushes_elided), (1, 2));
    assert_eq!(s.fua_writes, 2);
}

fn workload(dev: &SimDevice) {
    for i in 0..40u64 {
        let flags = match i % 7 {
            3 => WriteFlags::FUA,
            5 => WriteFlags::PREFLUSH,
            _ => WriteFlags::NONE,
        };
        dev.write((i * 3 % 64) * 512, &pattern(i as u8 + 1, 2), flags)
            .unwrap();
        if i % 11 == 10 {
            dev.flush().unwrap();
        }
    }
}

#[test]
fn crash_image_is_a_pure_function_of_seed_and_operations() {
    for seed in 0..32 {
        let a = SimDevice::new(LEN, seed);
        let b = SimDevice::new(LEN, seed);
        workload(&a);
        workload(&b);
        assert_eq!(
            a.crash(torn()).live_image(),
            b.crash(torn()).live_image(),
            "seed {seed}"
        );
        // Asking twice does not change the answer either.
        assert_eq!(
            a.crash(torn()).live_image(),
            a.crash(torn()).live_image(),
            "seed {seed}"
        );
    }
    // Different seeds do explore different outcomes.
    let images: std::collections::HashSet<Vec<u8>> = (0..32)
        .map(|seed| {
            let d = SimDevice::new(LEN, seed);
            workload(&d);
            read(&d.crash(torn()).live_image(), 0, 64 * 512)
        })
        .collect();
    assert!(images.len() > 1);
}

#[test]
fn torn_sectors_only_appear_inside_volatile_writes() {
    let mut saw_torn = false;
    for seed in 0..200 {
        let dev = SimDevice::new(LEN, seed);
        dev.write(0, &pattern(1, 16), WriteFlags::FUA).unwrap();
        dev.write(16 * 512, &pattern(2, 16), WriteFlags::NONE)
            .unwrap();
        dev.flush().unwrap();
        // The only volatile write: sectors 4..12 with byte 9.
        dev.write(4 * 512, &pattern(9, 8), WriteFlags::NONE)
            .unwrap();
        let img = dev.crash(torn()).live_image();
        let mut new_sectors = 0;
        for s in 0..40usize {
            let got = read(&img, (s * SECTOR) as u64, SECTOR);
            let stable = match s {
                0..16 => 1,
                16..32 => 2,
                _ => 0,
            };
            if (4..12).contains(&s) && got == vec![9; SECTOR] {
                new_sectors += 1;
            } else {
                assert_eq!(got, vec![stable; SECTOR], "seed {seed}: sector {s} changed");
            }
        }
        saw_torn |= new_sectors > 0 && new_sectors < 8;
    }
    assert!(saw_torn, "no seed tore the volatile write");
}

#[test]
fn injected_fault_fails_the_kth_operation() {
    let dev = SimDevice::new(LEN, 0);
    dev.inject_fault(2, cilfs_device::FaultMode::Once);
    dev.write(0, &pattern(1, 1), WriteFlags::NONE).unwrap();
    dev.flush().unwrap();
    let err = dev
        .write(512, &pattern(2, 1), WriteFlags::NONE)
        .unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    dev.write(512, &pattern(3, 1), WriteFlags::NONE).unwrap();

    let dev = SimDevice::new(LEN, 0);
    dev.inject_fault(1, cilfs_device::FaultMode::FromThenOn);
    dev.flush().unwrap();
    assert!(dev.flush().is_err());
    assert!(dev.read(0, &mut [0; 512]).is_err());
}

#[test]
fn unaligned_and_out_of_range_io_is_refused() {
    let dev = SimDevice::new(LEN, 0);
    assert!(dev.write(100, &[0; 512], WriteFlags::NONE).is_err());
    assert!(dev.write(0, &[0; 100], WriteFlags::NONE).is_err());
    assert!(dev.write(LEN, &[0; 512], WriteFlags::NONE).is_err());
    assert!(dev.read(LEN - 512, &mut [0; 1024]).is_err());
    assert_eq!(dev.stats().writes, 0);
}

/// One operation of the property test: a write of `sectors` sectors at `sector`, or a flush.
#[derive(Debug, Clone)]
enum Op {
    Write {
        sector: u8,
        sectors: u8,
        preflush: bool,
        fua: bool,
    },
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..32, 1u8..6, any::<bool>(), any::<bool>())
            .prop_map(|(sector, sectors, preflush, fua)| Op::Write { sector, sectors, preflush, fua }),
        1 => Just(Op::Flush),
    ]
}

proptest! {
    /// Every crash image holds every stable write: each sector shows either its newest stable
    /// version or a version written after it that was still volatile.
    #[test]
    fn every_crash_image_holds_every_stable_write(
        ops in proptest::collection::vec(op(), 1..60),
        seed in any::<u64>(),
        torn in any::<bool>(),
    ) {
        const SECTORS: usize = 40;
        let dev = SimDevice::new(SECTORS as u64 * 512, seed);
        // Per sector: the stable byte and the volatile bytes written since.
        let mut stable = [0u8; SECTORS];
        let mut pending: Vec<Vec<u8>> = vec![Vec::new(); SECTORS];
        let flush_model = |stable: &mut [u8; SECTORS], pending: &mut Vec<Vec<u8>>| {
            for (s, p) in stable.iter_mut().zip(pending.iter_mut()) {
                if let Some(&last) = p.last() { *s = last; }
                p.clear();
            }
        };
        for (i, op) in ops.iter().enumerate() {
            let byte = (i % 250) as u8 + 1;
            match *op {
                Op::Flush => { dev.flush().unwrap(); flush_model(&mut stable, &mut pending); }
                Op::Write { sector, sectors, preflush, fua } => {
                    let start = usize::from(sector);
                    let end = (start + usize::from(sectors)).min(SECTORS);
                    let mut flags = WriteFlags::NONE;
                    if preflush { flags = flags | WriteFlags::PREFLUSH; flush_model(&mut stable, &mut pending); }
                    if fua { flags = flags | WriteFlags::FUA; }
                    dev.write((start * SECTOR) as u64, &pattern(byte, end - start), flags).unwrap();
                    for s in start..end {
                        if fua { stable[s] = byte; pending[s].clear(); } else { pending[s].push(byte); }
                    }
                }
            }
        }
        let img = dev.crash(CrashOptions { torn_writes: torn }).live_image();
        for s in 0..SECTORS {
            let got = read(&img, (s * SECTOR) as u64, SECTOR);
            let b = got[0];
            prop_assert!(got.iter().all(|&x| x == b), "sector {} mixes versions", s);
            prop_assert!(b == stable[s] || pending[s].contains(&b),
                "sector {}: got {}, stable {}, volatile {:?}", s, b, stable[s], pending[s]);
        }
    }
}

#[test]
fn a_flush_reports_whether_anything_was_volatile() {
    let dev = SimDevice::new(LEN, 1);
    assert!(!dev.flush_reporting().unwrap());
    dev.write(0, &pattern(1, 1), WriteFlags::NONE).unwrap();
    assert!(dev.flush_reporting().unwrap());
    assert_eq!(dev.volatile_writes(), 0);
    assert!(!dev.flush_reporting().unwrap());
}
