//! The superblock: sector 0 of the data device, and its backup copies (byte 1 MiB and the
//! filesystem's last block). Layout in `docs/on-disk-format.md`.

use super::codec::{check_header, check_version, seal_header};
use super::{Decoder, Encoder, FormatError, FORMAT_VERSION, HEADER_BYTES};

pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"CILFS\0SB";
pub const MIN_BLOCK_SIZE: u32 = 512;
pub const MAX_BLOCK_SIZE: u32 = 65536;
pub const SECTOR_SIZE: u32 = 512;

const FLAG_EXTERNAL_LOG: u32 = 1 << 0;
const FLAG_BACKUPS: u32 = 1 << 1;
const KNOWN_FLAGS: u32 = FLAG_EXTERNAL_LOG | FLAG_BACKUPS;

/// Byte offset of the front backup copy. Past what a stray `dd bs=1M count=1` or a partition
/// tool (MBR, GPT's first 17 KiB) overwrites, and a multiple of every block size, so a search
/// needs no block size to find it.
pub const FRONT_BACKUP_BYTES: u64 = 1 << 20;

/// The block of the front backup copy.
pub fn front_backup_block(block_size: u32) -> u64 {
    FRONT_BACKUP_BYTES / u64::from(block_size)
}
const WHAT: &str = "superblock";

/// Where the log lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SbLog {
    /// Blocks `[start, start + blocks)` of the data device.
    Internal { start: u64 },
    /// A separate device whose header carries this UUID; the log starts at its block 1.
    External { log_uuid: [u8; 16] },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub uuid: [u8; 16],
    pub block_size: u32,
    /// Blocks of the data device that belong to the filesystem (superblock and internal log included).
    pub data_blocks: u64,
    pub log: SbLog,
    /// Length of the log in blocks.
    pub log_blocks: u64,
    /// Set by a clean unmount, cleared when a mount starts writing.
    pub clean: bool,
    /// Raised by every mount that found the log dirty; folded into the change attribute users see.
    pub unclean_epoch: u64,
    /// Raised by every mount before it writes the log; stamped into every log record so that
    /// records of an earlier mount can never be chained after newer ones.
    pub log_generation: u32,
    /// A mount met a corrupt metadata block: `cilfs check` is owed (ext4's error state). Set at
    /// once by the mount that saw it, kept by every later mount, cleared only by a check that
    /// found the filesystem consistent and may write. In what was a reserved (zero) word, so
    /// a binary older than it still reads the image.
    pub needs_check: bool,
    /// Backup copies at byte 1 MiB and in the last block (`backup_blocks`); the log and the
    /// metadata area start after the first and end before the last. Images made before
    /// backups existed have none.
    pub backups: bool,
    /// The filesystem label (FS_IOC_SETFSLABEL, `mkfs -L`): up to `LABEL_MAX` bytes, no NUL.
    /// In what was reserved (zero): older images have none.
    pub label: Vec<u8>,
}

/// Longest label: FSLABEL_MAX (256) less its terminating NUL.
pub const LABEL_MAX: usize = 255;
/// The label's room in the superblock, NUL-padded.
const LABEL_BYTES: usize = LABEL_MAX + 1;

pub fn is_valid_block_size(bs: u32) -> bool {
    bs.is_power_of_two() && (MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs)
}

impl Superblock {
    /// Byte length of the log.
    pub fn log_bytes(&self) -> u64 {
        self.log_blocks * u64::from(self.block_size)
    }

    pub fn data_bytes(&self) -> u64 {
        self.data_blocks * u64::from(self.block_size)
    }

    /// Where the backup copies live, front first: none on an image made before backups.
    pub fn backup_blocks(&self) -> Vec<u64> {
        if self.backups {
            vec![front_backup_block(self.block_size), self.data_blocks - 1]
        } else {
            Vec::new()
        }
    }

