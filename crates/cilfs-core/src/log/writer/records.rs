//! Writing records: a checkpoint (start op, one op per item, commit op) or an unmount record,
//! its op stream packed into consecutive iclogs (`RecordStream`), each written with the flush
//! policy's flags, the commit iclog only once every earlier one has completed.

use super::io::{put_back, threads_gone, AsyncIo, Job, Msg, HOLD_MIN_FREE_ICLOGS};
use super::FlushPolicy;
use super::{LogWriter, Written};
use crate::log::lsn::Lsn;
use crate::log::record::{
    pack, seal_record, OpHeader, OpKind, RecordHeader, OP_CONTINUATION, OP_CONTINUED,
    OP_HEADER_BYTES, SECTOR, SECTOR_PAYLOAD,
};
use cilfs_device::{AlignedBuf, DeviceError, WriteFlags};
use std::sync::atomic::Ordering;

impl LogWriter {
    /// Writes one checkpoint: start op, one op per item payload, commit op.
    ///
    /// `sample_tail(start, flush)` gives the tail to stamp, at most `start` (where the
    /// checkpoint's first record goes); `flush`, when given, is the `FlushClock` ticket of a
    /// data-device flush that completes before the record carrying the tail is written (the
    /// ail policy's commit record), so write back it covers need not hold the tail. It is
    /// called before anything is written; with the reduced policy the data device is then
    /// flushed, so the sampled tail is safe to stamp into every record and
    /// everything written back before the sample (and all ordered data) is stable before the
    /// first iclog goes out. It is called again for a commit iclog whose PREFLUSH covers the
    /// data device (internal log, or legacy on an external one): the commit record carries that
    /// fresher tail, which the flush makes safe as XFS's tail-sampling rule does, and the
    /// returned `Written::tail` is the one it carries.
    ///
    /// With the ail policy nothing is flushed before the body: the AIL's tail never passes
    /// write back no flush has covered yet (`ail::Publish`), so any sample is safe to stamp,
    /// and the commit record always carries a fresh one. The commit iclog goes PREFLUSH+FUA,
    /// which orders the body and the file data written before the commit (docs/journal.md
    /// section 7) before the commit record; on an external log the data device is flushed
    /// first instead, and a one-iclog checkpoint needs FUA alone there.
    ///
    /// Owned images are dropped as soon as they are packed, so the memory of a checkpoint being
    /// written shrinks while the next context fills.
    pub fn write_checkpoint<I>(
        &mut self,
        seq: u64,
        items: I,
        sample_tail: impl FnMut(Lsn, Option<u64>) -> Lsn,
    ) -> Result<Written, DeviceError>
    where
        I: ExactSizeIterator,
        I::Item: AsRef<[u8]>,
    {
        let w = self.write_checkpoint_async(seq, items, sample_tail, &mut || true)?;
        self.wait_commit()?;
        Ok(w)
    }

    /// As `write_checkpoint`, but with the write queue the commit iclog may still be in flight
    /// on return: the checkpoint is stable only once `wait_commit` (or the next checkpoint's
    /// commit, which waits for it) returns Ok. Until then a later checkpoint must not stamp a
    /// tail past this one's start.
    ///
    /// The commit iclog of the checkpoint before may itself still be in flight: `prior_stable`
    /// runs (at most once) as soon as that commit is found completed without error, between
    /// this checkpoint's iclogs, so the caller can complete the earlier checkpoint without
    /// waiting for this body (as XFS runs completions at IO completion). If it returns false
    /// (the caller shut down), nothing more of this checkpoint is written.
    pub fn write_checkpoint_async<I>(
        &mut self,
        seq: u64,
        items: I,
        mut sample_tail: impl FnMut(Lsn, Option<u64>) -> Lsn,
        prior_stable: &mut dyn FnMut() -> bool,
    ) -> Result<Written, DeviceError>
    where
        I: ExactSizeIterator,
        I::Item: AsRef<[u8]>,
    {
        let body_tail = sample_tail(self.head, None);
        if self.cfg.policy == FlushPolicy::Reduced {
            self.data_dev.flush()?;
        }
        let count = items.len() as u64;
        self.claim()?;
        let mut w = RecordStream::new(self, body_tail);
        w.prior_stable = Some(prior_stable);
        w.resample_tail = Some(&mut sample_tail);
        w.op(seq, OpKind::Start, &seq.to_le_bytes())?;
        for item in items {
            w.op(seq, OpKind::Item, item.as_ref())?;
        }
        w.op(seq, OpKind::Commit, &count.to_le_bytes())?;
        let (start, commit, tail, data_flush) = w.finish()?;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(Written {
            start,
            commit,
            tail,
            body_tail,
            data_flush,
        })
    }

