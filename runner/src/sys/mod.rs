//! The only module with `unsafe`: thin, documented wrappers over the Linux calls that the
//! supervisor and the executor need and that `std` does not offer.
//!
//! The calls come from `nix` (landlock rulesets from the `landlock` crate, in
//! `sandbox/linux/landlock.rs`). A raw `libc` call is left only where neither crate has the
//! call, or where its wrapper would lose something we need; each such wrapper says which in a
//! `Raw:` line of its documentation.
//!
//! Every wrapper returns `io::Result` with the OS error; callers add the step and the path.
#![allow(unsafe_code)]

pub(crate) mod activation;
pub(crate) mod cpu;
pub(crate) mod dirfd;
pub(crate) mod fdpass;
pub(crate) mod fs;
pub(crate) mod reexec;
pub(crate) mod sandbox;
pub(crate) mod spawn;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sched::CloneFlags;
use nix::sys::signal::{self as nsig, SaFlags, SigAction, SigHandler};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::{self, ForkResult, Gid, Pid, Uid};

pub(crate) use nix::sys::signal::Signal;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A signal number as nix's [`Signal`]. A number it cannot name (a real-time signal) is
/// `EINVAL`; none of ours is one.
fn signal(sig: i32) -> io::Result<Signal> {
    Ok(Signal::try_from(sig)?)
}

