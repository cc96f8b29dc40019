//! `cilfs repair`: makes an unmounted image consistent again, offline, without mounting it.
//!
//! 1. The log is replayed up to any damage and closed clean (`Journal::open_salvage`, then a
//!    clean unmount), so no later mount replays an old item over a block repair rewrites.
//! 2. Every fs-tree item is collected from the tree (`scan::walk`); a subtree that does not
//!    read, verify or decode is a lost key range, which a scan of the whole data area for
//!    stamped fs-tree leaves fills in (`scan::scan_leaves`), the newest stamp winning a key.
//! 3. The items are salvaged and fixed until the checker has nothing to say (`salvage`,
//!    `fixup`): undecodable items dropped, blocks owned once, names, links, sizes, orphans,
//!    unreachable inodes in `/lost+found`.
//! 4. Trees that changed are bulk-loaded into blocks that are free in the repaired image and
//!    unused by the old one's trees (`build`); once they are stable the header is written
//!    (`header`) and flushed: a crash in between leaves the old image whole.
//!
//! A second run finds nothing to change. A dry run writes into an overlay and says what it
//! would change.

mod build;
mod fixup;
mod header;
mod salvage;
mod scan;
#[cfg(all(test, not(loom)))]
mod tests;

use crate::check::{check_image, CheckError};
use crate::fs::items::header::{Header, TREE_FREE_BY_BLOCK, TREE_FREE_BY_SIZE, TREE_FS};
use crate::fs::tree::node::Key;
use crate::journal::{Journal, JournalConfig, JournalError};
use crate::log::Lsn;
use cilfs_device::{AlignedBuf, Device, DeviceError, OverlayDevice, WriteFlags};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Where the header and the data area are, from the superblock (as mkfs lays them out).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Area {
    pub hdr_blk: u64,
    pub start: u64,
    pub end: u64,
}

/// What repair is doing, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairProgress {
    pub phase: &'static str,
    pub done: u64,
    pub total: u64,
}

#[derive(Default)]
pub struct RepairOptions {
    /// Write nothing: work in an overlay and report what would change.
    pub dry_run: bool,
    pub progress: Option<Box<dyn FnMut(RepairProgress) + Send>>,
}

#[derive(Debug, Clone, Default)]
pub struct RepairReport {
    /// Every change made (or, in a dry run, that would be made), in order.
    pub changes: Vec<String>,
    /// The log was damaged: it was replayed up to the damage and the rest discarded.
    pub log_damaged: bool,
    /// Checkpoints replayed from a log that was not clean.
    pub checkpoints_replayed: u64,
    /// Something beyond the replay of a dirty but whole log was changed: damage repaired.
    pub damage_repaired: bool,
    /// Some tree (fs or free space) was rebuilt.
    pub rebuilt_trees: bool,
    /// Inodes named or owning items, whose inode item was not found.
    pub inodes_lost: u64,
    pub moved_to_lost_found: u64,
    /// Blocks of the data area read by the scan for surviving leaves (0 when nothing was lost).
    pub blocks_scanned: u64,
    /// Fs-tree leaves the scan found, and items it took from them.
    pub leaves_found: u64,
    pub items_salvaged: u64,
    /// Items of the fs tree after repair.
    pub items: u64,
    /// What the checker finds afterwards (in a dry run: in the image the repair would leave).
    pub problems_left: Vec<String>,
}

impl std::fmt::Debug for RepairOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepairOptions")
            .field("dry_run", &self.dry_run)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl RepairReport {
    pub fn changed(&self) -> bool {
        !self.changes.is_empty()
    }
}

