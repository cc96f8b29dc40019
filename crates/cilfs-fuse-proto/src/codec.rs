//! Little-endian field codecs over byte slices. The reader checks every length against what is
//! left, so that no input, however short or long, can make a decoder index out of bounds.

use crate::ProtoError;

/// A bounds-checked cursor over a received message.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// `what` names the structure in errors.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes, borrowed from the message.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or(ProtoError::Truncated {
                what: self.what,
                need: self.pos.saturating_add(n),
                have: self.buf.len(),
            })?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// A NUL-terminated string: the bytes before the first NUL (the NUL is consumed).
    pub fn cstr(&mut self) -> Result<&'a [u8], ProtoError> {
        let rest = &self.buf[self.pos..];
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(ProtoError::MissingNul { what: self.what })?;
        let s = &rest[..len];
        self.pos += len + 1;
        Ok(s)
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = &self.buf[self.pos..];
        self.pos = self.buf.len();
        rest
    }

    /// Fails if anything is left: a message longer than its arguments is not one the kernel
    /// sends for the negotiated protocol, so it is refused rather than half-read.
    pub fn finish(&self) -> Result<(), ProtoError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(ProtoError::TrailingBytes {
                what: self.what,
                extra,
            }),
        }
    }
}

/// Appends little-endian fields to a growing message. Encoding cannot fail for lack of room.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut Vec<u8>) -> Self {
        Self { buf }
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
}

/// One fixed-size field of a kernel structure.
pub trait Field: Sized {
    const SIZE: usize;
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError>;
    fn put(&self, w: &mut Writer<'_>);
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
            fn put(&self, w: &mut Writer<'_>) {
                w.bytes(&self.to_le_bytes());
            }
        }
    )*};
}
int_field!(u8, u16, u32, u64, i32, i64);

impl<T: Field + Copy + Default, const N: usize> Field for [T; N] {
    const SIZE: usize = T::SIZE * N;
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let mut a = [T::default(); N];
        for slot in &mut a {
            *slot = T::get(r)?;
        }
        Ok(a)
    }
    fn put(&self, w: &mut Writer<'_>) {
        for v in self {
            v.put(w);
        }
    }
}

/// Declares a kernel structure field by field, in the header's order, with its size and codec.
/// Padding fields are kept by name so the layout reads like the header.
macro_rules! wire_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident ($what:literal) {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $name {
            /// Size on the wire, in bytes.
            pub const SIZE: usize = 0 $( + <$ty as $crate::codec::Field>::SIZE )*;

            /// Decodes from the front of `bytes` (extra bytes after it are left alone).
            pub fn decode(bytes: &[u8]) -> Result<Self, $crate::ProtoError> {
                let mut r = $crate::codec::Reader::new(bytes, $what);
                <Self as $crate::codec::Field>::get(&mut r)
            }

            /// Appends the encoded structure.
            pub fn encode(&self, out: &mut Vec<u8>) {
                let mut w = $crate::codec::Writer::new(out);
                $crate::codec::Field::put(self, &mut w);
            }
        }

        impl $crate::codec::Field for $name {
            const SIZE: usize = $name::SIZE;
            fn get(r: &mut $crate::codec::Reader<'_>) -> Result<Self, $crate::ProtoError> {
                Ok(Self { $( $field: <$ty as $crate::codec::Field>::get(r)?, )* })
            }
            fn put(&self, w: &mut $crate::codec::Writer<'_>) {
                $( $crate::codec::Field::put(&self.$field, w); )*
            }
        }
    };
}
pub(crate) use wire_struct;
