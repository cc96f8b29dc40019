//! Several threads at once through a mount (the concurrent core of docs/concurrency.md, seen through FUSE):
//! each thread works in a directory of its own, whose contents it keeps a model of, and in one
//! directory all of them share, where they race on the same names. Afterwards every private
//! file is as its thread left it, every name in the shared tree leads to an inode whose link
//! count is the number of names it has, the image checks clean, and all of it holds again after
//! a remount; and after the daemon is killed amid such threads, the log's replay leaves a clean
//! image holding every file a thread had fsynced and not touched since. Scripts/test runs this
//! suite over each FUSE transport. Needs root and /dev/fuse.
#![allow(clippy::unwrap_used)]

use cilfs_device::rng::SimRng;
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

mod common;
use common::Mounted;

const THREADS: u64 = 4;

/// A file's content, a pure function of (seed, length): what a model keeps instead of bytes.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut r = SimRng::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Sizes that cross the cases: empty, inside one block, exactly one, several, past a hole.
const SIZES: [usize; 7] = [0, 1, 100, 4096, 5000, 70_000, 300_000];

/// What one thread left in its own directory: name -> (seed, length).
type Model = HashMap<String, (u64, usize)>;

/// One thread: about half its operations in its own directory `own`, whose `model` it keeps,
/// the rest in the shared one. `durable` holds the files it wrote and fsynced, each taken out
/// before any later change of its name, so that a kill at any moment finds them as recorded.
struct Worker {
    t: u64,
    r: SimRng,
    own: PathBuf,
    shared: PathBuf,
    model: Model,
    durable: Model,
    /// Every write fsynced (the kill test).
    sync_all: bool,
}

impl Worker {
    fn name(&mut self) -> String {
        format!("f{}", self.r.below(60))
    }

    fn shared_name(&mut self) -> PathBuf {
        self.shared.join(format!("s{}", self.r.below(40)))
    }

    fn shared_dir(&mut self) -> PathBuf {
        self.shared.join(format!("d{}", self.r.below(6)))
    }

    fn step(&mut self, op: u64) -> std::io::Result<()> {
        let t = self.t;
        match op {
            // Write a whole file, sometimes fsynced.
            0..=24 => {
                let n = self.name();
                let s = self.r.next_u64();
                let len = SIZES[self.r.below(SIZES.len() as u64) as usize];
                let sync = self.sync_all || self.r.chance(1, 8);
                self.durable.remove(&n);
                let mut f = fs::File::create(self.own.join(&n))?;
                f.write_all(&content(s, len))?;
                if sync {
                    f.sync_all()?;
                    self.durable.insert(n.clone(), (s, len));
                }
                self.model.insert(n, (s, len));
            }
            // Read one back.
            25..=32 => {
                let n = self.name();
                if let Some(&(s, len)) = self.model.get(&n) {
                    let got = fs::read(self.own.join(&n))?;
                    assert!(
                        got == content(s, len),
                        "thread {t}: {n} read back {} bytes, not the {len} written",
                        got.len()
                    );
                }
            }
            // Truncate, check the prefix left, and rewrite at the new length.
            33..=38 => {
                let n = self.name();
                if let Some(&(s, len)) = self.model.get(&n) {
                    self.durable.remove(&n);
                    let new = self.r.below(len as u64 + 1) as usize;
                    fs::OpenOptions::new()
                        .write(true)
                        .open(self.own.join(&n))?
                        .set_len(new as u64)?;
                    let got = fs::read(self.own.join(&n))?;
                    assert!(
                        got[..] == content(s, len)[..new],
                        "thread {t}: {n} truncated to {new} reads wrong"
                    );
                    let s2 = self.r.next_u64();
                    fs::write(self.own.join(&n), content(s2, new))?;
                    self.model.insert(n, (s2, new));
                }
            }
            // Rename within its own directory, over an existing name or not.
            39..=44 => {
                let (a, b) = (self.name(), self.name());
                if let (true, Some(v)) = (a != b, self.model.get(&a).copied()) {
                    self.durable.remove(&a);
                    self.durable.remove(&b);
                    fs::rename(self.own.join(&a), self.own.join(&b))?;
                    self.model.remove(&a);
                    self.model.insert(b, v);
                }
            }
            45..=49 => {
                let n = self.name();
                if self.model.contains_key(&n) {
                    self.durable.remove(&n);
                    fs::remove_file(self.own.join(&n))?;
                    self.model.remove(&n);
                }
            }
            // The shared directory: any name may be another thread's at any moment.
            50..=61 => {
                let len = self.r.below(9000) as usize;
                let p = self.shared_name();
                fs::write(p, content(op, len)).or_else(ignore_race)?;
            }
            62..=69 => fs::remove_file(self.shared_name()).or_else(ignore_race)?,
            70..=77 => {
                let (a, b) = (self.shared_name(), self.shared_name());
                fs::rename(a, b).or_else(ignore_race)?;
            }
            78..=83 => {
                let (a, b) = (self.shared_name(), self.shared_name());
                fs::hard_link(a, b).or_else(ignore_race)?;
            }
            84..=87 => {
                let d = self.shared_dir();
                if self.r.bool() {
                    fs::create_dir(&d).or_else(ignore_race)?;
                } else {
                    fs::remove_dir(&d).or_else(ignore_race)?;
                }
            }
            88..=93 => {
                let from = self.shared_name();
                let to = self.shared_dir().join(format!("m{}", self.r.below(10)));
                fs::rename(from, to).or_else(ignore_race)?;
            }
            94..=96 => {
                let from = self.shared_dir().join(format!("m{}", self.r.below(10)));
                let to = self.shared_name();
                fs::rename(from, to).or_else(ignore_race)?;
            }
            _ => {
                for e in fs::read_dir(&self.shared)? {
                    // An entry listed may be gone by the time it is looked at.
                    let _ = e?.metadata();
                }
            }
        }
        Ok(())
    }
}

