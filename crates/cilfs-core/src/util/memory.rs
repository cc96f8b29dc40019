//! The machine's memory, which sizes the default caches.

/// Total memory in bytes from /proc/meminfo, or 0 where it cannot be read. Read once a
/// process: every default `FsOptions` and `JournalConfig` asks, and a process may open many
/// filesystems (a check of an image opens one; the image fuzz target, three an input).
pub fn total_bytes() -> u64 {
    static TOTAL: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOTAL.get_or_init(read_total)
}

fn read_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}
