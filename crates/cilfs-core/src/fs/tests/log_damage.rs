//! Damage in the middle of the log: the mount is refused with a message, never replayed up to
//! the damage in silence; the salvage that repair uses keeps what lies before it.

#![allow(clippy::unwrap_used)]

use crate::check;
use crate::fs::tests::{assert_clean, jcfg, new_dev, TestClock};
use crate::fs::types::Cred;
use crate::fs::*;
use crate::journal::JournalError;
use cilfs_device::{CrashOptions, Device, SimDevice, WriteFlags};

/// Files f0..f{n}, each created, written and fsynced (a checkpoint each), then a crash that
/// keeps every stable write: the log holds them all, to replay.
fn fsynced_files(n: usize) -> Arc<SimDevice> {
    let clock = TestClock::new();
    let dev = new_dev(400);
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    let fs = Fs::open(
        j,
        FsOptions {
            clock: clock.clock(),
            ..FsOptions::default()
        },
    )
    .unwrap();
    for i in 0..n {
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
        fs.write(Cred::ROOT, f, 0, &[i as u8 + 1; 100]).unwrap();
        fs.fsync(f).unwrap();
        fs.fsync(ROOT_INO).unwrap();
    }
    Arc::new(dev.crash(CrashOptions { torn_writes: false }))
}

/// Flips a byte in the second sector of a record before the log's last one.
fn damage_a_middle_record(dev: &SimDevice) -> u64 {
    let (geo, scan) = crate::journal::scan(dev, None).unwrap();
    assert!(!scan.checkpoints.is_empty(), "the log holds checkpoints");
    // Not the last record (a commit record): a committed checkpoint must follow it.
    let n = scan.records.len();
    assert!(n >= 2, "{n} records");
    let r = scan.records[..n - 1]
        .iter()
        .find(|r| r.sectors >= 2)
        .unwrap();
    let at = geo.log_offset + u64::from(r.header.lsn.block()) * 512 + 512;
    let mut b = cilfs_device::AlignedBuf::zeroed(512);
    dev.read(at, &mut b).unwrap();
    b[100] ^= 0x10;
    dev.write(at, &b, WriteFlags::FUA).unwrap();
    scan.checkpoints.len() as u64
}

fn names_in_root(fs: &Fs) -> Vec<String> {
    let mut v: Vec<String> = fs
        .readdir(ROOT_INO, 0, 10_000)
        .unwrap()
        .into_iter()
        .map(|(e, _)| String::from_utf8(e.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    v.sort();
    v
}

#[test]
fn damage_in_the_middle_of_the_log_refuses_the_mount_and_salvage_keeps_what_precedes_it() {
    let dev = fsynced_files(12);
    let checkpoints = damage_a_middle_record(&dev);
    let refused = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg());
    let Err(JournalError::DamagedLog(what)) = refused else {
        panic!("a log damaged before committed checkpoints mounted: {refused:?}");
    };
    let msg = JournalError::DamagedLog(what.clone()).to_string();
    assert!(msg.contains("is damaged at lsn"), "{msg}");
    assert!(msg.contains("cilfs repair"), "names the way out: {msg}");
    // Refusing wrote nothing: refused again.
    assert!(matches!(
        Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()),
        Err(JournalError::DamagedLog(_))
    ));

    let j = Journal::open_salvage(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    let report = j.recovery_report().clone();
    assert!(report.damaged);
    assert!(report.checkpoints_replayed < checkpoints);
    assert!(report
        .torn
        .as_deref()
        .unwrap()
        .contains("committed checkpoint"));
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    assert_clean(&fs);
    let kept = names_in_root(&fs);
    // Files are fsynced in order: what survives is f0.. up to some point.
    for (i, n) in kept.iter().enumerate() {
        let ino = fs.lookup(ROOT_INO, n.as_bytes()).unwrap().ino;
        let k: usize = n[1..].parse().unwrap();
        assert_eq!(fs.read(ino, 0, 200).unwrap(), vec![k as u8 + 1; 100], "{n}");
        let _ = i;
    }
    assert!(
        kept.len() < 12,
        "salvage cannot keep what lies past the damage"
    );
    fs.unmount().unwrap();
    drop(fs);
    // The log starts again after salvage: a plain mount works and finds the same files.
    let j = Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).unwrap();
    let fs = Fs::open(j, FsOptions::default()).unwrap();
    assert_eq!(names_in_root(&fs), kept);
    assert_clean(&fs);
}

#[test]
fn a_check_of_a_damaged_log_reports_it_and_checks_the_rest() {
    let dev = fsynced_files(12);
    damage_a_middle_record(&dev);
    let (report, recovery) = check::check_image(dev.clone() as Arc<dyn Device>, None).unwrap();
    assert!(recovery.damaged);
    assert!(
        report
            .problems
            .first()
            .is_some_and(|p| p.starts_with("log: the log is damaged")),
        "{:?}",
        report.problems
    );
    assert!(report.inodes >= 1, "the rest was checked");
}
