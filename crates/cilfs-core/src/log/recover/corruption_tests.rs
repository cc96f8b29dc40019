//! Recovery on corrupted logs: bit flips, truncation, zeroed sectors, wrong cycle stamps and pure
//! garbage never panic; whatever is damaged ends the log, and every checkpoint that lies wholly
//! before the first damaged sector is still recovered, exactly as written. A checkpoint that lies
//! wholly past the last damaged sector makes the end `Damaged`, naming it: damage is never taken
//! for a torn end when committed checkpoints follow it.

#![allow(clippy::unwrap_used)]

use super::{scan_log, LogEnd, LogRegion, RecoveryError};
use crate::log::item_format::{decode_item, encode_buf_item, BufImage};
use crate::log::{LogSpace, Lsn};
use cilfs_device::{Device, SimDevice, WriteFlags};
use proptest::prelude::*;
use std::sync::Arc;

const LOG_BYTES: u64 = 256 * 1024;
const SECTORS: u64 = LOG_BYTES / 512;

struct Written {
    dev: Arc<SimDevice>,
    /// Per checkpoint: its items and the sector just past its commit record.
    checkpoints: Vec<(Vec<BufImage>, u64)>,
    end: u64,
}

/// Checkpoints of the given item sizes, written from sector 0; every record keeps the first
/// record as its tail, so recovery must return all of them.
fn build(sizes: &[Vec<u16>]) -> Written {
    let dev = Arc::new(SimDevice::new(LOG_BYTES, 1));
    let mut w = crate::log::tests::writer(&dev, Lsn::new(1, 0), 1);
    let mut checkpoints = Vec::new();
    for (seq, ck) in sizes.iter().enumerate() {
        let raw: Vec<Vec<u8>> = ck
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let data = vec![seq as u8 ^ i as u8; 4096];
                encode_buf_item(
                    i as u64,
                    false,
                    None,
                    &data,
                    &[(7, u32::from(n).clamp(1, 4000))],
                )
            })
            .collect();
        w.write_checkpoint(seq as u64 + 1, raw.iter(), |_, _| Lsn::new(1, 0))
            .unwrap();
        let images = raw.iter().map(|r| decode_item(r, 4096).unwrap()).collect();
        checkpoints.push((images, u64::from(w.head().block())));
    }
    let end = u64::from(w.head().block());
    Written {
        dev,
        checkpoints,
        end,
    }
}

fn sizes() -> impl Strategy<Value = Vec<Vec<u16>>> {
    // Up to ~180 KiB in all, so the log (256 KiB) does not wrap over the tail.
    proptest::collection::vec(proptest::collection::vec(1u16..4000, 0..6), 1..8)
}

/// Scans the damaged log; `first_bad` and `last_bad` are the first and last damaged sectors.
fn check(w: &Written, first_bad: u64, last_bad: u64) -> Result<(), TestCaseError> {
    let region = LogRegion {
        dev: &*w.dev,
        offset: 0,
        space: LogSpace::new(LOG_BYTES),
    };
    match scan_log(&region, 4096) {
        Err(RecoveryError::Corrupt { offset, .. }) => {
            prop_assert!(offset < LOG_BYTES);
        }
        Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
        Ok(scan) => {
            for (i, ck) in scan.checkpoints.iter().enumerate() {
                prop_assert!(i < w.checkpoints.len(), "more checkpoints than written");
                prop_assert_eq!(&ck.items, &w.checkpoints[i].0, "checkpoint {} differs", i);
            }
            let intact = w
                .checkpoints
                .iter()
                .filter(|(_, end)| *end <= first_bad)
                .count();
            prop_assert!(
                scan.checkpoints.len() >= intact,
                "{} checkpoints lie before sector {} but only {} recovered",
                intact,
                first_bad,
                scan.checkpoints.len()
            );
            // Checkpoints (by sequence) whose records all lie past the last damaged sector.
            let past: Vec<u64> = (1..w.checkpoints.len())
                .filter(|&i| w.checkpoints[i - 1].1 > last_bad)
                .map(|i| i as u64 + 1)
                .collect();
            match &scan.end {
                LogEnd::Damaged { lost, .. } => {
                    for seq in &past {
                        prop_assert!(
                            lost.contains(seq),
                            "checkpoint {} past the damage not named lost: {:?}",
                            seq,
                            lost
                        );
                    }
                }
                end => prop_assert!(
                    past.is_empty() || scan.checkpoints.len() == w.checkpoints.len(),
                    "checkpoints {:?} lie past the damage (sectors {}..={}) but the end is {:?}",
                    past,
                    first_bad,
                    last_bad,
                    end
                ),
            }
        }
    }
    Ok(())
}

