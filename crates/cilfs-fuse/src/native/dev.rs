//! The /dev/fuse file descriptor: one request per read, one reply or notification per write.

use rustix::fd::OwnedFd;
use rustix::io::Errno;
use std::io::IoSlice;
use std::path::Path;

/// An open /dev/fuse connection, shared by the worker threads (each read takes one whole
/// request, each write delivers one whole reply, so threads need no lock between them).
#[derive(Debug)]
pub struct FuseDev {
    fd: OwnedFd,
}

/// What a read from /dev/fuse gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// One request of this many bytes at the start of the buffer.
    Request(usize),
    /// The filesystem was unmounted or the connection aborted: the session is over.
    Ended,
}

impl FuseDev {
    /// Opens /dev/fuse read-write (close-on-exec: the daemon's children get no connection).
    pub fn open(path: &Path) -> std::io::Result<FuseDev> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
        Ok(FuseDev { fd })
    }

    /// A descriptor fusermount3 opened and passed over.
    pub fn from_fd(fd: OwnedFd) -> FuseDev {
        FuseDev { fd }
    }

    /// The descriptor's number, for the mount's `fd=` option.
    pub fn raw(&self) -> i32 {
        use rustix::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Reads the next request into `buf`. A read interrupted by a signal, or whose request
    /// the kernel dropped meanwhile (interrupted before we took it: ENOENT), is retried.
    pub fn receive(&self, buf: &mut [u8]) -> std::io::Result<Received> {
        loop {
            if let Some(r) = read_outcome(rustix::io::read(&self.fd, &mut *buf)) {
                return r;
            }
        }
    }

    /// Writes one reply or notification, given in pieces that make one message. Returns
    /// false if the kernel no longer wanted it: the request was interrupted and dropped
    /// (ENOENT), or a notification named an inode it does not cache (ENOENT), or the
    /// connection is gone (ENODEV; the next read says so).
    pub fn send(&self, pieces: &[&[u8]]) -> std::io::Result<bool> {
        let slices: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        loop {
            match rustix::io::writev(&self.fd, &slices) {
                // The device takes a message whole or not at all.
                Ok(n) if n == total => return Ok(true),
                Ok(n) => {
                    return Err(std::io::Error::other(format!(
                        "/dev/fuse took {n} of a {total}-byte message"
                    )))
                }
                Err(Errno::INTR) => continue,
                Err(Errno::NOENT | Errno::NODEV) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// What one read of /dev/fuse means; `None` to read again. The connection's end comes as
/// ENODEV (unmounted, or aborted through /sys/fs/fuse/connections) or, when the kernel marks
/// the connection aborted, ECONNABORTED: both end the session, whose clean shutdown follows.
/// The second was seen on 6.18 when an unmount (a SIGTERM's) came right after the mount.
fn read_outcome(r: rustix::io::Result<usize>) -> Option<std::io::Result<Received>> {
    match r {
        Ok(0) | Err(Errno::NODEV | Errno::CONNABORTED) => Some(Ok(Received::Ended)),
        Ok(n) => Some(Ok(Received::Request(n))),
        Err(Errno::INTR | Errno::AGAIN | Errno::NOENT) => None,
        Err(e) => Some(Err(e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connections_end_ends_the_session_and_other_errors_do_not() {
        for end in [Ok(0), Err(Errno::NODEV), Err(Errno::CONNABORTED)] {
            assert_eq!(read_outcome(end).unwrap().unwrap(), Received::Ended);
        }
        assert_eq!(
            read_outcome(Ok(80)).unwrap().unwrap(),
            Received::Request(80)
        );
        for again in [Errno::INTR, Errno::AGAIN, Errno::NOENT] {
            assert!(read_outcome(Err(again)).is_none());
        }
        let e = read_outcome(Err(Errno::INVAL)).unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
