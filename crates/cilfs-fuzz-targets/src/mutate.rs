//! A small seeded mutator for the smoke test: valid encodings changed by bit flips, byte sets,
//! interesting integers, truncations, extensions and splices, as libFuzzer's default
//! mutations do, without coverage feedback. Deterministic from its seed.

use cilfs_device::rng::SimRng;

/// Values that sit on the edges decoders check: zero, one, the maxima of each width, and the
/// sign bits.
const INTERESTING: [u64; 10] = [
    0,
    1,
    0x7f,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    i64::MAX as u64,
    u64::MAX,
];

#[derive(Debug)]
pub struct Mutator {
    rng: SimRng,
}

impl Mutator {
    pub fn new(seed: u64) -> Self {
        Mutator {
            rng: SimRng::new(seed),
        }
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.rng.below(n.max(1) as u64) as usize
    }

    /// An input for a target: a seed changed by one to eight mutations (another seed may be
    /// spliced in), or now and then bytes of no format at all.
    pub fn input(&mut self, seeds: &[Vec<u8>]) -> Vec<u8> {
        if seeds.is_empty() || self.rng.chance(1, 32) {
            let n = self.below(600);
            return (0..n).map(|_| self.rng.next_u64() as u8).collect();
        }
        let mut v = seeds[self.below(seeds.len())].clone();
        for _ in 0..1 + self.below(8) {
            self.mutate(&mut v, seeds);
        }
        v
    }

    fn mutate(&mut self, v: &mut Vec<u8>, seeds: &[Vec<u8>]) {
        let len = v.len();
        match self.below(8) {
            0 if len > 0 => {
                let i = self.below(len);
                v[i] ^= 1 << self.below(8);
            }
            1 if len > 0 => {
                let i = self.below(len);
                v[i] = self.rng.next_u64() as u8;
            }
            2 if len > 0 => {
                // An interesting integer of 1, 2, 4 or 8 bytes, at any offset it fits.
                let w = 1 << self.below(4);
                if len >= w {
                    let i = self.below(len - w + 1);
                    let x = INTERESTING[self.below(INTERESTING.len())];
                    let x = if self.rng.bool() {
                        x
                    } else {
                        x.wrapping_add(self.rng.below(3)).wrapping_sub(1)
                    };
                    v[i..i + w].copy_from_slice(&x.to_le_bytes()[..w]);
                }
            }
            3 => {
                let n = self.below(len + 1);
                v.truncate(n);
            }
            4 => {
                let n = 1 + self.below(64);
                let b = self.rng.next_u64() as u8;
                let random = self.rng.bool();
                for _ in 0..n {
                    v.push(if random { self.rng.next_u64() as u8 } else { b });
                }
            }
            5 if !seeds.is_empty() => {
                // Splice: this one's head, another seed's tail.
                let other = &seeds[self.below(seeds.len())];
                let cut = self.below(len + 1);
                let from = self.below(other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            6 if len > 1 => {
                // A run copied within the input (a count or key duplicated elsewhere).
                let n = 1 + self.below(len.min(32));
                let from = self.below(len - n + 1);
                let to = self.below(len - n + 1);
                v.copy_within(from..from + n, to);
            }
            7 if len > 0 => {
                // A run of zeros or of 0xff.
                let n = 1 + self.below(len.min(64));
                let at = self.below(len - n + 1);
                let b = if self.rng.bool() { 0 } else { 0xff };
                v[at..at + n].fill(b);
            }
            _ => {}
        }
    }
}
