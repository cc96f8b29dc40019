//! A damaged image, opened: the input patches a small populated image (a cleanly unmounted
//! one, or one whose log holds checkpoints to replay), then the target reads the log as check
//! and logprint do, checks the image, and if it mounts walks and changes it a little and
//! unmounts. Patching a real image explores damage that passes the superblock and the magic
//! numbers, where random bytes never would.
//!
//! Input: a first byte choosing the base image (even: clean, odd: log to replay), then
//! patches, each a 4-byte little-endian offset (taken modulo the image's length), a control
//! byte and data. The control byte's low 5 bits are the data's length; 0 zeroes the whole
//! block the offset falls in. Its high bit reseals the block after the patch: a node's or the
//! header's LSN stamp CRC, or the superblock's CRC, recomputed, so the damage is one a CRC
//! does not catch (a bad memory write before the block was sealed).

use cilfs_core::check;
use cilfs_core::format::superblock::SbLog;
use cilfs_core::format::{header_crc, HEADER_BYTES, HEADER_CRC_OFFSET};
use cilfs_core::fs::items::header::{HEADER_LSN_OFFSET, HEADER_MAGIC};
use cilfs_core::fs::tree::node::{NODE_LSN_OFFSET, NODE_MAGIC};
use cilfs_core::fs::types::Cred;
use cilfs_core::fs::types::XattrFlags;
use cilfs_core::fs::{mkfs, Fs, FsOptions, Timespec, ROOT_INO};
use cilfs_core::journal::{self, Journal, JournalConfig, PushMode};
use cilfs_core::log::stamp::write_lsn_stamp;
use cilfs_core::log::{FlushPolicy, LogConfig, Lsn};
use cilfs_core::mkfs::{write_filesystem, Layout};
use cilfs_device::{CrashOptions, Device, SimDevice, SparseImage, WriteFlags};
use std::sync::{Arc, OnceLock};

pub const BLOCK_SIZE: u32 = 2048;
/// 512 KiB in all: the smallest log the journal takes (four rings of two 16 KiB iclogs, 128
/// KiB), the free list mkfs sets aside (64 blocks), and room for a tree of two levels.
pub const BLOCKS: u64 = 512;
const LOG_BLOCKS: u64 = 64;
const UUID: [u8; 16] = [0x7E; 16];
/// Entries made in the directory "d": enough for a fs tree of two levels.
const DIR_FILES: usize = 24;

fn layout() -> Layout {
    Layout {
        uuid: UUID,
        block_size: BLOCK_SIZE,
        data_blocks: BLOCKS,
        log: SbLog::Internal { start: 1 },
        log_blocks: LOG_BLOCKS,
        // The front backup lies at 1 MiB, past this whole image: the layout of images made
        // before backups, which mounts as it did (backups have tests of their own).
        backups: false,
    }
}

/// A small log with small iclogs, checkpointing inline: deterministic, and wrap and
/// backpressure come soon.
fn jcfg() -> JournalConfig {
    JournalConfig {
        log: LogConfig {
            logbufs: 2,
            logbsize: 16 * 1024,
            policy: FlushPolicy::Reduced,
        },
        cil_limit: Some(16 * 1024),
        push_mode: PushMode::Inline,
        cache_bytes_max: Some(1 << 20),
        log_force_interval: None,
        cil_sharding: Default::default(),
    }
}

fn opts() -> FsOptions {
    FsOptions {
        // Time stands still: the same input makes the same image.
        clock: Arc::new(|| Timespec {
            sec: 1_700_000_000,
            nsec: 0,
        }),
        // A fixed small cache (16 shards): the default grows with the machine's memory, to
        // 1,024 shards that every unmount and writeback walks, most of an unmount's time here.
        inode_cache_max: 4096,
        ..FsOptions::default()
    }
}

fn mount(dev: &Arc<SimDevice>) -> Result<Arc<Fs>, String> {
    let j =
        Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).map_err(|e| e.to_string())?;
    Fs::open(j, opts()).map_err(|e| e.to_string())
}

/// The two base images: a clean one, and the same after a few fsynced changes and a crash, so
/// its log holds checkpoints to replay.
struct Bases {
    clean: SparseImage,
    dirty: SparseImage,
}

