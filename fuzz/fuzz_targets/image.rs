//! Patches to a small populated image, which is then scanned, checked, mounted, read,
//! changed and unmounted.
//! The body is `cilfs_fuzz_targets::image::image`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::image::image(data));
