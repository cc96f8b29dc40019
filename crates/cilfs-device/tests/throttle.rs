//! Per-tenant limits, measured on a virtual clock (no wall time in tests).

#![allow(clippy::unwrap_used)] // a test that cannot set up should fail loudly

use cilfs_device::{Clock, Device, SimDevice, TenantId, TenantLimits, Throttle, WriteFlags};
use cilfs_sync::Mutex;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Default)]
struct FakeClock {
    now: Mutex<Duration>,
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        *self.now.lock()
    }
    fn sleep(&self, d: Duration) {
        *self.now.lock() += d;
    }
}

fn setup() -> (Arc<FakeClock>, Arc<Throttle<SimDevice>>) {
    let clock = Arc::new(FakeClock::default());
    let t = Throttle::with_clock(SimDevice::new(1 << 20, 0), clock.clone());
    (clock, t)
}

#[test]
fn iops_limit_paces_a_tenant() {
    let (clock, t) = setup();
    t.set_limits(
        TenantId(1),
        TenantLimits {
            write_iops: Some(100),
            ..Default::default()
        },
    );
    let dev = t.tenant(TenantId(1));
    for i in 0..1000u64 {
        dev.write((i % 64) * 512, &[1; 512], WriteFlags::NONE)
            .unwrap();
    }
    let elapsed = clock.now();
    // 1000 IOs at 100/s take 10 s, less the 100 ms burst allowance.
    assert!(
        elapsed >= Duration::from_millis(9_890) && elapsed <= Duration::from_millis(10_000),
        "{elapsed:?}"
    );
    let s = t.tenant_stats(TenantId(1));
    assert_eq!(s.write.ios, 1000);
    assert!(s.write.throttled_ios > 980);
}

#[test]
fn bandwidth_limit_paces_a_tenant() {
    let (clock, t) = setup();
    t.set_limits(
        TenantId(2),
        TenantLimits {
            write_bytes_per_s: Some(1 << 20),
            ..Default::default()
        },
    );
    let dev = t.tenant(TenantId(2));
    for i in 0..256u64 {
        dev.write((i % 16) * 65536, &vec![1; 65536], WriteFlags::NONE)
            .unwrap();
    }
    // 16 MiB at 1 MiB/s.
    let elapsed = clock.now();
    assert!(
        elapsed >= Duration::from_millis(15_800) && elapsed <= Duration::from_secs(16),
        "{elapsed:?}"
    );
}

#[test]
fn unthrottled_tenant_and_flushes_never_wait() {
    let (clock, t) = setup();
    t.set_limits(
        TenantId(1),
        TenantLimits {
            write_iops: Some(1),
            write_bytes_per_s: Some(1),
            read_iops: Some(1),
            read_bytes_per_s: Some(1),
        },
    );
    // Limits set on the unthrottled tag are ignored.
    t.set_limits(
        TenantId::UNTHROTTLED,
        TenantLimits {
            write_iops: Some(1),
            write_bytes_per_s: Some(1),
            read_iops: Some(1),
            read_bytes_per_s: Some(1),
        },
    );
    let slow = t.tenant(TenantId(1));
    let journal = t.tenant(TenantId::UNTHROTTLED);
    slow.write(0, &[1; 512], WriteFlags::NONE).unwrap();
    let after_slow = clock.now();
    for i in 0..1000u64 {
        journal
            .write((i % 64) * 512, &[2; 512], WriteFlags::FUA)
            .unwrap();
        slow.flush().unwrap();
    }
    assert_eq!(
        clock.now(),
        after_slow,
        "journal IO or flushes waited for a throttled tenant"
    );
    assert_eq!(t.tenant_stats(TenantId::UNTHROTTLED).write.throttled_ios, 0);
}

#[test]
fn tenants_are_independent() {
    let (clock, t) = setup();
    t.set_limits(
        TenantId(1),
        TenantLimits {
            write_iops: Some(10),
            ..Default::default()
        },
    );
    let a = t.tenant(TenantId(1));
    let b = t.tenant(TenantId(2));
    for _ in 0..5 {
        a.write(0, &[1; 512], WriteFlags::NONE).unwrap();
    }
    let t0 = clock.now();
    for _ in 0..100 {
        b.write(512, &[1; 512], WriteFlags::NONE).unwrap();
    }
    assert_eq!(clock.now(), t0);
}

#[test]
fn reads_and_writes_have_their_own_limits() {
    let (clock, t) = setup();
    t.set_limits(
        TenantId(3),
        TenantLimits {
            read_iops: Some(10),
            ..Default::default()
        },
    );
    let dev = t.tenant(TenantId(3));
    for _ in 0..50 {
        dev.write(0, &[1; 512], WriteFlags::NONE).unwrap();
    }
    assert_eq!(clock.now(), Duration::ZERO, "writes are not limited");
    let mut buf = [0u8; 512];
    for _ in 0..21 {
        dev.read(0, &mut buf).unwrap();
    }
    // 21 reads at 10/s: the 21st starts 2 s after the first, less the 100 ms burst.
    assert_eq!(clock.now(), Duration::from_millis(1_900));
    let s = t.tenant_stats(TenantId(3));
    assert_eq!((s.read.ios, s.write.ios), (21, 50));
}

#[test]
fn try_admit_never_waits_and_charges_only_what_it_admits() {
    let (clock, t) = setup();
    t.set_limits(
        TenantId(4),
        TenantLimits {
            write_iops: Some(10),
            ..Default::default()
        },
    );
    // The burst allowance (100 ms at 10/s: this IO and one more), then nothing until time
    // moves.
    let admitted = (0..5)
        .filter(|_| t.try_admit(TenantId(4), cilfs_device::IoDir::Write, 512))
        .count();
    assert_eq!(admitted, 2);
    assert_eq!(clock.now(), Duration::ZERO);
    clock.sleep(Duration::from_millis(100));
    assert!(t.try_admit(TenantId(4), cilfs_device::IoDir::Write, 512));
    assert!(!t.try_admit(TenantId(4), cilfs_device::IoDir::Write, 512));
    assert_eq!(t.tenant_stats(TenantId(4)).write.ios, 3);
    assert!(t.try_admit(TenantId::UNTHROTTLED, cilfs_device::IoDir::Write, 512));
}
