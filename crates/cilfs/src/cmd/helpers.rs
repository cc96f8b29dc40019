//! The names the system's tools look for: mount(8) runs `/sbin/mount.fuse.cilfs` (type
//! `fuse.cilfs`, as in fstab) or `/sbin/mount.cilfs` (`-t cilfs`), and `mount.fuseblk.cilfs`
//! for `-o remount` of a mount through a loop device; fsck(8) runs `fsck.cilfs`, and
//! mkfs(8) runs `mkfs.cilfs`. Each is a symbolic link to the cilfs binary, which recognises the
//! name it was run by and takes that tool's arguments and exit statuses. `cilfs install-helpers`
//! makes the links.
//!
//! A helper of our own rather than mount.fuse3: mount.fuse3 runs `cilfs IMAGE DIR -o OPTS`, an
//! argument order the subcommands cannot take without guessing whether a mistyped subcommand
//! is an image, and it needs cilfs on root's PATH.

use super::{check, mkfs, mount, mount_opts};
use crate::size::parse_size;
use crate::Failure;
use anyhow::anyhow;
use clap::Parser;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Helper {
    Mount,
    Fsck,
    Mkfs,
}

/// Every helper name and what it runs. `fsck.fuse.cilfs` is what fsck(8) looks for when it
/// finds the image in fstab, where the type is `fuse.cilfs`.
pub const NAMES: [(&str, Helper); 6] = [
    ("mount.fuse.cilfs", Helper::Mount),
    // What mount(8) runs for `-o remount` of a mount through a loop device (fuseblk.cilfs).
    ("mount.fuseblk.cilfs", Helper::Mount),
    ("mount.cilfs", Helper::Mount),
    ("fsck.cilfs", Helper::Fsck),
    ("fsck.fuse.cilfs", Helper::Fsck),
    ("mkfs.cilfs", Helper::Mkfs),
];

/// The helper `argv0` names, if it names one.
pub fn called_as(argv0: &OsStr) -> Option<(&'static str, Helper)> {
    let name = Path::new(argv0).file_name()?;
    NAMES.into_iter().find(|(n, _)| OsStr::new(n) == name)
}

/// Runs a helper with the arguments after its name; the failure's status is the tool's own.
pub fn run(helper: Helper, name: &str, args: &[OsString]) -> Result<(), Failure> {
    let (result, operational) = match helper {
        Helper::Mount => (mount_helper(name, args), MOUNT_FAILURE),
        Helper::Fsck => (fsck_helper(name, args), FSCK_OPERATIONAL),
        Helper::Mkfs => (mkfs_helper(name, args), MKFS_FAILURE),
    };
    // Output that could not be written fails with the tool's own status, not cilfs's 2 (which
    // to fsck(8) would mean "reboot").
    crate::out::flush();
    match (result, crate::out::failure()) {
        (Ok(()), Some(e)) => Err(fail(
            operational,
            anyhow::Error::new(e).context("writing to standard output"),
        )),
        (result, _) => result,
    }
}

fn fail(status: u8, error: anyhow::Error) -> Failure {
    Failure { status, error }
}

/// Command-line words: clusters of one-letter flags (`-fy`), a flag's value attached (`-oro`)
/// or in the next word, long options with `=` or a separate value, `--`.
struct Words<'a> {
    it: std::slice::Iter<'a, OsString>,
    /// One-letter flags still to hand out from the current cluster.
    cluster: Vec<char>,
    only_positional: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Word {
    Short(char),
    Long(String, Option<String>),
    Positional(OsString),
}

impl<'a> Words<'a> {
    fn new(args: &'a [OsString]) -> Self {
        Words {
            it: args.iter(),
            cluster: Vec::new(),
            only_positional: false,
        }
    }

