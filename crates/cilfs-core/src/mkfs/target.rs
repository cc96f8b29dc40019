//! The files or block devices mkfs writes to: inspected read-only and validated in full before
//! anything is created or written, so that a refused mkfs touches nothing.

use super::layout::{human, Layout, LayoutError, DEFAULT_FS_BYTES};
use super::write_filesystem;
use crate::format::superblock::MAX_BLOCK_SIZE;
use crate::fs::items::header::MIN_FS_BLOCK_SIZE;
use crate::journal::{Journal, JournalConfig};
use cilfs_device::{Device, DeviceError, FileDevice, FileDeviceOptions, IoStats};
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// How much of each end of a target is probed for existing data.
const PROBE_BYTES: u64 = 64 * 1024;

#[derive(Debug, Clone, Default)]
pub struct MkfsRequest {
    pub image: PathBuf,
    pub size: Option<u64>,
    pub block_size: u64,
    pub log_size: Option<u64>,
    pub logdev: Option<PathBuf>,
    pub force: bool,
}

#[derive(Debug, Error)]
pub enum MkfsError {
    #[error("{0}")]
    Layout(#[from] LayoutError),
    #[error("{path} contains data (use --force to overwrite it)")]
    NotEmpty { path: PathBuf },
    #[error("{path}: {reason}")]
    Unsuitable { path: PathBuf, reason: String },
    #[error("size {size} is larger than the block device {path} ({len})")]
    LargerThanDevice {
        path: PathBuf,
        size: String,
        len: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Device(#[from] DeviceError),
    /// The filesystem's rule, checked before the journal's looser one (512..65536) is: a
    /// directory entry with a 255-byte name must fit a quarter of a tree leaf.
    #[error("block size {0} is not a power of two in {min}..{max}", min = MIN_FS_BLOCK_SIZE, max = MAX_BLOCK_SIZE)]
    BadBlockSize(u64),
    #[error("creating the filesystem: {0}")]
    Format(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Missing,
    File,
    BlockDevice,
}

#[derive(Debug, Clone)]
struct Target {
    path: PathBuf,
    kind: Kind,
    len: u64,
    has_data: bool,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> MkfsError + '_ {
    move |source| MkfsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Looks at a target without changing it.
fn inspect(path: &Path) -> Result<Target, MkfsError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Target {
                path: path.to_path_buf(),
                kind: Kind::Missing,
                len: 0,
                has_data: false,
            })
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    let kind = if meta.file_type().is_block_device() {
        Kind::BlockDevice
    } else if meta.is_file() {
        Kind::File
    } else {
        return Err(MkfsError::Unsuitable {
            path: path.to_path_buf(),
            reason: "not a regular file or block device".into(),
        });
    };
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let len = f.seek(SeekFrom::End(0)).map_err(io_err(path))?;
    let mut has_data = false;
    for start in [0, len.saturating_sub(PROBE_BYTES)] {
        let n = PROBE_BYTES.min(len);
        let mut buf = vec![0u8; n as usize];
        f.seek(SeekFrom::Start(start)).map_err(io_err(path))?;
        f.read_exact(&mut buf).map_err(io_err(path))?;
        has_data |= buf.iter().any(|&b| b != 0);
    }
    Ok(Target {
        path: path.to_path_buf(),
        kind,
        len,
        has_data,
    })
}

/// A validated mkfs: everything checked, nothing written yet.
#[derive(Debug, Clone)]
pub struct MkfsPlan {
    pub layout: Layout,
    /// The filesystem label (`mkfs -L`), empty for none.
    pub label: Vec<u8>,
    image: Target,
    logdev: Option<Target>,
}

/// Checks the request against the targets as they are now.
pub fn plan(req: &MkfsRequest) -> Result<MkfsPlan, MkfsError> {
    let image = inspect(&req.image)?;
    let logdev = req.logdev.as_deref().map(inspect).transpose()?;
    for t in std::iter::once(&image).chain(logdev.iter()) {
        if t.has_data && !req.force {
            return Err(MkfsError::NotEmpty {
                path: t.path.clone(),
            });
        }
    }
    if let Some(l) = &logdev {
        let same = std::fs::canonicalize(&l.path).ok().is_some_and(|p| {
            std::fs::canonicalize(&image.path).ok().as_deref() == Some(p.as_path())
        });
        if same {
            return Err(MkfsError::Unsuitable {
                path: l.path.clone(),
                reason: "the log device must not be the image itself".into(),
            });
        }
    }
    let size = match (image.kind, req.size) {
        (Kind::BlockDevice, Some(s)) if s > image.len => {
            return Err(MkfsError::LargerThanDevice {
                path: image.path.clone(),
                size: human(s),
                len: human(image.len),
            })
        }
        (_, Some(s)) => s,
        (Kind::BlockDevice, None) => image.len,
        (Kind::File, None) if image.len > 0 => image.len,
        _ => DEFAULT_FS_BYTES,
    };
    // An existing log device keeps its size; a new (or empty) one is made to fit the log.
    let bs = req.block_size;
    if !bs.is_power_of_two()
        || !(u64::from(MIN_FS_BLOCK_SIZE)..=u64::from(MAX_BLOCK_SIZE)).contains(&bs)
    {
        return Err(MkfsError::BadBlockSize(bs));
    }
    let logdev_bytes = logdev.as_ref().map(|l| match (l.kind, l.len) {
        (Kind::BlockDevice, len) | (Kind::File, len @ 1..) => Some(len.saturating_sub(bs)),
        _ => None,
    });
    let layout = match logdev_bytes {
        None => Layout::new(size, bs, req.log_size, None)?,
        Some(Some(avail)) => Layout::new(size, bs, req.log_size, Some(avail))?,
        Some(None) => {
            // Size a new log device file for the requested (or default) log.
            let internal = Layout::new(size, bs, req.log_size, Some(u64::MAX / 2))?;
            let want = req.log_size.unwrap_or_else(|| {
                super::default_log_bytes(internal.fs_bytes(), internal.block_size)
            });
            Layout::new(size, bs, Some(want), Some(want))?
        }
    };
    Ok(MkfsPlan {
        layout,
        label: Vec::new(),
        image,
        logdev,
    })
}

/// What mkfs did, for the report.
#[derive(Debug, Clone)]
pub struct MkfsReport {
    pub data_stats: IoStats,
    pub logdev_stats: Option<IoStats>,
}

impl MkfsPlan {
    pub fn image_path(&self) -> &Path {
        &self.image.path
    }

    /// Creates or sizes the files, then writes the filesystem.
    /// `owner` is the root directory's (uid, gid).
    pub fn execute(
        &self,
        owner: (u32, u32),
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<MkfsReport, MkfsError> {
        let bs = u64::from(self.layout.block_size);
        prepare(&self.image, Some(self.layout.fs_bytes()))?;
        if let Some(l) = &self.logdev {
            // An existing log device file keeps its size (plan sized the log to fit it).
            let len = (l.len == 0).then_some(bs + self.layout.log_bytes());
            prepare(l, len)?;
        }
        let opts = FileDeviceOptions::default();
        let data = FileDevice::open(&self.image.path, opts)?;
        let logdev = self
            .logdev
            .as_ref()
            .map(|l| FileDevice::open(&l.path, opts))
            .transpose()?;
        write_filesystem(
            &data,
            logdev.as_ref().map(|d| d as &dyn Device),
            &self.layout,
            progress,
        )?;
        // The filesystem inside: header, trees, free space and root directory, written through
        // the journal like every later change, then a clean unmount.
        let data: Arc<dyn Device> = Arc::new(data);
        let logdev: Option<Arc<dyn Device>> = logdev.map(|d| Arc::new(d) as Arc<dyn Device>);
        let j = Journal::open(Arc::clone(&data), logdev.clone(), JournalConfig::default())
            .map_err(|e| MkfsError::Format(e.to_string()))?;
        crate::fs::mkfs::format(&j, owner.0, owner.1)
            .map_err(|e| MkfsError::Format(e.to_string()))?;
        if !self.label.is_empty() {
            j.set_label(&self.label)
                .map_err(|e| MkfsError::Format(e.to_string()))?;
        }
        j.unmount().map_err(|e| MkfsError::Format(e.to_string()))?;
        Ok(MkfsReport {
            data_stats: data.stats(),
            logdev_stats: logdev.map(|d| d.stats()),
        })
    }
}

/// Creates a missing file, or empties a regular file and sets its length (sparse, so that no
/// old contents survive). `None` keeps an existing file as it is. Block devices are left as they
/// are: their size was checked by [`plan`].
fn prepare(t: &Target, len: Option<u64>) -> Result<(), MkfsError> {
    let Some(len) = len.filter(|_| t.kind != Kind::BlockDevice) else {
        return Ok(());
    };
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&t.path)
        .map_err(io_err(&t.path))?;
    f.set_len(0).map_err(io_err(&t.path))?;
    f.set_len(len).map_err(io_err(&t.path))
}
