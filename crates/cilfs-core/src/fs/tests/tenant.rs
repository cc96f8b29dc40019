//! Tenants on a virtual clock: a throttled project's IO waits in its own requests only, its
//! rate is its limit, and limits and projects are kept across remounts.

#![allow(clippy::unwrap_used)]

use crate::fs::tests::{assert_clean, mount, new_dev};
use crate::fs::types::XattrFlags;
use crate::fs::types::{Cred, RenameFlags};
use crate::fs::*;
use cilfs_device::TenantLimits;
use std::sync::{mpsc, Condvar, Mutex};
use std::time::Duration;

const U: Cred = Cred::user(1000, 1000);

/// Time that moves only when the test says: `sleep` blocks until `advance_to_next` reaches
/// its end.
#[derive(Debug, Default)]
struct VirtualClock {
    state: Mutex<ClockState>,
    moved: Condvar,
}

#[derive(Debug, Default)]
struct ClockState {
    now: Duration,
    /// When each sleeping thread wakes.
    deadlines: Vec<Duration>,
}

impl VirtualClock {
    fn now_(&self) -> Duration {
        self.state.lock().unwrap().now
    }
    /// Threads sleeping now.
    fn sleepers(&self) -> usize {
        let g = self.state.lock().unwrap();
        g.deadlines.iter().filter(|&&d| d > g.now).count()
    }
    /// Waits until `n` threads sleep. A test whose threads never come to sleep (no IO waited
    /// for its budget) fails after a minute instead of waiting forever.
    fn wait_for_sleepers(&self, n: usize) {
        let g = self.state.lock().unwrap();
        let (g, _) = self
            .moved
            .wait_timeout_while(g, Duration::from_secs(60), |g| {
                g.deadlines.iter().filter(|&&d| d > g.now).count() < n
            })
            .unwrap();
        let sleeping = g.deadlines.iter().filter(|&&d| d > g.now).count();
        assert!(sleeping >= n, "{sleeping} threads came to sleep, not {n}");
    }
    /// Moves time to the earliest deadline of a sleeping thread; false if none sleeps.
    fn advance_to_next(&self) -> bool {
        let mut g = self.state.lock().unwrap();
        let now = g.now;
        let Some(next) = g.deadlines.iter().copied().filter(|&d| d > now).min() else {
            return false;
        };
        g.now = next;
        self.moved.notify_all();
        true
    }
}

impl cilfs_device::Clock for VirtualClock {
    fn now(&self) -> Duration {
        self.now_()
    }
    fn sleep(&self, d: Duration) {
        let mut g = self.state.lock().unwrap();
        let until = g.now + d;
        g.deadlines.push(until);
        self.moved.notify_all();
        while g.now < until {
            g = self.moved.wait(g).unwrap();
        }
        let i = g.deadlines.iter().position(|&x| x == until).unwrap();
        g.deadlines.swap_remove(i);
    }
}

fn opts(clock: &Arc<VirtualClock>) -> FsOptions {
    FsOptions {
        io_clock: Some(clock.clone() as Arc<dyn cilfs_device::Clock>),
        ..FsOptions::default()
    }
}

fn limit(fs: &Fs, id: u32, write_iops: u64) {
    let l = TenantLimits {
        write_iops: Some(write_iops),
        ..TenantLimits::default()
    };
    fs.set_tenant_limits(Cred::ROOT, id, l).unwrap();
}

