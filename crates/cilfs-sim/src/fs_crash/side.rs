//! Background mode's other operation threads: creates (written and fsynced) and unlinks in one
//! directory they share, beside the workload's operations and each other, so that their
//! transactions meet in that directory's blocks and commit at once with the workload's
//! (optimistic commits published side by side, one CIL shard per thread), in the same
//! checkpoints.
//!
//! What a recovered image must show of them: each thread's names in the directory are those
//! after some prefix of its operations, and the prefixes together are a cut that some serial
//! order of the operations could have reached. An operation that returned before another
//! started comes first in every such order, so the cut that holds the later one holds the
//! earlier one too: the journal commits into checkpoints in order, and recovery brings back a
//! prefix of them. A file whose fsync returned is there (until its unlink is in the cut), with
//! its contents; any other file there reads as a prefix of its contents (ordered mode) or of
//! them and zeros (writeback mode).

use super::{contents, Mounted, SIDE_DIR};
use crate::recorded::RecordedSet;
use cilfs_core::fs::types::Cred;
use cilfs_core::fs::{DataMode, Fs, FsError, ROOT_INO};
use cilfs_device::rng::SimRng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One operation of a side thread in the shared directory, timed by the devices' operation
/// count: read before it began and after it returned. Counts only grow, so an operation whose
/// `returned` is below another's `started` returned before that one began.
#[derive(Debug)]
pub(super) struct SideOp {
    name: Vec<u8>,
    /// A create, with the contents then written to the file; `None` for an unlink.
    create: Option<Arc<Vec<u8>>>,
    started: usize,
    returned: usize,
    /// A create whose file's write and fsync returned: the count then.
    synced_at: Option<usize>,
}

/// The names of thread `who`: its own, so a name tells whose it is.
fn side_name(who: usize, n: u64) -> Vec<u8> {
    format!("t{who}-{n}").into_bytes()
}

fn whose(name: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(name).ok()?;
    s.strip_prefix('t')?.split_once('-')?.0.parse().ok()
}

/// Thread `who`: creates, writes and fsyncs, and unlinks, until the workload ends; it pauses
/// while the workload unmounts or remounts (which hold `mounted` for writing). Returns what it
/// did, in order.
pub(super) fn side_ops(
    mounted: &Mounted,
    stop: &std::sync::atomic::AtomicBool,
    set: &RecordedSet,
    seed: u64,
    who: usize,
) -> Result<Vec<SideOp>, String> {
    let mut rng = SimRng::derive(seed, 16 + who as u64);
    let mut ops: Vec<SideOp> = Vec::new();
    let mut live: Vec<Vec<u8>> = Vec::new();
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        cilfs_sync::thread::yield_now();
        if crate::SCHEDULED && rng.below(16) != 0 {
            continue;
        }
        let m = mounted.read();
        let Some(fs) = m.as_ref() else { continue };
        // Out of space, an operation changes nothing (its transaction never commits).
        let gone = |e: &FsError| matches!(e, FsError::NoSpace) || fs.is_shut_down();
        let dir = match fs.lookup(ROOT_INO, SIDE_DIR) {
            Ok(a) => a.ino,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(format!("lookup: {e}")),
        };
        if live.len() > 12 || (!live.is_empty() && rng.chance(1, 3)) {
            let name = live.swap_remove(rng.below(live.len() as u64) as usize);
            let started = set.op_count();
            match fs.unlink(dir, &name) {
                Ok(()) => ops.push(SideOp {
                    name,
                    create: None,
                    started,
                    returned: set.op_count(),
                    synced_at: None,
                }),
                Err(e) if gone(&e) => live.push(name),
                Err(e) => return Err(format!("unlink: {e}")),
            }
            continue;
        }
        next += 1;
        let name = side_name(who, next);
        let byte = (rng.next_u64() as u8) | 1;
        let data = Arc::new(vec![byte; 1 + rng.below(6000) as usize]);
        let started = set.op_count();
        let ino = match fs.mknod(Cred::ROOT, dir, &name, 0o100_644, 0) {
            Ok(a) => a.ino,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(format!("create: {e}")),
        };
        ops.push(SideOp {
            name: name.clone(),
            create: Some(Arc::clone(&data)),
            started,
            returned: set.op_count(),
            synced_at: None,
        });
        live.push(name);
        match fs
            .write(Cred::ROOT, ino, 0, &data)
            .and_then(|_| fs.fsync(ino))
        {
            Ok(()) => {
                if let Some(op) = ops.last_mut() {
                    op.synced_at = Some(set.op_count());
                }
            }
            Err(e) if gone(&e) => {}
            Err(e) => return Err(format!("write and fsync: {e}")),
        }
    }
    Ok(ops)
}

