//! Re-executing the daemon in place (`server/upgrade/`): the same process, so the same pid,
//! and the supervisors it started stay its children.
//!
//! The calls come from `nix`; the one `unsafe` block sets a signal disposition.

use std::ffi::CString;
use std::io;
use std::os::fd::BorrowedFd;

use nix::fcntl::{fcntl, FcntlArg, FdFlag};

/// Lets `fd` survive the next exec (clears `FD_CLOEXEC` on it alone): the descriptors the
/// daemon hands to its next image.
pub(crate) fn keep_across_exec(fd: BorrowedFd<'_>) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
    Ok(())
}

/// Sets `FD_CLOEXEC` on `fd` again (an exec that failed, or a descriptor just inherited).
pub(crate) fn close_on_exec(fd: BorrowedFd<'_>) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(())
}

/// `fexecve(2)`: runs the file open at `binary` in place of this process, with `argv` and
/// `envp`. What is executed is the file that descriptor was opened on, so nobody can swap it
/// between the checks made on the descriptor and the exec. Returns only on failure.
///
/// The descriptor may be close-on-exec: the kernel holds the file before it closes those
/// (true of an ELF binary; a script would need its descriptor left open, and is not run).
///
/// SIGHUP is ignored across the exec (an ignored signal stays ignored in the new image, until
/// it installs its handler), so a second SIGHUP sent just after the first cannot kill the new
/// image before it handles the signal; the handler is put back if the exec fails.
pub(crate) fn exec_file(binary: BorrowedFd<'_>, argv: &[CString], envp: &[CString]) -> io::Error {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    // SAFETY: ignoring a signal runs no code of ours; the previous action (tokio's handler)
    // is only put back as it was.
    let before = unsafe { sigaction(Signal::SIGHUP, &ignore) };
    let err = match nix::unistd::fexecve(binary, argv, envp) {
        Err(e) => e.into(),
        Ok(never) => match never {},
    };
    if let Ok(before) = before {
        // SAFETY: the action taken out above, restored unchanged.
        let _ = unsafe { sigaction(Signal::SIGHUP, &before) };
    }
    err
}

/// The identity of a descriptor's file (`st_dev`, `st_ino`), to tell that two descriptors
/// name the same file.
pub(crate) fn file_id(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}
