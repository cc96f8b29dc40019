//! Byte layouts checked against `<linux/fuse.h>` by hand: sizes, field offsets, and one
//! request captured from Linux 6.18.

mod common;

use std::ffi::OsStr;

use cilfs_fuse_proto::uring::{UringCmdReq, UringEntInOut, UringReqHeader};
use cilfs_fuse_proto::*;
use common::{le_u16, le_u32, le_u64};

/// Writes `v`'s little-endian bytes at `off` of a hand-built message.
fn put(buf: &mut [u8], off: usize, v: &[u8]) {
    buf[off..off + v.len()].copy_from_slice(v);
}

#[test]
fn structure_sizes_match_the_header() {
    // Each size summed from the header's field list.
    let sizes = [
        ("fuse_in_header", InHeader::SIZE, 40),
        ("fuse_out_header", OutHeader::SIZE, 16),
        ("fuse_attr", Attr::SIZE, 88),
        ("fuse_entry_out", EntryOut::SIZE, 128),
        ("fuse_attr_out", AttrOut::SIZE, 104),
        ("fuse_kstatfs", Kstatfs::SIZE, 80),
        ("fuse_file_lock", FileLock::SIZE, 24),
        ("fuse_forget_in", ForgetIn::SIZE, 8),
        ("fuse_forget_one", ForgetOne::SIZE, 16),
        ("fuse_batch_forget_in", BatchForgetIn::SIZE, 8),
        ("fuse_getattr_in", GetattrIn::SIZE, 16),
        ("fuse_sx_time", SxTime::SIZE, 16),
        ("fuse_statx", Statx::SIZE, 256),
        ("fuse_statx_in", StatxIn::SIZE, 24),
        ("fuse_statx_out", StatxOut::SIZE, 288),
        ("fuse_mknod_in", MknodIn::SIZE, 16),
        ("fuse_mkdir_in", MkdirIn::SIZE, 8),
        ("fuse_rename_in", RenameIn::SIZE, 8),
        ("fuse_rename2_in", Rename2In::SIZE, 16),
        ("fuse_link_in", LinkIn::SIZE, 8),
        ("fuse_setattr_in", SetattrIn::SIZE, 88),
        ("fuse_open_in", OpenIn::SIZE, 8),
        ("fuse_create_in", CreateIn::SIZE, 16),
        ("fuse_open_out", OpenOut::SIZE, 16),
        ("fuse_release_in", ReleaseIn::SIZE, 24),
        ("fuse_flush_in", FlushIn::SIZE, 24),
        ("fuse_read_in", ReadIn::SIZE, 40),
        ("fuse_write_in", WriteIn::SIZE, 40),
        ("fuse_write_out", WriteOut::SIZE, 8),
        ("fuse_fsync_in", FsyncIn::SIZE, 16),
        ("fuse_setxattr_in", SetxattrIn::SIZE, 16),
        ("fuse_getxattr_in", GetxattrIn::SIZE, 8),
        ("fuse_getxattr_out", GetxattrOut::SIZE, 8),
        ("fuse_lk_in", LkIn::SIZE, 48),
        ("fuse_lk_out", LkOut::SIZE, 24),
        ("fuse_access_in", AccessIn::SIZE, 8),
        ("fuse_init_in", InitIn::SIZE, 64),
        ("fuse_init_out", InitOut::SIZE, 64),
        ("fuse_interrupt_in", InterruptIn::SIZE, 8),
        ("fuse_bmap_in", BmapIn::SIZE, 16),
        ("fuse_bmap_out", BmapOut::SIZE, 8),
        ("fuse_ioctl_in", IoctlIn::SIZE, 32),
        ("fuse_ioctl_out", IoctlOut::SIZE, 16),
        ("fuse_poll_in", PollIn::SIZE, 24),
        ("fuse_poll_out", PollOut::SIZE, 8),
        ("fuse_fallocate_in", FallocateIn::SIZE, 32),
        ("fuse_dirent (fixed part)", Dirent::SIZE, 24),
        ("fuse_notify_poll_wakeup_out", NotifyPollWakeupOut::SIZE, 8),
        ("fuse_notify_inval_inode_out", NotifyInvalInodeOut::SIZE, 24),
        ("fuse_notify_inval_entry_out", NotifyInvalEntryOut::SIZE, 16),
        ("fuse_notify_delete_out", NotifyDeleteOut::SIZE, 24),
        ("fuse_notify_store_out", NotifyStoreOut::SIZE, 24),
        ("fuse_notify_retrieve_out", NotifyRetrieveOut::SIZE, 32),
        ("fuse_notify_retrieve_in", NotifyRetrieveIn::SIZE, 40),
        ("fuse_notify_prune_out", NotifyPruneOut::SIZE, 16),
        ("fuse_lseek_in", LseekIn::SIZE, 24),
        ("fuse_lseek_out", LseekOut::SIZE, 8),
        ("fuse_copy_file_range_in", CopyFileRangeIn::SIZE, 56),
        ("fuse_copy_file_range_out", CopyFileRangeOut::SIZE, 8),
        ("fuse_syncfs_in", SyncfsIn::SIZE, 8),
        ("fuse_ext_header", ExtHeader::SIZE, 8),
        ("fuse_secctx", Secctx::SIZE, 8),
        ("fuse_uring_ent_in_out", UringEntInOut::SIZE, 32),
        ("fuse_uring_req_header", UringReqHeader::SIZE, 288),
        ("fuse_uring_cmd_req", UringCmdReq::SIZE, 24),
    ];
    for (name, got, want) in sizes {
        assert_eq!(got, want, "{name}");
    }
    // fuse_notify_retrieve_in "matches the size of fuse_write_in".
    assert_eq!(NotifyRetrieveIn::SIZE, WriteIn::SIZE);
    // FUSE_URING_OP_IN_OUT_SZ holds the largest first argument the kernel puts there.
    const { assert!(SetattrIn::SIZE <= uring::URING_OP_IN_OUT_SZ) };
    const { assert!(InHeader::SIZE <= uring::URING_IN_OUT_HEADER_SZ) };
}

