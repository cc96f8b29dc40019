#![allow(clippy::unwrap_used)]

use super::*;
use crate::buf::{CounterChange, LateWrite};
use crate::format::superblock::SbLog;
use crate::log::FlushPolicy;
use crate::mkfs::{write_filesystem, Layout};
use cilfs_device::{CrashOptions, SimDevice, Survival};

pub(super) const BS: u32 = 1024;

/// A tiny filesystem: 4 MiB data device with a 256 KiB internal log.
fn tiny_layout(log_blocks: u64) -> Layout {
    Layout {
        uuid: [0x11; 16],
        block_size: BS,
        data_blocks: 4096,
        log: SbLog::Internal { start: 1 },
        log_blocks,
        backups: false,
    }
}

pub(super) fn tiny_cfg(policy: FlushPolicy) -> JournalConfig {
    JournalConfig {
        log: LogConfig {
            logbufs: 2,
            logbsize: 16 * 1024,
            policy,
        },
        cil_limit: Some(8 * 1024),
        push_mode: PushMode::Inline,
        // 64 buffers: tests touching hundreds of blocks exercise eviction.
        cache_bytes_max: Some(64 * 1024),
        log_force_interval: None,
        cil_sharding: Default::default(),
    }
}

pub(super) fn fresh(seed: u64) -> Arc<SimDevice> {
    let dev = Arc::new(SimDevice::new(4096 * u64::from(BS), seed));
    write_filesystem(&*dev, None, &tiny_layout(256), &mut |_, _| {}).unwrap();
    dev
}

pub(super) fn open(dev: &Arc<SimDevice>, policy: FlushPolicy) -> Arc<Journal> {
    Journal::open(dev.clone() as Arc<dyn Device>, None, tiny_cfg(policy)).unwrap()
}

/// A journal in background mode (push worker and AIL thread), `tune` applied to the tiny config.
fn open_background(dev: &Arc<SimDevice>, tune: impl FnOnce(&mut JournalConfig)) -> Arc<Journal> {
    let mut cfg = tiny_cfg(FlushPolicy::Reduced);
    cfg.push_mode = PushMode::Background;
    tune(&mut cfg);
    Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap()
}

pub(super) fn write_block(j: &Journal, blkno: u64, byte: u8) -> u64 {
    let mut tx = j.begin(Reservation::for_buffers(1, BS)).unwrap();
    let b = tx.buf(blkno).unwrap();
    tx.write(b, 100, &[byte; 200]);
    tx.commit().unwrap()
}

/// The device after a crash that kept the volatile writes whose bits are set in `mask`.
fn crashed_keeping(dev: &SimDevice, mask: u32) -> Arc<SimDevice> {
    Arc::new(dev.crash_with(&mut |i, _| {
        if mask & (1 << i) != 0 {
            Survival::Kept
        } else {
            Survival::Lost
        }
    }))
}

fn read_byte(dev: &SimDevice, blkno: u64) -> u8 {
    let mut b = vec![0u8; BS as usize];
    dev.read(blkno * u64::from(BS), &mut b).unwrap();
    b[150]
}

#[test]
fn forced_commit_survives_any_crash() {
    for seed in 0..20 {
        let dev = fresh(seed);
        let j = open(&dev, FlushPolicy::Reduced);
        let seq = write_block(&j, 300, 7);
        j.force(seq).unwrap();
        write_block(&j, 301, 8); // not forced: may or may not survive
        let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
        drop(j);
        let j2 = open(&crashed, FlushPolicy::Reduced);
        assert!(!j2.recovery_report().was_clean);
        assert_eq!(read_byte(&crashed, 300), 7, "seed {seed}");
        assert!(matches!(read_byte(&crashed, 301), 0 | 8));
    }
}

#[test]
fn unforced_commits_are_all_or_nothing_per_checkpoint() {
    let dev = fresh(3);
    let j = open(&dev, FlushPolicy::Reduced);
    let mut tx = j.begin(Reservation::for_buffers(2, BS)).unwrap();
    let a = tx.buf(400).unwrap();
    let b = tx.buf(401).unwrap();
    tx.write(a, 0, &[1; 512]);
    tx.write(b, 0, &[1; 512]);
    let seq = tx.commit().unwrap();
    j.push(seq).unwrap();
    // Every fate of the volatile writes gives both blocks or neither.
    let n = dev.volatile_writes();
    for mask in 0..(1u32 << n.min(10)) {
        let crashed = crashed_keeping(&dev, mask);
        let _j = open(&crashed, FlushPolicy::Reduced);
        let (x, y) = (read_byte(&crashed, 400), read_byte(&crashed, 401));
        assert_eq!(x, y, "mask {mask:b}: half a transaction");
    }
}

#[test]
fn clean_unmount_replays_nothing_and_keeps_data() {
    let dev = fresh(1);
    let j = open(&dev, FlushPolicy::Reduced);
    for i in 0..50 {
        write_block(&j, 300 + i % 7, i as u8 + 1);
    }
    j.unmount().unwrap();
    drop(j);
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    let j2 = open(&crashed, FlushPolicy::Reduced);
    let r = j2.recovery_report();
    assert!(r.was_clean);
    assert_eq!(r.checkpoints_replayed, 0);
    for k in 0..7u64 {
        let last = (0..50u64).filter(|i| i % 7 == k).max().unwrap();
        assert_eq!(read_byte(&crashed, 300 + k), last as u8 + 1);
    }
    assert_eq!(j2.superblock().unclean_epoch, 0);
}

/// `norecovery`: the log is left alone and the blocks read as written in place; over an
/// overlay nothing reaches the device, and a later normal open still replays everything.
#[test]
fn open_norecovery_shows_blocks_as_written_in_place_and_keeps_the_log() {
    let dev = fresh(4);
    let j = open(&dev, FlushPolicy::Reduced);
    let seq = write_block(&j, 300, 7);
    j.force(seq).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: false }));
    drop(j);
    let before = crashed.live_image();
    let overlay = Arc::new(cilfs_device::OverlayDevice::new(
        crashed.clone() as Arc<dyn Device>
    ));
    let j = Journal::open_norecovery(
        overlay.clone() as Arc<dyn Device>,
        None,
        tiny_cfg(FlushPolicy::Reduced),
    )
    .unwrap();
    let r = j.recovery_report().clone();
    assert!(!r.was_clean);
    assert_eq!((r.checkpoints_replayed, r.checkpoints_skipped), (0, 1));
    assert_eq!(j.buf(300).unwrap().lock().data[150], 0, "not replayed");
    j.unmount().unwrap();
    drop(j);
    assert!(
        overlay.overlay_bytes() > 0,
        "the journal wrote, into the overlay"
    );
    assert!(crashed.live_image() == before, "nothing reached the device");
    let j = open(&crashed, FlushPolicy::Reduced);
    assert_eq!(j.recovery_report().checkpoints_replayed, 1);
    assert_eq!(read_byte(&crashed, 300), 7);
}

#[test]
fn relogging_writes_an_item_once_per_checkpoint() {
    let dev = fresh(2);
    let j = open(&dev, FlushPolicy::Reduced);
    for i in 0..5000u32 {
        write_block(&j, 300 + u64::from(i % 10), i as u8);
    }
    j.force_all().unwrap();
    let s = j.stats();
    assert!(s.log.checkpoints >= 1);
    assert!(
        s.items_logged <= s.log.checkpoints * 10,
        "{} images in {} checkpoints",
        s.items_logged,
        s.log.checkpoints
    );
}

