//! Directory entries: fs-tree items keyed by (directory, name hash). A hash bucket holds every
//! name with that hash (collisions are rare at 56 bits, but anyone can make a pair in a minute
//! of CPU), in the order they were added, at most `BUCKET_MAX`. readdir walks the buckets in
//! hash order; the cookie after an entry is its bucket's hash and how many of the bucket's
//! entries have been returned, plus 3 (0, 1 and 2 mean start, after "." and after ".."), so a
//! cookie stays valid whatever is created or removed in other buckets meanwhile, and a reader
//! whose buffer fills inside a bucket resumes at the next entry of it. (One cookie per bucket
//! skipped the rest of a bucket whenever the kernel's buffer filled after its first entry.)

use super::error::{FsError, FsResult};
use super::inode::FileType;
use super::tree::keys::{key, kind_of, name_hash, KIND_DIRENT};
use super::tree::node::{arr8, Key};

pub const NAME_MAX: usize = 255;

/// The most names one hash bucket holds: a cookie keeps a place in a bucket in 6 bits, and
/// the cookie of the last bucket must stay below 2^63 (the kernel takes it as a signed offset).
pub const BUCKET_MAX: usize = 63;
const PLACE_BITS: u32 = 6;

/// readdir's cookie after the `returned` first entries of bucket `hash` (`returned` >= 1).
pub fn cookie_after(hash: u64, returned: usize) -> u64 {
    debug_assert!((1..=BUCKET_MAX).contains(&returned));
    ((hash << PLACE_BITS) | returned as u64) + 3
}

/// Where a cookie of 3 or more resumes: the bucket's hash and the entries of it returned.
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

/// Tree reads shared by transactions and read views.
pub trait TreeRead {
    fn t_get(&mut self, tree: u8, key: Key) -> FsResult<Option<Vec<u8>>>;
    fn t_seek_ge(&mut self, tree: u8, key: Key) -> FsResult<Option<(Key, Vec<u8>)>>;
    fn t_seek_le(&mut self, tree: u8, key: Key) -> FsResult<Option<(Key, Vec<u8>)>>;
}

pub fn encode_bucket(entries: &[DirEntry]) -> Vec<u8> {
    let mut v = Vec::new();
    for e in entries {
        v.extend_from_slice(&e.ino.to_le_bytes());
        v.push(e.kind.code());
        v.push(e.name.len() as u8);
        v.extend_from_slice(&e.name);
    }
    v
}

pub fn decode_bucket(b: &[u8], dir: u64) -> FsResult<Vec<DirEntry>> {
    let bad = || FsError::corrupt(0, format!("directory {dir}: malformed entry bucket"));
    let mut out = Vec::new();
    let mut p = 0;
    while p < b.len() {
        if p + 10 > b.len() {
            return Err(bad());
        }
        let ino = u64::from_le_bytes(arr8(&b[p..p + 8]));
        let kind = FileType::from_code(b[p + 8]).ok_or_else(bad)?;
        let n = usize::from(b[p + 9]);
        if n == 0 || p + 10 + n > b.len() {
            return Err(bad());
        }
        out.push(DirEntry {
            ino,
            kind,
            name: b[p + 10..p + 10 + n].to_vec(),
        });
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

pub fn lookup(t: &mut dyn TreeRead, tree: u8, dir: u64, name: &[u8]) -> FsResult<Option<DirEntry>> {
    let k = key(dir, KIND_DIRENT, name_hash(name));
    let Some(v) = t.t_get(tree, k)? else {
        return Ok(None);
    };
    Ok(decode_bucket(&v, dir)?.into_iter().find(|e| e.name == name))
}

/// Whether the directory has any entry.
pub fn is_empty(t: &mut dyn TreeRead, tree: u8, dir: u64) -> FsResult<bool> {
    let first = t.t_seek_ge(tree, key(dir, KIND_DIRENT, 0))?;
    Ok(!first.is_some_and(|(k, _)| k.a == dir && kind_of(k) == KIND_DIRENT))
}
