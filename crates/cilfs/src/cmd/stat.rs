//! `cilfs stat DIR [--all] [--json] [--watch]`: what a mounted filesystem holds and does. A
//! summary first (space and inodes from statvfs, rates from two readings of the counters a
//! second apart, the transport and the data mode), then with `--all` every counter, read from
//! the root's `user.cilfs.stats` xattr (nothing is added to the namespace). `cilfs stat
//! --change FILE` prints a file's change attribute.

use crate::Failure;
use anyhow::anyhow;
use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The mount point (or, with --change, any file of a mounted cilfs)
    path: PathBuf,
    /// Print the file's change attribute (NFSv4 change, i_version) instead
    #[arg(long)]
    change: bool,
    /// Every counter too, below the summary, each with its rate over the last second
    #[arg(short, long)]
    all: bool,
    /// Every counter as one JSON object, at once (no summary, no rates)
    #[arg(long)]
    json: bool,
    /// Print again every second (redrawn in place on a terminal)
    #[arg(long)]
    watch: bool,
}

/// The counters as the daemon lists them, in its order.
type Counters = Vec<(String, u64)>;

/// How far apart the two readings that give the rates are.
const INTERVAL: Duration = Duration::from_secs(1);

/// An xattr of a file on a mounted cilfs (the daemon's virtual ones: counters, change
/// attribute, tenants).
pub(crate) fn xattr(path: &Path, name: &str) -> Result<Vec<u8>, Failure> {
    let mut buf = vec![0u8; 64 * 1024];
    let n = rustix::fs::getxattr(path, name, &mut buf[..]).map_err(|e| {
        Failure::usage(anyhow!(
            "{}: reading {name}: {e} (is it a mounted cilfs?)",
            path.display()
        ))
    })?;
    buf.truncate(n);
    Ok(buf)
}

fn counters(dir: &Path) -> Result<Counters, Failure> {
    let text = String::from_utf8(xattr(dir, "user.cilfs.stats")?)
        .map_err(|_| Failure::usage(anyhow!("malformed counters")))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

/// Each counter of `now` per second since `prev`, read `secs` earlier, matched by name: the
/// daemon lists some counters only once they are non-zero (`requests_<opcode>`), so the same
/// position may hold another counter in the next reading. A counter `prev` lacks has no rate;
/// one that fell (a gauge: `ail_len`, `cache_buffers`) has a negative one.
pub(crate) fn rates(prev: &[(String, u64)], now: &[(String, u64)], secs: f64) -> Vec<Option<f64>> {
    let before: HashMap<&str, u64> = prev.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    now.iter()
        .map(|(k, v)| {
            let was = *before.get(k.as_str())?;
            (secs > 0.0).then(|| (*v as f64 - was as f64) / secs)
        })
        .collect()
}

/// What statvfs says of the mount.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Space {
    pub block: u64,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
}

fn space(dir: &Path) -> Result<Space, Failure> {
    let s = rustix::fs::statvfs(dir)
        .map_err(|e| Failure::usage(anyhow!("{}: statvfs: {e}", dir.display())))?;
    Ok(Space {
        block: s.f_frsize,
        blocks: s.f_blocks,
        bfree: s.f_bfree,
        bavail: s.f_bavail,
        files: s.f_files,
        ffree: s.f_ffree,
    })
}

/// `bytes` in binary units, one decimal above bytes.
pub(crate) fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes.abs() < 1024.0 {
        return format!("{bytes:.0} B");
    }
    let mut v = bytes / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v.abs() < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// A count with thousands separators: inode and operation counts run to millions.
pub(crate) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate rounded to a whole number, with its sign.
fn signed(rate: f64) -> String {
    let r = rate.round();
    let sign = if r < 0.0 { "-" } else { "+" };
    format!("{sign}{}", grouped(r.abs() as u64))
}

