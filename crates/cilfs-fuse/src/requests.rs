//! Requests served by opcode, and the transport serving them: what `cilfs stat` shows as
//! `requests_<opcode>` and `transport_*` (one mount per daemon, so one set per process).

use cilfs_fuse_proto::Opcode;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Opcodes are below 64 (FUSE_SYNCFS is 50, CUSE_INIT is 4096 and not served).
const SLOTS: usize = 64;

static BY_OPCODE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static TRANSPORT: AtomicU8 = AtomicU8::new(Transport::Fuser as u8);

/// Which transport serves the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Transport {
    /// fuser's session over /dev/fuse.
    Fuser = 0,
    /// cilfs's own, reading /dev/fuse.
    Native = 1,
}

/// Counts one request.
pub fn count(opcode: u32) {
    if let Some(c) = BY_OPCODE.get(opcode as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

pub fn set_transport(t: Transport) {
    TRANSPORT.store(t as u8, Ordering::Relaxed);
}

/// `transport_native` (0 or 1: fuser or cilfs's own), then `requests_<opcode>` for every
/// opcode served at least once.
pub fn counters() -> Vec<(String, u64)> {
    let mut v = vec![(
        "transport_native".to_string(),
        u64::from(TRANSPORT.load(Ordering::Relaxed) == Transport::Native as u8),
    )];
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
