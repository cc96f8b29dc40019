//! Answering FUSE_INIT.

use cilfs_fuse_proto::flags::init as f;
use cilfs_fuse_proto::*;

fn config(flags: u64) -> InitConfig {
    InitConfig {
        flags,
        max_readahead: 1 << 20,
        max_write: 1 << 20,
        max_pages: 256,
        max_background: 64,
        congestion_threshold: 48,
        time_gran: 1,
        request_timeout: 0,
    }
}

fn kernel(major: u32, minor: u32, offered: u64) -> InitIn {
    InitIn {
        major,
        minor,
        max_readahead: 128 * 1024,
        flags: offered as u32,
        flags2: (offered >> 32) as u32,
        unused: [0; 11],
    }
}

#[test]
fn accepted_flags_are_those_wanted_and_offered() {
    let offered = f::INIT_EXT
        | f::EXPORT_SUPPORT
        | f::HANDLE_KILLPRIV_V2
        | f::SETXATTR_EXT
        | f::MAX_PAGES
        | f::HAS_RESEND;
    let wanted = f::EXPORT_SUPPORT
        | f::HANDLE_KILLPRIV_V2
        | f::SETXATTR_EXT
        | f::MAX_PAGES
        | f::OVER_IO_URING // not offered: io_uring off in the kernel
        | f::HAS_RESEND;
    let InitReply::Accept { out, session } =
        negotiate(&kernel(7, 45, offered), &config(wanted)).unwrap()
    else {
        panic!("not accepted")
    };
    let agreed =
        f::EXPORT_SUPPORT | f::HANDLE_KILLPRIV_V2 | f::SETXATTR_EXT | f::MAX_PAGES | f::HAS_RESEND;
    assert_eq!(session.flags, agreed);
    assert!(session.setxattr_ext());
    // HAS_RESEND is bit 39: it travels in flags2, with INIT_EXT set in flags.
    assert_eq!(out.flags(), agreed | f::INIT_EXT);
    assert_eq!(out.flags2, 1 << 7);
    assert_eq!((out.major, out.minor), (7, 45));
    assert_eq!(session.minor, 45);
    assert_eq!(out.max_readahead, 128 * 1024, "the smaller readahead");
    assert_eq!(
        (out.max_write, out.max_pages, out.time_gran),
        (1 << 20, 256, 1)
    );
}

#[test]
fn the_smaller_minor_version_is_used() {
    let InitReply::Accept { out, session } =
        negotiate(&kernel(7, 31, f::SETXATTR_EXT), &config(f::SETXATTR_EXT)).unwrap()
    else {
        panic!()
    };
    assert_eq!((out.minor, session.minor), (31, 31));
    // Without INIT_EXT from the kernel, high bits are not offered at all.
    let InitReply::Accept { session, .. } =
        negotiate(&kernel(7, 45, f::HAS_RESEND), &config(f::HAS_RESEND)).unwrap()
    else {
        panic!()
    };
    assert_eq!(session.flags, 0);
    // A kernel newer than this crate gets our minor.
    let InitReply::Accept { out, .. } = negotiate(&kernel(7, 99, 0), &config(0)).unwrap() else {
        panic!()
    };
    assert_eq!(out.minor, KERNEL_MINOR_VERSION);
}

#[test]
fn versions_outside_the_supported_range() {
    // A newer major: offer ours and nothing else.
    let reply = negotiate(&kernel(8, 0, u32::MAX.into()), &config(u64::MAX)).unwrap();
    assert_eq!(
        reply,
        InitReply::OfferMajor(InitOut {
            major: 7,
            minor: KERNEL_MINOR_VERSION,
            ..InitOut::default()
        })
    );
    for (major, minor) in [(6, 99), (7, 22), (0, 0)] {
        assert_eq!(
            negotiate(&kernel(major, minor, 0), &config(0)).unwrap_err(),
            ProtoError::UnsupportedVersion {
                major,
                minor,
                min_minor: MIN_MINOR_VERSION
            }
        );
    }
}

#[test]
fn set_flags_keeps_flags2_only_with_init_ext() {
    let mut out = InitOut::default();
    out.set_flags(f::ASYNC_READ);
    assert_eq!((out.flags, out.flags2), (1, 0));
    out.set_flags(f::NO_EXPORT_SUPPORT);
    assert_eq!(out.flags as u64, f::INIT_EXT);
    assert_eq!(out.flags(), f::NO_EXPORT_SUPPORT | f::INIT_EXT);
    // flags2 without INIT_EXT is ignored, as by the kernel.
    let k = InitIn {
        flags: 0,
        flags2: 1,
        ..InitIn::default()
    };
    assert_eq!(k.flags(), 0);
}