fn rewrite(dev: &SimDevice, sector: u64, f: impl FnOnce(&mut [u8])) {
    let mut s = [0u8; 512];
    dev.read(sector * 512, &mut s).unwrap();
    f(&mut s);
    dev.write(sector * 512, &s, WriteFlags::NONE).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bit_flips(sz in sizes(), flips in proptest::collection::vec((any::<u64>(), 0u8..8), 1..4)) {
        let w = build(&sz);
        let (mut first, mut last) = (u64::MAX, 0);
        for (pos, bit) in flips {
            let byte = pos % (w.end * 512);
            first = first.min(byte / 512);
            last = last.max(byte / 512);
            rewrite(&w.dev, byte / 512, |s| s[(byte % 512) as usize] ^= 1 << bit);
        }
        check(&w, first, last)?;
    }

    #[test]
    fn truncation(sz in sizes(), at in any::<u64>()) {
        let w = build(&sz);
        let from = at % w.end;
        for s in from..w.end {
            rewrite(&w.dev, s, |b| b.fill(0));
        }
        check(&w, from, w.end)?;
    }

    #[test]
    fn zeroed_sectors(sz in sizes(), which in proptest::collection::vec(any::<u64>(), 1..5)) {
        let w = build(&sz);
        let (mut first, mut last) = (u64::MAX, 0);
        for x in which {
            let s = x % w.end;
            first = first.min(s);
            last = last.max(s);
            rewrite(&w.dev, s, |b| b.fill(0));
        }
        check(&w, first, last)?;
    }

    #[test]
    fn wrong_cycles(sz in sizes(), which in proptest::collection::vec((any::<u64>(), any::<u32>()), 1..5)) {
        let w = build(&sz);
        let (mut first, mut last) = (u64::MAX, 0);
        for (x, cycle) in which {
            let s = x % w.end;
            let cycle = if cycle == 1 { 2 } else { cycle };
            first = first.min(s);
            last = last.max(s);
            rewrite(&w.dev, s, |b| b[..4].copy_from_slice(&cycle.to_le_bytes()));
        }
        check(&w, first, last)?;
    }

    #[test]
    fn garbage_never_panics(seed in any::<u64>(), zero_first in any::<bool>()) {
        let dev = SimDevice::new(LOG_BYTES, 1);
        let mut rng = cilfs_device::rng::SimRng::new(seed);
        let mut buf = vec![0u8; LOG_BYTES as usize];
        for b in buf.iter_mut() {
            *b = rng.next_u64() as u8;
        }
        if zero_first {
            buf[..512].fill(0);
        }
        dev.write(0, &buf, WriteFlags::NONE).unwrap();
        let region = LogRegion { dev: &dev, offset: 0, space: LogSpace::new(LOG_BYTES) };
        let _ = scan_log(&region, 4096);
    }
}

/// Garbage that carries valid-looking cycle stamps everywhere still never panics.
#[test]
fn stamped_garbage_never_panics() {
    for seed in 0..32u64 {
        let dev = SimDevice::new(LOG_BYTES, 1);
        let mut rng = cilfs_device::rng::SimRng::new(seed);
        let mut buf = vec![0u8; LOG_BYTES as usize];
        for b in buf.iter_mut() {
            *b = rng.next_u64() as u8;
        }
        for s in 0..SECTORS as usize {
            buf[s * 512..s * 512 + 4].copy_from_slice(&1u32.to_le_bytes());
            if s % 3 == 0 {
                buf[s * 512 + 4..s * 512 + 8].copy_from_slice(b"CLRC");
            }
        }
        dev.write(0, &buf, WriteFlags::NONE).unwrap();
        let region = LogRegion {
            dev: &dev,
            offset: 0,
            space: LogSpace::new(LOG_BYTES),
        };
        let _ = scan_log(&region, 4096);
    }
}

/// Found by the fuzzer: a cycle stamp of u32::MAX made the next cycle overflow.
#[test]
fn maximal_cycle_stamp_is_an_error_not_an_overflow() {
    let dev = SimDevice::new(LOG_BYTES, 1);
    let mut s = [0u8; 512];
    s[..5].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff]);
    dev.write(0, &s, WriteFlags::NONE).unwrap();
    let region = LogRegion {
        dev: &dev,
        offset: 0,
        space: LogSpace::new(LOG_BYTES),
    };
    assert!(matches!(
        scan_log(&region, 4096),
        Err(RecoveryError::Corrupt { .. })
    ));
}

/// A block written back torn (its first sector, with a newer LSN stamp, on disk; a later sector
/// still old) must not count as "newer on disk": replay would then skip the logged image and
/// leave the torn block. The stamp's CRC covers the whole block. (Found by `crashtest fs`.)
#[test]
fn torn_block_with_a_newer_stamp_is_not_newer() {
    use crate::log::stamp::{read_lsn_stamp, write_lsn_stamp};
    use crate::log::Lsn;
    let uuid = [7u8; 16];
    let mut old = vec![1u8; 2048];
    write_lsn_stamp(&mut old, 16, Lsn::from_raw(100), &uuid);
    let mut new = vec![2u8; 2048];
    write_lsn_stamp(&mut new, 16, Lsn::from_raw(200), &uuid);
    assert_eq!(read_lsn_stamp(&new, 16, &uuid), Some(Lsn::from_raw(200)));
    let mut torn = new.clone();
    torn[512..].copy_from_slice(&old[512..]);
    assert_eq!(
        read_lsn_stamp(&torn, 16, &uuid),
        None,
        "a torn block has no valid stamp"
    );
    assert_eq!(
        read_lsn_stamp(&new, 16, &[8u8; 16]),
        None,
        "another filesystem's stamp"
    );
}
