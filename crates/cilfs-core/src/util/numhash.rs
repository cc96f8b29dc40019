//! Hash maps keyed by numbers the filesystem hands out itself (block and inode numbers): no key
//! is an attacker's choice, so a multiply-xorshift does instead of SipHash, which cost some
//! 140 instructions a lookup and a dozen lookups a create, a third of them under the
//! filesystem's exclusive lock.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// A multiply-xorshift of one u64 key.
#[derive(Debug, Default, Clone, Copy)]
pub struct NumberHasher(u64);

impl std::hash::Hasher for NumberHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b) ^ self.0.rotate_left(8));
        }
    }
    fn write_u64(&mut self, x: u64) {
        let m = (x ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = m ^ (m >> 29);
    }
}

/// A map keyed by a block or inode number.
pub type NumberMap<V> = HashMap<u64, V, BuildHasherDefault<NumberHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hasher};

    /// Sequential numbers (inode runs, neighbouring blocks) spread over the table's buckets.
    #[test]
    fn sequential_keys_spread_over_the_low_bits() {
        let b = BuildHasherDefault::<NumberHasher>::default();
        let mut buckets = [0u32; 64];
        for k in 0..64_000u64 {
            let mut h = b.build_hasher();
            h.write_u64(k);
            buckets[(h.finish() % 64) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&n| (800..1200).contains(&n)),
            "{buckets:?}"
        );
    }
}
