//! Arbitrary bytes through the superblock and log device header decoders.
#![no_main]

use cilfs_core::format::{LogDeviceHeader, Superblock};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Superblock::decode(data);
    let _ = LogDeviceHeader::decode(data);
});
