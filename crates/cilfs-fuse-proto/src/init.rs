//! Version and flag negotiation: what a server answers to FUSE_INIT, and what the rest of the
//! session's decoding depends on.

use crate::abi::{InitIn, InitOut, KERNEL_MINOR_VERSION, KERNEL_VERSION, MIN_MINOR_VERSION};
use crate::flags::init;
use crate::ProtoError;

impl InitIn {
    /// The kernel's offered flags as one word: `flags2` counts only when FUSE_INIT_EXT is set.
    pub fn flags(&self) -> u64 {
        let low = u64::from(self.flags);
        if low & init::INIT_EXT != 0 {
            low | u64::from(self.flags2) << 32
        } else {
            low
        }
    }
}

impl InitOut {
    /// The reply's flags as one word (`flags2` counts only with FUSE_INIT_EXT, as the kernel reads it).
    pub fn flags(&self) -> u64 {
        let low = u64::from(self.flags);
        if low & init::INIT_EXT != 0 {
            low | u64::from(self.flags2) << 32
        } else {
            low
        }
    }

    /// Splits `flags` into `flags` and `flags2`, setting FUSE_INIT_EXT when any bit past 31
    /// is set: without it the kernel ignores `flags2`.
    pub fn set_flags(&mut self, flags: u64) {
        let high = (flags >> 32) as u32;
        let mut low = flags as u32;
        if high != 0 {
            low |= init::INIT_EXT as u32;
        }
        self.flags = low;
        self.flags2 = high;
    }
}

/// What the session agreed on; request layouts that changed over versions depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The minor version both sides use: the smaller of the two announced.
    pub minor: u32,
    /// The INIT flags the server answered (only flags the kernel offered).
    pub flags: u64,
}

impl Negotiated {
    /// The newest protocol with FUSE_SETXATTR_EXT: what a cilfs server negotiates with a
    /// current kernel, and what [`crate::Request::parse`] assumes.
    pub const LATEST: Negotiated = Negotiated {
        minor: KERNEL_MINOR_VERSION,
        flags: init::SETXATTR_EXT,
    };

    /// SETXATTR carries the 16-byte `fuse_setxattr_in` (else the 8-byte compat one).
    pub fn setxattr_ext(&self) -> bool {
        self.flags & init::SETXATTR_EXT != 0
    }
}

/// What a server asks of a session; [`negotiate`] keeps what the kernel offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitConfig {
    /// Wanted INIT flags ([`crate::flags::init`]); those the kernel does not offer are dropped.
    pub flags: u64,
    /// Upper bound on readahead; the kernel's own bound applies too.
    pub max_readahead: u32,
    pub max_write: u32,
    /// With FUSE_MAX_PAGES.
    pub max_pages: u16,
    pub max_background: u16,
    pub congestion_threshold: u16,
    /// Timestamp granularity in nanoseconds.
    pub time_gran: u32,
    /// With FUSE_REQUEST_TIMEOUT, in seconds; 0 for none.
    pub request_timeout: u16,
}

/// The answer to a FUSE_INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitReply {
    /// The session runs with `session`; send `out`.
    Accept { out: InitOut, session: Negotiated },
    /// The kernel announced a newer major version: answer with ours only and wait for the
    /// kernel's next INIT, as the header's version negotiation says.
    OfferMajor(InitOut),
}

/// Answers the kernel's INIT: the smaller minor version, the flags wanted and offered, the
/// smaller readahead. A major version below ours, or a minor below [`MIN_MINOR_VERSION`], is
/// refused (the daemon answers EPROTO and the mount fails).
pub fn negotiate(kernel: &InitIn, config: &InitConfig) -> Result<InitReply, ProtoError> {
    if kernel.major > KERNEL_VERSION {
        return Ok(InitReply::OfferMajor(InitOut {
            major: KERNEL_VERSION,
            minor: KERNEL_MINOR_VERSION,
            ..InitOut::default()
        }));
    }
    if kernel.major < KERNEL_VERSION || kernel.minor < MIN_MINOR_VERSION {
        return Err(ProtoError::UnsupportedVersion {
            major: kernel.major,
            minor: kernel.minor,
            min_minor: MIN_MINOR_VERSION,
        });
    }
    let minor = kernel.minor.min(KERNEL_MINOR_VERSION);
    // INIT_EXT is framing, not a feature: keep it only as set_flags decides.
    let flags = config.flags & kernel.flags() & !init::INIT_EXT;
    let mut out = InitOut {
        major: KERNEL_VERSION,
        minor,
        max_readahead: config.max_readahead.min(kernel.max_readahead),
        max_background: config.max_background,
        congestion_threshold: config.congestion_threshold,
        max_write: config.max_write,
        time_gran: config.time_gran,
        max_pages: config.max_pages,
        request_timeout: config.request_timeout,
        ..InitOut::default()
    };
    out.set_flags(flags);
    Ok(InitReply::Accept {
        out,
        session: Negotiated { minor, flags },
    })
}