fn build() -> Result<Bases, String> {
    let dev = Arc::new(SimDevice::new(BLOCKS * u64::from(BLOCK_SIZE), 1));
    write_filesystem(&*dev, None, &layout(), &mut |_, _| {}).map_err(|e| e.to_string())?;
    let j =
        Journal::open(dev.clone() as Arc<dyn Device>, None, jcfg()).map_err(|e| e.to_string())?;
    mkfs::format(&j, 0, 0).map_err(|e| e.to_string())?;
    j.unmount().map_err(|e| e.to_string())?;
    let fs = mount(&dev)?;
    let e = |e: cilfs_core::fs::FsError| e.to_string();
    let c = Cred::ROOT;
    let d = fs.mkdir(c, ROOT_INO, b"d", 0o755).map_err(e)?.ino;
    for i in 0..DIR_FILES {
        let name = format!("entry-number-{i:03}");
        fs.mknod(c, d, name.as_bytes(), 0o100_644, 0).map_err(e)?;
    }
    let f = fs.mknod(c, ROOT_INO, b"f", 0o100_644, 0).map_err(e)?.ino;
    fs.write(c, f, 0, &[0xAB; 3000]).map_err(e)?;
    // A second extent, past a hole.
    fs.write(c, f, 4 * u64::from(BLOCK_SIZE), &[0xCD; 100])
        .map_err(e)?;
    fs.setxattr(f, b"user.small", b"inline value", XattrFlags::default())
        .map_err(e)?;
    fs.setxattr(f, b"user.big", &[0x42; 700], XattrFlags::default())
        .map_err(e)?;
    let acl = [
        2u32.to_le_bytes().as_slice(),
        &[1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff],
        &[2, 0, 4, 0, 0xe8, 3, 0, 0],
        &[4, 0, 4, 0, 0xff, 0xff, 0xff, 0xff],
        &[0x10, 0, 4, 0, 0xff, 0xff, 0xff, 0xff],
        &[0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
    ]
    .concat();
    fs.setxattr(f, b"system.posix_acl_access", &acl, XattrFlags::default())
        .map_err(e)?;
    fs.symlink(c, ROOT_INO, b"s", b"d/entry-number-001")
        .map_err(e)?;
    fs.unmount().map_err(e)?;
    let clean = dev.stable_image();

    let fs = mount(&dev)?;
    let g = fs.mknod(c, ROOT_INO, b"g", 0o100_644, 0).map_err(e)?.ino;
    fs.write(c, g, 0, &[0x11; 2500]).map_err(e)?;
    fs.fsync(g).map_err(e)?;
    fs.unlink(d, b"entry-number-002").map_err(e)?;
    fs.fsync(d).map_err(e)?;
    let crashed = dev.crash(CrashOptions { torn_writes: false });
    drop(fs);
    Ok(Bases {
        clean,
        dirty: crashed.stable_image(),
    })
}

fn bases() -> &'static Bases {
    static BASES: OnceLock<Bases> = OnceLock::new();
    BASES.get_or_init(|| match build() {
        Ok(b) => b,
        // The base image is made by the code under test from fixed steps: failing to make it
        // is a bug of its own, not an input's.
        Err(e) => panic!("making the base image: {e}"),
    })
}

/// Image length in bytes.
pub fn image_bytes() -> u64 {
    BLOCKS * u64::from(BLOCK_SIZE)
}

/// Recomputes the CRC of the block at `blkno` where it has one this target knows.
fn reseal(dev: &SimDevice, blkno: u64) {
    let bs = BLOCK_SIZE as usize;
    let at = blkno * u64::from(BLOCK_SIZE);
    let mut b = vec![0u8; bs];
    if dev.read(at, &mut b).is_err() {
        return;
    }
    if blkno == 0 {
        let crc = header_crc(&b[..HEADER_BYTES]);
        b[HEADER_CRC_OFFSET..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    } else {
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let off = match magic {
            NODE_MAGIC => NODE_LSN_OFFSET,
            HEADER_MAGIC => HEADER_LSN_OFFSET,
            _ => return,
        };
        let o = usize::from(off);
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&b[o..o + 8]);
        write_lsn_stamp(&mut b, off, Lsn::from_raw(u64::from_le_bytes(raw)), &UUID);
    }
    let _ = dev.write(at, &b, WriteFlags::FUA);
}

/// The base image with the input's patches applied.
fn patched(data: &[u8]) -> Arc<SimDevice> {
    let b = bases();
    let base = if data.first().is_some_and(|x| x & 1 == 1) {
        &b.dirty
    } else {
        &b.clean
    };
    let len = image_bytes();
    let dev = Arc::new(SimDevice::from_image(base.clone(), len, 0));
    let bs = u64::from(BLOCK_SIZE);
    let mut rest = data.get(1..).unwrap_or(&[]);
    while rest.len() >= 5 {
        let off = u64::from(u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]])) % len;
        let ctl = rest[4];
        let n = usize::from(ctl & 0x1f).min(rest.len() - 5);
        let blkno = off / bs;
        if ctl & 0x1f == 0 {
            let _ = dev.write(blkno * bs, &vec![0u8; bs as usize], WriteFlags::FUA);
        } else {
            // Writes are whole sectors: read the sector(s) the patch touches, patch, write.
            let start = off / 512 * 512;
            let end = (off + n as u64).div_ceil(512) * 512;
            let end = end.min(len);
            let mut buf = vec![0u8; (end - start) as usize];
            if dev.read(start, &mut buf).is_ok() {
                let p = (off - start) as usize;
                let m = n.min(buf.len() - p);
                buf[p..p + m].copy_from_slice(&rest[5..5 + m]);
                let _ = dev.write(start, &buf, WriteFlags::FUA);
            }
        }
        if ctl & 0x80 != 0 {
            reseal(&dev, blkno);
        }
        rest = &rest[5 + n..];
    }
    dev
}

