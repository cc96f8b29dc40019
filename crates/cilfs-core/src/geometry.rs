//! A filesystem's layout as read back from its devices: superblock plus, for an external log,
//! the log device header, cross-checked against each other and against the device sizes.

use crate::format::superblock::SbLog;
use crate::format::{FormatError, LogDeviceHeader, Superblock, HEADER_BYTES};
use cilfs_device::{Device, DeviceError};
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLocation {
    Internal,
    External { log_uuid: [u8; 16] },
}

/// Where everything is, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub sb: Superblock,
    pub log: LogLocation,
    /// Byte offset of the log on the device that holds it.
    pub log_offset: u64,
    pub log_bytes: u64,
}

#[derive(Debug, Error)]
pub enum GeometryError {
    #[error("reading {what}: {source}")]
    Device {
        what: &'static str,
        source: DeviceError,
    },
    #[error("{0}")]
    Format(#[from] FormatError),
    /// No cilfs superblock where it belongs: another filesystem, or none.
    #[error("not a cilfs filesystem: {0}")]
    NotCilfs(&'static str),
    #[error("the filesystem has an external log: give its device with --logdev")]
    MissingLogDevice,
    #[error("the filesystem has an internal log, but a log device was given")]
    UnexpectedLogDevice,
    #[error(
        "the log device belongs to another filesystem (log uuid {found}, expected {expected})"
    )]
    LogDeviceMismatch { expected: String, found: String },
    #[error(
        "the {what} is {actual} bytes, smaller than the {needed} bytes the superblock describes"
    )]
    DeviceTooSmall {
        what: &'static str,
        needed: u64,
        actual: u64,
    },
}

pub fn uuid_string(u: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*u).hyphenated().to_string()
}

fn read_header(dev: &dyn Device, what: &'static str) -> Result<[u8; HEADER_BYTES], GeometryError> {
    let mut s = [0u8; HEADER_BYTES];
    if dev.len() < HEADER_BYTES as u64 {
        return Err(GeometryError::DeviceTooSmall {
            what,
            needed: HEADER_BYTES as u64,
            actual: dev.len(),
        });
    }
    dev.read(0, &mut s)
        .map_err(|source| GeometryError::Device { what, source })?;
    Ok(s)
}

/// What `dev` holds instead of a cilfs superblock: the kind of filesystem where its magic
/// number says so (as blkid would name it).
fn other_filesystem(dev: &dyn Device) -> &'static str {
    const UNKNOWN: &str = "no cilfs superblock at its start (make one with cilfs mkfs)";
    let len = (128 * 1024).min(dev.len() / 512 * 512) as usize;
    let mut b = cilfs_device::AlignedBuf::zeroed(len);
    if dev.read(0, &mut b).is_err() {
        return UNKNOWN;
    }
    let at = |off: usize, magic: &[u8]| b.get(off..off + magic.len()) == Some(magic);
    if at(1080, &[0x53, 0xef]) {
        "it holds an ext2/ext3/ext4 filesystem"
    } else if at(0, b"XFSB") {
        "it holds an XFS filesystem"
    } else if at(65_600, b"_BHRfS_M") {
        "it holds a btrfs filesystem"
    } else if at(510, &[0x55, 0xaa]) {
        "it holds a FAT filesystem or a partition table"
    } else if b[..len.min(4096)].iter().all(|&x| x == 0) {
        "its start is zeros, no filesystem yet (make one with cilfs mkfs)"
    } else {
        UNKNOWN
    }
}

impl Geometry {
    /// The metadata area, blocks `[first, end)` of the data device: past the internal log, or
    /// past the superblock with an external one. Its first block is the filesystem header.
    pub fn metadata_area(&self) -> (u64, u64) {
        match self.sb.log {
            SbLog::Internal { start } => (start + self.sb.log_blocks, self.sb.data_blocks),
            SbLog::External { .. } => (1, self.sb.data_blocks),
        }
    }

    /// Reads and cross-checks the layout. `logdev` must be given exactly when the log is external.
    pub fn read(data: &dyn Device, logdev: Option<&dyn Device>) -> Result<Self, GeometryError> {
        let sb = match Superblock::decode(&read_header(data, "data device")?) {
            Err(FormatError::BadMagic { .. }) => {
                return Err(GeometryError::NotCilfs(other_filesystem(data)))
            }
            r => r?,
        };
        if sb.data_bytes() > data.len() {
            return Err(GeometryError::DeviceTooSmall {
                what: "data device",
                needed: sb.data_bytes(),
                actual: data.len(),
            });
        }
        let bs = u64::from(sb.block_size);
        let log_bytes = sb.log_bytes();
        match (sb.log, logdev) {
            (SbLog::Internal { .. }, Some(_)) => Err(GeometryError::UnexpectedLogDevice),
            (SbLog::External { .. }, None) => Err(GeometryError::MissingLogDevice),
            (SbLog::Internal { start }, None) => Ok(Self {
                log: LogLocation::Internal,
                log_offset: start * bs,
                log_bytes,
                sb,
            }),
            (SbLog::External { log_uuid }, Some(dev)) => {
                let h = LogDeviceHeader::decode(&read_header(dev, "log device")?)?;
                if h.log_uuid != log_uuid || h.fs_uuid != sb.uuid {
                    return Err(GeometryError::LogDeviceMismatch {
                        expected: uuid_string(&log_uuid),
                        found: uuid_string(&h.log_uuid),
                    });
                }
                if h.block_size != sb.block_size || h.log_blocks != sb.log_blocks {
                    return Err(FormatError::Invalid {
                        what: "log device header",
                        field: "geometry",
                        reason: format!(
                            "{} blocks of {} bytes, superblock says {} of {}",
                            h.log_blocks, h.block_size, sb.log_blocks, sb.block_size
                        ),
                    }
                    .into());
                }
                let needed = bs + log_bytes;
                if dev.len() < needed {
                    return Err(GeometryError::DeviceTooSmall {
                        what: "log device",
                        needed,
                        actual: dev.len(),
                    });
                }
                Ok(Self {
                    log: LogLocation::External { log_uuid },
                    log_offset: bs,
                    log_bytes,
                    sb,
                })
            }
        }
    }
}
