//! Messages the kernel would never send: each gives its typed error.

mod common;

use cilfs_fuse_proto::*;
use common::{pattern, KernelMsg};

fn write_msg(size: u32, data: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    WriteIn {
        size,
        ..WriteIn::default()
    }
    .encode(&mut a);
    KernelMsg::new(Opcode::Write).bytes(&a).bytes(data).encode()
}

#[test]
fn shorter_than_a_header_is_truncated() {
    for n in 0..40 {
        let err = Request::parse(&vec![0u8; n]).unwrap_err();
        assert!(
            matches!(err, ProtoError::Truncated { need: 4.., have, .. } if have == n),
            "{n}: {err:?}"
        );
    }
}

#[test]
fn header_len_must_be_the_message_length() {
    let good = KernelMsg::new(Opcode::Lookup).name("x").encode();
    assert!(Request::parse(&good).is_ok());
    // The buffer holds more than the header says (oversized) ...
    let mut longer = good.clone();
    longer.extend_from_slice(&[0; 8]);
    assert_eq!(
        Request::parse(&longer).unwrap_err(),
        ProtoError::LengthMismatch {
            header_len: good.len() as u32,
            buffer_len: good.len() + 8
        }
    );
    // ... or less (a cut message), or the header claims less than itself.
    let cut = &good[..good.len() - 1];
    assert!(matches!(
        Request::parse(cut).unwrap_err(),
        ProtoError::LengthMismatch { .. }
    ));
    for len in [0u32, 39, u32::MAX] {
        let mut m = good.clone();
        m[..4].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(
            Request::parse(&m).unwrap_err(),
            ProtoError::LengthMismatch { .. }
        ));
    }
}

#[test]
fn every_truncation_of_every_valid_message_fails() {
    // Cut a valid message anywhere and fix the header's len to match: the arguments are then
    // short, and must be reported, not read past.
    let a = {
        let mut v = Vec::new();
        SetattrIn::default().encode(&mut v);
        v
    };
    let msgs = [
        KernelMsg::new(Opcode::Setattr).bytes(&a).encode(),
        KernelMsg::new(Opcode::Rename)
            .bytes(&pattern(8, 1))
            .name("old")
            .name("new")
            .encode(),
        write_msg(5, b"12345"),
        KernelMsg::new(Opcode::Symlink).name("l").name("t").encode(),
    ];
    for msg in msgs {
        assert!(Request::parse(&msg).is_ok());
        for cut in 40..msg.len() {
            let mut m = msg[..cut].to_vec();
            m[..4].copy_from_slice(&(cut as u32).to_le_bytes());
            assert!(Request::parse(&m).is_err(), "cut at {cut} parsed");
        }
    }
}

#[test]
fn fixed_arguments_must_be_exact() {
    let short = KernelMsg::new(Opcode::Getattr).bytes(&[0; 15]).encode();
    assert!(matches!(
        Request::parse(&short).unwrap_err(),
        ProtoError::Truncated {
            what: "FUSE_GETATTR",
            need: 16,
            have: 15
        }
    ));
    let long = KernelMsg::new(Opcode::Getattr).bytes(&[0; 17]).encode();
    assert_eq!(
        Request::parse(&long).unwrap_err(),
        ProtoError::TrailingBytes {
            what: "FUSE_GETATTR",
            extra: 1
        }
    );
    let statfs = KernelMsg::new(Opcode::Statfs).bytes(&[0]).encode();
    assert!(matches!(
        Request::parse(&statfs).unwrap_err(),
        ProtoError::TrailingBytes { extra: 1, .. }
    ));
}

#[test]
fn names_need_their_nul_and_nothing_after() {
    let no_nul = KernelMsg::new(Opcode::Lookup).bytes(b"abc").encode();
    assert_eq!(
        Request::parse(&no_nul).unwrap_err(),
        ProtoError::MissingNul {
            what: "FUSE_LOOKUP"
        }
    );
    let after = KernelMsg::new(Opcode::Unlink)
        .name("a")
        .bytes(b"b")
        .encode();
    assert!(matches!(
        Request::parse(&after).unwrap_err(),
        ProtoError::TrailingBytes { extra: 1, .. }
    ));
    // RENAME with one name only.
    let one = KernelMsg::new(Opcode::Rename)
        .bytes(&[0; 8])
        .name("old")
        .encode();
    assert!(matches!(
        Request::parse(&one).unwrap_err(),
        ProtoError::MissingNul { .. }
    ));
}

