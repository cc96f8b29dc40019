//! A filesystem's layout as read back from its devices: superblock (the primary, or a backup
//! copy when the primary is damaged) plus, for an external log, the log device header,
//! cross-checked against each other and against the device sizes.

use crate::format::superblock::{
    front_backup_block, SbLog, FRONT_BACKUP_BYTES, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE,
};
use crate::format::{FormatError, LogDeviceHeader, Superblock, HEADER_BYTES};
use cilfs_device::{AlignedBuf, Device, DeviceError, WriteFlags};
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
    /// The primary superblock did not decode: `sb` is the backup copy at this block.
    pub from_backup: Option<u64>,
    /// Why the primary was passed over (with `from_backup`).
    pub primary_damage: Option<String>,
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
    #[error("writing the superblock: {0}")]
    WriteSuperblock(DeviceError),
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
/// number says so (as blkid would name it), and whether that is a whole other filesystem
/// (made over this one: no backup copy of ours may be taken over it).
fn other_filesystem(dev: &dyn Device) -> (&'static str, bool) {
    const UNKNOWN: &str = "no cilfs superblock at its start (make one with cilfs mkfs)";
    let len = (128 * 1024).min(dev.len() / 512 * 512) as usize;
    let mut b = cilfs_device::AlignedBuf::zeroed(len);
    if dev.read(0, &mut b).is_err() {
        return (UNKNOWN, false);
    }
    let at = |off: usize, magic: &[u8]| b.get(off..off + magic.len()) == Some(magic);
    let other = if at(1080, &[0x53, 0xef]) {
        "it holds an ext2/ext3/ext4 filesystem"
    } else if at(0, b"XFSB") {
        "it holds an XFS filesystem"
    } else if at(65_600, b"_BHRfS_M") {
        "it holds a btrfs filesystem"
    } else {
        ""
    };
    if !other.is_empty() {
        return (other, true);
    }
    // A partition table or boot sector written over sector 0 is the damage backups are for.
    let what = if at(510, &[0x55, 0xaa]) {
        "it holds a FAT filesystem or a partition table"
    } else if b[..len.min(4096)].iter().all(|&x| x == 0) {
        "its start is zeros, no filesystem yet (make one with cilfs mkfs)"
    } else {
        UNKNOWN
    };
    (what, false)
}

/// The copy of the superblock at byte `off`, if one decodes there and says it belongs there.
fn backup_at(dev: &dyn Device, off: u64) -> Option<(Superblock, u64)> {
    if off == 0 || off.checked_add(HEADER_BYTES as u64)? > dev.len() {
        return None;
    }
    let mut s = AlignedBuf::zeroed(HEADER_BYTES);
    dev.read(off, &mut s).ok()?;
    let (sb, at) = Superblock::decode_copy(&s).ok()?;
    (at != 0 && at.checked_mul(u64::from(sb.block_size)) == Some(off)).then_some((sb, at))
}

/// Every backup copy found without the primary: first at byte 1 MiB (the same byte for every
/// block size), then in the last block of the device for the first block size whose copy is
/// there, where the end copy lies when the filesystem fills its device (as mkfs makes it by
/// default).
fn all_backups(dev: &dyn Device) -> Vec<(Superblock, u64)> {
    let mut out: Vec<_> = backup_at(dev, FRONT_BACKUP_BYTES).into_iter().collect();
    let mut bs = u64::from(MIN_BLOCK_SIZE);
    while bs <= u64::from(MAX_BLOCK_SIZE) {
        if let Some(c) = (dev.len() / bs)
            .checked_sub(1)
            .and_then(|last| backup_at(dev, last * bs))
            .filter(|(sb, _)| u64::from(sb.block_size) == bs)
        {
            out.push(c);
            break;
        }
        bs *= 2;
    }
    out
}