/// Why repair could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error("{0}")]
    Journal(#[from] JournalError),
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    #[error("checking the result: {0}")]
    Check(#[from] CheckError),
    #[error("the data area (blocks {start}..{end}) is too small to rebuild the trees in")]
    NoSpace { start: u64, end: u64 },
}

/// The image's data device in blocks, read and written directly (the journal is closed).
pub(crate) struct Img {
    dev: Arc<dyn Device>,
    bs: usize,
    uuid: [u8; 16],
}

impl Img {
    fn read_blocks(&self, blk: u64, n: usize) -> Result<AlignedBuf, DeviceError> {
        let mut b = AlignedBuf::zeroed(self.bs * n);
        self.dev.read(blk * self.bs as u64, &mut b)?;
        Ok(b)
    }

    fn read(&self, blk: u64) -> Result<AlignedBuf, DeviceError> {
        self.read_blocks(blk, 1)
    }

    fn write(&self, blk: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.dev.write(
            blk * self.bs as u64,
            &AlignedBuf::from_slice(data),
            WriteFlags::NONE,
        )
    }
}

/// Calls the progress callback, if any.
pub(crate) struct Progress(Option<Box<dyn FnMut(RepairProgress) + Send>>);

impl Progress {
    fn tell(&mut self, phase: &'static str, done: u64, total: u64) {
        if let Some(f) = &mut self.0 {
            f(RepairProgress { phase, done, total });
        }
    }
}

/// Repairs an unmounted image (see the module comment).
pub fn repair_image(
    data: Arc<dyn Device>,
    logdev: Option<Arc<dyn Device>>,
    opts: RepairOptions,
) -> Result<RepairReport, RepairError> {
    let (data, logdev) = if opts.dry_run {
        (
            Arc::new(OverlayDevice::new(data)) as Arc<dyn Device>,
            logdev.map(|l| Arc::new(OverlayDevice::new(l)) as Arc<dyn Device>),
        )
    } else {
        (data, logdev)
    };
    let mut progress = Progress(opts.progress);
    let mut report = RepairReport::default();

    // The superblock's copies first, so that everything after reads the primary.
    report.changes.extend(
        crate::format::geometry::repair_copies(&*data, logdev.as_deref(), opts.dry_run)
            .map_err(JournalError::from)?,
    );
    let sb_changes = report.changes.len();
    progress.tell("log", 0, 1);
    let stamp = close_log(&data, logdev.as_ref(), &mut report)?;
    let log_changes = report.changes.len();
    progress.tell("log", 1, 1);

    let geo = crate::Geometry::read(&*data, logdev.as_deref()).map_err(JournalError::from)?;
    let (hdr_blk, data_end) = geo.metadata_area();
    let img = Img {
        dev: Arc::clone(&data),
        bs: geo.sb.block_size as usize,
        uuid: geo.sb.uuid,
    };
    if report.log_damaged {
        restamp_past_head(&img, hdr_blk, data_end, stamp, &mut report, &mut progress)?;
    }
    // What check finds consistent needs nothing more (repair is done when check is clean):
    // its trees are left as they are, as e2fsck leaves a clean filesystem.
    progress.tell("check", 0, 1);
    let before = check_image(Arc::clone(&data), logdev.clone());
    progress.tell("check", 1, 1);
    // A check that cannot run is damage for the repair below to meet.
    if before.is_ok_and(|(r, _)| r.is_clean()) {
        report.damage_repaired = report.log_damaged || sb_changes > 0;
        clear_needs_check(&*data, logdev.as_deref(), opts.dry_run, &mut report)?;
        return Ok(report);
    }
    let area = Area {
        hdr_blk,
        start: hdr_blk + 1,
        end: data_end,
    };
    if area.end <= area.start + 8 {
        return Err(RepairError::NoSpace {
            start: area.start,
            end: area.end,
        });
    }

    // The old image: header and trees as far as they read.
    let OldImage {
        old_hdr,
        fs_walk,
        free_walks,
    } = read_old(&img, &area, &mut report, &mut progress)?;
    let walked: BTreeMap<Key, Vec<u8>> = fs_walk
        .items
        .iter()
        .map(|(k, (_, v))| (*k, v.clone()))
        .collect();

    // The items, salvaged and fixed.
    progress.tell("fix", 0, 1);
    let mut old_nodes: Vec<u64> = fs_walk.readable.clone();
    if let Some((b, s)) = &free_walks {
        old_nodes.extend(&b.readable);
        old_nodes.extend(&s.readable);
    }
    let mut m = salvage::Model::new(
        walked.clone(),
        &img,
        &area,
        old_hdr.as_ref().map_or(0, |h| h.next_ino),
    );
    m.salvage();
    m.claim_blocks(&old_nodes)?;
    fixup::fix(&mut m)?;
    report.inodes_lost = m.inodes_lost.len() as u64;
    report.moved_to_lost_found = m.moved_to_lost_found;
    report.items = m.items.len() as u64;
    report.changes.append(&mut m.changes);
    progress.tell("fix", 1, 1);

    // What must be rebuilt, and the new header.
    let fs_changed = m.items != walked;
    let rebuild_fs = old_hdr.is_none() || !fs_walk.lost.is_empty() || fs_walk.unsound();
    let plan = header::plan(
        &img,
        &area,
        old_hdr.as_ref(),
        &fs_walk,
        free_walks.as_ref(),
        &m,
        rebuild_fs || fs_changed,
        &mut report.changes,
    )?;
    report.rebuilt_trees = plan.rebuild_fs || plan.rebuild_free;

    progress.tell("write", 0, 1);
    for (blk, bytes) in &m.block_fixes {
        img.write(*blk, bytes)?;
    }
    header::write(&img, &area, &plan, stamp, &mut progress)?;
    progress.tell("write", 1, 1);

    report.damage_repaired = report.log_damaged || report.changes.len() > log_changes;

    // Dry run or not, the checker judges the image repair leaves (it reads through an
    // overlay of its own).
    let (after, _) = check_image(Arc::clone(&data), logdev.clone())?;
    report.problems_left = after.problems;
    if report.problems_left.is_empty() {
        clear_needs_check(&*data, logdev.as_deref(), opts.dry_run, &mut report)?;
    }
    Ok(report)
}

/// The old image: its header, and its trees as far as they read; the keys the fs tree lost
/// looked for in a scan of the data area.
fn read_old(
    img: &Img,
    area: &Area,
    report: &mut RepairReport,
    progress: &mut Progress,
) -> Result<OldImage, RepairError> {
    let old_hdr = header::read(img, area, &mut report.changes)?;
    let mut fs_walk = match &old_hdr {
        Some(h) => scan::walk(img, area, h.fs_root, TREE_FS, progress)?,
        None => scan::Walked::all_lost(),
    };
    let free_walks = match &old_hdr {
        Some(h) => Some((
            scan::walk(img, area, h.bno_root, TREE_FREE_BY_BLOCK, progress)?,
            scan::walk(img, area, h.size_root, TREE_FREE_BY_SIZE, progress)?,
        )),
        None => None,
    };
    for (lo, hi) in &fs_walk.lost {
        report.changes.push(format!(
            "fs tree: keys {lo:?}..{} unreadable ({})",
            hi.map_or("the end".to_string(), |h| format!("{h:?}")),
            fs_walk.lost_why.get(lo).map_or("", String::as_str)
        ));
    }
    if !fs_walk.lost.is_empty() {
        // The free extents, if both free-space trees read whole and agree: the scan skips them.
        let free = free_walks.as_ref().and_then(|(b, s)| {
            let by_block: Vec<(u64, u64)> = b.items.keys().map(|k| (k.a, k.b)).collect();
            let by_size: BTreeSet<(u64, u64)> = s.items.keys().map(|k| (k.b, k.a)).collect();
            (b.lost.is_empty()
                && s.lost.is_empty()
                && by_block.len() == by_size.len()
                && by_block.iter().all(|e| by_size.contains(e)))
            .then_some(by_block)
        });
        let st = scan::scan_leaves(img, area, &mut fs_walk, free, progress)?;
        report.blocks_scanned = st.blocks;
        report.leaves_found = st.leaves;
        report.items_salvaged = st.items;
        report.changes.push(format!(
            "scan: {} blocks read, {} fs-tree leaves found, {} items taken from them",
            st.blocks, st.leaves, st.items
        ));
    }
    Ok(OldImage {
        old_hdr,
        fs_walk,
        free_walks,
    })
}

/// What `read_old` read of the old image.
struct OldImage {
    old_hdr: Option<Header>,
    fs_walk: scan::Walked,
    /// The free-space trees by block and by size, when the header read.
    free_walks: Option<(scan::Walked, scan::Walked)>,
}

/// A consistent image owes no check: the superblock's needs-check mark (a mount met a corrupt
/// block) is cleared, as e2fsck clears ext4's error state.
fn clear_needs_check(
    data: &dyn Device,
    logdev: Option<&dyn Device>,
    dry_run: bool,
    report: &mut RepairReport,
) -> Result<(), RepairError> {
    let mut sb = crate::Geometry::read(data, logdev)
        .map_err(JournalError::from)?
        .sb;
    if !sb.needs_check {
        return Ok(());
    }
    sb.needs_check = false;
    if !dry_run {
        crate::format::geometry::write_superblock(data, &sb, WriteFlags::FUA)?;
    }
    report.changes.push(format!(
        "superblock: needs-check mark {}",
        if dry_run {
            "would be cleared"
        } else {
            "cleared"
        }
    ));
    Ok(())
}

/// After a damaged log is cut short, blocks that checkpoints past the damage had written back
/// carry stamps past the new log head: the log will hand out those LSNs again, and replay
/// would then take such a block for newer than a checkpoint that changes it. Each is stamped
/// with the head (`stamp`), its contents kept as they are: they are what the trees on disk
/// hold, which the rest of the repair makes consistent.
fn restamp_past_head(
    img: &Img,
    first: u64,
    end: u64,
    stamp: Lsn,
    report: &mut RepairReport,
    progress: &mut Progress,
) -> Result<(), RepairError> {
    use crate::fs::items::header::HEADER_LSN_OFFSET;
    use crate::fs::tree::node::NODE_LSN_OFFSET;
    use crate::log::stamp::{read_lsn_stamp, write_lsn_stamp};
    const BATCH: u64 = 256;
    let mut restamped = 0u64;
    let mut at = first;
    while at < end {
        let n = BATCH.min(end - at);
        let mut chunk = img.read_blocks(at, n as usize)?;
        for (i, b) in chunk.chunks_mut(img.bs).enumerate() {
            for off in [NODE_LSN_OFFSET, HEADER_LSN_OFFSET] {
                if read_lsn_stamp(b, off, &img.uuid).is_some_and(|l| l > stamp) {
                    write_lsn_stamp(b, off, stamp, &img.uuid);
                    img.write(at + i as u64, b)?;
                    restamped += 1;
                    break;
                }
            }
        }
        at += n;
        progress.tell("restamping", at - first, end - first);
    }
    if restamped > 0 {
        img.dev.flush()?;
        report.changes.push(format!(
            "log: {restamped} blocks written back by the discarded checkpoints restamped to the \
             new log head"
        ));
    }
    Ok(())
}

/// Replays the log up to any damage and leaves it clean: the LSN a block repair writes is
/// stamped with (the unmount record's, older than every checkpoint a later mount writes and
/// no older than any checkpoint before it, so replay never overwrites what repair wrote).
fn close_log(
    data: &Arc<dyn Device>,
    logdev: Option<&Arc<dyn Device>>,
    report: &mut RepairReport,
) -> Result<Lsn, RepairError> {
    let (geo, s) = crate::journal::scan(&**data, logdev.map(|l| &**l))?;
    let damaged = matches!(s.end, crate::log::recover::LogEnd::Damaged { .. });
    let exhausted = crate::journal::counters_exhausted(&geo.sb, &s);
    let dirty = !geo.sb.clean || !s.checkpoints.is_empty();
    if dirty || damaged || exhausted {
        let j = Journal::open_salvage(Arc::clone(data), logdev.cloned(), JournalConfig::default())?;
        let rec = j.recovery_report().clone();
        j.unmount()?;
        drop(j);
        report.log_damaged = rec.damaged;
        report.checkpoints_replayed = rec.checkpoints_replayed;
        for d in &rec.replay.damaged {
            report.changes.push(format!(
                "log replay: {d}: left failing its CRC, for the rest of repair"
            ));
        }
        if rec.damaged {
            report.changes.push(format!(
                "log: {}; {} checkpoints replayed up to the damage, the rest discarded",
                rec.torn.as_deref().unwrap_or("damaged"),
                rec.checkpoints_replayed
            ));
        } else if dirty {
            report.changes.push(format!(
                "log: not clean, {} checkpoints replayed",
                rec.checkpoints_replayed
            ));
        }
        if rec.counters_reset {
            report.log_damaged = true;
            report.changes.push(
                "superblock: the log generation or the unclean-mount epoch was at its largest \
                 value: the log was zeroed after replay and both started again (a file's \
                 change attribute may repeat a value seen before)"
                    .into(),
            );
        }
    }
    let (_, s) = crate::journal::scan(&**data, logdev.map(|l| &**l))?;
    Ok(s.records.last().map_or(s.tail, |r| r.header.lsn))
}
