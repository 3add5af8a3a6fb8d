//! The one function that starts processes: the supervisor of a run.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::run_dir::{self, PrivateDir};
use crate::sys;

/// Starts `sidejob supervise <private_dir>` and returns its pid (the caller reaps it):
///
/// - its own process group, so a terminal's signals to the daemon never reach the run;
/// - no parent-death signal: the supervisor must outlive a daemon that dies;
/// - an empty environment (the plan carries the command's environment);
/// - exactly four descriptors: stdin (the read end of the run's stdin pipe, or /dev/null),
///   stdout (/dev/null), stderr (`supervisor.log` in the private directory) and
///   [`run_dir::SUPERVISOR_PUBLIC_FD`], the run's public directory; nothing else is
///   inherited.
pub fn spawn_supervisor(
    exe: &Path,
    private: &PrivateDir,
    public: BorrowedFd<'_>,
    stdin: Option<OwnedFd>,
) -> std::io::Result<i32> {
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
    let fds = [stdin, null.as_fd(), log.as_fd(), public];
    debug_assert_eq!(fds.len() - 1, run_dir::SUPERVISOR_PUBLIC_FD as usize);
    sys::spawn::spawn(
        exe,
        &[OsStr::new("supervise"), private.path().as_os_str()],
        &fds,
    )
}
