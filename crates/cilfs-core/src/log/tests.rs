//! Writer and recovery scan together: whatever the writer puts in the log, the scan reads back.

#![allow(clippy::unwrap_used)]

use super::item_format::encode_buf_item;
use super::recover::{scan_log, LogEnd, LogRegion};
use super::writer::{FlushPolicy, LogConfig, LogPlacement, LogWriter};
use super::{LogSpace, Lsn};
use crate::util::test_queue::Queued;
use cilfs_device::{Device, SimDevice, WriteFlags};
use proptest::prelude::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const LOG_BYTES: u64 = 256 * 1024;

/// A 256 KiB log at offset 0 of `log_dev` (internal when `data_dev` is the same device).
fn placement(log_dev: Arc<dyn Device>, data_dev: Arc<dyn Device>, external: bool) -> LogPlacement {
    LogPlacement {
        log_dev,
        data_dev,
        external,
        offset: 0,
        space: LogSpace::new(LOG_BYTES),
    }
}

/// `logbufs` iclogs of 16 KiB under `policy`.
fn config(logbufs: u32, policy: FlushPolicy) -> LogConfig {
    LogConfig {
        logbufs,
        logbsize: 16 * 1024,
        policy,
    }
}

/// A writer of `logbufs` iclogs of 16 KiB under `policy`, from the start of cycle 1.
fn log_writer(
    log_dev: Arc<dyn Device>,
    data_dev: Arc<dyn Device>,
    external: bool,
    logbufs: u32,
    policy: FlushPolicy,
) -> LogWriter {
    let place = placement(log_dev, data_dev, external);
    LogWriter::new(
        place,
        config(logbufs, policy),
        Lsn::new(1, 0),
        1,
        Arc::default(),
    )
}

/// A writer with `logbufs` iclogs of 16 KiB (reduced policy) on a 256 KiB internal log at offset 0
/// of `dev`.
fn writer_on(dev: Arc<dyn Device>, logbufs: u32, head: Lsn, generation: u32) -> LogWriter {
    let place = placement(dev.clone(), dev, false);
    let cfg = config(logbufs, FlushPolicy::Reduced);
    LogWriter::new(place, cfg, head, generation, Arc::default())
}

/// A writer with tiny iclogs (2 x 16 KiB, reduced policy) on a 256 KiB log at offset 0 of `dev`.
pub(super) fn writer(dev: &Arc<SimDevice>, head: Lsn, generation: u32) -> LogWriter {
    writer_on(dev.clone(), 2, head, generation)
}

/// The test log: all of `dev` from offset 0.
fn region(dev: &SimDevice) -> LogRegion<'_> {
    LogRegion {
        dev,
        offset: 0,
        space: LogSpace::new(LOG_BYTES),
    }
}