/// Runs thread `t` for `ops` operations or until `stop`; returns its model, or with
/// `sync_all` what it had made durable.
fn run_thread(
    root: &Path,
    t: u64,
    ops: usize,
    seed: u64,
    done: &AtomicUsize,
    stop: &AtomicBool,
    sync_all: bool,
) -> Model {
    let mut w = Worker {
        t,
        r: SimRng::derive(seed, t),
        own: root.join(format!("own{t}")),
        shared: root.join("shared"),
        model: Model::new(),
        durable: Model::new(),
        sync_all,
    };
    for _ in 0..ops {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let op = w.r.below(100);
        if let Err(e) = w.step(op) {
            // After the kill the mount answers nothing: the thread stops.
            assert!(stop.load(Ordering::Relaxed), "thread {t}, op {op}: {e}");
            break;
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    if sync_all {
        w.durable
    } else {
        w.model
    }
}

/// Lets pass the errors a thread may meet in the shared directory, where the others change
/// the same names.
fn ignore_race(e: std::io::Error) -> std::io::Result<()> {
    use rustix::io::Errno;
    match Errno::from_io_error(&e) {
        Some(Errno::NOENT | Errno::EXIST | Errno::NOTEMPTY | Errno::ISDIR | Errno::NOTDIR) => {
            Ok(())
        }
        _ => Err(e),
    }
}

/// Runs the threads on the mount at `root`; with `kill`, kills the daemon once that many
/// operations completed (all threads together) and returns what each thread had made durable.
fn run_threads(root: &Path, ops: usize, seed: u64, kill: Option<(usize, &Mounted)>) -> Vec<Model> {
    for t in 0..THREADS {
        fs::create_dir_all(root.join(format!("own{t}"))).unwrap();
    }
    fs::create_dir_all(root.join("shared")).unwrap();
    let done = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let running = AtomicUsize::new(THREADS as usize);
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (done, stop, running) = (&done, &stop, &running);
                sc.spawn(move || {
                    // Counted out however the thread ends, a failed assertion included, so
                    // that the wait below never outlives the threads.
                    let _out = Leaving(running);
                    run_thread(root, t, ops, seed, done, stop, kill.is_some())
                })
            })
            .collect();
        if let Some((after, m)) = kill {
            // Waits for progress, not for a time: the kill lands amid the threads' work.
            while done.load(Ordering::Relaxed) < after && running.load(Ordering::Relaxed) > 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            stop.store(true, Ordering::Relaxed);
            m.kill_daemon();
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Counts its thread out of `running` when dropped.
struct Leaving<'a>(&'a AtomicUsize);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn verify_models(root: &Path, models: &[Model], what: &str) {
    for (t, model) in models.iter().enumerate() {
        let own = root.join(format!("own{t}"));
        for (n, &(s, len)) in model {
            let got =
                fs::read(own.join(n)).unwrap_or_else(|e| panic!("{what}: thread {t}: {n}: {e}"));
            assert!(
                got == content(s, len),
                "{what}: thread {t}: {n} has {} bytes, not the {len} written",
                got.len()
            );
        }
    }
}

/// Every regular file in the shared tree has as many names there as its link count says.
fn verify_shared_links(root: &Path, what: &str) {
    let mut names: HashMap<u64, (u64, Vec<PathBuf>)> = HashMap::new();
    let mut dirs = vec![root.join("shared")];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p)
                .unwrap_or_else(|e| panic!("{what}: {} listed but not found: {e}", p.display()));
            if m.is_dir() {
                dirs.push(p);
            } else {
                names
                    .entry(m.ino())
                    .or_insert((m.nlink(), Vec::new()))
                    .1
                    .push(p);
            }
        }
    }
    for (ino, (nlink, paths)) in names {
        assert_eq!(
            nlink,
            paths.len() as u64,
            "{what}: inode {ino} has link count {nlink} and names {paths:?}"
        );
    }
}

#[test]
fn threads_in_their_own_and_a_shared_directory_keep_every_file() {
    let m = Mounted::new("512M", &[]);
    let models = run_threads(&m.dir, 3000, 17, None);
    verify_models(&m.dir, &models, "mounted");
    verify_shared_links(&m.dir, "mounted");
    m.unmount();
    m.mount(&[]);
    verify_models(&m.dir, &models, "remounted");
    verify_shared_links(&m.dir, "remounted");
    m.unmount();
}

#[test]
fn a_daemon_killed_amid_threads_leaves_every_fsynced_file_and_a_clean_image() {
    let m = Mounted::new("512M", &[]);
    let durable = run_threads(&m.dir, 100_000, 23, Some((4000, &m)));
    assert!(
        durable.iter().any(|d| !d.is_empty()),
        "nothing was fsynced before the kill"
    );
    // The mount replays the log; the unmount's check finds the image clean.
    m.mount(&[]);
    m.unmount();
    m.mount(&[]);
    verify_models(&m.dir, &durable, "after the kill");
    verify_shared_links(&m.dir, "after the kill");
    m.unmount();
}
