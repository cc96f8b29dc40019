//! The walk over the log: the head found by the cycle stamps, the last valid record before it
//! and the tail it names, then every valid record from the tail on, assembled into the
//! checkpoints they commit. Where the walk stops early it looks on for records that chain on
//! past the failure, which make it damage rather than a torn write.

use super::{LogRegion, RecoveryError};
use crate::log::item_format::{decode_item, BufImage};
use crate::log::lsn::Lsn;
use crate::log::record::{
    parse_ops, record_crc, stamp_of, unpack, Op, OpKind, RecordHeader, OP_CONTINUATION,
    OP_CONTINUED, SECTOR,
};
use std::collections::HashMap;

/// One op as logprint shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpSummary {
    pub tid: u64,
    pub kind: OpKind,
    pub flags: u8,
    pub len: u32,
    /// For an item op that is complete in this record: the block it logs.
    pub blkno: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    pub header: RecordHeader,
    pub sectors: u32,
    pub ops: Vec<OpSummary>,
}

/// A committed checkpoint read from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub seq: u64,
    pub start: Lsn,
    pub commit: Lsn,
    pub items: Vec<BufImage>,
}

/// Why the walk stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEnd {
    /// The next sector belongs to an older cycle: the normal end of the log.
    Clean,
    /// A record at the head failed validation: a torn or lost write, discarded.
    Torn { lsn: Lsn, reason: String },
    /// A record failed validation and valid records chain on past it up to `commit`, a commit
    /// (or unmount) record: damage in the stable part of the log, not a torn write. The walk
    /// stopped at the damage; `lost` checkpoints committed past it are not in `checkpoints`.
    Damaged {
        lsn: Lsn,
        reason: String,
        commit: Lsn,
        lost: Vec<u64>,
    },
    /// The walk covered the whole log.
    Full,
}

#[derive(Debug, Clone)]
pub struct LogScan {
    pub tail: Lsn,
    /// Where the next record goes.
    pub head: Lsn,
    /// Highest generation among the valid records (0 if none).
    pub generation: u32,
    pub records: Vec<RecordInfo>,
    pub checkpoints: Vec<Checkpoint>,
    /// Checkpoints begun but not committed in the valid part of the log (not replayed).
    pub uncommitted: Vec<u64>,
    /// The last valid record is an unmount record.
    pub unmounted: bool,
    pub end: LogEnd,
}

impl LogScan {
    /// Nothing to replay.
    pub fn is_clean(&self) -> bool {
        self.checkpoints.is_empty()
    }
}

