//! `mount -o remount,OPTIONS DIR` as the mount helper runs it: the mount's kernel flags change
//! (mount(2) with MS_REMOUNT on the mount point), and a switch between read-only and
//! read-write is also made in the daemon (`cilfs_fuse::native::request_remount`), which on
//! `ro` writes everything back, leaves the log clean and writes nothing more until `rw`.

use super::mountinfo::mounts_on;
use anyhow::{anyhow, bail, Result};
use rustix::mount::MountFlags;
use std::path::Path;

/// The flags a remount sets: what the mount has now (mountinfo), with `options` applied in
/// order (mount(8) may pass the current options along with the new ones: either way works).
pub fn flags_after(current: MountFlags, options: &[String]) -> Result<MountFlags> {
    let mut f = current;
    let atime = MountFlags::NOATIME | MountFlags::RELATIME | MountFlags::STRICTATIME;
    for o in options
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (k, v) = o.split_once('=').map_or((o, None), |(k, v)| (k, Some(v)));
        let (set, clear) = match k {
            "remount" => continue,
            "ro" => (MountFlags::RDONLY, MountFlags::empty()),
            "rw" => (MountFlags::empty(), MountFlags::RDONLY),
            "nosuid" => (MountFlags::NOSUID, MountFlags::empty()),
            "suid" => (MountFlags::empty(), MountFlags::NOSUID),
            "nodev" => (MountFlags::NODEV, MountFlags::empty()),
            "dev" => (MountFlags::empty(), MountFlags::NODEV),
            "noexec" => (MountFlags::NOEXEC, MountFlags::empty()),
            "exec" => (MountFlags::empty(), MountFlags::NOEXEC),
            "noatime" => (MountFlags::NOATIME, atime),
            "relatime" => (MountFlags::RELATIME, atime),
            "strictatime" => (MountFlags::STRICTATIME, atime),
            "nodiratime" => (MountFlags::NODIRATIME, MountFlags::empty()),
            "diratime" => (MountFlags::empty(), MountFlags::NODIRATIME),
            "sync" => (MountFlags::SYNCHRONOUS, MountFlags::empty()),
            "async" => (MountFlags::empty(), MountFlags::SYNCHRONOUS),
            "dirsync" => (MountFlags::DIRSYNC, MountFlags::empty()),
            "lazytime" => (MountFlags::LAZYTIME, MountFlags::empty()),
            "nolazytime" => (MountFlags::empty(), MountFlags::LAZYTIME),
            // The fuse connection's own options, which mountinfo shows and the kernel ignores
            // on a remount, and mount(8)'s bookkeeping.
            "user_id"
            | "group_id"
            | "default_permissions"
            | "allow_other"
            | "blksize"
            | "max_read"
            | "fd"
            | "rootmode"
            | "defaults"
            | "auto"
            | "noauto"
            | "nofail"
            | "_netdev"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "comment"
            | "loop"
            | "noloop"
            | "idmap"
            | "noidmap"
            | "silent"
            | "loud" => continue,
            _ if k.starts_with("x-") || k.starts_with("X-") => continue,
            _ => bail!(
                "option {}{} cannot be changed by a remount (unmount and mount again); a \
                 remount changes ro, rw, nosuid, nodev, noexec, the atime options, sync, \
                 async, dirsync and lazytime",
                k,
                v.map(|v| format!("={v}")).unwrap_or_default()
            ),
        };
        f = (f - clear) | set;
    }
    Ok(f)
}

/// The flags of the mount at `dir` now, from its per-mount and superblock options.
fn current_flags(dir: &Path) -> Result<MountFlags> {
    let m = mounts_on(dir)
        .pop()
        .ok_or_else(|| anyhow!("{}: not a mount point", dir.display()))?;
    let opts: Vec<String> = m
        .options
        .split(',')
        .chain(m.super_options.split(','))
        // Only the flags: the superblock's "rw" must not undo the mount's "ro".
        .filter(|o| *o != "rw")
        .map(str::to_string)
        .collect();
    flags_after(MountFlags::empty(), &opts)
}

/// Remounts the cilfs mount at `dir` with `options` (those after `remount`).
pub fn remount(dir: &Path, options: &[String]) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!(
            "{}: only root can remount (a user's mount through fusermount3 cannot be \
             remounted: unmount it and mount it again)",
            dir.display()
        );
    }
    if super::mountinfo::mounted_image(dir).is_none() {
        bail!("{}: no cilfs filesystem is mounted there", dir.display());
    }
    let now = current_flags(dir)?;
    let want = flags_after(now, options)?;
    let was_ro = now.contains(MountFlags::RDONLY);
    let ro = want.contains(MountFlags::RDONLY);
    let kernel = |f: MountFlags| {
        rustix::mount::mount_remount(dir, f, "")
            .map_err(|e| anyhow!("remounting {}: mount(2): {e}", dir.display()))
    };
    let daemon = |ro: bool| {
        cilfs_fuse::native::request_remount(dir, ro).map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(n) if n == rustix::io::Errno::ROFS.raw_os_error() => {
                    ": it was mounted read-only (ro) from the start, over devices opened \
                     read-only: unmount it and mount it read-write"
                }
                Some(n) if n == rustix::io::Errno::NOTTY.raw_os_error() => {
                    ": its daemon does not take remounts (an older cilfs)"
                }
                _ => "",
            };
            anyhow!(
                "remounting {} {}: the daemon refused: {e}{hint}",
                dir.display(),
                if ro { "read-only" } else { "read-write" }
            )
        })
    };
    match (was_ro, ro) {
        // The kernel first: it refuses (EBUSY) while a file is open for writing, and writes
        // its dirty pages back to the daemon; then the daemon makes everything stable.
        (false, true) => {
            kernel(want)?;
            if let Err(e) = daemon(true) {
                let _ = kernel(now);
                return Err(e);
            }
        }
        // The daemon first: if it cannot write, the mount stays read-only.
        (true, false) => {
            daemon(false)?;
            if let Err(e) = kernel(want) {
                let _ = daemon(true);
                return Err(e);
            }
        }
        _ => kernel(want)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    #[test]
    fn remount_flags_start_from_the_mounts_and_follow_the_options() {
        let now = MountFlags::NOSUID | MountFlags::RELATIME;
        assert_eq!(
            flags_after(now, &opts("remount,ro")).unwrap(),
            now | MountFlags::RDONLY
        );
        assert_eq!(
            flags_after(now | MountFlags::RDONLY, &opts("remount,rw,noatime,suid")).unwrap(),
            MountFlags::NOATIME
        );
        // What mount(8) may pass along from mountinfo is taken.
        assert_eq!(
            flags_after(
                now,
                &opts("rw,nosuid,relatime,user_id=0,group_id=0,default_permissions,blksize=4096,remount,ro")
            )
            .unwrap(),
            now | MountFlags::RDONLY
        );
        let e = flags_after(now, &opts("remount,logbufs=4")).unwrap_err();
        assert!(e.to_string().contains("logbufs=4"), "{e}");
    }
}
