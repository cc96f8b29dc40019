//! `cilfs logprint` on a log written by the journal, and on garbage.

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

use cilfs_core::journal::{Journal, JournalConfig};
use cilfs_core::trans::Reservation;
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use std::process::Command;
use std::sync::Arc;

fn cilfs(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cilfs"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn prints_records_checkpoints_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let p = img.to_str().unwrap();
    assert!(
        cilfs(&["mkfs", "-q", "--size", "64M", "--log-size", "4M", p])
            .status
            .success()
    );
    {
        let dev: Arc<dyn Device> =
            Arc::new(FileDevice::open(&img, FileDeviceOptions::default()).unwrap());
        let j = Journal::open(dev, None, JournalConfig::default()).unwrap();
        let first = j.metadata_area().0;
        for i in 0..3u64 {
            let mut tx = j.begin(Reservation::for_buffers(2, 4096)).unwrap();
            // Distinct blocks per transaction: nothing is relogged, so the tail stays at the
            // first record and all three checkpoints remain in the active log.
            for b in 0..2 {
                let h = tx.buf(first + 2 * i + b).unwrap();
                tx.write(h, 0, &[i as u8 + 1; 100]);
            }
            let seq = tx.commit().unwrap();
            j.force(seq).unwrap();
        }
        // Dropped without unmount: the log holds three committed checkpoints.
    }
    let out = cilfs(&["logprint", p]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("3 records, 3 committed checkpoints, 0 uncommitted"),
        "{text}"
    );
    assert!(text.contains("op tid 2 item len"), "{text}");
    let json = cilfs(&["logprint", "--json", p]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["checkpoints"].as_array().unwrap().len(), 3);
    assert_eq!(v["records"][0]["crc_ok"], true);
    // 64 MiB fs, 4 MiB log of 1024 blocks after the front backup superblock (block 256):
    // metadata starts at block 1281.
    assert_eq!(v["records"][0]["ops"][1]["blkno"], 1281);
}

#[test]
fn garbage_log_is_an_error_naming_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let p = img.to_str().unwrap();
    assert!(
        cilfs(&["mkfs", "-q", "--size", "64M", "--log-size", "4M", p])
            .status
            .success()
    );
    let mut bytes = std::fs::read(&img).unwrap();
    // The log's first block: the one after the front backup superblock at 1 MiB.
    let log = (1 << 20) + 4096;
    bytes[log..log + 4096].fill(0x6b);
    std::fs::write(&img, bytes).unwrap();
    let out = cilfs(&["logprint", p]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("log byte 0 (device byte 1052672)"), "{err}");
}
