//! The header in sector 0 of an external log device; the log itself starts at its block 1.

use super::codec::{check_header, check_version, seal_header};
use super::superblock::is_valid_block_size;
use super::FORMAT_VERSION;
use super::{Decoder, Encoder, FormatError, HEADER_BYTES};

pub const LOGDEV_MAGIC: [u8; 8] = *b"CILFSLOG";
const WHAT: &str = "log device header";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogDeviceHeader {
    pub log_uuid: [u8; 16],
    /// The filesystem this log belongs to.
    pub fs_uuid: [u8; 16],
    pub block_size: u32,
    /// Length of the log in blocks, starting at block 1.
    pub log_blocks: u64,
}

impl LogDeviceHeader {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut s = [0u8; HEADER_BYTES];
        Encoder::new(&mut s)
            .bytes(&LOGDEV_MAGIC)
            .u32(FORMAT_VERSION)
            .u32(0)
            .bytes(&self.log_uuid)
            .bytes(&self.fs_uuid)
            .u32(self.block_size)
            .u32(0)
            .u64(self.log_blocks);
        seal_header(&mut s);
        s
    }

    pub fn decode(sector: &[u8]) -> Result<Self, FormatError> {
        check_header(sector, WHAT, &LOGDEV_MAGIC)?;
        let mut d = Decoder::new(sector, WHAT);
        d.skip_to(8)?;
        check_version(&mut d, WHAT)?;
        let _flags = d.u32()?;
        let log_uuid = d.array::<16>()?;
        let fs_uuid = d.array::<16>()?;
        let block_size = d.u32()?;
        if !is_valid_block_size(block_size) {
            return Err(d.invalid("block size", format!("{block_size}")));
        }
        let _pad = d.u32()?;
        let log_blocks = d.u64()?;
        if log_blocks == 0 || log_blocks.checked_mul(u64::from(block_size)).is_none() {
            return Err(d.invalid("log blocks", format!("{log_blocks}")));
        }
        Ok(Self {
            log_uuid,
            fs_uuid,
            block_size,
            log_blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip_and_corruption() {
        let h = LogDeviceHeader {
            log_uuid: [1; 16],
            fs_uuid: [2; 16],
            block_size: 4096,
            log_blocks: 1024,
        };
        let raw = h.encode();
        assert_eq!(LogDeviceHeader::decode(&raw).unwrap(), h);
        let mut bad = raw;
        bad[40] ^= 1;
        assert!(matches!(
            LogDeviceHeader::decode(&bad),
            Err(FormatError::BadChecksum { .. })
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = LogDeviceHeader::decode(&bytes);
        }
    }
}
