//! FUSE-over-io_uring (7.42): the structures, and how a request and its reply sit in a queue
//! entry's buffers (`fs/fuse/dev_uring.c`).
//!
//! Each queue entry registers two buffers with a `FUSE_IO_URING_CMD_REGISTER` command (an
//! SQE128 `IORING_OP_URING_CMD` on the /dev/fuse fd, [`UringCmdReq`] in its command area):
//! a [`UringReqHeader`] and a payload buffer. The kernel fills the header's `in_out` with the
//! `fuse_in_header`, `op_in` with the opcode's first argument, and the payload with the rest;
//! the server writes its `fuse_out_header` into `in_out`, the reply into the payload, and
//! answers with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` carrying the entry's `commit_id`.
//!
//! [`assemble`] turns an entry back into the message /dev/fuse would have delivered, so that
//! [`crate::Request::parse_with`] decodes both transports' requests alike; [`put_reply`] puts
//! an encoded reply where the kernel's commit reads it.

use crate::abi::{InHeader, OutHeader};
use crate::codec::{wire_struct, Field, Reader, Writer};
use crate::ProtoError;
use std::ops::Range;

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

impl UringCmdReq {
    /// The SQE128 command area (80 bytes) carrying this request, the rest zero.
    pub fn command_area(&self) -> [u8; 80] {
        let mut v = Vec::with_capacity(UringCmdReq::SIZE);
        self.encode(&mut v);
        let mut area = [0u8; 80];
        area[..v.len()].copy_from_slice(&v);
        area
    }
}

/// Where `op_in` starts in an entry's header buffer.
const OP_IN_AT: usize = URING_IN_OUT_HEADER_SZ;
/// Where `ring_ent_in_out` starts.
const ENT_IN_OUT_AT: usize = OP_IN_AT + URING_OP_IN_OUT_SZ;
/// Where `payload_sz` lies within `ring_ent_in_out` (after `flags` and `commit_id`).
const PAYLOAD_SZ_AT: usize = ENT_IN_OUT_AT + 16;

/// Bytes an entry's buffer keeps in front of the payload it registers: where [`assemble`] puts
/// the in header and the first argument, so that a request reads as one message with a copy
/// of at most this many bytes, whatever the size of the payload (a WRITE's megabyte stays
/// where the kernel put it).
pub const PAYLOAD_HEADROOM: usize = InHeader::SIZE + URING_OP_IN_OUT_SZ;

/// A request assembled in an entry's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingRequest {
    /// What the COMMIT_AND_FETCH answering it must carry.
    pub commit_id: u64,
    /// The request as /dev/fuse would have delivered it, within the buffer given to
    /// [`assemble`].
    pub msg: Range<usize>,
}

fn header_part(header: &[u8]) -> Result<&[u8], ProtoError> {
    header
        .get(..UringReqHeader::SIZE)
        .ok_or(ProtoError::Truncated {
            what: "fuse_uring_req_header",
            need: UringReqHeader::SIZE,
            have: header.len(),
        })
}

/// The `ring_ent_in_out` of an entry's header buffer (commit_id, payload_sz).
pub fn ent_in_out(header: &[u8]) -> Result<UringEntInOut, ProtoError> {
    UringEntInOut::decode(&header_part(header)?[ENT_IN_OUT_AT..])
}

/// Makes the request the kernel put in an entry one /dev/fuse message again.
///
/// `header` is the entry's `fuse_uring_req_header` buffer; `buf` holds [`PAYLOAD_HEADROOM`]
/// bytes followed by the payload buffer the entry registered. The kernel wrote the in header
/// into `in_out`, the request's first argument (`in_args[0]`, possibly empty) into `op_in`,
/// the other arguments and the extensions into the payload, `payload_sz` bytes of it. It does
/// not say how long the first argument is, but the in header's `len` counts every argument,
/// so the first one is `len - 40 - payload_sz` bytes; the in header and those bytes are copied
/// right in front of the payload. Any inconsistency is an error, never a panic: the caller
/// still commits the entry (with an error reply) by [`ent_in_out`]'s commit_id.
pub fn assemble(header: &[u8], buf: &mut [u8]) -> Result<RingRequest, ProtoError> {
    let header = header_part(header)?;
    let ent = ent_in_out(header)?;
    let in_header = InHeader::decode(header)?;
    let room = buf
        .len()
        .checked_sub(PAYLOAD_HEADROOM)
        .ok_or(ProtoError::Truncated {
            what: "ring entry buffer",
            need: PAYLOAD_HEADROOM,
            have: buf.len(),
        })?;
    let split = ProtoError::RingSplit {
        header_len: in_header.len,
        payload_sz: ent.payload_sz,
        room,
        op_in_max: URING_OP_IN_OUT_SZ,
    };
    let payload_sz = ent.payload_sz as usize;
    if payload_sz > room {
        return Err(split);
    }
    let Some(op_in_len) = (in_header.len as usize)
        .checked_sub(InHeader::SIZE + payload_sz)
        .filter(|&n| n <= URING_OP_IN_OUT_SZ)
    else {
        return Err(split);
    };
    let start = PAYLOAD_HEADROOM - op_in_len - InHeader::SIZE;
    buf[start..start + InHeader::SIZE].copy_from_slice(&header[..InHeader::SIZE]);
    buf[start + InHeader::SIZE..PAYLOAD_HEADROOM]
        .copy_from_slice(&header[OP_IN_AT..OP_IN_AT + op_in_len]);
    Ok(RingRequest {
        commit_id: ent.commit_id,
        msg: start..PAYLOAD_HEADROOM + payload_sz,
    })
}

/// Puts a reply where the kernel's commit (`fuse_uring_commit`) reads it: the out header in
/// `in_out`, the body (without the header, unlike /dev/fuse) at the start of the payload, and
/// the body's length in `ring_ent_in_out.payload_sz`. `head` is an encoded reply as written to
/// /dev/fuse (its out header, whose `len` counts `data` too, and any small body) and `data`
/// what follows it (READ data), so both transports share the encoders. Returns the body's
/// length. A reply that is inconsistent or too big for the payload is an error; the caller
/// then commits an error reply instead, which carries no body.
pub fn put_reply(
    header: &mut [u8],
    payload: &mut [u8],
    head: &[u8],
    data: &[u8],
) -> Result<usize, ProtoError> {
    header_part(header)?;
    let out = OutHeader::decode(head)?;
    let total = head.len() + data.len();
    if out.len as usize != total {
        return Err(ProtoError::LengthMismatch {
            header_len: out.len,
            buffer_len: total,
        });
    }
    let small = &head[OutHeader::SIZE..];
    let body_len = small.len() + data.len();
    if body_len > payload.len() {
        return Err(ProtoError::DoesNotFit {
            what: "FUSE reply body",
            len: body_len,
            room: payload.len(),
        });
    }
    // The payload buffer is at most a few megabytes: its length fits payload_sz.
    let payload_sz = u32::try_from(body_len).map_err(|_| ProtoError::TooLong {
        what: "fuse_uring_ent_in_out.payload_sz",
        len: body_len,
    })?;
    header[..OutHeader::SIZE].copy_from_slice(&head[..OutHeader::SIZE]);
    payload[..small.len()].copy_from_slice(small);
    payload[small.len()..body_len].copy_from_slice(data);
    header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4].copy_from_slice(&payload_sz.to_le_bytes());
    Ok(body_len)
}
