//! Reading the log back: head and tail discovery by cycle stamps, a walk over the valid records
//! from the tail, checkpoint assembly, and replay of committed checkpoints onto the data device.
//!
//! The walk trusts a record only if its sector stamps carry the cycle of their position, its
//! header names its own LSN, its CRC matches, and its mount generation and tail do not go back.
//! The first record that fails ends the log: a torn or lost write (holes can only follow the last
//! stable commit record, because every commit iclog is PREFLUSH+FUA) or the old end of the log.
//! Unless valid records chain on past it up to a commit or unmount record: those were written
//! after everything before them was stable, so the failed record was stable too and is damage,
//! not a crash's torn write (`LogEnd::Damaged`, which refuses a mount).
//! Records of an older mount generation beyond the head can never be chained on later, because
//! every mount raises the generation in the superblock before it writes the log.

use super::item_format::{decode_item, BufImage};
use super::lsn::{LogSpace, Lsn, LOG_SECTOR};
use super::record::{
    parse_ops, record_crc, stamp_of, unpack, OpKind, RecordHeader, OP_CONTINUATION, OP_CONTINUED,
    SECTOR,
};
use cilfs_device::{Device, DeviceError, WriteFlags};
use std::collections::HashMap;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RecoveryError {
    #[error("reading the log at byte {offset}: {source}")]
    Device { offset: u64, source: DeviceError },
    #[error("corrupt log record at lsn {lsn} (log byte {offset}): {reason}")]
    Corrupt {
        lsn: Lsn,
        offset: u64,
        reason: String,
    },
    #[error("replaying onto the data device: {0}")]
    Replay(DeviceError),
}

/// Reads sectors of the log region of a device.
#[derive(Debug, Clone, Copy)]
pub struct LogRegion<'a> {
    pub dev: &'a dyn Device,
    pub offset: u64,
    pub space: LogSpace,
}

