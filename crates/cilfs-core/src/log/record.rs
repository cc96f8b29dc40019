//! Log records as they sit on disk. A record is one header sector followed by payload sectors;
//! every sector of the log starts with the 4-byte cycle it was written in, so recovery can tell
//! new sectors from old ones. The payload is a stream of ops packed into the remaining 508 bytes
//! of each payload sector. Layout: `docs/on-disk-format.md`, section "The log".

use super::lsn::{Lsn, LOG_SECTOR};
use crate::format::{Decoder, Encoder, FormatError};

pub const RECORD_MAGIC: [u8; 4] = *b"CLRC";
pub const RECORD_VERSION: u16 = 1;
pub const SECTOR: usize = LOG_SECTOR as usize;
/// Stream bytes carried by one payload sector (after its cycle stamp).
pub const SECTOR_PAYLOAD: usize = SECTOR - 4;
pub const OP_HEADER_BYTES: usize = 16;
const CRC_OFFSET: usize = 40;
const WHAT: &str = "log record header";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub cycle: u32,
    /// Bytes of op stream in the payload.
    pub payload_len: u32,
    pub lsn: Lsn,
    /// The log tail when this record was written: recovery starts there.
    pub tail: Lsn,
    /// The mount generation that wrote it; never decreases along the log.
    pub generation: u32,
    pub crc: u32,
}

pub fn payload_sectors(payload_len: usize) -> usize {
    payload_len.div_ceil(SECTOR_PAYLOAD)
}

impl RecordHeader {
    pub fn total_sectors(&self) -> usize {
        1 + payload_sectors(self.payload_len as usize)
    }

    /// Encodes into a header sector (CRC field zero: see [`seal_record`]).
    pub fn encode_into(&self, sector: &mut [u8]) {
        let mut e = Encoder::new(&mut sector[..SECTOR]);
        e.u32(self.cycle)
            .bytes(&RECORD_MAGIC)
            .u16(RECORD_VERSION)
            .u16(0)
            .u32(self.payload_len)
            .u64(self.lsn.raw())
            .u64(self.tail.raw())
            .u32(self.generation)
            .u32(payload_sectors(self.payload_len as usize) as u32)
            .u32(0)
            .skip_to(SECTOR);
    }

    /// Decodes a header sector; does not check the CRC (that needs the payload).
    pub fn decode(sector: &[u8]) -> Result<Self, FormatError> {
        let mut d = Decoder::new(sector, WHAT);
        let cycle = d.u32()?;
        let magic = d.array::<4>()?;
        if magic != RECORD_MAGIC {
            return Err(FormatError::BadMagic {
                what: WHAT,
                found: magic.to_vec(),
            });
        }
        let version = d.u16()?;
        if version != RECORD_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                found: u32::from(version),
                supported: u32::from(RECORD_VERSION),
            });
        }
        let _flags = d.u16()?;
        let payload_len = d.u32()?;
        let lsn = Lsn::from_raw(d.u64()?);
        let tail = Lsn::from_raw(d.u64()?);
        let generation = d.u32()?;
        let sectors = d.u32()?;
        let crc = d.u32()?;
        if sectors as usize != payload_sectors(payload_len as usize) {
            return Err(d.invalid(
                "payload sectors",
                format!("{sectors} for {payload_len} bytes"),
            ));
        }
        if lsn.cycle() != cycle || cycle == 0 {
            return Err(d.invalid("lsn", format!("{lsn} in a sector of cycle {cycle}")));
        }
        if tail > lsn {
            return Err(d.invalid("tail", format!("tail {tail} after the record {lsn}")));
        }
        Ok(Self {
            cycle,
            payload_len,
            lsn,
            tail,
            generation,
            crc,
        })
    }
}

/// CRC32C of a record as laid out in memory (`record` = header sector + payload sectors), with
/// the CRC field taken as zero.
pub fn record_crc(record: &[u8]) -> u32 {
    let mut c = crate::util::crc::Crc32c::new();
    c.update(&record[..CRC_OFFSET]);
    c.update(&[0; 4]);
    c.update(&record[CRC_OFFSET + 4..]);
    c.value()
}

/// Stamps each sector's cycle (`cycles[i]` for sector i) and then the CRC. The cycles differ only
/// for a record that wraps past the end of the log.
pub fn seal_record(record: &mut [u8], cycle_of_sector: impl Fn(usize) -> u32) {
    debug_assert_eq!(record.len() % SECTOR, 0);
    for (i, s) in record.chunks_mut(SECTOR).enumerate() {
        s[..4].copy_from_slice(&cycle_of_sector(i).to_le_bytes());
    }
    let crc = record_crc(record);
    record[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
}

pub fn stamp_of(sector: &[u8]) -> u32 {
    u32::from_le_bytes([sector[0], sector[1], sector[2], sector[3]])
}

/// Copies stream bytes into payload sectors, skipping each sector's stamp slot.
pub fn pack(record: &mut [u8], stream_offset: usize, bytes: &[u8]) {
    let mut done = 0;
    while done < bytes.len() {
        let s = stream_offset + done;
        let (sector, within) = (1 + s / SECTOR_PAYLOAD, s % SECTOR_PAYLOAD);
        let n = (SECTOR_PAYLOAD - within).min(bytes.len() - done);
        let at = sector * SECTOR + 4 + within;
        record[at..at + n].copy_from_slice(&bytes[done..done + n]);
        done += n;
    }
}

/// The op stream of a record (header sector included in `record`).
pub fn unpack(record: &[u8], payload_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload_len);
    for s in record[SECTOR..].chunks(SECTOR) {
        let n = (payload_len - out.len()).min(SECTOR_PAYLOAD);
        out.extend_from_slice(&s[4..4 + n]);
        if out.len() == payload_len {
            break;
        }
    }
    out
}

