//! Arbitrary bytes as a request read from /dev/fuse: decoded with and without
//! FUSE_SETXATTR_EXT, and everything a decoded request lends out walked.
#![no_main]

use cilfs_fuse_proto::{Extension, InHeader, Negotiated, Op, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = InHeader::parse(data);
    let compat = Negotiated {
        minor: 45,
        flags: 0,
    };
    for session in [Negotiated::LATEST, compat] {
        let Ok(req) = Request::parse_with(data, &session) else {
            continue;
        };
        for ext in req.extensions.iter() {
            if let Extension::SuppGroups(groups) = ext {
                assert_eq!(groups.iter().count(), groups.len());
            }
        }
        if let Op::BatchForget(list) = &req.op {
            assert_eq!(list.iter().count(), list.len());
        }
        let _ = req.op.opcode();
    }
});
