//! The log's ops, reached through valid records: the input is a list of op streams, each
//! sealed into a record with a right CRC and cycle stamps, laid one after another in a log
//! region, scanned as recovery scans it, and the checkpoints found replayed onto a small data
//! device. (The `log_record` target feeds raw bytes, which seldom carry a valid CRC: this one
//! reaches checkpoint assembly, item decoding and replay.)

use cilfs_core::log::item_format::{decode_item, encode_buf_item};
use cilfs_core::log::record::{
    pack, parse_ops, seal_record, OpHeader, OpKind, RecordHeader, OP_CONTINUATION, OP_CONTINUED,
    SECTOR,
};
use cilfs_core::log::recover::{replay, scan_log, LogRegion, ReplayTarget};
use cilfs_core::log::stamp::{read_lsn_stamp, LSN_STAMP_BYTES};
use cilfs_core::log::{LogSpace, Lsn};
use cilfs_device::{Device, SimDevice, WriteFlags};

const LOG_BYTES: u64 = 64 * 1024;
const BLOCK_SIZE: u32 = 2048;
/// The data device replay writes to: blocks `[FIRST_BLOCK, DATA_BLOCKS)` take items.
const DATA_BLOCKS: u64 = 32;
const FIRST_BLOCK: u64 = 2;
const UUID: [u8; 16] = [0x5A; 16];

/// Splits the input into op streams: each a 2-byte little-endian length and that many bytes
/// (the last one cut to what is left).
fn streams(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        out.push(&rest[2..2 + n]);
        rest = &rest[2 + n..];
    }
    out
}

/// The records of `streams` laid from the start of a log region, cycle 1, as a writer that
/// crashed after them would leave them: as many as fit.
fn region_of(streams: &[&[u8]]) -> Vec<u8> {
    let mut log = vec![0u8; LOG_BYTES as usize];
    let mut at = 0usize;
    for s in streams {
        let lsn = Lsn::new(1, (at / SECTOR) as u32);
        let h = RecordHeader {
            cycle: 1,
            payload_len: s.len() as u32,
            lsn,
            tail: Lsn::new(1, 0),
            generation: 1,
            crc: 0,
        };
        let len = h.total_sectors() * SECTOR;
        if at + len > log.len() {
            break;
        }
        let rec = &mut log[at..at + len];
        h.encode_into(rec);
        pack(rec, 0, s);
        seal_record(rec, |_| 1);
        at += len;
    }
    log
}

pub fn log_ops(data: &[u8]) {
    let _ = parse_ops(data);
    let _ = decode_item(data, BLOCK_SIZE);
    let _ = decode_item(data, 512);
    for off in [0u16, 16, 2000, u16::MAX] {
        let _ = read_lsn_stamp(data, off, &UUID);
    }
    let streams = streams(data);
    let dev = SimDevice::new(LOG_BYTES, 0);
    if dev
        .write(0, &region_of(&streams), WriteFlags::NONE)
        .is_err()
    {
        return;
    }
    let region = LogRegion {
        dev: &dev,
        offset: 0,
        space: LogSpace::new(LOG_BYTES),
    };
    let Ok(scan) = scan_log(&region, BLOCK_SIZE) else {
        return;
    };
    let _ = scan.end.describe();
    let data_dev = SimDevice::new(DATA_BLOCKS * u64::from(BLOCK_SIZE), 0);
    let target = ReplayTarget {
        dev: &data_dev,
        block_size: BLOCK_SIZE,
        first_block: FIRST_BLOCK,
        end_block: DATA_BLOCKS,
        uuid: UUID,
    };
    if let Ok(stats) = replay(&scan.checkpoints, &target) {
        assert!(stats.blocks_written <= DATA_BLOCKS - FIRST_BLOCK);
    }
}

fn op(tid: u64, kind: OpKind, flags: u8, data: &[u8]) -> Vec<u8> {
    let mut v = OpHeader {
        tid,
        kind,
        flags,
        len: data.len() as u32,
    }
    .encode()
    .to_vec();
    v.extend_from_slice(data);
    v
}

fn framed(streams: &[Vec<u8>]) -> Vec<u8> {
    let mut v = Vec::new();
    for s in streams {
        v.extend_from_slice(&(s.len() as u16).to_le_bytes());
        v.extend_from_slice(s);
    }
    v
}

/// A checkpoint of two items in one record; one whose item continues into a second record;
/// and an unmount record.
pub fn log_ops_seeds() -> Vec<Vec<u8>> {
    let block = vec![0x33u8; BLOCK_SIZE as usize];
    let stamp = Some(16u16);
    let a = encode_buf_item(5, false, stamp, &block, &[(0, 64), (1000, 10)]);
    let b = encode_buf_item(6, false, None, &block, &[(100, 200)]);
    let cancel = encode_buf_item(7, true, None, &block, &[]);
    assert!(16 + LSN_STAMP_BYTES <= BLOCK_SIZE as usize);
    let one = [
        op(1, OpKind::Start, 0, &[]),
        op(1, OpKind::Item, 0, &a),
        op(1, OpKind::Item, 0, &b),
        op(1, OpKind::Item, 0, &cancel),
        op(1, OpKind::Commit, 0, &3u64.to_le_bytes()),
    ]
    .concat();
    let (head, tail) = a.split_at(a.len() / 2);
    let first = [
        op(2, OpKind::Start, 0, &[]),
        op(2, OpKind::Item, OP_CONTINUED, head),
    ]
    .concat();
    let second = [
        op(2, OpKind::Item, OP_CONTINUATION, tail),
        op(2, OpKind::Commit, 0, &1u64.to_le_bytes()),
    ]
    .concat();
    let unmount = op(0, OpKind::Unmount, 0, &[]);
    vec![
        framed(std::slice::from_ref(&one)),
        framed(&[first, second, unmount.clone()]),
        framed(&[one, unmount]),
    ]
}
