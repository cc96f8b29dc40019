use crate::Failure;
use cilfs_core::journal::scan;
use cilfs_core::log::record::{OpKind, RecordHeader, OP_CONTINUATION, OP_CONTINUED};
use cilfs_core::log::recover::LogEnd;
use cilfs_core::LogLocation;
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image file or block device
    image: PathBuf,
    /// The external log device, if the filesystem has one
    #[arg(long)]
    logdev: Option<PathBuf>,
    /// One JSON object instead of text
    #[arg(long)]
    json: bool,
}

fn kind_name(k: OpKind) -> &'static str {
    match k {
        OpKind::Start => "start",
        OpKind::Item => "item",
        OpKind::Commit => "commit",
        OpKind::Unmount => "unmount",
    }
}

fn flag_names(f: u8) -> String {
    let mut v = Vec::new();
    if f & OP_CONTINUED != 0 {
        v.push("continued");
    }
    if f & OP_CONTINUATION != 0 {
        v.push("continuation");
    }
    v.join(",")
}

pub fn run(a: Args) -> Result<(), Failure> {
    let opts = FileDeviceOptions {
        read_only: true,
        ..Default::default()
    };
    let data = FileDevice::open(&a.image, opts).map_err(Failure::usage)?;
    let logdev = a
        .logdev
        .as_deref()
        .map(|p| FileDevice::open(p, opts))
        .transpose()
        .map_err(Failure::usage)?;
    let logdev_ref = logdev.as_ref().map(|d| d as &dyn Device);
    let (geo, s) = scan(&data, logdev_ref)
        .map_err(|e| Failure::usage(anyhow::anyhow!("{}: {e}", a.image.display())))?;
    // A log whose first sector is neither zero nor a record holds garbage, not an empty log.
    if s.records.is_empty() {
        let dev: &dyn Device = match geo.log {
            LogLocation::Internal => &data,
            LogLocation::External { .. } => logdev_ref.unwrap_or(&data),
        };
        let mut first = [0u8; 512];
        dev.read(geo.log_offset, &mut first)
            .map_err(Failure::usage)?;
        if first.iter().any(|&b| b != 0) {
            let why = RecordHeader::decode(&first)
                .err()
                .map_or_else(|| "no valid record".to_string(), |e| e.to_string());
            return Err(Failure::usage(anyhow::anyhow!(
                "log byte 0 (device byte {}): not a log record: {why}",
                geo.log_offset
            )));
        }
    }
    let end = match &s.end {
        LogEnd::Clean => "clean".to_string(),
        LogEnd::Full => "the whole log is valid".to_string(),
        LogEnd::Torn { lsn, reason } => format!(
            "torn write discarded at lsn {lsn} (log byte {}): {reason}",
            u64::from(lsn.block()) * 512
        ),
        LogEnd::Damaged { lsn, .. } => format!(
            "damaged at lsn {lsn} (log byte {}): {}",
            u64::from(lsn.block()) * 512,
            s.end.describe().unwrap_or_default()
        ),
    };
    if a.json {
        let records: Vec<_> = s
            .records
            .iter()
            .map(|r| {
                json!({
                    "lsn": r.header.lsn.to_string(),
                    "log_byte": u64::from(r.header.lsn.block()) * 512,
                    "cycle": r.header.cycle,
                    "sectors": r.sectors,
                    "payload_bytes": r.header.payload_len,
                    "tail": r.header.tail.to_string(),
                    "generation": r.header.generation,
                    "crc": format!("{:#010x}", r.header.crc),
                    "crc_ok": true,
                    "ops": r.ops.iter().map(|o| json!({
                        "tid": o.tid, "kind": kind_name(o.kind), "flags": flag_names(o.flags),
                        "len": o.len, "blkno": o.blkno,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let checkpoints: Vec<_> = s
            .checkpoints
            .iter()
            .map(|c| json!({"seq": c.seq, "start": c.start.to_string(), "commit": c.commit.to_string(), "items": c.items.len()}))
            .collect();
        let out = json!({
            "records": records,
            "checkpoints": checkpoints,
            "uncommitted": s.uncommitted,
            "log_offset": geo.log_offset,
            "head": s.head.to_string(),
            "tail": s.tail.to_string(),
            "unmounted": s.unmounted,
            "end": end,
        });
        println!("{out:#}");
        return Ok(());
    }
    for r in &s.records {
        let h = &r.header;
        println!(
            "record lsn {} (log byte {}) cycle {} sectors {} payload {} tail {} generation {} crc {:#010x} ok",
            h.lsn,
            u64::from(h.lsn.block()) * 512,
            h.cycle,
            r.sectors,
            h.payload_len,
            h.tail,
            h.generation,
            h.crc
        );
        for o in &r.ops {
            let blk = o.blkno.map(|b| format!(" block {b}")).unwrap_or_default();
            let fl = flag_names(o.flags);
            println!(
                "  op tid {} {}{} len {}{blk}",
                o.tid,
                kind_name(o.kind),
                if fl.is_empty() {
                    String::new()
                } else {
                    format!(" [{fl}]")
                },
                o.len
            );
        }
    }
    for c in &s.checkpoints {
        println!(
            "checkpoint {} start {} commit {} items {}",
            c.seq,
            c.start,
            c.commit,
            c.items.len()
        );
    }
    println!(
        "{} records, {} committed checkpoints, {} uncommitted, tail {}, head {}, {}{}",
        s.records.len(),
        s.checkpoints.len(),
        s.uncommitted.len(),
        s.tail,
        s.head,
        if s.unmounted {
            "cleanly unmounted, "
        } else {
            ""
        },
        end
    );
    Ok(())
}
