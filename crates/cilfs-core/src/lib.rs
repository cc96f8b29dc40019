//! The cilfs library. Layers, lowest first; a module imports only from those below it
//! (`scripts/check-imports` fails on any import cycle):
//!
//! - `util`: counters, number-keyed maps, the lock facade, lock statistics, spinning locks;
//! - `format`: on-disk headers (pure encode/decode) and the geometry read back from them;
//! - `log`: positions, record and item formats, block stamps, the record writer, recovery;
//! - `buf`: metadata buffers and their cache;
//! - `cil`: the committed item list and its limits;
//! - `ail`: the active item list and its pusher thread;
//! - `trans`: transactions and log-space grants;
//! - `journal`: the facade over log, CIL, AIL and transactions;
//! - `fs`: the filesystem; `check`: the checker and repair; `mkfs`: making a filesystem.

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
