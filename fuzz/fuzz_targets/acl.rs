//! An ACL xattr value: `Acl::parse`, re-encoded, chmod and create mask applied.
//! The body is `cilfs_fuzz_targets::decoders::acl`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::decoders::acl(data));