/// A primary that decodes (its CRC valid) can still be wrong: a bad write of memory before the
/// CRC was taken. The backups outvote it where both agree with each other and not with it, or
/// where it describes more than the device holds and a backup does not. The backup to use and
/// why, or None to keep the primary.
fn outvoted(data: &dyn Device, primary: &Superblock) -> Option<(Superblock, u64, String)> {
    let copies: Vec<_> = all_backups(data)
        .into_iter()
        .filter(|(b, _)| b.uuid == primary.uuid)
        .collect();
    if copies.iter().any(|(b, _)| same_filesystem(b, primary)) {
        return None;
    }
    match copies.as_slice() {
        [(a, at), (b, _)] if same_filesystem(a, b) => Some((
            a.clone(),
            *at,
            "its geometry disagrees with both backups".into(),
        )),
        _ if primary.needed_bytes() > data.len() => copies
            .into_iter()
            .find(|(b, _)| b.needed_bytes() <= data.len())
            .map(|(b, at)| {
                (
                    b,
                    at,
                    format!(
                        "it describes {} bytes, the device holds {}",
                        primary.needed_bytes(),
                        data.len()
                    ),
                )
            }),
        _ => None,
    }
}

/// Writes every copy of `sb`: the backups first, each with `flags`, then the primary. A
/// backup is so never older than the primary, and the primary, the copy every mount reads,
/// changes last. A backup past the device's end (an image file cut short) is skipped:
/// `cilfs check` reports it missing and `cilfs repair` writes it back.
pub fn write_superblock(
    dev: &dyn Device,
    sb: &Superblock,
    flags: WriteFlags,
) -> Result<(), DeviceError> {
    let bs = u64::from(sb.block_size);
    let mut buf = AlignedBuf::zeroed(sb.block_size as usize);
    for at in sb.backup_blocks() {
        if (at + 1) * bs > dev.len() {
            continue;
        }
        buf[..HEADER_BYTES].copy_from_slice(&sb.encode_copy(at));
        dev.write(at * bs, &buf, flags)?;
    }
    buf[..HEADER_BYTES].copy_from_slice(&sb.encode());
    dev.write(0, &buf, flags)
}

/// Rewrites the superblock's copies that `Geometry::copy_problems` finds wrong, from the copy
/// `Geometry::read` chose (the primary, or the backup it fell back to); with `dry_run` only
/// says what it would do. One line per copy rewritten, or that cannot be (a backup past the
/// end of the device). Every copy is written in one `write_superblock`, as a mount would.
pub fn repair_copies(
    data: &dyn Device,
    logdev: Option<&dyn Device>,
    dry_run: bool,
) -> Result<Vec<String>, GeometryError> {
    let g = Geometry::read(data, logdev)?;
    if g.copy_problems(data).is_empty() {
        return Ok(Vec::new());
    }
    let verb = if dry_run { "would rewrite" } else { "rewrote" };
    let bs = u64::from(g.sb.block_size);
    let mut out = Vec::new();
    if let Some(b) = g.from_backup {
        out.push(format!(
            "superblock: {verb} the primary from the backup at block {b}"
        ));
    }
    for b in g.sb.backup_blocks() {
        if Some(b) == g.from_backup {
            continue;
        }
        if (b + 1) * bs > data.len() {
            out.push(format!(
                "superblock: the backup at block {b} lies past the device's end ({} bytes): \
                 the device must be {} bytes",
                data.len(),
                g.sb.data_bytes()
            ));
        } else {
            out.push(format!("superblock: {verb} the backup at block {b}"));
        }
    }
    if !dry_run {
        write_superblock(data, &g.sb, WriteFlags::FUA).map_err(GeometryError::WriteSuperblock)?;
    }
    Ok(out)
}

/// Whether two copies describe the same filesystem in the same place (the fields a mount
/// changes, such as the clean flag or the generation, may differ by the one write a crash
/// interrupted).
fn same_filesystem(a: &Superblock, b: &Superblock) -> bool {
    (
        a.uuid,
        a.block_size,
        a.data_blocks,
        a.log,
        a.log_blocks,
        a.backups,
    ) == (
        b.uuid,
        b.block_size,
        b.data_blocks,
        b.log,
        b.log_blocks,
        b.backups,
    )
}