fn cvt_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Opens a pidfd for `pid`. The caller must make sure `pid` still names the process it means
/// (its own unreaped child, or a process whose start time it checks after opening).
///
/// Raw: nix 0.32 has no pidfd calls.
pub(crate) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1; no memory is
    // passed. O_NONBLOCK is not requested because the executor only polls it for readability.
    let fd = cvt_long(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `sig` to the process behind a pidfd; immune to pid reuse.
///
/// Raw: nix 0.32 has no pidfd calls.
pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, sig: i32) -> io::Result<()> {
    // SAFETY: the descriptor is valid for the call (borrowed), info is NULL as permitted, and
    // flags are zero.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

/// The start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`), which
/// tells a process apart from a later one that reuses its pid.
pub(crate) fn process_start_time(pid: i32) -> io::Result<u64> {
    stat_field(&format!("/proc/{pid}/stat"), 22)
}

pub(crate) fn getuid() -> u32 {
    unistd::getuid().as_raw()
}

pub(crate) fn getgid() -> u32 {
    unistd::getgid().as_raw()
}

pub(crate) fn getpid() -> i32 {
    unistd::getpid().as_raw()
}

/// Fills `buf` from the kernel's random source.
///
/// Raw: nix has no `getrandom`, and std's is not public.
pub(crate) fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`, which we own
        // mutably for the duration of the call.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        filled += n as usize;
    }
    Ok(())
}

/// Signals a process by pid (`-1`: every process we may signal); `sig` 0 only checks that
/// the process exists.
pub(crate) fn kill(pid: i32, sig: i32) -> io::Result<()> {
    let sig = if sig == 0 { None } else { Some(signal(sig)?) };
    nsig::kill(Pid::from_raw(pid), sig)?;
    Ok(())
}

/// `unshare(2)` with the given `CLONE_*` flags.
pub(crate) fn unshare(flags: libc::c_int) -> io::Result<()> {
    nix::sched::unshare(CloneFlags::from_bits_retain(flags))?;
    Ok(())
}

pub(crate) enum Fork {
    Parent(i32),
    Child,
}

/// How many threads this process has (field 20 of `/proc/self/stat`).
fn thread_count() -> io::Result<u64> {
    stat_field("/proc/self/stat", 20)
}

/// Field `n` (1-based, as in proc(5); 3 or more) of a `/proc/<pid>/stat` file. Read into a
/// buffer that holds it whole, as it is read on every fork: `read_to_string` would first ask
/// its size (0 for `/proc` files) and then grow its buffer read by read, nine calls in all.
fn stat_field(path: &str, n: usize) -> io::Result<u64> {
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, format!("malformed {path}"));
    let file = std::fs::File::open(path)?;
    // proc(5): 52 numeric fields and a name of at most 64 bytes.
    let mut buf = [0u8; 1536];
    let mut len = 0;
    loop {
        match read_fd(&file, &mut buf[len..])? {
            0 => break,
            got => len += got,
        }
        if len == buf.len() {
            return Err(malformed());
        }
    }
    // The command name (field 2) is in parentheses and may hold spaces or ')'.
    let stat = &buf[..len];
    let after = stat
        .iter()
        .rposition(|&b| b == b')')
        .ok_or_else(malformed)?;
    stat[after + 1..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
        .nth(n - 3)
        .and_then(|f| std::str::from_utf8(f).ok()?.parse().ok())
        .ok_or_else(malformed)
}

/// Waits (at most five seconds) until this process's thread `tid`, joined, has finished
/// exiting: `pthread_join` returns once the kernel has cleared the thread's id, which comes
/// before the thread leaves the process.
pub(crate) fn wait_for_thread_exit(tid: nix::unistd::Pid) {
    let task = format!("/proc/self/task/{tid}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::path::Path::new(&task).exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// Refuses to go on unless this process has exactly one thread.
fn single_threaded() -> io::Result<()> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to fork a process with {threads} threads"
        )));
    }
    Ok(())
}

/// `fork(2)`, refused unless this process has exactly one thread: a child forked from a
/// multi-threaded process could inherit a lock another thread held (in the allocator, say)
/// and deadlock. The supervisor and the run's init are single-threaded by design; this check
/// makes that a verified fact rather than a promise.
pub(crate) fn fork() -> io::Result<Fork> {
    single_threaded()?;
    // SAFETY: the process has one thread (checked just above, and nothing here starts one),
    // so the child's memory holds no lock owned by a thread that does not exist in it.
    Ok(match unsafe { unistd::fork() }? {
        ForkResult::Child => Fork::Child,
        ForkResult::Parent { child } => Fork::Parent(child.as_raw()),
    })
}

/// Sets the calling *thread's* filesystem credentials: supplementary groups, fsgid, fsuid.
/// Used by [`dirfd::as_caller`] on a thread of its own.
///
/// Raw system calls on purpose, all three: the kernel keeps credentials per thread, while
/// libc's `setgroups` (and so nix's) applies to every thread of the process, which here would
/// hand a caller's groups to every thread of the daemon. `setfsuid`/`setfsgid` go the same
/// way so that no libc wrapper stands between this thread and the kernel.
pub(crate) fn set_thread_fs_creds(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: the kernel reads `groups.len()` gid_t values (u32 on every Linux ABI we build
    // for) from the pointer, which points at exactly that many.
    cvt_long(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) })?;
    // setfsgid/setfsuid return the previous value whether or not they succeeded; asking with
    // an invalid id (-1) returns the current one, which tells.
    set_fs_id(libc::SYS_setfsgid, gid);
    let now_gid = set_fs_id(libc::SYS_setfsgid, u32::MAX);
    set_fs_id(libc::SYS_setfsuid, uid);
    let now_uid = set_fs_id(libc::SYS_setfsuid, u32::MAX);
    if now_uid != uid || now_gid != gid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("cannot take filesystem credentials {uid}:{gid}"),
        ));
    }
    Ok(())
}

/// May this thread's filesystem credentials read (`write: false`) or write what `fd` (an
/// `O_PATH` descriptor) is? A directory needs search permission too. `faccessat2` with
/// `AT_EACCESS | AT_EMPTY_PATH`, so the check is the fsuid's, fsgid's and groups' (those
/// [`set_thread_fs_creds`] set), on the file itself: no path is resolved again.
///
/// Raw: libc's `faccessat` falls back to its own emulation, with the effective uid, on a
/// kernel without `faccessat2`; here that kernel is an error (`ENOSYS`), never a yes.
pub(crate) fn access_fd(fd: std::os::fd::BorrowedFd<'_>, write: bool, dir: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut mode = if write { libc::W_OK } else { libc::R_OK };
    if dir {
        mode |= libc::X_OK;
    }
    // SAFETY: the path is a NUL-terminated empty string that lives across the call; the
    // other arguments are integers; the kernel only reads them.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            mode,
            libc::AT_EACCESS | libc::AT_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// `setfsuid(2)` or `setfsgid(2)` (by `nr`) for this thread; returns the previous id.
fn set_fs_id(nr: libc::c_long, id: u32) -> u32 {
    // SAFETY: both calls take one integer, touch no memory and cannot fail (they report the
    // previous id either way).
    unsafe { libc::syscall(nr, id) as u32 }
}

/// The supplementary groups of a Unix socket's peer (`SO_PEERGROUPS`, Linux 4.13), as they
/// were when it connected.
///
/// Raw: nix's socket options have no `SO_PEERGROUPS`.
pub(crate) fn peer_groups(sock: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut groups: Vec<u32> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<u32>()) as libc::socklen_t;
        // SAFETY: the buffer holds `len` bytes and the kernel writes at most that many,
        // reporting how many it wrote (or needs, with ERANGE) in `len`.
        let r = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<u32>();
        if r == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ERANGE) && n > groups.len() {
            groups.resize(n, 0);
            continue;
        }
        return Err(err);
    }
}

/// How a waited-for process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Code(i32),
    Signal(i32),
}

/// `waitpid(2)`; `Ok(None)` when `WNOHANG` found nothing to reap.
///
/// Raw: nix's `WaitStatus` cannot name a real-time signal, so its `waitpid` reaps a child
/// killed by one and then fails with `EINVAL`, losing the status (and the run's init would
/// wait forever for a child it has already reaped).
pub(crate) fn waitpid(pid: i32, nohang: bool) -> io::Result<Option<(i32, Exit)>> {
    let mut status = 0;
    let flags = if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: `status` is a valid, writable int for the duration of the call.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        if r == -1 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if r == 0 {
            return Ok(None);
        }
        let exit = if libc::WIFSIGNALED(status) {
            Exit::Signal(libc::WTERMSIG(status))
        } else {
            Exit::Code(libc::WEXITSTATUS(status))
        };
        return Ok(Some((r, exit)));
    }
}

/// Whether `pid` is a child of this process not yet reaped (running or a zombie): it leaves
/// it as it is (`waitid` with `WNOWAIT`).
pub(crate) fn is_child(pid: i32) -> bool {
    let Ok(id) = libc::id_t::try_from(pid) else {
        return false;
    };
    // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `info` is valid and writable for the duration of the call.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                id,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if r == 0 {
            return true;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// Asks the kernel to send `sig` to this process when its parent exits.
pub(crate) fn set_parent_death_signal(sig: i32) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(signal(sig)?)?;
    Ok(())
}

/// A set of signals, for blocking and for `signalfd`.
pub(crate) struct SigSet(nsig::SigSet);

impl SigSet {
    pub(crate) fn of(signals: &[Signal]) -> SigSet {
        let mut set = nsig::SigSet::empty();
        for &s in signals {
            set.add(s);
        }
        SigSet(set)
    }

    pub(crate) fn all() -> SigSet {
        SigSet(nsig::SigSet::all())
    }

    /// Blocks these signals for the calling thread (the whole process when single-threaded).
    pub(crate) fn block(&self) -> io::Result<()> {
        Ok(self.0.thread_block()?)
    }

    pub(crate) fn unblock(&self) -> io::Result<()> {
        Ok(self.0.thread_unblock()?)
    }

    /// A non-blocking, close-on-exec signalfd for these (blocked) signals.
    pub(crate) fn signalfd(&self) -> io::Result<OwnedFd> {
        let fd = SignalFd::with_flags(&self.0, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
        Ok(fd.into())
    }

    /// Waits for one of these (blocked) signals; returns its number.
    pub(crate) fn wait(&self) -> io::Result<i32> {
        Ok(self.0.wait()? as i32)
    }
}

/// Reads one pending signal number from a signalfd; `Ok(None)` if none is pending.
pub(crate) fn read_signalfd(fd: &OwnedFd) -> io::Result<Option<i32>> {
    // A signalfd hands out whole `signalfd_siginfo` records; the signal number is its first
    // field (`ssi_signo`, a u32).
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    match unistd::read(fd, &mut info) {
        Ok(n) if n >= 4 => Ok(Some(
            u32::from_ne_bytes([info[0], info[1], info[2], info[3]]) as i32,
        )),
        Ok(_) => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        Err(Errno::EAGAIN) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

extern "C" fn noop_handler(_: libc::c_int) {}

/// Installs a handler that does nothing, so that a PID-namespace init (which the kernel shields
/// from signals left at their default action) still receives `sig` through [`SigSet::wait`].
pub(crate) fn install_noop_handler(sig: i32) -> io::Result<()> {
    let act = SigAction::new(
        SigHandler::Handler(noop_handler),
        SaFlags::empty(),
        nsig::SigSet::empty(),
    );
    // SAFETY: the handler does nothing, so it is async-signal-safe and can interrupt any code
    // without breaking an invariant of it.
    unsafe { nsig::sigaction(signal(sig)?, &act) }?;
    Ok(())
}

/// Restores the default action for every catchable signal (used before exec, so the command
/// does not inherit the supervisor's dispositions).
///
/// Raw: nix's `Signal` cannot name the real-time signals, whose dispositions (an ignored one
/// survives exec) must be reset too.
pub(crate) fn reset_signal_dispositions() {
    for sig in 1..libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: signal() with SIG_DFL is always valid; failures for reserved signals are
        // harmless and ignored.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// A pipe whose both ends are close-on-exec.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(unistd::pipe2(OFlag::O_CLOEXEC)?)
}

/// `dup2(2)` onto a standard descriptor: makes `target` (0, 1 or 2) a copy of `fd`, clearing
/// close-on-exec on it. Any other target is refused: nothing else may be replaced behind the
/// back of the `OwnedFd` that holds it.
pub(crate) fn dup2(fd: impl AsFd, target: RawFd) -> io::Result<()> {
    match target {
        0 => unistd::dup2_stdin(fd)?,
        1 => unistd::dup2_stdout(fd)?,
        2 => unistd::dup2_stderr(fd)?,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("dup2 onto descriptor {target}: only 0, 1 and 2 are replaced"),
            ))
        }
    }
    Ok(())
}

/// Closes every descriptor from `first` upwards.
///
/// Raw: nix has no `close_range`.
pub(crate) fn close_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the caller guarantees nothing it still
    // uses lies at or above `first`.
    cvt_long(unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) })?;
    Ok(())
}

/// Sets or clears `O_NONBLOCK`.
/// `F_SETPIPE_SZ`: asks for a pipe buffer of `bytes` (rounded up to pages by the kernel).
pub(crate) fn set_pipe_size(fd: impl AsFd, bytes: i32) -> io::Result<()> {
    fcntl(fd.as_fd(), FcntlArg::F_SETPIPE_SZ(bytes))?;
    Ok(())
}

pub(crate) fn set_nonblocking(fd: impl AsFd, on: bool) -> io::Result<()> {
    let fd = fd.as_fd();
    let mut flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    flags.set(OFlag::O_NONBLOCK, on);
    fcntl(fd, FcntlArg::F_SETFL(flags))?;
    Ok(())
}

pub(crate) fn setsid() -> io::Result<()> {
    unistd::setsid()?;
    Ok(())
}

/// Drops to `uid`/`gid` with exactly `groups` as supplementary groups. Order matters: groups
/// and gid first, while we still have the privilege to change them. (libc's `setgroups`
/// applies to every thread; this runs in the single-threaded command child, where that is
/// the one thread.)
pub(crate) fn drop_to(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    let groups: Vec<Gid> = groups.iter().map(|g| Gid::from_raw(*g)).collect();
    unistd::setgroups(&groups)?;
    unistd::setresgid(gid, gid, gid)?;
    unistd::setresuid(uid, uid, uid)?;
    Ok(())
}

/// `poll(2)` for readability on a set of descriptors; returns which were ready (readable,
/// hung up or in error). A `None` is left out (never ready) without shifting the others'
/// positions. A negative timeout waits for ever.
pub(crate) fn poll_readable(
    fds: &[Option<BorrowedFd<'_>>],
    timeout_ms: i32,
) -> io::Result<Vec<bool>> {
    let timeout = PollTimeout::try_from(timeout_ms.max(-1)).unwrap_or(PollTimeout::NONE);
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .flatten()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    loop {
        match nix::poll::poll(&mut pfds, timeout) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => break,
        }
    }
    // Flags nix does not know (`None`) are still flags: ready.
    let mut ready = pfds
        .iter()
        .map(|p| p.revents().is_none_or(|r| !r.is_empty()));
    Ok(fds
        .iter()
        .map(|fd| fd.is_some() && ready.next().unwrap_or(false))
        .collect())
}

/// `execvp`-free exec: runs `path` with `argv` and `envp`. Returns only on failure.
pub(crate) fn execve(path: &CString, argv: &[CString], envp: &[CString]) -> io::Error {
    match unistd::execve(path, argv, envp) {
        Err(e) => e.into(),
        Ok(never) => match never {},
    }
}

/// Ends the process at once without running destructors or atexit handlers (used in forked
/// children, which must not flush buffers they share with their parent).
///
/// Raw: nix has no `_exit`, and `std::process::exit` runs the atexit handlers.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and is always safe to call.
    unsafe { libc::_exit(code) }
}

/// `fsync(2)` on a directory, so a rename inside it is durable.
pub(crate) fn fsync_dir(path: &std::path::Path) -> io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Marks every descriptor from `first` upwards close-on-exec, so `exec` drops them all while
/// the ones still needed before it (an error pipe) stay usable until then.
///
/// Raw: nix has no `close_range`.
pub(crate) fn cloexec_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors.
    cvt_long(unsafe {
        libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC)
    })?;
    Ok(())
}

/// Writes all of `data` to a raw descriptor, ignoring errors (used on failure paths in forked
/// children, where there is nobody left to tell).
pub(crate) fn write_all_fd(fd: &OwnedFd, data: &[u8]) {
    let mut off = 0;
    while off < data.len() {
        match unistd::write(fd, &data[off..]) {
            Ok(0) => return,
            Ok(n) => off += n,
            Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}

/// Reads what is available from a descriptor into `buf` (retrying an interrupted read);
/// returns the number of bytes read, `Ok(0)` at end of file, and, from a non-blocking one,
/// `WouldBlock` when nothing is ready.
pub(crate) fn read_fd(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match unistd::read(&fd, buf) {
            Err(Errno::EINTR) => continue,
            other => return Ok(other?),
        }
    }
}

/// Registers an owned descriptor (a pidfd) with tokio's reactor, readable-only.
///
/// Unsafe in tokio, not in the kernel: its registration trusts the descriptor to stay open.
pub(crate) fn async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is a valid open descriptor for as long as it lives, and the AsyncFd
    // owns it, so it stays open until after the registration is dropped.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// See `sidejob::start`: what the Rust runtime would do at start-up that sidejob relies on.
pub(crate) fn process_start() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: `fds` is an array of three pollfds, alive for the call.
    let polled = unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) };
    for p in fds {
        let closed = if polled == -1 {
            // A failed poll: each descriptor is checked on its own.
            // SAFETY: F_GETFD only reads the descriptor's flags.
            unsafe { libc::fcntl(p.fd, libc::F_GETFD) == -1 }
        } else {
            p.revents & libc::POLLNVAL != 0
        };
        // Opening takes the lowest free descriptor: this one. It stays open for good.
        // SAFETY: a NUL-terminated path and plain flags.
        if closed && unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } == -1 {
            std::process::abort();
        }
    }
    // SAFETY: ignoring a signal runs no code of ours.
    let _ = unsafe { nsig::signal(Signal::SIGPIPE, SigHandler::SigIgn) };
}

/// Restores the default action of SIGPIPE ([`process_start`] ignores it), so a client command
/// whose output pipe closes (`sidejob tasks | head`) ends quietly like other Unix tools. Never
/// for the daemon.
pub(crate) fn default_sigpipe() {
    // SAFETY: the default disposition runs no code of ours, so no handler can break an
    // invariant of the code it interrupts.
    let _ = unsafe { nsig::signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

/// A user's credentials from the user database: `gid` as their primary group and their
/// supplementary groups (`getgrouplist`). A uid with no entry has no supplementary groups.
pub(crate) fn user_creds(uid: u32, gid: u32) -> dirfd::Creds {
    use nix::unistd::{getgrouplist, Gid, Uid, User};
    let groups = User::from_uid(Uid::from_raw(uid))
        .ok()
        .flatten()
        .and_then(|u| {
            let name = std::ffi::CString::new(u.name).ok()?;
            getgrouplist(&name, Gid::from_raw(gid)).ok()
        })
        .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
        .unwrap_or_else(|| vec![gid]);
    dirfd::Creds { uid, gid, groups }
}

/// Takes ownership of a descriptor this process inherited at a documented number (the
/// supervisor's descriptor 3, the run's public directory). Refused if nothing is open there.
/// Call once, first thing, before anything else could own that number.
///
/// Raw: the check comes before there is a descriptor to hand to nix (which takes only
/// descriptors known to be open).
pub(crate) fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails with EBADF if not open.
    cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: the descriptor is open (checked above) and, by this function's contract, owned
    // by nothing else in this process: it was inherited, and this is the one place that
    // claims it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Close-on-exec from here on: nothing this process executes may inherit it.
    fcntl(&fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(fd)
}

/// `flock(2)` on a descriptor: `LOCK_SH`, `LOCK_EX`, `LOCK_UN`, with `LOCK_NB` to fail
/// (`EWOULDBLOCK`) instead of waiting. The lock belongs to the open file description.
///
/// Raw: nix's only non-deprecated flock is `Flock`, a guard that owns the descriptor and
/// unlocks it on drop; git's stand-ins turn a shared hold into an exclusive one on the same
/// open file and let the close release it, which that guard cannot express.
pub(crate) fn flock(fd: std::os::fd::BorrowedFd<'_>, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: integer arguments only; the descriptor is borrowed, so open for the call.
        match cvt(unsafe { libc::flock(fd.as_raw_fd(), op) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}

/// Makes every thread allocate from one heap (glibc's `M_ARENA_MAX`), before any thread
/// starts. glibc otherwise gives threads their own arenas, and memory freed in one of them
/// serves only the threads that happen to use it: over cycles of a thousand runs the daemon
/// grew by 2 MiB of scattered free memory a cycle, where with one heap it stays flat (the
/// `cycles` section of `sidejob-perf-bench`). The daemon's threads mostly wait on I/O, so
/// they seldom contend for the one heap.
pub(crate) fn one_heap_arena() {
    // SAFETY: mallopt takes two integers and only changes the allocator's tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns the heap's free memory to the system (`malloc_trim`): glibc keeps what was freed
/// for reuse, so a daemon that served a crowd of connections would otherwise stay at its peak.
pub(crate) fn trim_heap() {
    // SAFETY: malloc_trim takes an integer (the padding to keep) and only releases free
    // memory; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The soft limit on this process's open descriptors (`RLIMIT_NOFILE`); 1024, the usual
/// default, if it cannot be read.
pub(crate) fn descriptor_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft)
}

/// How many descriptors this process has open (the entries of `/proc/self/fd`, less the one
/// reading it). Costs a directory entry per descriptor: see [`descriptor_table_size`].
pub(crate) fn open_descriptors() -> io::Result<u64> {
    let n = std::fs::read_dir("/proc/self/fd")?.count() as u64;
    Ok(n.saturating_sub(1))
}

/// The size of this process's descriptor table (`FDSize` in `/proc/self/status`): every open
/// descriptor's number is below it, so it bounds [`open_descriptors`] at a cost that does not
/// grow with them.
pub(crate) fn descriptor_table_size() -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no FDSize in /proc/self/status"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A joined thread can still be exiting: one that leaves a mount namespace of its own
    /// behind tears it down after the join has returned. Once `wait_for_thread_exit`
    /// returns, it is gone.
    #[test]
    fn a_joined_thread_is_gone_once_waited_for() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root (a mount namespace of the thread's own)");
            return;
        }
        let threads = || std::fs::read_dir("/proc/self/task").unwrap().count();
        let before = threads();
        let mut still_there = 0;
        for _ in 0..20 {
            let tid = std::thread::spawn(|| {
                unshare(libc::CLONE_NEWNS).unwrap();
                nix::unistd::gettid()
            })
            .join()
            .unwrap();
            still_there += (threads() != before) as usize;
            wait_for_thread_exit(tid);
            assert_eq!(threads(), before, "thread {tid} waited for");
        }
        eprintln!("{still_there} of 20 were still exiting when joined");
    }

    #[test]
    fn the_descriptor_table_bounds_the_descriptors_open() {
        let before = descriptor_table_size().unwrap();
        assert!(before >= open_descriptors().unwrap());
        // Enough more to grow the table past where it was.
        let held: Vec<_> = (0..before + 64)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let (size, open) = (
            descriptor_table_size().unwrap(),
            open_descriptors().unwrap(),
        );
        assert!(open >= held.len() as u64, "{open} open");
        assert!(size >= open && size > before, "table {size}, {open} open");
    }

    #[test]
    fn stat_fields_are_counted_after_a_name_that_holds_spaces_and_parentheses() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            nix::sys::prctl::set_name(c"a) 1 2 (b").unwrap();
            // Field 4: the process's parent, the same for each of its threads.
            tx.send(stat_field("/proc/thread-self/stat", 4).unwrap())
                .unwrap();
        });
        assert_eq!(rx.recv().unwrap(), unistd::getppid().as_raw() as u64);
    }

    #[test]
    fn the_start_time_and_thread_count_match_procs_own_text() {
        let text = std::fs::read_to_string("/proc/self/stat").unwrap();
        let after: Vec<&str> = text
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let pid = std::process::id() as i32;
        assert_eq!(process_start_time(pid).unwrap().to_string(), after[19]);
        assert!(thread_count().unwrap() >= 1);
        assert!(process_start_time(i32::MAX).is_err());
    }
}
