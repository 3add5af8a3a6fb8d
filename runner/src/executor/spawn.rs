//! The one place that starts processes: the supervisor of a run.
//!
//! Every supervisor is started with the same rules, whichever way it is started:
//!
//! - it is this daemon's child (the daemon reaps it and watches its pidfd);
//! - its own process group, so a terminal's signals to the daemon never reach the run;
//! - no parent-death signal: the supervisor must outlive a daemon that dies;
//! - an empty environment (the plan carries the command's environment);
//! - exactly five descriptors: stdin (the read end of the run's stdin pipe, or /dev/null),
//!   stdout (/dev/null), stderr (`supervisor.log` in the private directory),
//!   [`crate::run::fds::SUPERVISOR_PUBLIC_FD`] (the run's public directory) and
//!   [`crate::run::fds::SUPERVISOR_REPORT_FD`] (the write end of the daemon's report pipe); nothing
//!   else is inherited (but what the spawner adds: the go-ahead pipe, and the network
//!   namespace a run may share).
//!
//! Normally the spawner forks it (`supervisor/spawner.rs`: a process started once that has
//! paid for loading the binary, whose forks are made the daemon's children). When the
//! spawner cannot be started or fails, `sidejob supervise <private_dir>` is started with
//! `posix_spawn` instead, and the spawner is started again for the next run.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tracing::warn;

use crate::run::dir::PrivateDir;
use crate::sys::{self, fdpass};

/// How long the daemon waits for the spawner's reply before it gives up on it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts supervisors (see the module's documentation).
pub(super) struct Spawner {
    exe: PathBuf,
    runs_dir: PathBuf,
    /// The spawner process, once started; `None` after it failed, until the next run.
    zygote: Mutex<Option<Zygote>>,
}

struct Zygote {
    sock: OwnedFd,
    pid: i32,
}

impl Spawner {
    pub(super) fn new(exe: PathBuf, runs_dir: PathBuf) -> Spawner {
        Spawner {
            exe,
            runs_dir,
            zygote: Mutex::new(None),
        }
    }

    /// Starts the supervisor of the run whose private directory is `private` and returns
    /// its pid (the caller reaps it). A run with a `netns_key` may share that offline
    /// network namespace (only a forked supervisor is given one).
    pub(super) fn spawn_supervisor(
        &self,
        private: &PrivateDir,
        netns_key: Option<&str>,
        public: BorrowedFd<'_>,
        stdin: Option<OwnedFd>,
        report: OwnedFd,
    ) -> io::Result<i32> {
        let log = File::options()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(private.log())?;
        let null = File::options().read(true).write(true).open("/dev/null")?;
        let stdin = match &stdin {
            Some(fd) => fd.as_fd(),
            None => null.as_fd(),
        };
        let fds = [stdin, null.as_fd(), log.as_fd(), public, report.as_fd()];
        debug_assert_eq!(fds.len(), crate::run::fds::FDS);
        debug_assert_eq!(crate::run::fds::SUPERVISOR_PUBLIC_FD, 3);
        debug_assert_eq!(crate::run::fds::SUPERVISOR_REPORT_FD, 4);

        // The spawner forks only for private halves directly beneath its runs directory; one
        // an older daemon made in `<state_dir>/runs` (a run queued before an upgrade) is
        // started directly.
        if private.path().parent() == Some(self.runs_dir.as_path()) {
            let mut zygote = self.zygote.lock().unwrap_or_else(|e| e.into_inner());
            if zygote.is_none() {
                match self.start_zygote() {
                    Ok(z) => *zygote = Some(z),
                    Err(e) => {
                        warn!("cannot start the spawner ({e}); starting the supervisor directly")
                    }
                }
            }
            if let Some(z) = zygote.as_ref() {
                match z.fork(private.path(), netns_key, &fds) {
                    Ok(pid) => return Ok(pid),
                    // It said no before forking: nothing was started.
                    Err(Failed::Refused(e)) => return Err(e),
                    // Nothing was started either: start it directly, and the spawner again
                    // for the next run.
                    Err(Failed::Unsent(e)) => {
                        warn!("the spawner is gone ({e}); starting the supervisor directly");
                        if let Some(z) = zygote.take() {
                            z.stop();
                        }
                    }
                    // A supervisor may have been forked. Once the spawner is gone (it forks
                    // nothing more), its pid file says: a supervisor goes ahead with the run
                    // only once the spawner has written that file (`spawner::fork_supervisor`).
                    // So with the file, that supervisor is the run's; without it, any
                    // supervisor forked runs nothing, and one is started directly.
                    Err(Failed::NoReply(e)) => {
                        if let Some(z) = zygote.take() {
                            z.stop();
                        }
                        if let Some(pid) = forked_before_it_died(private) {
                            warn!("the spawner did not answer ({e}), but forked supervisor {pid}");
                            return Ok(pid);
                        }
                        warn!("the spawner did not answer ({e}); starting the supervisor directly");
                    }
                }
            }
        }
        sys::spawn::spawn(
            &self.exe,
            &[OsStr::new("supervise"), private.path().as_os_str()],
            &fds,
        )
    }

