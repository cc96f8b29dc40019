use crate::counters::IoStats;
use crate::{Device, Result, WriteFlags};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Who an IO is done for. [`TenantId::UNTHROTTLED`] is never limited: the journal uses it, so
/// metadata never waits for a throttled tenant's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub u32);

impl TenantId {
    pub const UNTHROTTLED: TenantId = TenantId(0);
}

/// Limits of one tenant; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    pub iops: Option<u64>,
    pub bytes_per_s: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantStats {
    pub ios: u64,
    pub bytes: u64,
    /// IOs that had to wait for their budget.
    pub throttled_ios: u64,
    pub throttle_wait: Duration,
}

/// Time source of the throttle; tests use a virtual clock so they never depend on wall time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Duration;
    fn sleep(&self, d: Duration);
}

#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// How far ahead of its rate a tenant may burst.
const BURST: Duration = Duration::from_millis(100);

/// Generic cell rate algorithm: `tat` is the theoretical arrival time of the next IO.
#[derive(Debug, Default)]
struct Rate {
    tat: Duration,
}

impl Rate {
    /// Charges `cost` units at `per_s` units per second; returns how long to wait.
    fn charge(&mut self, now: Duration, cost: u64, per_s: u64) -> Duration {
        let interval = Duration::from_secs_f64(cost as f64 / per_s.max(1) as f64);
        self.tat = self.tat.max(now) + interval;
        self.tat.saturating_sub(now + BURST)
    }
}

#[derive(Debug, Default)]
struct Bucket {
    limits: TenantLimits,
    iops: Rate,
    bytes: Rate,
    stats: TenantStats,
}

/// Token-bucket IO limits per tenant over any device. Get a per-tenant view with
/// [`Throttle::tenant`]; flushes are device-wide and never throttled.
#[derive(Debug)]
pub struct Throttle<D> {
    inner: D,
    clock: Arc<dyn Clock>,
    tenants: Mutex<HashMap<TenantId, Bucket>>,
}

impl<D: Device> Throttle<D> {
    pub fn new(inner: D) -> Arc<Self> {
        Self::with_clock(inner, Arc::new(SystemClock::default()))
    }

    pub fn with_clock(inner: D, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            clock,
            tenants: Mutex::new(HashMap::new()),
        })
    }

    /// Sets a tenant's limits; limits on [`TenantId::UNTHROTTLED`] are ignored.
    pub fn set_limits(&self, tenant: TenantId, limits: TenantLimits) {
        self.tenants.lock().entry(tenant).or_default().limits = limits;
    }

    pub fn tenant(self: &Arc<Self>, tenant: TenantId) -> TenantDevice<D> {
        TenantDevice {
            throttle: Arc::clone(self),
            tenant,
        }
    }

    pub fn tenant_stats(&self, tenant: TenantId) -> TenantStats {
        self.tenants
            .lock()
            .get(&tenant)
            .map(|b| b.stats)
            .unwrap_or_default()
    }

    /// Takes the tenant's budget for one IO of `bytes`, sleeping (outside the lock) if it is spent.
    fn admit(&self, tenant: TenantId, bytes: usize) {
        let wait = {
            let mut tenants = self.tenants.lock();
            let b = tenants.entry(tenant).or_default();
            b.stats.ios += 1;
            b.stats.bytes += bytes as u64;
            if tenant == TenantId::UNTHROTTLED {
                return;
            }
            let now = self.clock.now();
            let mut wait = Duration::ZERO;
            if let Some(iops) = b.limits.iops {
                wait = wait.max(b.iops.charge(now, 1, iops));
            }
            if let Some(bps) = b.limits.bytes_per_s {
                wait = wait.max(b.bytes.charge(now, bytes as u64, bps));
            }
            if !wait.is_zero() {
                b.stats.throttled_ios += 1;
                b.stats.throttle_wait += wait;
            }
            wait
        };
        if !wait.is_zero() {
            self.clock.sleep(wait);
        }
    }
}

/// One tenant's view of a throttled device.
#[derive(Debug)]
pub struct TenantDevice<D> {
    throttle: Arc<Throttle<D>>,
    tenant: TenantId,
}

impl<D: Device> Device for TenantDevice<D> {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.throttle.admit(self.tenant, buf.len());
        self.throttle.inner.read(offset, buf)
    }

    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()> {
        self.throttle.admit(self.tenant, buf.len());
        self.throttle.inner.write(offset, buf, flags)
    }

    fn flush(&self) -> Result<()> {
        self.throttle.inner.flush()
    }

    fn len(&self) -> u64 {
        self.throttle.inner.len()
    }

    fn stats(&self) -> IoStats {
        self.throttle.inner.stats()
    }
}