impl LogRegion<'_> {
    fn read(&self, block: u32, buf: &mut [u8]) -> Result<(), RecoveryError> {
        let offset = self.offset + u64::from(block) * LOG_SECTOR;
        self.dev
            .read(offset, buf)
            .map_err(|source| RecoveryError::Device { offset, source })
    }

    fn stamp(&self, block: u32) -> Result<u32, RecoveryError> {
        let mut s = [0u8; SECTOR];
        self.read(block, &mut s)?;
        Ok(stamp_of(&s))
    }

    /// Reads `n` sectors starting at `lsn`, wrapping at the end of the log.
    fn read_wrapping(&self, lsn: Lsn, n: usize) -> Result<Vec<u8>, RecoveryError> {
        let mut buf = vec![0u8; n * SECTOR];
        let to_end = (self.space.sectors - lsn.block()) as usize;
        if n <= to_end {
            self.read(lsn.block(), &mut buf)?;
        } else {
            let (a, b) = buf.split_at_mut(to_end * SECTOR);
            self.read(lsn.block(), a)?;
            self.read(0, b)?;
        }
        Ok(buf)
    }

    fn byte_offset(&self, lsn: Lsn) -> u64 {
        self.space.offset(lsn)
    }
}

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
    let space = region.space;
    let empty = |head: Lsn| LogScan {
        tail: head,
        head,
        generation: 0,
        records: Vec::new(),
        checkpoints: Vec::new(),
        uncommitted: Vec::new(),
        unmounted: false,
        end: LogEnd::Clean,
    };
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
        // No record where the cycle stamps lead (a log never written, or damage at its
        // start): a log with a commit record anywhere is damaged, not empty.
        if let Some((commit, lost, cycle)) = commit_records_anywhere(region)? {
            let mut scan = empty(Lsn::new(cycle.saturating_add(1), 0));
            scan.end = LogEnd::Damaged {
                lsn: Lsn::new(1, 0),
                reason: "no valid record where the cycle stamps lead".into(),
                commit,
                lost,
            };
            return Ok(scan);
        }
        if rough.is_none() {
            return Ok(empty(Lsn::new(1, 0)));
        }
        // Nothing was ever committed. Start a fresh cycle so that no old sector can be
        // mistaken for a new one.
        let c = region.stamp(0)?.max(region.stamp(space.sectors - 1)?);
        return match c.checked_add(1) {
            Some(next) => Ok(empty(Lsn::new(next, 0))),
            None => Err(RecoveryError::Corrupt {
                lsn: Lsn::new(c, 0),
                offset: 0,
                reason: "cycle stamp at its maximum value".into(),
            }),
        };
    };
    let tail = last.tail;
    if tail.block() >= space.sectors {
        return Err(RecoveryError::Corrupt {
            lsn: last.lsn,
            offset: region.byte_offset(last.lsn),
            reason: format!("tail {tail} lies outside the {}-sector log", space.sectors),
        });
    }
    let mut scan = empty(tail);
    scan.tail = tail;
    let mut building: HashMap<u64, Building> = HashMap::new();
    let mut pos = tail;
    let mut prev: Option<RecordHeader> = None;
    // Why the walk stopped before the end of the log, if it did.
    let mut stopped: Option<String> = None;
    let corrupt = |lsn: Lsn, reason: String| RecoveryError::Corrupt {
        lsn,
        offset: region.byte_offset(lsn),
        reason,
    };
    scan.end = LogEnd::Full;
    while space.distance(tail, pos) < u64::from(space.sectors) {
        let (h, rec) = match read_record(region, pos)? {
            RecordRead::Valid(h, rec) => (h, rec),
            RecordRead::OtherCycle => {
                scan.end = LogEnd::Clean;
                stopped = Some(format!("sector of cycle {}", region.stamp(pos.block())?));
                break;
            }
            RecordRead::Invalid(reason) => {
                stopped = Some(reason.clone());
                scan.end = LogEnd::Torn { lsn: pos, reason };
                break;
            }
        };
        if let Some(p) = prev {
            if h.generation < p.generation || h.tail < p.tail {
                let reason = format!(
                    "stale record (generation {}, tail {}) after generation {}, tail {}",
                    h.generation, h.tail, p.generation, p.tail
                );
                stopped = Some(reason.clone());
                scan.end = LogEnd::Torn { lsn: pos, reason };
                break;
            }
        }
        if space.distance(tail, pos) + h.total_sectors() as u64 > u64::from(space.sectors) {
            scan.end = LogEnd::Full;
            break;
        }
        let stream = unpack(&rec, h.payload_len as usize);
        let ops = parse_ops(&stream)
            .map_err(|(at, e)| corrupt(pos, format!("op at stream byte {at}: {e}")))?;
        let mut info = RecordInfo {
            header: h,
            sectors: h.total_sectors() as u32,
            ops: Vec::with_capacity(ops.len()),
        };
        scan.unmounted = false;
        for op in ops {
            let oh = op.header;
            let mut blkno = None;
            match oh.kind {
                OpKind::Start => {
                    if oh.flags != 0
                        || building
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
                            pos,
                            format!("second start of checkpoint {}", oh.tid),
                        ));
                    }
                }
                OpKind::Item => {
                    let b = building.get_mut(&oh.tid).ok_or_else(|| {
                        corrupt(
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
                        _ => return Err(corrupt(pos, "item continuation out of order".into())),
                    };
                    if oh.flags & OP_CONTINUED != 0 {
                        b.partial = Some(std::mem::take(&mut data));
                    } else {
                        let img = decode_item(&data, block_size)
                            .map_err(|e| corrupt(pos, e.to_string()))?;
                        blkno = Some(img.blkno);
                        b.items.push(img);
                    }
                }
                OpKind::Commit => {
                    let b = building.remove(&oh.tid).ok_or_else(|| {
                        corrupt(
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
                            pos,
                            format!(
                                "commit of checkpoint {} counts {count} items, log holds {}",
                                oh.tid,
                                b.items.len()
                            ),
                        ));
                    }
                    scan.checkpoints.push(Checkpoint {
                        seq: oh.tid,
                        start: b.start,
                        commit: pos,
                        items: b.items,
                    });
                }
                OpKind::Unmount => scan.unmounted = true,
            }
            info.ops.push(OpSummary {
                tid: oh.tid,
                kind: oh.kind,
                flags: oh.flags,
                len: oh.len,
                blkno,
            });
        }
        scan.generation = scan.generation.max(h.generation);
        scan.records.push(info);
        prev = Some(h);
        pos = space.advance(pos, h.total_sectors() as u32);
    }
    scan.head = pos;
    if let Some(reason) = stopped {
        let after = prev.unwrap_or(last);
        if let Some((commit, lost)) = committed_past(region, pos, &after)? {
            scan.end = LogEnd::Damaged {
                lsn: pos,
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

/// Looks past `stop`, where the walk found no valid record, for valid records that chain on
/// after `prev` (the last valid one: same or later generation, a tail not behind it), up to a
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
            if h.generation < last.generation || h.tail < last.tail {
                continue;
            }
            // A record that chains on: follow the run to its end, then search past it.
            let mut pos = at;
            while space.distance(stop, pos) < total {
                let RecordRead::Valid(h, rec) = read_record(region, pos)? else {
                    break;
                };
                let stream = unpack(&rec, h.payload_len as usize);
                if h.generation < last.generation || h.tail < last.tail {
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

/// Bytes at a block's LSN stamp: the LSN, the filesystem UUID and a CRC32C of the whole block
/// (taken with the CRC field zeroed).
pub const LSN_STAMP_BYTES: usize = 28;

/// CRC32C of `block` with the 4 bytes at `crc_at` taken as zero.
fn block_crc(block: &[u8], crc_at: usize) -> u32 {
    let c = crc32c::crc32c(&block[..crc_at]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &block[crc_at + 4..])
}

/// CRC32C of the bytes of `block` outside its LSN stamp (at `lsn_offset`, if any) and outside
/// `unlogged`, in order: what the block means, whatever LSN write back or replay stamps on it
/// and whatever its unlogged stretch holds (`item_format::BUF_CONTENT_CRC`).
pub fn content_crc(block: &[u8], lsn_offset: Option<u16>, unlogged: Option<(u32, u32)>) -> u32 {
    let len = block.len();
    let mut skips = [(len, len); 2];
    if let Some(o) = lsn_offset.map(usize::from) {
        skips[0] = (o.min(len), (o + LSN_STAMP_BYTES).min(len));
    }
    if let Some((a, z)) = unlogged {
        skips[1] = ((a as usize).min(len), (z as usize).min(len));
    }
    skips.sort_unstable();
    let mut crc = 0;
    let mut at = 0;
    for (a, z) in skips {
        if a > at {
            crc = crc32c::crc32c_append(crc, &block[at..a]);
        }
        at = at.max(z);
    }
    if at < len {
        crc = crc32c::crc32c_append(crc, &block[at..]);
    }
    crc
}

/// Reads the LSN stamped into a block at `offset`, if the stamp carries this filesystem's UUID
/// and the block's CRC matches. A torn write (some sectors new, some old) fails the CRC, so a
/// stamp that made it to disk never hides a block whose other sectors did not.
pub fn read_lsn_stamp(block: &[u8], offset: u16, uuid: &[u8; 16]) -> Option<Lsn> {
    check_lsn_stamp(block, offset, uuid).ok()
}

/// `read_lsn_stamp`, saying what is wrong with a stamp it does not accept (the read
/// verifiers log and return it).
pub fn check_lsn_stamp(block: &[u8], offset: u16, uuid: &[u8; 16]) -> Result<Lsn, String> {
    let o = usize::from(offset);
    let s = block
        .get(o..o + LSN_STAMP_BYTES)
        .ok_or_else(|| format!("no room for an LSN stamp at byte {o}"))?;
    if s[8..24] != uuid[..] {
        if s.iter().all(|&b| b == 0) {
            return Err(format!("no LSN stamp (28 zero bytes at byte {o})"));
        }
        return Err(format!(
            "LSN stamp of another filesystem (UUID {})",
            s[8..24]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ));
    }
    let stored = u32::from_le_bytes(s[24..28].try_into().unwrap_or_default());
    let crc = block_crc(block, o + 24);
    if crc != stored {
        return Err(format!(
            "CRC32C {crc:#010x} of the block does not match its stamp's {stored:#010x}"
        ));
    }
    Ok(Lsn::from_raw(u64::from_le_bytes(
        s[..8].try_into().unwrap_or_default(),
    )))
}

/// Breaks the CRC of a sealed stamp, so the block fails every read check.
fn poison_stamp(block: &mut [u8], offset: u16) {
    let at = usize::from(offset) + 24;
    if let Some(crc) = block.get_mut(at..at + 4) {
        for b in crc {
            *b = !*b;
        }
    }
}

/// Stamps the LSN and UUID at `offset` and seals the block with its CRC.
pub fn write_lsn_stamp(block: &mut [u8], offset: u16, lsn: Lsn, uuid: &[u8; 16]) {
    let o = usize::from(offset);
    block[o..o + 8].copy_from_slice(&lsn.raw().to_le_bytes());
    block[o + 8..o + 24].copy_from_slice(uuid);
    let crc = block_crc(block, o + 24);
    block[o + 24..o + 28].copy_from_slice(&crc.to_le_bytes());
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayStats {
    pub checkpoints: u64,
    pub items_replayed: u64,
    pub items_cancelled: u64,
    pub items_newer_on_disk: u64,
    pub blocks_written: u64,
    /// Blocks that replay rebuilt into something other than what their last logged item
    /// recorded (`BUF_CONTENT_CRC`): damaged on disk outside the ranges the log holds. Written
    /// with a stamp whose CRC fails, so every read and check sees the damage.
    pub damaged: Vec<DamagedBlock>,
}

/// A block replay found damaged (`ReplayStats::damaged`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedBlock {
    pub blkno: u64,
    /// The checkpoint whose item the rebuilt block did not match.
    pub checkpoint: u64,
    /// CRC32C (`content_crc`) the item recorded and the rebuilt block's.
    pub logged_crc: u32,
    pub rebuilt_crc: u32,
}

impl std::fmt::Display for DamagedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "metadata block {}: damaged on disk outside the ranges the log holds for it (the \
             block rebuilt from checkpoint {} has CRC32C {:#010x}, the log recorded {:#010x})",
            self.blkno, self.checkpoint, self.rebuilt_crc, self.logged_crc
        )
    }
}

/// Where replay may write: blocks `[first, end)` of the data device.
#[derive(Debug, Clone, Copy)]
pub struct ReplayTarget<'a> {
    pub dev: &'a dyn Device,
    pub block_size: u32,
    pub first_block: u64,
    pub end_block: u64,
    pub uuid: [u8; 16],
}

/// Replays committed checkpoints in order and makes the result stable. Every item is checked
/// before anything is written, so a log that cannot be replayed leaves the device untouched.
pub fn replay(
    checkpoints: &[Checkpoint],
    t: &ReplayTarget<'_>,
) -> Result<ReplayStats, RecoveryError> {
    let mut stats = ReplayStats::default();
    let mut cancelled_at: HashMap<u64, usize> = HashMap::new();
    for (k, ck) in checkpoints.iter().enumerate() {
        for img in &ck.items {
            if img.blkno < t.first_block || img.blkno >= t.end_block {
                return Err(RecoveryError::Corrupt {
                    lsn: ck.start,
                    offset: 0,
                    reason: format!(
                        "checkpoint {} logs block {} outside the metadata area {}..{}",
                        ck.seq, img.blkno, t.first_block, t.end_block
                    ),
                });
            }
            if img.cancel {
                cancelled_at.insert(img.blkno, k);
            }
        }
    }
    let bs = t.block_size as usize;
    // Per block, the last applied item's recorded content CRC when the block did not match it.
    let mut mismatch: HashMap<u64, Option<(DamagedBlock, Option<u16>)>> = HashMap::new();
    let mut blocks: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut order: Vec<u64> = Vec::new();
    for (k, ck) in checkpoints.iter().enumerate() {
        stats.checkpoints += 1;
        for img in &ck.items {
            if img.cancel || cancelled_at.get(&img.blkno).is_some_and(|&c| c >= k) {
                stats.items_cancelled += 1;
                continue;
            }
            let block = match blocks.entry(img.blkno) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let mut b = vec![0u8; bs];
                    t.dev
                        .read(img.blkno * bs as u64, &mut b)
                        .map_err(RecoveryError::Replay)?;
                    order.push(img.blkno);
                    v.insert(b)
                }
            };
            if let Some(off) = img.lsn_offset {
                if read_lsn_stamp(block, off, &t.uuid).is_some_and(|l| l >= ck.start) {
                    stats.items_newer_on_disk += 1;
                    continue;
                }
            }
            for (off, data) in &img.ranges {
                let o = *off as usize;
                block[o..o + data.len()].copy_from_slice(data);
            }
            // Only the last applied item of a block must match: a torn write back leaves
            // sectors of a later image, which the later items' ranges cover.
            let rebuilt_crc = content_crc(block, img.lsn_offset, img.unlogged);
            mismatch.insert(
                img.blkno,
                img.content_crc
                    .filter(|&c| c != rebuilt_crc)
                    .map(|logged_crc| {
                        let d = DamagedBlock {
                            blkno: img.blkno,
                            checkpoint: ck.seq,
                            logged_crc,
                            rebuilt_crc,
                        };
                        (d, img.lsn_offset)
                    }),
            );
            if let Some(off) = img.lsn_offset {
                write_lsn_stamp(block, off, ck.start, &t.uuid);
            }
            stats.items_replayed += 1;
        }
    }
    order.sort_unstable();
    for blkno in order {
        if let Some((d, stamp)) = mismatch.remove(&blkno).flatten() {
            if let (Some(b), Some(off)) = (blocks.get_mut(&blkno), stamp) {
                poison_stamp(b, off);
            }
            stats.damaged.push(d);
        }
        if let Some(b) = blocks.get(&blkno) {
            t.dev
                .write(blkno * bs as u64, b, WriteFlags::NONE)
                .map_err(RecoveryError::Replay)?;
            stats.blocks_written += 1;
        }
    }
    if stats.blocks_written > 0 {
        t.dev.flush().map_err(RecoveryError::Replay)?;
    }
    Ok(stats)
}

#[cfg(test)]
mod corruption_tests;

#[cfg(test)]
mod replay_damage_tests;
