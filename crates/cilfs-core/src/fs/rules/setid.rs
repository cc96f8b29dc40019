//! The set-user-ID and set-group-ID rules: which bits a change clears, and who counts as a
//! member of a file's group (Linux's `setattr_should_drop_suidgid` and `chown_common`); and the
//! file capabilities a change of a file's data or owner drops (Linux's `cap_inode_killpriv`).

use crate::fs::error::FsResult;
use crate::fs::items::inode::{Inode, S_IFMT, S_IFREG, S_ISGID, S_ISUID};
use crate::fs::types::{Caller, Capability, Cred};
use crate::fs::{Fs, FsState};

/// The xattr holding a file's capabilities (`setcap`): privileges granted to a program, which
/// a change of its data or owner takes away as it takes set-user-ID away.
pub(crate) const CAPS_XATTR: &[u8] = b"security.capability";

impl Fs {
    /// Whether the caller holds CAP_FSETID (Linux's `capable(CAP_FSETID)`): for a caller the
    /// request names, asked of `FsOptions::holds_fsetid` when its process is known, otherwise
    /// root is taken to hold it and nobody else; for a kernel-checked caller, what the kernel
    /// said with the request (it asks for set-ID to go when the caller lacks CAP_FSETID), or
    /// else its process ([`Fs::capable`]).
    pub(crate) fn holds_fsetid(&self, cred: Cred) -> bool {
        let uid = match cred.caller {
            Caller::Ids { uid, .. } => uid,
            Caller::KernelChecked {
                kill_setid: Some(kill),
            } => return !kill,
            Caller::KernelChecked { kill_setid: None } => {
                return self.capable(cred, Capability::Fsetid)
            }
        };
        let known = match &self.opts.holds_fsetid {
            Some(f) if cred.pid != 0 => f(cred.pid, uid),
            _ => None,
        };
        known.unwrap_or(uid == 0)
    }

    /// Whether the caller counts as a member of group `gid` for the set-group-ID rules (Linux's
    /// `in_group_or_capable`): its primary or a supplementary group, or CAP_FSETID. A
    /// kernel-checked caller's groups are its process's: right on a mount without an
    /// idmapping; through an idmapped one they meet the file's group unmapped (the request
    /// carries no idmapping), so a member by the mapping only counts as outside, and a
    /// caller whose own group is the file's on-disk one as inside (docs/SEMANTICS.md).
    pub(crate) fn in_group_or_root(&self, cred: Cred, gid: u32) -> bool {
        cred.ids().is_some_and(|(_, g)| g == gid)
            || self
                .opts
                .groups_of
                .as_ref()
                .is_some_and(|f| cred.pid != 0 && f(cred.pid).contains(&gid))
            || self.holds_fsetid(cred)
    }

    /// Whether `cred` may do what Linux leaves to capability `cap`: for a caller the request
    /// names, root (uid 0) and nobody else, as before idmapped mounts; for a kernel-checked
    /// caller, its process's effective capabilities (`FsOptions::capable`), refused when they
    /// cannot be read.
    pub fn capable(&self, cred: Cred, cap: Capability) -> bool {
        match cred.caller {
            Caller::Ids { uid, .. } => uid == 0,
            Caller::KernelChecked { .. } => {
                let asked = match &self.opts.capable {
                    Some(f) if cred.pid != 0 => f(cred.pid, cap),
                    _ => None,
                };
                asked.unwrap_or(false)
            }
        }
    }

    /// The set-user-ID and set-group-ID bits a change of a regular file's data by `cred` clears
    /// (Linux's `setattr_should_drop_suidgid`): set-user-ID always, set-group-ID when group
    /// execute is set or the caller is outside the file's group; nothing for a caller holding
    /// CAP_FSETID (root, as a rule).
    pub(crate) fn privileges_to_kill(&self, cred: Cred, inode: &Inode) -> u32 {
        if inode.mode & S_IFMT != S_IFREG {
            return 0;
        }
        match self.setid_bits_to_clear(cred, inode) {
            0 => 0,
            _ if self.holds_fsetid(cred) => 0,
            kill => kill,
        }
    }

    /// The bits a change of owner or group clears on anything but a directory (Linux's
    /// `chown_common`, as ext4 and XFS see it): set-user-ID always, even for root;
    /// set-group-ID when group execute is set (even for root), or when the caller is outside
    /// the file's group as it was.
    pub(crate) fn chown_kills(&self, cred: Cred, inode: &Inode) -> u32 {
        if inode.is_dir() {
            return 0;
        }
        self.setid_bits_to_clear(cred, inode)
    }

    /// What both rules clear once they apply: set-user-ID, and set-group-ID when group execute
    /// is set or the caller is outside the file's group.
    fn setid_bits_to_clear(&self, cred: Cred, inode: &Inode) -> u32 {
        let mut kill = inode.mode & S_ISUID;
        if inode.mode & S_ISGID != 0
            && (inode.mode & 0o010 != 0 || !self.in_group_or_root(cred, inode.gid))
        {
            kill |= S_ISGID;
        }
        kill
    }

