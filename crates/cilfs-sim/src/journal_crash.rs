//! `cilfs crashtest journal`: random transactions on the journal alone, checked at crash points.
//!
//! The model records the state of a small region of blocks after every commit, keyed by
//! (mount, checkpoint sequence). After a crash, recovery must produce exactly the state after
//! some checkpoint (never part of one) that is at or after the last completed force or unmount.
//!
//! In background mode the journal runs as a mount runs it: the push worker (with idle pushes
//! and covers every 10 ms), the AIL worker and its queued write back, concurrent iclog IO,
//! CIL shards per thread, and a second committer on its own region of blocks beside the
//! workload's thread, forcing now and then. A checkpoint then holds what both committed into
//! it, and recovery must bring back both regions as of one checkpoint. The threads' timing is
//! the machine's, so a run's IO differs from one try to the next: a seed replays the workload's
//! choices, not its interleaving, except in the scheduled build
//! (`scripts/sched-crashtest`, `recorded::scheduled`), where a seed replays the interleaving
//! and the IO too.
//!
//! With IO errors, each run's devices fail once: from one write or flush on (the device died)
//! or at one alone. Whatever returned before the error stays promised; the operation that
//! meets it fails and the mount is taken as dead (recovered on the devices working again,
//! and checked as after a death), and the crash points cover the failed IO's aftermath.

use crate::recorded::{pick_crash_point, Fault, RecordedSet};
use cilfs_core::format::superblock::SbLog;
use cilfs_core::journal::{CilSharding, Journal, JournalConfig, PushMode};
use cilfs_core::log::{FlushPolicy, LogConfig};
use cilfs_core::mkfs::{write_filesystem, Layout};
use cilfs_core::trans::Reservation;
use cilfs_device::rng::SimRng;
use cilfs_device::{Device, SimDevice, SparseImage, Survival};
use std::collections::BTreeMap;
use std::sync::Arc;

const BS: u32 = 1024;
const DATA_BLOCKS: u64 = 4096;
const LOG_BLOCKS: u64 = 256;
/// Blocks the workload modifies.
const REGION: u64 = 48;
const TXS_PER_RUN: usize = 300;
const POINTS_PER_RUN: usize = 100;

#[derive(Debug, Clone, Copy)]
pub struct JournalCrashConfig {
    pub seed: u64,
    pub points: usize,
    pub policy: FlushPolicy,
    pub external_log: bool,
    /// The mount's threads instead of one (see the module comment).
    pub background: bool,
    /// An injected IO error in each run (see the module comment).
    pub io_errors: bool,
}

#[derive(Debug, Default)]
pub struct CrashReport {
    pub passed: usize,
    pub failed: usize,
    pub failures: Vec<String>,
    pub runs: usize,
    pub checkpoints: u64,
    pub log_bytes: u64,
    pub cache_evicted: u64,
    /// fs runs: xattr values compared byte for byte after recovery, and those of them whose
    /// blocks had been tree nodes or file data before.
    pub xattr_values_checked: u64,
    pub xattr_values_in_reused_blocks: u64,
    /// fs runs: blocks seen to change role (tree node, xattr value, file data) between two
    /// operations of a workload.
    pub blocks_changed_role: u64,
    /// fs runs: file data fsyncs put into the log (`FsOptions::log_data_max`).
    pub data_logged_bytes: u64,
    /// fs runs: optimistic commits that found what they read changed at publish, and ran
    /// again (the operation threads met).
    pub conflicts: u64,
    /// Runs whose injected IO error failed an operation (the mount then died).
    pub io_errors_met: u64,
    /// Each run's IO trace fingerprint (`RecordedSet::fingerprint`), in run order.
    pub traces: Vec<u64>,
}

impl CrashReport {
    /// Adds one run's figures.
    pub fn merge(&mut self, r: CrashReport) {
        self.passed += r.passed;
        self.failed += r.failed;
        self.failures.extend(r.failures);
        self.runs += r.runs;
        self.checkpoints += r.checkpoints;
        self.log_bytes += r.log_bytes;
        self.cache_evicted += r.cache_evicted;
        self.xattr_values_checked += r.xattr_values_checked;
        self.xattr_values_in_reused_blocks += r.xattr_values_in_reused_blocks;
        self.blocks_changed_role += r.blocks_changed_role;
        self.data_logged_bytes += r.data_logged_bytes;
        self.conflicts += r.conflicts;
        self.io_errors_met += r.io_errors_met;
        self.traces.extend(r.traces);
    }