impl Geometry {
    /// The metadata area, blocks `[first, end)` of the data device: past the internal log, or
    /// past the superblock (and the front backup) with an external one, and before the end
    /// backup. Its first block is the filesystem header.
    pub fn metadata_area(&self) -> (u64, u64) {
        let sb = &self.sb;
        let end = sb.data_blocks - u64::from(sb.backups);
        match sb.log {
            SbLog::Internal { start } => (start + sb.log_blocks, end),
            SbLog::External { .. } if sb.backups => (front_backup_block(sb.block_size) + 1, end),
            SbLog::External { .. } => (1, end),
        }
    }

    /// What is wrong with the superblock's copies, one line each, for `cilfs check`: a
    /// damaged primary (read from a backup), and each backup that is missing, damaged or
    /// describes another filesystem. Empty when every copy is sound (or the image has none).
    pub fn copy_problems(&self, data: &dyn Device) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(b) = self.from_backup {
            out.push(format!(
                "superblock: primary damaged ({}), using the backup at block {b} (cilfs repair \
                 rewrites it)",
                self.primary_damage.as_deref().unwrap_or("unreadable")
            ));
        }
        let bs = u64::from(self.sb.block_size);
        for b in self.sb.backup_blocks() {
            if Some(b) == self.from_backup {
                continue;
            }
            let off = b * bs;
            if off + HEADER_BYTES as u64 > data.len() {
                out.push(format!(
                    "superblock: the backup at block {b} is missing: the device ends at byte {} \
                     (cut short?)",
                    data.len()
                ));
                continue;
            }
            let mut s = AlignedBuf::zeroed(HEADER_BYTES);
            let problem = match data.read(off, &mut s) {
                Err(e) => Some(format!("cannot be read: {e}")),
                Ok(()) => match Superblock::decode_copy(&s) {
                    Err(e) => Some(format!("is damaged: {e}")),
                    Ok((_, at)) if at != b => Some(format!("is damaged: it says it is block {at}")),
                    Ok((c, _)) if !same_filesystem(&c, &self.sb) => Some(format!(
                        "describes another filesystem (uuid {}, {} blocks of {} bytes)",
                        uuid_string(&c.uuid),
                        c.data_blocks,
                        c.block_size
                    )),
                    Ok(_) => None,
                },
            };
            if let Some(p) = problem {
                out.push(format!("superblock: the backup at block {b} {p}"));
            }
        }
        out
    }

    /// Reads and cross-checks the layout. `logdev` must be given exactly when the log is
    /// external. A primary that does not decode is passed over for a backup copy
    /// (`from_backup` says which), unless another filesystem was made over this one.
    pub fn read(data: &dyn Device, logdev: Option<&dyn Device>) -> Result<Self, GeometryError> {
        let (sb, from_backup, primary_damage) =
            match Superblock::decode(&read_header(data, "data device")?) {
                Ok(sb) => match outvoted(data, &sb) {
                    Some((b, at, why)) => (b, Some(at), Some(why)),
                    None => (sb, None, None),
                },
                // A newer format: its backups are no older, and no more readable.
                Err(e @ FormatError::UnsupportedVersion { .. }) => return Err(e.into()),
                Err(e) => {
                    let other =
                        matches!(e, FormatError::BadMagic { .. }).then(|| other_filesystem(data));
                    if let Some((kind, true)) = other {
                        return Err(GeometryError::NotCilfs(kind));
                    }
                    match all_backups(data).into_iter().next() {
                        Some((sb, at)) => (sb, Some(at), Some(e.to_string())),
                        None => {
                            return Err(match other {
                                Some((kind, _)) => GeometryError::NotCilfs(kind),
                                None => e.into(),
                            })
                        }
                    }
                }
            };
        if sb.needed_bytes() > data.len() {
            return Err(GeometryError::DeviceTooSmall {
                what: "data device",
                needed: sb.needed_bytes(),
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
                from_backup,
                primary_damage,
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
                    from_backup,
                    primary_damage,
                })
            }
        }
    }
}
