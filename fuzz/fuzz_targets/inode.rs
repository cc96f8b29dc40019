//! An inode item: `Inode::decode`, and the attributes and encoding of what it accepts.
//! The body is `cilfs_fuzz_targets::decoders::inode`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::decoders::inode(data));
