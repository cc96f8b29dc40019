use std::ops::{Deref, DerefMut};

/// Alignment of [`AlignedBuf`]: enough for O_DIRECT on any device with sectors up to 4 KiB.
pub const BUF_ALIGN: usize = 4096;

/// A zero-initialised byte buffer whose start is aligned to [`BUF_ALIGN`], as O_DIRECT needs.
/// Built from an over-allocated `Vec` so no unsafe code is needed; the heap block never moves.
#[derive(Clone)]
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Self {
        let storage = vec![0u8; len + BUF_ALIGN];
        let start = storage.as_ptr().align_offset(BUF_ALIGN);
        debug_assert!(start < BUF_ALIGN);
        Self {
            storage,
            start,
            len,
        }
    }

    pub fn from_slice(data: &[u8]) -> Self {
        let mut buf = Self::zeroed(data.len());
        buf.copy_from_slice(data);
        buf
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Whether a slice may be handed to O_DIRECT as it is.
pub(crate) fn is_aligned(buf: &[u8]) -> bool {
    buf.as_ptr().align_offset(BUF_ALIGN) == 0
}