/// Reads, and changes when `write`, what the mounted filesystem lets it, ignoring errors:
/// every call must return.
fn exercise(fs: &Fs, write: bool) {
    let c = Cred::ROOT;
    let _ = fs.getattr(ROOT_INO);
    let mut inos = vec![ROOT_INO];
    if let Ok(d) = fs.lookup(ROOT_INO, b"d") {
        inos.push(d.ino);
    }
    for dir in inos.clone() {
        let Ok(entries) = fs.readdir(dir, 0, 256) else {
            continue;
        };
        for (e, _) in entries.iter().take(40) {
            if let Ok(a) = fs.lookup(dir, &e.name) {
                inos.push(a.ino);
            }
        }
        // And from the middle, as a reader resuming would.
        if let Some((_, cookie)) = entries.get(entries.len() / 2) {
            let _ = fs.readdir(dir, *cookie, 256);
        }
    }
    inos.sort_unstable();
    inos.dedup();
    for &ino in inos.iter().take(48) {
        let _ = fs.getattr(ino);
        let _ = fs.read(ino, 0, 16 * 1024);
        let _ = fs.readlink(ino);
        if let Ok(names) = fs.listxattr(ino) {
            for n in names.iter().take(8) {
                let _ = fs.getxattr(ino, n);
            }
        }
    }
    if !write {
        return;
    }
    if let Ok(f) = fs.lookup(ROOT_INO, b"f") {
        let _ = fs.write(c, f.ino, 1000, &[7; 3000]);
        let _ = fs.setxattr(f.ino, b"user.small", b"changed", XattrFlags::default());
    }
    if let Ok(n) = fs.mknod(c, ROOT_INO, b"new-file", 0o100_644, 0) {
        let _ = fs.write(c, n.ino, 0, &[9; 5000]);
        let _ = fs.fsync(n.ino);
    }
    if let Ok(d) = fs.lookup(ROOT_INO, b"d") {
        let _ = fs.unlink(d.ino, b"entry-number-003");
        let _ = fs.mkdir(c, d.ino, b"sub", 0o755);
    }
    let _ = fs.unlink(ROOT_INO, b"f");
}

pub fn image(data: &[u8]) {
    let dev = patched(data);
    let _ = journal::scan(&*dev, None);
    let _ = check::check_image(dev.clone() as Arc<dyn Device>, None);
    let Ok(fs) = mount(&dev) else {
        return;
    };
    // Writes go on whatever the checker says: an edit of a leaf a damaged parent misroutes is
    // refused as corrupt (`KeyRange`), so the debug check that each publish's leaves are
    // routed (`fs/txn/debug.rs`, `assert_leaves_routed`) holds on damaged trees too.
    let write = true;
    exercise(&fs, write);
    let _ = check::check(&fs);
    let _ = fs.unmount();
    drop(fs);
    // What the mount left, read again.
    let _ = check::check_image(dev as Arc<dyn Device>, None);
}

/// Offsets of the image's metadata: the superblock, the log's first sectors, and every block
/// holding the header or a tree node, in the base image (`data[0]` chooses).
pub fn metadata_offsets(dirty: bool) -> Vec<u64> {
    let b = bases();
    let img = if dirty { &b.dirty } else { &b.clean };
    let bs = u64::from(BLOCK_SIZE);
    let mut out = vec![0, bs, bs + 512, bs + 1024];
    let mut blk = vec![0u8; bs as usize];
    for n in (1 + LOG_BLOCKS)..BLOCKS {
        img.read(n * bs, &mut blk);
        let magic = u32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
        if magic == NODE_MAGIC || magic == HEADER_MAGIC {
            out.push(n * bs);
        }
    }
    out
}

/// One patch: `bytes` at `off`, resealed or not.
pub fn patch(off: u64, bytes: &[u8], reseal: bool) -> Vec<u8> {
    let n = bytes.len().min(31);
    let mut v = (off as u32).to_le_bytes().to_vec();
    v.push(n as u8 | if reseal { 0x80 } else { 0 });
    v.extend_from_slice(&bytes[..n]);
    v
}

/// Both base images untouched, and a flipped byte and a zeroed block at each metadata block.
pub fn image_seeds() -> Vec<Vec<u8>> {
    let mut out = vec![vec![0], vec![1]];
    for dirty in [false, true] {
        for (i, off) in metadata_offsets(dirty).into_iter().enumerate() {
            let mut v = vec![u8::from(dirty)];
            // A byte of the header or the first entry's key, then the whole block.
            v.extend(patch(off + 40 + (i as u64 % 24), &[0xFF], i % 2 == 0));
            out.push(v);
            let mut z = vec![u8::from(dirty)];
            z.extend((off as u32).to_le_bytes());
            z.push(0);
            out.push(z);
        }
    }
    out
}