    fn next(&mut self) -> Option<Word> {
        if let Some(c) = self.cluster.pop() {
            return Some(Word::Short(c));
        }
        let w = self.it.next()?;
        if self.only_positional {
            return Some(Word::Positional(w.clone()));
        }
        match w.to_str() {
            Some("--") => {
                self.only_positional = true;
                self.next()
            }
            Some(s) if s.starts_with("--") => Some(match s[2..].split_once('=') {
                Some((k, v)) => Word::Long(k.into(), Some(v.into())),
                None => Word::Long(s[2..].into(), None),
            }),
            Some(s) if s.len() > 1 && s.starts_with('-') => {
                self.cluster = s[1..].chars().rev().collect();
                self.next()
            }
            _ => Some(Word::Positional(w.clone())),
        }
    }

    /// The value of the flag just returned: the rest of its cluster, else the next word.
    fn value(&mut self) -> Option<OsString> {
        if !self.cluster.is_empty() {
            let rest: String = self.cluster.drain(..).rev().collect();
            return Some(rest.into());
        }
        self.it.next().cloned()
    }
}

fn utf8(v: OsString, what: &str) -> Result<String, String> {
    v.into_string().map_err(|_| format!("{what} is not UTF-8"))
}

/// mount(8)'s exit statuses (mount(8) "EXIT STATUS"), which it passes on from its helpers.
const MOUNT_USAGE: u8 = 1;
const MOUNT_FAILURE: u8 = 32;

/// `mount.fuse.cilfs IMAGE DIR [-sfnv] [-o OPTIONS] [-t TYPE]`, as mount(8) runs helpers.
fn mount_helper(name: &str, args: &[OsString]) -> Result<(), Failure> {
    let usage = |msg: String| {
        fail(
            MOUNT_USAGE,
            anyhow!("{msg} (usage: {name} IMAGE DIR [-fnsv] [-o OPTIONS])"),
        )
    };
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let (mut fake, mut verbose) = (false, false);
    let mut words = Words::new(args);
    while let Some(w) = words.next() {
        match w {
            Word::Positional(p) => positional.push(p),
            // Sloppy (-s) needs nothing: unknown options are refused either way, since one
            // misspelt `nosuid` must not leave set-user-ID programs working. No mtab (-n):
            // there is none to write.
            Word::Short('s' | 'n') => {}
            Word::Short('f') => fake = true,
            Word::Short('v') => verbose = true,
            Word::Short('o') => {
                let v = words
                    .value()
                    .ok_or_else(|| usage("-o needs options".into()))?;
                options.push(utf8(v, "the option list").map_err(usage)?);
            }
            // mount(8) names the type (fuse.cilfs) when the helper serves several.
            Word::Short('t') => {
                words
                    .value()
                    .ok_or_else(|| usage("-t needs a type".into()))?;
            }
            Word::Short('N') => {
                return Err(usage(
                    "-N: mounting in another namespace is not supported".into(),
                ))
            }
            Word::Short(c) => return Err(usage(format!("unknown flag -{c}"))),
            Word::Long(k, _) => return Err(usage(format!("unknown option --{k}"))),
        }
    }
    let [image, dir] = <[OsString; 2]>::try_from(positional).map_err(|p| {
        usage(format!(
            "needs an image and a directory, got {} names",
            p.len()
        ))
    })?;
    // `mount -o remount,...`: the mount at DIR changes; the source mount(8) names is the
    // mount's own.
    if options
        .iter()
        .flat_map(|o| o.split(','))
        .any(|o| o == "remount")
    {
        if fake {
            return Ok(());
        }
        return super::remount::remount(Path::new(&dir), &options)
            .map_err(|e| fail(MOUNT_FAILURE, e));
    }
    // A bad option is a wrong invocation (1), not a failed mount (32).
    mount_opts::parse(&options).map_err(|e| fail(MOUNT_USAGE, anyhow!(e)))?;
    if fake {
        return Ok(());
    }
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: mount::Args,
    }
    let mut argv: Vec<OsString> = vec![name.into()];
    for o in &options {
        argv.extend(["-o".into(), o.into()]);
    }
    argv.extend(["--".into(), image, dir]);
    let cli = Cli::try_parse_from(argv).map_err(|e| usage(crate::clap_line(&e)))?;
    // mount helpers print nothing when all went well.
    if !verbose {
        crate::out::quiet();
    }
    mount::run(cli.args).map_err(|f| fail(MOUNT_FAILURE, f.error))
}