    /// Whether `ino` has file capabilities (the filesystem lock held, outside a transaction).
    pub(crate) fn has_caps(&self, st: &FsState, ino: u64) -> FsResult<bool> {
        Ok(self.xattr_lookup(st, ino, CAPS_XATTR)?.is_some())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::CAPS_XATTR;
    use crate::fs::items::inode::{ROOT_INO, S_IFREG};
    use crate::fs::tests::{assert_clean, mount, new_dev, TestClock};
    use crate::fs::types::XattrFlags;
    use crate::fs::types::{Cred, SetAttr};
    use crate::fs::{FsError, FsOptions};
    use std::sync::Arc;

    /// A version 2 capability set: effective, CAP_NET_RAW permitted.
    const CAPS: [u8; 20] = [
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    const U: Cred = Cred::user(1000, 1000);

    fn opts(clock: &TestClock) -> FsOptions {
        FsOptions {
            clock: clock.clock(),
            ..FsOptions::default()
        }
    }

    #[test]
    fn file_capabilities_go_with_any_change_of_data_or_owner() {
        let clock = TestClock::new();
        let dev = new_dev(43);
        let fs = mount(&dev, opts(&clock));
        let f = fs
            .mknod(Cred::ROOT, ROOT_INO, b"f", S_IFREG | 0o666, 0)
            .unwrap()
            .ino;
        fs.write(Cred::ROOT, f, 0, &[1; 8192]).unwrap();
        let size = |s| SetAttr {
            size: Some(s),
            ..SetAttr::default()
        };
        type Change<'a> = (&'a str, Box<dyn Fn() -> Result<(), FsError> + 'a>);
        let changes: Vec<Change> = vec![
            // An overwrite of an owned block: no transaction of its own otherwise.
            (
                "write by root",
                Box::new(|| fs.write(Cred::ROOT, f, 0, b"x").map(drop)),
            ),
            (
                "write by a user",
                Box::new(|| fs.write(U, f, 0, b"x").map(drop)),
            ),
            (
                "truncate",
                Box::new(|| fs.setattr(U, f, size(4000)).map(drop)),
            ),
            (
                "fallocate",
                Box::new(|| fs.fallocate(U, f, 0, 16384, false, false)),
            ),
            (
                "punching a whole block",
                Box::new(|| fs.fallocate(U, f, 2048, 2048, true, true)),
            ),
            (
                "chown",
                Box::new(|| {
                    let sa = SetAttr {
                        uid: Some(0),
                        ..SetAttr::default()
                    };
                    fs.setattr(Cred::ROOT, f, sa).map(drop)
                }),
            ),
        ];
        for (what, change) in &changes {
            fs.setxattr(f, CAPS_XATTR, &CAPS, XattrFlags::default())
                .unwrap();
            change().unwrap();
            assert!(
                matches!(fs.getxattr(f, CAPS_XATTR), Err(FsError::NoAttr)),
                "{what} keeps the capabilities"
            );
        }
        drop(changes);
        // A read, a chmod or a new time is no change of data or owner.
        fs.setxattr(f, CAPS_XATTR, &CAPS, XattrFlags::default())
            .unwrap();
        fs.read_opts(f, 0, 10, true).unwrap();
        let sa = SetAttr {
            mode: Some(0o755),
            ..SetAttr::default()
        };
        fs.setattr(Cred::ROOT, f, sa).unwrap();
        assert_eq!(fs.getxattr(f, CAPS_XATTR).unwrap(), CAPS);
        assert_clean(&fs);
    }

    #[test]
    fn cap_fsetid_not_the_uid_decides_who_keeps_set_user_id() {
        let clock = TestClock::new();
        let dev = new_dev(44);
        let mut o = opts(&clock);
        // Process 10 is root without CAP_FSETID, process 11 a user holding it, process 12
        // is gone.
        o.holds_fsetid = Some(Arc::new(|pid, _| match pid {
            10 => Some(false),
            11 => Some(true),
            _ => None,
        }));
        let fs = mount(&dev, o);
        let f = fs
            .mknod(Cred::ROOT, ROOT_INO, b"f", S_IFREG | 0o666, 0)
            .unwrap()
            .ino;
        let set_mode = |mode| {
            let sa = SetAttr {
                mode: Some(mode),
                ..SetAttr::default()
            };
            fs.setattr(Cred::ROOT, f, sa).unwrap();
        };
        let perm = || u32::from(fs.getattr(f).unwrap().perm);
        let size = SetAttr {
            size: Some(100),
            ..SetAttr::default()
        };
        let capless_root = Cred {
            pid: 10,
            ..Cred::ROOT
        };
        let capable_user = Cred { pid: 11, ..U };
        let gone_root = Cred {
            pid: 12,
            ..Cred::ROOT
        };
        let gone_user = Cred { pid: 12, ..U };
        for (who, left) in [
            (capless_root, 0o676),
            (capable_user, 0o6676),
            (gone_root, 0o6676),
            (gone_user, 0o676),
        ] {
            set_mode(0o6676);
            fs.write(who, f, 0, b"x").unwrap();
            assert_eq!(
                format!("{:o}", perm()),
                format!("{left:o}"),
                "write by {who:?}"
            );
            set_mode(0o6676);
            fs.setattr(who, f, size).unwrap();
            assert_eq!(
                format!("{:o}", perm()),
                format!("{left:o}"),
                "truncate by {who:?}"
            );
        }
        assert_clean(&fs);
    }
}