/// Checks the shared directory of a filesystem recovered from the crash image at device
/// operation `g` against what the threads did (`threads[who]`, in order).
/// `barriers`: the workload's syncs, unmounts and shutdowns, (began, returned).
pub(super) fn check_side(
    fs: &Fs,
    threads: &[Vec<SideOp>],
    barriers: &[(usize, usize)],
    g: usize,
    data: DataMode,
) -> Result<(), String> {
    if threads.is_empty() {
        return Ok(());
    }
    let dir = fs
        .lookup(ROOT_INO, SIDE_DIR)
        .map_err(|e| format!("the side threads' directory: {e}"))?
        .ino;
    let mut got: Vec<BTreeMap<Vec<u8>, u64>> = vec![BTreeMap::new(); threads.len()];
    for (e, _) in fs.readdir(dir, 0, 1 << 20).map_err(|e| e.to_string())? {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let who = whose(&e.name)
            .filter(|&w| w < threads.len())
            .ok_or_else(|| format!("side: {} is no thread's name", show(&e.name)))?;
        got[who].insert(e.name, e.ino);
    }
    // Per thread, the prefixes whose names are the ones found (a name created and unlinked
    // again leaves the same names as before it), none shorter than its last fsynced create or
    // than what it had returned from before a sync (or unmount) that returned by the crash.
    let synced_before = barriers
        .iter()
        .filter(|&&(_, returned)| returned <= g)
        .map(|&(began, _)| began)
        .max();
    let mut prefixes: Vec<Vec<usize>> = Vec::with_capacity(threads.len());
    for (who, ops) in threads.iter().enumerate() {
        let found: BTreeSet<&[u8]> = got[who].keys().map(Vec::as_slice).collect();
        let fsynced = ops
            .iter()
            .rposition(|o| o.synced_at.is_some_and(|s| s <= g))
            .map_or(0, |i| i + 1);
        let need = synced_before.map_or(fsynced, |b| {
            fsynced.max(ops.iter().take_while(|o| o.returned < b).count())
        });
        let mut names: BTreeSet<&[u8]> = BTreeSet::new();
        let mut fits = Vec::new();
        for k in 0..=ops.len() {
            if k > 0 {
                let o = &ops[k - 1];
                // Nothing that began after the crash can be in its image.
                if o.started > g {
                    break;
                }
                match o.create {
                    Some(_) => names.insert(&o.name),
                    None => names.remove(o.name.as_slice()),
                };
            }
            if k >= need && names == found {
                fits.push(k);
            }
        }
        if fits.is_empty() {
            return Err(format!(
                "side: thread {who}'s names {:?} are those of no prefix of its operations from {need} (its last fsynced create, or its last before a sync) on",
                found.iter().map(|n| show(n)).collect::<Vec<_>>()
            ));
        }
        prefixes.push(fits);
    }
    if !cut_exists(threads, &prefixes, &mut Vec::new()) {
        return Err(format!(
            "side: no serial order reaches the names found: per thread, the prefixes that fit {prefixes:?} each leave out an operation that returned before one they hold began"
        ));
    }
    for (who, names) in got.iter().enumerate() {
        for (name, &ino) in names {
            // The newest create of the name (names are not reused).
            let Some(o) = threads[who].iter().rev().find(|o| o.name == *name) else {
                continue;
            };
            let Some(want) = &o.create else { continue };
            let c = contents(fs, ino)?;
            let fits = if o.synced_at.is_some_and(|s| s <= g) {
                c == **want
            } else {
                c.len() <= want.len()
                    && c.iter()
                        .zip(want.iter())
                        .all(|(a, b)| a == b || (data == DataMode::Writeback && *a == 0))
            };
            if !fits {
                return Err(format!(
                    "side: {} ({} bytes, fsynced at device operation {:?}) reads {} bytes that are not {}",
                    show(name),
                    want.len(),
                    o.synced_at,
                    c.len(),
                    if o.synced_at.is_some_and(|s| s <= g) { "its contents" } else { "a prefix of its contents" }
                ));
            }
        }
    }
    Ok(())
}