    /// Stops the spawner, if one runs, once no request to it is under way (before the daemon
    /// re-executes: the new image would not know it is its child).
    pub(super) fn stop(&self) {
        let mut zygote = self.zygote.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(z) = zygote.take() {
            z.stop();
        }
    }

    /// `sidejob spawner <runs_dir>`, started with the rules above (its stderr a pipe
    /// whose lines the daemon logs), holding its end of a socket pair at descriptor 3.
    fn start_zygote(&self) -> io::Result<Zygote> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        nix::sys::socket::setsockopt(
            &ours,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0),
        )?;
        let null = File::options().read(true).write(true).open("/dev/null")?;
        let (log_r, log_w) = sys::pipe()?;
        let pid = sys::spawn::spawn(
            &self.exe,
            &[OsStr::new("spawner"), self.runs_dir.as_os_str()],
            &[null.as_fd(), null.as_fd(), log_w.as_fd(), theirs.as_fd()],
        )?;
        drop(log_w);
        // The spawner's lines join the daemon's log (in its format, JSON or text) until the
        // spawner exits.
        std::thread::Builder::new()
            .name("spawner-log".into())
            .spawn(move || {
                for line in std::io::BufReader::new(File::from(log_r)).lines() {
                    match line {
                        Ok(line) => warn!(spawner = pid, "{line}"),
                        Err(_) => break,
                    }
                }
            })?;
        Ok(Zygote { sock: ours, pid })
    }
}

/// The supervisor the spawner's pid file names, if it is this daemon's child and still the
/// process that file recorded.
fn forked_before_it_died(private: &PrivateDir) -> Option<i32> {
    let (pid, start) = super::recover::read_pid_file(private)?;
    let ours = sys::is_child(pid) && sys::process_start_time(pid).ok()? == start;
    ours.then_some(pid)
}

/// Why the spawner did not start a supervisor.
enum Failed {
    /// The request could not be sent (the spawner is gone): nothing was forked.
    Unsent(io::Error),
    /// The spawner answered with an error: nothing was forked.
    Refused(io::Error),
    /// No answer (or a malformed one): a supervisor may or may not have been forked.
    NoReply(io::Error),
}

impl Zygote {
    /// One request, one reply (see `supervisor/spawner.rs`).
    fn fork(
        &self,
        private_dir: &Path,
        netns_key: Option<&str>,
        fds: &[BorrowedFd<'_>],
    ) -> Result<i32, Failed> {
        let request = crate::run::fds::encode_request(private_dir, netns_key);
        fdpass::send_with_fds(self.sock.as_fd(), &request, fds).map_err(Failed::Unsent)?;
        let mut reply = [0u8; 8];
        let n = nix::sys::socket::recv(
            std::os::fd::AsRawFd::as_raw_fd(&self.sock),
            &mut reply,
            nix::sys::socket::MsgFlags::empty(),
        )
        .map_err(|e| match e {
            // The spawner closed its end with the request still queued, unread (unix(7)
            // sockets say so with ECONNRESET; a read request closes to an end of file): it
            // was dying as the request went out, and forked nothing.
            nix::errno::Errno::ECONNRESET => Failed::Unsent(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "it closed its socket without reading the request",
            )),
            e => Failed::NoReply(e.into()),
        })?;
        if n == 0 {
            return Err(Failed::NoReply(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the spawner is gone",
            )));
        }
        match crate::run::fds::decode_reply(&reply[..n]) {
            Ok(pid) => Ok(pid),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(Failed::NoReply(e)),
            Err(e) => Err(Failed::Refused(e)),
        }
    }

    /// Stops and reaps it (it is this daemon's child).
    fn stop(self) {
        let _ = sys::kill(self.pid, libc::SIGKILL);
        drop(self.sock);
        let _ = sys::waitpid(self.pid, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

    /// A zygote whose other end is given to `peer`, which plays a spawner that dies.
    fn fork_against(peer: impl FnOnce(OwnedFd) + Send + 'static) -> Result<i32, Failed> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let peer = std::thread::spawn(move || peer(theirs));
        let null = File::open("/dev/null").unwrap();
        let zygote = Zygote { sock: ours, pid: 0 };
        let got = zygote.fork(Path::new("/runs/x"), None, &[null.as_fd()]);
        peer.join().unwrap();
        got
    }

    #[test]
    fn a_spawner_that_dies_with_the_request_unread_forked_nothing() {
        // Closed after the request was queued (or before it was sent: then sending fails).
        let got = fork_against(|theirs| {
            std::thread::sleep(Duration::from_millis(50));
            drop(theirs);
        });
        assert!(matches!(got, Err(Failed::Unsent(_))), "not Unsent");
    }

    #[test]
    fn a_spawner_that_dies_after_reading_the_request_may_have_forked() {
        let got = fork_against(|theirs| {
            let mut buf = [0u8; 4096];
            sys::poll_readable(&[Some(theirs.as_fd())], -1).unwrap();
            let (n, _fds) = fdpass::recv_with_fds(theirs.as_fd(), &mut buf).unwrap();
            assert!(n > 0);
            drop(theirs);
        });
        assert!(matches!(got, Err(Failed::NoReply(_))), "not NoReply");
    }
}
