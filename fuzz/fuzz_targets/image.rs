//! Patches to a small populated image, which is then scanned, checked, mounted, read,
//! changed and unmounted.
//! The body is `cilfs_fuzz_targets::image::image`, which the smoke test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The allocator of the cilfs binary, which mounts filesystems: glibc's malloc and free were a
// tenth of this target's time, in many short-lived vectors (decoded nodes, items, buffers).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fuzz_target!(|data: &[u8]| cilfs_fuzz_targets::image::image(data));
