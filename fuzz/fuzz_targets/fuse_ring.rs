//! Arbitrary bytes as a FUSE-over-io_uring entry: the first 288 bytes as its
//! fuse_uring_req_header, the rest as its payload. Assembled into one message and decoded
//! (what the ring transport does with each completion), then a reply of the same bytes placed
//! into the entry (what it does before each commit).
#![no_main]

use cilfs_fuse_proto::uring::{assemble, ent_in_out, put_reply, UringReqHeader, PAYLOAD_HEADROOM};
use cilfs_fuse_proto::Request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cut = data.len().min(UringReqHeader::SIZE);
    let (header, payload) = data.split_at(cut);
    let _ = ent_in_out(header);
    let mut buf = vec![0u8; PAYLOAD_HEADROOM + payload.len()];
    buf[PAYLOAD_HEADROOM..].copy_from_slice(payload);
    if let Ok(r) = assemble(header, &mut buf) {
        assert!(r.msg.end <= buf.len());
        let _ = Request::parse(&buf[r.msg]);
    }
    let mut header = header.to_vec();
    let mut room = vec![0u8; payload.len() / 2];
    if let Ok(n) = put_reply(&mut header, &mut room, payload, &[]) {
        assert!(n <= room.len());
    }
});
