//! The inode flags users set (chattr): what each forbids, as Linux enforces them (EPERM). The
//! FUSE kernel does not learn the flags (its attributes carry none), so every check is here.

use crate::fs::error::{FsError, FsResult};
use crate::fs::items::inode::{Inode, INODE_APPEND, INODE_IMMUTABLE, INODE_USER_FLAGS};
use crate::fs::types::{Capability, Cred};

fn refused(yes: bool) -> FsResult<()> {
    if yes {
        Err(FsError::NotPermitted)
    } else {
        Ok(())
    }
}

/// Immutable or append-only: the inode's own attributes, names and xattrs stay as they are
/// (unlink, rename or link of it, chmod, chown, explicit times, xattr changes; Linux's
/// `may_delete`, `vfs_link`, `notify_change`, `xattr_permission`).
pub(crate) fn may_change(i: &Inode) -> FsResult<()> {
    refused(i.flags & (INODE_IMMUTABLE | INODE_APPEND) != 0)
}

/// Immutable only: what append-only still allows (setting times to now; a name added to an
/// append-only directory).
pub(crate) fn may_touch(i: &Inode) -> FsResult<()> {
    refused(i.flags & INODE_IMMUTABLE != 0)
}

/// A name added to directory `dir`.
pub(crate) fn may_add_entry(dir: &Inode) -> FsResult<()> {
    may_touch(dir)
}

/// A name removed from directory `dir` (an append-only directory only grows).
pub(crate) fn may_remove_entry(dir: &Inode) -> FsResult<()> {
    may_change(dir)
}

/// Data written at `off`: never into an immutable file, and into an append-only one only at
/// its end.
pub(crate) fn may_write(i: &Inode, off: u64) -> FsResult<()> {
    may_touch(i)?;
    refused(i.flags & INODE_APPEND != 0 && off != i.size)
}

/// An open for writing: an append-only file only with O_APPEND.
pub fn may_open(i: &Inode, write: bool, append: bool) -> FsResult<()> {
    if !write {
        return Ok(());
    }
    may_touch(i)?;
    refused(i.flags & INODE_APPEND != 0 && !append)
}

/// The flags of `i` set to `flags` by `cred`: only flags cilfs keeps (EOPNOTSUPP otherwise,
/// as XFS answers), by the owner or root, and immutable or append-only set or cleared only
/// by a caller `capable` of CAP_LINUX_IMMUTABLE. A kernel-checked caller passed the kernel's
/// owner check (`vfs_fileattr_set`); the capability is asked of its process all the same,
/// since the flags are cilfs's to enforce.
pub(crate) fn may_set(
    cred: Cred,
    i: &Inode,
    flags: u32,
    capable: impl Fn(Capability) -> bool,
) -> FsResult<()> {
    if flags & !INODE_USER_FLAGS != 0 {
        return Err(FsError::NotSupported("an inode flag cilfs does not keep"));
    }
    if let Some((uid, _)) = cred.ids() {
        if uid != 0 && uid != i.uid {
            return Err(FsError::NotPermitted);
        }
    }
    let changed = (i.flags ^ flags) & (INODE_IMMUTABLE | INODE_APPEND);
    refused(changed != 0 && !capable(Capability::LinuxImmutable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::items::inode::{Timespec, INODE_NOATIME, INODE_PREALLOC, S_IFREG};

    fn file(flags: u32) -> Inode {
        let mut i = Inode::empty(5, S_IFREG | 0o644, 1000, 1000, Timespec::default());
        i.flags = flags;
        i.size = 10;
        i
    }

    #[test]
    fn immutable_refuses_every_change_and_append_only_all_but_appends() {
        let plain = file(INODE_PREALLOC);
        assert!(may_change(&plain).is_ok() && may_write(&plain, 3).is_ok());
        let imm = file(INODE_IMMUTABLE);
        assert!(matches!(may_change(&imm), Err(FsError::NotPermitted)));
        assert!(matches!(may_write(&imm, 10), Err(FsError::NotPermitted)));
        assert!(matches!(may_add_entry(&imm), Err(FsError::NotPermitted)));
        assert!(matches!(
            may_open(&imm, true, true),
            Err(FsError::NotPermitted)
        ));
        assert!(may_open(&imm, false, false).is_ok());
        let app = file(INODE_APPEND);
        assert!(matches!(may_change(&app), Err(FsError::NotPermitted)));
        assert!(matches!(may_remove_entry(&app), Err(FsError::NotPermitted)));
        assert!(may_add_entry(&app).is_ok() && may_touch(&app).is_ok());
        assert!(may_write(&app, 10).is_ok());
        assert!(matches!(may_write(&app, 9), Err(FsError::NotPermitted)));
        assert!(matches!(
            may_open(&app, true, false),
            Err(FsError::NotPermitted)
        ));
        assert!(may_open(&app, true, true).is_ok());
    }

    #[test]
    fn setting_flags_needs_the_owner_root_for_immutable_and_known_flags() {
        let i = file(0);
        let owner = Cred::user(1000, 1000);
        // What `Fs::capable` answers for a caller the request names: root only.
        let set = |c: Cred, i: &Inode, f| may_set(c, i, f, |_| c.is_uid(0));
        assert!(set(owner, &i, INODE_NOATIME).is_ok());
        assert!(matches!(
            set(Cred::user(1001, 1000), &i, INODE_NOATIME),
            Err(FsError::NotPermitted)
        ));
        assert!(matches!(
            set(owner, &i, INODE_IMMUTABLE),
            Err(FsError::NotPermitted)
        ));
        assert!(set(Cred::ROOT, &i, INODE_IMMUTABLE | INODE_APPEND).is_ok());
        // The owner may change other flags of an immutable file, but not clear it.
        let imm = file(INODE_IMMUTABLE);
        assert!(set(owner, &imm, INODE_IMMUTABLE | INODE_NOATIME).is_ok());
        assert!(matches!(set(owner, &imm, 0), Err(FsError::NotPermitted)));
        assert!(matches!(
            set(Cred::ROOT, &i, INODE_PREALLOC),
            Err(FsError::NotSupported(_))
        ));
    }

    #[test]
    fn a_kernel_checked_caller_sets_immutable_by_its_capability_alone() {
        let i = file(0);
        let anyone = Cred::kernel_checked(42);
        // The kernel checked ownership: any flag but the two that need the capability.
        assert!(may_set(anyone, &i, INODE_NOATIME, |_| false).is_ok());
        assert!(matches!(
            may_set(anyone, &i, INODE_IMMUTABLE, |_| false),
            Err(FsError::NotPermitted)
        ));
        let asked = |c| c == Capability::LinuxImmutable;
        assert!(may_set(anyone, &i, INODE_IMMUTABLE | INODE_APPEND, asked).is_ok());
    }
}