    /// Bytes of the data device the filesystem cannot do without: all its blocks but the last
    /// backup copy, so that a device (or image file) one block short still mounts.
    pub fn needed_bytes(&self) -> u64 {
        let blocks = self.data_blocks - u64::from(self.backups);
        blocks * u64::from(self.block_size)
    }

    /// The primary copy (sector 0).
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        self.encode_copy(0)
    }

    /// The copy written at block `at`: 0 for the primary, else one of `backup_blocks`. Each
    /// copy names its own place, so a copy found by a search is never taken for a primary,
    /// nor for a copy that belongs somewhere else.
    pub fn encode_copy(&self, at: u64) -> [u8; HEADER_BYTES] {
        let mut s = [0u8; HEADER_BYTES];
        let (mut flags, log_start, log_uuid) = match self.log {
            SbLog::Internal { start } => (0, start, [0u8; 16]),
            SbLog::External { log_uuid } => (FLAG_EXTERNAL_LOG, 1, log_uuid),
        };
        if self.backups {
            flags |= FLAG_BACKUPS;
        }
        let mut e = Encoder::new(&mut s);
        e.bytes(&SUPERBLOCK_MAGIC)
            .u32(FORMAT_VERSION)
            .u32(flags)
            .bytes(&self.uuid)
            .u32(self.block_size)
            .u32(SECTOR_SIZE)
            .u64(self.data_blocks)
            .u64(log_start)
            .u64(self.log_blocks)
            .bytes(&log_uuid)
            .u32(u32::from(self.clean))
            .u32(self.log_generation)
            .u64(self.unclean_epoch)
            .u32(u32::from(self.needs_check))
            .u64(at);
        debug_assert_eq!(e.position(), 108);
        let mut label = [0u8; LABEL_BYTES];
        let n = self.label.len().min(LABEL_MAX);
        label[..n].copy_from_slice(&self.label[..n]);
        e.bytes(&label);
        seal_header(&mut s);
        debug_assert_eq!(Self::decode_copy(&s), Ok((self.clone(), at)));
        s
    }

    /// The primary: a backup copy found at sector 0 (a block copied there by hand, say) is
    /// refused, since its `at` would not be where it lies.
    pub fn decode(sector: &[u8]) -> Result<Self, FormatError> {
        match Self::decode_copy(sector)? {
            (sb, 0) => Ok(sb),
            (_, at) => Err(FormatError::Invalid {
                what: WHAT,
                field: "copy",
                reason: format!("a backup copy of block {at}, not the primary"),
            }),
        }
    }

    /// Any copy, with the block it says it belongs at (0 for the primary).
    pub fn decode_copy(sector: &[u8]) -> Result<(Self, u64), FormatError> {
        check_header(sector, WHAT, &SUPERBLOCK_MAGIC)?;
        let mut d = Decoder::new(sector, WHAT);
        d.skip_to(8)?;
        check_version(&mut d, WHAT)?;
        let flags = d.u32()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(d.invalid("flags", format!("unknown flags {flags:#x}")));
        }
        let uuid = d.array::<16>()?;
        let block_size = d.u32()?;
        if !is_valid_block_size(block_size) {
            return Err(d.invalid(
                "block size",
                format!("{block_size} is not a power of two in 512..65536"),
            ));
        }
        let sector_size = d.u32()?;
        if sector_size != SECTOR_SIZE {
            return Err(d.invalid(
                "sector size",
                format!("{sector_size}, expected {SECTOR_SIZE}"),
            ));
        }
        let data_blocks = d.u64()?;
        let log_start = d.u64()?;
        let log_blocks = d.u64()?;
        let log_uuid = d.array::<16>()?;
        let clean = match d.u32()? {
            0 => false,
            1 => true,
            other => return Err(d.invalid("clean flag", format!("{other}"))),
        };
        let log_generation = d.u32()?;
        let unclean_epoch = d.u64()?;
        // Any non-zero value asks for a check: a later format may give the other bits meaning.
        let needs_check = d.u32()? != 0;
        // Reserved (zero) before backups: every older image reads as its primary.
        let at = d.u64()?;
        // Reserved (zero) before labels: no label. Up to the first NUL.
        let raw = d.array::<LABEL_BYTES>()?;
        let label = raw[..LABEL_MAX]
            .split(|&b| b == 0)
            .next()
            .unwrap_or_default()
            .to_vec();
        let backups = flags & FLAG_BACKUPS != 0;
        let bs = u64::from(block_size);
        if data_blocks.checked_mul(bs).is_none() || log_blocks.checked_mul(bs).is_none() {
            return Err(d.invalid("size", "byte size overflows 64 bits"));
        }
        // The log's sectors as `LogSpace` takes them: 16 at least, and a u32 of them at most.
        let log_sectors = log_blocks.saturating_mul(bs) / u64::from(SECTOR_SIZE);
        if !(16..=u64::from(u32::MAX)).contains(&log_sectors) {
            return Err(d.invalid(
                "log blocks",
                format!("{log_blocks} blocks, {log_sectors} sectors"),
            ));
        }
        // With backups the front copy comes before everything and the last block is the end
        // copy: the log and the metadata must lie between them.
        let (first_free, end_free) = if backups {
            let front = front_backup_block(block_size);
            if data_blocks < front + 3 {
                return Err(d.invalid(
                    "data blocks",
                    format!("{data_blocks}: no room for the backups at {front} and the end"),
                ));
            }
            (front + 1, data_blocks - 1)
        } else {
            (1, data_blocks)
        };
        if at != 0 && (!backups || (at != first_free - 1 && at != data_blocks - 1)) {
            return Err(d.invalid(
                "copy",
                format!("block {at} is not where this filesystem keeps a backup"),
            ));
        }
        let log = if flags & FLAG_EXTERNAL_LOG != 0 {
            SbLog::External { log_uuid }
        } else {
            let end = log_start.checked_add(log_blocks);
            if log_start < first_free || end.is_none_or(|e| e > end_free) {
                return Err(d.invalid(
                    "log location",
                    format!(
                        "blocks {log_start}+{log_blocks} outside the {data_blocks}-block device"
                    ),
                ));
            }
            SbLog::Internal { start: log_start }
        };
        Ok((
            Self {
                uuid,
                block_size,
                data_blocks,
                log,
                log_blocks,
                clean,
                unclean_epoch,
                log_generation,
                needs_check,
                backups,
                label,
            },
            at,
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Superblock {
        Superblock {
            uuid: [7; 16],
            block_size: 4096,
            data_blocks: 262_144,
            log: SbLog::Internal { start: 1 },
            log_blocks: 16_384,
            clean: true,
            unclean_epoch: 3,
            log_generation: 5,
            needs_check: false,
            backups: false,
            label: b"scratch".to_vec(),
        }
    }

    #[test]
    fn roundtrip_internal_and_external() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        let ext = Superblock {
            log: SbLog::External { log_uuid: [9; 16] },
            ..sample()
        };
        assert_eq!(Superblock::decode(&ext.encode()).unwrap(), ext);
    }

    #[test]
    fn needs_check_round_trips_and_an_image_without_it_reads_as_not_needing_one() {
        let sb = Superblock {
            needs_check: true,
            ..sample()
        };
        let raw = sb.encode();
        assert_eq!(raw[96..100], [1, 0, 0, 0]);
        assert_eq!(Superblock::decode(&raw).unwrap(), sb);
        // What a binary before the field wrote: the word was reserved, zero.
        let mut old = raw;
        old[96..100].fill(0);
        super::super::codec::seal_header(&mut old);
        assert!(!Superblock::decode(&old).unwrap().needs_check);
    }

    fn with_backups() -> Superblock {
        Superblock {
            log: SbLog::Internal {
                start: front_backup_block(4096) + 1,
            },
            backups: true,
            label: Vec::new(),
            ..sample()
        }
    }

    #[test]
    fn copies_name_their_place_and_a_backup_is_never_taken_for_the_primary() {
        let sb = with_backups();
        assert_eq!(sb.backup_blocks(), vec![256, 262_143]);
        assert_eq!(sb.needed_bytes(), 262_143 * 4096);
        for at in sb.backup_blocks() {
            let raw = sb.encode_copy(at);
            assert_eq!(Superblock::decode_copy(&raw).unwrap(), (sb.clone(), at));
            let err = Superblock::decode(&raw).unwrap_err();
            assert!(err.to_string().contains("not the primary"), "{err}");
        }
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        // A copy that names a block where this filesystem keeps none, and a copy in an image
        // without backups, are refused: neither was written by cilfs.
        let mut raw = sb.encode();
        raw[100..108].copy_from_slice(&1000u64.to_le_bytes());
        super::super::codec::seal_header(&mut raw);
        let err = Superblock::decode_copy(&raw).unwrap_err();
        assert!(err.to_string().contains("not where"), "{err}");
        let mut raw = sample().encode();
        raw[100..108].copy_from_slice(&256u64.to_le_bytes());
        super::super::codec::seal_header(&mut raw);
        assert!(Superblock::decode_copy(&raw).is_err());
    }

    #[test]
    fn with_backups_the_log_must_lie_between_them() {
        for start in [1, 255, 256, 262_143 - 16_384 + 1] {
            let sb = Superblock {
                log: SbLog::Internal { start },
                ..with_backups()
            };
            let mut raw = sb.encode_unchecked();
            raw[12] |= 2;
            super::super::codec::seal_header(&mut raw);
            let err = Superblock::decode(&raw).unwrap_err();
            assert!(
                err.to_string().contains("log location"),
                "start {start}: {err}"
            );
        }
        let ok = Superblock {
            log: SbLog::Internal {
                start: 262_143 - 16_384,
            },
            ..with_backups()
        };
        assert_eq!(Superblock::decode(&ok.encode()).unwrap(), ok);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        for s in [sample().encode(), with_backups().encode_copy(256)] {
            for bit in 0..HEADER_BYTES * 8 {
                let mut c = s;
                c[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    Superblock::decode_copy(&c).is_err(),
                    "bit {bit} flip accepted"
                );
            }
        }
    }

    #[test]
    fn invalid_fields_are_named() {
        let mut sb = sample();
        sb.log = SbLog::Internal { start: 262_000 };
        let err = Superblock::decode(&sb.encode_unchecked()).unwrap_err();
        assert!(err.to_string().contains("log location"), "{err}");
        let mut raw = sample().encode();
        raw[8] = 2;
        super::super::codec::seal_header(&mut raw);
        assert!(matches!(
            Superblock::decode(&raw),
            Err(FormatError::UnsupportedVersion { found: 2, .. })
        ));
        assert!(matches!(
            Superblock::decode(&[0; 100]),
            Err(FormatError::Truncated { .. })
        ));
    }

    impl Superblock {
        /// Encodes without the round-trip assertion, to build invalid images in tests.
        fn encode_unchecked(&self) -> [u8; HEADER_BYTES] {
            let mut s = [0u8; HEADER_BYTES];
            let SbLog::Internal { start } = self.log else {
                unreachable!()
            };
            Encoder::new(&mut s)
                .bytes(&SUPERBLOCK_MAGIC)
                .u32(FORMAT_VERSION)
                .u32(0)
                .bytes(&self.uuid)
                .u32(self.block_size)
                .u32(SECTOR_SIZE)
                .u64(self.data_blocks)
                .u64(start)
                .u64(self.log_blocks);
            seal_header(&mut s);
            s
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Superblock::decode(&bytes);
        }

        #[test]
        fn arbitrary_bytes_with_magic_and_crc_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 512)) {
            bytes[..8].copy_from_slice(&SUPERBLOCK_MAGIC);
            seal_header(&mut bytes);
            let _ = Superblock::decode(&bytes);
        }
    }
}
