//! Requests as Linux sends them once cilfs takes FUSE_ALLOW_IDMAP: FUSE_INVALID_UIDGID in
//! every header but the creating requests', whose ids are the mapped caller's. The
//! capabilities of the callers' processes come from a table instead of /proc.

use super::{header, request, sim};
use crate::native::dispatch::{Answer, Dispatcher};
use crate::native::ioctl::{FITRIM, FS_IOC_SETFLAGS, FS_IOC_SETFSLABEL};
use cilfs_core::fs::types::Capability;
use cilfs_core::fs::{Fs, FsOptions};
use cilfs_fuse_proto::flags::{fattr, write as write_flags};
use cilfs_fuse_proto::{
    CreateIn, InHeader, IoctlIn, IoctlOut, Op, Opcode, SetattrIn, WriteIn, INVALID_UIDGID, ROOT_ID,
};
use std::ffi::OsStr;
use std::sync::Arc;

/// Process 100 holds every capability, 200 none, and 300 is gone (nothing can be read).
const ADMIN: u32 = 100;
const NOBODY: u32 = 200;
const GONE: u32 = 300;

fn dispatcher() -> (Dispatcher, Arc<Fs>) {
    let opts = FsOptions {
        capable: Some(Arc::new(|pid, _: Capability| match pid {
            ADMIN => Some(true),
            NOBODY => Some(false),
            _ => None,
        })),
        groups_of: Some(Arc::new(|_| Vec::new())),
        ..FsOptions::default()
    };
    let fs = sim::mount_with(sim::new_dev(), opts);
    (Dispatcher::new(Arc::clone(&fs), false), fs)
}

/// A header of a request that names no caller, from process `pid`.
fn unnamed(op: Opcode, unique: u64, nodeid: u64, pid: u32) -> InHeader {
    InHeader {
        uid: INVALID_UIDGID,
        gid: INVALID_UIDGID,
        pid,
        ..header(op, unique, nodeid)
    }
}

/// The errno of a reply (0 for success).
fn errno_of(a: Answer) -> i32 {
    match a {
        Answer::Reply(r) => i32::from_le_bytes(r.as_bytes()[4..8].try_into().unwrap()),
        Answer::Data { .. } => 0,
        Answer::Nothing => panic!("no answer"),
    }
}

/// CREATE of `name` in the root with mode `mode`, by the ids in `h`: the new inode.
fn create(d: &Dispatcher, h: InHeader, name: &str, mode: u32) -> Result<u64, i32> {
    let arg = CreateIn {
        flags: libc::O_WRONLY as u32,
        mode: libc::S_IFREG | mode,
        umask: 0,
        open_flags: 0,
    };
    let name = OsStr::new(name);
    match d.answer(&request(h, Op::Create { arg, name })) {
        Answer::Reply(r) => {
            let b = r.as_bytes();
            match i32::from_le_bytes(b[4..8].try_into().unwrap()) {
                0 => Ok(u64::from_le_bytes(b[16..24].try_into().unwrap())),
                e => Err(e),
            }
        }
        other => panic!("create: {other:?}"),
    }
}

fn setattr(d: &Dispatcher, h: InHeader, s: SetattrIn) -> i32 {
    errno_of(d.answer(&request(h, Op::Setattr(s))))
}