#[test]
fn declared_data_lengths_are_checked() {
    assert_eq!(
        Request::parse(&write_msg(4, b"12345")).unwrap_err(),
        ProtoError::DataLength {
            what: "FUSE_WRITE data",
            declared: 4,
            actual: 5
        }
    );
    assert!(Request::parse(&write_msg(u32::MAX, b"1")).is_err());
    assert!(Request::parse(&write_msg(0, b"")).is_ok());

    let mut a = Vec::new();
    BatchForgetIn { count: 2, dummy: 0 }.encode(&mut a);
    a.extend_from_slice(&[0; 16]); // one entry, not two
    let m = KernelMsg::new(Opcode::BatchForget).bytes(&a).encode();
    assert!(matches!(
        Request::parse(&m).unwrap_err(),
        ProtoError::DataLength {
            declared: 32,
            actual: 16,
            ..
        }
    ));
    let mut a = Vec::new();
    BatchForgetIn {
        count: u32::MAX,
        dummy: 0,
    }
    .encode(&mut a);
    let m = KernelMsg::new(Opcode::BatchForget).bytes(&a).encode();
    assert!(Request::parse(&m).is_err());

    let mut a = Vec::new();
    SetxattrIn {
        size: 10,
        ..SetxattrIn::default()
    }
    .encode(&mut a);
    let m = KernelMsg::new(Opcode::Setxattr)
        .bytes(&a)
        .name("user.x")
        .bytes(b"short")
        .encode();
    assert!(matches!(
        Request::parse(&m).unwrap_err(),
        ProtoError::DataLength {
            declared: 10,
            actual: 5,
            ..
        }
    ));
}

#[test]
fn init_of_an_odd_size_is_refused() {
    for n in [0usize, 8, 15, 17, 40, 63] {
        let m = KernelMsg::new(Opcode::Init).bytes(&vec![1; n]).encode();
        assert!(Request::parse(&m).is_err(), "INIT of {n} bytes");
    }
    // A newer kernel's longer INIT: the known 64 bytes are read.
    let m = KernelMsg::new(Opcode::Init).bytes(&[1; 80]).encode();
    assert!(matches!(Request::parse(&m).unwrap().op, Op::Init(_)));
}

#[test]
fn extensions_are_bounded() {
    // total_extlen larger than the whole body.
    let mut m = KernelMsg::new(Opcode::Statfs).encode();
    m[36..38].copy_from_slice(&1u16.to_le_bytes());
    assert_eq!(
        Request::parse(&m).unwrap_err(),
        ProtoError::ExtensionOverrun {
            extension_bytes: 8,
            body_len: 0
        }
    );
    let create = |ext: &[u8]| {
        KernelMsg::new(Opcode::Create)
            .bytes(&[0; 16])
            .name("f")
            .ext(ext)
            .encode()
    };
    let ext_header = |size: u32, typ: u32| {
        let mut e = size.to_le_bytes().to_vec();
        e.extend_from_slice(&typ.to_le_bytes());
        e
    };
    // An extension of size 0 would never end; one of 16 runs past the 8 bytes there are.
    for size in [0u32, 4, 16, u32::MAX] {
        assert!(matches!(
            Request::parse(&create(&ext_header(size, EXT_GROUPS))).unwrap_err(),
            ProtoError::BadExtension { .. }
        ));
    }
    // Supplementary groups claiming more than they hold.
    let mut e = ext_header(16, EXT_GROUPS);
    e.extend_from_slice(&5u32.to_le_bytes());
    e.extend_from_slice(&[0; 4]);
    assert!(matches!(
        Request::parse(&create(&e)).unwrap_err(),
        ProtoError::BadExtension { .. }
    ));
    // An unknown extension type is carried, not refused.
    let mut e = ext_header(16, 99);
    e.extend_from_slice(&[7; 8]);
    let m = create(&e);
    let req = Request::parse(&m).unwrap();
    assert_eq!(
        req.extensions.iter().collect::<Vec<_>>(),
        [Extension::Unknown {
            typ: 99,
            bytes: &[7; 8]
        }]
    );
    assert!(req.extensions.supp_groups().is_none());
}

#[test]
fn a_bad_request_still_yields_its_header_for_the_error_reply() {
    let m = write_msg(9, b"1");
    assert!(Request::parse(&m).is_err());
    let h = InHeader::parse(&m).unwrap();
    let reply = Reply::error(h.unique, Errno::EINVAL);
    assert_eq!(reply.as_bytes()[8..16], h.unique.to_le_bytes());
}

#[test]
fn errno_outside_what_the_kernel_takes_is_refused() {
    for e in [0, -1, 512, i32::MIN, i32::MAX] {
        assert_eq!(Errno::new(e), Err(ProtoError::BadErrno(e)));
    }
    assert_eq!(Errno::new(511).unwrap().get(), 511);
    assert_eq!(Errno::new(libc::ENOENT).unwrap(), Errno::ENOENT);
}