/// fsck(8)'s exit statuses (fsck(8) "EXIT STATUS").
const FSCK_CORRECTED: u8 = 1;
const FSCK_UNCORRECTED: u8 = 4;
const FSCK_OPERATIONAL: u8 = 8;
const FSCK_USAGE: u8 = 16;

/// `fsck.cilfs [-a|-p|-n|-y] [-f] [-v] [--logdev PATH] IMAGE`: `cilfs check`; with -a, -p or
/// -y `cilfs repair` first (which repairs a damaged log, not yet damaged trees), and the check
/// then clears the needs-check mark of a filesystem it finds consistent.
fn fsck_helper(name: &str, args: &[OsString]) -> Result<(), Failure> {
    let usage = |msg: String| {
        fail(
            FSCK_USAGE,
            anyhow!("{msg} (usage: {name} [-a|-p|-n|-y] [-f] [-v] [--logdev PATH] IMAGE)"),
        )
    };
    let mut positional = Vec::new();
    let mut logdev: Option<OsString> = None;
    let mut may_write = false;
    let mut words = Words::new(args);
    while let Some(w) = words.next() {
        match w {
            Word::Positional(p) => positional.push(p),
            // Repair automatically (-a, -p) or answer yes (-y): the only change a check makes
            // is to clear the needs-check mark of a filesystem it finds consistent.
            Word::Short('a' | 'p' | 'y') => may_write = true,
            // Answer no (-n), check even if clean (-f), verbose (-v): the check is the same
            // one for each, and always full.
            Word::Short('n') => may_write = false,
            Word::Short('f' | 'v') => {}
            Word::Short('V') => {
                println!("{name} (cilfs {})", env!("CARGO_PKG_VERSION"));
                return Ok(());
            }
            Word::Long(k, v) if k == "logdev" => {
                logdev = Some(
                    v.map(OsString::from)
                        .or_else(|| words.value())
                        .ok_or_else(|| usage("--logdev needs a path".into()))?,
                );
            }
            Word::Short(c) => return Err(usage(format!("unknown flag -{c}"))),
            Word::Long(k, _) => return Err(usage(format!("unknown option --{k}"))),
        }
    }
    let [image] = <[OsString; 1]>::try_from(positional)
        .map_err(|p| usage(format!("needs one image, got {} names", p.len())))?;
    let image = std::path::PathBuf::from(image);
    let logdev = logdev.map(std::path::PathBuf::from);
    let repaired = if may_write {
        match super::repair::repair(&super::repair::Args::new(image.clone(), logdev.clone())) {
            Ok(changed) => changed,
            // Left for the check below to report.
            Err(f) if f.status == 1 => false,
            Err(f) => return Err(fail(FSCK_OPERATIONAL, f.error)),
        }
    } else {
        false
    };
    let args = check::Args::new(image, logdev, may_write);
    check::run(args).map_err(|f| match f.status {
        1 => fail(
            FSCK_UNCORRECTED,
            anyhow!("{}: errors left uncorrected", crate::one_line(&f.error)),
        ),
        _ => fail(FSCK_OPERATIONAL, f.error),
    })?;
    if repaired {
        return Err(fail(
            FSCK_CORRECTED,
            anyhow!("errors corrected by cilfs repair"),
        ));
    }
    Ok(())
}

/// mkfs(8): "0 on success and 1 on failure".
const MKFS_FAILURE: u8 = 1;