    /// Writes an unmount record, PREFLUSH+FUA after a data-device flush, and returns its LSN.
    /// The caller has emptied the AIL: the record's tail is the record itself.
    pub fn write_unmount(&mut self) -> Result<Lsn, DeviceError> {
        self.wait_all()?;
        self.data_dev.flush()?;
        let tail = self.head;
        let mut w = RecordStream::new(self, tail);
        w.force_flags = true;
        w.op(0, OpKind::Unmount, &[])?;
        let (lsn, _, _, _) = w.finish()?;
        self.counters
            .unmount_records
            .fetch_add(1, Ordering::Relaxed);
        Ok(lsn)
    }

    /// Seals and writes the iclog in ring slot `slot` holding `stream_len` stream bytes at the
    /// head, with `flags`. A record that runs past the end of the log goes out as two IOs.
    pub(super) fn write_iclog(
        &mut self,
        slot: usize,
        stream_len: usize,
        tail: Lsn,
        flags: WriteFlags,
        wait: bool,
    ) -> Result<Lsn, DeviceError> {
        let lsn = self.head;
        let header = RecordHeader {
            cycle: lsn.cycle(),
            payload_len: stream_len as u32,
            lsn,
            tail,
            generation: self.generation,
            crc: 0,
        };
        let sectors = header.total_sectors();
        let bytes = sectors * SECTOR;
        let Some(buf) = self.ring[slot].as_mut() else {
            unreachable!("writing iclog {slot} while it is in flight")
        };
        header.encode_into(&mut buf[..SECTOR]);
        // Zero the tail of the last payload sector so stale stream bytes never reach disk.
        let used =
            SECTOR + (stream_len / SECTOR_PAYLOAD) * SECTOR + 4 + stream_len % SECTOR_PAYLOAD;
        if used < bytes {
            buf[used..bytes].fill(0);
        }
        let to_end = (self.space.sectors - lsn.block()) as usize;
        seal_record(&mut buf[..bytes], |i| {
            if i < to_end {
                lsn.cycle()
            } else {
                lsn.cycle() + 1
            }
        });
        debug_assert!(RecordHeader::decode(&buf[..SECTOR]).is_ok());
        if self.external && self.cfg.policy == FlushPolicy::Legacy {
            // PREFLUSH on the log device does not cover the data device.
            self.data_dev.flush()?;
        }
        let base = self.log_offset;
        let ios = if sectors <= to_end {
            vec![(base + self.space.offset(lsn), 0..bytes)]
        } else {
            let split = to_end * SECTOR;
            vec![
                (base + self.space.offset(lsn), 0..split),
                (base, split..bytes),
            ]
        };
        // A record wrapping past the end of the log is two writes; through the queue the iclog
        // would come back with one of them, and the commit iclog that waits for its ring could
        // go out before the other completed. Written here instead (once a lap), after what the
        // queue holds back.
        let wrapped_in_queue = ios.len() > 1 && matches!(self.io, Some(AsyncIo::Queue { .. }));
        match (&mut self.io, wait) {
            (Some(_), false) if flags != WriteFlags::NONE && self.commit_io.is_some() => {
                // A commit iclog: a copy goes to the commit thread, so the ring slot is free
                // for the next checkpoint at once.
                debug_assert!(!self.commit_in_flight, "two commit iclogs in flight");
                let Some(buf) = self.ring[slot].as_ref() else {
                    unreachable!("iclog {slot} in flight")
                };
                let offset = ios.first().map_or(0, |io| io.0);
                let mut copy = match self.commit_spare.take() {
                    Some(b) if b.len() >= bytes => b,
                    _ => AlignedBuf::zeroed(self.cfg.logbsize as usize),
                };
                copy[..bytes].copy_from_slice(&buf[..bytes]);
                let job = Job {
                    slot,
                    buf: copy,
                    ios,
                    flags,
                };
                let Some(pool) = self.commit_io.as_ref() else {
                    unreachable!("checked above")
                };
                pool.jobs
                    .send(Msg::Write(job))
                    .map_err(|_| threads_gone(offset))?;
                self.commit_in_flight = true;
            }
            (Some(io), false) if !wrapped_in_queue => {
                debug_assert!(
                    flags == WriteFlags::NONE || matches!(io, AsyncIo::Threads(_)),
                    "the write queue takes only unflagged iclogs"
                );
                let Some(buf) = self.ring[slot].take() else {
                    unreachable!("iclog {slot} submitted twice")
                };
                // Hold it back for merging only while the pusher has others to fill meanwhile.
                let may_hold =
                    self.ring.iter().filter(|b| b.is_some()).count() >= HOLD_MIN_FREE_ICLOGS;
                let job = Job {
                    slot,
                    buf,
                    ios,
                    flags,
                };
                put_back(&mut self.ring, io.submit(job, may_hold))?;
            }
            (io, _) => {
                if let (Some(io), true) = (io, wrapped_in_queue) {
                    put_back(&mut self.ring, io.unplug())?;
                }
                let Some(buf) = self.ring[slot].as_ref() else {
                    unreachable!("iclog {slot} in flight")
                };
                for (off, r) in ios {
                    self.log_dev.write(off, &buf[r], flags)?;
                }
            }
        }
        self.head = self.space.advance(lsn, sectors as u32);
        self.counters.iclog_writes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .log_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(lsn)
    }
}