#[test]
fn log_wraps_many_times_and_recovers() {
    for policy in [FlushPolicy::Reduced, FlushPolicy::Legacy] {
        let dev = fresh(9);
        let j = open(&dev, policy);
        for i in 0..3000u64 {
            let seq = write_block(&j, 300 + i % 300, (i % 251) as u8 + 1);
            if i % 50 == 0 {
                j.force(seq).unwrap();
            }
        }
        j.force_all().unwrap();
        let s = j.stats();
        assert!(
            s.log.log_bytes > 2 * 256 * 1024,
            "log did not wrap: {} bytes",
            s.log.log_bytes
        );
        let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
        drop(j);
        let _j2 = open(&crashed, policy);
        for k in 0..300u64 {
            let last = (0..3000u64).filter(|i| i % 300 == k).max().unwrap();
            assert_eq!(
                read_byte(&crashed, 300 + k),
                (last % 251) as u8 + 1,
                "{policy} block {k}"
            );
        }
    }
}

/// One forced checkpoint of 40 whole blocks (several iclogs): device stats before and after,
/// and the iclogs written.
pub(super) fn forced_multi_iclog_checkpoint(
    policy: FlushPolicy,
) -> (cilfs_device::IoStats, cilfs_device::IoStats, u64) {
    let dev = fresh(4);
    let j = open(&dev, policy);
    let before = dev.stats();
    let mut tx = j.begin(Reservation::for_buffers(40, BS)).unwrap();
    for b in 0..40 {
        let r = tx.buf(500 + b).unwrap();
        tx.write(r, 0, &[3; 1024]);
    }
    let seq = tx.commit().unwrap();
    j.force(seq).unwrap();
    (before, dev.stats(), j.stats().log.iclog_writes)
}

#[test]
fn reduced_policy_flush_counts() {
    let (before, after, iclogs) = forced_multi_iclog_checkpoint(FlushPolicy::Reduced);
    assert!(iclogs >= 3, "{iclogs} iclogs");
    assert_eq!(after.fua_writes - before.fua_writes, 1);
    assert_eq!(after.preflush_writes - before.preflush_writes, 1);
    // Two flush points: before the first iclog (elided here: nothing was volatile) and the
    // commit iclog's PREFLUSH.
    let points = (after.flushes_issued + after.flushes_elided)
        - (before.flushes_issued + before.flushes_elided);
    assert_eq!(points, 2);
    assert_eq!(after.flushes_issued - before.flushes_issued, 1);
}

#[test]
fn legacy_policy_flags_every_iclog() {
    let (before, after, iclogs) = forced_multi_iclog_checkpoint(FlushPolicy::Legacy);
    assert!(iclogs >= 3, "{iclogs} iclogs");
    assert_eq!(after.fua_writes - before.fua_writes, iclogs);
    assert_eq!(after.preflush_writes - before.preflush_writes, iclogs);
}

/// Background pushes with iclogs in flight on the IO pool, four committing threads, forces:
/// every forced commit survives a crash, and the ring really had several iclogs in flight.
#[test]
fn background_mode_with_concurrent_iclogs() {
    let dev = fresh(11);
    let mut cfg = tiny_cfg(FlushPolicy::Reduced);
    cfg.push_mode = PushMode::Background;
    cfg.log.logbufs = 4;
    cfg.cil_limit = Some(32 * 1024);
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let j = &j;
            s.spawn(move || {
                for i in 0..300u64 {
                    let blk = 300 + t * 50 + i % 50;
                    let mut tx = j.begin(Reservation::for_buffers(1, BS)).unwrap();
                    let b = tx.buf(blk).unwrap();
                    tx.write(b, 0, &[(i % 250) as u8 + 1; 1024]);
                    let seq = tx.commit().unwrap();
                    if i % 100 == 99 {
                        j.force(seq).unwrap();
                    }
                }
            });
        }
    });
    let s = j.stats();
    assert!(s.log.checkpoints > 3, "{:?}", s.log);
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(j);
    let _j2 = open(&crashed, FlushPolicy::Reduced);
    // The last force of each thread covered i = 299.
    for t in 0..4u64 {
        for k in 0..50u64 {
            let last = (0..300u64).filter(|i| i % 50 == k).max().unwrap();
            assert_eq!(
                read_byte(&crashed, 300 + t * 50 + k),
                (last % 250) as u8 + 1
            );
        }
    }
}

/// Background mode with everything concurrent (committers, the push worker, iclog IO threads,
/// the AIL thread writing back in parallel without the AIL lock, the log wrapping many times),
/// crashed at moments in the middle of it: every transaction writes one version into both
/// blocks of a pair, so a recovered pair that differs is a partial checkpoint or a lost
/// write back, and a version below the last one forced before the crash is a lost force.
#[test]
fn background_crashes_mid_run_keep_pairs_whole_and_forces() {
    for seed in [23, 24, 25, 26] {
        background_crash_round(seed, false, 40);
    }
}

/// The same through write queues whose writes land only when completed, late and newest first
/// (body iclogs and AIL write back are then in flight, and lost by a crash, for longer), over a
/// working set six times the log, and with the AIL thread's ahead passes paused, so that
/// reservations must wait for the AIL thread to free space. Each round first drives one
/// checkpoint written while the commit iclog of the one before is held in the device
/// ([`overlap_step_by_step`]), crashing it at each step: on the simulated device a commit write
/// takes microseconds, so whether the random phase overlaps any checkpoint at all is up to the
/// scheduler (some rounds on a loaded machine overlapped none).
#[test]
fn background_crashes_through_late_write_queues() {
    for seed in [27, 28, 29, 30] {
        background_crash_round(seed, true, 800);
    }
}