    /// Whether more than half the runs met their injected IO error (one placed past a run's
    /// last IO is not met): the IO-error runs exercised what they are for.
    pub fn most_runs_met_their_io_error(&self) -> bool {
        self.io_errors_met * 2 > self.runs as u64
    }

    /// How many times the workloads wrote the whole log.
    pub fn log_laps(&self) -> u64 {
        self.log_bytes / (LOG_BLOCKS * u64::from(BS))
    }
}

type Key = (u32, u64);

/// One committer's blocks: what they hold now, and what they held after each (mount,
/// checkpoint) it committed into.
#[derive(Debug, Default)]
struct Region {
    now: Vec<u8>,
    states: BTreeMap<Key, Arc<Vec<u8>>>,
    /// After a commit that failed on an IO error: its state, which recovery may or may not
    /// bring back (its checkpoint may have reached the log before the error).
    maybe: Option<Arc<Vec<u8>>>,
}

impl Region {
    fn new() -> Self {
        Self {
            now: vec![0u8; (REGION * u64::from(BS)) as usize],
            states: BTreeMap::new(),
            maybe: None,
        }
    }

    fn snapshot(&mut self, key: Key) {
        self.states.insert(key, Arc::new(self.now.clone()));
    }

    /// What checkpoint `key` holds of this region: its state after its last commit into a
    /// checkpoint at or before `key`.
    fn at(&self, key: Key) -> Option<&Arc<Vec<u8>>> {
        self.states.range(..=key).next_back().map(|(_, s)| s)
    }

    /// The daemon died in mount `mount` and recovery came back to `key`: what came after it in
    /// that mount never happened.
    fn return_to(&mut self, mount: u32, key: Key) -> Result<(), String> {
        self.now = self
            .at(key)
            .ok_or("no state to return to")?
            .as_ref()
            .clone();
        self.states.retain(|&k, _| k.0 < mount || k <= key);
        Ok(())
    }
}

/// What recovery may produce: every region as of one (mount, checkpoint), and the forces that
/// completed with the global operation count at their return.
#[derive(Debug, Default)]
struct Model {
    regions: Vec<Region>,
    durable: Vec<(usize, Key)>,
}

impl Model {
    fn required_at(&self, g: usize) -> Key {
        self.durable
            .iter()
            .filter(|(at, _)| *at <= g)
            .map(|(_, k)| *k)
            .max()
            .unwrap_or((0, 0))
    }

    /// The (mount, checkpoint)s whose regions are exactly `got`.
    fn matching(&self, got: &[u8]) -> Vec<Key> {
        let regions: Vec<&Region> = self.regions.iter().collect();
        matching(&regions, got)
    }
}

/// The (mount, checkpoint)s whose `regions` are exactly `got` (all of them, in order).
fn matching(regions: &[&Region], got: &[u8]) -> Vec<Key> {
    let len = (REGION * u64::from(BS)) as usize;
    keys(regions)
        .into_iter()
        .filter(|&k| {
            regions.iter().enumerate().all(|(i, r)| {
                r.at(k)
                    .is_some_and(|s| s[..] == got[i * len..(i + 1) * len])
            })
        })
        .collect()
}

/// Every (mount, checkpoint) any of `regions` committed into, in order.
fn keys(regions: &[&Region]) -> std::collections::BTreeSet<Key> {
    regions
        .iter()
        .flat_map(|r| r.states.keys().copied())
        .collect()
}

/// The newest (mount, checkpoint) at or before `upto` that any of `regions` committed into.
fn newest_at_or_before(regions: &[&Region], upto: Key) -> Option<Key> {
    regions
        .iter()
        .filter_map(|r| r.states.range(..=upto).next_back())
        .map(|(k, _)| *k)
        .max()
}

fn layout(external: bool) -> Layout {
    Layout {
        uuid: [0x5a; 16],
        block_size: BS,
        data_blocks: DATA_BLOCKS,
        log: if external {
            SbLog::External {
                log_uuid: [0xa5; 16],
            }
        } else {
            SbLog::Internal { start: 1 }
        },
        log_blocks: LOG_BLOCKS,
        backups: false,
    }
}

