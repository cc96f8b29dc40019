//! An fsx-style random test through a real mount: random writes, reads, truncates, every
//! fallocate mode, reads and writes through a shared mapping (msync'd, as fsx's mapread
//! and mapwrite), and block-aligned O_DIRECT reads and writes (fsx's -Z) on one file, each applied to an in-memory copy as well, and after each
//! operation the file's size and whole contents compared with the copy. Now and then the
//! kernel's clean pages are dropped (so reads reach the daemon), the file is fsynced, or closed
//! and opened again; at the end the image is unmounted and checked, and compared once more
//! after a remount. Runs with and without the kernel's writeback cache. Needs root and
//! /dev/fuse.
//!
//! Seeded and sized from the environment:
//! `CILFS_FSX_OPS=1000000 CILFS_FSX_SEED=7 cargo test --release -p cilfs --test mount_fsx -- --nocapture`
//! (default 3000 operations, seed 1).
#![allow(clippy::unwrap_used)]

use cilfs_device::rng::SimRng;
use cilfs_device::AlignedBuf;
use rustix::fs::{Advice, FallocateFlags};
use rustix::io::Errno;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

mod common;
use common::Mounted;

/// The file stays below this size (so a whole-file compare after each operation is cheap).
const FILE_MAX: u64 = 256 * 1024;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the run did, by kind; `refused` counts the modes the kernel answered EOPNOTSUPP to
/// itself (Linux 6.18's FUSE sends no COLLAPSE_RANGE, INSERT_RANGE or UNSHARE_RANGE; a kernel
/// that does has them checked like the others).
#[derive(Debug, Default)]
struct Tally {
    writes: u64,
    reads: u64,
    map_writes: u64,
    map_reads: u64,
    direct_writes: u64,
    direct_reads: u64,
    truncates: u64,
    fallocates: [u64; 8],
    einval: u64,
    refused: u64,
}

struct Fsx {
    rng: SimRng,
    model: Vec<u8>,
    bs: u64,
    tally: Tally,
}

/// fallocate's modes in the order `Tally::fallocates` counts them.
const MODES: [(FallocateFlags, &str); 8] = [
    (FallocateFlags::empty(), "allocate"),
    (FallocateFlags::KEEP_SIZE, "allocate keep_size"),
    (
        FallocateFlags::PUNCH_HOLE.union(FallocateFlags::KEEP_SIZE),
        "punch_hole",
    ),
    (FallocateFlags::ZERO_RANGE, "zero_range"),
    (
        FallocateFlags::ZERO_RANGE.union(FallocateFlags::KEEP_SIZE),
        "zero_range keep_size",
    ),
    (FallocateFlags::COLLAPSE_RANGE, "collapse_range"),
    (FallocateFlags::INSERT_RANGE, "insert_range"),
    (FallocateFlags::UNSHARE_RANGE, "unshare_range"),
];

impl Fsx {
    /// A range inside or a little past the file: (offset, length), length at least 1.
    fn range(&mut self, max_len: u64) -> (u64, u64) {
        let reach = (self.model.len() as u64 + 16 * 1024).min(FILE_MAX);
        let off = self.rng.below(reach);
        let len = 1 + self.rng.below(max_len.min(FILE_MAX - off).max(1));
        (off, len)
    }

    fn write(&mut self, f: &File, i: u64) {
        let (off, len) = self.range(64 * 1024);
        let data: Vec<u8> = (0..len).map(|k| ((i * 31 + k) % 251) as u8 + 1).collect();
        f.write_all_at(&data, off).unwrap();
        let end = (off + len) as usize;
        if self.model.len() < end {
            self.model.resize(end, 0);
        }
        self.model[off as usize..end].copy_from_slice(&data);
        self.tally.writes += 1;
    }

    fn read(&mut self, f: &File, i: u64) {
        let (off, len) = self.range(64 * 1024);
        let mut buf = vec![0u8; len as usize];
        let n = read_full(f, &mut buf, off);
        let want = self.model.get(off as usize..).unwrap_or(&[]);
        let want = &want[..want.len().min(len as usize)];
        assert_eq!(n, want.len(), "op {i}: read of {len} at {off}: length");
        assert!(buf[..n] == *want, "op {i}: read of {len} at {off} differs");
        self.tally.reads += 1;
    }

    /// A block-aligned range inside or a little past the file, for O_DIRECT: (offset, length).
    fn aligned_range(&mut self) -> (u64, u64) {
        let blocks = FILE_MAX / self.bs;
        let reach = (self.model.len() as u64).div_ceil(self.bs) + 4;
        let first = self.rng.below(reach.min(blocks));
        let len = 1 + self.rng.below((blocks - first).min(16));
        (first * self.bs, len * self.bs)
    }