impl LogEnd {
    /// What the end says to an administrator: None for the normal end of the log.
    pub fn describe(&self) -> Option<String> {
        match self {
            LogEnd::Clean | LogEnd::Full => None,
            LogEnd::Torn { lsn, reason } => Some(format!(
                "the log ends in a torn or lost write at lsn {lsn} ({reason}): what follows it \
                 was in flight at the crash and was never committed"
            )),
            LogEnd::Damaged {
                lsn,
                reason,
                commit,
                lost,
            } => Some(format!(
                "the log is damaged at lsn {lsn} ({reason}), and valid records follow it up to \
                 a commit record at lsn {commit}: {} committed checkpoint(s) ({}) lie past the \
                 damage",
                lost.len(),
                lost.iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// How far past a failed record the walk looks for records that chain on (`committed_past`):
/// more than the largest iclog (256 KiB) and a damaged block around it.
const LOOK_PAST_SECTORS: u32 = 4096;

/// What is at a log position.
enum RecordRead {
    Valid(RecordHeader, Vec<u8>),
    /// The first sector belongs to another cycle: the end of the log.
    OtherCycle,
    /// Not a valid record, and why.
    Invalid(String),
}

/// Validates and reads the record at `lsn`.
fn read_record(region: &LogRegion<'_>, lsn: Lsn) -> Result<RecordRead, RecoveryError> {
    let mut first = [0u8; SECTOR];
    region.read(lsn.block(), &mut first)?;
    if stamp_of(&first) != lsn.cycle() {
        return Ok(RecordRead::OtherCycle);
    }
    if lsn.cycle() == u32::MAX {
        // No log wraps four billion times; such a stamp is garbage, and the next cycle would
        // not be representable.
        return Ok(RecordRead::Invalid(
            "cycle stamp at its maximum value".into(),
        ));
    }
    let h = match RecordHeader::decode(&first) {
        Ok(h) => h,
        Err(e) => return Ok(RecordRead::Invalid(e.to_string())),
    };
    if h.lsn != lsn {
        return Ok(RecordRead::Invalid(format!("header names lsn {}", h.lsn)));
    }
    let sectors = h.total_sectors();
    if sectors as u64 > u64::from(region.space.sectors) / 2 {
        return Ok(RecordRead::Invalid(format!("record of {sectors} sectors")));
    }
    let rec = region.read_wrapping(lsn, sectors)?;
    let to_end = (region.space.sectors - lsn.block()) as usize;
    for (i, s) in rec.chunks(SECTOR).enumerate() {
        let want = if i < to_end {
            lsn.cycle()
        } else {
            lsn.cycle() + 1
        };
        if stamp_of(s) != want {
            return Ok(RecordRead::Invalid(format!(
                "sector {i} of the record has cycle {}, expected {want}",
                stamp_of(s)
            )));
        }
    }
    let crc = record_crc(&rec);
    if crc != h.crc {
        return Ok(RecordRead::Invalid(format!(
            "checksum mismatch (stored {:#010x}, computed {crc:#010x})",
            h.crc
        )));
    }
    Ok(RecordRead::Valid(h, rec))
}

/// The first sector whose cycle differs from sector 0's, by binary search: the head of a log
/// written without holes. Holes only move the real head back; the walk finds it.
fn rough_head(region: &LogRegion<'_>) -> Result<Lsn, RecoveryError> {
    let n = region.space.sectors;
    let c0 = region.stamp(0)?;
    if region.stamp(n - 1)? == c0 {
        // Saturating: a maximal stamp is garbage, and the record reads refuse it.
        return Ok(Lsn::new(c0.saturating_add(1), 0));
    }
    let (mut lo, mut hi) = (0u32, n - 1); // stamp(lo) == c0, stamp(hi) != c0
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if region.stamp(mid)? == c0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Lsn::new(c0, hi))
}

/// Searches back from `head` for the last valid record; returns its header.
fn last_record_before(
    region: &LogRegion<'_>,
    head: Lsn,
) -> Result<Option<RecordHeader>, RecoveryError> {
    let n = region.space.sectors;
    let mut pos = head;
    for _ in 0..n {
        pos = if pos.block() == 0 {
            if pos.cycle() <= 1 {
                return Ok(None);
            }
            Lsn::new(pos.cycle() - 1, n - 1)
        } else {
            Lsn::new(pos.cycle(), pos.block() - 1)
        };
        if let RecordRead::Valid(h, _) = read_record(region, pos)? {
            return Ok(Some(h));
        }
    }
    Ok(None)
}

#[derive(Debug, Default)]
struct Building {
    start: Lsn,
    items: Vec<BufImage>,
    partial: Option<Vec<u8>>,
}

/// Finds head and tail and reads every valid record from the tail on.
pub fn scan_log(region: &LogRegion<'_>, block_size: u32) -> Result<LogScan, RecoveryError> {
    let rough = if region.stamp(0)? == 0 {
        None
    } else {
        Some(rough_head(region)?)
    };
    let last = match rough {
        Some(r) => last_record_before(region, r)?,
        None => None,
    };
    let Some(last) = last else {
        return scan_without_records(region, rough.is_some());
    };
    let tail = last.tail;
    if tail.block() >= region.space.sectors {
        return Err(RecoveryError::Corrupt {
            lsn: last.lsn,
            offset: region.byte_offset(last.lsn),
            reason: format!(
                "tail {tail} lies outside the {}-sector log",
                region.space.sectors
            ),
        });
    }
    let mut walk = Walk {
        region,
        block_size,
        scan: LogScan::empty(tail),
        building: HashMap::new(),
        prev: None,
    };
    let (head, stopped) = walk.run()?;
    let Walk {
        mut scan,
        building,
        prev,
        ..
    } = walk;
    scan.head = head;
    if let Some(reason) = stopped {
        let after = prev.unwrap_or(last);
        if let Some((commit, lost)) = committed_past(region, head, &after)? {
            scan.end = LogEnd::Damaged {
                lsn: head,
                reason,
                commit,
                lost,
            };
        }
    }
    let mut uncommitted: Vec<u64> = building.into_keys().collect();
    uncommitted.sort_unstable();
    scan.uncommitted = uncommitted;
    Ok(scan)
}

impl LogScan {
    /// A log with no records, whose next record goes at `head`.
    fn empty(head: Lsn) -> Self {
        LogScan {
            tail: head,
            head,
            generation: 0,
            records: Vec::new(),
            checkpoints: Vec::new(),
            uncommitted: Vec::new(),
            unmounted: false,
            end: LogEnd::Clean,
        }
    }
}

/// The scan of a log with no record where the cycle stamps lead (`stamped`: sector 0 carries
/// a cycle; else the log was never written, or is damaged at its start). A log with a commit
/// record anywhere is damaged, not empty.
fn scan_without_records(region: &LogRegion<'_>, stamped: bool) -> Result<LogScan, RecoveryError> {
    if let Some((commit, lost, cycle)) = commit_records_anywhere(region)? {
        let mut scan = LogScan::empty(Lsn::new(cycle.saturating_add(1), 0));
        scan.end = LogEnd::Damaged {
            lsn: Lsn::new(1, 0),
            reason: "no valid record where the cycle stamps lead".into(),
            commit,
            lost,
        };
        return Ok(scan);
    }
    if !stamped {
        return Ok(LogScan::empty(Lsn::new(1, 0)));
    }
    // Nothing was ever committed. Start a fresh cycle so that no old sector can be
    // mistaken for a new one.
    let c = region
        .stamp(0)?
        .max(region.stamp(region.space.sectors - 1)?);
    match c.checked_add(1) {
        Some(next) => Ok(LogScan::empty(Lsn::new(next, 0))),
        None => Err(RecoveryError::Corrupt {
            lsn: Lsn::new(c, 0),
            offset: 0,
            reason: "cycle stamp at its maximum value".into(),
        }),
    }
}

/// The walk over the valid records from the tail (`scan.tail`), and what it has gathered.
struct Walk<'r, 'a> {
    region: &'r LogRegion<'a>,
    block_size: u32,
    scan: LogScan,
    /// Checkpoints begun and not yet committed, by sequence.
    building: HashMap<u64, Building>,
    /// The last valid record.
    prev: Option<RecordHeader>,
}

/// What the walk does at a log position.
enum Step {
    /// Takes in this valid record.
    Record(RecordHeader, Vec<u8>),
    /// Stops here: before the end of the log, for the reason given, or at the end of the
    /// log's space (None).
    Stop(Option<String>),
}

impl Walk<'_, '_> {
    /// Reads records from the tail on until one fails or the whole log is covered. Returns
    /// where the next record goes, and why the walk stopped before the end of the log, if it
    /// did (`scan.end` says how it ended).
    fn run(&mut self) -> Result<(Lsn, Option<String>), RecoveryError> {
        let space = self.region.space;
        let tail = self.scan.tail;
        let mut pos = tail;
        self.scan.end = LogEnd::Full;
        while space.distance(tail, pos) < u64::from(space.sectors) {
            let (h, rec) = match self.step(pos)? {
                Step::Record(h, rec) => (h, rec),
                Step::Stop(stopped) => return Ok((pos, stopped)),
            };
            self.take_record(pos, h, &rec)?;
            pos = space.advance(pos, h.total_sectors() as u32);
        }
        Ok((pos, None))
    }

    /// Whether the walk goes on with the record at `pos`: it must be valid, chain on after
    /// the last one (same or later generation) and fit in what is left of the log. Sets
    /// `scan.end` where the walk stops.
    ///
    /// A record's tail may be behind the one before it: with the ail policy a commit record
    /// stamps a tail its own pre-flush makes true, while the next checkpoint's body, written as
    /// that commit is in flight, stamps one that holds without it. Each claim holds where its
    /// record is on disk, so the newest record's tail is where the walk starts, as in XFS.
    fn step(&mut self, pos: Lsn) -> Result<Step, RecoveryError> {
        let (h, rec) = match read_record(self.region, pos)? {
            RecordRead::Valid(h, rec) => (h, rec),
            RecordRead::OtherCycle => {
                self.scan.end = LogEnd::Clean;
                let cycle = self.region.stamp(pos.block())?;
                return Ok(Step::Stop(Some(format!("sector of cycle {cycle}"))));
            }
            RecordRead::Invalid(reason) => {
                self.scan.end = LogEnd::Torn {
                    lsn: pos,
                    reason: reason.clone(),
                };
                return Ok(Step::Stop(Some(reason)));
            }
        };
        if let Some(p) = self.prev {
            if h.generation < p.generation {
                let reason = format!(
                    "stale record (generation {}) after generation {}",
                    h.generation, p.generation
                );
                self.scan.end = LogEnd::Torn {
                    lsn: pos,
                    reason: reason.clone(),
                };
                return Ok(Step::Stop(Some(reason)));
            }
        }
        let space = self.region.space;
        if space.distance(self.scan.tail, pos) + h.total_sectors() as u64 > u64::from(space.sectors)
        {
            self.scan.end = LogEnd::Full;
            return Ok(Step::Stop(None));
        }
        Ok(Step::Record(h, rec))
    }

    /// Takes in the valid record `h` at `pos` (its sectors `rec`): its ops, and the
    /// checkpoints they begin, add items to and commit.
    fn take_record(&mut self, pos: Lsn, h: RecordHeader, rec: &[u8]) -> Result<(), RecoveryError> {
        let region = self.region;
        let stream = unpack(rec, h.payload_len as usize);
        let ops = parse_ops(&stream)
            .map_err(|(at, e)| corrupt(region, pos, format!("op at stream byte {at}: {e}")))?;
        let mut info = RecordInfo {
            header: h,
            sectors: h.total_sectors() as u32,
            ops: Vec::with_capacity(ops.len()),
        };
        self.scan.unmounted = false;
        for op in ops {
            let blkno = self.take_op(pos, &op)?;
            let oh = op.header;
            info.ops.push(OpSummary {
                tid: oh.tid,
                kind: oh.kind,
                flags: oh.flags,
                len: oh.len,
                blkno,
            });
        }
        self.scan.generation = self.scan.generation.max(h.generation);
        self.scan.records.push(info);
        self.prev = Some(h);
        Ok(())
    }

    /// One op of the record at `pos`. Returns the block it logs, for an item op complete in
    /// this record.
    fn take_op(&mut self, pos: Lsn, op: &Op<'_>) -> Result<Option<u64>, RecoveryError> {
        let region = self.region;
        let oh = op.header;
        let mut blkno = None;
        match oh.kind {
            OpKind::Start => {
                if oh.flags != 0
                    || self
                        .building
                        .insert(
                            oh.tid,
                            Building {
                                start: pos,
                                ..Default::default()
                            },
                        )
                        .is_some()
                {
                    return Err(corrupt(
                        region,
                        pos,
                        format!("second start of checkpoint {}", oh.tid),
                    ));
                }
            }
            OpKind::Item => {
                let b = self.building.get_mut(&oh.tid).ok_or_else(|| {
                    corrupt(
                        region,
                        pos,
                        format!("item of checkpoint {} before its start", oh.tid),
                    )
                })?;
                let mut data = match (b.partial.take(), oh.flags & OP_CONTINUATION != 0) {
                    (None, false) => op.data.to_vec(),
                    (Some(mut p), true) => {
                        p.extend_from_slice(op.data);
                        p
                    }
                    _ => {
                        return Err(corrupt(
                            region,
                            pos,
                            "item continuation out of order".into(),
                        ))
                    }
                };
                if oh.flags & OP_CONTINUED != 0 {
                    b.partial = Some(std::mem::take(&mut data));
                } else {
                    let img = decode_item(&data, self.block_size)
                        .map_err(|e| corrupt(region, pos, e.to_string()))?;
                    blkno = Some(img.blkno);
                    b.items.push(img);
                }
            }
            OpKind::Commit => {
                let b = self.building.remove(&oh.tid).ok_or_else(|| {
                    corrupt(
                        region,
                        pos,
                        format!("commit of checkpoint {} without start", oh.tid),
                    )
                })?;
                let count = op
                    .data
                    .try_into()
                    .map(u64::from_le_bytes)
                    .unwrap_or(u64::MAX);
                if b.partial.is_some() || count != b.items.len() as u64 {
                    return Err(corrupt(
                        region,
                        pos,
                        format!(
                            "commit of checkpoint {} counts {count} items, log holds {}",
                            oh.tid,
                            b.items.len()
                        ),
                    ));
                }
                self.scan.checkpoints.push(Checkpoint {
                    seq: oh.tid,
                    start: b.start,
                    commit: pos,
                    items: b.items,
                });
            }
            OpKind::Unmount => self.scan.unmounted = true,
        }
        Ok(blkno)
    }
}

/// The error for a record at `lsn` that is valid but holds what the log format forbids.
fn corrupt(region: &LogRegion<'_>, lsn: Lsn, reason: String) -> RecoveryError {
    RecoveryError::Corrupt {
        lsn,
        offset: region.byte_offset(lsn),
        reason,
    }
}

/// Looks past `stop`, where the walk found no valid record, for valid records that chain on
/// after `prev` (the last valid one: same or later generation), up to a
/// commit or unmount record. A crash can leave only iclogs that were in flight past a torn
/// write, and a commit iclog is issued only once every iclog before it has completed, with a
/// pre-flush: a commit record past `stop` means the record at `stop` was stable, and is
/// damaged. Returns the first such record and the checkpoints committed past `stop`.
///
/// Each run of valid records is followed to its end, and the search goes on from there (more
/// damage may cut the log again), for at most `LOOK_PAST_SECTORS` sectors between runs.
fn committed_past(
    region: &LogRegion<'_>,
    stop: Lsn,
    prev: &RecordHeader,
) -> Result<Option<(Lsn, Vec<u64>)>, RecoveryError> {
    let space = region.space;
    let total = u64::from(space.sectors);
    let mut lost = Vec::new();
    let mut first_commit = None;
    let mut last = *prev;
    let mut cursor = stop;
    'search: while space.distance(stop, cursor) < total {
        let window = LOOK_PAST_SECTORS
            .min((total - space.distance(stop, cursor)) as u32)
            .saturating_sub(1);
        // One read of the window; a record is tried only where a sector carries the cycle its
        // place would have (most mounts stop at sectors of the previous cycle: no more reads).
        let sectors = region.read_wrapping(cursor, window as usize + 1)?;
        for k in 1..=window {
            let at = space.advance(cursor, k);
            let s = &sectors[k as usize * SECTOR..(k as usize + 1) * SECTOR];
            if stamp_of(s) != at.cycle() {
                continue;
            }
            let RecordRead::Valid(h, _) = read_record(region, at)? else {
                continue;
            };
            if h.generation < last.generation {
                continue;
            }
            // A record that chains on: follow the run to its end, then search past it.
            let mut pos = at;
            while space.distance(stop, pos) < total {
                let RecordRead::Valid(h, rec) = read_record(region, pos)? else {
                    break;
                };
                let stream = unpack(&rec, h.payload_len as usize);
                if h.generation < last.generation {
                    break;
                }
                let Ok(ops) = parse_ops(&stream) else {
                    break;
                };
                for op in ops {
                    match op.header.kind {
                        OpKind::Commit => {
                            lost.push(op.header.tid);
                            first_commit = first_commit.or(Some(pos));
                        }
                        OpKind::Unmount => first_commit = first_commit.or(Some(pos)),
                        OpKind::Start | OpKind::Item => {}
                    }
                }
                last = h;
                pos = space.advance(pos, h.total_sectors() as u32);
            }
            cursor = pos;
            continue 'search;
        }
        break;
    }
    // With no commit past the stop, whatever chains on was in flight: a torn end after all.
    Ok(first_commit.map(|c| (c, lost)))
}

/// Every valid record in the log, wherever it is (a record names its own place): used only
/// when the cycle stamps lead to none. Returns the first commit or unmount record, the
/// checkpoints committed, and the highest cycle seen.
fn commit_records_anywhere(
    region: &LogRegion<'_>,
) -> Result<Option<(Lsn, Vec<u64>, u32)>, RecoveryError> {
    let n = region.space.sectors;
    let mut found: Option<Lsn> = None;
    let mut lost = Vec::new();
    let mut cycle = 0u32;
    let mut at = 0u32;
    while at < n {
        let len = LOOK_PAST_SECTORS.min(n - at);
        let mut chunk = vec![0u8; len as usize * SECTOR];
        region.read(at, &mut chunk)?;
        for (k, sector) in chunk.chunks(SECTOR).enumerate() {
            let block = at + k as u32;
            let Ok(h) = RecordHeader::decode(sector) else {
                continue;
            };
            if h.lsn.block() != block || h.lsn.cycle() == 0 {
                continue;
            }
            let RecordRead::Valid(h, rec) = read_record(region, h.lsn)? else {
                continue;
            };
            let stream = unpack(&rec, h.payload_len as usize);
            let Ok(ops) = parse_ops(&stream) else {
                continue;
            };
            cycle = cycle.max(h.lsn.cycle());
            for op in ops {
                match op.header.kind {
                    OpKind::Commit => {
                        lost.push(op.header.tid);
                        found = found.or(Some(h.lsn));
                    }
                    OpKind::Unmount => found = found.or(Some(h.lsn)),
                    OpKind::Start | OpKind::Item => {}
                }
            }
        }
        at += len;
    }
    Ok(found.map(|f| (f, lost, cycle)))
}
