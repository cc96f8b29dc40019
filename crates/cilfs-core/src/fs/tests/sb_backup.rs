//! Backup superblocks: a lost primary (or the first MiB) is read from a backup by every tool,
//! a mount rewrites it, check reports it; a lost end copy is reported and nothing else
//! changes; images made before backups work as before.

#![allow(clippy::unwrap_used)]

use crate::check::check_image;
use crate::format::geometry::{Geometry, GeometryError};
use crate::format::superblock::front_backup_block;
use crate::format::Superblock;
use crate::fs::tests::{jcfg, layout};
use crate::fs::types::Cred;
use crate::fs::*;
use crate::mkfs::{write_filesystem, Layout};
use cilfs_device::{AlignedBuf, CrashOptions, Device, SimDevice, WriteFlags};

// Large enough for the log 64 KiB blocks need (`crate::mkfs::min_log_bytes`).
const FS_BYTES: u64 = 32 << 20;
const BS: u32 = 4096;
const FILES: usize = 20;

/// A new-format filesystem (what mkfs makes) of `FILES` files, cleanly unmounted.
fn populated(bs: u32) -> Arc<SimDevice> {
    let l = Layout::new(FS_BYTES, u64::from(bs), None, None).unwrap();
    assert!(l.backups);
    let dev = Arc::new(SimDevice::new(FS_BYTES, 9));
    write_filesystem(&*dev, None, &l, &mut |_, _| {}).unwrap();
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    mkfs::format(&j, 0, 0).unwrap();
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    for i in 0..FILES {
        let f = fs
            .mknod(
                Cred::ROOT,
                ROOT_INO,
                format!("f{i}").as_bytes(),
                0o100_644,
                0,
            )
            .unwrap()
            .ino;
        fs.write(Cred::ROOT, f, 0, &[i as u8 + 1; 5000]).unwrap();
    }
    fs.unmount().unwrap();
    dev
}

fn zero(dev: &dyn Device, off: u64, len: u64) {
    dev.write(off, &AlignedBuf::zeroed(len as usize), WriteFlags::FUA)
        .unwrap();
}

fn primary(dev: &dyn Device) -> Result<Superblock, crate::format::FormatError> {
    let mut s = AlignedBuf::zeroed(512);
    dev.read(0, &mut s).unwrap();
    Superblock::decode(&s)
}

fn all_files_read_back(fs: &Fs) {
    for i in 0..FILES {
        let ino = fs.lookup(ROOT_INO, format!("f{i}").as_bytes()).unwrap().ino;
        assert_eq!(
            fs.read(ino, 0, 6000).unwrap(),
            vec![i as u8 + 1; 5000],
            "f{i}"
        );
    }
}

/// A truncated copy of `dev`, `short` bytes shorter.
fn cut_short(dev: &SimDevice, short: u64) -> Arc<SimDevice> {
    Arc::new(SimDevice::from_image(
        dev.stable_image(),
        dev.len() - short,
        3,
    ))
}

#[test]
fn every_block_size_finds_a_backup_without_the_primary() {
    let mut bs = 512u32;
    while bs <= 65536 {
        let l = Layout::new(FS_BYTES, u64::from(bs), None, None).unwrap();
        let dev = SimDevice::new(FS_BYTES, 1);
        write_filesystem(&dev, None, &l, &mut |_, _| {}).unwrap();
        let sb = l.superblock();
        let (front, last) = (front_backup_block(bs), l.data_blocks - 1);
        assert_eq!(sb.backup_blocks(), vec![front, last], "bs {bs}");
        // The primary zeroed: the front copy, at byte 1 MiB.
        zero(&dev, 0, 512);
        let g = Geometry::read(&dev, None).unwrap();
        assert_eq!((g.from_backup, &g.sb), (Some(front), &sb), "bs {bs}");
        assert!(g.primary_damage.unwrap().contains("magic"), "bs {bs}");
        // The first MiB and the front copy gone: the end copy, found from the device's size.
        zero(&dev, 0, (1 << 20) + u64::from(bs));
        let g = Geometry::read(&dev, None).unwrap();
        assert_eq!((g.from_backup, &g.sb), (Some(last), &sb), "bs {bs}");
        // A bad CRC in the primary (not zeros) falls back too.
        write_filesystem(&dev, None, &l, &mut |_, _| {}).unwrap();
        let mut s = AlignedBuf::zeroed(512);
        dev.read(0, &mut s).unwrap();
        s[40] ^= 1;
        dev.write(0, &s, WriteFlags::FUA).unwrap();
        let g = Geometry::read(&dev, None).unwrap();
        assert_eq!(g.from_backup, Some(front), "bs {bs}");
        assert!(g.primary_damage.unwrap().contains("checksum"), "bs {bs}");
        // No copy left: today's error, naming what is there.
        zero(&dev, 0, (1 << 20) + u64::from(bs));
        zero(&dev, last * u64::from(bs), u64::from(bs));
        let err = Geometry::read(&dev, None).unwrap_err();
        assert!(matches!(err, GeometryError::NotCilfs(_)), "bs {bs}: {err}");
        bs *= 2;
    }
}

