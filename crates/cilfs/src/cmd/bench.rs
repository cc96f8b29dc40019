use super::bench_measure::{positive_seconds, rss_max_bytes};
use crate::size::parse_size;
use crate::Failure;
use cilfs_core::journal::{Journal, JournalConfig, PushMode};
use cilfs_core::log::{FlushPolicy, LogConfig};
use cilfs_core::mkfs::{write_filesystem, Layout};
use cilfs_core::trans::Reservation;
use cilfs_device::rng::SimRng;
use cilfs_device::{AlignedBuf, Device, FileDevice, FileDeviceOptions, IoStats, WriteFlags};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// In-process committers on the journal alone, over a file device
    Journal(JournalArgs),
    /// One directory grown to a million names on the filesystem core: lookup and readdir cost
    Dir(super::bench_dir::DirArgs),
    /// The filesystem core alone: creates, unlinks, 1-byte writes (lazy/eager change attribute),
    /// fsyncs
    Fs(super::bench_fs::FsArgs),
}

#[derive(Debug, clap::Args)]
pub struct JournalArgs {
    /// Flush policy of the log: reduced, legacy or ail
    #[arg(long, default_value = "reduced")]
    policy: FlushPolicy,
    /// In-core log buffers (2..8)
    #[arg(long, default_value_t = 8)]
    logbufs: u32,
    /// Size of each in-core log buffer (16k..256k)
    #[arg(long, default_value = "256k", value_parser = parse_size)]
    logbsize: u64,
    /// Log size
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    log_size: u64,
    /// Put the log on this file (created) instead of inside the image
    #[arg(long)]
    logdev: Option<PathBuf>,
    /// Committing threads
    #[arg(long, default_value_t = 2)]
    threads: u64,
    /// Run time, unless --commits is reached first
    #[arg(long, default_value_t = 5.0, value_parser = positive_seconds)]
    seconds: f64,
    /// Stop after this many commits
    #[arg(long)]
    commits: Option<u64>,
    /// Working set: distinct metadata blocks (4 KiB each) the transactions pick from
    #[arg(long, default_value_t = 20_000)]
    items: u64,
    /// Bytes each transaction changes in each block it touches
    #[arg(long, default_value_t = 64)]
    item_bytes: u64,
    /// Blocks each transaction touches
    #[arg(long, default_value_t = 4)]
    items_per_tx: u64,
    /// Force the log every N commits per thread (0: never, only background pushes)
    #[arg(long, default_value_t = 0)]
    force_every: u64,
    /// CIL space limit S [default: min(log/8, 16 x logbufs x logbsize)]
    #[arg(long, value_parser = parse_size)]
    cil_limit: Option<u64>,
    /// Issue every flush even with nothing volatile (as a kernel must): for comparing policies the
    /// way pre-5.14 XFS paid for them
    #[arg(long)]
    no_flush_elision: bool,
    /// Memory for cached metadata blocks before clean ones are evicted [default: a sixteenth of
    /// the machine's memory, 128M..2G]
    #[arg(long, value_parser = parse_size)]
    cache_size: Option<u64>,
    /// Directory for the image [default: $TMPDIR or /tmp]
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Skip the warm-up: the timed run then also reads every block of the working set for the
    /// first time and writes back into holes of the sparse image
    #[arg(long)]
    cold: bool,
    /// Print one JSON object
    #[arg(long)]
    json: bool,
}

const BS: u32 = 4096;

/// Before the clock starts: writes the working set's blocks once (the image is sparse, and a
/// first write back into a hole makes the host filesystem allocate, so io_uring hands it to a
/// worker thread: tens of thousands of such writes in the first second of a cold run), then
/// reads them into the buffer cache. The timed run then measures the journal in steady state,
/// as mkfs writing the whole log region does for log writes. The blocks hold zeros before and
/// after, and nothing has logged them yet, so writing them outside a transaction changes nothing.
fn warm_up(j: &Journal, data: &dyn Device, first: u64, items: u64) -> Result<(), Failure> {
    const CHUNK: u64 = 1 << 20;
    let zeros = AlignedBuf::zeroed(CHUNK as usize);
    let (start, end) = (first * u64::from(BS), (first + items) * u64::from(BS));
    let mut at = start;
    while at < end {
        let n = CHUNK.min(end - at);
        data.write(at, &zeros[..n as usize], WriteFlags::NONE)
            .map_err(Failure::usage)?;
        at += n;
    }
    data.flush().map_err(Failure::usage)?;
    for b in first..first + items {
        j.buf(b).map_err(Failure::usage)?;
    }
    Ok(())
}

fn dev_json(s: &IoStats) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields()
            .iter()
            .map(|(k, v)| ((*k).to_string(), json!(v)))
            .collect(),
    )
}

pub fn run(k: Kind) -> Result<(), Failure> {
    match k {
        Kind::Journal(a) => journal(a),
        Kind::Dir(a) => super::bench_dir::run(a),
        Kind::Fs(a) => super::bench_fs::run(a),
    }
}

