//! The flush policies' ordering, checked on the simulated device: what each checkpoint flushes,
//! and that no record carries a tail past write back that no flush has covered (rule 1 of
//! docs/journal.md).

#![allow(clippy::unwrap_used)]

use super::tests::{forced_multi_iclog_checkpoint, fresh, open, tiny_cfg, write_block, BS};
use super::*;
use crate::log::record::RecordHeader;
use crate::log::stamp::read_lsn_stamp;
use crate::log::FlushPolicy;
use cilfs_device::{IoStats, SimDevice};

#[test]
fn ail_policy_one_iclog_checkpoint_flushes_only_for_written_data() {
    let dev = fresh(61);
    let j = open(&dev, FlushPolicy::AilFlush);
    j.force(write_block(&j, 300, 1)).unwrap();
    let before = dev.stats();
    j.force(write_block(&j, 301, 2)).unwrap();
    let after = dev.stats();
    assert_eq!(j.stats().log.checkpoints, 2);
    assert_eq!(after.fua_writes - before.fua_writes, 1);
    assert_eq!(
        after.flushes_issued - before.flushes_issued,
        0,
        "nothing was volatile: no flush"
    );
    // File data written since the last flush: the commit record is ordered after it by one
    // flush, so the data is stable once the checkpoint is.
    dev.write(4000 * u64::from(BS), &[9u8; BS as usize], WriteFlags::NONE)
        .unwrap();
    let before = dev.stats();
    j.force(write_block(&j, 302, 3)).unwrap();
    let after = dev.stats();
    assert_eq!(after.flushes_issued - before.flushes_issued, 1);
    assert_eq!(after.fua_writes - before.fua_writes, 1);
    assert_eq!(dev.volatile_writes(), 0, "the data is not stable");
}

#[test]
fn ail_policy_multi_iclog_checkpoint_flushes_once() {
    let (before, after, iclogs) = forced_multi_iclog_checkpoint(FlushPolicy::AilFlush);
    assert!(iclogs >= 3, "{iclogs} iclogs");
    assert_eq!(after.fua_writes - before.fua_writes, 1);
    assert_eq!(after.preflush_writes - before.preflush_writes, 1);
    // One flush point, the commit iclog's PREFLUSH: none before the body.
    let points = |s: IoStats| s.flushes_issued + s.flushes_elided;
    assert_eq!(points(after) - points(before), 1);
    assert_eq!(after.flushes_issued - before.flushes_issued, 1);
}

/// One device operation as the trace saw it.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A flush, or the PREFLUSH half of a write (before its write).
    Flush,
    /// A metadata block written with the LSN stamp it carries (write back).
    WriteBack(Lsn),
    /// A log record, and the tail it carries.
    Record(Lsn),
}

/// The simulated device, with every flush, write back and record in the order they happened.
#[derive(Debug)]
struct Trace {
    inner: Arc<SimDevice>,
    ops: Mutex<Vec<Op>>,
    /// Byte range of the log, and of the blocks whose stamps are looked at.
    log: std::ops::Range<u64>,
    stamped: std::ops::Range<u64>,
}

