//! `cilfs bench dir`: one directory grown to `--entries` names on the filesystem core (no
//! FUSE), with lookup, readdir and create figures at each power of ten, then every name
//! unlinked and the filesystem checked.

use crate::Failure;
use cilfs_core::check;
use cilfs_core::fs::types::Cred;
use cilfs_core::fs::{Fs, FsOptions, ROOT_INO};
use cilfs_core::journal::{Journal, JournalConfig, PushMode};
use cilfs_core::mkfs::{plan, MkfsRequest};
use cilfs_device::rng::SimRng;
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct DirArgs {
    /// Names to create in the directory
    #[arg(long, default_value_t = 1_000_000)]
    entries: u64,
    /// Lookups timed at each step
    #[arg(long, default_value_t = 20_000)]
    lookups: u64,
    /// Inodes kept in memory [default: the filesystem's, sized from the machine's memory]
    #[arg(long)]
    inode_cache: Option<usize>,
    /// Directory for the image [default: $TMPDIR or /tmp]
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn name(i: u64) -> Vec<u8> {
    format!("entry-{i:08}").into_bytes()
}

pub fn run(a: DirArgs) -> Result<(), Failure> {
    let usage = |m: String| Failure::usage(anyhow::anyhow!(m));
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::Builder::new()
        .prefix("cilfs-bench-")
        .tempdir_in(&dir)
        .map_err(|e| usage(format!("{}: {e}", dir.display())))?;
    let image = tmp.path().join("dir.img");
    let req = MkfsRequest {
        image: image.clone(),
        size: Some((4u64 << 30).max(a.entries * 1024)),
        block_size: 4096,
        log_size: None,
        logdev: None,
        force: false,
    };
    plan(&req)
        .and_then(|p| p.execute((0, 0), &mut |_, _| {}))
        .map_err(Failure::usage)?;
    let data: Arc<dyn Device> =
        Arc::new(FileDevice::open(&image, FileDeviceOptions::default()).map_err(Failure::usage)?);
    let cfg = JournalConfig {
        push_mode: PushMode::Background,
        ..JournalConfig::default()
    };
    let j = Journal::open(data, None, cfg).map_err(Failure::usage)?;
    let inode_cache = a
        .inode_cache
        .unwrap_or_else(cilfs_core::fs::default_inode_cache_max);
    let fs = Fs::open(
        Arc::clone(&j),
        FsOptions {
            inode_cache_max: inode_cache,
            ..FsOptions::default()
        },
    )
    .map_err(Failure::usage)?;
    let d = fs
        .mkdir(Cred::ROOT, ROOT_INO, b"big", 0o755)
        .map_err(Failure::usage)?
        .ino;
    let mut steps = Vec::new();
    let mut made = 0u64;
    let mut target = 1000u64.min(a.entries);
    let mut rng = SimRng::new(7);
    let t_all = Instant::now();
    loop {
        let t = Instant::now();
        while made < target {
            fs.mknod(Cred::ROOT, d, &name(made), 0o100_644, 0)
                .map_err(Failure::usage)?;
            made += 1;
        }
        let create_s = t.elapsed().as_secs_f64();
        // Time lookups on a quiet filesystem: the creates leave checkpoints and metadata write
        // back running in the background, and those would be measured with the lookups.
        fs.sync().map_err(Failure::usage)?;
        fs.journal().cover().map_err(Failure::usage)?;
        let n = a.lookups.min(made);
        let t = Instant::now();
        for _ in 0..n {
            let i = rng.below(made);
            fs.lookup(d, &name(i)).map_err(Failure::usage)?;
        }
        let lookup_ns = t.elapsed().as_nanos() as f64 / n as f64;
        // The same number of lookups over a fixed set of 1000 names: the tree's depth without
        // the memory-hierarchy cost of touching a working set that grows with the directory.
        let hot: Vec<u64> = (0..1000.min(made))
            .map(|k| k * made / 1000.min(made))
            .collect();
        let t = Instant::now();
        for k in 0..n {
            fs.lookup(d, &name(hot[(k % hot.len() as u64) as usize]))
                .map_err(Failure::usage)?;
        }
        let hot_lookup_ns = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        let mut cookie = 0;
        let mut seen = 0u64;
        loop {
            let batch = fs.readdir(d, cookie, 1024).map_err(Failure::usage)?;
            let Some(&(_, next)) = batch.last() else {
                break;
            };
            seen += batch.len() as u64;
            cookie = next;
        }
        let readdir_ns = t.elapsed().as_nanos() as f64 / seen as f64;
        if seen != made + 2 {
            return Err(usage(format!(
                "readdir saw {seen} names, expected {}",
                made + 2
            )));
        }
        let step = json!({
            "entries": made,
            "lookup_ns_per_entry": lookup_ns.round(),
            "hot_set_lookup_ns_per_entry": hot_lookup_ns.round(),
            "readdir_ns_per_entry": readdir_ns.round(),
            "tree_levels": fs.tree_levels(),
            "creates_per_s_this_step": ((target - steps.last().map_or(0, |s: &serde_json::Value| s["entries"].as_u64().unwrap_or(0))) as f64 / create_s).round(),
        });
        eprintln!("bench dir: {step}");
        steps.push(step);
        if made >= a.entries {
            break;
        }
        target = (target * 10).min(a.entries);
    }
    let create_total_s = t_all.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..made {
        fs.unlink(d, &name(i)).map_err(Failure::usage)?;
    }
    let unlink_s = t.elapsed().as_secs_f64();
    fs.rmdir(ROOT_INO, b"big").map_err(Failure::usage)?;
    let report = check::check(&fs).map_err(Failure::usage)?;
    fs.unmount().map_err(Failure::usage)?;
    let out = json!({
        "entries": made,
        "inode_cache": inode_cache,
        "steps": steps,
        "unlinks_per_s": (made as f64 / unlink_s).round(),
        "elapsed_with_measurements_s": create_total_s,
        "check_clean_after_unlinking_all": report.is_clean(),
        "check_problems": report.problems,
        "rss_max_bytes": super::bench_measure::rss_max_bytes(),
    });
    println!("{out}");
    if !report.is_clean() {
        return Err(Failure::found(anyhow::anyhow!("check found problems")));
    }
    Ok(())
}
