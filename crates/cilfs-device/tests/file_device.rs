//! The file device: flags become syscalls, flushes with nothing volatile are elided.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

use cilfs_device::{
    AlignedBuf, Device, DirectIo, FileDevice, FileDeviceOptions, FuaMode, WriteFlags,
};

fn image(len: u64) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().set_len(len).unwrap();
    f
}

#[test]
fn write_read_roundtrip_aligned_and_unaligned_memory() {
    let f = image(1 << 20);
    let dev = FileDevice::open(f.path(), FileDeviceOptions::default()).unwrap();
    assert_eq!(dev.len(), 1 << 20);
    let mut buf = AlignedBuf::zeroed(4096);
    buf.fill(0xab);
    dev.write(8192, &buf, WriteFlags::NONE).unwrap();
    // A Vec slice at an odd address goes through a bounce buffer under O_DIRECT.
    let v = vec![0xcdu8; 513];
    dev.write(0, &v[1..], WriteFlags::NONE).unwrap();
    let mut back = vec![0u8; 4097];
    dev.read(8192, &mut back[1..]).unwrap();
    assert!(back[1..].iter().all(|&b| b == 0xab));
    let mut back = vec![0u8; 512];
    dev.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0xcd));
    let s = dev.stats();
    assert_eq!(
        (s.writes, s.write_bytes, s.reads, s.read_bytes),
        (2, 4608, 2, 4608)
    );
}

#[test]
fn unaligned_io_is_refused_with_a_clear_error() {
    let f = image(1 << 20);
    let dev = FileDevice::open(f.path(), FileDeviceOptions::default()).unwrap();
    let err = dev.write(100, &[0; 512], WriteFlags::NONE).unwrap_err();
    assert!(err.to_string().contains("512"), "{err}");
    assert!(dev.read(0, &mut [0; 100]).is_err());
    assert!(dev.write(1 << 20, &[0; 512], WriteFlags::NONE).is_err());
    assert_eq!(dev.stats().writes, 0);
}

#[test]
fn flags_become_syscalls_and_idle_flushes_are_elided() {
    for fua in [FuaMode::DsyncWrite, FuaMode::WriteThenSync] {
        let f = image(1 << 20);
        let opts = FileDeviceOptions {
            fua,
            ..Default::default()
        };
        let dev = FileDevice::open(f.path(), opts).unwrap();
        let buf = AlignedBuf::zeroed(4096);
        dev.flush().unwrap(); // nothing written: elided
        dev.write(0, &buf, WriteFlags::NONE).unwrap();
        dev.write(4096, &buf, WriteFlags::PREFLUSH | WriteFlags::FUA)
            .unwrap(); // flush + sync write
        dev.write(8192, &buf, WriteFlags::PREFLUSH).unwrap(); // nothing volatile: elided
        dev.flush().unwrap(); // the previous write is volatile: issued
        let s = dev.stats();
        assert_eq!(s.flushes_issued, 2, "{fua:?}");
        assert_eq!(s.flushes_elided, 2, "{fua:?}");
        assert_eq!((s.preflush_writes, s.fua_writes), (2, 1), "{fua:?}");
        // fdatasync, then pwritev2(DSYNC) or the write's own fdatasync, then fdatasync.
        assert_eq!(s.sync_syscalls, 3, "{fua:?}");
    }
}

#[test]
fn buffered_mode_and_missing_files() {
    let f = image(65536);
    let opts = FileDeviceOptions {
        direct: DirectIo::Never,
        ..Default::default()
    };
    let dev = FileDevice::open(f.path(), opts).unwrap();
    assert!(!dev.is_direct());
    dev.write(512, &[7; 512], WriteFlags::FUA).unwrap();
    let mut b = [0; 512];
    dev.read(512, &mut b).unwrap();
    assert_eq!(b, [7; 512]);
    let err = FileDevice::open(std::path::Path::new("/nonexistent/cilfs.img"), opts).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/cilfs.img"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    assert!(FileDevice::open(dir.path(), opts).is_err());
}

#[test]
fn flushes_can_be_forced_for_comparisons() {
    let f = image(1 << 20);
    let opts = FileDeviceOptions {
        no_flush_elision: true,
        ..Default::default()
    };
    let dev = FileDevice::open(f.path(), opts).unwrap();
    dev.flush().unwrap();
    dev.write(
        0,
        &AlignedBuf::zeroed(4096),
        WriteFlags::PREFLUSH | WriteFlags::FUA,
    )
    .unwrap();
    let s = dev.stats();
    assert_eq!((s.flushes_issued, s.flushes_elided), (2, 0));
}

