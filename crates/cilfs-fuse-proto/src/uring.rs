//! FUSE-over-io_uring (7.42) structures, as plain data for the queue transport to come.
//!
//! Each queue entry registers two buffers with a `FUSE_IO_URING_CMD_REGISTER` command (an
//! SQE128 `IORING_OP_URING_CMD` on the /dev/fuse fd, [`UringCmdReq`] in its command area):
//! a [`UringReqHeader`] and a payload buffer. The kernel fills the header's `in_out` with the
//! `fuse_in_header`, `op_in` with the opcode's first argument, and the payload with the rest;
//! the server writes its `fuse_out_header` into `in_out`, the reply into the payload, and
//! answers with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` carrying the entry's `commit_id`.

use crate::codec::{wire_struct, Field, Reader, Writer};
use crate::ProtoError;

/// Bytes of `fuse_uring_req_header.in_out` (room for the in or out header).
pub const URING_IN_OUT_HEADER_SZ: usize = 128;
/// Bytes of `fuse_uring_req_header.op_in` (room for the opcode's first argument).
pub const URING_OP_IN_OUT_SZ: usize = 128;

wire_struct! {
    /// `struct fuse_uring_ent_in_out`.
    pub struct UringEntInOut ("fuse_uring_ent_in_out") {
        pub flags: u64,
        /// What the COMMIT_AND_FETCH answering this request must carry.
        pub commit_id: u64,
        /// Bytes of the payload buffer in use.
        pub payload_sz: u32,
        pub padding: u32,
        pub reserved: u64,
    }
}

/// `struct fuse_uring_req_header`: the header buffer of one queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringReqHeader {
    pub in_out: [u8; URING_IN_OUT_HEADER_SZ],
    pub op_in: [u8; URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: UringEntInOut,
}

impl Default for UringReqHeader {
    fn default() -> Self {
        UringReqHeader {
            in_out: [0; URING_IN_OUT_HEADER_SZ],
            op_in: [0; URING_OP_IN_OUT_SZ],
            ring_ent_in_out: UringEntInOut::default(),
        }
    }
}

impl UringReqHeader {
    pub const SIZE: usize = URING_IN_OUT_HEADER_SZ + URING_OP_IN_OUT_SZ + UringEntInOut::SIZE;

    pub fn decode(bytes: &[u8]) -> Result<UringReqHeader, ProtoError> {
        let mut r = Reader::new(bytes, "fuse_uring_req_header");
        Ok(UringReqHeader {
            in_out: r.array()?,
            op_in: r.array()?,
            ring_ent_in_out: Field::get(&mut r)?,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        w.bytes(&self.in_out).bytes(&self.op_in);
        self.ring_ent_in_out.put(&mut w);
    }
}

/// `enum fuse_uring_cmd`: the `cmd_op` of an SQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum UringCmd {
    Invalid = 0,
    /// Register an entry's buffers and fetch a request into them.
    Register = 1,
    /// Commit the reply in the entry's buffers and fetch the next request.
    CommitAndFetch = 2,
}

wire_struct! {
    /// `struct fuse_uring_cmd_req`: in the 80-byte command area of an SQE128.
    pub struct UringCmdReq ("fuse_uring_cmd_req") {
        pub flags: u64,
        /// For COMMIT_AND_FETCH: the entry's `commit_id`.
        pub commit_id: u64,
        /// The queue (one per CPU).
        pub qid: u16,
        pub padding: [u8; 6],
    }
}