/// `pairs_per_thread` pairs of blocks per thread; with `queued`, through [`crate::util::test_queue::Queued`].
fn background_crash_round(seed: u64, queued: bool, pairs_per_thread: u64) {
    use std::sync::atomic::{AtomicU32, AtomicUsize};
    const THREADS: u64 = 2;
    let dev = fresh(seed);
    let mut cfg = tiny_cfg(FlushPolicy::Reduced);
    cfg.push_mode = PushMode::Background;
    cfg.log.logbufs = 4;
    cfg.cil_limit = Some(16 * 1024);
    let q = queued.then(|| {
        Arc::new(crate::util::test_queue::Queued::new(
            Arc::clone(&dev),
            false,
        ))
    });
    let data: Arc<dyn Device> = match &q {
        Some(q) => q.clone() as Arc<dyn Device>,
        None => dev.clone(),
    };
    if queued {
        // The worker's periodic force would push (or cover) on its own while the overlap is
        // driven step by step; a round takes seconds, so this changes nothing after it.
        cfg.log_force_interval = Some(std::time::Duration::from_secs(3600));
    }
    let j = Journal::open(data, None, cfg).unwrap();
    // A failed assertion must not leave the journal's threads held in the device (dropping
    // the journal joins them): declared after `j`, so dropped before it.
    let _open_holds = HoldsOpenOnDrop(q.as_deref());
    // Through the queues, only reservation relief frees log space, so that path must run
    // however the threads are scheduled.
    j.ahead_paused.store(queued, Ordering::Relaxed);
    let driven = match &q {
        Some(q) => overlap_step_by_step(&j, q, &dev, seed),
        None => Vec::new(),
    };
    let forced: Vec<AtomicU32> = (0..THREADS * pairs_per_thread)
        .map(|_| AtomicU32::new(0))
        .collect();
    let blocks = |pair: u64| (300 + 2 * pair, 301 + 2 * pair);
    let read_version = |d: &SimDevice, blk: u64| {
        let mut b = vec![0u8; BS as usize];
        d.read(blk * u64::from(BS), &mut b).unwrap();
        u32::from_le_bytes(b[500..504].try_into().unwrap())
    };
    let taken = AtomicUsize::new(0);
    let mut snapshots = Vec::new();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (j, forced, taken) = (&j, &forced, &taken);
                s.spawn(move || {
                    for v in 1..=2000u32 {
                        // Thread 0 waits for a snapshot three times, so that at least three
                        // are taken mid-run however few turns the snapshot loop gets.
                        if t == 0 && v % 500 == 0 {
                            let n = taken.load(Ordering::SeqCst);
                            while taken.load(Ordering::SeqCst) == n {
                                std::thread::sleep(std::time::Duration::from_millis(1));
                            }
                        }
                        let pair = t * pairs_per_thread + u64::from(v) % pairs_per_thread;
                        let (a, b) = blocks(pair);
                        let mut tx = j.begin(Reservation::for_buffers(2, BS)).unwrap();
                        let image: Vec<u8> = v.to_le_bytes().repeat(BS as usize / 4);
                        for blk in [a, b] {
                            let h = tx.buf(blk).unwrap();
                            tx.write(h, 0, &image);
                        }
                        let seq = tx.commit().unwrap();
                        if v % 50 == 0 {
                            j.force(seq).unwrap();
                            forced[pair as usize].fetch_max(v, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        while workers.iter().any(|w| !w.is_finished()) {
            // What was forced before the snapshot must be in it.
            let floor: Vec<u32> = forced.iter().map(|f| f.load(Ordering::SeqCst)).collect();
            snapshots.push((floor, dev.crash(CrashOptions { torn_writes: true })));
            taken.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    let st = j.stats();
    assert!(
        st.ail_writeback_bytes > 0 && st.log.log_bytes > 4 * 256 * 1024,
        "the run must write back and wrap the log: {st:?}"
    );
    assert!(
        !queued || st.log.reservation_waits > 0,
        "the run must wait for log space (the AIL thread's relief): {st:?}"
    );
    assert!(snapshots.len() >= 3, "only {} snapshots", snapshots.len());
    for (i, (floor, crashed)) in snapshots.into_iter().enumerate() {
        let crashed = Arc::new(crashed);
        let j2 = open(&crashed, FlushPolicy::Reduced);
        drop(j2);
        for pair in 0..THREADS * pairs_per_thread {
            let (a, b) = blocks(pair);
            let (va, vb) = (read_version(&crashed, a), read_version(&crashed, b));
            assert_eq!(
                va, vb,
                "seed {seed} snapshot {i}: pair {pair} split ({va} vs {vb})"
            );
            assert!(
                va >= floor[pair as usize],
                "seed {seed} snapshot {i}: pair {pair} at {va}, but {} was forced",
                floor[pair as usize]
            );
        }
        // Forced before the random phase, never written again: the tail must never pass
        // them before they are written back.
        for &(blk, byte) in &driven {
            assert_eq!(
                read_byte(&crashed, blk),
                byte,
                "seed {seed} snapshot {i}: block {blk} of the driven overlap lost"
            );
        }
    }
}

/// Opens the holds of a [`crate::util::test_queue::Queued`] when dropped.
struct HoldsOpenOnDrop<'a>(Option<&'a crate::util::test_queue::Queued>);

impl Drop for HoldsOpenOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.0 {
            q.open_holds();
        }
    }
}

/// Drives, through the holds of `q`, one checkpoint written while the commit iclog of the one
/// before is still being written, and crashes each step. Checkpoint 1's start flush is held
/// while the test fills the next context to S; then its commit iclog is held in the device, so
/// when the pusher looks, the commit is pending and the next context is due: it must write
/// checkpoint 2 (the start flush, held again, shows it did) without completing checkpoint 1,
/// even once checkpoint 2's body has landed (the pusher held after its wait for the body),
/// stamp no tail past checkpoint 1's start (its items are not in the AIL yet) and complete
/// both in order. Each step is reached through the one before with no other wait, so every run
/// takes the same path. Returns the blocks written and their bytes, all forced and, with the
/// AIL's ahead passes paused, not written back.
fn overlap_step_by_step(
    j: &Arc<Journal>,
    q: &crate::util::test_queue::Queued,
    dev: &SimDevice,
    seed: u64,
) -> Vec<(u64, u8)> {
    // Out of the random phase's pairs (blocks 300..3500).
    const FIRST: (u64, u8) = (3600, 0xa1);
    const SECOND: (u64, u8) = (3700, 0xb2);
    let s = j.limits.space_limit;
    let commit_block = |blk: u64, byte: u8| {
        let mut tx = j.begin(Reservation::for_buffers(1, BS)).unwrap();
        let h = tx.buf(blk).unwrap();
        tx.write(h, 0, &[byte; BS as usize]);
        tx.commit().unwrap()
    };
    let recovered = |crashed: SimDevice| {
        let crashed = Arc::new(crashed);
        drop(open(&crashed, FlushPolicy::Reduced));
        crashed
    };
    // Whether blocks `first..first + n` all read `byte` (0: never written).
    let all_read = |crashed: &SimDevice, first: u64, n: u64, byte: u8| {
        (first..first + n).all(|b| read_byte(crashed, b) == byte)
    };

    // Checkpoint 1: filled to S, so a push is requested; the pusher switches contexts and
    // stops in the flush that starts the checkpoint. (cil_bytes_max, not the context's size:
    // the pusher may switch contexts as soon as S is passed.)
    q.flush_hold.arm();
    let mut n1 = 0;
    while j.extra.cil_bytes_max.0.load(Ordering::Relaxed) < s {
        assert_eq!(commit_block(FIRST.0 + n1, FIRST.1), 1);
        n1 += 1;
    }
    assert!(q.flush_hold.wait_caught(1), "checkpoint 1 was never pushed");
    assert_eq!(j.current_seq(), 2);
    let forcer = {
        let j = Arc::clone(j);
        std::thread::spawn(move || j.force(1))
    };
    // Checkpoint 2, filled to S while the pusher holds the writer, so nothing switches it.
    let mut n2 = 0;
    while j.cil.stream_bytes() < s {
        assert_eq!(commit_block(SECOND.0 + n2, SECOND.1), 2);
        n2 += 1;
    }

    // Checkpoint 1 goes out; its commit iclog is held, the next start flush too.
    q.flagged_hold.arm();
    q.flush_hold.arm();
    q.flush_hold.release();
    assert!(
        q.flush_hold.wait_caught(2),
        "the pusher did not start checkpoint 2 while checkpoint 1's commit was in flight: {:?}",
        j.stats()
    );
    assert!(
        q.flagged_hold.wait_caught(1),
        "checkpoint 1's commit never issued"
    );
    assert_eq!(j.stats().overlapped_checkpoints, 1);
    assert_eq!(
        j.completed_seq(),
        0,
        "checkpoint 1 completed while its commit iclog was being written"
    );
    assert!(!forcer.is_finished(), "force(1) returned before its commit");
    // No commit record is on disk: whatever survives, nothing is replayed.
    let crashed = recovered(dev.crash(CrashOptions { torn_writes: true }));
    assert!(
        all_read(&crashed, FIRST.0, n1, 0) && all_read(&crashed, SECOND.0, n2, 0),
        "seed {seed}: a checkpoint recovered without its commit record"
    );

    // Checkpoint 2's body goes out and lands; the pusher stops before its commit iclog, which
    // must wait for checkpoint 1's commit, still held.
    q.waited_hold.arm();
    q.flush_hold.release();
    assert!(
        q.waited_hold.wait_caught(1),
        "checkpoint 2's body never went out"
    );
    assert_eq!(
        j.completed_seq(),
        0,
        "checkpoint 1 completed during checkpoint 2's body while its commit iclog was being written"
    );
    assert!(!forcer.is_finished(), "force(1) returned before its commit");
    let crashed = recovered(dev.crash(CrashOptions { torn_writes: true }));
    assert!(
        all_read(&crashed, FIRST.0, n1, 0) && all_read(&crashed, SECOND.0, n2, 0),
        "seed {seed}: a checkpoint recovered without its commit record (two bodies on disk)"
    );

    // Checkpoint 1's commit completes, then checkpoint 1; checkpoint 2's commit is held.
    q.flagged_hold.arm();
    q.flagged_hold.release();
    q.waited_hold.release();
    assert!(
        q.flagged_hold.wait_caught(2),
        "checkpoint 2's commit never issued"
    );
    forcer.join().unwrap().unwrap();
    assert_eq!(j.completed_seq(), 1);
    // Checkpoint 2's body records, on disk and kept, are the last records: recovery starts at
    // the tail they carry, which must not be past checkpoint 1 (not written back).
    let crashed = recovered(dev.crash_with(&mut |_, _| Survival::Kept));
    assert!(
        all_read(&crashed, FIRST.0, n1, FIRST.1),
        "seed {seed}: forced checkpoint 1 lost behind the tail checkpoint 2's body carries"
    );
    assert!(
        all_read(&crashed, SECOND.0, n2, 0),
        "seed {seed}: checkpoint 2 recovered without its commit record"
    );
    let crashed = recovered(dev.crash(CrashOptions { torn_writes: true }));
    assert!(
        all_read(&crashed, FIRST.0, n1, FIRST.1),
        "seed {seed}: forced checkpoint 1 lost"
    );

    // Both complete; a crash that loses every volatile write keeps both, recovering from the
    // tail checkpoint 2's commit record carries.
    q.flagged_hold.release();
    j.force(2).unwrap();
    let crashed = recovered(dev.crash_with(&mut |_, _| Survival::Lost));
    assert!(
        all_read(&crashed, FIRST.0, n1, FIRST.1) && all_read(&crashed, SECOND.0, n2, SECOND.1),
        "seed {seed}: forced checkpoints 1 and 2 not both recovered"
    );
    (FIRST.0..FIRST.0 + n1)
        .map(|b| (b, FIRST.1))
        .chain((SECOND.0..SECOND.0 + n2).map(|b| (b, SECOND.1)))
        .collect()
}

/// An IO error while writing the log shuts the journal down with an error, never a panic, and
/// what was forced before it is still recovered.
#[test]
fn log_io_error_shuts_down() {
    let dev = fresh(12);
    let j = open(&dev, FlushPolicy::Reduced);
    let seq = write_block(&j, 300, 9);
    j.force(seq).unwrap();
    j.buf(301).unwrap(); // read it in before the device dies
    dev.inject_fault(dev.op_count(), cilfs_device::FaultMode::FromThenOn);
    let seq = write_block(&j, 301, 10);
    assert!(j.force(seq).is_err());
    assert!(matches!(
        j.begin(Reservation::for_buffers(1, BS)),
        Err(JournalError::Shutdown)
    ));
    dev.clear_fault();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(j);
    let _j2 = open(&crashed, FlushPolicy::Reduced);
    assert_eq!(read_byte(&crashed, 300), 9);
}

/// After covering, a crash replays nothing and loses nothing; covering twice writes once.
#[test]
fn covered_log_replays_nothing() {
    let dev = fresh(21);
    let j = open(&dev, FlushPolicy::Reduced);
    for i in 0..40 {
        write_block(&j, 300 + i % 5, i as u8 + 1);
    }
    assert!(j.cover().unwrap());
    assert!(
        !j.cover().unwrap(),
        "an already covered log was covered again"
    );
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(j);
    let j2 = open(&crashed, FlushPolicy::Reduced);
    assert_eq!(j2.recovery_report().checkpoints_replayed, 0);
    assert!(
        !j2.recovery_report().was_clean,
        "covering is not a clean unmount"
    );
    for k in 0..5u64 {
        let last = (0..40u64).filter(|i| i % 5 == k).max().unwrap();
        assert_eq!(read_byte(&crashed, 300 + k), last as u8 + 1);
    }
}

/// Eight threads with mixed reservation sizes on a 256 KiB log that wraps constantly: no deadlock
/// (a watchdog fails the test instead of hanging CI), every reservation returned, and a crash
/// afterwards recovers the last forced values.
#[test]
fn reservations_under_contention_on_a_tiny_log() {
    let dev = fresh(31);
    let mut cfg = tiny_cfg(FlushPolicy::Reduced);
    cfg.push_mode = PushMode::Background;
    cfg.cil_limit = Some(16 * 1024);
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let j2 = Arc::clone(&j);
    let worker = std::thread::spawn(move || {
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let j = &j2;
                s.spawn(move || {
                    let mut rng = cilfs_device::rng::SimRng::new(t);
                    for i in 0..400u64 {
                        let n = 1 + rng.below(8);
                        let mut blocks: Vec<u64> =
                            (0..n).map(|_| 300 + t * 40 + rng.below(40)).collect();
                        blocks.sort_unstable();
                        blocks.dedup();
                        let mut tx = j
                            .begin(Reservation::for_buffers(blocks.len() as u64, BS))
                            .unwrap();
                        for &b in &blocks {
                            let r = tx.buf(b).unwrap();
                            tx.write(r, (i as usize * 64) % 960, &[(i % 250) as u8 + 1; 64]);
                        }
                        let seq = tx.commit().unwrap();
                        if i % 23 == 0 {
                            j.force(seq).unwrap();
                        }
                    }
                });
            }
        });
        let _ = done_tx.send(());
    });
    done_rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("reservations deadlocked: threads did not finish in 120 s");
    worker.join().unwrap();
    j.force_all().unwrap();
    let st = j.stats();
    assert!(
        st.log.log_bytes > 2 * 256 * 1024,
        "log did not wrap twice: {}",
        st.log.log_bytes
    );
    assert_eq!(
        j.space_in_use(),
        (0, 0),
        "reservations or CIL charges leaked"
    );
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: true }));
    drop(j);
    let j3 = open(&crashed, FlushPolicy::Reduced);
    assert!(j3.recovery_report().checkpoints_replayed > 0);
}

