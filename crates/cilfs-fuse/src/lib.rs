//! The FUSE adapter of cilfs: /dev/fuse read and written by cilfs itself ([`native`]), each
//! request decoded by `cilfs-fuse-proto`, answered by one operation of the core
//! ([`cilfs_core::fs::Fs`]) and encoded back; errors become errno values in [`errno::errno`]
//! only. No filesystem logic lives here.

mod errno;
pub mod native;
mod openers;
pub mod requests;

pub use errno::{errno, observe_errors, ErrorObserver};

use cilfs_core::fs::types::Capability;
use std::sync::OnceLock;

/// The root directory's read-only xattr carrying every counter as "name value" lines (what
/// `cilfs stat` reads): live figures without adding entries to the namespace.
pub const STATS_XATTR: &[u8] = b"user.cilfs.stats";

/// The groups of process `pid` (from /proc/PID/status): its filesystem gid (`Gid:`, the
/// fourth) and its supplementary groups (`Groups:`); none if the process is gone. What
/// `FsOptions::groups_of` is set to on a mount: a request that names its caller carries the
/// filesystem gid too, one that does not (idmapped mounts) carries none.
pub fn process_groups(pid: u32) -> Vec<u32> {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => groups_in(&s),
        Err(_) => Vec::new(),
    }
}

/// The filesystem gid and supplementary groups in a /proc/PID/status text.
fn groups_in(s: &str) -> Vec<u32> {
    let field = |name: &str| s.lines().find_map(|l| l.strip_prefix(name));
    let fsgid = field("Gid:").and_then(|g| g.split_whitespace().nth(3)?.parse().ok());
    let supplementary = field("Groups:")
        .into_iter()
        .flat_map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()));
    fsgid.into_iter().chain(supplementary).collect()
}

/// Linux's capability number of CAP_FSETID (`<linux/capability.h>`).
const CAP_FSETID: u32 = Capability::Fsetid.number();

/// Whether process `pid`, running as filesystem uid `uid`, holds CAP_FSETID as the kernel's
/// `capable(CAP_FSETID)` would judge it (from /proc/PID/status); `None` if the process is gone
/// or the pid now names a process of another user. What `FsOptions::holds_fsetid` is set to on
/// a mount, for callers a request names (a kernel without FUSE_ALLOW_IDMAP): a root without
/// CAP_FSETID must lose set-user-ID. Callers the kernel does not name are judged by its
/// KILL_SUIDGID flags, or by [`capable`].
pub fn holds_fsetid(pid: u32, uid: u32) -> Option<bool> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| s.lines().find_map(|l| l.strip_prefix(name));
    // Real, effective, saved and filesystem uid: the request carries the last.
    let fsuid: u32 = field("Uid:")?.split_whitespace().nth(3)?.parse().ok()?;
    if fsuid != uid {
        return None;
    }
    holds(&s, pid, CAP_FSETID)
}

/// Whether process `pid` holds `cap` as the kernel's `capable()` would judge it: in its
/// effective set (`CapEff:` of /proc/PID/status) and in the initial user namespace (ours);
/// `None` if the process is gone. What `FsOptions::capable` is set to on a mount, asked for
/// the callers of requests that name none (idmapped mounts): the root-only ioctls and
/// cilfs's own xattrs reach cilfs unchecked, whoever sends them.
pub fn capable(pid: u32, cap: Capability) -> Option<bool> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    holds(&s, pid, cap.number())
}

/// Whether the process whose status is `s` holds capability number `cap` in the initial
/// user namespace.
fn holds(s: &str, pid: u32, cap: u32) -> Option<bool> {
    let field = |name: &str| s.lines().find_map(|l| l.strip_prefix(name));
    let effective = u64::from_str_radix(field("CapEff:")?.trim(), 16).ok()?;
    // capable() asks the initial user namespace: a process in another one holds nothing there
    // whatever its own namespace grants it.
    static OURS: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    let ours = OURS.get_or_init(|| std::fs::read_link("/proc/self/ns/user").ok());
    let same_ns =
        ours.is_some() && std::fs::read_link(format!("/proc/{pid}/ns/user")).ok() == *ours;
    Some(same_ns && effective.checked_shr(cap).is_some_and(|e| e & 1 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tx\nUid:\t1000\t1000\t1000\t1001\nGid:\t100\t100\t100\t101\n\
                          Groups:\t4 27 \nCapEff:\t0000000000200210\n";

    #[test]
    fn groups_are_the_filesystem_gid_and_the_supplementary_ones() {
        assert_eq!(groups_in(STATUS), vec![101, 4, 27]);
        assert_eq!(groups_in("Name:\tgone\n"), Vec::<u32>::new());
    }

    /// CapEff 0x200210: CAP_FSETID (4), CAP_LINUX_IMMUTABLE (9), CAP_SYS_ADMIN (21); this
    /// process is in our own user namespace, so the bits decide.
    #[test]
    fn capabilities_come_from_the_effective_set() {
        let me = std::process::id();
        for cap in [
            Capability::Fsetid,
            Capability::LinuxImmutable,
            Capability::SysAdmin,
        ] {
            assert_eq!(holds(STATUS, me, cap.number()), Some(true), "{cap:?}");
        }
        assert_eq!(holds(STATUS, me, 0), Some(false), "CAP_CHOWN");
        assert_eq!(holds(STATUS, me, 200), Some(false), "past the set");
        assert_eq!(holds("Name:\tx\n", me, 4), None, "no CapEff");
    }
}