/// A creating request carries the mapped caller's ids, and the new inode is theirs; one
/// that carried none would have no owner to give it (EOVERFLOW, as Linux answers a caller
/// with no mapping). Any other request by an unnamed caller is one the kernel checked: a
/// chown goes through.
#[test]
fn creates_take_the_ids_sent_and_an_unnamed_caller_chowns() {
    let (d, fs) = dispatcher();
    let h = InHeader {
        uid: 1000,
        gid: 1001,
        pid: NOBODY,
        ..header(Opcode::Create, 1, ROOT_ID)
    };
    let ino = create(&d, h, "mine", 0o644).unwrap();
    let a = fs.getattr(ino).unwrap();
    assert_eq!((a.uid, a.gid), (1000, 1001));
    assert_eq!(
        create(
            &d,
            unnamed(Opcode::Create, 2, ROOT_ID, NOBODY),
            "nobodys",
            0o644
        ),
        Err(-libc::EOVERFLOW)
    );
    assert!(fs.lookup(ROOT_ID, b"nobodys").is_err());
    let chown = SetattrIn {
        valid: fattr::UID | fattr::GID | fattr::KILL_SUIDGID,
        uid: 2000,
        gid: 2001,
        ..SetattrIn::default()
    };
    assert_eq!(
        setattr(&d, unnamed(Opcode::Setattr, 3, ino, NOBODY), chown),
        0
    );
    let a = fs.getattr(ino).unwrap();
    assert_eq!((a.uid, a.gid), (2000, 2001));
}

/// A chown clears set-user-ID whoever calls, and set-group-ID (without group execute) only
/// for a caller outside the file's group and without CAP_FSETID: an unnamed caller is judged
/// by its process's capability, not taken for a user because the header names none.
#[test]
fn a_chown_keeps_set_group_id_for_an_unnamed_caller_holding_cap_fsetid() {
    let (d, fs) = dispatcher();
    let h = InHeader {
        uid: 1000,
        gid: 1000,
        ..header(Opcode::Create, 1, ROOT_ID)
    };
    for (i, (pid, left)) in [(ADMIN, 0o2644), (NOBODY, 0o644), (GONE, 0o644)]
        .into_iter()
        .enumerate()
    {
        let u = 10 * i as u64;
        let ino = create(&d, InHeader { unique: u + 1, ..h }, &format!("f{i}"), 0o644).unwrap();
        let mode = SetattrIn {
            valid: fattr::MODE,
            mode: 0o6644,
            ..SetattrIn::default()
        };
        assert_eq!(
            setattr(&d, unnamed(Opcode::Setattr, u + 2, ino, pid), mode),
            0
        );
        let chown = SetattrIn {
            valid: fattr::UID | fattr::KILL_SUIDGID,
            uid: 2000,
            ..SetattrIn::default()
        };
        assert_eq!(
            setattr(&d, unnamed(Opcode::Setattr, u + 3, ino, pid), chown),
            0
        );
        assert_eq!(
            u32::from(fs.getattr(ino).unwrap().perm),
            left,
            "process {pid}"
        );
    }
}

/// A write by an unnamed caller clears set-user-ID and set-group-ID when the kernel says so
/// (FUSE_WRITE_KILL_SUIDGID: the writer lacks CAP_FSETID) and keeps them when it does not;
/// likewise a truncate with and without FATTR_KILL_SUIDGID.
#[test]
fn set_id_goes_as_the_kernel_says_for_writes_and_truncates_by_unnamed_callers() {
    let (d, fs) = dispatcher();
    let h = InHeader {
        uid: 1000,
        gid: 1000,
        ..header(Opcode::Create, 1, ROOT_ID)
    };
    let ino = create(&d, h, "setid", 0o755).unwrap();
    let chmod = |unique| {
        let s = SetattrIn {
            valid: fattr::MODE,
            mode: 0o6755,
            ..SetattrIn::default()
        };
        assert_eq!(
            setattr(&d, unnamed(Opcode::Setattr, unique, ino, NOBODY), s),
            0
        );
        assert_eq!(fs.getattr(ino).unwrap().perm, 0o6755);
    };
    let perm = || u32::from(fs.getattr(ino).unwrap().perm);
    let write = |unique, kill: bool| {
        let data = b"x";
        let arg = WriteIn {
            size: 1,
            write_flags: if kill { write_flags::KILL_SUIDGID } else { 0 },
            ..WriteIn::default()
        };
        let h = unnamed(Opcode::Write, unique, ino, NOBODY);
        assert!(matches!(
            d.answer(&request(h, Op::Write { arg, data })),
            Answer::Reply(_)
        ));
    };
    chmod(2);
    write(3, false);
    assert_eq!(
        perm(),
        0o6755,
        "a write the kernel did not flag cleared set-ID"
    );
    write(4, true);
    assert_eq!(perm(), 0o755, "a flagged write kept set-ID");
    chmod(5);
    let truncate = |kill: bool| SetattrIn {
        valid: fattr::SIZE | if kill { fattr::KILL_SUIDGID } else { 0 },
        size: 0,
        ..SetattrIn::default()
    };
    assert_eq!(
        setattr(
            &d,
            unnamed(Opcode::Setattr, 6, ino, NOBODY),
            truncate(false)
        ),
        0
    );
    assert_eq!(
        perm(),
        0o6755,
        "a truncate the kernel did not flag cleared set-ID"
    );
    assert_eq!(
        setattr(&d, unnamed(Opcode::Setattr, 7, ino, NOBODY), truncate(true)),
        0
    );
    assert_eq!(perm(), 0o755, "a flagged truncate kept set-ID");
}