#[test]
fn primary_zeroed_check_reports_it_and_a_mount_reads_the_backup_and_rewrites_it() {
    let dev = populated(BS);
    zero(&*dev, 0, 512);
    let (report, _) = check_image(dev.clone() as Arc<dyn Device>, None).unwrap();
    assert_eq!(
        report.problems.len(),
        1,
        "only the superblock: {:?}",
        report.problems
    );
    let p = &report.problems[0];
    assert!(
        p.starts_with("superblock: primary damaged") && p.contains("backup at block 256"),
        "{p}"
    );
    assert!(primary(&*dev).is_err(), "check wrote nothing");
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    assert_eq!(j.geometry().from_backup, Some(256));
    // The mount's first superblock write put the primary back.
    assert_eq!(primary(&*dev).unwrap().uuid, j.superblock().uuid);
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    all_files_read_back(&fs);
    fs.unmount().unwrap();
    let (report, _) = check_image(dev.clone() as Arc<dyn Device>, None).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(Geometry::read(&*dev, None).unwrap().from_backup, None);
}

#[test]
fn the_first_mib_zeroed_mounts_from_the_front_backup() {
    let dev = populated(BS);
    zero(&*dev, 0, 1 << 20);
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    assert_eq!(j.geometry().from_backup, Some(256));
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    all_files_read_back(&fs);
    fs.unmount().unwrap();
    assert!(check_image(dev as Arc<dyn Device>, None)
        .unwrap()
        .0
        .is_clean());
}

#[test]
fn the_last_block_lost_the_primary_still_works_and_check_reports_the_missing_backup() {
    let full = populated(BS);
    let dev = cut_short(&full, u64::from(BS));
    let last = FS_BYTES / u64::from(BS) - 1;
    let g = Geometry::read(&*dev, None).unwrap();
    assert_eq!(g.from_backup, None);
    let (report, _) = check_image(dev.clone() as Arc<dyn Device>, None).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].contains(&format!("the backup at block {last} is missing")),
        "{:?}",
        report.problems
    );
    // A mount works and writes every copy it can; the file data is all there.
    let fs = crate::fs::tests::mount(&dev, FsOptions::default());
    all_files_read_back(&fs);
    fs.unmount().unwrap();
    // Two blocks short is the filesystem itself cut short: refused as before.
    let err = Geometry::read(&*cut_short(&full, 2 * u64::from(BS)), None).unwrap_err();
    assert!(matches!(err, GeometryError::DeviceTooSmall { .. }), "{err}");
}

#[test]
fn a_damaged_or_foreign_backup_is_a_problem_for_check() {
    let dev = populated(BS);
    let last = FS_BYTES / u64::from(BS) - 1;
    zero(&*dev, 256 * u64::from(BS), 512);
    // The end copy replaced by the end copy of another filesystem.
    let other = Layout::new(FS_BYTES, u64::from(BS), None, None).unwrap();
    let mut b = AlignedBuf::zeroed(BS as usize);
    b[..512].copy_from_slice(&other.superblock().encode_copy(last));
    dev.write(last * u64::from(BS), &b, WriteFlags::FUA)
        .unwrap();
    let (report, _) = check_image(dev as Arc<dyn Device>, None).unwrap();
    assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
    assert!(
        report.problems[0].contains("backup at block 256 is damaged"),
        "{:?}",
        report.problems
    );
    assert!(
        report.problems[1].contains("describes another filesystem"),
        "{:?}",
        report.problems
    );
}