/// The FUSE_INIT Linux 6.18 sent to a probe on this machine (read from /dev/fuse after a
/// mount(2) of type fuse.probe): protocol 7.45, readahead 128 KiB, io_uring not enabled.
const INIT_FROM_LINUX_6_18: [u8; 104] = {
    let mut m = [0u8; 104];
    let head: [u8; 60] = [
        0x68, 0, 0, 0, 0x1a, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, // len 104, opcode 26, unique 2
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // nodeid 0, uid 0, gid 0
        0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0x2d, 0, 0,
        0, // pid 0, extlen 0, major 7, minor 45
        0, 0, 2, 0, 0xfb, 0xff, 0xff, 0x73, 0xfd, 0x05, 0, 0, // readahead, flags, flags2
    ];
    let mut i = 0;
    while i < head.len() {
        m[i] = head[i];
        i += 1;
    }
    m
};

#[test]
fn init_captured_from_linux_6_18_parses() {
    let req = Request::parse(&INIT_FROM_LINUX_6_18).unwrap();
    assert_eq!(req.header.unique, 2);
    assert_eq!(req.header.nodeid, 0);
    let Op::Init(init) = req.op else {
        panic!("not INIT: {:?}", req.op)
    };
    assert_eq!((init.major, init.minor), (7, 45));
    assert_eq!(init.max_readahead, 128 * 1024);
    let offered = init.flags();
    for f in [
        flags::init::EXPORT_SUPPORT,
        flags::init::HANDLE_KILLPRIV_V2,
        flags::init::SETXATTR_EXT,
        flags::init::MAX_PAGES,
        flags::init::DO_READDIRPLUS,
        flags::init::INIT_EXT,
        flags::init::HAS_RESEND,
        flags::init::NO_EXPORT_SUPPORT,
        flags::init::REQUEST_TIMEOUT,
    ] {
        assert_ne!(offered & f, 0, "{f:#x} offered");
    }
    // enable_uring was off; FILE_OPS and DAX bits are never offered.
    for f in [
        flags::init::OVER_IO_URING,
        flags::init::FILE_OPS,
        flags::init::HAS_INODE_DAX,
    ] {
        assert_eq!(offered & f, 0, "{f:#x} not offered");
    }
}

