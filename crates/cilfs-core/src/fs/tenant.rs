//! Tenants (docs/ARCHITECTURE.md, tenants): project IDs on directory trees, as XFS project quotas, and IO limits per
//! project, enforced here because every IO of a FUSE filesystem is done by its daemon (a host
//! cgroup on a tenant's processes throttles nothing).
//!
//! - A project is a number in the inode (`Inode::project`); new inodes take their directory's.
//!   A rename or hard link into a directory of another project is EXDEV (`may_enter`), as XFS
//!   answers for a directory with an inherited project. The tenant is the data's project, not
//!   the caller's uid or gid: write back and the flusher act for no caller, and a file two
//!   users share would otherwise be charged to two budgets.
//! - Limits per project (write and read IOPS and bytes/s) live in the root directory as xattrs
//!   `trusted.cilfs.tenant.<id>` (kept across remounts, replayed like any metadata), and in the
//!   `Throttle` of the data device. Project 0 is never limited.
//! - Only file data IO is charged, and it waits for its budget in the thread of the request
//!   that does it, holding nothing but that inode's IO lock (`cache/iolock.rs`): metadata and the
//!   journal never wait for a tenant, and the periodic write back only takes budget that is
//!   there now (`Throttle::try_admit`), leaving a throttled tenant's pages to its own fsync or
//!   a later round.
//! - Set and read through virtual xattrs, which both FUSE transports pass through:
//!   `user.cilfs.project` on any inode, `user.cilfs.tenant.<id>` and `user.cilfs.tenants` on the
//!   root (`cilfs tenant` uses them). Changing them takes root.

use super::error::{FsError, FsResult};
use super::items::inode::{Inode, ROOT_INO};
use super::types::XattrFlags;
use super::types::{Capability, Cred};
use super::{log_inode, Fs};
use cilfs_device::{IoDir, TenantId, TenantLimits, TenantStats, WriteFlags};

/// A file's or directory's project, as decimal text.
pub const PROJECT_XATTR: &[u8] = b"user.cilfs.project";
/// On the root, followed by a project ID: that project's limits.
pub const TENANT_XATTR_PREFIX: &[u8] = b"user.cilfs.tenant.";
/// On the root: every project with limits or IO, a line each.
pub const TENANTS_XATTR: &[u8] = b"user.cilfs.tenants";
/// Where the limits are kept: xattrs of the root no caller may set.
pub(crate) const STORED_PREFIX: &[u8] = b"trusted.cilfs.";
const STORED_LIMITS: &str = "trusted.cilfs.tenant.";

/// A rename or link of `inode` into directory `dir`: refused across projects, unless `dir`
/// has none.
pub(crate) fn may_enter(inode: &Inode, dir: &Inode) -> FsResult<()> {
    if dir.project != 0 && inode.project != dir.project {
        return Err(FsError::CrossProject);
    }
    Ok(())
}

/// Limits as text: `write_iops=N write_bps=N read_iops=N read_bps=N`, 0 for unlimited.
pub fn format_limits(l: &TenantLimits) -> String {
    let n = |v: Option<u64>| v.unwrap_or(0);
    format!(
        "write_iops={} write_bps={} read_iops={} read_bps={}",
        n(l.write_iops),
        n(l.write_bytes_per_s),
        n(l.read_iops),
        n(l.read_bytes_per_s)
    )
}

/// Parses what `format_limits` writes; fields left out are unlimited.
pub fn parse_limits(text: &[u8]) -> FsResult<TenantLimits> {
    let text = std::str::from_utf8(text).map_err(|_| FsError::Invalid("limits are not text"))?;
    let mut l = TenantLimits::default();
    for field in text.split_whitespace() {
        let (k, v) = field
            .split_once('=')
            .ok_or(FsError::Invalid("a limit is written name=value"))?;
        let v: u64 = v
            .parse()
            .map_err(|_| FsError::Invalid("a limit is a whole number"))?;
        let v = (v > 0).then_some(v);
        match k {
            "write_iops" => l.write_iops = v,
            "write_bps" => l.write_bytes_per_s = v,
            "read_iops" => l.read_iops = v,
            "read_bps" => l.read_bytes_per_s = v,
            _ => {
                return Err(FsError::Invalid(
                    "unknown limit (write_iops, write_bps, read_iops, read_bps)",
                ))
            }
        }
    }
    Ok(l)
}

