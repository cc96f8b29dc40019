//! Every opcode: encoded as the kernel sends it, parsed back to the same arguments.

mod common;

use std::collections::HashSet;
use std::ffi::OsStr;

use cilfs_fuse_proto::flags;
use cilfs_fuse_proto::*;
use common::{pattern, KernelMsg};

/// A structure whose every field differs from its neighbours (decoded from a pattern).
macro_rules! filled {
    ($t:ty, $seed:expr) => {
        <$t>::decode(&pattern(<$t>::SIZE, $seed)).unwrap()
    };
}

fn enc<F: FnOnce(&mut Vec<u8>)>(f: F) -> Vec<u8> {
    let mut v = Vec::new();
    f(&mut v);
    v
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// (message, what it must parse to) for every opcode the crate decodes.
fn cases() -> Vec<(KernelMsg, Op<'static>)> {
    use Opcode as O;
    let mut c: Vec<(KernelMsg, Op<'static>)> = Vec::new();
    let m = KernelMsg::new;

    c.push((
        m(O::Lookup).name("file.txt"),
        Op::Lookup {
            name: os("file.txt"),
        },
    ));
    let a = filled!(ForgetIn, 1);
    c.push((m(O::Forget).bytes(&enc(|v| a.encode(v))), Op::Forget(a)));
    let a = GetattrIn {
        getattr_flags: flags::getattr::FH,
        ..filled!(GetattrIn, 2)
    };
    c.push((m(O::Getattr).bytes(&enc(|v| a.encode(v))), Op::Getattr(a)));
    let a = SetattrIn {
        valid: flags::fattr::MODE | flags::fattr::KILL_SUIDGID,
        ..filled!(SetattrIn, 3)
    };
    c.push((m(O::Setattr).bytes(&enc(|v| a.encode(v))), Op::Setattr(a)));
    c.push((m(O::Readlink), Op::Readlink));
    c.push((
        m(O::Symlink).name("link").name("../some/target"),
        Op::Symlink {
            name: os("link"),
            target: os("../some/target"),
        },
    ));
    let a = filled!(MknodIn, 4);
    c.push((
        m(O::Mknod).bytes(&enc(|v| a.encode(v))).name("fifo"),
        Op::Mknod {
            arg: a,
            name: os("fifo"),
        },
    ));
    let a = filled!(MkdirIn, 5);
    c.push((
        m(O::Mkdir).bytes(&enc(|v| a.encode(v))).name("dir"),
        Op::Mkdir {
            arg: a,
            name: os("dir"),
        },
    ));
    c.push((m(O::Unlink).name("gone"), Op::Unlink { name: os("gone") }));
    c.push((m(O::Rmdir).name("d"), Op::Rmdir { name: os("d") }));
    let a = filled!(RenameIn, 6);
    c.push((
        m(O::Rename)
            .bytes(&enc(|v| a.encode(v)))
            .name("old")
            .name("new"),
        Op::Rename {
            arg: a,
            name: os("old"),
            newname: os("new"),
        },
    ));
    let a = filled!(LinkIn, 7);
    c.push((
        m(O::Link).bytes(&enc(|v| a.encode(v))).name("hard"),
        Op::Link {
            arg: a,
            newname: os("hard"),
        },
    ));
    let a = OpenIn {
        flags: 0o1002, // O_RDWR | O_TRUNC
        open_flags: flags::open_in::KILL_SUIDGID,
    };
    c.push((m(O::Open).bytes(&enc(|v| a.encode(v))), Op::Open(a)));
    let a = filled!(ReadIn, 8);
    c.push((m(O::Read).bytes(&enc(|v| a.encode(v))), Op::Read(a)));
    let a = WriteIn {
        size: 11,
        write_flags: flags::write::KILL_SUIDGID,
        ..filled!(WriteIn, 9)
    };
    c.push((
        m(O::Write)
            .bytes(&enc(|v| a.encode(v)))
            .bytes(b"hello world"),
        Op::Write {
            arg: a,
            data: b"hello world",
        },
    ));
    c.push((m(O::Statfs), Op::Statfs));
    let a = filled!(ReleaseIn, 10);
    c.push((m(O::Release).bytes(&enc(|v| a.encode(v))), Op::Release(a)));
    let a = filled!(FsyncIn, 11);
    c.push((m(O::Fsync).bytes(&enc(|v| a.encode(v))), Op::Fsync(a)));
    let a = SetxattrIn {
        size: 3,
        flags: 1,
        setxattr_flags: flags::setxattr::ACL_KILL_SGID,
        padding: 0,
    };
    c.push((
        m(O::Setxattr)
            .bytes(&enc(|v| a.encode(v)))
            .name("user.k")
            .bytes(b"v\0w"),
        Op::Setxattr {
            arg: a,
            name: os("user.k"),
            value: b"v\0w",
        },
    ));
    let a = filled!(GetxattrIn, 12);
    c.push((
        m(O::Getxattr)
            .bytes(&enc(|v| a.encode(v)))
            .name("security.capability"),
        Op::Getxattr {
            arg: a,
            name: os("security.capability"),
        },
    ));
    let a = filled!(GetxattrIn, 13);
    c.push((
        m(O::Listxattr).bytes(&enc(|v| a.encode(v))),
        Op::Listxattr(a),
    ));
    c.push((
        m(O::Removexattr).name("user.k"),
        Op::Removexattr { name: os("user.k") },
    ));
    let a = filled!(FlushIn, 14);
    c.push((m(O::Flush).bytes(&enc(|v| a.encode(v))), Op::Flush(a)));
    let a = InitIn {
        major: 7,
        minor: 45,
        max_readahead: 131072,
        flags: flags::init::INIT_EXT as u32 | flags::init::ASYNC_READ as u32,
        flags2: (flags::init::OVER_IO_URING >> 32) as u32,
        unused: [0; 11],
    };
    c.push((m(O::Init).bytes(&enc(|v| a.encode(v))), Op::Init(a)));
    let a = filled!(OpenIn, 15);
    c.push((m(O::Opendir).bytes(&enc(|v| a.encode(v))), Op::Opendir(a)));
    let a = filled!(ReadIn, 16);
    c.push((m(O::Readdir).bytes(&enc(|v| a.encode(v))), Op::Readdir(a)));
    let a = filled!(ReleaseIn, 17);
    c.push((
        m(O::Releasedir).bytes(&enc(|v| a.encode(v))),
        Op::Releasedir(a),
    ));
    let a = filled!(FsyncIn, 18);
    c.push((m(O::Fsyncdir).bytes(&enc(|v| a.encode(v))), Op::Fsyncdir(a)));
    let a = filled!(LkIn, 19);
    c.push((m(O::Getlk).bytes(&enc(|v| a.encode(v))), Op::Getlk(a)));
    let a = filled!(LkIn, 20);
    c.push((m(O::Setlk).bytes(&enc(|v| a.encode(v))), Op::Setlk(a)));
    let a = filled!(LkIn, 21);
    c.push((m(O::Setlkw).bytes(&enc(|v| a.encode(v))), Op::Setlkw(a)));
    let a = filled!(AccessIn, 22);
    c.push((m(O::Access).bytes(&enc(|v| a.encode(v))), Op::Access(a)));
    let a = CreateIn {
        open_flags: flags::open_in::KILL_SUIDGID,
        ..filled!(CreateIn, 23)
    };
    c.push((
        m(O::Create).bytes(&enc(|v| a.encode(v))).name("new.txt"),
        Op::Create {
            arg: a,
            name: os("new.txt"),
        },
    ));
    let a = filled!(InterruptIn, 24);
    c.push((
        m(O::Interrupt).bytes(&enc(|v| a.encode(v))),
        Op::Interrupt(a),
    ));
    let a = filled!(BmapIn, 25);
    c.push((m(O::Bmap).bytes(&enc(|v| a.encode(v))), Op::Bmap(a)));
    c.push((m(O::Destroy), Op::Destroy));
    let a = IoctlIn {
        in_size: 4,
        ..filled!(IoctlIn, 26)
    };
    c.push((
        m(O::Ioctl)
            .bytes(&enc(|v| a.encode(v)))
            .bytes(b"\x01\x02\x03\x04"),
        Op::Ioctl {
            arg: a,
            data: b"\x01\x02\x03\x04",
        },
    ));
    let a = filled!(PollIn, 27);
    c.push((m(O::Poll).bytes(&enc(|v| a.encode(v))), Op::Poll(a)));
    let a = NotifyRetrieveIn {
        size: 2,
        ..filled!(NotifyRetrieveIn, 28)
    };
    c.push((
        m(O::NotifyReply).bytes(&enc(|v| a.encode(v))).bytes(b"pg"),
        Op::NotifyReply {
            arg: a,
            data: b"pg",
        },
    ));
    // BATCH_FORGET: checked separately below (its list borrows the message).
    let a = filled!(FallocateIn, 29);
    c.push((
        m(O::Fallocate).bytes(&enc(|v| a.encode(v))),
        Op::Fallocate(a),
    ));
    let a = filled!(ReadIn, 30);
    c.push((
        m(O::Readdirplus).bytes(&enc(|v| a.encode(v))),
        Op::Readdirplus(a),
    ));
    let a = filled!(Rename2In, 31);
    c.push((
        m(O::Rename2)
            .bytes(&enc(|v| a.encode(v)))
            .name("a")
            .name("b"),
        Op::Rename2 {
            arg: a,
            name: os("a"),
            newname: os("b"),
        },
    ));
    let a = filled!(LseekIn, 32);
    c.push((m(O::Lseek).bytes(&enc(|v| a.encode(v))), Op::Lseek(a)));
    let a = filled!(CopyFileRangeIn, 33);
    c.push((
        m(O::CopyFileRange).bytes(&enc(|v| a.encode(v))),
        Op::CopyFileRange(a),
    ));
    let a = SyncfsIn { padding: 0 };
    c.push((m(O::Syncfs).bytes(&enc(|v| a.encode(v))), Op::Syncfs(a)));
    let a = filled!(CreateIn, 34);
    c.push((
        m(O::Tmpfile).bytes(&enc(|v| a.encode(v))).name("/"),
        Op::Tmpfile {
            arg: a,
            name: os("/"),
        },
    ));
    let a = filled!(StatxIn, 35);
    c.push((m(O::Statx).bytes(&enc(|v| a.encode(v))), Op::Statx(a)));
    let a = filled!(CopyFileRangeIn, 36);
    c.push((
        m(O::CopyFileRange64).bytes(&enc(|v| a.encode(v))),
        Op::CopyFileRange64(a),
    ));
    for (op, body) in [
        (O::SetupMapping, pattern(40, 37)),
        (O::RemoveMapping, pattern(20, 38)),
        (O::CuseInit, pattern(16, 39)),
    ] {
        let body: &'static [u8] = body.leak();
        c.push((m(op).bytes(body), Op::Unsupported { opcode: op, body }));
    }
    c
}

#[test]
fn every_opcode_round_trips() {
    let mut seen = HashSet::new();
    for (msg, want) in cases() {
        let bytes = msg.encode();
        let req = Request::parse(&bytes).unwrap_or_else(|e| panic!("{want:?}: {e}"));
        assert_eq!(req.op, want);
        assert_eq!(req.header.len as usize, bytes.len());
        assert_eq!(req.header.opcode, msg.opcode);
        assert_eq!(req.header.unique, msg.unique);
        assert_eq!(req.header.nodeid, msg.nodeid);
        assert_eq!(
            (req.header.uid, req.header.gid, req.header.pid),
            (msg.uid, msg.gid, msg.pid)
        );
        assert!(req.extensions.is_empty());
        let opcode = req.op.opcode().unwrap();
        assert_eq!(opcode as u32, msg.opcode);
        seen.insert(opcode);
    }
    seen.insert(Opcode::BatchForget); // batch_forget_lists_every_entry
    let missing: Vec<_> = Opcode::ALL.iter().filter(|o| !seen.contains(o)).collect();
    assert!(
        missing.is_empty(),
        "opcodes without a round trip: {missing:?}"
    );
}

/// Over FUSE-over-io_uring the kernel splits a request between the entry's header (in
/// header, first argument) and its payload; assembled again it parses as from /dev/fuse,
/// wherever the first argument ends (each opcode's `in_args[0]` has its own size, zero for
/// those that start with a name).
#[test]
fn every_opcode_round_trips_over_the_ring_at_every_split() {
    for (msg, want) in cases() {
        let whole = msg.encode();
        for arg0 in 0..=msg.args.len().min(uring::URING_OP_IN_OUT_SZ) {
            let (header, mut buf) = msg.ring(arg0, whole.len());
            let r = uring::assemble(&header, &mut buf)
                .unwrap_or_else(|e| panic!("{want:?} split at {arg0}: {e}"));
            assert_eq!(r.commit_id, msg.unique);
            assert_eq!(&buf[r.msg.clone()], &whole[..], "{want:?} split at {arg0}");
            let req = Request::parse(&buf[r.msg.clone()]).unwrap();
            assert_eq!(req.op, want);
        }
    }
}

#[test]
fn batch_forget_lists_every_entry() {
    let entries = [(5u64, 1u64), (9, 3), (u64::MAX, u64::MAX)];
    let mut args = enc(|v| BatchForgetIn { count: 3, dummy: 0 }.encode(v));
    for (nodeid, nlookup) in entries {
        ForgetOne { nodeid, nlookup }.encode(&mut args);
    }
    let bytes = KernelMsg::new(Opcode::BatchForget).bytes(&args).encode();
    let req = Request::parse(&bytes).unwrap();
    let Op::BatchForget(list) = req.op else {
        panic!("not a batch forget: {:?}", req.op)
    };
    assert_eq!(list.len(), 3);
    let got: Vec<_> = list.iter().map(|f| (f.nodeid, f.nlookup)).collect();
    assert_eq!(got, entries);
    assert!(!req.op.expects_reply());
}

#[test]
fn unknown_opcodes_are_values_not_errors() {
    for opcode in [0u32, 7, 54, 999, 4095, 4097, u32::MAX] {
        let bytes = KernelMsg::raw(opcode).bytes(b"whatever").encode();
        let req = Request::parse(&bytes).unwrap();
        assert_eq!(
            req.op,
            Op::Unknown {
                opcode,
                body: b"whatever"
            }
        );
        assert_eq!(req.op.opcode(), None);
        assert!(req.op.expects_reply());
    }
}

#[test]
fn setxattr_without_the_extension_reads_the_8_byte_header() {
    let session = Negotiated {
        minor: 45,
        flags: 0,
    };
    let mut args = Vec::new();
    args.extend_from_slice(&3u32.to_le_bytes()); // size
    args.extend_from_slice(&2u32.to_le_bytes()); // flags: XATTR_REPLACE
    let bytes = KernelMsg::new(Opcode::Setxattr)
        .bytes(&args)
        .name("user.a")
        .bytes(b"xyz")
        .encode();
    let req = Request::parse_with(&bytes, &session).unwrap();
    assert_eq!(
        req.op,
        Op::Setxattr {
            arg: SetxattrIn {
                size: 3,
                flags: 2,
                setxattr_flags: 0,
                padding: 0
            },
            name: os("user.a"),
            value: b"xyz",
        }
    );
    // The same bytes in a session with the extension do not parse as a valid SETXATTR.
    assert!(Request::parse(&bytes).is_err());
}

#[test]
fn init_from_kernels_before_7_36_is_16_bytes() {
    let mut args = Vec::new();
    for v in [7u32, 31, 65536, 0x1234] {
        args.extend_from_slice(&v.to_le_bytes());
    }
    let bytes = KernelMsg::new(Opcode::Init).bytes(&args).encode();
    let Op::Init(init) = Request::parse(&bytes).unwrap().op else {
        panic!("not init")
    };
    assert_eq!((init.major, init.minor, init.max_readahead), (7, 31, 65536));
    assert_eq!(init.flags, 0x1234);
    assert_eq!(init.flags2, 0);
}

#[test]
fn kill_suidgid_flags_read_as_the_kernel_sets_them() {
    let cases = cases();
    let find = |opcode: Opcode| {
        cases
            .iter()
            .find(|(m, _)| m.opcode == opcode as u32)
            .map(|(_, op)| op.clone())
            .unwrap()
    };
    let Op::Write { arg, .. } = find(Opcode::Write) else {
        panic!()
    };
    assert!(arg.kill_suidgid());
    let Op::Setattr(arg) = find(Opcode::Setattr) else {
        panic!()
    };
    assert!(arg.kill_suidgid());
    let Op::Open(arg) = find(Opcode::Open) else {
        panic!()
    };
    assert!(arg.kill_suidgid());
    let Op::Create { arg, .. } = find(Opcode::Create) else {
        panic!()
    };
    assert!(arg.kill_suidgid());
    let Op::Setxattr { arg, .. } = find(Opcode::Setxattr) else {
        panic!()
    };
    assert!(arg.acl_kill_sgid());
    assert!(!WriteIn::default().kill_suidgid());
    assert!(!SetattrIn::default().kill_suidgid());
    assert_eq!(GetattrIn::default().fh(), None);
    let Op::Getattr(arg) = find(Opcode::Getattr) else {
        panic!()
    };
    assert_eq!(arg.fh(), Some(arg.fh));
}

#[test]
fn extensions_of_a_create_are_split_off_and_decoded() {
    // fuse_ext_header { size 24, type EXT_GROUPS }, nr_groups 2, groups 100 and 4242, pad 4.
    let mut ext = Vec::new();
    ext.extend_from_slice(&24u32.to_le_bytes());
    ext.extend_from_slice(&EXT_GROUPS.to_le_bytes());
    ext.extend_from_slice(&2u32.to_le_bytes());
    ext.extend_from_slice(&100u32.to_le_bytes());
    ext.extend_from_slice(&4242u32.to_le_bytes());
    ext.extend_from_slice(&[0; 4]);
    // A security context header for one context, 16 bytes in all.
    ext.extend_from_slice(&16u32.to_le_bytes());
    ext.extend_from_slice(&1u32.to_le_bytes());
    ext.extend_from_slice(b"ctx\0\0\0\0\0");
    let a = filled!(CreateIn, 40);
    let bytes = KernelMsg::new(Opcode::Create)
        .bytes(&enc(|v| a.encode(v)))
        .name("f")
        .ext(&ext)
        .encode();
    let req = Request::parse(&bytes).unwrap();
    assert_eq!(req.header.total_extlen, 5);
    assert_eq!(
        req.op,
        Op::Create {
            arg: a,
            name: os("f")
        }
    );
    let groups: Vec<u32> = req.extensions.supp_groups().unwrap().iter().collect();
    assert_eq!(groups, [100, 4242]);
    let all: Vec<_> = req.extensions.iter().collect();
    assert_eq!(all.len(), 2);
    assert_eq!(
        all[1],
        Extension::SecurityContexts {
            count: 1,
            bytes: b"ctx\0\0\0\0\0"
        }
    );
}

#[test]
fn resend_bit_is_reported() {
    let mut msg = KernelMsg::new(Opcode::Statfs);
    msg.unique = UNIQUE_RESEND | 8;
    let bytes = msg.encode();
    assert!(Request::parse(&bytes).unwrap().header.is_resend());
    msg.unique = 8;
    assert!(!Request::parse(&msg.encode()).unwrap().header.is_resend());
}
