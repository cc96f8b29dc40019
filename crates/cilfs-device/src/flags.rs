use std::fmt;
use std::ops::BitOr;

/// Flags of a write, with the meaning of the Linux block layer's REQ_PREFLUSH and REQ_FUA.
///
/// PREFLUSH: before this write, make stable every write that had completed when it was issued.
/// FUA: this write is stable when it completes. Neither orders against IO still in flight.
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct WriteFlags(u8);

impl WriteFlags {
    pub const NONE: Self = Self(0);
    pub const PREFLUSH: Self = Self(1);
    pub const FUA: Self = Self(2);

    pub fn preflush(self) -> bool {
        self.0 & Self::PREFLUSH.0 != 0
    }

    pub fn fua(self) -> bool {
        self.0 & Self::FUA.0 != 0
    }

    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn bits(self) -> u8 {
        self.0
    }

    /// Builds flags from bits, ignoring unknown ones.
    pub fn from_bits_truncate(bits: u8) -> Self {
        Self(bits & (Self::PREFLUSH.0 | Self::FUA.0))
    }
}

impl BitOr for WriteFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl fmt::Debug for WriteFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for WriteFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.preflush(), self.fua()) {
            (false, false) => f.write_str("-"),
            (true, false) => f.write_str("PREFLUSH"),
            (false, true) => f.write_str("FUA"),
            (true, true) => f.write_str("PREFLUSH|FUA"),
        }
    }
}
