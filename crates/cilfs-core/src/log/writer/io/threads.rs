//! The IO thread back end, for devices without a write queue: threads that write iclogs, so
//! several are in flight at once, each merging the adjacent ones queued behind it into one
//! write. The commit thread of the queue back end is one of these pools too.

use super::{merges, Done, Job};
use crate::util::sync::{lock, mpsc, raise_priority, spawn, JoinHandle, Mutex};
use cilfs_device::{Device, DeviceError};
use std::sync::Arc;

/// What an IO thread is told: write this iclog, or stop. (An explicit stop rather than a closed
/// channel, so that loom, which does not model hang-ups, can check the pool.)
pub(crate) enum Msg {
    Write(Job),
    Stop,
}

/// Threads that write iclogs, so several are in flight at once.
pub(crate) struct IoPool {
    pub(crate) jobs: mpsc::Sender<Msg>,
    pub(crate) done: mpsc::Receiver<Done>,
    pub(crate) threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for IoPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoPool({} threads)", self.threads.len())
    }
}

impl IoPool {
    pub(crate) fn new(dev: Arc<dyn Device>, threads: usize) -> Self {
        let (jobs_tx, jobs_rx) = mpsc::channel::<Msg>();
        let (done_tx, done_rx) = mpsc::channel::<Done>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let threads = (0..threads)
            .filter_map(|i| {
                let (rx, tx, dev) = (Arc::clone(&jobs_rx), done_tx.clone(), Arc::clone(&dev));
                spawn(format!("cilfs-iclog-{i}"), move || {
                    raise_priority();
                    loop {
                        let (jobs, stop) = take_jobs(&rx);
                        let mut jobs = jobs.into_iter().peekable();
                        while let Some(first) = jobs.next() {
                            let mut group = vec![first];
                            while let Some(next) = jobs.next_if(|n| merges(&group, n)) {
                                group.push(next);
                            }
                            let result = write_group(&*dev, &group);
                            for job in group {
                                let done = Done {
                                    slot: job.slot,
                                    buf: job.buf,
                                    result: result.as_ref().map(|_| ()).map_err(|e| {
                                        DeviceError::Io {
                                            kind: cilfs_device::IoKind::Write,
                                            offset: job.ios[0].0,
                                            source: std::io::Error::other(e.to_string()),
                                        }
                                    }),
                                };
                                if tx.send(done).is_err() {
                                    return;
                                }
                            }
                        }
                        if stop {
                            return;
                        }
                    }
                })
            })
            .collect();
        Self {
            jobs: jobs_tx,
            done: done_rx,
            threads,
        }
    }
}

/// Waits for the next iclog write, then takes every one already queued behind it (at most a
/// ring's worth), so that adjacent iclogs can go out as one IO. Returns the jobs and whether a
/// stop came after them.
fn take_jobs(rx: &Mutex<mpsc::Receiver<Msg>>) -> (Vec<Job>, bool) {
    let rx = lock(rx);
    let mut jobs = Vec::new();
    match rx.recv() {
        Ok(Msg::Write(j)) => jobs.push(j),
        Ok(Msg::Stop) | Err(_) => return (jobs, true),
    }
    while jobs.len() < MERGE_MAX_ICLOGS {
        match rx.try_recv() {
            Ok(Msg::Write(j)) => jobs.push(j),
            Ok(Msg::Stop) => return (jobs, true),
            Err(_) => break,
        }
    }
    (jobs, false)
}

/// Writes a group of iclogs: one IO when it holds several (see `merges`).
fn write_group(dev: &dyn Device, group: &[Job]) -> Result<(), DeviceError> {
    if let [job] = group {
        for (off, r) in &job.ios {
            dev.write(*off, &job.buf[r.clone()], job.flags)?;
        }
        return Ok(());
    }
    let bufs: Vec<&[u8]> = group.iter().map(|j| &j.buf[j.ios[0].1.clone()]).collect();
    dev.write_vectored(group[0].ios[0].0, &bufs)
}

/// iclog IO threads: enough to keep iclogs in flight while another thread merges the ones
/// queued behind them; more would take each iclog alone as soon as it is queued.
pub(crate) const IO_THREADS: usize = 2;

/// The most iclogs one IO thread takes at once (and so merges into one write).
const MERGE_MAX_ICLOGS: usize = 8;

impl Drop for IoPool {
    fn drop(&mut self) {
        for _ in &self.threads {
            let _ = self.jobs.send(Msg::Stop);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