impl Device for Trace {
    fn read(&self, offset: u64, buf: &mut [u8]) -> cilfs_device::Result<()> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> cilfs_device::Result<()> {
        let mut ops = self.ops.lock();
        if flags.preflush() {
            ops.push(Op::Flush);
        }
        if self.log.contains(&offset) {
            // The second piece of a record wrapping past the log's end has no header.
            if let Ok(h) = RecordHeader::decode(&buf[..512]) {
                ops.push(Op::Record(h.tail));
            }
        } else if self.stamped.contains(&offset) {
            for block in buf.chunks(BS as usize) {
                if let Some(lsn) = read_lsn_stamp(block, 8, &[0x11; 16]) {
                    ops.push(Op::WriteBack(lsn));
                }
            }
        }
        self.inner.write(offset, buf, flags)
    }
    fn flush(&self) -> cilfs_device::Result<()> {
        self.ops.lock().push(Op::Flush);
        self.inner.flush()
    }
    fn flush_reporting(&self) -> cilfs_device::Result<bool> {
        self.ops.lock().push(Op::Flush);
        self.inner.flush_reporting()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}

/// Under every policy, over a log that wraps many times with write back ahead of need, or
/// with relief alone: no record carries a tail past a write back that no flush completed before it
/// (a record's own PREFLUSH counts, as it precedes the record). Under the ail policy the
/// AIL's tail moves past write back only once a flush covered it, so it publishes no tail
/// ahead of that flush, and write back ahead of need mostly costs no flush of its own.
#[test]
fn no_record_carries_a_tail_past_unflushed_write_back() {
    for (policy, ahead) in FlushPolicy::ALL
        .into_iter()
        .flat_map(|p| [(p, true), (p, false)])
    {
        let sim = fresh(62);
        let dev = Arc::new(Trace {
            inner: sim,
            ops: Mutex::new(Vec::new()),
            log: u64::from(BS)..257 * u64::from(BS),
            stamped: 300 * u64::from(BS)..340 * u64::from(BS),
        });
        let j = Journal::open(dev.clone() as Arc<dyn Device>, None, tiny_cfg(policy)).unwrap();
        j.set_ail_push_ahead(ahead);
        let mut rng = cilfs_device::rng::SimRng::new(7);
        for i in 0..1500u64 {
            // Now and then a transaction of many blocks: checkpoints of several iclogs, whose
            // body records carry a tail sampled without a flush of their own.
            let n = if i % 8 == 0 { 24 } else { 1 + rng.below(3) };
            let mut tx = j.begin(Reservation::for_buffers(n, BS)).unwrap();
            for _ in 0..n {
                // A window that moves on leaves items behind that nothing relogs: only write
                // back moves the tail past them.
                let b = tx.buf(300 + (i / 8 + rng.below(30)) % 40).unwrap();
                tx.write(b, 64, &[(i % 251) as u8 + 1; 900]);
                tx.set_lsn_offset(b, 8);
            }
            let seq = tx.commit().unwrap();
            if i % 40 == 0 {
                j.force(seq).unwrap();
            }
        }
        j.force_all().unwrap();
        let ops = dev.ops.lock().clone();
        let mut unflushed: Vec<Lsn> = Vec::new();
        let (mut passed, mut write_backs) = (0, 0);
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Flush => unflushed.clear(),
                Op::WriteBack(lsn) => {
                    write_backs += 1;
                    unflushed.push(lsn);
                }
                Op::Record(tail) => {
                    if let Some(l) = unflushed.iter().find(|&&l| l < tail) {
                        panic!("{policy}: op {i}: a record carries tail {tail} past write back at {l} that no flush covered");
                    }
                    passed += 1;
                }
            }
        }
        let s = j.stats();
        eprintln!(
            "{policy} ahead={ahead}: {write_backs} write backs, {passed} records, {} checkpoints, {} AIL flushes, {} tail records",
            s.log.checkpoints, s.ail_flushes, s.tail_records
        );
        assert!(write_backs > 100, "{policy}: {write_backs} write backs");
        assert!(passed > 100, "{policy}: {passed} records");
        assert!(
            s.log.log_bytes > 4 * 256 * 1024,
            "{policy}: the log did not wrap"
        );
        if policy == FlushPolicy::AilFlush && ahead {
            // Ahead of need the AIL waits for the commit path's flush instead of its own.
            assert!(
                s.ail_flushes < s.log.checkpoints / 4,
                "{} AIL flushes over {} checkpoints",
                s.ail_flushes,
                s.log.checkpoints
            );
        }
        if policy == FlushPolicy::AilFlush && !ahead {
            // Relief flushes for the space it frees now.
            assert!(s.ail_flushes > 0, "relief never flushed");
        }
    }
}
