//! `-o` options of `cilfs mount`, parsed and checked before anything is mounted.

use crate::size::parse_size;
use cilfs_core::fs::{AtimeMode, DataMode, FsOptions, IversionMode, SyncMode};
use cilfs_core::log::{FlushPolicy, LogConfig};
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct MountOpts {
    pub logbufs: Option<u32>,
    pub logbsize: Option<u32>,
    pub logdev: Option<PathBuf>,
    pub flush: FlushPolicy,
    pub iversion: IversionMode,
    pub tsgran_ns: u32,
    pub data: DataMode,
    pub threads: usize,
    pub writeback_cache: bool,
    pub ro: bool,
    pub allow_other: bool,
    /// Mount without replaying the log (XFS's `norecovery`); only with `ro`.
    pub norecovery: bool,
    /// Metadata cache size in bytes [default: the journal's].
    pub cache: Option<u64>,
    /// POSIX ACLs stored and enforced (`acl`, the default) or refused (`noacl`).
    pub acl: bool,
    /// Set-user-ID and set-group-ID honoured on exec (`suid`, the default, as on any mount by
    /// root), device files usable (`dev`), programs runnable (`exec`): each a kernel mount flag.
    pub suid: bool,
    pub dev: bool,
    pub exec: bool,
    /// `noatime`, `relatime` (the default) or `strictatime`.
    pub atime: AtimeMode,
    pub lazytime: bool,
    /// `diratime` (the default) or `nodiratime`: whether readdir moves a directory's atime.
    pub diratime: bool,
    /// `sync`: every change forced before the reply, `async` (the default) undoes it;
    /// `dirsync`: every change of a directory.
    pub sync: bool,
    pub dirsync: bool,
    /// With `transport=native`: requests through io_uring queues where the kernel allows
    /// (`uring=auto`, the default), always (`on`: or no mount), never (`off`: /dev/fuse reads).
    pub uring: cilfs_fuse::native::UringMode,
    /// `loop`: an image file is mounted through a loop device (`loopdev.rs`), as mount(8)'s
    /// `-o loop`; `noloop`: never; unset, a mount by root does (mount.rs's `wants_loop`).
    /// Ignored for a block device.
    pub loop_dev: Option<bool>,
    /// `idmap` (the default): cilfs takes FUSE_ALLOW_IDMAP, so idmapped bind mounts of the
    /// mount work, and Linux names the caller only in creating requests (others are judged by
    /// what the kernel checked, its KILL_SUIDGID flags and the caller's /proc status);
    /// `noidmap`: every request names its caller, for a daemon that cannot read its callers'
    /// /proc status (hidepid, another pid namespace), which root-only operations need then.
    pub idmap: bool,
    /// `logdata=SIZE`: an fsync of at most this much dirty data puts it into the log (one
    /// log write, no data flush before it); `logdata=0` writes all data in place first, as
    /// XFS does [default 64K].
    pub log_data_max: u64,
    /// `delalloc` (default) / `nodelalloc`: buffered writes into holes get their blocks at
    /// write back, or map them unwritten at once (ext4's option names).
    pub delalloc: bool,
}

impl Default for MountOpts {
    fn default() -> Self {
        MountOpts {
            logbufs: None,
            logbsize: None,
            logdev: None,
            flush: FlushPolicy::Reduced,
            iversion: IversionMode::Lazy,
            tsgran_ns: 1_000_000,
            data: DataMode::Ordered,
            threads: 4,
            writeback_cache: false,
            ro: false,
            allow_other: false,
            norecovery: false,
            cache: None,
            acl: true,
            suid: true,
            dev: true,
            exec: true,
            atime: AtimeMode::Relative,
            lazytime: false,
            diratime: true,
            sync: false,
            dirsync: false,
            uring: cilfs_fuse::native::UringMode::Auto,
            idmap: true,
            log_data_max: cilfs_core::fs::DEFAULT_LOG_DATA_MAX,
            delalloc: true,
            loop_dev: None,
        }
    }
}

/// The range of `cache=SIZE`, the same bounds as the default (a sixteenth of memory) keeps to.
const CACHE_MIN: u64 = cilfs_core::journal::DEFAULT_CACHE_BYTES;
const CACHE_MAX: u64 = 2 << 30;