/// The ioctls the kernel passes through unchecked, by unnamed callers: chattr +i needs
/// CAP_LINUX_IMMUTABLE in the process's effective set, the label and FITRIM CAP_SYS_ADMIN;
/// a process whose capabilities cannot be read is refused.
#[test]
fn unchecked_ioctls_by_unnamed_callers_go_by_their_process_capabilities() {
    let (d, fs) = dispatcher();
    let h = InHeader {
        uid: 1000,
        gid: 1000,
        ..header(Opcode::Create, 1, ROOT_ID)
    };
    let ino = create(&d, h, "flags", 0o644).unwrap();
    let ioctl = |unique: u64, pid: u32, nodeid: u64, cmd: u32, data: &[u8], out_size: u32| {
        let arg = IoctlIn {
            cmd,
            in_size: data.len() as u32,
            out_size,
            ..IoctlIn::default()
        };
        let h = unnamed(Opcode::Ioctl, unique, nodeid, pid);
        match d.answer(&request(h, Op::Ioctl { arg, data })) {
            Answer::Data { data, .. } => Ok(data[IoctlOut::SIZE..].to_vec()),
            other => Err(errno_of(other)),
        }
    };
    let immutable = 0x10u32.to_ne_bytes();
    for pid in [NOBODY, GONE] {
        assert_eq!(
            ioctl(2, pid, ino, FS_IOC_SETFLAGS, &immutable, 0),
            Err(-libc::EPERM),
            "process {pid}"
        );
    }
    assert_eq!(
        ioctl(3, ADMIN, ino, FS_IOC_SETFLAGS, &immutable, 0),
        Ok(vec![])
    );
    let unlink = d.answer(&request(
        unnamed(Opcode::Unlink, 4, ROOT_ID, ADMIN),
        Op::Unlink {
            name: OsStr::new("flags"),
        },
    ));
    assert_eq!(errno_of(unlink), -libc::EPERM, "the immutable file went");
    // The owner's other flags need no capability (the kernel checked ownership).
    assert_eq!(
        ioctl(
            5,
            NOBODY,
            ino,
            FS_IOC_SETFLAGS,
            &(0x10u32 | 0x80).to_ne_bytes(),
            0
        ),
        Ok(vec![])
    );
    let mut label = [0u8; 256];
    label[..4].copy_from_slice(b"mapd");
    assert_eq!(
        ioctl(6, NOBODY, ROOT_ID, FS_IOC_SETFSLABEL, &label, 0),
        Err(-libc::EPERM)
    );
    assert_eq!(
        ioctl(7, ADMIN, ROOT_ID, FS_IOC_SETFSLABEL, &label, 0),
        Ok(vec![])
    );
    assert_eq!(fs.label(), b"mapd");
    let range: Vec<u8> = [0u64, u64::MAX, 0]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    assert_eq!(
        ioctl(8, NOBODY, ROOT_ID, FITRIM, &range, 24),
        Err(-libc::EPERM)
    );
    assert!(ioctl(9, ADMIN, ROOT_ID, FITRIM, &range, 24).is_ok());
}
