//! The spawner: a small, single-threaded process the daemon starts once, which forks a
//! supervisor per run (`sidejob spawner <runs_dir>`).
//!
//! Starting `sidejob supervise` afresh for every run costs an `exec` of the whole binary:
//! loading and relocating it, and a private copy of every page the relocations touch. The
//! spawner has paid that once; each supervisor is a fork of it, sharing its pages. The fork
//! is a [`sys::spawn::fork_sibling`]: the supervisor is the *daemon's* child, exactly as if
//! the daemon had started it with `posix_spawn` — the daemon reaps it, watches its pidfd,
//! records its pid and start time, and a supervisor outlives a daemon that dies. The
//! spawner itself holds nothing of any run and exits when the daemon's end of its socket
//! closes.
//!
//! One request, one reply, on a `SOCK_SEQPACKET` socket pair (descriptor 3): the request is
//! the run's private directory, with [`FDS`] descriptors attached (the supervisor's 0 to 4,
//! see `executor::spawn`); the reply is the supervisor's pid, or a negated `errno`.
//! Encoded and decoded here only. A supervisor forked this way keeps the spawner's command
//! line; its name (`comm`) is [`SUPERVISOR_NAME`].

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use crate::sys::{self, fdpass, Fork};

/// Descriptors attached to a request: the supervisor's stdin, stdout, stderr, public
/// directory and report pipe, in that order.
pub(crate) const FDS: usize = 5;

/// The name (`comm`) of a supervisor the spawner forked.
pub(crate) const SUPERVISOR_NAME: &std::ffi::CStr = c"sidejob-run";

/// The spawner's socket, as it is inherited.
const SOCKET_FD: i32 = 3;

/// The longest request (a private directory's path).
const MAX_REQUEST: usize = 4096;

/// A request, as sent: the private directory's path.
pub(crate) fn encode_request(private_dir: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    private_dir.as_os_str().as_bytes().to_vec()
}

/// The private directory a request names: a directory directly beneath `runs_dir`, nothing
/// else (the spawner takes requests only from the daemon, and checks them anyway).
pub(crate) fn decode_request(runs_dir: &Path, bytes: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let path = Path::new(std::ffi::OsStr::from_bytes(bytes));
    let name = path.strip_prefix(runs_dir).ok()?;
    let mut parts = name.components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(_)), None) => Some(path.to_path_buf()),
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

/// Entry point of `sidejob spawner <runs_dir>`; returns the process exit code.
pub fn main(runs_dir: &Path) -> i32 {
    // Every supervisor is born with the stop signals blocked (it reads them from a signalfd):
    // one the daemon sends as soon as it knows the pid — which this process writes down
    // before the child has run a single instruction — stays pending instead of killing the
    // supervisor before it could settle the run. (This process itself stops when the daemon
    // closes its socket.)
    if let Err(e) = super::stop_signals().block() {
        eprintln!("sidejob spawner: cannot block the stop signals: {e}");
        return 2;
    }
    let _ = sys::close_from(SOCKET_FD as u32 + 1);
    // Moved out of the way: a supervisor's descriptors 0 to 4 are placed where it was.
    let sock = match sys::take_inherited_fd(SOCKET_FD)
        .and_then(|fd| sys::spawn::dup_at_least(fd.as_fd(), 16))
    {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("sidejob spawner: the daemon's socket (descriptor 3): {e}");
            return 2;
        }
    };
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        match sys::poll_readable(&[Some(sock.as_fd())], -1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return 1,
        }
        let (n, fds) = match fdpass::recv_with_fds(sock.as_fd(), &mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return 1,
        };
        if n == 0 && fds.is_empty() {
            return 0; // the daemon is gone
        }
        let result = fork_supervisor(runs_dir, &buf[..n], fds);
        if fdpass::send(sock.as_fd(), &encode_reply(&result)).is_err() {
            return 1;
        }
    }
}

/// Forks a supervisor for the run a request names, with the descriptors it came with.
fn fork_supervisor(runs_dir: &Path, request: &[u8], fds: Vec<OwnedFd>) -> io::Result<i32> {
    let private_dir = decode_request(runs_dir, request)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    if fds.len() != FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    match sys::spawn::fork_sibling()? {
        Fork::Parent(pid) => {
            // Before the daemon hears of it: a daemon that dies before it records the pid
            // finds it here after its restart. Written by the spawner, not the supervisor,
            // so the run does not wait for it. (The descriptors are closed as they drop.)
            super::write_pid_file(&crate::run_dir::PrivateDir::at(private_dir), pid);
            Ok(pid)
        }
        Fork::Child => {
            // What `executor::spawn` asks of posix_spawn, done here: the descriptors at
            // their numbers, a process group of its own. The signal mask and dispositions
            // are the spawner's, which posix_spawn reset. The spawner's socket is closed by
            // the supervisor's first step (it keeps descriptors 0 to 4 only).
            let code =
                match sys::spawn::place_fds(fds).and_then(|()| sys::spawn::own_process_group()) {
                    Ok(()) => {
                        // Its command line stays the spawner's; its name says what it is.
                        let _ = sys::spawn::set_name(SUPERVISOR_NAME);
                        super::forked_main(&private_dir)
                    }
                    Err(e) => {
                        eprintln!("sidejob spawner: cannot set up a supervisor: {e}");
                        2
                    }
                };
            std::process::exit(code)
        }
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
        assert_eq!(decode_request(runs, &encode_request(&ok)), Some(ok));
        for bad in [
            "/var/lib/sidejob/runs",
            "/var/lib/sidejob/runs/",
            "/var/lib/sidejob/runs/a/b",
            "/var/lib/sidejob/runs/../sessions",
            "/var/lib/sidejob/runsx/a",
            "/tmp/a",
            "runs/a",
        ] {
            assert_eq!(decode_request(runs, bad.as_bytes()), None, "{bad}");
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