/// Tiny iclogs and a CIL limit per run: below one iclog (single-iclog checkpoints, FUA only) or
/// a few iclogs (multi-iclog checkpoints whose body goes out without flags).
fn journal_config(policy: FlushPolicy, cil_limit: u64, background: bool) -> JournalConfig {
    if background {
        return crate::recorded::with_mount_threads(journal_config(policy, cil_limit, false));
    }
    JournalConfig {
        log: LogConfig {
            logbufs: 2,
            logbsize: 16 * 1024,
            policy,
        },
        cil_limit: Some(cil_limit),
        push_mode: PushMode::Inline,
        // Fewer buffers than the workload's region, so eviction and re-reading are exercised.
        cache_bytes_max: Some(32 * u64::from(BS)),
        log_force_interval: None,
        // Every checkpoint a merge of the CIL's shards.
        cil_sharding: CilSharding::Rotate,
    }
}

const CIL_LIMITS: [u64; 3] = [6 * 1024, 24 * 1024, 40 * 1024];

/// Fresh, formatted images of the data device (and log device).
fn base_images(external: bool) -> Vec<(SparseImage, u64)> {
    let data_len = DATA_BLOCKS * u64::from(BS);
    let log_len = (LOG_BLOCKS + 1) * u64::from(BS);
    let data = SimDevice::new(data_len, 0);
    let log = SimDevice::new(log_len, 0);
    let l = layout(external);
    let r = if external {
        write_filesystem(&data, Some(&log), &l, &mut |_, _| {})
    } else {
        write_filesystem(&data, None, &l, &mut |_, _| {})
    };
    assert!(r.is_ok(), "formatting a simulated device failed: {r:?}");
    let mut v = vec![(data.stable_image(), data_len)];
    if external {
        v.push((log.stable_image(), log_len));
    }
    v
}

fn open(
    devs: &[Arc<dyn Device>],
    cfg: &JournalCrashConfig,
    cil_limit: u64,
) -> Result<Arc<Journal>, String> {
    Journal::open(
        Arc::clone(&devs[0]),
        devs.get(1).cloned(),
        journal_config(cfg.policy, cil_limit, cfg.background),
    )
    .map_err(|e| e.to_string())
}

/// The blocks of both committers' regions, in order (the second's stay zero in inline mode).
fn read_regions(dev: &dyn Device, first: u64) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; (2 * REGION * u64::from(BS)) as usize];
    dev.read(first * u64::from(BS), &mut v)
        .map_err(|e| e.to_string())?;
    Ok(v)
}

/// The journal now mounted, and which mount of the run it is.
type Mounted = cilfs_sync::RwLock<(u32, Arc<Journal>)>;

/// One random transaction on committer `who`'s region (block `first + who * REGION` on),
/// recorded in `region`; returns the checkpoint it joined. `window`: relief-only runs touch a
/// window of blocks that moves on, leaving items behind in the AIL that nothing relogs, so the
/// tail stays put until relief writes them back.
fn transaction(
    j: &Journal,
    rng: &mut SimRng,
    region: &mut Region,
    first: u64,
    who: u64,
    tx_no: usize,
    window: bool,
) -> Result<u64, String> {
    // Now and then a transaction of a sixth of the log, whole blocks: reservations then wait
    // for log space, and relief (write back, tail record) runs under the crashes.
    let big = rng.below(100) < 3;
    let nbufs = if big {
        24 + rng.below(16)
    } else {
        1 + rng.below(4)
    };
    let mut tx = j
        .begin(Reservation::for_buffers(nbufs, BS))
        .map_err(|e| e.to_string())?;
    // Until the commit nothing of the transaction can be recovered: an error before it
    // leaves the region as it was.
    let before = region.now.clone();
    for _ in 0..nbufs {
        let blk = if window {
            (tx_no as u64 / 4 + rng.below(16)) % REGION
        } else {
            rng.below(REGION)
        };
        let len = if big {
            BS as usize - 1
        } else {
            1 + rng.below(u64::from(BS) / 2) as usize
        };
        let off = rng.below(u64::from(BS) - len as u64) as usize;
        let fill = (tx_no as u8)
            .wrapping_mul(31)
            .wrapping_add(blk as u8)
            .wrapping_add(who as u8 * 7)
            | 1;
        let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
        let b = match tx.buf(first + who * REGION + blk) {
            Ok(b) => b,
            Err(e) => {
                region.now = before;
                return Err(e.to_string());
            }
        };
        tx.write(b, off, &data);
        let at = (blk * u64::from(BS)) as usize + off;
        region.now[at..at + len].copy_from_slice(&data);
    }
    tx.commit().map_err(|e| {
        // A commit that fails may have reached the log: its state is a maybe, and the
        // region's last committed state is where the next transaction starts.
        region.maybe = Some(Arc::new(std::mem::replace(&mut region.now, before)));
        e.to_string()
    })
}

