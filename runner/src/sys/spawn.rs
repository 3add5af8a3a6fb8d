//! Starting a process from the (multi-threaded) daemon: `posix_spawn`, which never runs our
//! code in the child, with exactly the descriptors we name at exactly the numbers we name.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::{fcntl, FcntlArg};
use nix::spawn::{posix_spawn, PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
use nix::sys::signal::SigSet;
use nix::unistd::Pid;

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "argument holds a NUL byte"))
}

/// A close-on-exec copy of `fd` numbered `min` or above.
///
/// Raw (the ownership only): nix's `fcntl` returns `F_DUPFD_CLOEXEC`'s descriptor as a
/// number.
fn dup_at_least(fd: BorrowedFd<'_>, min: RawFd) -> io::Result<OwnedFd> {
    let new = fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(min))?;
    // SAFETY: fcntl just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Starts `program` with `args` and an empty environment, in a process group of its own,
/// with default signal dispositions and an empty signal mask. `fds[i]` becomes descriptor
/// `i` of the child (0 = stdin, …); nothing else is inherited (everything this process opens
/// is close-on-exec, and the child closes what is above its own descriptors first thing).
/// Returns the child's pid; the caller reaps it.
pub fn spawn(program: &Path, args: &[&OsStr], fds: &[BorrowedFd<'_>]) -> io::Result<i32> {
    let prog = cstring(program.as_os_str())?;
    let mut argv = vec![prog.clone()];
    for a in args {
        argv.push(cstring(a)?);
    }
    let envp: [CString; 0] = [];

    // The sources are first copied above every target number, so one dup2 can never clobber
    // a source another still needs (the daemon's own descriptor 3 may be a source, say).
    let high: Vec<OwnedFd> = fds
        .iter()
        .map(|fd| dup_at_least(*fd, fds.len() as RawFd + 3))
        .collect::<io::Result<_>>()?;

    let mut actions = PosixSpawnFileActions::init()?;
    for (target, src) in high.iter().enumerate() {
        // dup2 in the child clears close-on-exec on the target.
        actions.add_dup2(src.as_raw_fd(), target as RawFd)?;
    }

    let mut attr = PosixSpawnAttr::init()?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETPGROUP
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF,
    )?;
    attr.set_pgroup(Pid::from_raw(0))?;
    attr.set_sigmask(&SigSet::empty())?;
    attr.set_sigdefault(&SigSet::all())?;

    let pid = posix_spawn(prog.as_c_str(), &actions, &attr, &argv, &envp)?;
    drop(high);
    Ok(pid.as_raw())
}
