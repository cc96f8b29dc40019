//! The bodies of cilfs's fuzz targets: one public function per decoder of on-disk bytes, and one
//! that opens a damaged image. Each takes arbitrary bytes and must return, never panic or hang;
//! where a decoder accepts its input, the body also checks what must then hold (an accepted
//! value encodes back to itself, an in-place edit leaves a leaf that decodes).
//!
//! Two callers run the same bodies: the libFuzzer binaries in `fuzz/` (nightly, coverage
//! guided, for long runs) and `tests/smoke.rs`, a plain test that feeds every target mutated
//! valid encodings for a bounded, seeded number of iterations on every `cargo test`.
//!
//! A crate of its own rather than a module of cilfs-core: the targets use only the public API
//! (the decoders, `Journal`, `Fs`, the checker), as a reader of a damaged image would, and the
//! library ships no fuzzing code. It sits beside cilfs-sim, above cilfs-core and cilfs-device.

pub mod decoders;
pub mod image;
pub mod log;
pub mod mutate;

/// A fuzz target: its name (the libFuzzer binary's), its body, and valid inputs to start from.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target whose body lives here.
pub const TARGETS: &[Target] = &[
    Target {
        name: "node",
        run: decoders::node,
        seeds: decoders::node_seeds,
    },
    Target {
        name: "inode",
        run: decoders::inode,
        seeds: decoders::inode_seeds,
    },
    Target {
        name: "dir",
        run: decoders::dir,
        seeds: decoders::dir_seeds,
    },
    Target {
        name: "extent",
        run: decoders::extent,
        seeds: decoders::extent_seeds,
    },
    Target {
        name: "xattr",
        run: decoders::xattr,
        seeds: decoders::xattr_seeds,
    },
    Target {
        name: "acl",
        run: decoders::acl,
        seeds: decoders::acl_seeds,
    },
    Target {
        name: "header",
        run: decoders::header,
        seeds: decoders::header_seeds,
    },
    Target {
        name: "log_ops",
        run: log::log_ops,
        seeds: log::log_ops_seeds,
    },
    Target {
        name: "image",
        run: image::image,
        seeds: image::image_seeds,
    },
];

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}