fn parse_id(text: &[u8]) -> FsResult<u32> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or(FsError::Invalid(
            "a project ID is a number from 0 to 4294967295",
        ))
}

impl Fs {
    /// Reads file data for project `project`, waiting for its read budget first.
    /// Blocks whose data the log holds read as their buffers say (`Journal::
    /// logged_data_buffers`, taken before the device read so none is evicted meanwhile).
    pub(crate) fn data_read(&self, project: u32, disk: u64, buf: &mut [u8]) -> FsResult<()> {
        self.throttle
            .admit(TenantId(project), IoDir::Read, buf.len());
        let blocks = (buf.len() as u64).div_ceil(u64::from(self.bs));
        let logged = self
            .journal
            .logged_data_buffers(disk, disk.saturating_add(blocks));
        self.journal
            .data
            .read(self.data_offset(disk)?, buf)
            .map_err(FsError::from)?;
        if !logged.is_empty() {
            self.journal.overlay_logged_data(&logged, disk, buf);
        }
        Ok(())
    }

    /// The byte offset of data block `disk`, which a damaged extent may put past 2^64 bytes.
    fn data_offset(&self, disk: u64) -> FsResult<u64> {
        disk.checked_mul(u64::from(self.bs))
            .ok_or_else(|| FsError::corrupt(0, format!("data block {disk} past any device")))
    }

    /// Waits for project `project`'s budget to write `bytes` (file data that goes into the
    /// log, which `data_write` does not see).
    pub(crate) fn admit_write(&self, project: u32, bytes: usize) {
        self.throttle.admit(TenantId(project), IoDir::Write, bytes);
    }

    /// Writes file data for project `project`, waiting for its write budget first.
    pub(crate) fn data_write(&self, project: u32, disk: u64, buf: &[u8]) -> FsResult<()> {
        self.throttle
            .admit(TenantId(project), IoDir::Write, buf.len());
        let offset = self.data_offset(disk)?;
        self.wait_write_back(disk, buf);
        self.journal
            .data
            .write(offset, buf, WriteFlags::NONE)
            .map_err(FsError::from)
    }

    /// A block given to a file may have been freed while the AIL was writing an older image of
    /// it back (a tree node, or file data the log held): the file's data goes after that.
    fn wait_write_back(&self, disk: u64, buf: &[u8]) {
        let blocks = (buf.len() as u64).div_ceil(u64::from(self.bs));
        self.journal.wait_write_back(disk, disk + blocks);
    }

    /// Writes file data only if project `project` has the budget for it now (false: nothing
    /// written, nothing charged).
    pub(crate) fn data_try_write(&self, project: u32, disk: u64, buf: &[u8]) -> FsResult<bool> {
        if !self
            .throttle
            .try_admit(TenantId(project), IoDir::Write, buf.len())
        {
            return Ok(false);
        }
        let offset = self.data_offset(disk)?;
        self.wait_write_back(disk, buf);
        self.journal.data.write(offset, buf, WriteFlags::NONE)?;
        Ok(true)
    }

    /// The project of `ino`.
    pub fn project(&self, ino: u64) -> FsResult<u32> {
        self.retrying(|| {
            let st = self.read_state();
            Ok(self.peek_inode(&st, ino)?.project)
        })
    }

    /// Puts `ino` in project `project` (root only, or CAP_SYS_ADMIN for a kernel-checked
    /// caller; XFS also lets the owner in the initial namespace, which cilfs cannot tell).
    /// What it holds keeps its projects: `cilfs tenant assign` walks a tree.
    pub fn set_project(&self, cred: Cred, ino: u64, project: u32) -> FsResult<()> {
        if !self.capable(cred, Capability::SysAdmin) {
            return Err(FsError::NotPermitted);
        }
        self.retrying(|| {
            self.check_writable()?;
            let mut st = self.write_state();
            let now = self.now();
            self.with_tx(&mut st, |t, inodes| {
                let m = Fs::inode_mut(t, inodes, ino)?;
                m.inode.project = project;
                self.touch_ctime(m, now);
                log_inode(t, m, &self.stats)?;
                Ok(((), vec![ino]))
            })?;
            Ok(())
        })
    }

