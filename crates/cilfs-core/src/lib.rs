//! The cilfs library. Layers, lowest first: `format` (pure encode/decode), `mkfs` and `geometry`
//! (making and reading a filesystem's layout); the journal and filesystem layers build on these.

pub mod adaptive;
pub mod ail;
pub mod buf;
pub mod check;
pub mod cil;
pub mod counter;
pub mod format;
pub mod fs;
pub mod geometry;
pub mod journal;
pub mod lockstat;
pub mod log;
pub mod memory;
pub mod mkfs;
pub mod numhash;
mod sync;
#[cfg(test)]
mod test_queue;
pub mod trans;

pub use geometry::{Geometry, LogLocation};
