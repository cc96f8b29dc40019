use std::fmt;
use std::path::PathBuf;

/// Which kind of IO an error happened on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Flush,
    Discard,
}

impl fmt::Display for IoKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Flush => "flush",
            IoKind::Discard => "discard",
        })
    }
}

/// Errors of the device layer.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("unaligned {kind} at offset {offset}, length {len}: device IO must be aligned to {align} bytes")]
    Unaligned {
        kind: IoKind,
        offset: u64,
        len: usize,
        align: u32,
    },
    #[error("{kind} at offset {offset}, length {len} is past the end of the device ({device_len} bytes)")]
    OutOfRange {
        kind: IoKind,
        offset: u64,
        len: usize,
        device_len: u64,
    },
    #[error("{kind} at offset {offset} failed: {source}")]
    Io {
        kind: IoKind,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("injected IO error on {kind} (operation {op_index})")]
    Injected { kind: IoKind, op_index: u64 },
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    Unsuitable { path: PathBuf, reason: String },
    #[error("this device cannot {0}")]
    Unsupported(IoKind),
}

pub type Result<T> = std::result::Result<T, DeviceError>;
