//! Log sequence numbers: (cycle, block) positions in the log, where a block is a 512-byte sector
//! and the cycle counts how many times the log has wrapped. Cycle 0 is never written, so a zeroed
//! log holds no records.

use std::fmt;

pub const LOG_SECTOR: u64 = 512;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);

    pub fn new(cycle: u32, block: u32) -> Self {
        Lsn((u64::from(cycle) << 32) | u64::from(block))
    }
    pub fn from_raw(raw: u64) -> Self {
        Lsn(raw)
    }
    pub fn raw(self) -> u64 {
        self.0
    }
    pub fn cycle(self) -> u32 {
        (self.0 >> 32) as u32
    }
    pub fn block(self) -> u32 {
        self.0 as u32
    }
}

impl fmt::Debug for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.cycle(), self.block())
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Position arithmetic for a log of `sectors` sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSpace {
    pub sectors: u32,
}

impl LogSpace {
    pub fn new(log_bytes: u64) -> Self {
        let sectors = log_bytes / LOG_SECTOR;
        assert!(
            sectors >= 16 && sectors <= u64::from(u32::MAX),
            "log of {sectors} sectors"
        );
        Self {
            sectors: sectors as u32,
        }
    }

    pub fn bytes(&self) -> u64 {
        u64::from(self.sectors) * LOG_SECTOR
    }

    /// The position `n` sectors after `lsn`, wrapping into the next cycle.
    pub fn advance(&self, lsn: Lsn, n: u32) -> Lsn {
        debug_assert!(n <= self.sectors);
        let b = u64::from(lsn.block()) + u64::from(n);
        if b >= u64::from(self.sectors) {
            Lsn::new(lsn.cycle() + 1, (b - u64::from(self.sectors)) as u32)
        } else {
            Lsn::new(lsn.cycle(), b as u32)
        }
    }

    /// The position `n` sectors before `lsn` (never before cycle 1, block 0).
    pub fn back(&self, lsn: Lsn, n: u32) -> Lsn {
        debug_assert!(n <= self.sectors);
        if lsn.block() >= n {
            Lsn::new(lsn.cycle(), lsn.block() - n)
        } else if lsn.cycle() > 1 {
            Lsn::new(lsn.cycle() - 1, self.sectors - (n - lsn.block()))
        } else {
            Lsn::new(1, 0)
        }
    }

    /// Sectors from `from` forward to `to` (`to` not before `from`, less than one lap apart).
    pub fn distance(&self, from: Lsn, to: Lsn) -> u64 {
        let lin = |l: Lsn| u64::from(l.cycle()) * u64::from(self.sectors) + u64::from(l.block());
        debug_assert!(lin(to) >= lin(from), "distance back from {from} to {to}");
        lin(to).saturating_sub(lin(from))
    }

    /// Byte offset of a sector within the log region.
    pub fn offset(&self, lsn: Lsn) -> u64 {
        u64::from(lsn.block()) * LOG_SECTOR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_and_wrap() {
        let s = LogSpace { sectors: 100 };
        assert!(Lsn::new(1, 99) < Lsn::new(2, 0));
        assert_eq!(s.advance(Lsn::new(1, 98), 5), Lsn::new(2, 3));
        assert_eq!(s.advance(Lsn::new(1, 98), 2), Lsn::new(2, 0));
        assert_eq!(s.distance(Lsn::new(1, 98), Lsn::new(2, 3)), 5);
        assert_eq!(format!("{}", Lsn::new(3, 7)), "3/7");
    }
}