/// A duration like `1ms`, `100us`, `1s`, `1ns`.
fn parse_duration_ns(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("tsgran={s}: not a duration (examples: 1ns, 100us, 1ms, 1s)"))?;
    let mult = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" | "" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return Err(format!("tsgran={s}: unknown unit (use ns, us, ms or s)")),
    };
    let ns = n
        .checked_mul(mult)
        .filter(|&x| (1..=1_000_000_000).contains(&x));
    ns.map(|x| x as u32)
        .ok_or_else(|| format!("tsgran={s}: must be between 1ns and 1s"))
}

pub fn parse(list: &[String]) -> Result<MountOpts, String> {
    let mut o = MountOpts::default();
    for opt in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (k, v) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let need = || v.ok_or_else(|| format!("option {k} needs a value ({k}=...)"));
        let no_value = || match v {
            Some(_) => Err(format!("option {k} takes no value")),
            None => Ok(()),
        };
        match k {
            "logbufs" => {
                let n: u32 = need()?.parse().map_err(|_| format!("logbufs={}: not a number", v.unwrap_or("")))?;
                if !(2..=8).contains(&n) {
                    return Err(format!("logbufs={n}: must be 2..8"));
                }
                o.logbufs = Some(n);
            }
            "logbsize" => {
                let n = parse_size(need()?)?;
                if !(16 * 1024..=256 * 1024).contains(&n) || !n.is_power_of_two() {
                    return Err(format!("logbsize={}: must be a power of two in 16k..256k", v.unwrap_or("")));
                }
                o.logbsize = Some(n as u32);
            }
            "logdev" => o.logdev = Some(PathBuf::from(need()?)),
            "flush" => {
                let x = need()?;
                o.flush = x
                    .parse()
                    .map_err(|_| format!("flush={x}: use reduced, legacy or ail"))?;
            }
            "iversion" => {
                o.iversion = match need()? {
                    "lazy" => IversionMode::Lazy,
                    "eager" => IversionMode::Eager,
                    x => return Err(format!("iversion={x}: use lazy or eager")),
                }
            }
            "tsgran" => o.tsgran_ns = parse_duration_ns(need()?)?,
            "data" => {
                o.data = match need()? {
                    "ordered" => DataMode::Ordered,
                    "writeback" => DataMode::Writeback,
                    x => return Err(format!("data={x}: use ordered or writeback")),
                }
            }
            "threads" => {
                let n: usize = need()?.parse().map_err(|_| format!("threads={}: not a number", v.unwrap_or("")))?;
                if !(1..=64).contains(&n) {
                    return Err(format!("threads={n}: must be 1..64"));
                }
                o.threads = n;
            }
            "writeback_cache" => {
                no_value()?;
                o.writeback_cache = true;
            }
            "ro" => {
                no_value()?;
                o.ro = true;
            }
            "rw" => {
                no_value()?;
                o.ro = false;
            }
            "norecovery" => {
                no_value()?;
                o.norecovery = true;
            }
            "cache" => {
                // parse_size refuses what does not fit in u64; the range bounds the rest.
                let n = parse_size(need()?)?;
                if !(CACHE_MIN..=CACHE_MAX).contains(&n) {
                    return Err(format!("cache={}: must be 128M..2G", v.unwrap_or("")));
                }
                o.cache = Some(n);
            }
            "allow_other" => {
                no_value()?;
                o.allow_other = true;
            }
            "acl" | "noacl" => {
                no_value()?;
                o.acl = k == "acl";
            }
            "suid" | "nosuid" => {
                no_value()?;
                o.suid = k == "suid";
            }
            "dev" | "nodev" => {
                no_value()?;
                o.dev = k == "dev";
            }
            "exec" | "noexec" => {
                no_value()?;
                o.exec = k == "exec";
            }
            // The kernel checks permissions (mode and ACLs) on every cilfs mount already.
            "default_permissions" => no_value()?,
            // For mount(8), systemd and fstab's readers, not the filesystem (`defaults` sets no
            // flag in mount(8) either: it leaves an earlier `nosuid` in force). `user=NAME` is
            // how mount(8) records a user mount.
            "defaults" | "auto" | "noauto" | "nofail" | "_netdev" | "nouser" | "users"
            | "owner" | "group" => no_value()?,
            "user" | "comment" => {}
            _ if k.starts_with("x-") || k.starts_with("X-") => {}
            "noatime" | "relatime" | "strictatime" => {
                no_value()?;
                o.atime = match k {
                    "noatime" => AtimeMode::Never,
                    "relatime" => AtimeMode::Relative,
                    _ => AtimeMode::Strict,
                };
            }
            "delalloc" | "nodelalloc" => {
                no_value()?;
                o.delalloc = k == "delalloc";
            }
            "lazytime" | "nolazytime" => {
                no_value()?;
                o.lazytime = k == "lazytime";
            }
            "diratime" | "nodiratime" => {
                no_value()?;
                o.diratime = k == "diratime";
            }
            "sync" | "async" => {
                no_value()?;
                o.sync = k == "sync";
            }
            "dirsync" => {
                no_value()?;
                o.dirsync = true;
            }
            "loop" | "noloop" => {
                no_value()?;
                o.loop_dev = Some(k == "loop");
            }
            "idmap" | "noidmap" => {
                no_value()?;
                o.idmap = k == "idmap";
            }
            "logdata" => {
                let n = parse_size(need()?)?;
                if n > LOG_DATA_MAX {
                    return Err(format!(
                        "logdata={}: at most 1M (0 turns the logged path off)",
                        v.unwrap_or("")
                    ));
                }
                o.log_data_max = n;
            }
            "transport" => check_transport(need()?)?,
            "uring" => o.uring = parse_uring(need()?)?,
            _ => return Err(format!("unknown mount option '{k}' (known: logbufs, logbsize, logdev, flush, iversion, tsgran, data, threads, cache, writeback_cache, ro, rw, norecovery, allow_other, acl, noacl, suid, nosuid, dev, nodev, exec, noexec, default_permissions, defaults, auto, noauto, nofail, _netdev, user, nouser, users, owner, group, comment, x-*, noatime, relatime, strictatime, lazytime, nolazytime, delalloc, nodelalloc, diratime, nodiratime, sync, async, dirsync, loop, noloop, idmap, noidmap, logdata, transport, uring)")),
        }
    }
    Ok(o)
}

