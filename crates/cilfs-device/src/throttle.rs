use crate::counters::IoStats;
use crate::{Device, Result, WriteFlags};
use cilfs_sync::Mutex;
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

/// Limits of one tenant, by direction; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    pub write_iops: Option<u64>,
    pub write_bytes_per_s: Option<u64>,
    pub read_iops: Option<u64>,
    pub read_bytes_per_s: Option<u64>,
}

impl TenantLimits {
    pub fn is_unlimited(&self) -> bool {
        *self == TenantLimits::default()
    }
}

/// Which way an IO goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoDir {
    Read,
    Write,
}

/// What one tenant did in one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirStats {
    pub ios: u64,
    pub bytes: u64,
    /// IOs that had to wait for their budget.
    pub throttled_ios: u64,
    /// Time those IOs waited.
    pub throttle_wait: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantStats {
    pub read: DirStats,
    pub write: DirStats,
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
            start: cilfs_sync::time::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        cilfs_sync::time::now().saturating_duration_since(self.start)
    }
    fn sleep(&self, d: Duration) {
        cilfs_sync::thread::sleep(d);
    }
}

/// How far ahead of its rate a tenant may burst.
const BURST: Duration = Duration::from_millis(100);

/// Generic cell rate algorithm: `tat` is the theoretical arrival time of the next IO. An IO
/// may start once `tat` is no more than `BURST` ahead of now, so an idle tenant's first IO
/// never waits.
#[derive(Debug, Default)]
struct Rate {
    tat: Duration,
}

impl Rate {
    /// Charges `cost` units at `per_s` units per second; returns how long to wait.
    fn charge(&mut self, now: Duration, cost: u64, per_s: u64) -> Duration {
        let interval = Duration::from_secs_f64(cost as f64 / per_s.max(1) as f64);
        let wait = self.tat.saturating_sub(now + BURST);
        self.tat = self.tat.max(now) + interval;
        wait
    }
}

#[derive(Debug, Default)]
struct Bucket {
    limits: TenantLimits,
    write_iops: Rate,
    write_bytes: Rate,
    read_iops: Rate,
    read_bytes: Rate,
    stats: TenantStats,
}

impl Bucket {
    /// How long an IO of `bytes` in `dir` must wait for the budget at `now`, charging it only
    /// if `charge_if_waiting` or it need not wait.
    fn charge(
        &mut self,
        dir: IoDir,
        now: Duration,
        bytes: u64,
        charge_if_waiting: bool,
    ) -> Duration {
        let (iops, bps, ri, rb) = match dir {
            IoDir::Write => (
                self.limits.write_iops,
                self.limits.write_bytes_per_s,
                &mut self.write_iops,
                &mut self.write_bytes,
            ),
            IoDir::Read => (
                self.limits.read_iops,
                self.limits.read_bytes_per_s,
                &mut self.read_iops,
                &mut self.read_bytes,
            ),
        };
        let (saved_i, saved_b) = (ri.tat, rb.tat);
        let mut wait = Duration::ZERO;
        if let Some(iops) = iops {
            wait = wait.max(ri.charge(now, 1, iops));
        }
        if let Some(bps) = bps {
            wait = wait.max(rb.charge(now, bytes, bps));
        }
        if !wait.is_zero() && !charge_if_waiting {
            ri.tat = saved_i;
            rb.tat = saved_b;
        }
        wait
    }

    fn stats_mut(&mut self, dir: IoDir) -> &mut DirStats {
        match dir {
            IoDir::Read => &mut self.stats.read,
            IoDir::Write => &mut self.stats.write,
        }
    }
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

    pub fn limits(&self, tenant: TenantId) -> TenantLimits {
        self.tenants
            .lock()
            .get(&tenant)
            .map(|b| b.limits)
            .unwrap_or_default()
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

    /// Every tenant with limits or IO so far, in order.
    pub fn tenants(&self) -> Vec<(TenantId, TenantLimits, TenantStats)> {
        let mut v: Vec<_> = self
            .tenants
            .lock()
            .iter()
            .map(|(&t, b)| (t, b.limits, b.stats))
            .collect();
        v.sort_by_key(|(t, _, _)| *t);
        v
    }

    /// The device the throttle paces.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The throttle's time source.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Takes the tenant's budget for one IO of `bytes`, sleeping (outside the lock) if it is
    /// spent: in the caller's thread, so only the caller waits.
    pub fn admit(&self, tenant: TenantId, dir: IoDir, bytes: usize) {
        let wait = {
            let mut tenants = self.tenants.lock();
            let b = tenants.entry(tenant).or_default();
            let st = b.stats_mut(dir);
            st.ios += 1;
            st.bytes += bytes as u64;
            if tenant == TenantId::UNTHROTTLED {
                return;
            }
            let wait = b.charge(dir, self.clock.now(), bytes as u64, true);
            if !wait.is_zero() {
                let st = b.stats_mut(dir);
                st.throttled_ios += 1;
                st.throttle_wait += wait;
            }
            wait
        };
        if !wait.is_zero() {
            self.clock.sleep(wait);
        }
    }

    /// Takes the budget for one IO of `bytes` only if it is there now (nothing is charged
    /// otherwise): for work done on a tenant's behalf by a thread that serves others too (the
    /// periodic write back), which leaves the IO for later rather than wait.
    pub fn try_admit(&self, tenant: TenantId, dir: IoDir, bytes: usize) -> bool {
        let mut tenants = self.tenants.lock();
        let b = tenants.entry(tenant).or_default();
        if tenant != TenantId::UNTHROTTLED
            && !b
                .charge(dir, self.clock.now(), bytes as u64, false)
                .is_zero()
        {
            return false;
        }
        let st = b.stats_mut(dir);
        st.ios += 1;
        st.bytes += bytes as u64;
        true
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
        self.throttle.admit(self.tenant, IoDir::Read, buf.len());
        self.throttle.inner.read(offset, buf)
    }

    fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> Result<()> {
        self.throttle.admit(self.tenant, IoDir::Write, buf.len());
        self.throttle.inner.write(offset, buf, flags)
    }

    fn flush(&self) -> Result<()> {
        self.throttle.inner.flush()
    }

    fn flush_reporting(&self) -> Result<bool> {
        self.throttle.inner.flush_reporting()
    }

    fn len(&self) -> u64 {
        self.throttle.inner.len()
    }

    fn stats(&self) -> IoStats {
        self.throttle.inner.stats()
    }

    fn can_discard(&self) -> bool {
        self.throttle.inner.can_discard()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.throttle.inner.discard(offset, len)
    }
}
