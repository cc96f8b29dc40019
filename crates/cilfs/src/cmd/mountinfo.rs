//! The mount table as /proc/self/mountinfo gives it: the mounts on a directory, and the image
//! of the cilfs mount there. Read by `mount`, `unmount` and `remount`.

use std::path::{Path, PathBuf};

/// One mount from /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub fstype: String,
    pub source: String,
    /// Mounted `ro`.
    pub read_only: bool,
    /// The per-mount options (`ro,nosuid,relatime`) and the superblock's (`rw,user_id=0`).
    pub options: String,
    pub super_options: String,
}

/// The mounts whose mount point is `dir`, from /proc/self/mountinfo, the topmost last.
pub fn mounts_on(dir: &Path) -> Vec<MountEntry> {
    let Some(canon) = canonical(dir) else {
        return Vec::new();
    };
    all_mounts()
        .into_iter()
        .filter(|(at, _)| *at == canon)
        .map(|(_, m)| m)
        .collect()
}

/// Every mount in /proc/self/mountinfo with its mount point, in the table's order.
fn all_mounts() -> Vec<(PathBuf, MountEntry)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut l = left.split(' ').skip(4);
            let mnt = l.next()?;
            let options = l.next()?;
            let read_only = options.split(',').any(|o| o == "ro");
            let mut r = right.split(' ');
            let fstype = r.next()?;
            let source = r.next()?;
            let super_options = r.next().unwrap_or("");
            Some((
                PathBuf::from(unescape(mnt)),
                MountEntry {
                    fstype: fstype.to_string(),
                    source: unescape(source),
                    read_only,
                    options: options.to_string(),
                    super_options: super_options.to_string(),
                },
            ))
        })
        .collect()
}

/// Whether `m` is a cilfs mount.
fn is_cilfs(m: &MountEntry) -> bool {
    // The pure-Rust mount reports the type as "fuse"; the source is the image path.
    // fuseblk.cilfs: the native transport's mount of an image on a block device.
    m.fstype == "fuse.cilfs"
        || m.fstype == "fuseblk.cilfs"
        || (m.fstype == "fuse" && Path::new(&m.source).exists())
}

/// Where the filesystem on `image` (an image file, or a block device) is mounted now, if it
/// is: a cilfs mount whose source is it, or a loop device over it.
pub fn cilfs_mount_of(image: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let id = |p: &Path| {
        let m = std::fs::metadata(p).ok()?;
        Some(if m.file_type().is_block_device() {
            (0, m.rdev())
        } else {
            (m.dev(), m.ino())
        })
    };
    let want = id(image)?;
    all_mounts().into_iter().find_map(|(at, m)| {
        if !is_cilfs(&m) {
            return None;
        }
        let source = PathBuf::from(&m.source);
        let image = cilfs_device::loopdev::backing_file(&source).unwrap_or(source);
        (id(&image) == Some(want)).then_some(at)
    })
}

/// `dir` made absolute without looking at `dir` itself, only its parent, when that fails: a
/// dead FUSE mount answers ENOTCONN to a stat of its mount point.
pub fn canonical(dir: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(dir).ok().or_else(|| {
        let name = dir.file_name()?;
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(parent).ok()?.join(name))
    })
}

/// The image (FUSE source) of the cilfs mount at `dir`, from /proc/self/mountinfo.
pub fn mounted_image(dir: &Path) -> Option<PathBuf> {
    mounts_on(dir)
        .into_iter()
        .rev()
        .find_map(|m| is_cilfs(&m).then(|| PathBuf::from(m.source)))
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}