/// `mkfs.cilfs [-f] [-q] [-b size=N] [-l size=N,logdev=PATH] [-d size=N] DEVICE [BLOCKS]`:
/// mkfs.xfs's spelling of cilfs mkfs's options (which are taken too), and mkfs(8)'s optional
/// size in blocks after the device.
fn mkfs_helper(name: &str, args: &[OsString]) -> Result<(), Failure> {
    let usage = |msg: String| {
        fail(
            MKFS_FAILURE,
            anyhow!(
                "{msg} (usage: {name} [-f] [-q] [-b size=N] [-l size=N,logdev=PATH] \
                 [-d size=N] DEVICE [BLOCKS])"
            ),
        )
    };
    let mut positional = Vec::new();
    let mut flags: Vec<OsString> = Vec::new();
    let mut block_size: Option<String> = None;
    let mut size: Option<String> = None;
    let mut words = Words::new(args);
    // `-b size=4096,...`: each suboption is key=value; the keys a flag takes are listed.
    let suboptions = |words: &mut Words<'_>, flag: char, keys: &[&str]| {
        let v = words
            .value()
            .ok_or_else(|| usage(format!("-{flag} needs suboptions")))?;
        let v = utf8(v, "a suboption").map_err(usage)?;
        v.split(',')
            .filter(|s| !s.is_empty())
            .map(|s| match s.split_once('=') {
                Some((k, v)) if keys.contains(&k) => Ok((k.to_string(), v.to_string())),
                _ => Err(usage(format!(
                    "-{flag} {s}: unknown suboption (known: {})",
                    keys.join("=, ") + "="
                ))),
            })
            .collect::<Result<Vec<_>, _>>()
    };
    while let Some(w) = words.next() {
        match w {
            Word::Positional(p) => positional.push(p),
            Word::Short('f') => flags.push("--force".into()),
            Word::Short('q') => flags.push("--quiet".into()),
            Word::Short('V') => {
                println!("{name} (cilfs {})", env!("CARGO_PKG_VERSION"));
                return Ok(());
            }
            Word::Short('b') => {
                for (_, v) in suboptions(&mut words, 'b', &["size"])? {
                    block_size = Some(v);
                }
            }
            Word::Short('d') => {
                for (_, v) in suboptions(&mut words, 'd', &["size"])? {
                    size = Some(v);
                }
            }
            Word::Short('l') => {
                for (k, v) in suboptions(&mut words, 'l', &["size", "logdev"])? {
                    let flag = if k == "size" {
                        "--log-size"
                    } else {
                        "--logdev"
                    };
                    flags.extend([flag.into(), v.into()]);
                }
            }
            Word::Long(k, v)
                if ["size", "block-size", "log-size", "logdev", "force", "quiet"]
                    .contains(&k.as_str()) =>
            {
                let takes_value = !matches!(k.as_str(), "force" | "quiet");
                let v = match (takes_value, v) {
                    (false, None) => None,
                    (false, Some(_)) => return Err(usage(format!("--{k} takes no value"))),
                    (true, Some(v)) => Some(v.into()),
                    (true, None) => Some(
                        words
                            .value()
                            .ok_or_else(|| usage(format!("--{k} needs a value")))?,
                    ),
                };
                match (k.as_str(), v) {
                    ("size", Some(v)) => size = Some(utf8(v, "--size").map_err(usage)?),
                    ("block-size", Some(v)) => {
                        block_size = Some(utf8(v, "--block-size").map_err(usage)?)
                    }
                    (k, v) => {
                        flags.push(format!("--{k}").into());
                        flags.extend(v);
                    }
                }
            }
            Word::Short(c) => return Err(usage(format!("unknown flag -{c}"))),
            Word::Long(k, _) => return Err(usage(format!("unknown option --{k}"))),
        }
    }
    let mut positional = positional.into_iter();
    let device = positional
        .next()
        .ok_or_else(|| usage("needs a device or image file".into()))?;
    if let Some(blocks) = positional.next() {
        if positional.next().is_some() {
            return Err(usage("too many names".into()));
        }
        if size.is_some() {
            return Err(usage("a size is given twice".into()));
        }
        size = Some(
            blocks_to_size(
                &utf8(blocks, "the size").map_err(usage)?,
                block_size.as_deref(),
            )
            .map_err(usage)?,
        );
    }
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: mkfs::Args,
    }
    let mut argv: Vec<OsString> = vec![name.into()];
    argv.extend(flags);
    if let Some(s) = size {
        argv.extend(["--size".into(), s.into()]);
    }
    if let Some(b) = block_size {
        argv.extend(["--block-size".into(), b.into()]);
    }
    argv.extend(["--".into(), device]);
    let cli = Cli::try_parse_from(argv).map_err(|e| usage(crate::clap_line(&e)))?;
    mkfs::run(cli.args).map_err(|f| fail(MKFS_FAILURE, f.error))
}

