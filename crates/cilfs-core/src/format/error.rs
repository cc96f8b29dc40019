use thiserror::Error;

/// Why bytes read from a device are not a valid structure.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("{what}: bad magic {found:02x?}")]
    BadMagic { what: &'static str, found: Vec<u8> },
    #[error("{what}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum {
        what: &'static str,
        stored: u32,
        computed: u32,
    },
    #[error(
        "{what}: format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        what: &'static str,
        found: u32,
        supported: u32,
    },
    #[error("{what}: truncated: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("{what}: invalid {field}: {reason}")]
    Invalid {
        what: &'static str,
        field: &'static str,
        reason: String,
    },
}