/// What an op is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// First op of a checkpoint.
    Start = 1,
    /// One logged item (possibly split across records).
    Item = 2,
    /// Last op of a checkpoint: the checkpoint counts only if this is on disk.
    Commit = 3,
    /// Clean unmount: nothing before it needs replay.
    Unmount = 4,
}

impl OpKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Start,
            2 => Self::Item,
            3 => Self::Commit,
            4 => Self::Unmount,
            _ => return None,
        })
    }
}

/// The op's data continues in the next record.
pub const OP_CONTINUED: u8 = 1;
/// The op continues one begun in the previous record.
pub const OP_CONTINUATION: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpHeader {
    /// The checkpoint sequence (0 for an unmount record).
    pub tid: u64,
    pub kind: OpKind,
    pub flags: u8,
    pub len: u32,
}

impl OpHeader {
    pub fn encode(&self) -> [u8; OP_HEADER_BYTES] {
        let mut b = [0u8; OP_HEADER_BYTES];
        Encoder::new(&mut b)
            .u64(self.tid)
            .u8(self.kind as u8)
            .u8(self.flags)
            .u16(0)
            .u32(self.len);
        b
    }
}

/// One op of a record's stream, borrowing its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op<'a> {
    pub header: OpHeader,
    pub data: &'a [u8],
}

/// Splits a record's op stream into ops. Errors carry the byte position in the stream.
pub fn parse_ops(stream: &[u8]) -> Result<Vec<Op<'_>>, (usize, FormatError)> {
    let mut d = Decoder::new(stream, "log op");
    let mut ops = Vec::new();
    while d.remaining() > 0 {
        let at = d.position();
        let err = |e| (at, e);
        let tid = d.u64().map_err(err)?;
        let kind_raw = d.u8().map_err(err)?;
        let kind = OpKind::from_u8(kind_raw)
            .ok_or_else(|| (at, d.invalid("op kind", format!("{kind_raw}"))))?;
        let flags = d.u8().map_err(err)?;
        if flags & !(OP_CONTINUED | OP_CONTINUATION) != 0 {
            return Err((at, d.invalid("op flags", format!("{flags:#x}"))));
        }
        let _reserved = d.u16().map_err(err)?;
        let len = d.u32().map_err(err)?;
        let data = d.bytes(len as usize).map_err(err)?;
        ops.push(Op {
            header: OpHeader {
                tid,
                kind,
                flags,
                len,
            },
            data,
        });
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn build(stream: &[u8], lsn: Lsn) -> Vec<u8> {
        let h = RecordHeader {
            cycle: lsn.cycle(),
            payload_len: stream.len() as u32,
            lsn,
            tail: Lsn::new(1, 0),
            generation: 1,
            crc: 0,
        };
        let mut rec = vec![0u8; h.total_sectors() * SECTOR];
        h.encode_into(&mut rec);
        pack(&mut rec, 0, stream);
        seal_record(&mut rec, |_| lsn.cycle());
        rec
    }

    #[test]
    fn record_roundtrip() {
        let mut stream = Vec::new();
        let op = OpHeader {
            tid: 7,
            kind: OpKind::Item,
            flags: 0,
            len: 1000,
        };
        stream.extend_from_slice(&op.encode());
        stream.extend((0..1000u32).map(|i| i as u8));
        let rec = build(&stream, Lsn::new(3, 40));
        let h = RecordHeader::decode(&rec).unwrap();
        assert_eq!(h.total_sectors(), 1 + 2); // 1016 stream bytes: two full payload sectors
        assert_eq!(h.crc, record_crc(&rec));
        let back = unpack(&rec, h.payload_len as usize);
        assert_eq!(back, stream);
        let ops = parse_ops(&back).unwrap();
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].header, op);
        assert_eq!(ops[0].data.len(), 1000);
        for s in rec.chunks(SECTOR) {
            assert_eq!(stamp_of(s), 3);
        }
    }

    #[test]
    fn any_corruption_changes_the_crc() {
        let rec = build(&[9u8; 700], Lsn::new(1, 0));
        let good = record_crc(&rec);
        for byte in (0..rec.len()).filter(|b| !(CRC_OFFSET..CRC_OFFSET + 4).contains(b)) {
            let mut c = rec.clone();
            c[byte] ^= 0x10;
            assert_ne!(record_crc(&c), good, "byte {byte}");
        }
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1200)) {
            let _ = RecordHeader::decode(&bytes);
            let _ = parse_ops(&bytes);
        }

        #[test]
        fn pack_unpack_roundtrip(stream in proptest::collection::vec(any::<u8>(), 0..3000)) {
            let rec = build(&stream, Lsn::new(2, 5));
            prop_assert_eq!(unpack(&rec, stream.len()), stream);
        }
    }
}