/// mkfs(8)'s size after the device: a number of blocks (of the block size chosen, 4096 by
/// default), or a size with a suffix (`1G`) as mke2fs also takes.
fn blocks_to_size(s: &str, block_size: Option<&str>) -> Result<String, String> {
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(s.to_string());
    }
    let blocks: u64 = s
        .parse()
        .map_err(|_| format!("{s}: not a number of blocks"))?;
    let bs = block_size.map_or(Ok(4096), parse_size)?;
    blocks
        .checked_mul(bs)
        .map(|b| b.to_string())
        .ok_or_else(|| format!("{s} blocks of {bs} bytes is too large"))
}

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Where mount(8), fsck(8) and mkfs(8) look for helpers
    #[arg(long, default_value = "/sbin")]
    dir: PathBuf,
    /// Replace files of these names that are not symbolic links
    #[arg(long)]
    force: bool,
}

/// `cilfs install-helpers [--dir /sbin]`: links every helper name to this binary.
pub fn install(a: InstallArgs) -> Result<(), Failure> {
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| Failure::usage(anyhow!("finding this program: {e}")))?;
    let paths: Vec<PathBuf> = NAMES.iter().map(|(n, _)| a.dir.join(n)).collect();
    // Every name is checked before any is changed, so a refusal changes nothing.
    for p in &paths {
        match std::fs::symlink_metadata(p) {
            Ok(m) if !m.file_type().is_symlink() && !a.force => {
                return Err(Failure::usage(anyhow!(
                    "{} exists and is not a symbolic link (use --force to replace it)",
                    p.display()
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Failure::usage(anyhow!("{}: {e}", p.display()))),
        }
    }
    for p in &paths {
        // A new link renamed over the old one: a mount(8) running now finds one or the other.
        let tmp = p.with_file_name(format!(
            ".{}.{}",
            p.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&exe, &tmp)
            .and_then(|()| std::fs::rename(&tmp, p))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                Failure::usage(anyhow!("linking {} to {}: {e}", p.display(), exe.display()))
            })?;
        println!("{} -> {}", p.display(), exe.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(args: &[&str]) -> Vec<Word> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let mut w = Words::new(&args);
        let mut out = Vec::new();
        while let Some(x) = w.next() {
            let v = matches!(x, Word::Short('o')).then(|| w.value());
            out.push(x);
            if let Some(Some(v)) = v {
                out.push(Word::Positional(v));
            }
        }
        out
    }

    #[test]
    fn words_split_clusters_attached_values_and_long_options() {
        use Word::*;
        let p = |s: &str| Positional(s.into());
        assert_eq!(
            words(&["img", "dir", "-nv", "-o", "ro,nosuid"]),
            [
                p("img"),
                p("dir"),
                Short('n'),
                Short('v'),
                Short('o'),
                p("ro,nosuid")
            ]
        );
        assert_eq!(
            words(&["-sorw", "--logdev=x", "--force", "--", "-img"]),
            [
                Short('s'),
                Short('o'),
                p("rw"),
                Long("logdev".into(), Some("x".into())),
                Long("force".into(), None),
                p("-img")
            ]
        );
    }

    #[test]
    fn helper_names() {
        assert_eq!(
            called_as(OsStr::new("/sbin/mount.fuse.cilfs")),
            Some(("mount.fuse.cilfs", Helper::Mount))
        );
        assert_eq!(
            called_as(OsStr::new("fsck.cilfs")).map(|h| h.1),
            Some(Helper::Fsck)
        );
        assert_eq!(called_as(OsStr::new("/usr/bin/cilfs")), None);
    }

    #[test]
    fn mkfs_size_after_the_device_is_in_blocks() {
        assert_eq!(blocks_to_size("1024", None), Ok("4194304".into()));
        assert_eq!(blocks_to_size("1024", Some("64k")), Ok("67108864".into()));
        assert_eq!(blocks_to_size("1G", None), Ok("1G".into()));
        assert!(blocks_to_size("99999999999999999999", None).is_err());
        assert!(blocks_to_size("18446744073709551615", None).is_err());
    }
}
