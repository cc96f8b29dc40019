//! Op streams sealed into valid log records, scanned by recovery and replayed.
//! The body is `cilfs_fuzz_targets::log::log_ops`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::log::log_ops(data));
