//! The recording device rebuilds the device at any operation index.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

use cilfs_device::rng::SimRng;
use cilfs_device::{Device, RecordingDevice, SimDevice, SparseImage, Survival, WriteFlags};

const LEN: u64 = 256 * 1024;

/// Runs a seeded random workload, returning the live and stable images after each operation.
fn run(seed: u64, ops: usize) -> (RecordingDevice<SimDevice>, Vec<(SparseImage, SparseImage)>) {
    let rec = RecordingDevice::new(SimDevice::new(LEN, seed), SparseImage::new());
    let mut rng = SimRng::new(seed);
    let mut snapshots = vec![(SparseImage::new(), SparseImage::new())];
    for i in 0..ops {
        if rng.chance(1, 8) {
            rec.flush().unwrap();
        } else {
            let sectors = rng.below(16) as usize + 1;
            let sector = rng.below(LEN / 512 - sectors as u64);
            let mut flags = WriteFlags::NONE;
            if rng.chance(1, 6) {
                flags = flags | WriteFlags::PREFLUSH;
            }
            if rng.chance(1, 6) {
                flags = flags | WriteFlags::FUA;
            }
            let data = vec![(i % 251) as u8 + 1; sectors * 512];
            rec.write(sector * 512, &data, flags).unwrap();
        }
        snapshots.push((rec.inner().live_image(), rec.inner().stable_image()));
    }
    (rec, snapshots)
}

#[test]
fn image_at_n_equals_live_image_at_n() {
    for seed in 0..8 {
        let (rec, snaps) = run(seed, 300);
        assert_eq!(rec.op_count(), 300);
        for (n, (live, _)) in snaps.iter().enumerate() {
            let rebuilt = rec.image_at(n);
            assert_eq!(
                &rebuilt,
                live,
                "seed {seed} op {n}: pages {:?}",
                rebuilt.differing_pages(live)
            );
        }
    }
}

#[test]
fn losing_every_volatile_write_gives_the_stable_image() {
    for seed in 0..8 {
        let (rec, snaps) = run(seed, 200);
        for (n, (_, stable)) in snaps.iter().enumerate() {
            assert_eq!(
                &rec.crash_image(n, &mut |_, _| Survival::Lost),
                stable,
                "seed {seed} op {n}"
            );
        }
    }
}

#[test]
fn durability_points_and_volatile_sets_are_reported() {
    let rec = RecordingDevice::new(SimDevice::new(LEN, 0), SparseImage::new());
    rec.write(0, &[1; 1024], WriteFlags::NONE).unwrap();
    rec.write(1024, &[2; 512], WriteFlags::NONE).unwrap();
    rec.write(4096, &[3; 512], WriteFlags::PREFLUSH | WriteFlags::FUA)
        .unwrap();
    rec.write(8192, &[4; 512], WriteFlags::NONE).unwrap();
    rec.flush().unwrap();
    let points: Vec<bool> = rec
        .ops()
        .iter()
        .map(|op| op.is_durability_point())
        .collect();
    assert_eq!(points, [false, false, true, false, true]);
    assert_eq!(rec.volatile_at(2), vec![2, 1]);
    assert_eq!(rec.volatile_at(3), Vec::<usize>::new());
    assert_eq!(rec.volatile_at(4), vec![1]);
    assert_eq!(rec.volatile_at(5), Vec::<usize>::new());
    // Tearing the first write at op 2: only its second sector lands.
    let img = rec.crash_image(2, &mut |i, n| {
        if i == 0 {
            Survival::Torn((0..n).map(|s| s == 1).collect())
        } else {
            Survival::Lost
        }
    });
    let mut buf = [0u8; 1536];
    img.read(0, &mut buf);
    assert!(buf[..512].iter().all(|&b| b == 0));
    assert!(buf[512..1024].iter().all(|&b| b == 1));
    assert!(buf[1024..].iter().all(|&b| b == 0));
}