/// The second committer of background mode: transactions on its own region, as the workload's
/// thread commits on its, now and then a force; it pauses while the workload's thread
/// unmounts, kills or reads the journal (which holds `mounted` for writing).
fn side_committer(
    mounted: &Mounted,
    stop: &std::sync::atomic::AtomicBool,
    seed: u64,
    first: u64,
    region: &cilfs_sync::Mutex<Region>,
    durable: &cilfs_sync::Mutex<Vec<(usize, Key)>>,
    set: &RecordedSet,
) -> Result<(), String> {
    let mut rng = SimRng::derive(seed, 2);
    let mut tx_no = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let m = mounted.read();
        let (mount, j) = (m.0, &m.1);
        let mut r = region.lock();
        let step = transaction(j, &mut rng, &mut r, first, 1, tx_no, false).and_then(|seq| {
            r.snapshot((mount, seq));
            if rng.below(100) < 8 {
                j.force(seq).map_err(|e| e.to_string())?;
                durable.lock().push((set.op_count(), (mount, seq)));
            }
            Ok(())
        });
        drop(r);
        // Down after an IO error (the only way a journal of this explorer shuts down but by
        // unmounting, which the workload's thread does with the mount held).
        let dead = j.is_shut_down();
        drop(m);
        match step {
            Ok(()) => {}
            // The injected error (or the shutdown after it): the workload's thread finds the
            // mount dead too, recovers (returning this region to what recovery brought back)
            // and mounts again.
            Err(_) if set.fault_hit() || dead => {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && mounted.read().0 == mount
                {
                    cilfs_sync::thread::yield_now();
                }
            }
            Err(e) => return Err(e),
        }
        tx_no += 1;
        // Let the workload's thread take the journal for an unmount or a death.
        cilfs_sync::thread::yield_now();
    }
    Ok(())
}

/// Runs the workload of one run, returning the recorded devices and the model.
fn workload(
    seed: u64,
    cfg: &JournalCrashConfig,
    cil_limit: u64,
    report: &mut CrashReport,
) -> Result<(RecordedSet, Model, u64), String> {
    let set = if cfg.background {
        RecordedSet::with_jitter(base_images(cfg.external_log), seed)
    } else {
        RecordedSet::new(base_images(cfg.external_log), seed)
    };
    let devs: Vec<Arc<dyn Device>> = set
        .devs
        .iter()
        .map(|d| Arc::clone(d) as Arc<dyn Device>)
        .collect();
    let mut rng = SimRng::new(seed);
    // One run in three writes nothing back ahead of need: the log runs full, and relief (write
    // back to a target, a CIL push or an empty checkpoint carrying the new tail) gets crashed.
    let relief_only = rng.below(3) == 0;
    let open = |devs: &[Arc<dyn Device>]| {
        let j = open(devs, cfg, cil_limit)?;
        j.set_ail_push_ahead(!relief_only);
        Ok::<_, String>(j)
    };
    let j = open(&devs)?;
    let first = j.metadata_area().0;
    let mounted: Mounted = cilfs_sync::RwLock::new((0, j));
    let mut main = Region::new();
    main.snapshot((0, 0));
    let side = cilfs_sync::Mutex::new(Region::new());
    side.lock().snapshot((0, 0));
    let side_durable = cilfs_sync::Mutex::new(Vec::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut durable = Vec::new();
    let r = cilfs_sync::thread::scope(|scope| {
        // Stops the second committer however this thread leaves the scope: a panic here must
        // fail the run, not leave the scope waiting for a committer that waits for a remount.
        let _stop_side = crate::recorded::StopOnDrop(&stop);
        let helper = cfg.background.then(|| {
            scope.spawn(|| {
                let r = side_committer(&mounted, &stop, seed, first, &side, &side_durable, &set);
                // A failed side ends the run: the workload's thread stops at its next step.
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                r
            })
        });
        let run = Run {
            mounted: &mounted,
            set: &set,
            devs: &devs,
            open: &open,
            side: &side,
            stop: &stop,
            first,
            relief_only,
            fault_tx: cfg
                .io_errors
                .then(|| rng.below(TXS_PER_RUN as u64) as usize),
        };
        let r = main_committer(run, &mut main, &mut durable, &mut rng, report);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let side = helper.map_or(Ok(()), |h| {
            h.join()
                .unwrap_or_else(|_| Err("the second committer panicked".into()))
        });
        r.and(side.map_err(|e| format!("second committer: {e}")))
    });
    let (_, j) = mounted.into_inner();
    tally(&j, report);
    drop(j);
    r?;
    durable.extend(side_durable.into_inner());
    let regions = vec![main, side.into_inner()];
    Ok((set, Model { regions, durable }, first))
}

/// The newest (mount, checkpoint) either committer committed into in mount `mount`: what an
/// unmount or a cover makes durable.
fn newest_key(main: &Region, side: &Region, mount: u32) -> Key {
    newest_at_or_before(&[main, side], (mount, u64::MAX)).unwrap_or((mount, 0))
}

/// Mounts the journal on the run's devices.
type Opener<'a> = dyn Fn(&[Arc<dyn Device>]) -> Result<Arc<Journal>, String> + Sync + 'a;

/// What the workload's thread shares with the second committer, and how it mounts.
#[derive(Clone, Copy)]
struct Run<'a> {
    mounted: &'a Mounted,
    set: &'a RecordedSet,
    devs: &'a [Arc<dyn Device>],
    open: &'a Opener<'a>,
    /// The second committer's region.
    side: &'a cilfs_sync::Mutex<Region>,
    stop: &'a std::sync::atomic::AtomicBool,
    /// The first block of the regions.
    first: u64,
    relief_only: bool,
    /// With IO errors: the transaction before which the devices are told to fail.
    fault_tx: Option<usize>,
}

