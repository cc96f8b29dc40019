//! `cilfs tenant`: projects (tenants) and their IO limits on a mounted filesystem, through the
//! virtual xattrs the daemon serves (`user.cilfs.project` on any file or directory,
//! `user.cilfs.tenant.<id>` and `user.cilfs.tenants` on the root). Like `xfs_quota -x -c
//! 'project -s'`, `assign` tags a whole tree; new files then inherit their directory's project.

use crate::Failure;
use anyhow::anyhow;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Put a directory tree in a project: the directory, and everything below it unless
    /// --no-recurse (files created later inherit their directory's project)
    Assign {
        dir: PathBuf,
        /// Project ID (1 to 4294967295; 0 takes the tree out of every project)
        id: u32,
        /// Only the directory itself
        #[arg(long)]
        no_recurse: bool,
    },
    /// Set a project's IO limits (0 is unlimited; limits not given keep their value)
    Limit {
        /// The mount point
        mount: PathBuf,
        id: u32,
        /// Writes per second
        #[arg(long)]
        write_iops: Option<u64>,
        /// Bytes written per second
        #[arg(long)]
        write_bps: Option<u64>,
        /// Reads per second
        #[arg(long)]
        read_iops: Option<u64>,
        /// Bytes read per second
        #[arg(long)]
        read_bps: Option<u64>,
    },
    /// Remove a project's limits
    Clear { mount: PathBuf, id: u32 },
    /// Every project with limits or IO: its limits, IOs, bytes and time spent waiting for its
    /// budget
    List {
        mount: PathBuf,
        /// One JSON array
        #[arg(long)]
        json: bool,
    },
    /// The project of a file or directory
    Show { path: PathBuf },
}

const PROJECT: &str = "user.cilfs.project";
const TENANTS: &str = "user.cilfs.tenants";

fn tenant_xattr(id: u32) -> String {
    format!("user.cilfs.tenant.{id}")
}

fn get(path: &Path, name: &str) -> Result<String, Failure> {
    String::from_utf8(super::stat::xattr(path, name)?)
        .map_err(|_| Failure::usage(anyhow!("{name}: not text")))
}

fn set(path: &Path, name: &str, value: &str) -> Result<(), Failure> {
    rustix::fs::lsetxattr(
        path,
        name,
        value.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(|e| {
        let hint = if e == rustix::io::Errno::PERM {
            " (only root changes projects and limits)"
        } else {
            ""
        };
        Failure::usage(anyhow!("{}: setting {name}: {e}{hint}", path.display()))
    })
}

pub fn run(c: Command) -> Result<(), Failure> {
    match c {
        Command::Assign {
            dir,
            id,
            no_recurse,
        } => assign(&dir, id, no_recurse),
        Command::Limit {
            mount,
            id,
            write_iops,
            write_bps,
            read_iops,
            read_bps,
        } => {
            check_id(id)?;
            let name = tenant_xattr(id);
            let mut fields: Vec<(String, u64)> = parse_fields(&get(&mount, &name)?);
            for (k, v) in [
                ("write_iops", write_iops),
                ("write_bps", write_bps),
                ("read_iops", read_iops),
                ("read_bps", read_bps),
            ] {
                if let Some(v) = v {
                    match fields.iter_mut().find(|(f, _)| f == k) {
                        Some(f) => f.1 = v,
                        None => fields.push((k.to_string(), v)),
                    }
                }
            }
            let text = fields
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
            set(&mount, &name, &text)?;
            println!("project {id}: {}", get(&mount, &name)?);
            Ok(())
        }
        Command::Clear { mount, id } => {
            check_id(id)?;
            set(&mount, &tenant_xattr(id), "")?;
            println!("project {id}: no limits");
            Ok(())
        }
        Command::List { mount, json } => list(&mount, json),
        Command::Show { path } => {
            println!("{}", get(&path, PROJECT)?.trim());
            Ok(())
        }
    }
}

fn check_id(id: u32) -> Result<(), Failure> {
    if id == 0 {
        return Err(Failure::usage(anyhow!(
            "project 0 is no project, and never limited"
        )));
    }
    Ok(())
}

/// `k=v` fields of a limits line.
fn parse_fields(text: &str) -> Vec<(String, u64)> {
    text.split_whitespace()
        .filter_map(|f| {
            let (k, v) = f.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn assign(dir: &Path, id: u32, no_recurse: bool) -> Result<(), Failure> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| Failure::usage(anyhow!("{}: {e}", dir.display())))?;
    if !meta.is_dir() {
        return Err(Failure::usage(anyhow!(
            "{}: not a directory",
            dir.display()
        )));
    }
    let value = id.to_string();
    let mut done = 0u64;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        set(&d, PROJECT, &value)?;
        done += 1;
        if no_recurse {
            break;
        }
        let entries =
            std::fs::read_dir(&d).map_err(|e| Failure::usage(anyhow!("{}: {e}", d.display())))?;
        for e in entries {
            let e = e.map_err(|e| Failure::usage(anyhow!("{}: {e}", d.display())))?;
            let t = e
                .file_type()
                .map_err(|err| Failure::usage(anyhow!("{}: {err}", e.path().display())))?;
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                // Only files carry data IO; symlinks and special files have none to charge.
                set(&e.path(), PROJECT, &value)?;
                done += 1;
            }
            if done % 10_000 == 0 {
                eprintln!("cilfs tenant assign: {done} inodes so far");
            }
        }
    }
    println!("{}: {done} inodes in project {id}", dir.display());
    Ok(())
}

fn list(mount: &Path, json: bool) -> Result<(), Failure> {
    let text = get(mount, TENANTS)?;
    let rows: Vec<(u32, Vec<(String, u64)>)> = text
        .lines()
        .filter_map(|l| {
            let (id, rest) = l.split_once(' ')?;
            Some((id.parse().ok()?, parse_fields(rest)))
        })
        .collect();
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(id, f)| {
                let mut o = serde_json::Map::new();
                o.insert("project".into(), serde_json::json!(id));
                for (k, v) in f {
                    o.insert(k.clone(), serde_json::json!(v));
                }
                serde_json::Value::Object(o)
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    println!(
        "{:>10} {:>10} {:>12} {:>10} {:>12} {:>10} {:>12} {:>12} {:>10} {:>12} {:>12}",
        "project",
        "write_iops",
        "write_bps",
        "read_iops",
        "read_bps",
        "write_ios",
        "write_bytes",
        "write_wait_ms",
        "read_ios",
        "read_bytes",
        "read_wait_ms"
    );
    for (id, f) in rows {
        let g = |k: &str| {
            f.iter()
                .find(|(n, _)| n == k)
                .map_or_else(|| "-".to_string(), |(_, v)| v.to_string())
        };
        println!(
            "{:>10} {:>10} {:>12} {:>10} {:>12} {:>10} {:>12} {:>12} {:>10} {:>12} {:>12}",
            id,
            g("write_iops"),
            g("write_bps"),
            g("read_iops"),
            g("read_bps"),
            g("write_ios"),
            g("write_bytes"),
            g("write_wait_ms"),
            g("read_ios"),
            g("read_bytes"),
            g("read_wait_ms")
        );
    }
    Ok(())
}
