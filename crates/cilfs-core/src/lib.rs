//! The cilfs library. Layers, lowest first: `format` (pure encode/decode), `mkfs` and `geometry`
//! (making and reading a filesystem's layout); the journal and filesystem layers build on these.

pub mod ail;
pub mod buf;
pub mod check;
pub mod cil;
pub mod format;
pub mod fs;
pub mod journal;
pub mod log;
pub mod mkfs;
pub mod trans;
pub mod util;

pub use format::geometry::{Geometry, LogLocation};
