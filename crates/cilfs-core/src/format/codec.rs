//! Little-endian field cursors. The decoder bounds-checks every read so that no input can panic.

use super::FormatError;

#[derive(Debug)]
pub struct Encoder<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Encoder<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    /// Writes raw bytes. Encoding is driven by our own structures, so overrunning the buffer is a
    /// programming error, not bad input.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        let end = self.pos + b.len();
        assert!(
            end <= self.buf.len(),
            "encoder overrun: {end} > {}",
            self.buf.len()
        );
        self.buf[self.pos..end].copy_from_slice(b);
        self.pos = end;
        self
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes(&[v])
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn skip_to(&mut self, pos: usize) -> &mut Self {
        assert!(
            pos >= self.pos && pos <= self.buf.len(),
            "bad encoder skip to {pos}"
        );
        self.buf[self.pos..pos].fill(0);
        self.pos = pos;
        self
    }
}

#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(FormatError::Truncated {
                what: self.what,
                need: self.pos.saturating_add(n),
                have: self.buf.len(),
            })?;
        let b = &self.buf[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn skip_to(&mut self, pos: usize) -> Result<(), FormatError> {
        if pos < self.pos {
            return Err(self.invalid("layout", format!("skip back to {pos}")));
        }
        self.bytes(pos - self.pos).map(|_| ())
    }

    pub fn invalid(&self, field: &'static str, reason: impl Into<String>) -> FormatError {
        FormatError::Invalid {
            what: self.what,
            field,
            reason: reason.into(),
        }
    }
}

/// Checks the magic, then the CRC32C stored in the last four bytes of a 512-byte header sector.
pub(crate) fn check_header(
    sector: &[u8],
    what: &'static str,
    magic: &[u8; 8],
) -> Result<(), FormatError> {
    use super::{header_crc, HEADER_BYTES, HEADER_CRC_OFFSET};
    if sector.len() < HEADER_BYTES {
        return Err(FormatError::Truncated {
            what,
            need: HEADER_BYTES,
            have: sector.len(),
        });
    }
    if &sector[..8] != magic {
        return Err(FormatError::BadMagic {
            what,
            found: sector[..8].to_vec(),
        });
    }
    let mut d = Decoder::new(&sector[HEADER_CRC_OFFSET..HEADER_BYTES], what);
    let stored = d.u32()?;
    let computed = header_crc(sector);
    if stored != computed {
        return Err(FormatError::BadChecksum {
            what,
            stored,
            computed,
        });
    }
    Ok(())
}

/// Stamps the CRC32C of a 512-byte header sector into its last four bytes.
pub(crate) fn seal_header(sector: &mut [u8]) {
    use super::{header_crc, HEADER_CRC_OFFSET};
    let crc = header_crc(sector);
    sector[HEADER_CRC_OFFSET..HEADER_CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Reads the format version field and refuses versions this build does not know.
pub(crate) fn check_version(d: &mut Decoder<'_>, what: &'static str) -> Result<(), FormatError> {
    let version = d.u32()?;
    if version != super::FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion {
            what,
            found: version,
            supported: super::FORMAT_VERSION,
        });
    }
    Ok(())
}
