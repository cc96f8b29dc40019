//! Directory entries: fs-tree items keyed by (directory, name hash). A hash bucket holds every
//! name with that hash (collisions are rare at 56 bits, but anyone can make a pair in a minute
//! of CPU), at most `BUCKET_MAX`, each in a slot it keeps while it stays. readdir walks the
//! buckets in hash order; the cookie after an entry is its bucket's hash and slot plus one,
//! plus 3 (0, 1 and 2 mean start, after "." and after ".."), and reading resumes at the slots
//! above it: so a cookie stays valid whatever is created or removed meanwhile, a reader whose
//! buffer fills inside a bucket resumes at its next entry, and removing returned entries hides
//! none that was not returned. (One cookie per bucket skipped the rest of a bucket whenever
//! the kernel's buffer filled after its first entry; positions instead of slots skipped one
//! when an earlier name of the bucket was removed.)

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::inode::FileType;

use crate::fs::items::arr8;

pub const NAME_MAX: usize = 255;

/// The most names one hash bucket holds: each has a slot of its own (0..31), kept in the high
/// bits of its type byte and unchanged while it stays, which readdir's cookie names.
pub const BUCKET_MAX: usize = 31;
const SLOT_SHIFT: u8 = 3;
const KIND_MASK: u8 = (1 << SLOT_SHIFT) - 1;
/// Bits of a cookie for the place in a bucket (`slot + 1`, up to 32): the cookie of the last
/// bucket stays below 2^63, as the kernel takes it as a signed offset.
const PLACE_BITS: u32 = 6;

/// readdir's cookie after the entry in `slot` of bucket `hash`: resume at the slots above it.
pub fn cookie_after(hash: u64, slot: u8) -> u64 {
    debug_assert!(usize::from(slot) < BUCKET_MAX);
    ((hash << PLACE_BITS) | (u64::from(slot) + 1)) + 3
}

/// Where a cookie of 3 or more resumes: the bucket's hash, and the first slot not returned.
pub fn resume_at(cookie: u64) -> (u64, usize) {
    let v = cookie - 3;
    (v >> PLACE_BITS, (v & ((1 << PLACE_BITS) - 1)) as usize)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileType,
    pub name: Vec<u8>,
}

/// Encodes a bucket of `(slot, entry)`: the slot shares the type's byte (its high 5 bits).
pub fn encode_bucket(entries: &[(u8, DirEntry)]) -> Vec<u8> {
    let mut v = Vec::new();
    for (slot, e) in entries {
        debug_assert!(usize::from(*slot) < BUCKET_MAX);
        v.extend_from_slice(&e.ino.to_le_bytes());
        v.push(e.kind.code() | (slot << SLOT_SHIFT));
        v.push(e.name.len() as u8);
        v.extend_from_slice(&e.name);
    }
    v
}

/// The entries of a bucket.
pub fn decode_bucket(b: &[u8], dir: u64) -> FsResult<Vec<DirEntry>> {
    Ok(decode_slotted(b, dir)?
        .into_iter()
        .map(|(_, e)| e)
        .collect())
}

/// The entries of a bucket with their slots, in slot order. A bucket written before slots
/// (every entry in slot 0) gets its entries' places as slots.
pub fn decode_slotted(b: &[u8], dir: u64) -> FsResult<Vec<(u8, DirEntry)>> {
    let raw = decode_raw(b, dir)?;
    let (mut seen, mut twice) = (0u32, false);
    for (code, _) in &raw {
        let slot = code >> SLOT_SHIFT;
        if usize::from(slot) >= BUCKET_MAX {
            return Err(FsError::corrupt(
                0,
                format!("directory {dir}: entry in slot {slot} of a hash bucket"),
            ));
        }
        twice |= seen & (1 << slot) != 0;
        seen |= 1 << slot;
    }
    // A slot seen twice: a bucket from before slots, whose places serve as slots.
    let mut v: Vec<(u8, DirEntry)> = raw
        .into_iter()
        .enumerate()
        .map(|(k, (code, e))| {
            let slot = if twice {
                k.min(BUCKET_MAX - 1) as u8
            } else {
                code >> SLOT_SHIFT
            };
            (slot, e)
        })
        .collect();
    v.sort_by_key(|(s, _)| *s);
    Ok(v)
}

/// The free slot a new entry of `bucket` takes, if any.
pub fn free_slot(bucket: &[(u8, DirEntry)]) -> Option<u8> {
    (0..BUCKET_MAX as u8).find(|s| bucket.iter().all(|(t, _)| t != s))
}

fn decode_raw(b: &[u8], dir: u64) -> FsResult<Vec<(u8, DirEntry)>> {
    let bad = || FsError::corrupt(0, format!("directory {dir}: malformed entry bucket"));
    let mut out = Vec::new();
    let mut p = 0;
    while p < b.len() {
        if p + 10 > b.len() {
            return Err(bad());
        }
        let ino = u64::from_le_bytes(arr8(&b[p..p + 8]));
        let code = b[p + 8];
        let kind = FileType::from_code(code & KIND_MASK).ok_or_else(bad)?;
        let n = usize::from(b[p + 9]);
        if n == 0 || p + 10 + n > b.len() {
            return Err(bad());
        }
        out.push((
            code,
            DirEntry {
                ino,
                kind,
                name: b[p + 10..p + 10 + n].to_vec(),
            },
        ));
        p += 10 + n;
    }
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

pub fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(FsError::Invalid("bad file name"));
    }
    Ok(())
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    fn entry(name: &str) -> DirEntry {
        DirEntry {
            ino: 7,
            kind: FileType::Regular,
            name: name.as_bytes().to_vec(),
        }
    }

    /// Slots round-trip through the type byte and come back in slot order; a slot a removal
    /// freed is the one a new entry takes; a bucket from before slots (all in slot 0) gets
    /// its places as slots; a full bucket has no slot left.
    #[test]
    fn slots_survive_encoding_and_old_buckets_get_their_places() {
        let b = encode_bucket(&[(2, entry("c")), (0, entry("a"))]);
        let got = decode_slotted(&b, 1).unwrap();
        assert_eq!(got, vec![(0, entry("a")), (2, entry("c"))]);
        assert_eq!(free_slot(&got), Some(1));
        let old = encode_bucket(&[(0, entry("x")), (0, entry("y"))]);
        assert_eq!(
            decode_slotted(&old, 1).unwrap(),
            vec![(0, entry("x")), (1, entry("y"))]
        );
        let full: Vec<(u8, DirEntry)> = (0..BUCKET_MAX as u8).map(|s| (s, entry("n"))).collect();
        assert_eq!(free_slot(&full), None);
        // A slot past the last is damage, not a panic.
        let mut bad = encode_bucket(&[(0, entry("a"))]);
        bad[8] |= 31 << SLOT_SHIFT;
        assert!(decode_slotted(&bad, 1).is_err());
        // A single entry in slot 0 is byte for byte what cilfs wrote before slots.
        assert_eq!(
            encode_bucket(&[(0, entry("a"))])[8],
            FileType::Regular.code()
        );
    }
}
