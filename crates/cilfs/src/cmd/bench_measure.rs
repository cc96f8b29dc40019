//! What the benchmarks measure besides time, shared by `bench`, `bench dir` and `bench fs`:
//! CPU time by thread and by thread role (`/proc/self/task/*/schedstat`), the peak resident
//! size, and the run-time argument they all take.

/// CPU time each of this process's threads has run, by thread id: its name and nanoseconds
/// (`/proc/self/task/*/schedstat`, which counts in nanoseconds where `stat` counts in ticks).
pub fn thread_cpu_ns() -> std::collections::HashMap<u64, (String, u64)> {
    let mut out = std::collections::HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        let p = t.path();
        let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if let Some(ns) = schedstat_ns(&p.join("schedstat")) {
            out.insert(tid, (name.trim().to_string(), ns));
        }
    }
    out
}

/// CPU time the calling thread has run, in nanoseconds (0 where /proc does not tell).
pub fn own_cpu_ns() -> u64 {
    schedstat_ns(std::path::Path::new("/proc/thread-self/schedstat")).unwrap_or(0)
}

/// The time on CPU a task's `schedstat` file gives (its first field, in nanoseconds).
fn schedstat_ns(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
}

/// CPU seconds run between two `thread_cpu_ns` snapshots, by thread role: a name without its
/// trailing number (`cilfs-iclog-3` counts as `cilfs-iclog`). Threads started between the
/// snapshots count from zero; threads gone by the second are not seen.
pub fn cpu_s_by_role(
    before: &std::collections::HashMap<u64, (String, u64)>,
    after: &std::collections::HashMap<u64, (String, u64)>,
) -> std::collections::BTreeMap<String, f64> {
    let mut roles = std::collections::BTreeMap::new();
    for (tid, (name, ns)) in after {
        let was = before.get(tid).map_or(0, |b| b.1);
        let role = name
            .trim_end_matches(|c: char| c.is_ascii_digit() || c == '.')
            .trim_end_matches('-')
            .to_string();
        *roles.entry(role).or_insert(0.0) += ns.saturating_sub(was) as f64 / 1e9;
    }
    roles
}

pub fn rss_max_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map_or(0, |kib| kib * 1024)
}

/// A run time: a finite number of seconds above zero (what `Duration` can hold); anything else
/// made the benchmarks panic.
pub(crate) fn positive_seconds(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if s > 0.0 && std::time::Duration::try_from_secs_f64(s).is_ok() => Ok(s),
        _ => Err(format!("{v:?} is not a number of seconds above zero")),
    }
}