/// The default iclog geometry (8 x 256 KiB) shrinks to fit a small log; explicit settings that do
/// not fit are refused.
#[test]
fn default_log_config_fits_small_logs() {
    let dev = fresh(41);
    let cfg = JournalConfig::default();
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    write_block(&j, 300, 1);
    j.unmount().unwrap();
    drop(j);
    let mut explicit = JournalConfig::default();
    explicit.log.logbufs = 7;
    let err = Journal::open(dev as Arc<dyn Device>, None, explicit).unwrap_err();
    assert!(err.to_string().contains("too small"), "{err}");
}

/// Dropping the journal while its push worker is busy never hangs, whichever thread drops the
/// last reference.
#[test]
fn dropping_a_busy_background_journal_returns() {
    for seed in 0..20 {
        let dev = fresh(50 + seed);
        let mut cfg = tiny_cfg(FlushPolicy::Reduced);
        cfg.push_mode = PushMode::Background;
        cfg.cil_limit = Some(4096);
        let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
        for i in 0..30 {
            write_block(&j, 300 + i, 1);
        }
        drop(j);
    }
}

/// Relief that frees log space with the CIL empty must not let the head overwrite log that the
/// last stable record's tail still points at. The scenario: a full log whose last record carries
/// tail T0; relief writes back the oldest quarter and moves the tail with no record written; a
/// big checkpoint then wraps from the head into the old tail's sectors and the crash keeps only
/// part of it. Recovery starts from the last valid record's tail: if that is T0, it meets the
/// overwritten sectors and stops before the checkpoints whose items were never written back.
#[test]
fn relief_with_an_empty_cil_keeps_the_old_tail_readable() {
    let mut cases = 0;
    for stop_at in [6u64, 9, 12, 15, 18] {
        for fault_after in 0..8u64 {
            cases += relief_crash_case(stop_at * 1024, fault_after);
        }
    }
    assert!(
        cases > 0,
        "no case reached a crash with volatile log writes"
    );
}

