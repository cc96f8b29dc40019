//! Requests served by opcode, and whether io_uring queues serve them: what `cilfs stat` shows
//! as `requests_<opcode>`, `transport_uring` and `uring_*` (one mount per daemon, so one set
//! per process).

use cilfs_fuse_proto::Opcode;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Opcodes are below 64 (FUSE_SYNCFS is 50, CUSE_INIT is 4096 and not served).
const SLOTS: usize = 64;

static BY_OPCODE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static TRANSPORT: AtomicU8 = AtomicU8::new(Transport::Native as u8);
static URING_QUEUES: AtomicU64 = AtomicU64::new(0);
static URING_ENTRIES: AtomicU64 = AtomicU64::new(0);
static URING_REQUESTS: AtomicU64 = AtomicU64::new(0);

/// How requests reach the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Transport {
    /// Reads of /dev/fuse.
    Native = 1,
    /// io_uring queues.
    Uring = 2,
}

/// Counts one request.
pub fn count(opcode: u32) {
    if let Some(c) = BY_OPCODE.get(opcode as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts one request that came through an io_uring queue (also counted by opcode).
pub fn count_ring() {
    URING_REQUESTS.fetch_add(1, Ordering::Relaxed);
}

pub fn set_transport(t: Transport) {
    TRANSPORT.store(t as u8, Ordering::Relaxed);
}

/// The io_uring queues serve: how many, with how many entries in all.
pub fn set_uring(queues: usize, entries: usize) {
    URING_QUEUES.store(queues as u64, Ordering::Relaxed);
    URING_ENTRIES.store(entries as u64, Ordering::Relaxed);
    set_transport(Transport::Uring);
}

/// `transport_uring` (1: requests through io_uring queues, 0: through /dev/fuse reads), with
/// io_uring `uring_queues`, `uring_entries` and `uring_requests` (requests answered over the
/// ring), then `requests_<opcode>` for every opcode served at least once, over either path.
pub fn counters() -> Vec<(String, u64)> {
    let uring = TRANSPORT.load(Ordering::Relaxed) == Transport::Uring as u8;
    let mut v = vec![("transport_uring".to_string(), u64::from(uring))];
    if uring {
        for (k, c) in [
            ("uring_queues", &URING_QUEUES),
            ("uring_entries", &URING_ENTRIES),
            ("uring_requests", &URING_REQUESTS),
        ] {
            v.push((k.to_string(), c.load(Ordering::Relaxed)));
        }
    }
    for &op in Opcode::ALL {
        let n = BY_OPCODE
            .get(op as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed));
        if n > 0 {
            let name = op.name().trim_start_matches("FUSE_").to_ascii_lowercase();
            v.push((format!("requests_{name}"), n));
        }
    }
    v
}
