//! Property tests: no input makes the decoders panic, and what they accept is consistent.

mod common;

use cilfs_fuse_proto::*;
use common::{pattern, KernelMsg};
use proptest::prelude::*;

const NO_EXT: Negotiated = Negotiated {
    minor: 45,
    flags: 0,
};

/// Parses with both layouts and walks everything a request lends out.
fn exercise(bytes: &[u8]) -> Result<(), ProtoError> {
    let _ = Request::parse_with(bytes, &NO_EXT);
    let req = Request::parse(bytes)?;
    for e in req.extensions.iter() {
        if let Extension::SuppGroups(g) = e {
            assert_eq!(g.iter().count(), g.len());
        }
    }
    if let Op::BatchForget(list) = &req.op {
        assert_eq!(list.iter().count(), list.len());
    }
    match req.op.opcode() {
        Some(op) => assert_eq!(op as u32, req.header.opcode),
        None => assert!(Opcode::from_u32(req.header.opcode).is_none()),
    }
    assert_eq!(req.header.len as usize, bytes.len());
    Ok(())
}

/// A few valid messages to mutate.
fn corpus() -> Vec<Vec<u8>> {
    let mut w = Vec::new();
    WriteIn {
        size: 4,
        ..WriteIn::default()
    }
    .encode(&mut w);
    let mut f = Vec::new();
    BatchForgetIn { count: 2, dummy: 0 }.encode(&mut f);
    f.extend_from_slice(&pattern(32, 1));
    let mut ext = 16u32.to_le_bytes().to_vec();
    ext.extend_from_slice(&EXT_GROUPS.to_le_bytes());
    ext.extend_from_slice(&1u32.to_le_bytes());
    ext.extend_from_slice(&5u32.to_le_bytes());
    vec![
        KernelMsg::new(Opcode::Lookup).name("name").encode(),
        KernelMsg::new(Opcode::Write)
            .bytes(&w)
            .bytes(b"data")
            .encode(),
        KernelMsg::new(Opcode::BatchForget).bytes(&f).encode(),
        KernelMsg::new(Opcode::Rename2)
            .bytes(&pattern(16, 2))
            .name("a")
            .name("b")
            .encode(),
        KernelMsg::new(Opcode::Create)
            .bytes(&pattern(16, 3))
            .name("c")
            .ext(&ext)
            .encode(),
        KernelMsg::new(Opcode::Init).bytes(&pattern(64, 4)).encode(),
        KernelMsg::new(Opcode::Setxattr)
            .bytes(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            .name("user.a")
            .bytes(b"v")
            .encode(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = exercise(&bytes);
    }

    /// Random bodies behind a header that is right about the length, for every opcode the
    /// protocol defines and some it does not, with or without extensions.
    #[test]
    fn random_bodies_behind_a_valid_header_never_panic(
        opcode in prop_oneof![0u32..60, Just(4096u32), any::<u32>()],
        body in proptest::collection::vec(any::<u8>(), 0..400),
        extlen in prop_oneof![Just(0u16), 0u16..8, any::<u16>()],
    ) {
        let mut msg = KernelMsg::raw(opcode).bytes(&body).encode();
        msg[36..38].copy_from_slice(&extlen.to_le_bytes());
        let _ = exercise(&msg);
    }

    /// Valid messages with bytes overwritten (and the length fixed or not).
    #[test]
    fn mutated_messages_never_panic(
        which in 0usize..7,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        fix_len in any::<bool>(),
    ) {
        let mut msg = corpus()[which].clone();
        for (at, v) in edits {
            let at = at % msg.len();
            msg[at] = v;
        }
        if fix_len {
            let len = msg.len() as u32;
            msg[..4].copy_from_slice(&len.to_le_bytes());
        }
        let _ = exercise(&msg);
    }

    /// Cutting a valid message short always gives an error, whether the header's length is
    /// left alone or made to agree. (An INIT cut to 16 bytes of arguments is the one exception:
    /// that is what kernels before 7.36 send.)
    #[test]
    fn truncated_messages_are_errors(which in 0usize..7, cut in any::<usize>(), fix_len in any::<bool>()) {
        let full = corpus()[which].clone();
        prop_assert!(exercise(&full).is_ok());
        let cut = cut % full.len();
        let mut msg = full[..cut].to_vec();
        if fix_len && cut >= 4 {
            let len = cut as u32;
            msg[..4].copy_from_slice(&len.to_le_bytes());
        }
        let old_init = which == 5 && cut == 40 + COMPAT_INIT_IN_SIZE && fix_len;
        prop_assert_eq!(Request::parse(&msg).is_err(), !old_init);
    }

    /// Listings never exceed the asked size and keep every entry 8-byte aligned.
    #[test]
    fn listings_respect_size_and_alignment(
        limit in 0u32..2048,
        names in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..40),
    ) {
        let mut d = Dirents::new(limit);
        let mut p = DirentsPlus::new(limit);
        for (i, name) in names.iter().enumerate() {
            let _ = d.push(i as u64, i as u64 + 1, 8, name);
            let _ = p.push(&EntryOut::default(), i as u64, i as u64 + 1, 8, name);
            prop_assert!(d.len() <= limit as usize && d.len() % 8 == 0);
            prop_assert!(p.len() <= limit as usize && p.len() % 8 == 0);
        }
    }
}