impl MountOpts {
    pub fn log_config(&self) -> LogConfig {
        let d = LogConfig::default();
        LogConfig {
            logbufs: self.logbufs.unwrap_or(d.logbufs),
            logbsize: self.logbsize.unwrap_or(d.logbsize),
            policy: self.flush,
        }
    }

    /// What the core forces before replying: `sync` covers `dirsync`.
    pub fn sync_mode(&self) -> SyncMode {
        if self.sync {
            SyncMode::All
        } else if self.dirsync {
            SyncMode::Dirs
        } else {
            SyncMode::None
        }
    }

    /// Whether the iclog geometry was left to the defaults (which shrink to fit small logs).
    pub fn default_geometry(&self) -> bool {
        self.logbufs.is_none() && self.logbsize.is_none()
    }

    pub fn fs_options(&self) -> FsOptions {
        FsOptions {
            iversion: self.iversion,
            tsgran_ns: self.tsgran_ns,
            data: self.data,
            read_only: self.ro,
            atime: self.atime,
            lazytime: self.lazytime,
            diratime: self.diratime,
            sync: self.sync_mode(),
            groups_of: Some(std::sync::Arc::new(cilfs_fuse::process_groups)),
            acl: self.acl,
            log_data_max: self.log_data_max,
            delalloc: self.delalloc,
            ..FsOptions::default()
        }
    }
}

/// The largest `logdata=`: an fsync's pages go into one checkpoint, 16 blocks a transaction.
const LOG_DATA_MAX: u64 = 1 << 20;

/// What `transport=fuser` is refused with: the fuser crate's transport is not built any more.
pub const FUSER_REFUSED: &str = "transport=fuser: the fuser transport has been removed; cilfs \
     serves FUSE itself (transport=native, the default: leave the option out), and \
     uring=on|off|auto picks io_uring queues or /dev/fuse reads";

/// `transport=`: `native` names the one transport (accepted so that fstab lines naming it
/// still mount); `fuser` and anything else is refused.
pub fn check_transport(v: &str) -> Result<(), String> {
    match v {
        "native" => Ok(()),
        "fuser" => Err(FUSER_REFUSED.into()),
        x => Err(format!(
            "transport={x}: the one transport is native (uring=on|off|auto picks io_uring \
             queues or /dev/fuse reads)"
        )),
    }
}

