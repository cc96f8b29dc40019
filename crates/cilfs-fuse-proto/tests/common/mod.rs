//! A small encoder of requests as the kernel writes them: the in header by hand, field by
//! field, then the arguments in the order the kernel passes them.
#![allow(dead_code)]

use cilfs_fuse_proto::Opcode;

#[derive(Debug, Clone)]
pub struct KernelMsg {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub args: Vec<u8>,
    pub ext: Vec<u8>,
}

impl KernelMsg {
    pub fn new(opcode: Opcode) -> Self {
        Self::raw(opcode as u32)
    }

    pub fn raw(opcode: u32) -> Self {
        KernelMsg {
            opcode,
            unique: 0x1122_3344_5566_7788,
            nodeid: 0x0102_0304_0506_0708,
            uid: 1000,
            gid: 100,
            pid: 4242,
            args: Vec::new(),
            ext: Vec::new(),
        }
    }

    /// Appends raw argument bytes (an encoded structure, data).
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.args.extend_from_slice(b);
        self
    }

    /// Appends a name and its NUL, as the kernel sends `d_name.len + 1` bytes.
    pub fn name(mut self, n: &str) -> Self {
        self.args.extend_from_slice(n.as_bytes());
        self.args.push(0);
        self
    }

    /// Appends request extensions (already padded to 8 bytes).
    pub fn ext(mut self, b: &[u8]) -> Self {
        self.ext.extend_from_slice(b);
        self
    }

    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(self.ext.len() % 8, 0, "extensions come in 8-byte units");
        let len = 40 + self.args.len() + self.ext.len();
        let mut m = Vec::with_capacity(len);
        m.extend_from_slice(&(len as u32).to_le_bytes()); // len
        m.extend_from_slice(&self.opcode.to_le_bytes()); // opcode
        m.extend_from_slice(&self.unique.to_le_bytes()); // unique
        m.extend_from_slice(&self.nodeid.to_le_bytes()); // nodeid
        m.extend_from_slice(&self.uid.to_le_bytes()); // uid
        m.extend_from_slice(&self.gid.to_le_bytes()); // gid
        m.extend_from_slice(&self.pid.to_le_bytes()); // pid
        m.extend_from_slice(&((self.ext.len() / 8) as u16).to_le_bytes()); // total_extlen
        m.extend_from_slice(&0u16.to_le_bytes()); // padding
        assert_eq!(m.len(), 40);
        m.extend_from_slice(&self.args);
        m.extend_from_slice(&self.ext);
        m
    }

    /// The request as the kernel puts it in a FUSE-over-io_uring entry
    /// (`fuse_uring_copy_to_ring`): the in header in `in_out`, the first `arg0` bytes of the
    /// arguments (its `in_args[0]`) in `op_in`, the rest and the extensions in the payload,
    /// their length in `payload_sz`, the unique as `commit_id`. Returns the 288-byte header
    /// buffer and a buffer of `PAYLOAD_HEADROOM` bytes (filled with 0xee, so that what
    /// assembly does not write shows) followed by a payload of `room` bytes.
    pub fn ring(&self, arg0: usize, room: usize) -> (Vec<u8>, Vec<u8>) {
        use cilfs_fuse_proto::uring::{UringEntInOut, UringReqHeader, PAYLOAD_HEADROOM};
        let whole = self.encode();
        let mut h = UringReqHeader::default();
        h.in_out[..40].copy_from_slice(&whole[..40]);
        h.op_in[..arg0].copy_from_slice(&self.args[..arg0]);
        let rest = &whole[40 + arg0..];
        h.ring_ent_in_out = UringEntInOut {
            commit_id: self.unique,
            payload_sz: rest.len() as u32,
            ..UringEntInOut::default()
        };
        let mut header = Vec::new();
        h.encode(&mut header);
        let mut buf = vec![0xee; PAYLOAD_HEADROOM + room];
        buf[PAYLOAD_HEADROOM..PAYLOAD_HEADROOM + rest.len()].copy_from_slice(rest);
        (header, buf)
    }
}

/// `n` bytes, none zero and few alike, so a field read from the wrong place shows.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u32 * 37 + u32::from(seed) * 11) % 251) as u8 + 1)
        .collect()
}

/// Reads a little-endian integer at `off` (for checking encoded replies by offset).
pub fn le_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}
pub fn le_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}
pub fn le_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
