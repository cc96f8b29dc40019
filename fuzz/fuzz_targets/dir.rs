//! A directory entry bucket: `decode_bucket` and `decode_slotted`, re-encoded.
//! The body is `cilfs_fuzz_targets::decoders::dir`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::decoders::dir(data));