/// The summary's lines: space and inodes from statvfs; operations, log writes, fsyncs and file
/// data per second from two readings `secs` apart (the statfs this command makes between them,
/// one each interval, is not counted); the transport and the data mode.
pub(crate) fn summary(prev: &Counters, now: &Counters, secs: f64, s: &Space) -> Vec<String> {
    let value = |k: &str| now.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    let per_sec = |k: &str, own: u64| -> Option<f64> {
        let was = prev.iter().find(|(n, _)| n == k)?.1;
        let delta = value(k)?.saturating_sub(was).saturating_sub(own);
        (secs > 0.0).then(|| delta as f64 / secs)
    };
    let count = |r: Option<f64>| r.map_or("?".to_string(), |r| grouped(r.round() as u64));
    let bytes = |r: Option<f64>| r.map_or("?".to_string(), human_bytes);
    let mut lines = Vec::new();
    let used = s.blocks.saturating_sub(s.bfree);
    let pct = |part: u64, whole: u64| {
        if whole == 0 {
            0
        } else {
            (u128::from(part) * 100).div_ceil(u128::from(whole))
        }
    };
    lines.push(format!(
        "space       {} used, {} available, of {} ({}% used)",
        human_bytes((u128::from(used) * u128::from(s.block)) as f64),
        human_bytes((u128::from(s.bavail) * u128::from(s.block)) as f64),
        human_bytes((u128::from(s.blocks) * u128::from(s.block)) as f64),
        pct(used, s.blocks)
    ));
    lines.push(format!(
        "inodes      {} used, {} free (no fixed count: as many as there are free blocks)",
        grouped(s.files.saturating_sub(s.ffree)),
        grouped(s.ffree)
    ));
    lines.push(format!("operations  {}/s", count(per_sec("operations", 1))));
    lines.push(format!(
        "log         {} writes/s, {}/s; {} fsyncs/s",
        count(per_sec("iclog_writes", 0)),
        bytes(per_sec("log_bytes", 0)),
        count(per_sec("fsyncs", 0))
    ));
    lines.push(format!(
        "file data   {}/s read, {}/s written",
        bytes(per_sec("file_read_bytes", 0)),
        bytes(per_sec("file_write_bytes", 0))
    ));
    let transport = match value("transport_uring") {
        Some(1) => format!(
            "io_uring, {} queues with {} entries in all",
            value("uring_queues").unwrap_or(0),
            value("uring_entries").unwrap_or(0)
        ),
        Some(_) => "/dev/fuse reads".to_string(),
        None => "unknown".to_string(),
    };
    lines.push(format!("transport   {transport}"));
    let data = match value("data_ordered") {
        Some(1) => "ordered (new blocks are written before the metadata that maps them)",
        Some(0) => "writeback (metadata may commit before the data it maps)",
        _ => "unknown (a daemon older than this cilfs)",
    };
    lines.push(format!("data mode   {data}"));
    lines
}

/// Every counter, with its rate where `prev` has it.
fn raw_lines(prev: &Counters, now: &Counters, secs: f64) -> Vec<String> {
    now.iter()
        .zip(rates(prev, now, secs))
        .map(|((k, v), r)| {
            let rate = r
                .map(|r| format!("  ({}/s)", signed(r)))
                .unwrap_or_default();
            format!("{k:<26} {v}{rate}")
        })
        .collect()
}

pub fn run(a: Args) -> Result<(), Failure> {
    if a.change {
        let v = String::from_utf8(xattr(&a.path, "user.cilfs.change")?)
            .map_err(|_| Failure::usage(anyhow!("malformed change attribute")))?;
        if a.json {
            println!(
                "{{\"path\":{},\"change\":{v}}}",
                serde_json::json!(a.path.display().to_string())
            );
        } else {
            println!("{v}");
        }
        return Ok(());
    }
    if a.json {
        return json(&a);
    }
    // On a terminal each reading replaces the last; into a file or pipe they follow each other.
    let redraw = a.watch && std::io::stdout().is_terminal();
    let mut prev = counters(&a.path)?;
    let mut at = Instant::now();
    loop {
        std::thread::sleep(INTERVAL);
        let s = space(&a.path)?;
        let now = counters(&a.path)?;
        let secs = at.elapsed().as_secs_f64();
        at = Instant::now();
        if redraw {
            // Cursor home, clear the screen.
            crate::out::print(format_args!("\x1b[H\x1b[2J"));
        }
        println!("{}: rates over the last {secs:.1} s", a.path.display());
        for l in summary(&prev, &now, secs, &s) {
            println!("{l}");
        }
        if a.all {
            println!();
            for l in raw_lines(&prev, &now, secs) {
                println!("{l}");
            }
        } else if !a.watch {
            println!("(cilfs stat --all for every counter)");
        }
        // A reader that went away (`| head`) ends the watch.
        if !a.watch || crate::out::closed() {
            return Ok(());
        }
        if !redraw {
            println!();
        }
        prev = now;
    }
}

