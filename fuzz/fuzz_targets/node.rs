//! A tree node block: `Node::decode`, the raw lookup and seek, the leaf layout check and
//! the in-place put and remove, against the decoding way.
//! The body is `cilfs_fuzz_targets::decoders::node`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::decoders::node(data));
