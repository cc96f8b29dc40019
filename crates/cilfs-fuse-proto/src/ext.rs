//! Request extensions (7.38+): the bytes `total_extlen` counts at the end of a creating
//! request, each starting with a `fuse_ext_header` whose size covers it whole.

use crate::abi::{ExtHeader, EXT_GROUPS, MAX_NR_SECCTX};
use crate::codec::Reader;
use crate::ProtoError;

/// A request's extensions, checked at parse so that iterating cannot fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Extensions<'a> {
    bytes: &'a [u8],
}

/// One extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extension<'a> {
    /// FUSE_SECURITY_CTX: `count` contexts (`fuse_secctx`, name, value, each), left encoded.
    SecurityContexts { count: u32, bytes: &'a [u8] },
    /// FUSE_CREATE_SUPP_GROUP: the caller's supplementary groups the kernel chose to send.
    SuppGroups(Groups<'a>),
    /// A type this crate does not know; a server may ignore it.
    Unknown { typ: u32, bytes: &'a [u8] },
}

/// The group IDs of a `fuse_supp_groups`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups<'a> {
    bytes: &'a [u8],
}

impl<'a> Groups<'a> {
    pub fn len(&self) -> usize {
        self.bytes.len() / 4
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }
}

impl<'a> Extensions<'a> {
    /// Walks the extensions once, checking each size against what is left.
    pub fn parse(bytes: &'a [u8]) -> Result<Extensions<'a>, ProtoError> {
        let ext = Extensions { bytes };
        let mut rest = bytes;
        while !rest.is_empty() {
            let (one, tail) = split_one(rest)?;
            decode_one(one)?;
            rest = tail;
        }
        Ok(ext)
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The raw bytes (a multiple of 8 long).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn iter(&self) -> impl Iterator<Item = Extension<'a>> + 'a {
        let mut rest = self.bytes;
        // Checked by parse: neither step can fail, and each consumes at least a header.
        std::iter::from_fn(move || {
            let (one, tail) = split_one(rest).ok()?;
            rest = tail;
            decode_one(one).ok()
        })
    }

    /// The supplementary groups, if the kernel sent them.
    pub fn supp_groups(&self) -> Option<Groups<'a>> {
        self.iter().find_map(|e| match e {
            Extension::SuppGroups(g) => Some(g),
            _ => None,
        })
    }
}

/// Splits the first extension (header included) off `bytes`.
fn split_one(bytes: &[u8]) -> Result<(&[u8], &[u8]), ProtoError> {
    let header = ExtHeader::decode(bytes)?;
    let size = header.size as usize;
    if size < ExtHeader::SIZE {
        return Err(ProtoError::BadExtension {
            reason: "size smaller than its header",
        });
    }
    if size > bytes.len() {
        return Err(ProtoError::BadExtension {
            reason: "size past the end of the message",
        });
    }
    Ok(bytes.split_at(size))
}

fn decode_one(one: &[u8]) -> Result<Extension<'_>, ProtoError> {
    let header = ExtHeader::decode(one)?;
    let body = &one[ExtHeader::SIZE..];
    if header.typ <= MAX_NR_SECCTX {
        return Ok(Extension::SecurityContexts {
            count: header.typ,
            bytes: body,
        });
    }
    if header.typ != EXT_GROUPS {
        return Ok(Extension::Unknown {
            typ: header.typ,
            bytes: body,
        });
    }
    let mut r = Reader::new(body, "fuse_supp_groups");
    let count = u32::from_le_bytes(r.array()?);
    let too_many = ProtoError::BadExtension {
        reason: "more supplementary groups than bytes",
    };
    let len = (count as usize).checked_mul(4).ok_or(too_many.clone())?;
    let groups = r.take(len).map_err(|_| too_many)?;
    // What follows the groups is alignment padding to 8 bytes.
    Ok(Extension::SuppGroups(Groups { bytes: groups }))
}