#[test]
fn vectored_writes_land_back_to_back_as_one_io() {
    let f = image(1 << 20);
    let dev = FileDevice::open(f.path(), FileDeviceOptions::default()).unwrap();
    let mut a = AlignedBuf::zeroed(4096);
    a.fill(1);
    let mut b = AlignedBuf::zeroed(1024);
    b.fill(2);
    let mut c = AlignedBuf::zeroed(8192);
    c.fill(3);
    dev.write_vectored(65536, &[&a, &b, &c]).unwrap();
    let s = dev.stats();
    assert_eq!((s.writes, s.write_bytes), (1, 4096 + 1024 + 8192));
    let mut back = AlignedBuf::zeroed(4096 + 1024 + 8192);
    dev.read(65536, &mut back).unwrap();
    assert!(back[..4096].iter().all(|&x| x == 1));
    assert!(back[4096..5120].iter().all(|&x| x == 2));
    assert!(back[5120..].iter().all(|&x| x == 3));
    // The write is volatile like any other: a flush follows it, not elided.
    dev.flush().unwrap();
    assert_eq!(dev.stats().flushes_issued, 1);
    // Unaligned memory under O_DIRECT goes buffer by buffer through bounce buffers.
    let v = vec![4u8; 1025];
    dev.write_vectored(0, &[&v[1..], &a]).unwrap();
    let mut back = AlignedBuf::zeroed(1024 + 4096);
    dev.read(0, &mut back).unwrap();
    assert!(back[..1024].iter().all(|&x| x == 4) && back[1024..].iter().all(|&x| x == 1));
    // Past the end: refused with an error, nothing written.
    assert!(dev.write_vectored((1 << 20) - 4096, &[&a, &b]).is_err());
}

/// Loop device flush requests so far (field 16 of /sys/block/loopN/stat).
fn loop_flushes(dev: &str) -> u64 {
    let name = dev.trim_start_matches("/dev/");
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
    stat.split_whitespace().nth(15).unwrap().parse().unwrap()
}

/// On a block device without native FUA, RWF_DSYNC costs two cache flushes (the emulated FUA,
/// then the file sync) and a write plus fdatasync one; `Auto` picks the latter there. Needs root
/// and loop devices, as the mount tests do.
#[test]
fn fua_on_a_block_device_costs_one_flush() {
    let f = image(16 << 20);
    let out = std::process::Command::new("losetup")
        .args(["-f", "--show"])
        .arg(f.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "losetup: {out:?} (this test needs root)"
    );
    let loopdev = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let result = std::panic::catch_unwind(|| {
        let mut buf = AlignedBuf::zeroed(4096);
        buf.fill(7);
        let mut flushes = Vec::new();
        for fua in [FuaMode::Auto, FuaMode::DsyncWrite] {
            let opts = FileDeviceOptions {
                fua,
                ..FileDeviceOptions::default()
            };
            let dev = FileDevice::open(std::path::Path::new(&loopdev), opts).unwrap();
            assert!(dev.is_block_device());
            let before = loop_flushes(&loopdev);
            dev.write(0, &buf, WriteFlags::FUA).unwrap();
            flushes.push(loop_flushes(&loopdev) - before);
        }
        assert_eq!(
            flushes,
            vec![1, 2],
            "flush requests per FUA write: Auto, DsyncWrite"
        );
    });
    let _ = std::process::Command::new("losetup")
        .args(["-d", &loopdev])
        .status();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn a_flush_reports_whether_it_was_issued() {
    let f = image(1 << 20);
    let dev = FileDevice::open(f.path(), FileDeviceOptions::default()).unwrap();
    assert!(!dev.flush_reporting().unwrap(), "nothing volatile: elided");
    dev.write(0, &AlignedBuf::zeroed(4096), WriteFlags::NONE)
        .unwrap();
    assert!(dev.flush_reporting().unwrap());
    assert!(!dev.flush_reporting().unwrap());
    let s = dev.stats();
    assert_eq!((s.flushes_issued, s.flushes_elided), (1, 2));
}