    /// An O_DIRECT write of whole blocks through `d` (the file opened O_DIRECT), from an
    /// aligned buffer: into holes it reaches the device before the transaction that maps it.
    fn direct_write(&mut self, d: &File, i: u64) {
        let (off, len) = self.aligned_range();
        let mut buf = AlignedBuf::zeroed(len as usize);
        for (k, b) in buf.iter_mut().enumerate() {
            *b = ((i * 13 + k as u64) % 251) as u8 + 1;
        }
        d.write_all_at(&buf, off).unwrap();
        let end = (off + len) as usize;
        if self.model.len() < end {
            self.model.resize(end, 0);
        }
        self.model[off as usize..end].copy_from_slice(&buf);
        self.tally.direct_writes += 1;
    }

    /// An O_DIRECT read of whole blocks through `d`.
    fn direct_read(&mut self, d: &File, i: u64) {
        let (off, len) = self.aligned_range();
        let mut buf = AlignedBuf::zeroed(len as usize);
        let n = read_full(d, &mut buf, off);
        let want = self.model.get(off as usize..).unwrap_or(&[]);
        let want = &want[..want.len().min(len as usize)];
        assert_eq!(
            n,
            want.len(),
            "op {i}: direct read of {len} at {off}: length"
        );
        assert!(
            buf[..n] == *want,
            "op {i}: direct read of {len} at {off} differs"
        );
        self.tally.direct_reads += 1;
    }

    /// A write through a shared mapping of the range (the file grown to its end first, as
    /// fsx's mapwrite does), msync'd before the unmap.
    fn map_write(&mut self, f: &File, i: u64) {
        let (off, len) = self.range(64 * 1024);
        let end = off + len;
        if end > self.model.len() as u64 {
            f.set_len(end).unwrap();
            self.model.resize(end as usize, 0);
        }
        let data: Vec<u8> = (0..len).map(|k| ((i * 17 + k) % 251) as u8 + 1).collect();
        let map = Mapping::new(f, off, len, true);
        map.bytes()[..].copy_from_slice(&data);
        map.sync();
        self.model[off as usize..end as usize].copy_from_slice(&data);
        self.tally.map_writes += 1;
    }

    /// A read through a shared mapping of a range inside the file.
    fn map_read(&mut self, f: &File, i: u64) {
        let size = self.model.len() as u64;
        if size == 0 {
            return;
        }
        let off = self.rng.below(size);
        let len = 1 + self.rng.below((size - off).min(64 * 1024));
        let map = Mapping::new(f, off, len, false);
        let want = &self.model[off as usize..(off + len) as usize];
        assert!(
            map.bytes()[..] == *want,
            "op {i}: mapped read of {len} at {off} differs"
        );
        self.tally.map_reads += 1;
    }

    fn truncate(&mut self, f: &File) {
        let size = self.rng.below(FILE_MAX);
        f.set_len(size).unwrap();
        self.model.resize(size as usize, 0);
        self.tally.truncates += 1;
    }

    fn fallocate(&mut self, f: &File, i: u64) {
        let k = self.rng.below(MODES.len() as u64) as usize;
        let (flags, name) = MODES[k];
        let shift = k == 5 || k == 6;
        let (mut off, mut len) = self.range(32 * 1024);
        if shift && !self.rng.chance(1, 10) {
            off = off / self.bs * self.bs;
            len = len.div_ceil(self.bs) * self.bs;
        }
        let size = self.model.len() as u64;
        let end = off + len;
        if !flags.contains(FallocateFlags::KEEP_SIZE) && !shift && end > FILE_MAX
            || k == 6 && size + len > FILE_MAX
        {
            return;
        }
        let r = rustix::fs::fallocate(f, flags, off, len);
        let aligned = off % self.bs == 0 && len % self.bs == 0;
        let invalid = shift && (!aligned || (k == 5 && end >= size) || (k == 6 && off >= size));
        match r {
            Err(Errno::OPNOTSUPP) if k >= 5 => {
                self.tally.refused += 1;
                return;
            }
            Err(Errno::INVAL) if invalid => {
                self.tally.einval += 1;
                return;
            }
            Err(e) => panic!("op {i}: {name} of {len} at {off} (size {size}): {e}"),
            Ok(()) if invalid => panic!("op {i}: {name} of {len} at {off} (size {size}) succeeded"),
            Ok(()) => {}
        }
        let m = &mut self.model;
        let inside = off.min(size) as usize..end.min(size) as usize;
        match k {
            2..=4 => m[inside].fill(0),
            5 => drop(m.drain(off as usize..end as usize)),
            6 => drop(m.splice(off as usize..off as usize, vec![0u8; len as usize])),
            _ => {}
        }
        if matches!(k, 0 | 3 | 7) && end > size {
            m.resize(end as usize, 0);
        }
        self.tally.fallocates[k] += 1;
    }