    /// Sets project `id`'s limits (root only; all unlimited removes them), kept in the
    /// filesystem and applied at once.
    pub fn set_tenant_limits(&self, cred: Cred, id: u32, limits: TenantLimits) -> FsResult<()> {
        if !self.capable(cred, Capability::SysAdmin) {
            return Err(FsError::NotPermitted);
        }
        if id == 0 {
            return Err(FsError::Invalid("project 0 is never limited"));
        }
        let name = format!("{STORED_LIMITS}{id}");
        let value = format_limits(&limits);
        let r = self.set_xattr_inner(
            Cred::ROOT,
            ROOT_INO,
            name.as_bytes(),
            (!limits.is_unlimited()).then_some(value.as_bytes()),
            XattrFlags::default(),
        );
        match r {
            Ok(()) | Err(FsError::NoAttr) => {}
            Err(e) => return Err(e),
        }
        self.throttle.set_limits(TenantId(id), limits);
        Ok(())
    }

    /// Every project with limits or data IO since mount: its limits and what it did.
    pub fn tenants(&self) -> Vec<(u32, TenantLimits, TenantStats)> {
        self.throttle
            .tenants()
            .into_iter()
            .filter(|(t, _, _)| t.0 != 0)
            .map(|(t, l, s)| (t.0, l, s))
            .collect()
    }

    /// Applies the limits kept in the root's xattrs (at mount).
    pub(crate) fn load_tenant_limits(&self) -> FsResult<()> {
        let names = self.listxattr(ROOT_INO)?;
        for n in names {
            let Some(id) = n.strip_prefix(STORED_LIMITS.as_bytes()) else {
                continue;
            };
            let id = parse_id(id)?;
            let v = self.getxattr(ROOT_INO, &n)?;
            self.throttle.set_limits(TenantId(id), parse_limits(&v)?);
        }
        Ok(())
    }

    /// The tenant virtual xattrs' values, or None for any other name.
    pub(crate) fn tenant_xattr_get(&self, ino: u64, name: &[u8]) -> Option<FsResult<Vec<u8>>> {
        if name == PROJECT_XATTR {
            return Some(self.project(ino).map(|p| p.to_string().into_bytes()));
        }
        if ino != ROOT_INO {
            return None;
        }
        if name == TENANTS_XATTR {
            let mut out = String::new();
            for (id, l, s) in self.tenants() {
                out.push_str(&format!(
                    "{id} {} write_ios={} write_bytes={} write_wait_ms={} read_ios={} read_bytes={} read_wait_ms={}\n",
                    format_limits(&l),
                    s.write.ios,
                    s.write.bytes,
                    s.write.throttle_wait.as_millis(),
                    s.read.ios,
                    s.read.bytes,
                    s.read.throttle_wait.as_millis(),
                ));
            }
            return Some(Ok(out.into_bytes()));
        }
        let id = name.strip_prefix(TENANT_XATTR_PREFIX)?;
        Some(parse_id(id).map(|id| format_limits(&self.throttle.limits(TenantId(id))).into_bytes()))
    }

    /// Sets (or, with no value, clears) a tenant virtual xattr; None for any other name.
    pub(crate) fn tenant_xattr_set(
        &self,
        cred: Cred,
        ino: u64,
        name: &[u8],
        value: Option<&[u8]>,
    ) -> Option<FsResult<()>> {
        if name == PROJECT_XATTR {
            let id = match value {
                Some(v) => parse_id(v),
                None => Ok(0),
            };
            return Some(id.and_then(|id| self.set_project(cred, ino, id)));
        }
        if ino != ROOT_INO {
            return None;
        }
        if name == TENANTS_XATTR {
            return Some(Err(FsError::NotPermitted));
        }
        let id = name.strip_prefix(TENANT_XATTR_PREFIX)?;
        Some((|| {
            let id = parse_id(id)?;
            let limits = match value {
                Some(v) => parse_limits(v)?,
                None => TenantLimits::default(),
            };
            self.set_tenant_limits(cred, id, limits)
        })())
    }

    /// How many projects have limits kept in the root's xattrs (tests).
    #[cfg(test)]
    pub(crate) fn stored_tenant_limits(&self) -> usize {
        self.listxattr(ROOT_INO).map_or(0, |names| {
            names
                .iter()
                .filter(|n| n.starts_with(STORED_LIMITS.as_bytes()))
                .count()
        })
    }
}
