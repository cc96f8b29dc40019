//! `cilfs bench fs`: the filesystem core alone (no FUSE) on an image file: creates, unlinks,
//! 1-byte overwrites (lazy or eager change attribute, optionally with a thread querying the
//! change attribute in a tight loop) and fsyncs, with the journal's counters.

use crate::Failure;
use cilfs_core::fs::types::Cred;
use cilfs_core::fs::{Fs, FsOptions, IversionMode, ROOT_INO};
use cilfs_core::journal::{Journal, JournalConfig, PushMode};
use cilfs_core::mkfs::{plan, MkfsRequest};
use cilfs_device::{Device, FileDevice, FileDeviceOptions};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Empty files created in a directory per thread
    Create,
    /// Unlinking files created beforehand
    Unlink,
    /// 1-byte overwrites inside a 1 MiB file per thread (no size change)
    Write1,
    /// 4 KiB write then fsync, per thread (group commit across threads)
    Fsync,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Iversion {
    Lazy,
    Eager,
}

#[derive(Debug, clap::Args)]
pub struct FsArgs {
    #[arg(long, value_enum)]
    workload: Workload,
    /// Change attribute maintenance
    #[arg(long, value_enum, default_value = "lazy")]
    iversion: Iversion,
    /// A thread querying the change attribute of the written files in a tight loop
    #[arg(long)]
    querier: bool,
    /// Threads running the workload
    #[arg(long, default_value_t = 1)]
    threads: u64,
    /// All threads work in one directory instead of one each
    #[arg(long)]
    shared_dir: bool,
    /// Run time, unless --ops is reached first [default: 5, or none with --ops]
    #[arg(long, value_parser = super::bench_measure::positive_seconds)]
    seconds: Option<f64>,
    /// Stop after this many operations (all threads together): a fixed amount of work, as
    /// callgrind needs (a run under valgrind is far slower than the 5 s default allows)
    #[arg(long)]
    ops: Option<u64>,
    /// Log size, as mkfs's --log-size [default: mkfs's for 8 GiB, 64 MiB]
    #[arg(long, value_parser = crate::size::parse_size)]
    log_size: Option<u64>,
    /// Directory for the image [default: $TMPDIR or /tmp]
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print one JSON object on one line
    #[arg(long)]
    json: bool,
}