#[test]
fn in_header_and_setattr_in_decode_from_hand_placed_fields() {
    let mut m = vec![0u8; 40 + 88];
    put(&mut m, 0, &128u32.to_le_bytes()); // len
    put(&mut m, 4, &4u32.to_le_bytes()); // FUSE_SETATTR
    put(&mut m, 8, &0xaabbu64.to_le_bytes()); // unique
    put(&mut m, 16, &77u64.to_le_bytes()); // nodeid
    put(&mut m, 24, &1001u32.to_le_bytes()); // uid
    put(&mut m, 28, &1002u32.to_le_bytes()); // gid
    put(&mut m, 32, &1003u32.to_le_bytes()); // pid
    let a = 40;
    let valid = flags::fattr::SIZE | flags::fattr::MTIME | flags::fattr::KILL_SUIDGID;
    put(&mut m, a, &valid.to_le_bytes());
    put(&mut m, a + 8, &9u64.to_le_bytes()); // fh
    put(&mut m, a + 16, &4096u64.to_le_bytes()); // size
    put(&mut m, a + 24, &55u64.to_le_bytes()); // lock_owner
    put(&mut m, a + 32, &1u64.to_le_bytes()); // atime
    put(&mut m, a + 40, &2u64.to_le_bytes()); // mtime
    put(&mut m, a + 48, &3u64.to_le_bytes()); // ctime
    put(&mut m, a + 56, &4u32.to_le_bytes()); // atimensec
    put(&mut m, a + 60, &5u32.to_le_bytes()); // mtimensec
    put(&mut m, a + 64, &6u32.to_le_bytes()); // ctimensec
    put(&mut m, a + 68, &0o104755u32.to_le_bytes()); // mode
    put(&mut m, a + 76, &7u32.to_le_bytes()); // uid
    put(&mut m, a + 80, &8u32.to_le_bytes()); // gid
    let req = Request::parse(&m).unwrap();
    assert_eq!(req.header.unique, 0xaabb);
    assert_eq!(req.header.nodeid, 77);
    assert_eq!(
        (req.header.uid, req.header.gid, req.header.pid),
        (1001, 1002, 1003)
    );
    let Op::Setattr(s) = req.op else {
        panic!("{:?}", req.op)
    };
    assert_eq!(s.valid, valid);
    assert!(s.kill_suidgid());
    assert_eq!((s.fh, s.size, s.lock_owner), (9, 4096, 55));
    assert_eq!((s.atime, s.mtime, s.ctime), (1, 2, 3));
    assert_eq!((s.atimensec, s.mtimensec, s.ctimensec), (4, 5, 6));
    assert_eq!((s.mode, s.uid, s.gid), (0o104755, 7, 8));
}

#[test]
fn write_in_decodes_from_hand_placed_fields() {
    let mut m = vec![0u8; 40 + 40 + 3];
    put(&mut m, 0, &83u32.to_le_bytes());
    put(&mut m, 4, &16u32.to_le_bytes()); // FUSE_WRITE
    let a = 40;
    put(&mut m, a, &3u64.to_le_bytes()); // fh
    put(&mut m, a + 8, &(1u64 << 40).to_le_bytes()); // offset
    put(&mut m, a + 16, &3u32.to_le_bytes()); // size
    put(&mut m, a + 20, &flags::write::KILL_SUIDGID.to_le_bytes()); // write_flags
    put(&mut m, a + 24, &99u64.to_le_bytes()); // lock_owner
    put(&mut m, a + 32, &0o2u32.to_le_bytes()); // flags: O_RDWR
    put(&mut m, a + 40, b"abc");
    let Op::Write { arg, data } = Request::parse(&m).unwrap().op else {
        panic!()
    };
    assert_eq!((arg.fh, arg.offset, arg.size), (3, 1 << 40, 3));
    assert!(arg.kill_suidgid());
    assert_eq!((arg.lock_owner, arg.flags), (99, 2));
    assert_eq!(data, b"abc");
}

#[test]
fn lookup_name_is_borrowed_without_its_nul() {
    let mut m = vec![0u8; 40];
    m.extend_from_slice(b"a b\xff\0");
    let len = m.len() as u32;
    put(&mut m, 0, &len.to_le_bytes());
    put(&mut m, 4, &1u32.to_le_bytes());
    use std::os::unix::ffi::OsStrExt;
    let Op::Lookup { name } = Request::parse(&m).unwrap().op else {
        panic!()
    };
    assert_eq!(name, OsStr::from_bytes(b"a b\xff"));
}

#[test]
fn error_reply_bytes() {
    let r = Reply::error(0x0102_0304_0506_0708, Errno::ENOSYS);
    let mut want = vec![16u8, 0, 0, 0];
    want.extend_from_slice(&(-libc::ENOSYS).to_le_bytes());
    want.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(r.as_bytes(), want);
    assert_eq!(
        Reply::empty(5).as_bytes(),
        [16, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]
    );
}

