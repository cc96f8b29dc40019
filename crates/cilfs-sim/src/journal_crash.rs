//! `cilfs crashtest journal`: random transactions on the journal alone, checked at crash points.
//!
//! The model records the state of a small region of blocks after every commit, keyed by
//! (mount, checkpoint sequence). After a crash, recovery must produce exactly the state after
//! some checkpoint (never part of one) that is at or after the last completed force or unmount.

use crate::recorded::{pick_crash_point, RecordedSet};
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
}

impl CrashReport {
    /// How many times the workloads wrote the whole log.
    pub fn log_laps(&self) -> u64 {
        self.log_bytes / (LOG_BLOCKS * u64::from(BS))
    }
}

type Key = (u32, u64);

/// What recovery may produce: the region after each (mount, checkpoint), and the forces that
/// completed with the global operation count at their return.
#[derive(Debug, Default)]
struct Model {
    region: Vec<u8>,
    states: BTreeMap<Key, Arc<Vec<u8>>>,
    durable: Vec<(usize, Key)>,
}

impl Model {
    fn snapshot(&mut self, key: Key) {
        self.states.insert(key, Arc::new(self.region.clone()));
    }

    fn required_at(&self, g: usize) -> Key {
        self.durable
            .iter()
            .filter(|(at, _)| *at <= g)
            .map(|(_, k)| *k)
            .max()
            .unwrap_or((0, 0))
    }
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
fn journal_config(policy: FlushPolicy, cil_limit: u64) -> JournalConfig {
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
    policy: FlushPolicy,
    cil_limit: u64,
) -> Result<Arc<Journal>, String> {
    Journal::open(
        Arc::clone(&devs[0]),
        devs.get(1).cloned(),
        journal_config(policy, cil_limit),
    )
    .map_err(|e| e.to_string())
}

fn read_region(dev: &dyn Device, first: u64) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; (REGION * u64::from(BS)) as usize];
    dev.read(first * u64::from(BS), &mut v)
        .map_err(|e| e.to_string())?;
    Ok(v)
}

