//! Support code the other layers share and that knows nothing of the filesystem: CRC32C, event
//! counters, number-keyed hash maps, the machine's memory, the lock facade (std or loom), lock
//! statistics, polling a lock before blocking and the adaptive mutex, (tests only) a write queue
//! that completes late, and (scheduled builds only) switches that break the code on purpose.

pub mod adaptive;
pub mod counter;
pub mod crc;
pub mod lockstat;
pub mod memory;
#[cfg(shuttle)]
pub mod mutants;
pub mod numhash;
pub mod spin;
pub(crate) mod sync;
#[cfg(test)]
pub(crate) mod test_queue;