/// Tenant A (project 7) at 10 write IOPS creates, writes and fsyncs files; tenant B
/// (unlimited) creates, writes and fsyncs in its own directory while A's IO waits for its
/// budget, and A's rate is its limit.
#[test]
fn a_throttled_tenant_waits_alone_and_gets_its_rate() {
    let clock = Arc::new(VirtualClock::default());
    let dev = new_dev(2201);
    let fs = mount(&dev, opts(&clock));
    let a = fs.mkdir(Cred::ROOT, ROOT_INO, b"a", 0o777).unwrap().ino;
    let b = fs.mkdir(Cred::ROOT, ROOT_INO, b"b", 0o777).unwrap().ino;
    fs.set_project(Cred::ROOT, a, 7).unwrap();
    limit(&fs, 7, 10);
    const FILES: usize = 20;
    let done_a = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tenant_a = {
        let (fs, done) = (Arc::clone(&fs), Arc::clone(&done_a));
        std::thread::spawn(move || {
            for i in 0..FILES {
                let f = fs
                    .mknod(
                        U,
                        a,
                        format!("f{i}").as_bytes(),
                        items::inode::S_IFREG | 0o644,
                        0,
                    )
                    .unwrap();
                assert_eq!(f.ino, fs.lookup(a, format!("f{i}").as_bytes()).unwrap().ino);
                assert_eq!(
                    fs.project(f.ino).unwrap(),
                    7,
                    "inherited from its directory"
                );
                fs.write(U, f.ino, 0, &[0xA; 4096]).unwrap();
                fs.fsync(f.ino).unwrap();
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    // A's second IO waits for its budget (the first goes at once).
    clock.wait_for_sleepers(1);
    let (tx, rx) = mpsc::channel();
    let tenant_b = {
        let (fs, clock, done) = (Arc::clone(&fs), Arc::clone(&clock), Arc::clone(&done_a));
        std::thread::spawn(move || {
            for i in 0..FILES {
                let f = fs
                    .mknod(
                        U,
                        b,
                        format!("f{i}").as_bytes(),
                        items::inode::S_IFREG | 0o644,
                        0,
                    )
                    .unwrap()
                    .ino;
                fs.write(U, f, 0, &[0xB; 4096]).unwrap();
                if i % 2 == 0 {
                    fs.fsync(f).unwrap();
                }
            }
            fs.unlink(b, b"f0").unwrap();
            fs.writeback_idle().unwrap();
            fs.journal().force_all().unwrap();
            tx.send((
                clock.sleepers(),
                done.load(std::sync::atomic::Ordering::SeqCst),
            ))
            .unwrap();
        })
    };
    // Not a measure of speed: only how long to wait before calling B stuck.
    let (sleeping, a_done) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("tenant B's operations waited for tenant A's budget");
    tenant_b.join().unwrap();
    assert_eq!(sleeping, 1, "A's IO is still queued when B is done");
    assert!(
        a_done <= 2,
        "A got no further than its budget allows ({a_done} files)"
    );
    assert_eq!(clock.now_(), Duration::ZERO, "no time passed for B");
    // Now time moves, to each of A's deadlines in turn, until A is done.
    while !tenant_a.is_finished() {
        if !clock.advance_to_next() {
            std::thread::yield_now();
        }
    }
    tenant_a.join().unwrap();
    let elapsed = clock.now_();
    let s = fs
        .tenants()
        .into_iter()
        .find(|(id, _, _)| *id == 7)
        .unwrap()
        .2;
    assert_eq!(s.write.ios, FILES as u64);
    // The first two IOs go at once (the 100 ms burst), the other 18 at 10 a second.
    let rate = (s.write.ios - 2) as f64 / elapsed.as_secs_f64();
    assert!(
        (9.0..=11.0).contains(&rate),
        "A's rate {rate:.2} IOPS over {elapsed:?}, limit 10"
    );
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    for i in 0..FILES {
        let f = fs.lookup(a, format!("f{i}").as_bytes()).unwrap().ino;
        assert_eq!(fs.read(f, 0, 4096).unwrap(), vec![0xA; 4096]);
    }
    assert_clean(&fs);
}

/// The periodic write back takes only the budget a throttled tenant has now and leaves the
/// rest of its pages dirty, instead of waiting for it.
#[test]
fn the_periodic_write_back_never_waits_for_a_throttled_tenant() {
    let clock = Arc::new(VirtualClock::default());
    let dev = new_dev(2202);
    let fs = mount(&dev, opts(&clock));
    let a = fs.mkdir(Cred::ROOT, ROOT_INO, b"a", 0o777).unwrap().ino;
    fs.set_project(Cred::ROOT, a, 9).unwrap();
    // Files with blocks (written before the limit), then overwritten: dirty pages.
    let files: Vec<u64> = (0..6)
        .map(|i| {
            let f = fs
                .mknod(
                    U,
                    a,
                    format!("f{i}").as_bytes(),
                    items::inode::S_IFREG | 0o644,
                    0,
                )
                .unwrap()
                .ino;
            fs.write(U, f, 0, &[1; 2048]).unwrap();
            f
        })
        .collect();
    limit(&fs, 9, 1);
    for &f in &files {
        fs.write(U, f, 0, &[2; 2048]).unwrap();
    }
    let dirty = || fs.read_state().cache.dirty_pages();
    assert_eq!(dirty(), files.len());
    let ios = || fs.tenants().iter().find(|t| t.0 == 9).unwrap().2.write.ios;
    let ios_before = ios();
    let (tx, rx) = mpsc::channel();
    {
        let fs = Arc::clone(&fs);
        std::thread::spawn(move || tx.send(fs.writeback_idle().is_ok()).unwrap());
    }
    assert!(
        rx.recv_timeout(Duration::from_secs(60)).unwrap(),
        "the periodic write back waited for a throttled tenant"
    );
    assert_eq!(clock.sleepers(), 0);
    // One page went (the budget of one IO), the rest wait for A's own fsync or later rounds.
    assert_eq!(dirty(), files.len() - 1);
    assert_eq!(ios() - ios_before, 1);
    // Lifting the limit: everything goes.
    fs.set_tenant_limits(Cred::ROOT, 9, TenantLimits::default())
        .unwrap();
    fs.writeback_idle().unwrap();
    assert_eq!(dirty(), 0);
    fs.unmount().unwrap();
}

/// Projects are inherited and kept; limits are kept in the filesystem across remounts; a
/// rename or link into another project's directory is EXDEV; only root sets either; the
/// xattrs that keep the limits cannot be set directly.
#[test]
fn projects_and_limits_are_kept_inherited_and_guarded() {
    let clock = Arc::new(VirtualClock::default());
    let dev = new_dev(2203);
    let fs = mount(&dev, opts(&clock));
    let p = fs.mkdir(Cred::ROOT, ROOT_INO, b"p", 0o777).unwrap().ino;
    let q = fs.mkdir(Cred::ROOT, ROOT_INO, b"q", 0o777).unwrap().ino;
    let none = fs.mkdir(Cred::ROOT, ROOT_INO, b"none", 0o777).unwrap().ino;
    assert!(matches!(
        fs.set_project(U, p, 5),
        Err(FsError::NotPermitted)
    ));
    fs.setxattr(p, tenant::PROJECT_XATTR, b"5", XattrFlags::default())
        .unwrap();
    fs.set_project(Cred::ROOT, q, 6).unwrap();
    let sub = fs.mkdir(U, p, b"sub", 0o755).unwrap().ino;
    let f = fs
        .mknod(U, sub, b"f", items::inode::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    assert_eq!(fs.project(sub).unwrap(), 5);
    assert_eq!(
        fs.getxattr(f, tenant::PROJECT_XATTR).unwrap(),
        b"5".to_vec()
    );
    // Into another project: EXDEV, both ways; into a directory with no project: allowed.
    assert!(matches!(
        fs.rename(sub, b"f", q, b"f", RenameFlags::default()),
        Err(FsError::CrossProject)
    ));
    assert!(matches!(fs.link(f, q, b"l"), Err(FsError::CrossProject)));
    fs.link(f, p, b"same-project").unwrap();
    fs.rename(sub, b"f", none, b"f", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.project(f).unwrap(), 5, "a move keeps the data's project");
    // Limits: through the virtual xattr, root only; the stored form is not settable.
    let name = b"user.cilfs.tenant.5";
    assert!(matches!(
        fs.set_xattr_as(
            U,
            ROOT_INO,
            name,
            Some(b"write_iops=100"),
            XattrFlags::default()
        ),
        Err(FsError::NotPermitted)
    ));
    fs.setxattr(
        ROOT_INO,
        name,
        b"write_iops=100 read_bps=1048576",
        XattrFlags::default(),
    )
    .unwrap();
    assert!(matches!(
        fs.setxattr(
            ROOT_INO,
            b"trusted.cilfs.tenant.5",
            b"write_iops=1",
            XattrFlags::default()
        ),
        Err(FsError::NotPermitted)
    ));
    assert!(matches!(
        fs.setxattr(ROOT_INO, name, b"write_iops=lots", XattrFlags::default()),
        Err(FsError::Invalid(_))
    ));
    limit(&fs, 6, 50);
    assert_eq!(fs.stored_tenant_limits(), 2);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, opts(&clock));
    assert_eq!(
        fs.getxattr(ROOT_INO, name).unwrap(),
        b"write_iops=100 write_bps=0 read_iops=0 read_bps=1048576".to_vec()
    );
    let listed = String::from_utf8(fs.getxattr(ROOT_INO, tenant::TENANTS_XATTR).unwrap()).unwrap();
    assert!(listed.starts_with("5 write_iops=100 "), "{listed}");
    assert!(listed.contains("\n6 write_iops=50 "), "{listed}");
    assert_eq!(fs.project(f).unwrap(), 5);
    // Removing the limits' xattr lifts them.
    fs.removexattr(ROOT_INO, name).unwrap();
    assert_eq!(fs.stored_tenant_limits(), 1);
    assert_clean(&fs);
}