/// Packs an op stream into consecutive iclogs and writes them with the policy's flags.
struct RecordStream<'w> {
    w: &'w mut LogWriter,
    tail: Lsn,
    slot: usize,
    stream_len: usize,
    capacity: usize,
    /// LSN of the first record written, and how many have been.
    first: Option<Lsn>,
    records: usize,
    /// Every record PREFLUSH+FUA (unmount record).
    force_flags: bool,
    /// Told when the previous checkpoint's commit iclog completed (`write_checkpoint_async`).
    prior_stable: Option<&'w mut dyn FnMut() -> bool>,
    /// Samples the tail again for a commit iclog whose PREFLUSH covers the data device.
    resample_tail: Option<&'w mut dyn FnMut(Lsn, Option<u64>) -> Lsn>,
    /// The ail policy: the ticket of the data flush the commit record was ordered after.
    data_flush: Option<u64>,
}

impl<'w> RecordStream<'w> {
    fn new(w: &'w mut LogWriter, tail: Lsn) -> Self {
        let slot = w.next_iclog;
        let capacity = w.cfg.iclog_payload();
        Self {
            w,
            tail,
            slot,
            stream_len: 0,
            capacity,
            first: None,
            records: 0,
            force_flags: false,
            prior_stable: None,
            resample_tail: None,
            data_flush: None,
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        debug_assert!(bytes.len() <= self.capacity - self.stream_len);
        let Some(buf) = self.w.ring[self.slot].as_mut() else {
            unreachable!("filling iclog {} while it is in flight", self.slot)
        };
        pack(buf, self.stream_len, bytes);
        self.stream_len += bytes.len();
    }

    fn op(&mut self, tid: u64, kind: OpKind, mut data: &[u8]) -> Result<(), DeviceError> {
        let mut flags = 0;
        // Only item ops may be split across records; the others are small and must stay whole.
        let splittable = kind == OpKind::Item;
        loop {
            let need = OP_HEADER_BYTES
                + if splittable {
                    usize::from(!data.is_empty())
                } else {
                    data.len()
                };
            if self.capacity - self.stream_len < need {
                self.emit(false)?;
            }
            let room = self.capacity - self.stream_len - OP_HEADER_BYTES;
            let n = data.len().min(room);
            if n < data.len() {
                flags |= OP_CONTINUED;
            }
            let header = OpHeader {
                tid,
                kind,
                flags,
                len: n as u32,
            };
            self.put(&header.encode());
            self.put(&data[..n]);
            data = &data[n..];
            if data.is_empty() {
                return Ok(());
            }
            self.emit(false)?;
            flags = OP_CONTINUATION;
        }
    }

    /// Writes the current iclog; `last` marks the one holding the commit (or unmount) op.
    fn emit(&mut self, last: bool) -> Result<(), DeviceError> {
        let policy = self.w.cfg.policy;
        let ail_flush = policy == FlushPolicy::AilFlush && !self.force_flags;
        let flags = if self.force_flags || policy == FlushPolicy::Legacy {
            WriteFlags::PREFLUSH | WriteFlags::FUA
        } else if !last {
            WriteFlags::NONE
        } else if self.records == 0 && (policy == FlushPolicy::Reduced || self.w.external) {
            // Start and commit share this iclog. Reduced: the pre-checkpoint flush covered the
            // rest. Ail on an external log: the data flush below orders the file data.
            WriteFlags::FUA
        } else {
            // Ail on an internal log, one iclog: the PREFLUSH orders file data written since
            // the last flush, and is elided when there is none.
            WriteFlags::PREFLUSH | WriteFlags::FUA
        };
        if last {
            // The commit iclog goes out only after every earlier iclog completed, so that its
            // PREFLUSH (or the FUA of a one-iclog checkpoint) covers the whole checkpoint.
            self.w.wait_all()?;
            // Its PREFLUSH also makes stable what the AIL wrote back while the body went out
            // (on an internal log the flush is the data device's; legacy flushes the data
            // device before each flagged write to an external log): the commit record may
            // carry the tail as it is now, so that space frees one checkpoint sooner.
            let covers_data = !self.w.external || policy == FlushPolicy::Legacy;
            if ail_flush {
                // Ail: the commit record is ordered after a flush of the data device (its
                // own PREFLUSH, or on an external log a flush here), whose ticket lets the AIL
                // publish what it wrote back before it (`FlushClock`).
                let ticket = self.w.flush_clock.ticket();
                if self.w.external {
                    self.w.data_dev.flush()?;
                    self.w.flush_clock.completed(ticket);
                }
                self.data_flush = Some(ticket);
            }
            // The ail policy's tail is safe to stamp whenever it is sampled.
            if (flags.contains(WriteFlags::PREFLUSH) && covers_data) || ail_flush {
                if let Some(sample) = self.resample_tail.take() {
                    let fresh = sample(self.first.unwrap_or(self.w.head), self.data_flush);
                    debug_assert!(fresh >= self.tail, "tail {fresh} behind {}", self.tail);
                    self.tail = self.tail.max(fresh);
                }
            }
        }
        // A checkpoint's commit iclog may stay in flight (see `write_checkpoint_async`); an
        // unmount record is always written synchronously.
        let wait = last && (self.force_flags || self.w.commit_io.is_none());
        let lsn = self
            .w
            .write_iclog(self.slot, self.stream_len, self.tail, flags, wait)?;
        self.first.get_or_insert(lsn);
        self.records += 1;
        self.w.next_iclog = (self.slot + 1) % self.w.ring.len();
        self.stream_len = 0;
        if !last {
            if self.prior_stable.is_some() && self.w.take_completed_commit() {
                if let Some(f) = self.prior_stable.take() {
                    if !f() {
                        return Err(DeviceError::Io {
                            kind: cilfs_device::IoKind::Write,
                            offset: self.w.log_offset,
                            source: std::io::Error::other(
                                "the journal shut down while a checkpoint was written",
                            ),
                        });
                    }
                }
            }
            self.w.claim()?;
            self.slot = self.w.next_iclog;
        }
        Ok(())
    }

    /// Writes the last iclog; returns the first and last record LSNs, the tail the last one
    /// carries and the ticket of the data flush it was ordered after (ail policy).
    fn finish(mut self) -> Result<(Lsn, Lsn, Lsn, Option<u64>), DeviceError> {
        let last = self.w.head;
        self.emit(true)?;
        Ok((self.first.unwrap_or(last), last, self.tail, self.data_flush))
    }
}
