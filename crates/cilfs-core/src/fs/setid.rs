//! The set-user-ID and set-group-ID rules: which bits a change clears, and who counts as a
//! member of a file's group (Linux's `setattr_should_drop_suidgid` and `chown_common`).

use super::inode::{Inode, S_IFMT, S_IFREG, S_ISGID, S_ISUID};
use super::types::Cred;
use super::Fs;

impl Fs {
    /// Whether the caller counts as a member of group `gid` for the set-group-ID rules: root
    /// (taken as holding CAP_FSETID), or its primary or a supplementary group.
    pub(crate) fn in_group_or_root(&self, cred: Cred, gid: u32) -> bool {
        cred.uid == 0
            || cred.gid == gid
            || self
                .opts
                .groups_of
                .as_ref()
                .is_some_and(|f| f(cred.pid).contains(&gid))
    }

    /// The set-user-ID and set-group-ID bits a change of a regular file's data by `cred` clears
    /// (Linux's `setattr_should_drop_suidgid`): set-user-ID always, set-group-ID when group
    /// execute is set or the caller is outside the file's group; nothing for root.
    pub(crate) fn privileges_to_kill(&self, cred: Cred, inode: &Inode) -> u32 {
        if cred.uid == 0 || inode.mode & S_IFMT != S_IFREG {
            return 0;
        }
        self.setid_bits_to_clear(cred, inode)
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
}
