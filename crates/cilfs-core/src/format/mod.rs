//! On-disk structures: explicit little-endian fields, magic numbers, a version and a CRC32C each.
//! Decoding arbitrary bytes returns an error, never panics. `docs/on-disk-format.md` is the spec.
//! `geometry` reads them back from the devices: a filesystem's layout, from its primary
//! superblock or a backup copy, cross-checked against the log device header.

mod codec;
mod error;
pub mod geometry;
pub mod logdev;
pub mod superblock;

pub use codec::{Decoder, Encoder};
pub use error::FormatError;
pub use logdev::LogDeviceHeader;
pub use superblock::Superblock;

/// The format version every header carries (superblock, log device header); decoding refuses
/// any other.
pub const FORMAT_VERSION: u32 = 1;
/// Every header block is one 512-byte sector: the unit a device writes atomically.
pub const HEADER_BYTES: usize = 512;
/// Offset of the CRC32C in a header sector: the last four bytes.
pub const HEADER_CRC_OFFSET: usize = HEADER_BYTES - 4;

/// CRC32C of `sector[..508]` with the CRC field itself excluded.
pub fn header_crc(sector: &[u8]) -> u32 {
    crate::util::crc::crc32c(&sector[..HEADER_CRC_OFFSET])
}