/// Runs one case; returns how many crash images it recovered and checked.
fn relief_crash_case(stop_below: u64, fault_after: u64) -> usize {
    let dev = fresh(41);
    let j = open(&dev, FlushPolicy::Reduced);
    j.ahead_paused.store(true, Ordering::Relaxed);
    // Fill the log with forced one-block checkpoints until it is nearly full.
    let mut written: Vec<(u64, u8)> = Vec::new();
    let mut blk = 300u64;
    while j.grant.read(|g| g.available()) > stop_below {
        let v = (blk % 250) as u8 + 1;
        let seq = write_block(&j, blk, v);
        j.force(seq).unwrap();
        written.push((blk, v));
        blk += 1;
    }
    // What the AIL thread does for a waiting reservation.
    let safe = j.space.lock().safe_tail;
    let target = j.space_math.advance(safe, j.space_math.sectors / 4);
    j.free_space(target).unwrap();
    assert_eq!(
        j.extra.tail_records.load(Ordering::Relaxed),
        1,
        "relief did not move the tail with an empty CIL"
    );
    // One checkpoint of several iclogs from the head on.
    let mut tx = j.begin(Reservation::for_buffers(46, BS)).unwrap();
    for b in 0..46u64 {
        let h = tx.buf(3000 + b).unwrap();
        tx.write(h, 0, &[0xee; BS as usize]);
    }
    dev.inject_fault(
        dev.op_count() + fault_after,
        cilfs_device::FaultMode::FromThenOn,
    );
    let pushed = tx.commit().and_then(|seq| j.force(seq));
    dev.clear_fault();
    let n = dev.volatile_writes();
    if pushed.is_ok() || n == 0 || n > 6 {
        return 0;
    }
    let fates = |k: u32, i: usize, sectors: usize| match (k / 3u32.pow(i as u32)) % 3 {
        0 => Survival::Lost,
        1 => Survival::Kept,
        _ => Survival::Torn((0..sectors).map(|s| s >= sectors / 2).collect()),
    };
    let mut checked = 0;
    for k in 0..3u32.pow(n as u32) {
        let crashed = Arc::new(dev.crash_with(&mut |i, sectors| fates(k, i, sectors)));
        let j2 = Journal::open(
            crashed.clone() as Arc<dyn Device>,
            None,
            tiny_cfg(FlushPolicy::Reduced),
        )
        .unwrap_or_else(|e| panic!("stop {stop_below} fault {fault_after} fates {k}: {e}"));
        drop(j2);
        for &(b, v) in &written {
            assert_eq!(
                read_byte(&crashed, b),
                v,
                "stop {stop_below} fault {fault_after} fates {k}: forced block {b} lost"
            );
        }
        checked += 1;
    }
    checked
}

/// A forcer whose checkpoint is already complete returns while another pusher holds the writer
/// (under steady load the background pusher keeps it for a long run of checkpoints).
#[test]
fn force_of_a_completed_checkpoint_does_not_wait_for_the_writer() {
    let dev = fresh(43);
    let j = open(&dev, FlushPolicy::Reduced);
    let seq = write_block(&j, 300, 5);
    j.force(seq).unwrap();
    let busy = j.writer.lock();
    let (tx, rx) = std::sync::mpsc::channel();
    let j2 = j.clone();
    let t = std::thread::spawn(move || tx.send(j2.force(seq).is_ok()).unwrap());
    // A deadlock detector, not a timing assertion: the force needs no IO at all.
    let done = rx.recv_timeout(std::time::Duration::from_secs(20));
    drop(busy);
    t.join().unwrap();
    assert_eq!(done, Ok(true), "the force waited for the writer");
}

/// A committer that waits for the push to make room in the CIL is woken when the journal stops
/// taking commits (a kill, an unmount, a shutdown) and fails, rather than waiting for a push
/// that will never come; later commits fail at once.
#[test]
fn a_committer_waiting_for_room_fails_when_the_journal_is_killed() {
    let dev = fresh(44);
    let j = open_background(&dev, |c| c.cil_limit = Some(2 * 1024));
    // The push cannot switch contexts while the writer is held.
    let busy = j.writer.lock();
    let (tx, rx) = std::sync::mpsc::channel();
    let j2 = j.clone();
    let t = std::thread::spawn(move || {
        for i in 0u64.. {
            let r = j2
                .begin(Reservation::for_buffers(1, BS))
                .and_then(|mut tx| {
                    let b = tx.buf(300 + i % 50)?;
                    tx.write(b, 0, &[i as u8 | 1; 1000]);
                    tx.commit()
                });
            if let Err(e) = r {
                tx.send(e).unwrap();
                return;
            }
        }
    });
    while j.extra.cil_blocked_commits.load(Ordering::Relaxed) == 0 {
        std::thread::yield_now();
    }
    j.stop_commits();
    // A deadlock detector, not a timing assertion.
    let r = rx.recv_timeout(std::time::Duration::from_secs(60));
    assert!(matches!(r, Ok(JournalError::Shutdown)), "{r:?}");
    drop(busy);
    t.join().unwrap();
    j.kill();
    assert!(matches!(
        j.begin(Reservation::for_buffers(1, BS)),
        Err(JournalError::Shutdown)
    ));
}

/// The lock order is checked by the code: waiting for the log writer (rank 10) while holding
/// the log space lock (rank 17) is the reversal `writer_unless_done` avoids by only trying the
/// writer there, and a debug build stops it before it waits.
#[test]
#[cfg(debug_assertions)]
#[should_panic(
    expected = "lock order: log writer (rank 10) waited for while holding log space (rank 17)"
)]
fn waiting_for_the_writer_under_the_log_space_lock_breaks_the_order() {
    let dev = fresh(44);
    let j = open(&dev, FlushPolicy::Reduced);
    let _space = j.space();
    // A try never waits: allowed, and what the forcer does.
    drop(j.writer.try_lock());
    let _writer = j.writer.lock();
}