/// `--json`: the counters as they are, one object a reading.
fn json(a: &Args) -> Result<(), Failure> {
    loop {
        let obj: serde_json::Map<String, serde_json::Value> = counters(&a.path)?
            .into_iter()
            .map(|(k, v)| (k, serde_json::json!(v)))
            .collect();
        println!("{}", serde_json::Value::Object(obj));
        if !a.watch || crate::out::closed() {
            return Ok(());
        }
        std::thread::sleep(INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pairs: &[(&str, u64)]) -> Counters {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// A counter listed for the first time pushes the others down a place: each keeps its
    /// own rate, and the new one has none.
    #[test]
    fn a_counter_appearing_between_readings_has_no_rate_and_moves_no_other() {
        let prev = sample(&[("requests_getxattr", 2), ("requests_statfs", 4)]);
        let now = sample(&[
            ("requests_getattr", 1),
            ("requests_getxattr", 3),
            ("requests_statfs", 7),
        ]);
        assert_eq!(rates(&prev, &now, 1.0), vec![None, Some(1.0), Some(3.0)]);
        assert_eq!(rates(&prev, &now, 2.0), vec![None, Some(0.5), Some(1.5)]);
    }

    #[test]
    fn a_falling_counter_has_a_negative_rate() {
        let prev = sample(&[("ail_len", 10), ("commits", 5)]);
        let now = sample(&[("ail_len", 4), ("commits", 5)]);
        assert_eq!(rates(&prev, &now, 2.0), vec![Some(-3.0), Some(0.0)]);
        let lines = raw_lines(&prev, &now, 2.0);
        assert!(lines[0].ends_with("4  (-3/s)"), "{lines:?}");
        assert!(lines[1].ends_with("5  (+0/s)"), "{lines:?}");
    }

    #[test]
    fn a_counter_gone_from_the_second_reading_is_not_listed_and_no_time_gives_no_rate() {
        let prev = sample(&[("a", 1), ("b", 2)]);
        let now = sample(&[("b", 3)]);
        assert_eq!(rates(&prev, &now, 1.0), vec![Some(1.0)]);
        assert_eq!(rates(&prev, &now, 0.0), vec![None]);
    }

    #[test]
    fn the_summary_speaks_in_human_units_and_leaves_out_its_own_statfs() {
        let prev = sample(&[
            ("operations", 100),
            ("iclog_writes", 10),
            ("log_bytes", 0),
            ("fsyncs", 0),
            ("file_read_bytes", 0),
            ("file_write_bytes", 0),
            ("data_ordered", 1),
            ("transport_uring", 1),
        ]);
        let mut now = prev.clone();
        for (k, v) in &mut now {
            match k.as_str() {
                "operations" => *v = 301,
                "iclog_writes" => *v = 30,
                "log_bytes" => *v = 3 << 20,
                "file_write_bytes" => *v = 1 << 30,
                _ => {}
            }
        }
        now.push(("uring_queues".into(), 2));
        now.push(("uring_entries".into(), 256));
        let space = Space {
            block: 4096,
            blocks: 262_144,
            bfree: 196_608,
            bavail: 196_000,
            files: 196_003,
            ffree: 196_000,
        };
        let text = summary(&prev, &now, 2.0, &space).join("\n");
        for want in [
            "space       256.0 MiB used, 765.6 MiB available, of 1.0 GiB (25% used)",
            "inodes      3 used, 196,000 free",
            "operations  100/s",
            "log         10 writes/s, 1.5 MiB/s; 0 fsyncs/s",
            "file data   0 B/s read, 512.0 MiB/s written",
            "transport   io_uring, 2 queues with 256 entries in all",
            "data mode   ordered",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
    }

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(signed(-1234.4), "-1,234");
        assert_eq!(human_bytes(1023.0), "1023 B");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
    }
}
