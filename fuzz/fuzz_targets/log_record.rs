//! Arbitrary bytes through every log decoder, and as a whole log region through recovery's scan:
//! errors are fine, panics are not.
#![no_main]

use cilfs_core::log::item_format::decode_item;
use cilfs_core::log::record::{parse_ops, RecordHeader};
use cilfs_core::log::recover::{scan_log, LogRegion};
use cilfs_core::log::LogSpace;
use cilfs_device::{Device, SimDevice, WriteFlags};
use libfuzzer_sys::fuzz_target;

const LOG_BYTES: u64 = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let _ = RecordHeader::decode(data);
    let _ = parse_ops(data);
    let _ = decode_item(data, 4096);
    let dev = SimDevice::new(LOG_BYTES, 0);
    let mut region = vec![0u8; LOG_BYTES as usize];
    let n = data.len().min(region.len());
    region[..n].copy_from_slice(&data[..n]);
    if dev.write(0, &region, WriteFlags::NONE).is_ok() {
        let r = LogRegion { dev: &dev, offset: 0, space: LogSpace::new(LOG_BYTES) };
        let _ = scan_log(&r, 4096);
    }
});
