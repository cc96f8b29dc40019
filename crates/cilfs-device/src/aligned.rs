use std::ops::{Deref, DerefMut};

/// Alignment of [`AlignedBuf`]: enough for O_DIRECT on any device with sectors up to 4 KiB.
pub const BUF_ALIGN: usize = 4096;

/// One aligned page. `bytemuck` views a slice of them as bytes, so the buffer is aligned by its
/// type (no over-allocation, no unsafe code of ours).
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(4096))]
struct Page([u8; BUF_ALIGN]);

/// A zero-initialised byte buffer whose start is aligned to [`BUF_ALIGN`], as O_DIRECT needs.
/// Its allocation is rounded up to whole pages.
#[derive(Clone)]
pub struct AlignedBuf {
    pages: Vec<Page>,
    len: usize,
}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Self {
        Self {
            pages: vec![Page([0; BUF_ALIGN]); len.div_ceil(BUF_ALIGN)],
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
        &bytemuck::cast_slice::<Page, u8>(&self.pages)[..self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Page, u8>(&mut self.pages)[..self.len]
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
