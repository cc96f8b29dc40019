//! A short fuzz of every target on each test run, with no nightly toolchain: valid encodings
//! from each target's seeds, mutated by a seeded mutator, a fixed number of iterations (no
//! clock). A failure prints the seed, the iteration and the input, and how to replay it:
//!
//!   CILFS_FUZZ_SEED=<seed> cargo test -p cilfs-fuzz-targets --test smoke <target>
//!
//! CILFS_FUZZ_ITERS multiplies the iterations (a longer run without libFuzzer); with
//! CILFS_FUZZ_TRACE set each input is printed before it runs.

use cilfs_fuzz_targets::image;
use cilfs_fuzz_targets::mutate::Mutator;
use cilfs_fuzz_targets::{target, Target};
use std::panic::{catch_unwind, AssertUnwindSafe};

const DEFAULT_SEED: u64 = 0x00C1_1F52;

fn seed() -> u64 {
    std::env::var("CILFS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

fn iterations(base: usize) -> usize {
    let k: usize = std::env::var("CILFS_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    base * k
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs `t` on `input`, and on a panic says how to get the input back before passing it on.
/// With CILFS_FUZZ_TRACE set, every input is printed before it runs: an abort (an allocation
/// too large, a stack overflow) unwinds past `catch_unwind` and prints nothing.
fn run_one(t: &Target, seed: u64, i: usize, input: &[u8]) {
    if std::env::var_os("CILFS_FUZZ_TRACE").is_some() {
        eprintln!("{} {i}: {}", t.name, hex(input));
    }
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| (t.run)(input))) {
        eprintln!(
            "fuzz target {} panicked: seed {seed}, iteration {i}, input ({} bytes) {}\n\
             replay: CILFS_FUZZ_SEED={seed} cargo test -p cilfs-fuzz-targets --test smoke {}",
            t.name,
            input.len(),
            hex(input),
            t.name
        );
        std::panic::resume_unwind(p);
    }
}

/// Every seed as it is, then `n` mutated inputs.
fn smoke(name: &str, n: usize) {
    let t = target(name).expect("a target of that name");
    let seeds = (t.seeds)();
    assert!(!seeds.is_empty(), "{name} has seeds");
    let seed = seed();
    for (i, s) in seeds.iter().enumerate() {
        run_one(t, seed, i, s);
    }
    let mut m = Mutator::new(seed ^ name.len() as u64);
    for i in 0..iterations(n) {
        let input = m.input(&seeds);
        run_one(t, seed, i, &input);
    }
}

#[test]
fn node() {
    smoke("node", 40_000);
}

#[test]
fn inode() {
    smoke("inode", 40_000);
}

#[test]
fn dir() {
    smoke("dir", 40_000);
}

#[test]
fn extent() {
    smoke("extent", 40_000);
}

#[test]
fn xattr() {
    smoke("xattr", 40_000);
}

#[test]
fn acl() {
    smoke("acl", 40_000);
}

#[test]
fn header() {
    smoke("header", 40_000);
}

#[test]
fn log_ops() {
    smoke("log_ops", 5_000);
}

/// The image target, with patches aimed at its metadata (the mutator alone would spend most
/// of them on file data): a few bytes at a random place of a metadata block, resealed or not,
/// or the block zeroed.
#[test]
fn image() {
    let t = target("image").expect("the image target");
    let seed = seed();
    let mut m = Mutator::new(seed);
    let seeds = (t.seeds)();
    let offsets = [
        image::metadata_offsets(false),
        image::metadata_offsets(true),
    ];
    let bs = u64::from(image::BLOCK_SIZE);
    for i in 0..iterations(600) {
        let input = if i % 4 == 3 {
            m.input(&seeds)
        } else {
            let dirty = m.below(2);
            let mut v = vec![dirty as u8];
            for _ in 0..1 + m.below(3) {
                let offs = &offsets[dirty];
                let block = offs[m.below(offs.len())] / bs * bs;
                if m.below(10) == 0 {
                    v.extend((block as u32).to_le_bytes());
                    v.push(0);
                    continue;
                }
                // Mostly the first bytes: header, entries and keys live there.
                let within = if m.below(2) == 0 {
                    m.below(160)
                } else {
                    m.below(bs as usize)
                } as u64;
                let bytes: Vec<u8> = (0..1 + m.below(8)).map(|_| m.below(256) as u8).collect();
                v.extend(image::patch(block + within, &bytes, m.below(2) == 0));
            }
            v
        };
        run_one(t, seed, i, &input);
    }
}

/// Every target has valid inputs to start from; with CILFS_FUZZ_CORPUS set, they are written
/// to `$CILFS_FUZZ_CORPUS/<target>/` (what `fuzz/run` starts an empty corpus with).
#[test]
fn seeds_to_corpus() {
    let dir = std::env::var_os("CILFS_FUZZ_CORPUS").map(std::path::PathBuf::from);
    for t in cilfs_fuzz_targets::TARGETS {
        let seeds = (t.seeds)();
        assert!(!seeds.is_empty(), "{} has seeds", t.name);
        let Some(dir) = &dir else { continue };
        let d = dir.join(t.name);
        std::fs::create_dir_all(&d).expect("corpus directory");
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(d.join(format!("seed-{i}")), s).expect("seed written");
        }
    }
}