    /// Size and whole contents against the model.
    fn compare(&self, f: &File, i: u64) {
        let size = f.metadata().unwrap().len();
        assert_eq!(size, self.model.len() as u64, "op {i}: size");
        let mut buf = vec![0u8; self.model.len() + 1];
        let n = read_full(f, &mut buf, 0);
        assert_eq!(n, self.model.len(), "op {i}: read to the end");
        if buf[..n] != self.model[..] {
            let at = buf.iter().zip(&self.model).position(|(a, b)| a != b);
            panic!(
                "op {i}: contents differ first at byte {at:?} of {n}: {:?} where {:?}",
                at.map(|p| buf[p]),
                at.map(|p| self.model[p])
            );
        }
    }
}

/// A shared mapping of bytes `[off, off + len)` of a file (from the page below `off`): the
/// only unsafe code here, mmap's.
struct Mapping {
    base: *mut std::ffi::c_void,
    map_len: usize,
    skip: usize,
    len: usize,
}

#[allow(unsafe_code)]
impl Mapping {
    fn new(f: &File, off: u64, len: u64, write: bool) -> Mapping {
        let page = rustix::param::page_size() as u64;
        let start = off / page * page;
        let map_len = (off + len - start) as usize;
        let prot = match write {
            true => rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            false => rustix::mm::ProtFlags::READ,
        };
        // SAFETY: a fresh mapping the kernel places; only `bytes` touches it, inside its
        // length, and `drop` unmaps it.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                map_len,
                prot,
                rustix::mm::MapFlags::SHARED,
                f,
                start,
            )
        }
        .unwrap();
        Mapping {
            base,
            map_len,
            skip: (off - start) as usize,
            len: len as usize,
        }
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes(&self) -> &mut [u8] {
        // SAFETY: inside the mapping, which lives as long as `self`; one user at a time.
        unsafe { std::slice::from_raw_parts_mut(self.base.cast::<u8>().add(self.skip), self.len) }
    }

    fn sync(&self) {
        // SAFETY: the whole mapping, still mapped.
        unsafe { rustix::mm::msync(self.base, self.map_len, rustix::mm::MsyncFlags::SYNC) }
            .unwrap();
    }
}

#[allow(unsafe_code)]
impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `new` with this length, and no slice of it outlives `self`.
        unsafe { rustix::mm::munmap(self.base, self.map_len) }.unwrap();
    }
}

/// Reads until `buf` is full or the end of the file: the bytes read.
fn read_full(f: &File, buf: &mut [u8], off: u64) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

fn open(m: &Mounted) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(m.p("fsx"))
        .unwrap()
}

/// The file opened again with O_DIRECT.
fn open_direct(m: &Mounted) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(m.p("fsx"))
        .unwrap()
}

/// One run over a fresh mount with `opts`, seeded by `CILFS_FSX_SEED` plus `salt`.
fn fsx(opts: &[&str], salt: u64) {
    let env_seed = env_u64("CILFS_FSX_SEED", 1);
    let seed = env_seed + salt;
    let ops = env_u64("CILFS_FSX_OPS", 3000);
    let m = Mounted::new("128M", opts);
    let bs = rustix::fs::statvfs(&m.dir).unwrap().f_bsize;
    let mut x = Fsx {
        rng: SimRng::new(seed),
        model: Vec::new(),
        bs,
        tally: Tally::default(),
    };
    let mut f = open(&m);
    let d = open_direct(&m);
    for i in 0..ops {
        match x.rng.below(100) {
            0..=24 => x.write(&f, i),
            25..=29 => x.direct_write(&d, i),
            30..=40 => x.read(&f, i),
            41..=44 => x.direct_read(&d, i),
            45..=49 => x.map_write(&f, i),
            50..=54 => x.map_read(&f, i),
            55..=62 => x.truncate(&f),
            63..=94 => x.fallocate(&f, i),
            95..=96 => rustix::fs::fadvise(&f, 0, None, Advice::DontNeed).unwrap(),
            97..=98 => f.sync_all().unwrap(),
            _ => f = open(&m),
        }
        x.compare(&f, i);
    }
    drop((f, d));
    m.unmount();
    m.mount(opts);
    x.compare(&open(&m), ops);
    m.unmount();
    eprintln!(
        "fsx {opts:?} seed {seed}: {ops} operations: {:?}; modes {}",
        x.tally,
        MODES
            .iter()
            .zip(x.tally.fallocates)
            .map(|((_, n), c)| format!("{n} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!(
        "a million: CILFS_FSX_OPS=1000000 CILFS_FSX_SEED={env_seed} cargo test --release -p \
         cilfs --test mount_fsx -- --nocapture"
    );
    assert!(x.tally.fallocates.iter().sum::<u64>() > ops / 8);
}

#[test]
fn fsx_against_a_copy_in_memory() {
    fsx(&[], 0);
}

#[test]
fn fsx_with_the_writeback_cache() {
    fsx(&["writeback_cache"], 1);
}