fn journal(a: JournalArgs) -> Result<(), Failure> {
    let usage = |m: String| Failure::usage(anyhow::anyhow!(m));
    if a.items == 0
        || a.items_per_tx == 0
        || a.items_per_tx > a.items
        || a.item_bytes == 0
        || a.item_bytes > u64::from(BS)
    {
        return Err(usage(format!(
            "need 0 < --items-per-tx <= --items and 0 < --item-bytes <= {BS}"
        )));
    }
    if a.threads == 0 || a.threads > 256 {
        return Err(usage("--threads must be in 1..256".into()));
    }
    let logbsize = u32::try_from(a.logbsize).map_err(|_| usage("--logbsize too large".into()))?;
    let log_cfg = LogConfig {
        logbufs: a.logbufs,
        logbsize,
        policy: a.policy,
    };
    log_cfg.validate(a.log_size).map_err(Failure::usage)?;
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::Builder::new()
        .prefix("cilfs-bench-")
        .tempdir_in(&dir)
        .map_err(|e| usage(format!("{}: {e}", dir.display())))?;
    let image = tmp.path().join("bench.img");
    // Room for the working set after the superblock (and the internal log).
    let internal_log = if a.logdev.is_some() { 0 } else { a.log_size };
    let fs_bytes = ((1 + a.items) * u64::from(BS) + internal_log + (16 << 20))
        .max(2 * internal_log + (16 << 20));
    let layout = Layout::new(
        fs_bytes,
        u64::from(BS),
        Some(a.log_size),
        a.logdev.as_ref().map(|_| a.log_size),
    )
    .map_err(Failure::usage)?;
    let create = |p: &PathBuf, len: u64| -> Result<(), Failure> {
        let f = std::fs::File::create(p).map_err(|e| usage(format!("{}: {e}", p.display())))?;
        f.set_len(len)
            .map_err(|e| usage(format!("{}: {e}", p.display())))
    };
    create(&image, layout.fs_bytes())?;
    if let Some(l) = &a.logdev {
        create(l, u64::from(BS) + layout.log_bytes())?;
    }
    let opts = FileDeviceOptions {
        no_flush_elision: a.no_flush_elision,
        ..Default::default()
    };
    let data: Arc<dyn Device> = Arc::new(FileDevice::open(&image, opts).map_err(Failure::usage)?);
    let logdev: Option<Arc<dyn Device>> = match &a.logdev {
        Some(p) => Some(Arc::new(FileDevice::open(p, opts).map_err(Failure::usage)?)),
        None => None,
    };
    eprintln!(
        "bench journal: writing the {} MiB log once",
        a.log_size >> 20
    );
    write_filesystem(&*data, logdev.as_deref(), &layout, &mut |_, _| {}).map_err(Failure::usage)?;
    let cfg = JournalConfig {
        log: log_cfg,
        cil_limit: a.cil_limit,
        push_mode: PushMode::Background,
        cache_bytes_max: a.cache_size,
        log_force_interval: None,
        cil_sharding: Default::default(),
    };
    let j = Journal::open(Arc::clone(&data), logdev.clone(), cfg).map_err(Failure::usage)?;
    let (first, _) = j.metadata_area();
    if !a.cold {
        eprintln!(
            "bench journal: warming up the {} MiB working set",
            (a.items * u64::from(BS)) >> 20
        );
        warm_up(&j, &*data, first, a.items)?;
    }
    let base_data = data.stats();
    let base_evicted = j.stats().cache_evicted;
    let base_ail_flushes = j.stats().ail_flushes;
    let base_log = logdev.as_ref().map(|d| d.stats());
    let commits = AtomicU64::new(0);
    let conflicts = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let error: parking_lot::Mutex<Option<String>> = parking_lot::Mutex::new(None);
    eprintln!("bench journal: {} threads for {} s", a.threads, a.seconds);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..a.threads {
            let (j, commits, conflicts, stop, error, a) =
                (&j, &commits, &conflicts, &stop, &error, &a);
            s.spawn(move || {
                let mut rng = SimRng::derive(0xbe4c, t);
                let res = Reservation::for_buffers(a.items_per_tx, BS);
                let pattern = vec![t as u8 + 1; a.item_bytes as usize];
                let mut mine = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut blocks: Vec<u64> =
                        (0..a.items_per_tx).map(|_| rng.below(a.items)).collect();
                    blocks.sort_unstable();
                    blocks.dedup();
                    let offs: Vec<usize> = blocks
                        .iter()
                        .map(|_| rng.below(u64::from(BS) - a.item_bytes + 1) as usize)
                        .collect();
                    let once = || -> Result<u64, cilfs_core::journal::JournalError> {
                        let mut tx = j.begin(res)?;
                        for (&b, &off) in blocks.iter().zip(&offs) {
                            let h = tx.buf(first + b)?;
                            tx.write(h, off, &pattern);
                        }
                        tx.commit()
                    };
                    // A transaction works on its own copies: when another thread committed to
                    // one of its blocks meanwhile, it publishes nothing and is run again.
                    let r = loop {
                        match once() {
                            Err(cilfs_core::journal::JournalError::Conflict { .. }) => {
                                conflicts.fetch_add(1, Ordering::Relaxed);
                            }
                            r => break r,
                        }
                    };
                    let seq = match r {
                        Ok(seq) => seq,
                        Err(e) => {
                            *error.lock() = Some(e.to_string());
                            stop.store(true, Ordering::Relaxed);
                            return;
                        }
                    };
                    mine += 1;
                    let total = commits.fetch_add(1, Ordering::Relaxed) + 1;
                    if a.force_every > 0 && mine % a.force_every == 0 {
                        if let Err(e) = j.force(seq) {
                            *error.lock() = Some(e.to_string());
                            stop.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                    if a.commits.is_some_and(|c| total >= c) {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
        let deadline = start + Duration::from_secs_f64(a.seconds);
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if a.commits.is_none() && now >= deadline {
                stop.store(true, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(
                Duration::from_millis(10).min(
                    deadline
                        .saturating_duration_since(now)
                        .max(Duration::from_millis(1)),
                ),
            );
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(e) = error.lock().take() {
        return Err(usage(format!("benchmark failed: {e}")));
    }
    j.force_all().map_err(Failure::usage)?;
    let st = j.stats();
    let rss = rss_max_bytes();
    let sub = |now: IoStats, base: IoStats| IoStats {
        reads: now.reads - base.reads,
        read_bytes: now.read_bytes - base.read_bytes,
        writes: now.writes - base.writes,
        write_bytes: now.write_bytes - base.write_bytes,
        flushes_issued: now.flushes_issued - base.flushes_issued,
        flushes_elided: now.flushes_elided - base.flushes_elided,
        preflush_writes: now.preflush_writes - base.preflush_writes,
        fua_writes: now.fua_writes - base.fua_writes,
        sync_syscalls: now.sync_syscalls - base.sync_syscalls,
    };
    let data_io = sub(st.data_dev, base_data);
    let log_io = st.log_dev.zip(base_log).map(|(n, b)| sub(n, b));
    j.unmount().map_err(Failure::usage)?;
    let n = commits.load(Ordering::Relaxed);
    let flushes_total = data_io.flushes_issued + log_io.map_or(0, |l| l.flushes_issued);
    // The AIL's own flushes (ail policy); the rest are the commit path's (the bench runs no
    // fsync, and the warm-up's flush is before the base).
    let ail_flushes = st.ail_flushes - base_ail_flushes;
    let per_checkpoint = |n: u64| n as f64 / st.log.checkpoints.max(1) as f64;
    let fua_total = data_io.fua_writes + log_io.map_or(0, |l| l.fua_writes);
    let out = json!({
        "config": {
            "policy": a.policy.to_string(), "logbufs": a.logbufs, "logbsize": a.logbsize,
            "log_size": a.log_size, "external_log": a.logdev.is_some(), "threads": a.threads,
            "seconds": a.seconds, "commits_limit": a.commits, "items": a.items, "item_bytes": a.item_bytes,
            "items_per_tx": a.items_per_tx, "cold": a.cold, "cache_size": a.cache_size, "no_flush_elision": a.no_flush_elision, "force_every": a.force_every, "cil_limit": a.cil_limit,
            "image_dir": dir.display().to_string(),
        },
        "elapsed_s": elapsed,
        "commits": n,
        "commits_per_s": n as f64 / elapsed,
        // Transactions run again because another thread committed to one of their blocks.
        "conflicts": conflicts.load(Ordering::Relaxed),
        "checkpoints": st.log.checkpoints,
        "iclog_writes": st.log.iclog_writes,
        "log_bytes": st.log.log_bytes,
        "noiclog_waits": st.log.noiclog_waits,
        "log_forces": st.log.log_forces,
        "reservation_waits": st.log.reservation_waits,
        "cil_space_limit": st.cil_space_limit,
        "cil_bytes_max": st.cil_bytes_max,
        "cil_blocked_commits": st.cil_blocked_commits,
        "ail_writeback_bytes": st.ail_writeback_bytes,
        "ail_flushes": ail_flushes,
        "items_logged": st.items_logged,
        "tail_records": st.tail_records,
        "relief_passes": st.relief_passes,
        "overlapped_checkpoints": st.overlapped_checkpoints,
        "reservation_wait_us": st.reservation_wait_us,
        "cil_blocked_us": st.cil_blocked_us,
        "rss_max_bytes": rss,
        "cache_evicted": st.cache_evicted - base_evicted,
        "data_device": dev_json(&data_io),
        "log_device": log_io.as_ref().map(dev_json),
        "flushes_issued_per_checkpoint": per_checkpoint(flushes_total),
        "commit_path_flushes_per_checkpoint": per_checkpoint(flushes_total - ail_flushes),
        "ail_flushes_per_checkpoint": per_checkpoint(ail_flushes),
        "fua_writes_per_checkpoint": per_checkpoint(fua_total),
    });
    if a.json {
        println!("{out}");
    } else {
        println!("{out:#}");
    }
    Ok(())
}
