//! The filesystem header block: `Header::decode`, re-encoded.
//! The body is `cilfs_fuzz_targets::decoders::header`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::decoders::header(data));