fn sample_attr() -> Attr {
    Attr {
        ino: 0x11,
        size: 0x22,
        blocks: 0x33,
        atime: 0x44,
        mtime: 0x55,
        ctime: 0x66,
        atimensec: 0x77,
        mtimensec: 0x88,
        ctimensec: 0x99,
        mode: 0o100644,
        nlink: 0xaa,
        uid: 0xbb,
        gid: 0xcc,
        rdev: 0xdd,
        blksize: 4096,
        flags: 0xee,
    }
}

/// `fuse_attr` fields at their offsets from `at`.
fn check_attr(b: &[u8], at: usize) {
    assert_eq!(le_u64(b, at), 0x11, "ino");
    assert_eq!(le_u64(b, at + 8), 0x22, "size");
    assert_eq!(le_u64(b, at + 16), 0x33, "blocks");
    assert_eq!(le_u64(b, at + 24), 0x44, "atime");
    assert_eq!(le_u64(b, at + 32), 0x55, "mtime");
    assert_eq!(le_u64(b, at + 40), 0x66, "ctime");
    assert_eq!(le_u32(b, at + 48), 0x77, "atimensec");
    assert_eq!(le_u32(b, at + 52), 0x88, "mtimensec");
    assert_eq!(le_u32(b, at + 56), 0x99, "ctimensec");
    assert_eq!(le_u32(b, at + 60), 0o100644, "mode");
    assert_eq!(le_u32(b, at + 64), 0xaa, "nlink");
    assert_eq!(le_u32(b, at + 68), 0xbb, "uid");
    assert_eq!(le_u32(b, at + 72), 0xcc, "gid");
    assert_eq!(le_u32(b, at + 76), 0xdd, "rdev");
    assert_eq!(le_u32(b, at + 80), 4096, "blksize");
    assert_eq!(le_u32(b, at + 84), 0xee, "flags");
}

fn sample_entry() -> EntryOut {
    EntryOut {
        nodeid: 42,
        generation: 7,
        entry_valid: 3600,
        attr_valid: 60,
        entry_valid_nsec: 500,
        attr_valid_nsec: 600,
        attr: sample_attr(),
    }
}

#[test]
fn entry_reply_layout() {
    let r = Reply::entry(9, &sample_entry());
    let b = r.as_bytes();
    assert_eq!(b.len(), 16 + 128);
    assert_eq!(le_u32(b, 0), 144, "out header len");
    assert_eq!(le_u32(b, 4), 0, "error");
    assert_eq!(le_u64(b, 8), 9, "unique");
    assert_eq!(le_u64(b, 16), 42, "nodeid");
    assert_eq!(le_u64(b, 24), 7, "generation");
    assert_eq!(le_u64(b, 32), 3600, "entry_valid");
    assert_eq!(le_u64(b, 40), 60, "attr_valid");
    assert_eq!(le_u32(b, 48), 500, "entry_valid_nsec");
    assert_eq!(le_u32(b, 52), 600, "attr_valid_nsec");
    check_attr(b, 56);
}

#[test]
fn attr_and_create_reply_layouts() {
    let r = Reply::attr(
        1,
        &AttrOut {
            attr_valid: 5,
            attr_valid_nsec: 6,
            dummy: 0,
            attr: sample_attr(),
        },
    );
    let b = r.as_bytes();
    assert_eq!(b.len(), 16 + 104);
    assert_eq!(le_u64(b, 16), 5);
    assert_eq!(le_u32(b, 24), 6);
    check_attr(b, 32);

    let open = OpenOut {
        fh: 0xf00d,
        open_flags: flags::fopen::KEEP_CACHE | flags::fopen::NOFLUSH,
        backing_id: -1,
    };
    let b = Reply::create(2, &sample_entry(), &open).into_bytes();
    assert_eq!(b.len(), 16 + 128 + 16);
    assert_eq!(le_u32(b.as_slice(), 0) as usize, b.len());
    assert_eq!(le_u64(&b, 16 + 128), 0xf00d, "fh");
    assert_eq!(le_u32(&b, 16 + 136), (1 << 1) | (1 << 5), "open_flags");
    assert_eq!(le_u32(&b, 16 + 140), u32::MAX, "backing_id -1");
}

