//! `cilfs stat DIR [--json] [--watch]`: live counters of a mounted filesystem, read from the
//! root's `user.cilfs.stats` xattr (nothing is added to the namespace); `cilfs stat --change
//! FILE` prints a file's change attribute.

use crate::Failure;
use anyhow::anyhow;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The mount point (or, with --change, any file of a mounted cilfs)
    path: PathBuf,
    /// Print the file's change attribute (NFSv4 change, i_version) instead
    #[arg(long)]
    change: bool,
    /// One JSON object
    #[arg(long)]
    json: bool,
    /// Print again every second, with rates
    #[arg(long)]
    watch: bool,
}

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

fn counters(dir: &Path) -> Result<Vec<(String, u64)>, Failure> {
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
    let mut prev: Option<Vec<(String, u64)>> = None;
    loop {
        let now = counters(&a.path)?;
        if a.json {
            let obj: serde_json::Map<String, serde_json::Value> = now
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::json!(v)))
                .collect();
            println!("{}", serde_json::Value::Object(obj));
        } else {
            for (i, (k, v)) in now.iter().enumerate() {
                let rate = prev
                    .as_ref()
                    .and_then(|p| p.get(i))
                    .map(|(_, pv)| format!("  (+{}/s)", v.saturating_sub(*pv)))
                    .unwrap_or_default();
                println!("{k:<26} {v}{rate}");
            }
        }
        // A reader that went away (`| head`) ends the watch.
        if !a.watch || crate::out::closed() {
            return Ok(());
        }
        if !a.json {
            println!();
        }
        prev = Some(now);
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}