/// Forces ten blocks, opens transactions that hold all but `unit - 1` bytes of the log, and
/// starts a reservation of `unit`, which cannot fit until they go. Returns how much `count` rose
/// in the 300 ms it waited (long enough for a spinning waiter to go round thousands of times),
/// then lets the holders go and checks that the waiter gets its space.
fn count_while_kept_short(j: &Journal, count: impl Fn() -> u64) -> u64 {
    for i in 0..10 {
        let seq = write_block(j, 300 + i, 3);
        j.force(seq).unwrap();
    }
    let unit = Reservation::for_buffers(8, BS).unit_bytes;
    let capacity = j.capacity();
    let mut holders = Vec::new();
    let mut left = capacity - (unit - 1);
    while left > 0 {
        let take = left.min(capacity / 4);
        holders.push(j.begin(Reservation { unit_bytes: take }).unwrap());
        left -= take;
    }
    let before = count();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| j.begin(Reservation { unit_bytes: unit }).map(drop));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let during = count() - before;
        assert!(!waiter.is_finished(), "the waiter fit without waiting");
        drop(std::mem::take(&mut holders));
        waiter.join().unwrap().unwrap();
        during
    })
}

/// A reservation that other open transactions keep short, with nothing left to write back,
/// sleeps: relief does not write one empty checkpoint after another to chase the head.
#[test]
fn a_waiter_kept_short_by_other_reservations_writes_no_stream_of_tail_records() {
    let dev = fresh(44);
    let j = open(&dev, FlushPolicy::Reduced);
    let during = count_while_kept_short(&j, || j.counters.checkpoints.load(Ordering::Relaxed));
    assert!(
        during <= 2,
        "{during} checkpoints written while the waiter could not fit"
    );
}

/// A reservation that waits while the oldest item in the AIL is locked (a commit publishing
/// into it: no write back or push can move the tail) does not spin pushing empty contexts: it
/// waits for the holder, and gets its space once the lock is let go.
#[test]
fn a_waiter_behind_a_locked_item_does_not_spin() {
    let dev = fresh(45);
    let j = open(&dev, FlushPolicy::Reduced);
    let seq = write_block(&j, 300, 1);
    j.force(seq).unwrap();
    // The oldest logged block stays locked (as by a commit publishing into it): the tail
    // cannot pass it. A transaction alone no longer locks what it touches.
    let locked = j.buf(300).unwrap();
    let guard = locked.lock();
    let unit = Reservation::for_buffers(1, BS).unit_bytes;
    let mut blk = 400;
    while j.grant.read(|g| g.available()) >= 4 * unit {
        let seq = write_block(&j, blk, 2);
        j.force(seq).unwrap();
        blk = 400 + (blk - 399) % 200;
    }
    let (seq_before, seq_during) = std::thread::scope(|s| {
        let before = j.current_seq();
        // More than the log holds: with the tail stuck it must wait for space.
        let filler = s.spawn(|| {
            for k in 0..2000 {
                write_block(&j, 700 + k % 100, 3);
            }
        });
        // Long enough for a spinning waiter to push thousands of empty contexts.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let during = j.current_seq();
        assert!(!filler.is_finished(), "the filler never had to wait");
        drop(guard);
        filler.join().unwrap();
        (before, during)
    });
    assert!(
        seq_during - seq_before <= 3,
        "{} contexts pushed while the waiter could not fit",
        seq_during - seq_before
    );
    j.force_all().unwrap();
}

/// The same in background mode: a waiter that other open transactions keep short asks the AIL
/// thread for relief, which finds nothing to free. It must then sleep until something changes,
/// not wake the waiter to ask again at once (the two threads ping-ponged, burning both cores
/// until a holder committed), and it still gets its space as soon as the holders let go.
#[test]
fn a_waiter_kept_short_in_background_mode_does_not_ping_pong_with_relief() {
    let j = open_background(&fresh(46), |_| {});
    let started = std::time::Instant::now();
    let during = count_while_kept_short(&j, || j.stats().relief_passes);
    // A sleeping waiter asks again on its 50 ms safety net at most: about six times in the
    // nominal 300 ms. The bound follows the time the window really took (a loaded machine can
    // stretch it), at twice that rate plus ten; a ping-pong runs to thousands.
    let bound = 10 + 2 * started.elapsed().as_millis() as u64 / 50;
    assert!(
        during <= bound,
        "{during} relief passes (at most {bound}) while the waiter could not fit"
    );
    j.force_all().unwrap();
}

/// In background mode, transactions that never fill the CIL to its limit are still made durable
/// within the log force interval (XFS's log worker forces the log every 30 s), interval after
/// interval: a crash that loses every write not made stable by a flush or FUA keeps them. Before,
/// such commits sat in the CIL until a sync, or until the log had been idle for a whole interval,
/// which steady light traffic never allows.
#[test]
fn commits_below_the_cil_limit_are_forced_within_the_interval() {
    let dev = fresh(47);
    let j = open_background(&dev, |cfg| {
        cfg.cil_limit = Some(64 * 1024);
        cfg.log_force_interval = Some(std::time::Duration::from_millis(50));
    });
    let started = std::time::Instant::now();
    let mut other = 0u64;
    // Commits every 20 ms, each well below the limit, so the log is never idle for a whole
    // interval, until checkpoint `seq` is complete: only the periodic force can complete it.
    let mut keep_committing_until_stable = |seq: u64| {
        while j.completed_seq() < seq {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "checkpoint {seq} not complete after 30 s of light traffic"
            );
            write_block(&j, 310 + other % 5, 20 + (other % 200) as u8);
            other += 1;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let mut seq = 0;
    for k in 0..3u64 {
        seq = write_block(&j, 300 + k, 7);
    }
    keep_committing_until_stable(seq);
    // A later interval's force too, not only the worker's first.
    let seq = write_block(&j, 303, 8);
    keep_committing_until_stable(seq);
    let crashed = Arc::new(dev.crash_with(&mut |_, _| Survival::Lost));
    drop(j);
    let _j2 = open(&crashed, FlushPolicy::Reduced);
    for (blk, byte) in [(300, 7), (301, 7), (302, 7), (303, 8)] {
        assert_eq!(read_byte(&crashed, blk), byte, "block {blk}");
    }
}

/// A transaction works on its own copy: nothing of it shows in the buffer before commit, a
/// dropped one leaves no trace, and a commit over a block another commit changed since the
/// first touch publishes nothing and says so (the basis of running changes in parallel).
#[test]
fn a_transaction_publishes_its_copy_only_at_commit_and_only_over_the_version_it_read() {
    let dev = fresh(47);
    let j = open(&dev, FlushPolicy::Reduced);
    let unit = Reservation::for_buffers(2, BS);
    let bytes = |blkno| j.buf(blkno).unwrap().lock().data[100..104].to_vec();
    let mut t = j.begin(unit).unwrap();
    let b = t.buf(310).unwrap();
    t.write(b, 100, &[5; 4]);
    assert_eq!(t.read(b, |d| d[100..104].to_vec()), vec![5; 4]);
    assert_eq!(bytes(310), vec![0; 4], "not published before commit");
    drop(t);
    assert_eq!(
        bytes(310),
        vec![0; 4],
        "a dropped transaction leaves no trace"
    );
    // Two transactions touch block 311; the first commits, the second finds it changed.
    let mut first = j.begin(unit).unwrap();
    let mut second = j.begin(unit).unwrap();
    let f = first.buf(311).unwrap();
    let s = second.buf(311).unwrap();
    let s2 = second.buf(312).unwrap();
    first.write(f, 100, &[1; 4]);
    let seq = first.commit().unwrap();
    second.write(s2, 100, &[2; 4]);
    second.write(s, 100, &[2; 4]);
    assert!(matches!(
        second.commit(),
        Err(JournalError::Conflict { blkno: 311 })
    ));
    assert_eq!(bytes(311), vec![1; 4]);
    assert_eq!(
        bytes(312),
        vec![0; 4],
        "nothing of a conflicting commit is published"
    );
    // The reservation of the refused commit came back: the log still takes a full unit.
    j.force(seq).unwrap();
    let mut t = j.begin(unit).unwrap();
    let b = t.buf(312).unwrap();
    t.write(b, 100, &[3; 4]);
    j.force(t.commit().unwrap()).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: false }));
    drop(j);
    let j = open(&crashed, FlushPolicy::Reduced);
    assert_eq!(j.buf(311).unwrap().lock().data[100..104], [1; 4]);
    assert_eq!(j.buf(312).unwrap().lock().data[100..104], [3; 4]);
}