/// Whether some choice of one prefix per thread (`prefixes[who]`, after those `chosen`) is a
/// cut of a serial order: no operation it leaves out returned before one it holds began.
fn cut_exists(threads: &[Vec<SideOp>], prefixes: &[Vec<usize>], chosen: &mut Vec<usize>) -> bool {
    let who = chosen.len();
    if who == threads.len() {
        let began_last = (0..who)
            .filter(|&t| chosen[t] > 0)
            .map(|t| threads[t][chosen[t] - 1].started)
            .max();
        let first_left_out = (0..who)
            .filter_map(|t| threads[t].get(chosen[t]))
            .map(|o| o.returned)
            .min();
        return match (began_last, first_left_out) {
            (Some(b), Some(r)) => r >= b,
            _ => true,
        };
    }
    prefixes[who].iter().any(|&k| {
        chosen.push(k);
        let ok = cut_exists(threads, prefixes, chosen);
        chosen.pop();
        ok
    })
}

/// The side files written with byte `b` (a stale-data failure's possible sources).
pub(super) fn written_with(threads: &[Vec<SideOp>], b: u8) -> Vec<String> {
    threads
        .iter()
        .flatten()
        .filter(|o| o.create.as_ref().is_some_and(|d| d.first() == Some(&b)))
        .map(|o| {
            format!(
                "side file {} ({} bytes)",
                show(&o.name),
                o.create.as_ref().map_or(0, |d| d.len())
            )
        })
        .collect()
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, create: bool, started: usize, returned: usize) -> SideOp {
        SideOp {
            name: name.as_bytes().to_vec(),
            create: create.then(|| Arc::new(vec![1])),
            started,
            returned,
            synced_at: None,
        }
    }

    /// A cut may hold an operation only with every one that returned before it began, on
    /// any thread; operations that overlapped may be cut either way.
    #[test]
    fn a_cut_holds_what_returned_before_what_it_holds_began() {
        // Thread 0 creates a (device operations 1-2); thread 1 then creates b (5-6).
        let threads = vec![vec![op("t0-1", true, 1, 2)], vec![op("t1-1", true, 5, 6)]];
        let cut = |k0: usize, k1: usize| cut_exists(&threads, &[vec![k0], vec![k1]], &mut vec![]);
        assert!(cut(0, 0));
        assert!(cut(1, 0));
        assert!(cut(1, 1));
        assert!(!cut(0, 1), "b without a, though a returned before b began");
        // Overlapping: either alone is a cut.
        let threads = vec![vec![op("t0-1", true, 1, 6)], vec![op("t1-1", true, 2, 7)]];
        let cut = |k0: usize, k1: usize| cut_exists(&threads, &[vec![k0], vec![k1]], &mut vec![]);
        assert!(cut(0, 1) && cut(1, 0));
        // Some choice among the prefixes that fit will do.
        let threads = vec![
            vec![op("t0-1", true, 1, 2), op("t0-1", false, 3, 4)],
            vec![op("t1-1", true, 5, 6)],
        ];
        assert!(cut_exists(&threads, &[vec![0, 2], vec![1]], &mut vec![]));
        assert!(!cut_exists(&threads, &[vec![0], vec![1]], &mut vec![]));
    }

    #[test]
    fn names_say_whose_they_are() {
        assert_eq!(whose(&side_name(1, 17)), Some(1));
        assert_eq!(whose(b"f3"), None);
        assert_eq!(whose(b"t-3"), None);
    }
}