/// The workload's own thread: transactions, forces, unmounts, covers and deaths.
fn main_committer(
    run: Run<'_>,
    main: &mut Region,
    durable: &mut Vec<(usize, Key)>,
    rng: &mut SimRng,
    report: &mut CrashReport,
) -> Result<(), String> {
    for tx_no in 0..TXS_PER_RUN {
        if run.stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        if run.fault_tx == Some(tx_no) {
            run.set.inject(Fault {
                at: run.set.op_count() + rng.below(40) as usize,
                once: rng.bool(),
            });
        }
        match step(run, main, durable, rng, report, tx_no) {
            Ok(()) => {}
            // The injected IO error: the mount is dead. The devices work again for the next.
            Err(e) if run.set.fault_hit() => {
                let failed = run.set.clear_fault().unwrap_or_default();
                report.io_errors_met += 1;
                let mut m = run.mounted.write();
                die(run, &mut m, main, report).map_err(|d| {
                    format!("{d} (after the IO error: {failed}; the operation: {e})")
                })?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One transaction of the workload's thread and what follows it.
fn step(
    run: Run<'_>,
    main: &mut Region,
    durable: &mut Vec<(usize, Key)>,
    rng: &mut SimRng,
    report: &mut CrashReport,
    tx_no: usize,
) -> Result<(), String> {
    let Run {
        mounted,
        set,
        devs,
        open,
        side,
        first,
        relief_only,
        ..
    } = run;
    let m = mounted.read();
    let mount = m.0;
    let last_seq = transaction(&m.1, rng, main, first, 0, tx_no, relief_only)?;
    main.snapshot((mount, last_seq));
    drop(m);
    let mut event = rng.below(100);
    if relief_only && (8..=12).contains(&event) && rng.below(8) != 0 {
        // Unmounts, deaths and covers empty the AIL: rarer here, so the log can fill.
        event = 99;
    }
    match event {
        0..=7 => {
            mounted
                .read()
                .1
                .force(last_seq)
                .map_err(|e| e.to_string())?;
            durable.push((set.op_count(), (mount, last_seq)));
        }
        8..=9 => {
            // Clean unmount and mount again.
            let mut m = mounted.write();
            m.1.unmount().map_err(|e| e.to_string())?;
            tally(&m.1, report);
            durable.push((set.op_count(), newest_key(main, &side.lock(), mount)));
            let j = open(devs)?;
            if !j.recovery_report().was_clean {
                return Err("mount after a clean unmount found a dirty log".into());
            }
            *m = (mount + 1, j);
            main.snapshot((mount + 1, 0));
            side.lock().snapshot((mount + 1, 0));
        }
        11..=12 => {
            // Idle: cover the log (everything is forced and written back first).
            let m = mounted.write();
            m.1.cover().map_err(|e| e.to_string())?;
            durable.push((set.op_count(), newest_key(main, &side.lock(), mount)));
            drop(m);
        }
        10 => {
            let mut m = mounted.write();
            die(run, &mut m, main, report)?;
        }
        _ => {}
    }
    // The journal must always read back what the model holds.
    if tx_no % 50 == 49 {
        let m = mounted.write();
        let side = side.lock();
        for (who, region) in [&*main, &*side].into_iter().enumerate() {
            for blk in 0..REGION {
                let b =
                    m.1.buf(first + who as u64 * REGION + blk)
                        .map_err(|e| e.to_string())?;
                let g = b.lock();
                let at = (blk * u64::from(BS)) as usize;
                if g.data[..] != region.now[at..at + BS as usize] {
                    return Err(format!(
                        "live read of block {blk} of committer {who} differs from the model"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The daemon dies: unpushed commits are gone, the rest is recovered from the log. In
/// background mode a checkpoint written as it died may be recovered too. Recovery must come
/// back to the state of a checkpoint of the dead mount at or after the last one it completed.
fn die(
    run: Run<'_>,
    m: &mut (u32, Arc<Journal>),
    main: &mut Region,
    report: &mut CrashReport,
) -> Result<(), String> {
    let mount = m.0;
    let done = m.1.completed_seq();
    tally(&m.1, report);
    // Nothing of the dead mount may write once the next one mounts.
    m.1.kill();
    let dead = std::mem::replace(&mut m.1, (run.open)(run.devs)?);
    if Arc::into_inner(dead).is_none() {
        return Err("the dead mount's journal is still referenced".into());
    }
    let got = read_regions(&*run.devs[0], run.first)?;
    let mut side = run.side.lock();
    // Checkpoint `done` holds what the last commit at or before it left.
    let floor = newest_at_or_before(&[&*main, &*side], (mount, done)).unwrap_or((mount, 0));
    let len = (REGION * u64::from(BS)) as usize;
    let regions = [&*main, &*side];
    // Each region as of the checkpoint, or as after its failed commit (which joined that
    // checkpoint or a later one).
    let fits = |k: Key, i: usize, maybe: bool| {
        let part = &got[i * len..(i + 1) * len];
        match maybe {
            false => regions[i].at(k).is_some_and(|s| s[..] == *part),
            true => regions[i].maybe.as_ref().is_some_and(|s| s[..] == *part),
        }
    };
    let back = keys(&regions)
        .into_iter()
        .filter(|k| k.0 == mount && *k >= floor)
        .rev()
        .find_map(|k| {
            let choice: Option<Vec<bool>> = (0..regions.len())
                .map(|i| {
                    [false, true]
                        .into_iter()
                        .find(|&maybe| fits(k, i, maybe))
                })
                .collect();
            choice.map(|c| (k, c))
        })
        .ok_or_else(|| {
            format!(
                "mount {mount} died after checkpoint {done}: recovery came back to no state at or after it"
            )
        })?;
    for (r, maybe) in [&mut *main, &mut *side].into_iter().zip(back.1) {
        r.return_to(mount, back.0)?;
        if maybe {
            r.now = r
                .maybe
                .as_ref()
                .map_or_else(Vec::new, |s| s.as_ref().clone());
        }
        r.maybe = None;
        r.snapshot((mount + 1, 0));
    }
    m.0 = mount + 1;
    Ok(())
}

fn tally(j: &Journal, report: &mut CrashReport) {
    let s = j.stats();
    report.checkpoints += s.log.checkpoints;
    report.cache_evicted += s.cache_evicted;
    report.log_bytes += s.log.log_bytes;
}

fn random_fate(rng: &mut SimRng, sectors: usize) -> Survival {
    match rng.below(3) {
        0 => Survival::Lost,
        1 => Survival::Kept,
        _ => Survival::Torn((0..sectors).map(|_| rng.bool()).collect()),
    }
}

/// Recovers the crash image at global operation `g` and checks it against the model.
fn check_point(
    set: &RecordedSet,
    model: &Model,
    first: u64,
    g: usize,
    rng: &mut SimRng,
    cfg: &JournalCrashConfig,
    cil_limit: u64,
) -> Result<(), String> {
    // Scheduled, recovery and the checks run on the run's main task alone: every task spawned
    // lives until the end of the run there, and each costs every later step. What is explored
    // is the workload's interleavings, not the checker's.
    let cfg = &JournalCrashConfig {
        background: cfg.background && !crate::SCHEDULED,
        ..*cfg
    };
    let mut images = set.crash_images(g, &mut |_, n| random_fate(rng, n));
    let lens: Vec<u64> = set.devs.iter().map(|d| d.len()).collect();
    if rng.chance(1, 4) {
        // Crash during recovery too: recovery must be idempotent.
        let rec = RecordedSet::new(
            images.iter().cloned().zip(lens.iter().copied()).collect(),
            rng.next_u64(),
        );
        let devs: Vec<Arc<dyn Device>> = rec
            .devs
            .iter()
            .map(|d| Arc::clone(d) as Arc<dyn Device>)
            .collect();
        let _ = open(&devs, cfg, cil_limit);
        let k = rng.below(rec.op_count() as u64 + 1) as usize;
        images = rec.crash_images(k, &mut |_, n| random_fate(rng, n));
    }
    let devs: Vec<Arc<dyn Device>> = images
        .into_iter()
        .zip(lens)
        .map(|(img, len)| Arc::new(SimDevice::from_image(img, len, 1)) as Arc<dyn Device>)
        .collect();
    let j = open(&devs, cfg, cil_limit).map_err(|e| format!("recovery failed: {e}"))?;
    drop(j);
    let got = read_regions(&*devs[0], first)?;
    let required = model.required_at(g);
    let matched = model.matching(&got);
    match matched.last() {
        None => {
            // Which checkpoints each committer's region matches alone: where they disagree.
            let len = (REGION * u64::from(BS)) as usize;
            let each: Vec<String> = model
                .regions
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let own: Vec<Key> = matching(&[r], &got[i * len..(i + 1) * len]);
                    format!("committer {i}'s region matches {own:?}")
                })
                .collect();
            Err(format!(
                "recovered state is not the state after any checkpoint (partial checkpoint or corruption); {}",
                each.join("; ")
            ))
        }
        Some(&k) if k < required => Err(format!(
            "recovered the state of checkpoint {k:?}, but checkpoint {required:?} was forced before the crash"
        )),
        Some(_) => Ok(()),
    }
}

/// Runs workloads and crash checks until `cfg.points` crash points have been checked.
pub fn run_journal_crashtest(
    cfg: &JournalCrashConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> CrashReport {
    let mut report = CrashReport::default();
    let mut run = 0u64;
    while report.passed + report.failed < cfg.points {
        let run_seed = SimRng::derive(cfg.seed, run).next_u64();
        let todo = POINTS_PER_RUN.min(cfg.points - report.passed - report.failed);
        let c = *cfg;
        match crate::recorded::scheduled(run_seed, move || one_run(&c, run, run_seed, todo)) {
            Ok(r) => report.merge(r),
            Err(e) => {
                report.runs += 1;
                report.failed += 1;
                report
                    .failures
                    .push(format!("run {run} (seed {run_seed}): {e}"));
            }
        }
        progress(report.passed + report.failed, cfg.points);
        run += 1;
    }
    report
}

/// Run `run` of the seed: its workload, then `todo` crash points.
fn one_run(cfg: &JournalCrashConfig, run: u64, run_seed: u64, todo: usize) -> CrashReport {
    let mut report = CrashReport {
        runs: 1,
        ..CrashReport::default()
    };
    let cil_limit = CIL_LIMITS[(run % CIL_LIMITS.len() as u64) as usize];
    let (set, model, first) = match workload(run_seed, cfg, cil_limit, &mut report) {
        Ok(w) => w,
        Err(e) => {
            report.failed += 1;
            report
                .failures
                .push(format!("run {run}: workload failed: {e}"));
            return report;
        }
    };
    report.traces.push(set.fingerprint());
    let n = set.op_count();
    let durability = set.durability_points();
    let mut rng = SimRng::derive(run_seed, 1);
    for _ in 0..todo {
        let g = pick_crash_point(&mut rng, &durability, n);
        match check_point(&set, &model, first, g, &mut rng, cfg, cil_limit) {
            Ok(()) => report.passed += 1,
            Err(e) => {
                report.failed += 1;
                report.failures.push(format!(
                    "run {run} (seed {run_seed}) crash after operation {g} of {n}: {e}"
                ));
            }
        }
    }
    report
}
