//! CRC32C (Castagnoli, the iSCSI CRC), the checksum of every log record, LSN stamp, buffer
//! item and superblock.

use crc_fast::{CrcAlgorithm, Digest};

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// CRC32C of the bytes whose CRC32C is `crc` followed by `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    let mut d = Crc32c::resume(crc);
    d.update(data);
    d.value()
}

/// A CRC32C taken over pieces.
pub struct Crc32c(Digest);

impl Crc32c {
    pub fn new() -> Self {
        Self::resume(0)
    }

    /// Goes on from the CRC32C `crc` of what came before.
    pub fn resume(crc: u32) -> Self {
        // The reflected register holds the CRC before its final inversion.
        Crc32c(Digest::new_with_init_state(
            CrcAlgorithm::Crc32Iscsi,
            u64::from(!crc),
        ))
    }

    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    pub fn value(&self) -> u32 {
        self.0.finalize() as u32
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Crc32c {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Crc32c({:#010x})", self.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bit by bit, the definition: reflected polynomial 0x82F63B78, inverted in and out.
    fn reference(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    #[test]
    fn check_value_of_the_catalogue() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c_append(0, b"123456789"), 0xE306_9283);
    }

    proptest! {
        #[test]
        fn pieces_give_the_crc_of_the_whole(data in proptest::collection::vec(any::<u8>(), 0..9000), cut in any::<prop::sample::Index>(), cut2 in any::<prop::sample::Index>()) {
            let whole = reference(&data);
            prop_assert_eq!(crc32c(&data), whole);
            let (a, b) = {
                let x = cut.index(data.len() + 1);
                let y = cut2.index(data.len() + 1);
                (x.min(y), x.max(y))
            };
            prop_assert_eq!(crc32c_append(crc32c(&data[..a]), &data[a..]), whole);
            let mut d = Crc32c::new();
            d.update(&data[..a]);
            d.update(&data[a..b]);
            d.update(&data[b..]);
            prop_assert_eq!(d.value(), whole);
        }
    }
}