/// Recovery from a backup one write behind the primary (a crash between their writes, then
/// the primary lost): the log's newer records still replay, and the next generation is above
/// every record's.
#[test]
fn a_backup_one_generation_behind_still_replays_the_log() {
    let dev = populated(BS);
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    let generation = j.superblock().log_generation;
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    let f = fs
        .mknod(Cred::ROOT, ROOT_INO, b"after", 0o100_644, 0)
        .unwrap()
        .ino;
    fs.write(Cred::ROOT, f, 0, b"logged").unwrap();
    fs.fsync(f).unwrap();
    fs.fsync(ROOT_INO).unwrap();
    let crashed = Arc::new(dev.crash(CrashOptions { torn_writes: false }));
    drop(fs);
    // The backup as the mount before this one left it, and the primary gone.
    let mut sb = Geometry::read(&*crashed, None).unwrap().sb;
    assert_eq!(sb.log_generation, generation);
    sb.log_generation -= 1;
    let mut b = AlignedBuf::zeroed(BS as usize);
    b[..512].copy_from_slice(&sb.encode_copy(256));
    crashed
        .write(256 * u64::from(BS), &b, WriteFlags::FUA)
        .unwrap();
    zero(&*crashed, 0, 512);
    let j = Journal::open(crashed.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    assert_eq!(j.geometry().from_backup, Some(256));
    assert!(j.recovery_report().checkpoints_replayed > 0);
    assert!(j.superblock().log_generation > generation);
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    let ino = fs.lookup(ROOT_INO, b"after").unwrap().ino;
    assert_eq!(fs.read(ino, 0, 100).unwrap(), b"logged");
    all_files_read_back(&fs);
    fs.unmount().unwrap();
    assert!(check_image(crashed as Arc<dyn Device>, None)
        .unwrap()
        .0
        .is_clean());
}

/// Another filesystem made over a cilfs one leaves our backups behind: it is named, never
/// mounted as the cilfs filesystem it replaced.
#[test]
fn an_ext4_made_over_cilfs_is_named_not_read_from_a_stale_backup() {
    let dev = populated(BS);
    zero(&*dev, 0, 4096);
    let mut s = AlignedBuf::zeroed(4096);
    s[1080..1082].copy_from_slice(&[0x53, 0xef]);
    dev.write(0, &s, WriteFlags::FUA).unwrap();
    let err = Geometry::read(&*dev, None).unwrap_err();
    assert!(err.to_string().contains("ext2/ext3/ext4"), "{err}");
}

/// An image made before backups (log at block 1, metadata to the last block): mounts, checks
/// clean with no superblock problem, keeps no copies, and a lost primary is today's error.
#[test]
fn an_image_without_backups_works_as_before() {
    let l = layout();
    assert!(!l.backups);
    let dev = crate::fs::tests::new_dev(31);
    let g = Geometry::read(&*dev, None).unwrap();
    assert!(!g.sb.backups && g.sb.backup_blocks().is_empty());
    assert_eq!(g.metadata_area(), (1 + l.log_blocks, l.data_blocks));
    assert!(g.copy_problems(&*dev).is_empty());
    let fs = crate::fs::tests::mount(&dev, FsOptions::default());
    fs.mknod(Cred::ROOT, ROOT_INO, b"x", 0o100_644, 0).unwrap();
    fs.unmount().unwrap();
    let (report, _) = check_image(dev.clone() as Arc<dyn Device>, None).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    // No copy was written where a new image keeps its front one (here: the log).
    let mut b = AlignedBuf::zeroed(BS as usize);
    dev.read(1 << 20, &mut b).unwrap();
    assert!(Superblock::decode_copy(&b[..512]).is_err());
    zero(&*dev, 0, 512);
    let err = Geometry::read(&*dev, None).unwrap_err();
    assert!(err.to_string().contains("not a cilfs filesystem"), "{err}");
}

/// A primary whose CRC is valid but whose geometry is wrong (a bad write of memory before the
/// CRC was taken): the two backups that agree outvote it, every tool reads them, check names
/// the primary, and repair rewrites it.
#[test]
fn a_primary_with_a_valid_crc_and_wrong_geometry_is_outvoted_by_the_backups() {
    for change in 0..3 {
        let dev = populated(BS);
        let mut sb = primary(&*dev).unwrap();
        let right = sb.clone();
        match change {
            0 => sb.data_blocks /= 2,
            1 => sb.data_blocks *= 4,
            _ => {
                sb.log = crate::format::superblock::SbLog::Internal {
                    start: sb.data_blocks / 2,
                }
            }
        }
        let mut s = AlignedBuf::zeroed(512);
        s.copy_from_slice(&sb.encode());
        dev.write(0, &s, WriteFlags::FUA).unwrap();
        assert_eq!(primary(&*dev).unwrap(), sb, "the primary decodes");
        let g = Geometry::read(&*dev, None).unwrap();
        assert_eq!(g.sb, right, "change {change}");
        assert!(g.from_backup.is_some());
        let (report, _) = check_image(dev.clone() as Arc<dyn Device>, None).unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains("disagrees with both backups") || p.contains("describes")),
            "change {change}: {:?}",
            report.problems
        );
        let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
        let fs = Fs::open(j, FsOptions::default()).unwrap();
        all_files_read_back(&fs);
        fs.unmount().unwrap();
        let r = crate::check::repair::repair_image(
            dev.clone() as Arc<dyn Device>,
            None,
            crate::check::repair::RepairOptions {
                dry_run: false,
                progress: None,
            },
        )
        .unwrap();
        assert!(r.problems_left.is_empty(), "{:?}", r.problems_left);
        let now = primary(&*dev).unwrap();
        assert!(
            now.data_blocks == right.data_blocks && now.log == right.log,
            "change {change}: {now:?}"
        );
    }
}