/// Write back stamps a block's LSN in place while a transaction holds an older copy of it: the
/// transaction's commit keeps the newer stamp.
#[test]
fn a_commit_keeps_a_stamp_written_after_its_copy() {
    let dev = fresh(48);
    let j = open(&dev, FlushPolicy::Reduced);
    let unit = Reservation::for_buffers(1, BS);
    let mut t = j.begin(unit).unwrap();
    let b = t.buf(320).unwrap();
    t.write(b, 0, &[7; 64]);
    t.set_lsn_offset(b, 8);
    j.force(t.commit().unwrap()).unwrap();
    let mut t = j.begin(unit).unwrap();
    let b = t.buf(320).unwrap();
    t.write(b, 0, &[8; 64]);
    // Write back (the AIL) stamps the buffer now.
    j.force_all().unwrap();
    j.write_back_ail(crate::log::Lsn::from_raw(u64::MAX))
        .unwrap();
    let stamped = j.buf(320).unwrap().lock().data[8..36].to_vec();
    t.commit().unwrap();
    let g = j.buf(320).unwrap();
    let g = g.lock();
    assert_eq!(g.data[8..36], stamped[..], "the newer stamp stays");
    assert_eq!(g.data[0..8], [8; 8]);
    assert_eq!(g.data[36..64], [8; 28]);
}

/// A block written late (`LateWrite`, the filesystem header) is logged as the newest late
/// write of its checkpoint, in the same checkpoint as the rest of that commit: after any
/// crash it matches the blocks committed with it, and never carries an older late write.
#[test]
fn late_writes_land_with_their_commits_newest_first() {
    let dev = fresh(51);
    let j = open(&dev, FlushPolicy::Reduced);
    let commit = |blkno: u64, byte: u8| {
        let mut tx = j.begin(Reservation::for_buffers(2, BS)).unwrap();
        let b = tx.buf(blkno).unwrap();
        tx.write(b, 100, &[byte; 200]);
        tx.write_late(
            500,
            LateWrite {
                offset: 0,
                bytes: vec![byte; 600],
                lsn_offset: 8,
                counters: Vec::new(),
                counters_set: false,
            },
        )
        .unwrap();
        tx.commit().unwrap()
    };
    commit(400, 1);
    let seq = commit(401, 2);
    j.force(seq).unwrap();
    {
        let g = j.buf(500).unwrap();
        let g = g.lock();
        assert_eq!(g.data[150], 2, "the push wrote the newest late bytes");
        assert_ne!(
            g.data[8..36],
            [2; 28],
            "late bytes never carry over the stamp"
        );
    }
    commit(402, 3);
    j.push(j.current_seq()).unwrap();
    let n = dev.volatile_writes();
    for mask in 0..(1u32 << n.min(10)) {
        let crashed = crashed_keeping(&dev, mask);
        let _j = open(&crashed, FlushPolicy::Reduced);
        assert_eq!(
            read_byte(&crashed, 401),
            2,
            "mask {mask:b}: forced commit lost"
        );
        let (late, third) = (read_byte(&crashed, 500), read_byte(&crashed, 402));
        assert!(
            (late, third) == (2, 0) || (late, third) == (3, 3),
            "mask {mask:b}: late block {late} beside commit {third}"
        );
    }
}

/// A commit that brings its images formatted (`Transaction::preformat`, as optimistic commits
/// do before their turn) gets back, in their place, the images they replaced in the CIL, to
/// free after its turn: nothing for a block new to the context, the earlier commit's image for
/// a block relogged in it. The CIL keeps the newest, and the checkpoint logs it.
#[test]
fn preformatted_images_come_back_with_what_they_replaced() {
    let dev = fresh(53);
    let j = open(&dev, FlushPolicy::Reduced);
    let commit = |byte: u8| {
        let mut tx = j.begin(Reservation::for_buffers(1, BS)).unwrap();
        let b = tx.buf(400).unwrap();
        tx.write(b, 100, &[byte; 200]);
        let mut locks = tx.lock_changed().unwrap();
        tx.publish_locked(&mut locks);
        let images = tx.preformat(&locks);
        assert_eq!(images.len(), 1);
        let formatted = images[0].clone();
        let (seq, locks) = tx.insert_locked(locks, true, Some(images)).unwrap();
        (seq, formatted, locks.replaced().to_vec())
    };
    let (_, first, replaced) = commit(1);
    assert_eq!(
        replaced,
        vec![Vec::<u8>::new()],
        "a block new to the context"
    );
    let (seq, second, replaced) = commit(2);
    assert_eq!(replaced, vec![first], "the first commit's image, replaced");
    assert_ne!(second, replaced[0]);
    j.force(seq).unwrap();
    let crashed = crashed_keeping(&dev, u32::MAX);
    let _j = open(&crashed, FlushPolicy::Reduced);
    assert_eq!(read_byte(&crashed, 400), 2, "the newest image was logged");
}

