//! Every descriptor number a run's processes inherit, and the spawner's request and reply:
//! the daemon, the spawner and the supervisor agree on them here and nowhere else.
//!
//! A supervisor the daemon starts directly (`sidejob supervise <private_dir>`) has its
//! stdin, stdout and stderr, [`SUPERVISOR_PUBLIC_FD`] and, when open, [`SUPERVISOR_REPORT_FD`].
//! The spawner (`sidejob spawner`) inherits its socket as [`SPAWNER_SOCKET_FD`]; a request
//! on it carries [`FDS`] descriptors (the supervisor's 0 to 4, in that order), and a
//! supervisor it forks finds its go-ahead pipe at [`GO_FD`], then a shared offline network
//! namespace, if it was given one, at [`SHARED_NETNS_FD`], then the bare mount namespace,
//! when the spawner has one ([`bare_mntns_fd`]).

use std::io;
use std::os::fd::RawFd;
use std::path::{Component, Path, PathBuf};

/// The supervisor's descriptor 3: the run's public directory, opened by the daemon when it
/// made it. The supervisor creates `output.log` and `result.json` through it, so nothing done
/// to the directory's path since can send them elsewhere.
pub(crate) const SUPERVISOR_PUBLIC_FD: RawFd = 3;

/// The supervisor's descriptor 4, when open: the write end of a pipe the daemon that
/// started it reads. The supervisor sends its result there as soon as `output.log` and
/// `result.json` are complete (`RunResult::send`), so the daemon settles the run without
/// waiting for the supervisor's exit. A daemon restarted since has no pipe and reads
/// `result.json` once the supervisor is gone.
pub(crate) const SUPERVISOR_REPORT_FD: RawFd = 4;

/// Descriptors attached to a request: the supervisor's stdin, stdout, stderr, public
/// directory and report pipe, in that order.
pub(crate) const FDS: usize = 5;

/// The spawner's socket, as it is inherited.
pub(crate) const SPAWNER_SOCKET_FD: RawFd = 3;

/// Where a forked supervisor finds the read end of its go-ahead pipe (see
/// `supervisor::spawner`).
pub(crate) const GO_FD: RawFd = FDS as i32;

/// Where a forked supervisor finds the shared network namespace it was given, if any.
pub(crate) const SHARED_NETNS_FD: RawFd = GO_FD + 1;

/// Where a forked supervisor finds the bare mount namespace: the next descriptor after the
/// go-ahead pipe and the shared network namespace, when it was given one.
pub(crate) const fn bare_mntns_fd(shared_netns: bool) -> RawFd {
    SHARED_NETNS_FD + shared_netns as RawFd
}

/// The longest request (a private directory's path and a key).
pub(crate) const MAX_REQUEST: usize = 4096;

/// The longest key of a shared network namespace.
const MAX_KEY: usize = 512;

/// A request, as sent: the private directory's path, then, for a run that may share an
/// offline network namespace, a NUL and that namespace's key.
pub(crate) fn encode_request(private_dir: &Path, netns_key: Option<&str>) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut bytes = private_dir.as_os_str().as_bytes().to_vec();
    if let Some(key) = netns_key.filter(|k| valid_key(k.as_bytes())) {
        bytes.push(0);
        bytes.extend_from_slice(key.as_bytes());
    }
    bytes
}

fn valid_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY && !key.contains(&0)
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// A directory directly beneath the runs directory.
    pub private_dir: PathBuf,
    /// The shared offline network namespace the run may join.
    pub netns_key: Option<Vec<u8>>,
}

/// The request these bytes make: a private directory directly beneath `runs_dir`, nothing
/// else, and a well-formed key if there is one (the spawner takes requests only from the
/// daemon, and checks them anyway).
pub(crate) fn decode_request(runs_dir: &Path, bytes: &[u8]) -> Option<Request> {
    use std::os::unix::ffi::OsStrExt;
    let (path, key) = match bytes.iter().position(|&b| b == 0) {
        Some(i) => (&bytes[..i], Some(&bytes[i + 1..])),
        None => (bytes, None),
    };
    if key.is_some_and(|k| !valid_key(k)) {
        return None;
    }
    let path = Path::new(std::ffi::OsStr::from_bytes(path));
    let name = path.strip_prefix(runs_dir).ok()?;
    let mut parts = name.components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(_)), None) => Some(Request {
            private_dir: path.to_path_buf(),
            netns_key: key.map(<[u8]>::to_vec),
        }),
        _ => None,
    }
}

/// A reply, as sent: the pid, or the negated error number.
pub(crate) fn encode_reply(result: &io::Result<i32>) -> [u8; 4] {
    match result {
        Ok(pid) => pid.to_le_bytes(),
        Err(e) => (-e.raw_os_error().unwrap_or(libc::EIO)).to_le_bytes(),
    }
}

pub(crate) fn decode_reply(bytes: &[u8]) -> io::Result<i32> {
    let n = i32::from_le_bytes(bytes.try_into().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "a malformed reply from the spawner",
        )
    })?);
    if n > 0 {
        Ok(n)
    } else {
        Err(io::Error::from_raw_os_error(-n))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn requests_name_a_directory_directly_beneath_the_runs() {
        let runs = Path::new("/var/lib/sidejob/runs");
        let ok = runs.join("01M8PG3K5F3FN1N1776JYV76XC");
        let plain = decode_request(runs, &encode_request(&ok, None)).unwrap();
        assert_eq!(plain.private_dir, ok);
        assert_eq!(plain.netns_key, None);
        let keyed = decode_request(runs, &encode_request(&ok, Some("1000/s1"))).unwrap();
        assert_eq!(keyed.private_dir, ok);
        assert_eq!(keyed.netns_key.as_deref(), Some(&b"1000/s1"[..]));
        // A key that cannot be sent is left out, not sent cut or empty.
        assert_eq!(
            decode_request(runs, &encode_request(&ok, Some("")))
                .unwrap()
                .netns_key,
            None
        );
        let long = "k".repeat(MAX_KEY + 1);
        assert_eq!(
            decode_request(runs, &encode_request(&ok, Some(&long)))
                .unwrap()
                .netns_key,
            None
        );
        // Received, a malformed key makes the request malformed.
        for bad in [&b"\0"[..], b"\0a\0b"] {
            let mut bytes = encode_request(&ok, None);
            bytes.extend_from_slice(bad);
            assert_eq!(decode_request(runs, &bytes), None, "{bad:?}");
        }
        for bad in [
            "/var/lib/sidejob/runs",
            "/var/lib/sidejob/runs/",
            "/var/lib/sidejob/runs/a/b",
            "/var/lib/sidejob/runs/../sessions",
            "/var/lib/sidejob/runsx/a",
            "/tmp/a",
            "runs/a",
        ] {
            assert!(decode_request(runs, bad.as_bytes()).is_none(), "{bad}");
        }
    }

    #[test]
    fn replies_round_trip() {
        assert_eq!(decode_reply(&encode_reply(&Ok(4242))).unwrap(), 4242);
        let e = decode_reply(&encode_reply(&Err(io::Error::from_raw_os_error(
            libc::EAGAIN,
        ))))
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        // An error without a number is still an error.
        assert!(decode_reply(&encode_reply(&Err(io::Error::other("x")))).is_err());
        assert!(decode_reply(b"12").is_err());
    }
}