/// `uring=`: whether requests come through io_uring queues.
pub fn parse_uring(v: &str) -> Result<cilfs_fuse::native::UringMode, String> {
    match v {
        "auto" => Ok(cilfs_fuse::native::UringMode::Auto),
        "on" => Ok(cilfs_fuse::native::UringMode::On),
        "off" => Ok(cilfs_fuse::native::UringMode::Off),
        x => Err(format!("uring={x}: use auto, on or off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idmap_is_the_default_and_noidmap_turns_it_off() {
        assert!(parse(&[]).expect("valid").idmap);
        assert!(!parse(&["noidmap".into()]).expect("valid").idmap);
        assert!(parse(&["noidmap,idmap".into()]).expect("valid").idmap);
        assert!(parse(&["idmap=1".into()]).is_err());
    }

    #[test]
    fn options() {
        let o = parse(&["logbufs=4,logbsize=32k,flush=legacy,iversion=eager,tsgran=100us,data=writeback,threads=2,writeback_cache,ro".into()]).expect("valid");
        assert_eq!(
            (o.logbufs, o.logbsize, o.flush, o.iversion),
            (
                Some(4),
                Some(32768),
                FlushPolicy::Legacy,
                IversionMode::Eager
            )
        );
        assert_eq!(
            (o.tsgran_ns, o.data, o.threads, o.writeback_cache, o.ro),
            (100_000, DataMode::Writeback, 2, true, true)
        );
        for (flush, policy) in [
            ("reduced", FlushPolicy::Reduced),
            ("legacy", FlushPolicy::Legacy),
            ("ail", FlushPolicy::AilFlush),
        ] {
            let o = parse(&[format!("flush={flush}")]).expect("valid");
            assert_eq!(o.flush, policy);
        }
        for bad in [
            "logbufs=9",
            "logbsize=8k",
            "flush=fast",
            "nosuch",
            "ro=1",
            "tsgran=2s",
            "threads=0",
            "logbufs",
        ] {
            assert!(parse(&[bad.into()]).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn atime_options() {
        let atime = |o: &str| parse(&[o.into()]).map(|o| (o.atime, o.lazytime));
        assert_eq!(atime(""), Ok((AtimeMode::Relative, false)));
        assert_eq!(atime("noatime"), Ok((AtimeMode::Never, false)));
        assert_eq!(atime("strictatime"), Ok((AtimeMode::Strict, false)));
        assert_eq!(atime("noatime,relatime"), Ok((AtimeMode::Relative, false)));
        assert_eq!(atime("lazytime"), Ok((AtimeMode::Relative, true)));
        assert_eq!(
            atime("lazytime,nolazytime"),
            Ok((AtimeMode::Relative, false))
        );
        for bad in [
            "noatime=1",
            "atime",
            "nodiratime=1",
            "diratime=yes",
            "relatime=yes",
            "lazytime=on",
        ] {
            assert!(atime(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn diratime_and_sync_options() {
        let parsed = |o: &str| parse(&[o.into()]).map(|o| (o.diratime, o.sync_mode()));
        assert_eq!(parsed(""), Ok((true, SyncMode::None)));
        assert_eq!(parsed("nodiratime"), Ok((false, SyncMode::None)));
        assert_eq!(parsed("nodiratime,diratime"), Ok((true, SyncMode::None)));
        assert_eq!(parsed("dirsync"), Ok((true, SyncMode::Dirs)));
        assert_eq!(parsed("sync"), Ok((true, SyncMode::All)));
        assert_eq!(parsed("dirsync,sync"), Ok((true, SyncMode::All)));
        // As in mount(8), async undoes sync and leaves dirsync.
        assert_eq!(parsed("sync,async"), Ok((true, SyncMode::None)));
        assert_eq!(parsed("sync,dirsync,async"), Ok((true, SyncMode::Dirs)));
        let fs = parse(&["nodiratime,sync".into()])
            .expect("valid")
            .fs_options();
        assert_eq!((fs.diratime, fs.sync), (false, SyncMode::All));
        for bad in ["sync=1", "dirsync=yes", "async=0"] {
            assert!(parse(&[bad.into()]).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn fstab_options() {
        let flags = |o: &str| parse(&[o.into()]).map(|o| (o.suid, o.dev, o.exec, o.ro));
        assert_eq!(flags(""), Ok((true, true, true, false)));
        assert_eq!(
            flags("nosuid,nodev,noexec"),
            Ok((false, false, false, false))
        );
        assert_eq!(
            flags("nosuid,suid,nodev,dev,noexec,exec"),
            Ok((true, true, true, false))
        );
        // `defaults` leaves what came before, as in mount(8).
        assert_eq!(flags("nosuid,defaults"), Ok((false, true, true, false)));
        assert_eq!(
            flags("defaults,ro,default_permissions,nofail,_netdev,noauto,auto,user,user=alice,nouser,users,owner,group,comment=x,comment,x-systemd.automount,x-systemd.device-timeout=10s,X-mount.mkdir"),
            Ok((true, true, true, true))
        );
        for bad in [
            "nosuid=1",
            "defaults=1",
            "nofail=yes",
            "suidx",
            "xsystemd.automount",
            "default_permissions=0",
        ] {
            assert!(flags(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn norecovery_is_a_flag() {
        assert!(!parse(&[]).expect("valid").norecovery);
        assert!(parse(&["ro,norecovery".into()]).expect("valid").norecovery);
        assert!(parse(&["norecovery=1".into()]).is_err());
        assert!(parse(&["nosuch".into()])
            .unwrap_err()
            .contains("norecovery"));
    }

    #[test]
    fn loop_is_a_flag_of_the_native_transport() {
        assert_eq!(parse(&[]).expect("valid").loop_dev, None);
        assert_eq!(parse(&["loop".into()]).expect("valid").loop_dev, Some(true));
        assert_eq!(
            parse(&["loop,transport=native".into()])
                .expect("valid")
                .loop_dev,
            Some(true)
        );
        assert_eq!(
            parse(&["loop,noloop".into()]).expect("valid").loop_dev,
            Some(false)
        );
        assert!(parse(&["loop=1".into()]).is_err());
        assert!(parse(&["loop,transport=fuser".into()]).is_err());
        assert!(parse(&["noloop=1".into()]).is_err());
    }

    #[test]
    fn cache_size_is_128m_to_2g() {
        for (good, bytes) in [
            ("cache=128M", 128u64 << 20),
            ("cache=1G", 1 << 30),
            ("cache=2G", 2 << 30),
            ("cache=2147483648", 2 << 30),
        ] {
            assert_eq!(parse(&[good.into()]).expect(good).cache, Some(bytes));
        }
        for bad in [
            "cache=16M",
            "cache=127M",
            "cache=134217727",
            "cache=2147483649",
            "cache=3G",
            "cache=1T",
            "cache=1P",
            "cache=16383P",
            "cache=18446744073709551615",
            "cache=99999999999999999999",
            "cache=0",
            "cache=",
            "cache",
        ] {
            let e = parse(&[bad.into()]).expect_err(bad);
            assert!(!e.contains('\n'), "{bad}: one line: {e}");
        }
        assert!(parse(&["cache=1P".into()])
            .unwrap_err()
            .contains("must be 128M..2G"));
    }

    #[test]
    fn acl_is_on_unless_noacl() {
        assert!(parse(&[]).expect("valid").acl);
        assert!(!parse(&["noacl".into()]).expect("valid").acl);
        assert!(parse(&["noacl,acl".into()]).expect("valid").acl);
        assert!(parse(&["acl=1".into()]).is_err());
        assert!(!parse(&["noacl".into()]).expect("valid").fs_options().acl);
    }

    #[test]
    fn transport_names() {
        assert_eq!(check_transport("native"), Ok(()));
        assert!(check_transport("uring").is_err());
        assert_eq!(parse_uring("on"), Ok(cilfs_fuse::native::UringMode::On));
        assert_eq!(parse_uring("off"), Ok(cilfs_fuse::native::UringMode::Off));
        assert_eq!(parse_uring("auto"), Ok(cilfs_fuse::native::UringMode::Auto));
        assert!(parse_uring("yes").is_err());
        let o = parse(&["transport=native,uring=on".into()]).unwrap();
        assert_eq!(o.uring, cilfs_fuse::native::UringMode::On);
        assert_eq!(
            MountOpts::default().uring,
            cilfs_fuse::native::UringMode::Auto
        );
        let o = parse(&["uring=off".into()]).unwrap();
        assert_eq!(o.uring, cilfs_fuse::native::UringMode::Off);
    }

    /// `transport=fuser` is refused before anything is mounted, naming what replaced it,
    /// alone or with any other option.
    #[test]
    fn transport_fuser_is_refused_naming_the_replacement() {
        assert_eq!(check_transport("fuser"), Err(FUSER_REFUSED.to_string()));
        for opts in [
            "transport=fuser",
            "ro,transport=fuser",
            "transport=fuser,uring=off",
        ] {
            let e = parse(&[opts.into()]).unwrap_err();
            assert_eq!(e, FUSER_REFUSED, "{opts}");
        }
        assert!(FUSER_REFUSED.contains("transport=native"));
        assert!(FUSER_REFUSED.contains("uring=on|off|auto"));
        assert!(!FUSER_REFUSED.contains('\n'));
    }
}
