//! Committing into the CIL, pushing checkpoints, and log forces.

use super::{CilSharding, Journal, JournalError, PushMode, SpaceState};
use crate::buf::{Buf, BufData, LateWrite};
use crate::cil::{commit_bytes, late_bound, BYTES_SHARD};
use crate::log::item::LogItem;
use crate::log::record::OP_HEADER_BYTES;
use crate::log::writer::Written;
use crate::log::{LogWriter, Lsn};
use crate::util::sync::{rank, RankedMutexGuard};
use cilfs_sync::thread::JoinHandle;
use cilfs_sync::{Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

impl Journal {
    /// Waits, holding nothing, while the CIL's current context is over its hard limit (2S)
    /// for the push to switch contexts: what a committer that will not wait in
    /// `commit_images` does before it locks its buffers.
    pub(crate) fn wait_below_hard_limit(&self) {
        if self.cfg.push_mode != PushMode::Background || !self.cil.over_hard_limit() {
            return;
        }
        self.wait_for_room(0);
    }

    /// Waits, holding no shard of the CIL (the push needs them all to switch), while adding
    /// `adding` bytes would take a context that holds something past the hard limit, for the
    /// push to switch contexts.
    fn wait_for_room(&self, adding: u64) {
        let mut blocked_since = None;
        let mut room = self.cil_room.lock();
        while self.limits.commit_waits(&self.cil, adding) && self.check_alive().is_ok() {
            blocked_since.get_or_insert_with(cilfs_sync::time::now);
            self.extra
                .cil_blocked_commits
                .fetch_add(1, Ordering::Relaxed);
            self.request_push(self.cil.seq());
            // The push notifies under `cil_room` once it switched: no wakeup is missed.
            room.wait(&self.cil_switched);
        }
        if let Some(t) = blocked_since {
            self.extra.cil_blocked_us.fetch_add(
                cilfs_sync::time::now()
                    .saturating_duration_since(t)
                    .as_micros() as u64,
                Ordering::Relaxed,
            );
        }
    }

    /// After a throttled commit (`commit_images`) let go of its locks: in inline mode, the
    /// push it owes once the context passed S.
    pub(crate) fn push_if_due(&self) -> Result<(), JournalError> {
        if self.cfg.push_mode != PushMode::Inline || !self.limits.push_due(self.cil.stream_bytes())
        {
            return Ok(());
        }
        self.push(self.cil.seq())
    }

    /// Formats the locked buffers into the current CIL context (relogging replaces older images) and
    /// moves the transaction's reservation into the context's charge.
    /// `late`: a block the transaction writes late (`LateWrite`), kept in the same context.
    /// `images`: the images of `bufs` formatted beforehand (`Transaction::preformat`), each
    /// swapped with the one it replaces in the CIL (empty for a block new to the context).
    /// `throttled`: the committer waited below the hard limit before it locked anything
    /// (`wait_below_hard_limit`), and must not wait here: it holds buffer locks that the AIL
    /// may need to move the tail, which the push may need to switch contexts. The context may
    /// then pass 2S by what commits in flight add, as in XFS, which throttles committers after
    /// they insert.
    pub(crate) fn commit_images(
        &self,
        unit: u64,
        bufs: &[(&Arc<Buf>, &BufData)],
        late: Option<(&Arc<Buf>, &LateWrite)>,
        throttled: bool,
        mut images: Option<&mut [Vec<u8>]>,
    ) -> Result<u64, JournalError> {
        // Image i is block i's: a count that differs would log one block's bytes as another's.
        assert!(
            images.as_ref().is_none_or(|v| v.len() == bufs.len()),
            "{} preformatted images for {} logged blocks",
            images.as_ref().map_or(0, |v| v.len()),
            bufs.len()
        );
        if let Err(e) = self.check_alive() {
            self.release_reservation(unit);
            return Err(e);
        }
        if self.cfg.push_mode == PushMode::Background && !throttled {
            // Committers block at 2S (before adding, so the context passes it only by what
            // commits in flight add) until the push has switched contexts; a transaction
            // larger than 2S goes into an empty one.
            self.wait_for_room(commit_bytes(
                bufs,
                late.is_some(),
                self.block_size() as usize,
            ));
        }
        // A shard of the CIL, held for a moment (the images move in, the charge moves over):
        // its thread's, so that threads seldom meet there; shard 0 for late bytes, whose
        // order is that shard's (`cil/shards.rs`).
        let shard = if late.is_some_and(|(_, w)| !w.bytes.is_empty()) {
            BYTES_SHARD
        } else {
            match self.cfg.cil_sharding {
                CilSharding::ByThread => crate::util::counter::shard(),
                CilSharding::Rotate => {
                    (self.cil_next_shard.fetch_add(1, Ordering::Relaxed) / 2) % 3
                }
            }
        };
        let mut cil = self.cil.lock(shard, &self.cil_waits);
        let seq = cil.seq;
        for (i, &(buf, g)) in bufs.iter().enumerate() {
            let item = || Arc::clone(buf) as Arc<dyn LogItem>;
            match images.as_deref_mut() {
                // The image it replaces comes back in its place, for the caller to free after
                // it lets go of the CIL and its turn.
                Some(images) => cil.insert_with(buf.blkno(), g.version, item, |out| {
                    std::mem::swap(out, &mut images[i])
                }),
                None => cil.insert_with(buf.blkno(), g.version, item, |out| {
                    if out.capacity() == 0 {
                        *out = crate::cil::image_pool::POOL.take();
                    }
                    buf.format_into(g, out)
                }),
            }
        }
        if let Some((buf, w)) = late {
            cil.set_late(buf, w, self.block_size() as usize);
        }
        // Charged per shard: the shards' charges add up to at least the merged context's
        // (`sectors_bound` is subadditive, and the merge only drops images).
        let charge = self.charge_for(cil.stream_bytes);
        let delta = charge.saturating_sub(cil.charge);
        cil.charge = charge.max(cil.charge);
        let bytes = cil.cil_stream_bytes();
        {
            let mut sp = self.space();
            sp.cil_charged += delta;
            // The reservation becomes the context's charge in one step, so no waiter ever sees
            // the space twice.
            let in_use = self.space_in_use_bytes(&sp);
            self.grant.update(|g| {
                assert!(
                    g.reserved >= unit,
                    "committing {unit} of {} reserved bytes",
                    g.reserved
                );
                g.reserved -= unit;
                g.in_use = in_use;
            });
        }
        self.extra.commits.add(1);
        let max = &self.extra.cil_bytes_max.0;
        if bytes > max.load(Ordering::Relaxed) {
            max.fetch_max(bytes, Ordering::Relaxed);
        }
        if self.limits.past_hard(bytes) {
            cil.set_over_hard_limit();
        }
        if !self.limits.push_due(bytes) {
            return Ok(seq);
        }
        match self.cfg.push_mode {
            // Pushed by the committer once it let go of its locks (`push_if_due`).
            PushMode::Inline if throttled => {}
            PushMode::Inline => {
                drop(cil);
                self.push(seq)?;
            }
            PushMode::Background => {
                drop(cil);
                self.request_push(seq);
            }
        }
        Ok(seq)
    }

    /// Log bytes charged for a context whose op stream is `stream` bytes.
    pub(crate) fn charge_for(&self, stream: u64) -> u64 {
        self.cfg.log.sectors_bound(stream) * 512
    }

    /// Makes every checkpoint up to `seq` stable. Concurrent forcers share one checkpoint.
    pub fn force(&self, seq: u64) -> Result<(), JournalError> {
        self.counters.log_forces.fetch_add(1, Ordering::Relaxed);
        self.push(seq)
    }

    /// Forces everything committed so far.
    pub fn force_all(&self) -> Result<(), JournalError> {
        self.force(self.cil.seq())
    }

    /// The current CIL sequence: what a commit now would join.
    pub fn current_seq(&self) -> u64 {
        self.cil.seq()
    }

    pub fn completed_seq(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// Checkpoint `seq` is stable; `space`'s lock is held (as `_held`), for the waiters on
    /// `checkpoint_done`.
    fn set_completed_seq(&self, _held: &mut SpaceState, seq: u64) {
        debug_assert!(seq >= self.completed_seq(), "completed sequence going back");
        self.completed.store(seq, Ordering::Release);
    }

    /// Pushes CIL contexts until checkpoint `seq` is stable. Pushes are serialised by the writer
    /// lock, so commit records reach the log in sequence order.
    ///
    /// With the write queue a checkpoint's commit iclog is still in flight when the next
    /// context is already big enough to push (S) or is needed for `seq`: the next checkpoint
    /// is then written first, and the earlier one completes when its commit has, so the commit
    /// write's flushes overlap the next checkpoint's body instead of stalling the pusher (and
    /// the committers blocked at 2S behind it). Completions still run in sequence order.
    pub(crate) fn push(&self, seq: u64) -> Result<(), JournalError> {
        self.push_inner(seq, false)
    }

    /// Writes a checkpoint even if the CIL is empty, so that a stable record carries the
    /// current tail (see `free_space`).
    pub(crate) fn push_carrying_tail(&self) -> Result<(), JournalError> {
        let seq = self.current_seq();
        self.push_inner(seq, true)
    }

    fn push_inner(&self, seq: u64, write_empty: bool) -> Result<(), JournalError> {
        self.check_alive()?;
        self.force_target.fetch_max(seq, Ordering::Relaxed);
        let Some(mut writer) = self.writer_unless_done(seq)? else {
            return Ok(());
        };
        let r = self.push_locked(&mut writer, seq, write_empty);
        self.release_writer(writer);
        r
    }

    /// Lets go of the writer and wakes forcers that found it taken: they try again, or find
    /// their checkpoint done. Every holder of the writer releases it through here.
    pub(crate) fn release_writer(&self, writer: RankedMutexGuard<'_, LogWriter, { rank::WRITER }>) {
        drop(writer);
        let _sp = self.space();
        self.checkpoint_done.notify_all();
    }

    /// The writer lock, or `None` once checkpoint `seq` is complete. A forcer whose checkpoint
    /// another pusher completes returns then, instead of queueing for the writer: under steady
    /// load the pusher keeps it for a long run of overlapped checkpoints.
    fn writer_unless_done(
        &self,
        seq: u64,
    ) -> Result<Option<RankedMutexGuard<'_, LogWriter, { rank::WRITER }>>, JournalError> {
        let mut sp = self.space();
        loop {
            if self.completed_seq() >= seq {
                return Ok(None);
            }
            // Never blocks with `space` held (the writer is taken before `space` elsewhere).
            if let Some(w) = self.writer.try_lock() {
                return Ok(Some(w));
            }
            self.check_alive()?;
            // Woken by every completion and every release of the writer (`release_writer`);
            // the timeout is only a net.
            sp.wait_for(&self.checkpoint_done, std::time::Duration::from_millis(10));
        }
    }

    fn push_locked(
        &self,
        writer: &mut LogWriter,
        seq: u64,
        mut write_empty: bool,
    ) -> Result<(), JournalError> {
        let mut in_flight: Option<InFlight> = None;
        loop {
            if let Some(f) = in_flight.take() {
                let want = seq.max(self.force_target.load(Ordering::Relaxed));
                let next_ready = !self.cil.is_empty()
                    && (self.cil.seq() <= want || self.limits.push_due(self.cil.stream_bytes()));
                // A commit that already completed is completed now: its items reach the AIL
                // and its forcers go before the next body is written.
                if !next_ready || !writer.commit_pending() || self.check_alive().is_err() {
                    if let Err(e) = writer.wait_commit() {
                        return self.shut_down(e);
                    }
                    self.complete_checkpoint(f)?;
                    continue;
                }
                in_flight = Some(f);
                self.extra
                    .overlapped_checkpoints
                    .fetch_add(1, Ordering::Relaxed);
            } else if self.completed_seq() >= seq {
                return Ok(());
            }
            self.check_alive()?;
            let ctx = self.cil.switch(self.block_size() as usize);
            {
                let _room = self.cil_room.lock();
                self.cil_switched.notify_all();
            }
            let carry_tail = std::mem::take(&mut write_empty);
            if ctx.is_empty() {
                if carry_tail {
                    self.extra.tail_records.fetch_add(1, Ordering::Relaxed);
                } else {
                    // Only reached with nothing in flight: one in flight is followed only by a
                    // context seen non-empty, and committers only add to it.
                    debug_assert!(in_flight.is_none());
                    // A commit that logged nothing was still charged for a checkpoint's own
                    // ops: given back, or the log would shrink by that much for good.
                    let mut sp = self.space();
                    sp.cil_charged -= ctx.charge;
                    self.set_completed_seq(&mut sp, ctx.seq);
                    self.publish_space(&sp);
                    self.checkpoint_done.notify_all();
                    continue;
                }
            }
            let nitems = ctx.items.len() as u64;
            let bound = late_bound(self.block_size() as usize) as usize - OP_HEADER_BYTES;
            let (items, mut images): (Vec<_>, Vec<_>) = ctx
                .items
                .into_values()
                .map(|mut e| {
                    if let Some((buf, w)) = &e.late {
                        buf.apply_late(w, &mut e.image);
                        // What the context was charged for: more would overrun the log.
                        assert!(
                            e.image.len() <= bound,
                            "block {} logged late as {} bytes, counted as {bound}",
                            buf.blkno(),
                            e.image.len()
                        );
                    }
                    (e.item, e.image)
                })
                .unzip();
            // Until the checkpoint in flight completes its items are not in the AIL, so the
            // tail this one stamps must not pass its start. The cap stays for the commit
            // record's sample even if that one completed meanwhile (safe, if less fresh).
            let floor = in_flight.as_ref().map(|f| f.written.start);
            // The one in flight completes as soon as its commit has, while this body is written.
            let mut completed = Ok(());
            let written = writer.write_checkpoint_async(
                ctx.seq,
                images.iter(),
                |start, flush| {
                    // Deferred write back that a completed flush covered (or the flush this
                    // record is ordered after will) no longer holds the tail (ail policy).
                    let upto = flush.unwrap_or(0).max(self.flush_clock.completed_upto());
                    let tail = self
                        .ail
                        .lock()
                        .min_lsn_after_flush(upto)
                        .unwrap_or(start)
                        .min(start);
                    floor.map_or(tail, |f| tail.min(f))
                },
                &mut || {
                    if let Some(f) = in_flight.take() {
                        completed = self.complete_checkpoint(f);
                    }
                    completed.is_ok()
                },
            );
            // Copied into iclogs: the vectors go back for committers to format into (those the
            // spare list does not keep are freed here, outside its lock).
            crate::cil::image_pool::POOL.give_spare(&mut images);
            drop(images);
            completed?;
            let written = match written {
                Ok(w) => w,
                Err(e) => return self.shut_down(e),
            };
            // Its commit iclog waited for every earlier write: the one in flight is stable.
            if let Some(f) = in_flight.take() {
                self.complete_checkpoint(f)?;
            }
            let f = InFlight {
                seq: ctx.seq,
                charge: ctx.charge,
                nitems,
                items,
                written,
                end: writer.head(),
            };
            if writer.commit_in_flight() {
                in_flight = Some(f);
            } else {
                self.complete_checkpoint(f)?;
            }
        }
    }

    /// A checkpoint is stable: its items go to the AIL at its start LSN and are unpinned, its
    /// charge becomes log space used up to its end, and forcers waiting for it may go.
    fn complete_checkpoint(&self, f: InFlight) -> Result<(), JournalError> {
        self.extra
            .items_logged
            .fetch_add(f.nitems, Ordering::Relaxed);
        // Its commit record was ordered after this flush of the data device, complete now:
        // write back done before it may let the tail go (ail policy, `ail_push_ahead`).
        if let Some(ticket) = f.written.data_flush {
            self.flush_clock.completed(ticket);
        }
        {
            // Unpinned and moved under one hold of the AIL lock, under which the AIL thread
            // looks at pins (`Ail::prepare_batch`): it sees them pinned where they were, or
            // unpinned where they are.
            let mut ail = self.ail.lock();
            for item in &f.items {
                let prev = item.pins().fetch_sub(1, Ordering::AcqRel);
                debug_assert!(prev > 0, "unpinning an unpinned item");
            }
            ail.insert_all(f.written.start, f.items);
        }
        {
            let mut sp = self.space();
            sp.cil_charged -= f.charge;
            // Against the body records' tail: recovery starts there if the commit is lost.
            let used = self.space_math.distance(f.written.body_tail, f.end);
            assert!(
                used <= u64::from(self.space_math.sectors),
                "log head {} overran the tail {}",
                f.end,
                f.written.body_tail
            );
            sp.head = f.end;
            sp.safe_tail = sp.safe_tail.max(f.written.tail);
            self.set_completed_seq(&mut sp, f.seq);
            self.publish_space(&sp);
            self.checkpoint_done.notify_all();
        }
        // Keep a quarter of the log free ahead of need (docs/journal.md section 4): on the AIL
        // thread when there is one, so the pusher never waits for metadata writeback.
        match self.ail_worker.lock().as_ref() {
            Some(a) => a.kick(),
            None => self.ail_push_ahead()?,
        }
        Ok(())
    }

    /// A worker (push or AIL) stops on an error: the journal must not stay up without it, or
    /// committers at the CIL's hard limit, or reservations waiting for log space, would wait
    /// for a worker that is gone. Every error of theirs shuts the journal down already; this
    /// keeps it so for any that would not.
    pub(crate) fn worker_failed(&self, e: JournalError) {
        if !self.is_shut_down() {
            let _ = self.shut_down::<()>(e);
        }
    }

    pub(crate) fn request_push(&self, seq: u64) {
        if let Some(w) = self.worker.lock().as_ref() {
            w.request(seq);
        }
    }

    /// Kills the journal as a dying daemon's threads stop: every commit from now on fails
    /// (a committer waiting for the push is woken to fail), the push and AIL workers stop and
    /// write nothing more, and the log writes in flight complete now, as a dead process's IO
    /// does before its image can be opened again: none may land after the next mount read the
    /// log. What was written stays as it is (nothing is forced). The crash explorers kill a
    /// mount this way before they mount its devices again.
    pub fn kill(&self) {
        self.stop_commits();
        self.stop_worker();
        let mut w = self.writer.lock();
        // Failed or not, nothing of it is waited for again.
        let _ = w.settle();
    }

    pub(crate) fn stop_worker(&self) {
        let w = self.worker.lock().take();
        if let Some(w) = w {
            w.stop();
        }
        let a = self.ail_worker.lock().take();
        if let Some(a) = a {
            a.stop();
        }
    }
}

/// A checkpoint written but not yet completed (see `Journal::push`).
struct InFlight {
    seq: u64,
    charge: u64,
    nitems: u64,
    items: Vec<Arc<dyn LogItem>>,
    written: Written,
    /// The log head just past its commit record.
    end: Lsn,
}

/// The longest the worker lets the log go without a push before it forces it (or, with no
/// commits meanwhile, covers it), as XFS's log worker (xfssyncd_centisecs).
const LOG_FORCE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
/// A shorter interval would keep the worker pushing empty contexts in a loop.
const MIN_LOG_FORCE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

#[derive(Debug, Default)]
struct WorkerState {
    target: u64,
    stop: bool,
}

/// The background CIL push worker.
#[derive(Debug)]
pub(crate) struct Worker {
    shared: Arc<(Mutex<WorkerState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    pub(crate) fn start(j: &Arc<Journal>) -> Self {
        let shared = Arc::new((Mutex::new(WorkerState::default()), Condvar::new()));
        let weak: Weak<Journal> = Arc::downgrade(j);
        let s = Arc::clone(&shared);
        let interval = j
            .cfg
            .log_force_interval
            .unwrap_or(LOG_FORCE_INTERVAL)
            .max(MIN_LOG_FORCE_INTERVAL);
        let thread = cilfs_sync::thread::spawn_named("cilfs-cil-push", move || {
            let mut commits_seen = u64::MAX;
            loop {
                let target = {
                    let mut st = s.0.lock();
                    while st.target == 0 && !st.stop {
                        if s.1.wait_for(&mut st, interval).timed_out() {
                            break;
                        }
                    }
                    if st.stop {
                        return;
                    }
                    std::mem::take(&mut st.target)
                };
                let Some(j) = weak.upgrade() else { return };
                if target > 0 {
                    if let Err(e) = j.push(target) {
                        return j.worker_failed(e);
                    }
                    continue;
                }
                // An interval without a push. Commits since the last look are forced into
                // a checkpoint, as XFS's log worker forces the log every 30 s: otherwise a
                // load that never fills the CIL to its limit would never be made durable
                // before a sync. A whole interval without commits covers the log.
                let commits = j.extra.commits.get();
                let r = if commits == commits_seen {
                    j.cover().map(drop)
                } else {
                    j.push(j.current_seq())
                };
                if let Err(e) = r {
                    return j.worker_failed(e);
                }
                commits_seen = commits;
            }
        })
        .ok();
        Self { shared, thread }
    }

    fn request(&self, seq: u64) {
        let mut st = self.shared.0.lock();
        st.target = st.target.max(seq);
        self.shared.1.notify_one();
    }

    fn stop(mut self) {
        self.shared.0.lock().stop = true;
        self.shared.1.notify_one();
        if let Some(t) = self.thread.take() {
            // The worker itself may drop the last reference to the journal (it upgrades a weak
            // one while pushing); it then only has to return, not join itself.
            if t.thread().id() != cilfs_sync::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
