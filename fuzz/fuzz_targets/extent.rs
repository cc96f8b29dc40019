//! An extent item: `Extent::decode` under a key's file block, re-encoded.
//! The body is `cilfs_fuzz_targets::decoders::extent`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::decoders::extent(data));