/// A block committed several times in one checkpoint is logged with every range changed
/// since it was last written back, each as its last commit left it: ranges copied by earlier
/// commits of the context, overlapping ones, a cancel and reuse, and the ranges an earlier
/// checkpoint logged, which the next must log again once the tail has passed the earlier one.
#[test]
fn a_block_relogged_in_one_checkpoint_carries_every_dirty_range() {
    let dev = fresh(52);
    let j = open(&dev, FlushPolicy::Reduced);
    let write = |blkno: u64, ranges: &[(usize, usize, u8)]| {
        let mut tx = j.begin(Reservation::for_buffers(1, BS)).unwrap();
        let b = tx.buf(blkno).unwrap();
        for &(off, len, byte) in ranges {
            tx.write(b, off, &vec![byte; len]);
        }
        tx.commit().unwrap()
    };
    write(300, &[(0, 100, 1)]);
    write(300, &[(200, 100, 2)]);
    write(300, &[(50, 10, 3), (290, 20, 4)]);
    // Freed and used again in the same checkpoint: only what follows the cancel is logged.
    write(301, &[(0, 64, 5)]);
    {
        let mut tx = j.begin(Reservation::for_buffers(1, BS)).unwrap();
        let b = tx.buf(301).unwrap();
        tx.cancel(b);
        tx.commit().unwrap();
    }
    let seq = write(301, &[(100, 8, 6)]);
    j.force(seq).unwrap();
    // The next checkpoint changes block 300 again; then a record moves the tail past the
    // first, with nothing written back in place.
    let seq = write(300, &[(500, 10, 7)]);
    j.force(seq).unwrap();
    j.push_carrying_tail().unwrap();
    j.force_all().unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: false }));
    drop(j);
    let _j = open(&crashed, FlushPolicy::Reduced);
    let mut b = vec![0u8; BS as usize];
    crashed.read(300 * u64::from(BS), &mut b).unwrap();
    let mut want = vec![0u8; BS as usize];
    for (off, len, byte) in [
        (0, 100, 1),
        (200, 100, 2),
        (50, 10, 3),
        (290, 20, 4),
        (500, 10, 7),
    ] {
        want[off..off + len].fill(byte);
    }
    assert_eq!(b[..600], want[..600], "block 300");
    crashed.read(301 * u64::from(BS), &mut b).unwrap();
    assert_eq!(b[100..108], [6; 8], "block 301 after its reuse");
}

/// Counters written late as changes (`LateWrite::counters`): each checkpoint's block holds
/// the sum of the changes of the commits in it and before it, whichever order they came in,
/// and bytes written late over them (which carry stale values) never overwrite the counters
/// the writes list (every write here lists all three, as the header's must).
/// The device dies at every IO of two unforced checkpoints and loses any of its volatile
/// writes: the counters always match the commits that survived.
#[test]
fn late_counter_changes_sum_to_the_commits_each_checkpoint_holds() {
    let ops = {
        let (dev, before) = late_counter_run(None);
        dev.op_count() - before
    };
    let mut seen = std::collections::BTreeSet::new();
    for fault_after in 0..=ops {
        let (dev, _) = late_counter_run(Some(fault_after));
        let n = dev.volatile_writes();
        for mask in 0..(1u32 << n.min(8)) {
            let crashed = crashed_keeping(&dev, mask);
            drop(open(&crashed, FlushPolicy::Reduced));
            let at = format!("fault after {fault_after}, mask {mask:b}");
            let survived = (1..=9u64)
                .take_while(|i| read_byte(&crashed, 400 + i) == 1)
                .count() as u64;
            assert!(survived >= 4, "{at}: forced commits lost");
            assert!(
                (survived + 1..=9).all(|i| read_byte(&crashed, 400 + i) == 0),
                "{at}: a commit after a lost one survived"
            );
            let mut b = vec![0u8; BS as usize];
            crashed.read(500 * u64::from(BS), &mut b).unwrap();
            let c = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
            assert_eq!(
                (c(200), c(208), c(216)),
                (survived, (2 * survived).wrapping_neg(), 10 * survived),
                "{at}: counters of {survived} commits"
            );
            seen.insert(survived);
        }
    }
    // Commits 1-4 forced, 5-6 and 7-9 in a checkpoint each.
    assert_eq!(seen, [4, 6, 9].into(), "crashes kept other checkpoints");
}

/// `late_counter_changes_sum_to_the_commits_each_checkpoint_holds`'s workload, the device
/// dying `fault_after` IOs after four forced commits: commit i marks block 400 + i and counts
/// itself at 200 (by 1) and at 208 (down by 2), and raises 216 to 10 x i; every third also
/// writes 300 late bytes of 0xee over those places. Returns the device and its IO count
/// when the forced commits were stable.
fn late_counter_run(fault_after: Option<u64>) -> (Arc<SimDevice>, u64) {
    use CounterChange::{Add, Max};
    let dev = fresh(52);
    let j = open(&dev, FlushPolicy::Reduced);
    let commit = |i: u64| -> Result<u64, JournalError> {
        let mut tx = j.begin(Reservation::for_buffers(2, BS))?;
        let b = tx.buf(400 + i)?;
        tx.write(b, 100, &[1; 200]);
        let late = LateWrite {
            offset: 0,
            bytes: if i % 3 == 0 {
                vec![0xee; 300]
            } else {
                Vec::new()
            },
            lsn_offset: 8,
            counters: vec![
                (208, Add(2u64.wrapping_neg())),
                (216, Max(10 * i)),
                (200, Add(1)),
            ],
            counters_set: false,
        };
        tx.write_late(500, late)?;
        tx.commit()
    };
    for i in 1..=3 {
        commit(i).unwrap();
    }
    let seq = commit(4).unwrap();
    j.force(seq).unwrap();
    let before = dev.op_count();
    if let Some(k) = fault_after {
        dev.inject_fault(before + k, cilfs_device::FaultMode::FromThenOn);
    }
    let _ = (5..=6).try_for_each(|i| commit(i).map(drop));
    let _ = j.push(j.current_seq());
    let _ = (7..=9).try_for_each(|i| commit(i).map(drop));
    let _ = j.push(j.current_seq());
    dev.clear_fault();
    (dev, before)
}

/// A commit that logs nothing is still charged for a checkpoint's own ops; a context holding
/// only such commits is not written, and its charge comes back (it stayed taken for good, a
/// leak a review found).
#[test]
fn a_context_of_commits_that_log_nothing_gives_its_charge_back() {
    let dev = fresh(55);
    let j = open(&dev, FlushPolicy::Reduced);
    for _ in 0..3 {
        let tx = j.begin(Reservation::for_buffers(1, BS)).unwrap();
        let seq = tx.commit().unwrap();
        assert!(j.space_in_use().1 > 0, "an empty commit is charged");
        j.force(seq).unwrap();
        assert_eq!(j.space_in_use(), (0, 0), "charge left after its context");
    }
}

/// Six threads relog one block, each through its own shard of the CIL: the push's merge keeps
/// the image of the buffer as the last commit left it, and one pin. (From a review.)
#[test]
fn relogs_of_one_block_from_several_threads_merge_to_its_newest_image() {
    let dev = fresh(56);
    let mut cfg = tiny_cfg(FlushPolicy::Reduced);
    cfg.cil_limit = Some(1 << 20);
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, cfg).unwrap();
    const B: u64 = 300;
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let j = &j;
            s.spawn(move || {
                for k in 0..300u64 {
                    loop {
                        let mut tx = j.begin(Reservation::for_buffers(1, BS)).unwrap();
                        let b = tx.buf(B).unwrap();
                        tx.write(b, (t * 100) as usize, &[(k % 251) as u8 + 1; 50]);
                        match tx.commit() {
                            Ok(_) => break,
                            Err(JournalError::Conflict { .. }) => continue,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            });
        }
    });
    let buf = j.cached_buf(B).unwrap();
    let newest = {
        let g = buf.lock();
        let mut out = Vec::new();
        buf.format_into(&g, &mut out);
        out
    };
    let pins = || crate::log::item::LogItem::pins(&*buf).load(Ordering::Relaxed);
    assert!(pins() >= 2, "one shard held every image");
    let ctx = j.cil.switch(BS as usize);
    assert_eq!(ctx.items[&B].image, newest);
    assert_eq!(pins(), 1);
}