#[test]
fn init_reply_layout() {
    let mut out = InitOut {
        major: 7,
        minor: 45,
        max_readahead: 0x20000,
        max_background: 64,
        congestion_threshold: 48,
        max_write: 1 << 20,
        time_gran: 1,
        max_pages: 256,
        map_alignment: 0,
        max_stack_depth: 0,
        request_timeout: 30,
        ..InitOut::default()
    };
    out.set_flags(flags::init::EXPORT_SUPPORT | flags::init::NO_EXPORT_SUPPORT);
    let b = Reply::init(3, &out).into_bytes();
    assert_eq!(b.len(), 16 + 64);
    let p = &b[16..];
    assert_eq!(le_u32(p, 0), 7, "major");
    assert_eq!(le_u32(p, 4), 45, "minor");
    assert_eq!(le_u32(p, 8), 0x20000, "max_readahead");
    // flags: EXPORT_SUPPORT and, because a high bit is set, INIT_EXT.
    assert_eq!(le_u32(p, 12), (1 << 4) | (1 << 30), "flags");
    assert_eq!(le_u16(p, 16), 64, "max_background");
    assert_eq!(le_u16(p, 18), 48, "congestion_threshold");
    assert_eq!(le_u32(p, 20), 1 << 20, "max_write");
    assert_eq!(le_u32(p, 24), 1, "time_gran");
    assert_eq!(le_u16(p, 28), 256, "max_pages");
    assert_eq!(le_u16(p, 30), 0, "map_alignment");
    assert_eq!(le_u32(p, 32), 1 << 6, "flags2: NO_EXPORT_SUPPORT is bit 38");
    assert_eq!(le_u16(p, 40), 30, "request_timeout");
    assert!(p[42..].iter().all(|&b| b == 0), "unused");
}

