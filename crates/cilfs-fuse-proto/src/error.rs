//! Why bytes are not a valid FUSE message, or why a reply cannot be encoded.

use thiserror::Error;

/// A decoding or encoding failure. Every input the kernel (or anyone writing to the daemon's
/// buffers) could produce ends here rather than in a panic.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtoError {
    #[error("{what}: truncated: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("header says {header_len} bytes but the message has {buffer_len}")]
    LengthMismatch { header_len: u32, buffer_len: usize },
    #[error("{extension_bytes} bytes of extensions do not fit a {body_len}-byte body")]
    ExtensionOverrun {
        extension_bytes: usize,
        body_len: usize,
    },
    #[error("{what}: no terminating NUL")]
    MissingNul { what: &'static str },
    #[error("{what}: {extra} bytes past the end of the arguments")]
    TrailingBytes { what: &'static str, extra: usize },
    #[error("{what}: declared {declared} bytes of data, message carries {actual}")]
    DataLength {
        what: &'static str,
        declared: u64,
        actual: usize,
    },
    #[error("request extension: {reason}")]
    BadExtension { reason: &'static str },
    #[error("protocol {major}.{minor} is not supported (need 7.{min_minor} or later)")]
    UnsupportedVersion {
        major: u32,
        minor: u32,
        min_minor: u32,
    },
    #[error("{what}: name of {len} bytes, the protocol allows {max}")]
    NameTooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{what}: name is empty or holds a NUL or '/'")]
    BadName { what: &'static str },
    #[error("errno {0} cannot be sent: the kernel takes 1..=511")]
    BadErrno(i32),
    #[error("{what}: {len} bytes do not fit the message length field")]
    TooLong { what: &'static str, len: usize },
    /// A FUSE-over-io_uring entry whose in header's `len` is not the header, a first argument
    /// of at most 128 bytes and the payload the entry says it carries.
    #[error("ring entry: in header says {header_len} bytes, payload {payload_sz} of {room} (first argument at most {op_in_max})")]
    RingSplit {
        header_len: u32,
        payload_sz: u32,
        room: usize,
        op_in_max: usize,
    },
    #[error("{what}: {len} bytes do not fit a {room}-byte buffer")]
    DoesNotFit {
        what: &'static str,
        len: usize,
        room: usize,
    },
}
