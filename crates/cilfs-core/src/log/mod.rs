//! The on-disk log: positions, record and op format, what the log asks of a logged object
//! (`item::LogItem`), the record writer with its flush policies, block stamps, and recovery.

pub mod item;
pub mod item_format;
pub mod lsn;
pub mod record;
pub mod recover;
pub mod stamp;
pub mod writer;

pub use lsn::{LogSpace, Lsn};
pub use writer::{FlushClock, FlushPolicy, LogConfig, LogCounters, LogWriter};

#[cfg(test)]
mod tests;