#[test]
fn statfs_write_lseek_xattr_reply_layouts() {
    let st = Kstatfs {
        blocks: 1,
        bfree: 2,
        bavail: 3,
        files: 4,
        ffree: 5,
        bsize: 4096,
        namelen: 255,
        frsize: 4096,
        padding: 0,
        spare: [0; 6],
    };
    let b = Reply::statfs(1, &st).into_bytes();
    assert_eq!(b.len(), 16 + 80);
    let p = &b[16..];
    for (i, v) in [1u64, 2, 3, 4, 5].into_iter().enumerate() {
        assert_eq!(le_u64(p, i * 8), v);
    }
    assert_eq!(
        (le_u32(p, 40), le_u32(p, 44), le_u32(p, 48)),
        (4096, 255, 4096)
    );

    assert_eq!(
        Reply::write(4, 0x1234).as_bytes()[16..],
        [0x34, 0x12, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(le_u64(Reply::lseek(4, 1 << 33).as_bytes(), 16), 1 << 33);
    assert_eq!(le_u32(Reply::xattr_size(4, 77).as_bytes(), 16), 77);
    assert_eq!(
        le_u64(Reply::copy_file_range_64(4, 1 << 40).as_bytes(), 16),
        1 << 40
    );
    let data = Reply::data(4, b"xyz").unwrap().into_bytes();
    assert_eq!(data.len(), 19);
    assert_eq!(le_u32(&data, 0), 19);
    assert_eq!(&data[16..], b"xyz");
}

#[test]
fn dirent_layout_pads_to_8_bytes() {
    let mut d = Dirents::new(4096);
    assert!(d.push(5, 1, dirent_type(0o040755), b"abc").unwrap());
    assert!(d.push(6, 2, dirent_type(0o100644), b"12345678").unwrap());
    let b = d.as_bytes();
    // 24 + 3 -> 32; 24 + 8 -> 32.
    assert_eq!(b.len(), 64);
    assert_eq!(le_u64(b, 0), 5, "ino");
    assert_eq!(le_u64(b, 8), 1, "off");
    assert_eq!(le_u32(b, 16), 3, "namelen");
    assert_eq!(le_u32(b, 20), 4, "type: DT_DIR");
    assert_eq!(&b[24..32], b"abc\0\0\0\0\0");
    assert_eq!(le_u64(b, 32), 6);
    assert_eq!(le_u32(b, 52), 8, "type: DT_REG");
    assert_eq!(&b[56..64], b"12345678");
}

#[test]
fn direntplus_layout() {
    let mut d = DirentsPlus::new(4096);
    assert!(d.push(&sample_entry(), 0x11, 9, 4, b"x").unwrap());
    let b = d.as_bytes();
    // 128 + 24 + 1 -> 160.
    assert_eq!(b.len(), 160);
    assert_eq!(le_u64(b, 0), 42, "entry_out.nodeid");
    check_attr(b, 40);
    assert_eq!(le_u64(b, 128), 0x11, "dirent.ino");
    assert_eq!(le_u64(b, 136), 9, "dirent.off");
    assert_eq!(le_u32(b, 144), 1, "dirent.namelen");
    assert_eq!(le_u32(b, 148), 4, "dirent.type");
    assert_eq!(&b[152..160], b"x\0\0\0\0\0\0\0");
}

#[test]
fn notification_layouts() {
    let n = Notification::inval_entry(1, b"name", flags::inval_entry::EXPIRE_ONLY).unwrap();
    let b = n.as_bytes();
    assert_eq!(b.len(), 16 + 16 + 5);
    assert_eq!(le_u32(b, 0) as usize, b.len());
    assert_eq!(le_u32(b, 4), 3, "error carries FUSE_NOTIFY_INVAL_ENTRY");
    assert_eq!(le_u64(b, 8), 0, "unique 0");
    assert_eq!(le_u64(b, 16), 1, "parent");
    assert_eq!(le_u32(b, 24), 4, "namelen");
    assert_eq!(le_u32(b, 28), 1, "flags");
    assert_eq!(&b[32..], b"name\0");

    let b = Notification::inval_inode(7, -1, 0).into_bytes();
    assert_eq!(b.len(), 40);
    assert_eq!(le_u32(&b, 4), 2);
    assert_eq!(le_u64(&b, 16), 7);
    assert_eq!(le_u64(&b, 24), u64::MAX, "off -1: attributes only");
    assert_eq!(le_u64(&b, 32), 0);

    let b = Notification::delete(1, 2, b"d").unwrap().into_bytes();
    assert_eq!(b.len(), 16 + 24 + 2);
    assert_eq!(le_u32(&b, 4), 6);
    assert_eq!((le_u64(&b, 16), le_u64(&b, 24), le_u32(&b, 32)), (1, 2, 1));
    assert_eq!(&b[40..], b"d\0");

    let b = Notification::store(3, 4096, b"pq").unwrap().into_bytes();
    assert_eq!(
        (le_u32(&b, 4), le_u64(&b, 16), le_u64(&b, 24)),
        (4, 3, 4096)
    );
    assert_eq!(le_u32(&b, 32), 2);
    assert_eq!(&b[40..], b"pq");

    let b = Notification::retrieve(77, 3, 0, 8192).into_bytes();
    assert_eq!(b.len(), 16 + 32);
    assert_eq!(
        (le_u32(&b, 4), le_u64(&b, 16), le_u32(&b, 40)),
        (5, 77, 8192)
    );

    let b = Notification::prune(&[10, 11]).unwrap().into_bytes();
    assert_eq!(b.len(), 16 + 16 + 16);
    assert_eq!((le_u32(&b, 4), le_u32(&b, 16)), (9, 2));
    assert_eq!((le_u64(&b, 32), le_u64(&b, 40)), (10, 11));

    for (n, code) in [(Notification::resend(), 7), (Notification::inc_epoch(), 8)] {
        assert_eq!(
            n.as_bytes(),
            [16, 0, 0, 0, code, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }
    let b = Notification::poll_wakeup(5).into_bytes();
    assert_eq!((b.len(), le_u32(&b, 4), le_u64(&b, 16)), (24, 1, 5));
}

#[test]
fn uring_structures_layout() {
    let mut b = Vec::new();
    UringCmdReq {
        flags: 1,
        commit_id: 2,
        qid: 3,
        padding: [0; 6],
    }
    .encode(&mut b);
    assert_eq!(b.len(), 24);
    assert_eq!((le_u64(&b, 0), le_u64(&b, 8), le_u16(&b, 16)), (1, 2, 3));

    let mut h = UringReqHeader::default();
    h.in_out[0] = 0xaa;
    h.op_in[0] = 0xbb;
    h.ring_ent_in_out = UringEntInOut {
        flags: 4,
        commit_id: 5,
        payload_sz: 6,
        padding: 0,
        reserved: 0,
    };
    let mut b = Vec::new();
    h.encode(&mut b);
    assert_eq!(b.len(), 288);
    assert_eq!((b[0], b[128]), (0xaa, 0xbb));
    assert_eq!(
        (le_u64(&b, 256), le_u64(&b, 264), le_u32(&b, 272)),
        (4, 5, 6)
    );
    assert_eq!(UringReqHeader::decode(&b).unwrap(), h);
    assert_eq!(uring::UringCmd::CommitAndFetch as u32, 2);
}

#[test]
fn dev_ioc_clone_number() {
    // _IOR(229, 0, uint32_t) as <asm-generic/ioctl.h> composes it.
    assert_eq!(DEV_IOC_CLONE, 0x8004_e500);
}
