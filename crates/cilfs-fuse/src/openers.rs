//! The caller of a request as a [`Cred`], and who opened each file handle. A write the kernel
//! sends from its page cache (a shared writable mmap, or any write with writeback_cache)
//! carries the flusher's credentials, not the writer's, and the set-user-ID rules must judge
//! the writer.

use cilfs_core::fs::types::{Caller, Cred};
use cilfs_fuse_proto::INVALID_UIDGID;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The caller of a request, from its header's ids (no umask: a create adds the one it gets).
/// FUSE_INVALID_UIDGID is no id: with FUSE_ALLOW_IDMAP taken, Linux sends it in every request
/// but the creating ones, having checked the caller itself ([`Caller::KernelChecked`]).
pub(crate) fn caller(uid: u32, gid: u32, pid: u32) -> Cred {
    if uid == INVALID_UIDGID || gid == INVALID_UIDGID {
        return Cred::kernel_checked(pid);
    }
    Cred {
        caller: Caller::Ids { uid, gid },
        pid,
        umask: 0,
    }
}

/// The file handles given out, each with the caller that opened it, until its release.
#[derive(Debug)]
pub(crate) struct Openers {
    openers: Mutex<HashMap<u64, Cred>>,
    next_fh: AtomicU64,
}

impl Openers {
    pub(crate) fn new() -> Self {
        Openers {
            openers: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
    }

    /// A new file handle, remembering who opened it until its release.
    pub(crate) fn open(&self, opener: Cred) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.openers.lock().insert(fh, opener);
        fh
    }

    /// The caller a write is judged as: the opener of its handle for a write from the page
    /// cache (its header names the kernel's flusher), `caller` otherwise (Linux judges the
    /// writing task, not the opener). An opener that exited meanwhile has no supplementary
    /// groups to read, which can only clear set-group-ID, never keep it.
    pub(crate) fn writer(&self, fh: u64, from_page_cache: bool, caller: Cred) -> Cred {
        if from_page_cache {
            if let Some(c) = self.openers.lock().get(&fh) {
                return *c;
            }
        }
        caller
    }

    /// Forgets a released handle.
    pub(crate) fn release(&self, fh: u64) {
        self.openers.lock().remove(&fh);
    }
}