/// Runs the workload of one run, returning the recorded devices and the model.
fn workload(
    seed: u64,
    cfg: &JournalCrashConfig,
    cil_limit: u64,
    report: &mut CrashReport,
) -> Result<(RecordedSet, Model, u64), String> {
    let set = RecordedSet::new(base_images(cfg.external_log), seed);
    let devs: Vec<Arc<dyn Device>> = set
        .devs
        .iter()
        .map(|d| Arc::clone(d) as Arc<dyn Device>)
        .collect();
    let mut rng = SimRng::new(seed);
    let mut model = Model {
        region: vec![0u8; (REGION * u64::from(BS)) as usize],
        ..Default::default()
    };
    let mut mount = 0u32;
    // One run in three writes nothing back ahead of need: the log runs full, and relief (write
    // back to a target, a CIL push or an empty checkpoint carrying the new tail) gets crashed.
    let relief_only = rng.below(3) == 0;
    let open = |devs: &[Arc<dyn Device>], policy, cil_limit| {
        let j = open(devs, policy, cil_limit)?;
        j.set_ail_push_ahead(!relief_only);
        Ok::<_, String>(j)
    };
    let mut j = open(&devs, cfg.policy, cil_limit)?;
    let first = j.metadata_area().0;
    model.snapshot((mount, 0));
    for tx_no in 0..TXS_PER_RUN {
        // Now and then a transaction of a sixth of the log, whole blocks: reservations then
        // wait for log space, and relief (write back, tail record) runs under the crashes.
        let big = rng.below(100) < 3;
        let nbufs = if big {
            24 + rng.below(16)
        } else {
            1 + rng.below(4)
        };
        let mut tx = j
            .begin(Reservation::for_buffers(nbufs, BS))
            .map_err(|e| e.to_string())?;
        for _ in 0..nbufs {
            // Relief-only runs touch a window of blocks that moves on, leaving items behind
            // in the AIL that nothing relogs: the tail stays put until relief writes them back.
            let blk = if relief_only {
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
            let fill = (tx_no as u8).wrapping_mul(31).wrapping_add(blk as u8) | 1;
            let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
            let b = tx.buf(first + blk).map_err(|e| e.to_string())?;
            tx.write(b, off, &data);
            let at = (blk * u64::from(BS)) as usize + off;
            model.region[at..at + len].copy_from_slice(&data);
        }
        let last_seq = tx.commit().map_err(|e| e.to_string())?;
        model.snapshot((mount, last_seq));
        let mut event = rng.below(100);
        if relief_only && (8..=12).contains(&event) && rng.below(8) != 0 {
            // Unmounts, deaths and covers empty the AIL: rarer here, so the log can fill.
            event = 99;
        }
        match event {
            0..=7 => {
                j.force(last_seq).map_err(|e| e.to_string())?;
                model.durable.push((set.op_count(), (mount, last_seq)));
            }
            8..=9 => {
                // Clean unmount and mount again.
                j.unmount().map_err(|e| e.to_string())?;
                tally(&j, report);
                model.durable.push((set.op_count(), (mount, last_seq)));
                drop(j);
                mount += 1;
                j = open(&devs, cfg.policy, cil_limit)?;
                if !j.recovery_report().was_clean {
                    return Err("mount after a clean unmount found a dirty log".into());
                }
                model.snapshot((mount, 0));
            }
            11..=12 => {
                // Idle: cover the log (everything is forced and written back first).
                j.cover().map_err(|e| e.to_string())?;
                model.durable.push((set.op_count(), (mount, last_seq)));
            }
            10 => {
                // The daemon dies: unpushed commits are gone, the rest is recovered from the log.
                let done = j.completed_seq();
                tally(&j, report);
                drop(j);
                model.states.retain(|&(m, s), _| m < mount || s <= done);
                let (_, state) = model
                    .states
                    .range(..=(mount, done))
                    .next_back()
                    .ok_or("no state to return to")?;
                model.region = state.as_ref().clone();
                mount += 1;
                j = open(&devs, cfg.policy, cil_limit)?;
                model.snapshot((mount, 0));
            }
            _ => {}
        }
        // The journal must always read back what the model holds.
        if tx_no % 50 == 49 {
            for blk in 0..REGION {
                let b = j.buf(first + blk).map_err(|e| e.to_string())?;
                let g = b.lock();
                let at = (blk * u64::from(BS)) as usize;
                if g.data[..] != model.region[at..at + BS as usize] {
                    return Err(format!("live read of block {blk} differs from the model"));
                }
            }
        }
    }
    tally(&j, report);
    drop(j);
    Ok((set, model, first))
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
    policy: FlushPolicy,
    cil_limit: u64,
) -> Result<(), String> {
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
        let _ = open(&devs, policy, cil_limit);
        let k = rng.below(rec.op_count() as u64 + 1) as usize;
        images = rec.crash_images(k, &mut |_, n| random_fate(rng, n));
    }
    let devs: Vec<Arc<dyn Device>> = images
        .into_iter()
        .zip(lens)
        .map(|(img, len)| Arc::new(SimDevice::from_image(img, len, 1)) as Arc<dyn Device>)
        .collect();
    let j = open(&devs, policy, cil_limit).map_err(|e| format!("recovery failed: {e}"))?;
    drop(j);
    let got = read_region(&*devs[0], first)?;
    let required = model.required_at(g);
    let matched: Vec<Key> = model
        .states
        .iter()
        .filter(|(_, s)| ***s == got)
        .map(|(k, _)| *k)
        .collect();
    match matched.last() {
        None => Err("recovered state is not the state after any checkpoint (partial checkpoint or corruption)".into()),
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
        report.runs += 1;
        let cil_limit = CIL_LIMITS[(run % CIL_LIMITS.len() as u64) as usize];
        let (set, model, first) = match workload(run_seed, cfg, cil_limit, &mut report) {
            Ok(w) => w,
            Err(e) => {
                report.failed += 1;
                report
                    .failures
                    .push(format!("run {run}: workload failed: {e}"));
                run += 1;
                continue;
            }
        };
        let n = set.op_count();
        let durability = set.durability_points();
        let mut rng = SimRng::derive(run_seed, 1);
        let todo = POINTS_PER_RUN.min(cfg.points - report.passed - report.failed);
        for _ in 0..todo {
            let g = pick_crash_point(&mut rng, &durability, n);
            match check_point(&set, &model, first, g, &mut rng, cfg.policy, cil_limit) {
                Ok(()) => report.passed += 1,
                Err(e) => {
                    report.failed += 1;
                    report.failures.push(format!(
                        "run {run} (seed {run_seed}) crash after operation {g} of {n}: {e}"
                    ));
                }
            }
            progress(report.passed + report.failed, cfg.points);
        }
        run += 1;
    }
    report
}
