//! The checker with and without read-ahead, on a filesystem of every kind of item and on
//! damaged copies of it.

#![allow(clippy::unwrap_used)]

use super::{check_with, CheckReport, ReadAheadMode, Role};
use crate::fs::tests::{jcfg, layout, mount, new_dev, BS};
use crate::fs::tree::node::{NODE_HEADER_BYTES, NODE_LSN_OFFSET};
use crate::fs::types::Cred;
use crate::fs::*;
use crate::log::stamp::write_lsn_stamp;
use crate::log::Lsn;
use cilfs_device::rng::SimRng;
use cilfs_device::{AlignedBuf, Device, OverlayDevice, SimDevice, WriteFlags};
use std::sync::Arc;

/// Directories, files with data, hard links, symlinks, inline and remote xattrs; unmounted.
pub(super) fn populated() -> Arc<SimDevice> {
    let dev = new_dev(9);
    let fs = mount(&dev, FsOptions::default());
    let c = Cred::ROOT;
    let mut dirs = vec![ROOT_INO];
    for d in 0..6 {
        let p = dirs[d % dirs.len()];
        dirs.push(
            fs.mkdir(c, p, format!("dir{d}").as_bytes(), 0o755)
                .unwrap()
                .ino,
        );
    }
    for i in 0..120usize {
        let p = dirs[i % dirs.len()];
        let name = format!("file-{i:04}");
        let f = fs.mknod(c, p, name.as_bytes(), 0o100_644, 0).unwrap().ino;
        if i % 3 == 0 {
            fs.write(c, f, 0, &vec![i as u8 + 1; 1000 + (i % 5) * 1500])
                .unwrap();
        }
        if i % 7 == 0 {
            let d = dirs[(i + 1) % dirs.len()];
            fs.link(f, d, format!("hard-{i}").as_bytes()).unwrap();
        }
        if i % 11 == 0 {
            fs.symlink(c, p, format!("sym-{i}").as_bytes(), b"some/target")
                .unwrap();
        }
        if i % 13 == 0 {
            let v = vec![7u8; if i % 2 == 0 { 3000 } else { 20 }];
            fs.setxattr(f, b"user.x", &v, types::XattrFlags::default())
                .unwrap();
        }
    }
    fs.unmount().unwrap();
    dev
}

/// The tree nodes of the clean image.
pub(super) fn tree_nodes(dev: &Arc<SimDevice>) -> Vec<u64> {
    let (r, _) = super::check_image(dev.clone() as Arc<dyn Device>, None).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    r.blocks
        .iter()
        .filter(|b| b.2 == Role::TreeNode)
        .map(|b| b.0)
        .collect()
}

/// A copy of `img` with one to three bytes of a tree node flipped (its header, its entries
/// or its values) and its stamp made valid again: damage decoding does not always catch.
pub(super) fn damaged(
    img: &Arc<SimDevice>,
    nodes: &[u64],
    rng: &mut SimRng,
    case: u64,
) -> Arc<SimDevice> {
    let d = Arc::new(SimDevice::from_image(img.stable_image(), img.len(), case));
    let bs = BS as usize;
    let blk = nodes[rng.below(nodes.len() as u64) as usize];
    let at = blk * bs as u64;
    let mut b = AlignedBuf::zeroed(bs);
    d.read(at, &mut b).unwrap();
    let count = usize::from(u16::from_le_bytes([b[6], b[7]]));
    for _ in 0..1 + rng.below(3) {
        let p = match rng.below(3) {
            0 => rng.below(bs as u64) as usize,
            1 => NODE_HEADER_BYTES + rng.below((count * 20).max(1) as u64) as usize,
            _ => bs - 1 - rng.below((bs / 2) as u64) as usize,
        };
        let o = usize::from(NODE_LSN_OFFSET);
        if (o..o + 8).contains(&p) {
            continue;
        }
        b[p] ^= 1 << rng.below(8);
    }
    let o = usize::from(NODE_LSN_OFFSET);
    let lsn = Lsn::from_raw(u64::from_le_bytes(b[o..o + 8].try_into().unwrap()));
    write_lsn_stamp(&mut b, NODE_LSN_OFFSET, lsn, &layout().uuid);
    d.write(at, &b, WriteFlags::FUA).unwrap();
    d
}

/// Opens `dev` read-only over an overlay, as `check_image` does.
pub(super) fn open(dev: &Arc<SimDevice>) -> Option<Arc<Fs>> {
    let data: Arc<dyn Device> = Arc::new(OverlayDevice::new(dev.clone() as Arc<dyn Device>));
    let j = crate::journal::Journal::open_salvage(data, None, jcfg()).ok()?;
    let opts = FsOptions {
        read_only: true,
        ..FsOptions::default()
    };
    Fs::open(j, opts).ok()
}

/// Everything a report says, to compare.
pub(super) fn said(r: FsResult<CheckReport>) -> Result<String, String> {
    r.map(|r| format!("{r:?}")).map_err(|e| e.to_string())
}

/// Read-ahead changes how blocks are read, not what is found: the same report, problems in
/// the same order, on the clean filesystem and on damaged copies; and fewer device reads.
#[test]
fn read_ahead_finds_what_the_walk_alone_finds_with_fewer_reads() {
    let dev = populated();
    let nodes = tree_nodes(&dev);
    let reads = |mode| {
        let fs = open(&dev).unwrap();
        let before = dev.stats().reads;
        let r = check_with(&fs, mode).unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
        dev.stats().reads - before
    };
    let (alone, ahead) = (reads(ReadAheadMode::Never), reads(ReadAheadMode::Always));
    assert!(
        ahead * 2 <= alone,
        "{ahead} device reads with read-ahead, {alone} without"
    );
    let mut rng = SimRng::new(5);
    let mut found = 0;
    for case in 0..400 {
        let d = damaged(&dev, &nodes, &mut rng, case);
        let (Some(a), Some(b)) = (open(&d), open(&d)) else {
            continue;
        };
        let alone = said(check_with(&a, ReadAheadMode::Never));
        let ahead = said(check_with(&b, ReadAheadMode::Always));
        assert_eq!(alone, ahead, "case {case}");
        found += usize::from(alone.is_ok_and(|r| !r.contains("problems: []")));
    }
    assert!(found > 100, "only {found} damaged copies had problems");
}