fn item(blkno: u64, len: usize, fill: u8) -> Vec<u8> {
    let data = vec![fill; 4096];
    let len = len.clamp(1, 4096) as u32;
    encode_buf_item(blkno, false, None, &data, &[(0, len)])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Any sequence of checkpoints (any item sizes, so ops split at every possible place, and
    /// records wrap past the end of the log) reads back exactly.
    #[test]
    fn checkpoints_read_back(sizes in proptest::collection::vec(proptest::collection::vec(1usize..4096, 0..12), 1..40)) {
        let dev = Arc::new(SimDevice::new(LOG_BYTES, 1));
        let region = region(&dev);
        let mut w = writer(&dev, Lsn::new(1, 0), 1);
        let mut expect: Vec<Vec<Vec<u8>>> = Vec::new();
        for (seq, ck) in sizes.iter().enumerate() {
            let items: Vec<Vec<u8>> = ck.iter().enumerate().map(|(i, &n)| item(i as u64 + 10, n, seq as u8)).collect();
            // The tail follows the head closely enough that the log never overruns itself.
            let written = w.write_checkpoint(seq as u64 + 1, items.iter().map(|v| &v[..]), |head, _| head).unwrap();
            prop_assert!(written.start <= written.commit);
            expect.push(items);
        }
        let scan = scan_log(&region, 4096).unwrap();
        prop_assert_eq!(scan.head, w.head());
        prop_assert_eq!(scan.end, LogEnd::Clean);
        let last = scan.checkpoints.last().unwrap();
        prop_assert_eq!(last.seq, sizes.len() as u64);
        prop_assert_eq!(last.items.len(), expect.last().unwrap().len());
        for (img, raw) in last.items.iter().zip(expect.last().unwrap()) {
            let back = super::item_format::decode_item(raw, 4096).unwrap();
            prop_assert_eq!(img, &back);
        }
    }
}

#[test]
fn torn_last_record_is_discarded_and_earlier_ones_kept() {
    let dev = Arc::new(SimDevice::new(LOG_BYTES, 1));
    let mut w = writer(&dev, Lsn::new(1, 0), 1);
    let a = item(5, 3000, 1);
    w.write_checkpoint(1, [&a[..]].into_iter(), |h, _| h)
        .unwrap();
    let second = w.head();
    w.write_checkpoint(2, [&a[..]].into_iter(), |_, _| Lsn::new(1, 0))
        .unwrap();
    // Tear the second record: overwrite one of its payload sectors with old-cycle garbage.
    let mut s = [0u8; 512];
    dev.read(u64::from(second.block() + 2) * 512, &mut s)
        .unwrap();
    s[100] ^= 0xff;
    dev.write(u64::from(second.block() + 2) * 512, &s, WriteFlags::NONE)
        .unwrap();
    let region = region(&dev);
    let scan = scan_log(&region, 4096).unwrap();
    assert_eq!(scan.checkpoints.len(), 1);
    assert_eq!(scan.head, second);
    assert!(matches!(scan.end, LogEnd::Torn { .. }), "{:?}", scan.end);
}

/// Sweeps the end of the items across the end of the first iclog so that the commit op meets
/// every possible amount of room left (it must never be split).
#[test]
fn commit_op_at_every_position_near_an_iclog_boundary() {
    let payload = config(2, FlushPolicy::Reduced).iclog_payload();
    // Start op 24 bytes; each one-range item op is 16 + 24 + len bytes.
    let fixed = 24 + 4 * 40 + 3 * 4096;
    for room in 0..64usize {
        let last = payload - room - fixed;
        let dev = Arc::new(SimDevice::new(LOG_BYTES, 1));
        let mut w = writer(&dev, Lsn::new(1, 0), 1);
        let items = [
            item(1, 4096, 1),
            item(2, 4096, 2),
            item(3, 4096, 3),
            item(4, last, 4),
        ];
        w.write_checkpoint(1, items.iter().map(|v| &v[..]), |h, _| h)
            .unwrap();
        let region = region(&dev);
        let scan = scan_log(&region, 4096).unwrap_or_else(|e| panic!("room {room}: {e}"));
        assert_eq!(scan.checkpoints.len(), 1, "room {room}");
        assert_eq!(scan.checkpoints[0].items.len(), 4, "room {room}");
    }
}

/// A writer with 4 x 16 KiB iclogs, asynchronous IO through a [`LateQueue`], on a 256 KiB log.
fn queued_writer() -> (Arc<SimDevice>, Arc<Queued>, LogWriter) {
    queued_writer_with(false)
}

fn queued_writer_with(oldest_last: bool) -> (Arc<SimDevice>, Arc<Queued>, LogWriter) {
    let sim = Arc::new(SimDevice::new(LOG_BYTES, 1));
    let dev = Arc::new(Queued::new(Arc::clone(&sim), oldest_last));
    let w = writer_on(dev.clone(), 4, Lsn::new(1, 0), 1).with_async_io();
    (sim, dev, w)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// Through a write queue (adjacent body iclogs merged, completions late and newest first,
    /// or all but the oldest early; records wrapping past the end of the log), every
    /// checkpoint reads back, and no commit iclog is written while a body iclog (or a piece of
    /// one) is still in flight.
    #[test]
    fn queued_checkpoints_read_back_and_commit_after_the_body(sizes in proptest::collection::vec(proptest::collection::vec(1usize..4096, 0..24), 1..40), oldest_last: bool) {
        // Oldest last: the second piece of a wrapped record, submitted first, is still in
        // flight when the first piece (which brings the iclog back) completes.
        let (sim, dev, mut w) = queued_writer_with(oldest_last);
        let mut last_items = Vec::new();
        for (seq, ck) in sizes.iter().enumerate() {
            let items: Vec<Vec<u8>> = ck.iter().enumerate().map(|(i, &n)| item(i as u64 + 10, n, seq as u8)).collect();
            w.write_checkpoint(seq as u64 + 1, items.iter().map(|v| &v[..]), |head, _| head).unwrap();
            last_items = items;
        }
        let head = w.head();
        drop(w);
        prop_assert_eq!(dev.early_flagged.load(Ordering::SeqCst), 0, "a commit iclog overtook its body");
        prop_assert_eq!(dev.in_flight.load(Ordering::SeqCst), 0);
        let region = region(&sim);
        let scan = scan_log(&region, 4096).unwrap();
        prop_assert_eq!(scan.head, head);
        prop_assert_eq!(scan.end, LogEnd::Clean);
        let last = scan.checkpoints.last().unwrap();
        prop_assert_eq!(last.seq, sizes.len() as u64);
        prop_assert_eq!(last.items.len(), last_items.len());
        for (img, raw) in last.items.iter().zip(&last_items) {
            prop_assert_eq!(img, &super::item_format::decode_item(raw, 4096).unwrap());
        }
    }
}

/// Checkpoints of many iclogs through the queue merge adjacent body iclogs into one write.
#[test]
fn queued_body_iclogs_merge() {
    let (sim, dev, mut w) = queued_writer();
    let items: Vec<Vec<u8>> = (0..40).map(|i| item(i, 4000, 1)).collect();
    w.write_checkpoint(1, items.iter().map(|v| &v[..]), |h, _| h)
        .unwrap();
    drop(w);
    assert!(dev.merged.load(Ordering::SeqCst) > 0, "no merged write");
    let region = region(&sim);
    let scan = scan_log(&region, 4096).unwrap();
    assert_eq!(scan.checkpoints.len(), 1);
    assert_eq!(scan.checkpoints[0].items.len(), 40);
}

/// Writes completing out of order free iclogs other than the next one in ring order; the pusher
/// fills those instead of waiting, and the checkpoint still commits after its whole body.
#[test]
fn queued_pusher_takes_any_free_iclog() {
    let (sim, dev, mut w) = queued_writer_with(true);
    let items: Vec<Vec<u8>> = (0..40).map(|i| item(i, 4000, 7)).collect();
    w.write_checkpoint(1, items.iter().map(|v| &v[..]), |h, _| h)
        .unwrap();
    assert!(
        w.stats().iclog_writes > 8,
        "the checkpoint should span many iclogs"
    );
    assert_eq!(
        w.stats().noiclog_waits,
        0,
        "waited although an iclog was free"
    );
    drop(w);
    assert_eq!(
        dev.early_flagged.load(Ordering::SeqCst),
        0,
        "a commit iclog overtook its body"
    );
    let region = region(&sim);
    let scan = scan_log(&region, 4096).unwrap();
    assert_eq!(scan.checkpoints.len(), 1);
    assert_eq!(scan.checkpoints[0].items.len(), 40);
}

/// Writes three checkpoints, the first two stamping the first one's start as the tail; the
/// third's sampler answers its first call with that too and later ones with the second's start. Returns the
/// calls seen (the bound each was given), what the writer reports, and the log read back.
fn third_checkpoint_sampled(
    w: &mut LogWriter,
    region: &LogRegion<'_>,
    third_items: usize,
) -> (Vec<Lsn>, super::writer::Written, super::recover::LogScan) {
    let a = item(5, 1000, 1);
    let first = w
        .write_checkpoint(1, [&a[..]].into_iter(), |h, _| h)
        .unwrap();
    let second = w
        .write_checkpoint(2, [&a[..]].into_iter(), |_, _| first.start)
        .unwrap();
    let items: Vec<Vec<u8>> = (0..third_items as u64).map(|i| item(i, 4000, 3)).collect();
    let mut calls = Vec::new();
    let written = w
        .write_checkpoint(3, items.iter().map(|v| &v[..]), |bound, _| {
            calls.push(bound);
            if calls.len() == 1 {
                first.start
            } else {
                second.start.min(bound)
            }
        })
        .unwrap();
    (calls, written, scan_log(region, 4096).unwrap())
}

/// The commit iclog of a many-iclog checkpoint carries PREFLUSH, which on an internal log also
/// makes stable what was written back while the body went out: it stamps the tail sampled
/// again then (XFS's tail-sampling rule), the body keeps the tail sampled before the start
/// flush, and recovery takes the fresher one from the newest record.
#[test]
fn the_commit_record_carries_a_tail_sampled_after_the_body() {
    for policy in [FlushPolicy::Reduced, FlushPolicy::Legacy] {
        let dev = Arc::new(SimDevice::new(LOG_BYTES, 1));
        let mut w = log_writer(dev.clone(), dev.clone(), false, 2, policy);
        let region = region(&dev);
        let (calls, written, scan) = third_checkpoint_sampled(&mut w, &region, 10);
        assert_eq!(
            calls.len(),
            2,
            "{policy:?}: sampled again for the commit iclog"
        );
        assert_eq!(calls[1], written.start, "bounded by the checkpoint's start");
        let tails: Vec<Lsn> = scan
            .records
            .iter()
            .filter(|r| r.header.lsn >= written.start)
            .map(|r| r.header.tail)
            .collect();
        assert!(tails.len() > 2, "the checkpoint should span several iclogs");
        let (body, commit) = tails.split_at(tails.len() - 1);
        assert!(body.iter().all(|&t| t == Lsn::new(1, 0)), "{body:?}");
        assert!(commit[0] > Lsn::new(1, 0), "{commit:?}");
        assert_eq!(written.tail, commit[0]);
        assert_eq!(written.body_tail, Lsn::new(1, 0));
        assert_eq!(scan.tail, commit[0]);
        assert_eq!(scan.checkpoints.last().unwrap().seq, 3);
    }
}

/// No fresher tail where nothing flushes the data device before the commit record: a
/// one-iclog checkpoint (FUA only) and, under the reduced policy, an external log (whose
/// PREFLUSH flushes only the log device). Stamping one there could start recovery past
/// checkpoints whose write back was lost from the data device's cache.
#[test]
fn no_fresher_tail_without_a_flush_covering_the_data_device() {
    let dev = Arc::new(SimDevice::new(LOG_BYTES, 1));
    let mut w = writer(&dev, Lsn::new(1, 0), 1);
    let region = region(&dev);
    let (calls, written, scan) = third_checkpoint_sampled(&mut w, &region, 1);
    assert_eq!(calls.len(), 1, "a one-iclog checkpoint has no PREFLUSH");
    assert_eq!(written.tail, Lsn::new(1, 0));
    assert_eq!(scan.tail, Lsn::new(1, 0));

    let log = Arc::new(SimDevice::new(LOG_BYTES, 1));
    let data = Arc::new(SimDevice::new(LOG_BYTES, 1));
    let mut w = log_writer(log.clone(), data, true, 2, FlushPolicy::Reduced);
    let region = LogRegion {
        dev: &*log,
        offset: 0,
        space: LogSpace::new(LOG_BYTES),
    };
    let (calls, written, scan) = third_checkpoint_sampled(&mut w, &region, 10);
    assert_eq!(
        calls.len(),
        1,
        "an external log's PREFLUSH does not cover the data device"
    );
    assert_eq!(written.tail, Lsn::new(1, 0));
    assert_eq!(scan.tail, Lsn::new(1, 0));
}

/// A log device that writes metadata back to the data device once, right after the first log
/// write following `arm`: as the AIL does while a checkpoint's body goes out.
#[derive(Debug)]
struct WritesBackDuringBody {
    log: Arc<SimDevice>,
    data: Arc<SimDevice>,
    armed: std::sync::atomic::AtomicBool,
    written_back: Arc<std::sync::atomic::AtomicBool>,
}

const DATA_BLOCK: u64 = 100;

impl Device for WritesBackDuringBody {
    fn read(&self, offset: u64, buf: &mut [u8]) -> cilfs_device::Result<()> {
        self.log.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> cilfs_device::Result<()> {
        self.log.write(offset, buf, flags)?;
        if self.armed.swap(false, Ordering::SeqCst) {
            self.data
                .write(DATA_BLOCK * 4096, &[0xAB; 4096], WriteFlags::NONE)?;
            self.written_back.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
    fn flush(&self) -> cilfs_device::Result<()> {
        self.log.flush()
    }
    fn len(&self) -> u64 {
        self.log.len()
    }
    fn stats(&self) -> cilfs_device::IoStats {
        self.log.stats()
    }
}

/// A block is logged, then written back while the next checkpoint's body goes out, so the
/// commit record may carry a tail past the block's checkpoint. Power is then cut and every
/// volatile write lost: the block must come back, from the data device if a flush made its
/// write back stable before the commit record, from the log otherwise. Internal and external
/// logs, both policies (an external log under the reduced policy is the case a fresher tail
/// would break: its commit PREFLUSH does not flush the data device).
#[test]
fn a_block_written_back_during_a_body_survives_a_crash_after_its_commit() {
    for external in [false, true] {
        for policy in [FlushPolicy::Reduced, FlushPolicy::Legacy] {
            let what = format!("external {external}, {policy:?}");
            let log_sim = Arc::new(SimDevice::new(LOG_BYTES + (1 << 20), 1));
            let data_sim = if external {
                Arc::new(SimDevice::new(1 << 20, 2))
            } else {
                Arc::clone(&log_sim)
            };
            let written_back = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let hooked = Arc::new(WritesBackDuringBody {
                log: Arc::clone(&log_sim),
                data: Arc::clone(&data_sim),
                armed: false.into(),
                written_back: Arc::clone(&written_back),
            });
            let log_dev: Arc<dyn Device> = hooked.clone();
            let data_dev: Arc<dyn Device> = if external {
                data_sim.clone()
            } else {
                log_dev.clone()
            };
            let mut w = log_writer(log_dev, data_dev, external, 2, policy);
            let block = encode_buf_item(DATA_BLOCK, false, None, &[0xAB; 4096], &[(0, 4096)]);
            let first = w
                .write_checkpoint(1, [&block[..]].into_iter(), |h, _| h)
                .unwrap();
            hooked.armed.store(true, Ordering::SeqCst);
            let others: Vec<Vec<u8>> = (0..10).map(|i| item(200 + i, 4000, 3)).collect();
            // The block leaves the AIL once written back: the tail is then this checkpoint's
            // start (nothing older is needed); before, the block's checkpoint holds it.
            w.write_checkpoint(2, others.iter().map(|v| &v[..]), |start, _| {
                if written_back.load(Ordering::SeqCst) {
                    start
                } else {
                    first.start
                }
            })
            .unwrap();
            assert!(written_back.load(Ordering::SeqCst), "{what}: no write back");
            drop(w);

            let crashed_log =
                Arc::new(log_sim.crash_with(&mut |_, _| cilfs_device::Survival::Lost));
            let crashed_data = if external {
                Arc::new(data_sim.crash_with(&mut |_, _| cilfs_device::Survival::Lost))
            } else {
                Arc::clone(&crashed_log)
            };
            let region = LogRegion {
                dev: &*crashed_log,
                offset: 0,
                space: LogSpace::new(LOG_BYTES),
            };
            let scan = scan_log(&region, 4096).unwrap();
            assert_eq!(scan.checkpoints.last().map(|c| c.seq), Some(2), "{what}");
            let target = super::recover::ReplayTarget {
                dev: &*crashed_data,
                block_size: 4096,
                first_block: 0,
                end_block: 256,
                uuid: [0; 16],
            };
            super::recover::replay(&scan.checkpoints, &target).unwrap();
            let mut back = vec![0u8; 4096];
            crashed_data.read(DATA_BLOCK * 4096, &mut back).unwrap();
            assert!(
                back.iter().all(|&b| b == 0xAB),
                "{what}: the block was lost"
            );
        }
    }
}

/// A record's tail may be behind the record's before it: under the ail policy a commit record
/// stamps a tail its own pre-flush makes true, and the next checkpoint's body, written while
/// that commit is still in flight, stamps an older one that holds without it. Recovery walks
/// on through such a record instead of taking it for a stale one (the journal explorer's
/// background mode found the ail policy's forced checkpoints refused as damage).
#[test]
fn a_tail_behind_the_record_before_is_walked_through() {
    let dev = Arc::new(SimDevice::new(LOG_BYTES, 1));
    let mut w = log_writer(dev.clone(), dev.clone(), false, 2, FlushPolicy::Reduced);
    let region = region(&dev);
    let a = item(5, 1000, 1);
    let first = w
        .write_checkpoint(1, [&a[..]].into_iter(), |h, _| h)
        .unwrap();
    let items: Vec<Vec<u8>> = (0..10).map(|i| item(i, 4000, 2)).collect();
    let second = w
        .write_checkpoint(2, items.iter().map(|v| &v[..]), |bound, _| bound)
        .unwrap();
    w.write_checkpoint(3, items.iter().map(|v| &v[..]), |_, _| first.start)
        .unwrap();
    assert!(second.tail > first.start);
    let scan = scan_log(&region, 4096).unwrap();
    assert_eq!(scan.end, LogEnd::Clean, "{:?}", scan.end);
    let seqs: Vec<u64> = scan.checkpoints.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    let tails: Vec<Lsn> = scan.records.iter().map(|r| r.header.tail).collect();
    assert!(
        tails.windows(2).any(|p| p[1] < p[0]),
        "no tail goes back: {tails:?}"
    );
}
