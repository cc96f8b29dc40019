//! FUSE-over-io_uring entries without a kernel: requests assembled from an entry's two
//! buffers, replies put where `fuse_uring_commit` reads them, and no input that panics.

mod common;

use cilfs_fuse_proto::uring::{
    assemble, ent_in_out, put_reply, UringCmd, UringCmdReq, UringReqHeader, PAYLOAD_HEADROOM,
    URING_OP_IN_OUT_SZ,
};
use cilfs_fuse_proto::*;
use common::{pattern, KernelMsg};
use proptest::prelude::*;

fn write_msg(data: &[u8]) -> KernelMsg {
    let mut arg = Vec::new();
    WriteIn {
        fh: 7,
        offset: 4096,
        size: data.len() as u32,
        ..WriteIn::default()
    }
    .encode(&mut arg);
    KernelMsg::new(Opcode::Write).bytes(&arg).bytes(data)
}

/// A WRITE's data stays where the kernel put it: assembly copies only the in header and
/// the 40-byte fuse_write_in in front of it.
#[test]
fn a_write_is_assembled_in_front_of_its_payload() {
    let data = pattern(65536, 3);
    let msg = write_msg(&data);
    let (header, mut buf) = msg.ring(WriteIn::SIZE, 1 << 20);
    let r = assemble(&header, &mut buf).unwrap();
    assert_eq!(r.msg.end, PAYLOAD_HEADROOM + data.len());
    assert_eq!(
        r.msg.start,
        PAYLOAD_HEADROOM - WriteIn::SIZE - InHeader::SIZE
    );
    assert!(
        buf[..r.msg.start].iter().all(|&b| b == 0xee),
        "wrote before the message"
    );
    let req = Request::parse(&buf[r.msg.clone()]).unwrap();
    match req.op {
        Op::Write { arg, data: got } => {
            assert_eq!((arg.fh, arg.offset), (7, 4096));
            assert_eq!(got, &data[..]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.commit_id, msg.unique);
}

/// A name-first request (LOOKUP) has an empty first argument: the name is in the payload.
#[test]
fn a_lookup_has_an_empty_op_in() {
    let msg = KernelMsg::new(Opcode::Lookup).name("a-name");
    let (header, mut buf) = msg.ring(0, 8192);
    assert_eq!(ent_in_out(&header).unwrap().payload_sz, 7);
    let r = assemble(&header, &mut buf).unwrap();
    assert_eq!(r.msg.start, PAYLOAD_HEADROOM - InHeader::SIZE);
    let req = Request::parse(&buf[r.msg]).unwrap();
    assert_eq!(
        req.op,
        Op::Lookup {
            name: std::ffi::OsStr::new("a-name")
        }
    );
}

fn set_payload_sz(header: &mut [u8], n: u32) {
    let at = 2 * URING_OP_IN_OUT_SZ + 16;
    header[at..at + 4].copy_from_slice(&n.to_le_bytes());
}

#[test]
fn inconsistent_entries_are_errors() {
    let msg = write_msg(&[1, 2, 3, 4]);
    let (header, buf) = msg.ring(WriteIn::SIZE, 4096);
    // A payload bigger than the buffer registered.
    let mut h = header.clone();
    set_payload_sz(&mut h, 4097);
    assert!(matches!(
        assemble(&h, &mut buf.clone()),
        Err(ProtoError::RingSplit { .. })
    ));
    // A header len that leaves more than op_in can hold for the first argument.
    let mut h = header.clone();
    set_payload_sz(&mut h, 0);
    h[..4].copy_from_slice(&(40u32 + 129).to_le_bytes());
    assert!(matches!(
        assemble(&h, &mut buf.clone()),
        Err(ProtoError::RingSplit { .. })
    ));
    // A header len shorter than the in header and the payload.
    let mut h = header.clone();
    h[..4].copy_from_slice(&10u32.to_le_bytes());
    assert!(matches!(
        assemble(&h, &mut buf.clone()),
        Err(ProtoError::RingSplit { .. })
    ));
    // Buffers too short to be an entry's.
    assert!(matches!(
        assemble(&header[..100], &mut buf.clone()),
        Err(ProtoError::Truncated { .. })
    ));
    assert!(matches!(
        assemble(&header, &mut [0; PAYLOAD_HEADROOM - 1]),
        Err(ProtoError::Truncated { .. })
    ));
    // The commit id is still there to answer the entry with.
    assert_eq!(ent_in_out(&header).unwrap().commit_id, msg.unique);
}

/// An entry whose header has garbage still decodes through the same checks: a valid
/// split of garbage is a message the parser then refuses or accepts, never a panic.
#[test]
fn a_valid_split_of_a_bad_message_is_the_parsers_to_refuse() {
    let msg = KernelMsg::new(Opcode::Write).bytes(&[0; 8]);
    let (header, mut buf) = msg.ring(8, 4096);
    let r = assemble(&header, &mut buf).unwrap();
    assert!(Request::parse(&buf[r.msg]).is_err());
}

fn header_buf() -> Vec<u8> {
    vec![0xaa; UringReqHeader::SIZE]
}

/// dev_uring.c reads the out header from `in_out` and, when its error is 0, `payload_sz`
/// bytes of body from the payload, the out header not included (fuse_copy_out_args counts
/// no header for a ring).
#[test]
fn replies_go_to_in_out_and_the_payload() {
    let entry = EntryOut {
        nodeid: 5,
        ..EntryOut::default()
    };
    let r = Reply::entry(77, &entry);
    let (mut header, mut payload) = (header_buf(), vec![0u8; 8192]);
    let n = put_reply(&mut header, &mut payload, r.as_bytes(), &[]).unwrap();
    assert_eq!(n, EntryOut::SIZE);
    let out = OutHeader::decode(&header).unwrap();
    assert_eq!((out.unique, out.error), (77, 0));
    assert_eq!(out.len as usize, OutHeader::SIZE + EntryOut::SIZE);
    assert_eq!(&payload[..n], &r.as_bytes()[OutHeader::SIZE..]);
    let ent = ent_in_out(&header).unwrap();
    assert_eq!(ent.payload_sz as usize, EntryOut::SIZE);
    // op_in and the rest of ring_ent_in_out are left alone.
    assert!(header[OutHeader::SIZE..256].iter().all(|&b| b == 0xaa));
    assert_eq!(ent.commit_id, 0xaaaa_aaaa_aaaa_aaaa);
}

#[test]
fn read_data_follows_its_header_in_the_payload() {
    let data = pattern(300_000, 9);
    let mut head = Vec::new();
    reply_header(12, data.len()).unwrap().encode(&mut head);
    let (mut header, mut payload) = (header_buf(), vec![0u8; 1 << 20]);
    let n = put_reply(&mut header, &mut payload, &head, &data).unwrap();
    assert_eq!(n, data.len());
    assert_eq!(&payload[..n], &data[..]);
    assert_eq!(ent_in_out(&header).unwrap().payload_sz as usize, n);
    assert_eq!(OutHeader::decode(&header).unwrap().unique, 12);
}

/// An error reply is its header alone: payload_sz 0, which the kernel does not read anyway.
#[test]
fn errors_carry_no_body() {
    let (mut header, mut payload) = (header_buf(), vec![0u8; 16]);
    let r = Reply::error(3, Errno::ENOSYS);
    assert_eq!(
        put_reply(&mut header, &mut payload, r.as_bytes(), &[]),
        Ok(0)
    );
    let out = OutHeader::decode(&header).unwrap();
    assert_eq!(out.error, -libc::ENOSYS);
    assert_eq!(ent_in_out(&header).unwrap().payload_sz, 0);
}

#[test]
fn replies_that_do_not_fit_are_errors() {
    let (mut header, mut payload) = (header_buf(), vec![0u8; 100]);
    let data = vec![1u8; 101];
    let mut head = Vec::new();
    reply_header(1, data.len()).unwrap().encode(&mut head);
    assert!(matches!(
        put_reply(&mut header, &mut payload, &head, &data),
        Err(ProtoError::DoesNotFit { len: 101, .. })
    ));
    // A header whose len does not count the data.
    assert!(matches!(
        put_reply(&mut header, &mut payload, &head, &data[..5]),
        Err(ProtoError::LengthMismatch { .. })
    ));
    assert!(put_reply(&mut header, &mut payload, &head[..8], &[]).is_err());
    assert!(put_reply(&mut header[..200], &mut payload, &head, &data).is_err());
    // Nothing was written by the refusals.
    assert!(header.iter().all(|&b| b == 0xaa));
}

#[test]
fn the_command_area_holds_fuse_uring_cmd_req() {
    let area = UringCmdReq {
        flags: 0,
        commit_id: 0x0102_0304_0506_0708,
        qid: 3,
        padding: [0; 6],
    }
    .command_area();
    assert_eq!(area.len(), 80);
    assert_eq!(&area[8..16], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(&area[16..18], &3u16.to_le_bytes());
    assert!(area[18..].iter().all(|&b| b == 0));
    assert_eq!(UringCmd::CommitAndFetch as u32, 2);
}

proptest! {
    /// Any header and payload bytes: assembly gives an error or a range inside the buffer
    /// whose bytes the parser checks like any other message.
    #[test]
    fn any_entry_assembles_or_fails_without_panic(
        header in proptest::collection::vec(any::<u8>(), 0..400),
        room in 0usize..600,
        len in any::<u32>(),
        payload_sz in 0u32..700,
    ) {
        let mut header = header;
        if header.len() >= UringReqHeader::SIZE {
            header[..4].copy_from_slice(&len.to_le_bytes());
            set_payload_sz(&mut header, payload_sz);
        }
        let mut buf = vec![0u8; PAYLOAD_HEADROOM + room];
        if let Ok(r) = assemble(&header, &mut buf) {
            prop_assert!(r.msg.end <= buf.len() && r.msg.start <= r.msg.end);
            prop_assert_eq!(r.msg.len(), len as usize);
            let _ = Request::parse(&buf[r.msg]);
        }
    }

    /// Any reply bytes and payload room: the reply is placed whole or refused.
    #[test]
    fn any_reply_is_placed_or_refused(
        head in proptest::collection::vec(any::<u8>(), 0..64),
        data_len in 0usize..300,
        room in 0usize..300,
        fix_len in any::<bool>(),
    ) {
        let mut head = head;
        if fix_len && head.len() >= 16 {
            let total = (head.len() + data_len) as u32;
            head[..4].copy_from_slice(&total.to_le_bytes());
        }
        let data = vec![5u8; data_len];
        let (mut header, mut payload) = (header_buf(), vec![0u8; room]);
        if let Ok(n) = put_reply(&mut header, &mut payload, &head, &data) {
            prop_assert_eq!(n, head.len() - 16 + data_len);
            prop_assert_eq!(ent_in_out(&header).unwrap().payload_sz as usize, n);
        }
    }
}