pub fn run(a: FsArgs) -> Result<(), Failure> {
    let usage = |m: String| Failure::usage(anyhow::anyhow!(m));
    if a.threads == 0 || a.threads > 256 {
        return Err(usage("--threads must be in 1..256".into()));
    }
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::Builder::new()
        .prefix("cilfs-bench-")
        .tempdir_in(&dir)
        .map_err(|e| usage(format!("{}: {e}", dir.display())))?;
    let image = tmp.path().join("fs.img");
    let req = MkfsRequest {
        image: image.clone(),
        size: Some(8 << 30),
        block_size: 4096,
        log_size: a.log_size,
        logdev: None,
        force: false,
    };
    eprintln!(
        "bench fs: making an 8 GiB filesystem in {}",
        tmp.path().display()
    );
    plan(&req)
        .and_then(|p| p.execute((0, 0), &mut |_, _| {}))
        .map_err(Failure::usage)?;
    let data: Arc<dyn Device> =
        Arc::new(FileDevice::open(&image, FileDeviceOptions::default()).map_err(Failure::usage)?);
    let j = Journal::open(
        Arc::clone(&data),
        None,
        JournalConfig {
            push_mode: PushMode::Background,
            ..JournalConfig::default()
        },
    )
    .map_err(Failure::usage)?;
    let opts = FsOptions {
        iversion: match a.iversion {
            Iversion::Lazy => IversionMode::Lazy,
            Iversion::Eager => IversionMode::Eager,
        },
        ..FsOptions::default()
    };
    let fs = Fs::open(Arc::clone(&j), opts).map_err(Failure::usage)?;
    let c = Cred::ROOT;
    // Per-thread setup: a directory, and the file the thread writes or the files it unlinks.
    let mut targets = Vec::new();
    let shared = if a.shared_dir {
        let d = fs
            .mkdir(c, ROOT_INO, b"shared", 0o755)
            .map_err(Failure::usage)?;
        Some(d.ino)
    } else {
        None
    };
    for t in 0..a.threads {
        let d = match shared {
            Some(d) => d,
            None => {
                fs.mkdir(c, ROOT_INO, format!("t{t}").as_bytes(), 0o755)
                    .map_err(Failure::usage)?
                    .ino
            }
        };
        let f = fs
            .mknod(c, d, format!("file{t}").as_bytes(), 0o100_644, 0)
            .map_err(Failure::usage)?
            .ino;
        if matches!(a.workload, Workload::Write1) {
            fs.write(c, f, 0, &vec![1u8; 1 << 20])
                .map_err(Failure::usage)?;
        }
        targets.push((d, f));
    }
    let prepared = if a.workload == Workload::Unlink {
        let per = a.ops.map_or(200_000, |n| n.div_ceil(a.threads));
        eprintln!("bench fs: creating {} files to unlink", per * a.threads);
        for (t, &(d, _)) in targets.iter().enumerate() {
            for i in 0..per {
                fs.mknod(c, d, format!("u{t}-{i}").as_bytes(), 0o100_644, 0)
                    .map_err(Failure::usage)?;
            }
        }
        per
    } else {
        0
    };
    fs.sync().map_err(Failure::usage)?;
    let base = fs.stats();
    let base_locks = fs.lock_waits();
    let base_j = j.stats();
    let base_dev = data.stats();
    let ops = AtomicU64::new(0);
    let queries = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failed: parking_lot::Mutex<Option<String>> = parking_lot::Mutex::new(None);
    let limit = a.ops.unwrap_or(u64::MAX);
    // --ops alone runs to its count, however long it takes.
    let seconds = a.seconds.or(if a.ops.is_some() { None } else { Some(5.0) });
    let deadline = seconds.map_or(Duration::MAX, Duration::from_secs_f64);
    eprintln!(
        "bench fs: {:?} on {} threads{}{} for {}",
        a.workload,
        a.threads,
        if a.shared_dir {
            " in one directory"
        } else {
            ""
        },
        if a.querier { " with a querier" } else { "" },
        seconds.map_or("its operations".to_string(), |s| format!("{s} s"))
    );
    let cpu_before = super::bench_measure::thread_cpu_ns();
    let worker_ns = AtomicU64::new(0);
    // Workers that ended (an unlink worker ends when its files are gone): the run ends with
    // the last of them, not at the deadline, or its rate would count time nobody worked.
    let ended = AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for (t, &(d, f)) in targets.iter().enumerate() {
            let (fs, ops, stop, failed, a) = (&fs, &ops, &stop, &failed, &a);
            let (worker_ns, ended) = (&worker_ns, &ended);
            // Named, so that their CPU time is told from the journal's threads'.
            let worker = std::thread::Builder::new().name(format!("bench-worker-{t}"));
            let spawned = worker.spawn_scoped(s, move || {
                let cpu_at_start = super::bench_measure::own_cpu_ns();
                let mut i = 0u64;
                let block = vec![t as u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    let r = match a.workload {
                        Workload::Create => fs
                            .mknod(c, d, format!("c{t}-{i}").as_bytes(), 0o100_644, 0)
                            .map(|_| ()),
                        Workload::Unlink => {
                            if i >= prepared {
                                break;
                            }
                            fs.unlink(d, format!("u{t}-{i}").as_bytes())
                        }
                        Workload::Write1 => fs.write(c, f, i % (1 << 20), &[i as u8]).map(|_| ()),
                        Workload::Fsync => fs
                            .write(c, f, (i % 256) * 4096, &block)
                            .and_then(|_| fs.fsync(f)),
                    };
                    if let Err(e) = r {
                        *failed.lock() = Some(e.to_string());
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                    i += 1;
                    if ops.fetch_add(1, Ordering::Relaxed) + 1 >= limit {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                // Counted here: a worker is gone by the time the others are looked at.
                let ran = super::bench_measure::own_cpu_ns().saturating_sub(cpu_at_start);
                worker_ns.fetch_add(ran, Ordering::Relaxed);
                ended.fetch_add(1, Ordering::Release);
            });
            if let Err(e) = spawned {
                *failed.lock() = Some(format!("cannot start a thread: {e}"));
                stop.store(true, Ordering::Relaxed);
            }
        }
        if a.querier {
            let (fs, stop, queries, targets) = (&fs, &stop, &queries, &targets);
            s.spawn(move || {
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    let _ = fs.change_attr(targets[k % targets.len()].1);
                    queries.fetch_add(1, Ordering::Relaxed);
                    k += 1;
                }
            });
        }
        while !stop.load(Ordering::Relaxed)
            && start.elapsed() < deadline
            && ended.load(Ordering::Acquire) < targets.len()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = start.elapsed().as_secs_f64();
    if a.workload == Workload::Unlink && seconds.is_some_and(|s| elapsed < s) {
        eprintln!(
            "bench fs: the {prepared} files of each thread were gone after {elapsed:.2} s (more with --ops)"
        );
    }
    let mut cpu =
        super::bench_measure::cpu_s_by_role(&cpu_before, &super::bench_measure::thread_cpu_ns());
    cpu.insert(
        "bench-worker".into(),
        worker_ns.load(Ordering::Relaxed) as f64 / 1e9,
    );
    if let Some(e) = failed.lock().take() {
        return Err(usage(format!("workload failed: {e}")));
    }
    let st = fs.stats();
    let locks: Vec<serde_json::Value> = fs
        .lock_waits()
        .iter()
        .zip(&base_locks)
        .map(|(l, b)| {
            let l = l.since(b);
            // Waiting against the workload threads' time: the target is no lock above 10% (docs/concurrency.md).
            let thread_ns = elapsed * 1e9 * a.threads as f64;
            json!({
                "lock": l.name,
                "acquired": l.acquired,
                "contended": l.contended,
                "wait_ms": l.wait_ns as f64 / 1e6,
                "wait_share_of_thread_time": l.wait_ns as f64 / thread_ns,
            })
        })
        .collect();
    let js = j.stats();
    let dev = data.stats();
    let n = ops.load(Ordering::Relaxed);
    fs.unmount().map_err(Failure::usage)?;
    let inode_relogs = st.inode_logs - base.inode_logs;
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let out = json!({
        "config": {
            "workload": format!("{:?}", a.workload).to_lowercase(),
            "iversion": format!("{:?}", a.iversion).to_lowercase(),
            "querier": a.querier, "threads": a.threads, "seconds": seconds,
            "shared_dir": a.shared_dir,
            "tsgran_ns": fs.options().tsgran_ns,
        },
        "elapsed_s": elapsed,
        "ops": n,
        "ops_per_s": n as f64 / elapsed,
        "inode_relogs": inode_relogs,
        "inode_relogs_per_million_ops": inode_relogs as f64 * 1e6 / n.max(1) as f64,
        "timestamp_ticks_elapsed": (elapsed * 1e9 / f64::from(fs.options().tsgran_ns)).floor(),
        "change_bumps": st.change_bumps - base.change_bumps,
        "change_bumps_skipped": st.change_bumps_skipped - base.change_bumps_skipped,
        "change_queries": queries.load(Ordering::Relaxed),
        "transactions": st.transactions - base.transactions,
        "conflicts": st.conflicts - base.conflicts,
        "shared_publishes": st.shared_publishes - base.shared_publishes,
        "retries_reshaped": st.retries_reshaped - base.retries_reshaped,
        "retries_freeing": st.retries_freeing - base.retries_freeing,
        "retries_read": st.retries_read - base.retries_read,
        "checkpoints": d(js.log.checkpoints, base_j.log.checkpoints),
        "iclog_writes": d(js.log.iclog_writes, base_j.log.iclog_writes),
        "log_bytes": d(js.log.log_bytes, base_j.log.log_bytes),
        "items_logged": d(js.items_logged, base_j.items_logged),
        "ail_writeback_bytes": d(js.ail_writeback_bytes, base_j.ail_writeback_bytes),
        "noiclog_waits": d(js.log.noiclog_waits, base_j.log.noiclog_waits),
        "log_forces": d(js.log.log_forces, base_j.log.log_forces),
        "flushes_issued": d(dev.flushes_issued, base_dev.flushes_issued),
        "flushes_elided": d(dev.flushes_elided, base_dev.flushes_elided),
        "fua_writes": d(dev.fua_writes, base_dev.fua_writes),
        "preflush_writes": d(dev.preflush_writes, base_dev.preflush_writes),
        "cil_bytes_max": js.cil_bytes_max,
        "rss_max_bytes": super::bench_measure::rss_max_bytes(),
        // Where the CPU went: the workload's threads against the journal's (push, iclog
        // writers, AIL), which take the same cores once every core runs a worker.
        "cpu_s_by_thread": cpu,
        "lock_waits": locks,
    });
    if a.json {
        println!("{out}");
    } else {
        println!("{out:#}");
    }
    Ok(())
}
