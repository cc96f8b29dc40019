//! An xattr bucket: `xattr::decode`, re-encoded, and the ACLs it holds parsed.
//! The body is `cilfs_fuzz_targets::decoders::xattr`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::decoders::xattr(data));
