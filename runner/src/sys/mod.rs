//! The only module with `unsafe`: thin, documented wrappers over the Linux calls that the
//! supervisor and the executor need and that `std` does not offer.
//!
//! Every wrapper returns `io::Result` with the OS error; callers add the step and the path.
#![allow(unsafe_code)]

pub mod dirfd;
pub mod fdpass;
pub mod fs;
pub mod sandbox;
pub mod spawn;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
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
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1; no memory is
    // passed. O_NONBLOCK is not requested because the executor only polls it for readability.
    let fd = cvt_long(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `sig` to the process behind a pidfd; immune to pid reuse.
pub fn pidfd_send_signal(pidfd: &OwnedFd, sig: i32) -> io::Result<()> {
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
pub fn process_start_time(pid: i32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces or ')'.
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))?;
    // After ')' come field 3 (state) onwards; start time is field 22, so index 19 here.
    after
        .split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))
}

pub fn getuid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

pub fn getgid() -> u32 {
    // SAFETY: getgid cannot fail and touches no memory.
    unsafe { libc::getgid() }
}

pub fn getpid() -> i32 {
    // SAFETY: getpid cannot fail and touches no memory.
    unsafe { libc::getpid() }
}

pub fn getppid() -> i32 {
    // SAFETY: getppid cannot fail and touches no memory.
    unsafe { libc::getppid() }
}

/// Fills `buf` from the kernel's random source.
pub fn getrandom(buf: &mut [u8]) -> io::Result<()> {
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

/// Signals a single process by pid.
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: kill takes two integers; no memory is involved.
    cvt(unsafe { libc::kill(pid, sig) })?;
    Ok(())
}

/// `unshare(2)` with the given `CLONE_*` flags.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare only changes this process's namespaces; no memory is involved.
    cvt(unsafe { libc::unshare(flags) })?;
    Ok(())
}

pub enum Fork {
    Parent(i32),
    Child,
}

/// How many threads this process has (field 20 of `/proc/self/stat`).
fn thread_count() -> io::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().nth(17))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc/self/stat"))
}

/// `fork(2)`, refused unless this process has exactly one thread: a child forked from a
/// multi-threaded process could inherit a lock another thread held (in the allocator, say)
/// and deadlock. The supervisor and the run's init are single-threaded by design; this check
/// makes that a verified fact rather than a promise.
pub fn fork() -> io::Result<Fork> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to fork a process with {threads} threads"
        )));
    }
    // SAFETY: the process has one thread (checked just above, and nothing here starts one),
    // so the child's memory holds no lock owned by a thread that does not exist in it.
    let pid = cvt(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Fork::Child
    } else {
        Fork::Parent(pid)
    })
}

/// Sets the calling *thread's* filesystem credentials: supplementary groups, fsgid, fsuid.
/// Raw system calls on purpose: the kernel keeps credentials per thread, while glibc's
/// wrappers for `setgroups` apply to every thread. Used by [`dirfd::as_caller`] on a thread
/// of its own.
pub(crate) fn set_thread_fs_creds(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: the kernel reads `groups.len()` gid_t values (u32 on every Linux ABI we build
    // for) from the pointer, which points at exactly that many.
    cvt_long(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) })?;
    // setfsgid/setfsuid return the previous value whether or not they succeeded; asking with
    // an invalid id (-1) returns the current one, which tells.
    // SAFETY: integer arguments only.
    unsafe { libc::syscall(libc::SYS_setfsgid, gid) };
    // SAFETY: integer arguments only.
    let now_gid = unsafe { libc::syscall(libc::SYS_setfsgid, u32::MAX) } as u32;
    // SAFETY: integer arguments only.
    unsafe { libc::syscall(libc::SYS_setfsuid, uid) };
    // SAFETY: integer arguments only.
    let now_uid = unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) } as u32;
    if now_uid != uid || now_gid != gid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("cannot take filesystem credentials {uid}:{gid}"),
        ));
    }
    Ok(())
}

/// The supplementary groups of a Unix socket's peer (`SO_PEERGROUPS`, Linux 4.13), as they
/// were when it connected.
pub fn peer_groups(sock: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<u32>> {
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
pub enum Exit {
    Code(i32),
    Signal(i32),
}

/// `waitpid(2)`; `Ok(None)` when `WNOHANG` found nothing to reap.
pub fn waitpid(pid: i32, nohang: bool) -> io::Result<Option<(i32, Exit)>> {
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

/// Asks the kernel to send `sig` to this process when its parent exits.
pub fn set_parent_death_signal(sig: i32) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes the signal number as an unsigned long; no memory.
    cvt(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) })?;
    Ok(())
}

/// A set of signals, for blocking and for `signalfd`.
pub struct SigSet(libc::sigset_t);

impl SigSet {
    pub fn of(signals: &[i32]) -> SigSet {
        // SAFETY: sigemptyset initialises the zeroed set; sigaddset only writes within it.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &s in signals {
                libc::sigaddset(&mut set, s);
            }
            SigSet(set)
        }
    }

    pub fn all() -> SigSet {
        // SAFETY: sigfillset initialises the zeroed set in place.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            SigSet(set)
        }
    }

    /// Blocks these signals for the calling thread (the whole process when single-threaded).
    pub fn block(&self) -> io::Result<()> {
        self.mask(libc::SIG_BLOCK)
    }

    pub fn unblock(&self) -> io::Result<()> {
        self.mask(libc::SIG_UNBLOCK)
    }

    fn mask(&self, how: libc::c_int) -> io::Result<()> {
        // SAFETY: the set is initialised; the old-set pointer may be NULL.
        let r = unsafe { libc::pthread_sigmask(how, &self.0, std::ptr::null_mut()) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(())
    }

    /// A non-blocking, close-on-exec signalfd for these (blocked) signals.
    pub fn signalfd(&self) -> io::Result<OwnedFd> {
        // SAFETY: -1 asks for a new descriptor; the mask is initialised.
        let fd =
            cvt(unsafe { libc::signalfd(-1, &self.0, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) })?;
        // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Waits for one of these (blocked) signals; returns its number.
    pub fn wait(&self) -> io::Result<i32> {
        loop {
            // SAFETY: the set is initialised; the info pointer may be NULL.
            let r = unsafe { libc::sigwaitinfo(&self.0, std::ptr::null_mut()) };
            if r == -1 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            return Ok(r);
        }
    }
}

/// Reads one pending signal number from a signalfd; `Ok(None)` if none is pending.
pub fn read_signalfd(fd: &OwnedFd) -> io::Result<Option<i32>> {
    // SAFETY: signalfd_siginfo is plain old data; zeroed is a valid value.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: we pass a pointer to `info` and exactly its size.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut info as *mut libc::signalfd_siginfo).cast(),
            size,
        )
    };
    if n == -1 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(err);
    }
    Ok(Some(info.ssi_signo as i32))
}

extern "C" fn noop_handler(_: libc::c_int) {}

/// Installs a handler that does nothing, so that a PID-namespace init (which the kernel shields
/// from signals left at their default action) still receives `sig` through `sigwaitinfo`.
pub fn install_noop_handler(sig: i32) -> io::Result<()> {
    // SAFETY: sigaction is zero-initialisable; we set a valid handler and an empty mask.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = noop_handler as *const () as usize;
        libc::sigemptyset(&mut act.sa_mask);
        cvt(libc::sigaction(sig, &act, std::ptr::null_mut()))?;
    }
    Ok(())
}

/// Restores the default action for every catchable signal (used before exec, so the command
/// does not inherit the supervisor's dispositions).
pub fn reset_signal_dispositions() {
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
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `dup2(2)`: makes `target` a copy of `fd` (clearing close-on-exec on `target`).
pub fn dup2(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: both are integers; dup2 validates them.
    cvt(unsafe { libc::dup2(fd, target) })?;
    Ok(())
}

/// Closes every descriptor from `first` upwards.
pub fn close_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the caller guarantees nothing it still
    // uses lies at or above `first`.
    cvt_long(unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) })?;
    Ok(())
}

/// Sets or clears `O_NONBLOCK`.
pub fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor the caller owns.
    unsafe {
        let flags = cvt(libc::fcntl(fd, libc::F_GETFL))?;
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        cvt(libc::fcntl(fd, libc::F_SETFL, flags))?;
    }
    Ok(())
}

pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes no arguments.
    cvt(unsafe { libc::setsid() })?;
    Ok(())
}

/// Drops to `uid`/`gid` with no supplementary groups. Order matters: groups and gid first,
/// while we still have the privilege to change them.
pub fn drop_to(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setgroups with a zero-length list and a NULL pointer is valid; the rest take ints.
    unsafe {
        cvt(libc::setgroups(0, std::ptr::null()))?;
        cvt(libc::setresgid(gid, gid, gid))?;
        cvt(libc::setresuid(uid, uid, uid))?;
    }
    Ok(())
}

/// `poll(2)` on a set of descriptors for readability; returns which were ready (readable,
/// hung up or in error).
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
        if r == -1 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(pfds.iter().map(|p| p.revents != 0).collect());
    }
}

/// `execvp`-free exec: runs `path` with `argv` and `envp`. Returns only on failure.
pub fn execve(path: &CString, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // SAFETY: all pointers reference NUL-terminated strings owned by the caller that outlive
    // the call, and both arrays are NULL-terminated.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// Ends the process at once without running destructors or atexit handlers (used in forked
/// children, which must not flush buffers they share with their parent).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and is always safe to call.
    unsafe { libc::_exit(code) }
}

/// `fsync(2)` on a directory, so a rename inside it is durable.
pub fn fsync_dir(path: &std::path::Path) -> io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Marks every descriptor from `first` upwards close-on-exec, so `exec` drops them all while
/// the ones still needed before it (an error pipe) stay usable until then.
pub fn cloexec_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors.
    cvt_long(unsafe {
        libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC)
    })?;
    Ok(())
}

/// Writes all of `data` to a raw descriptor, ignoring errors (used on failure paths in forked
/// children, where there is nobody left to tell).
pub fn write_all_fd(fd: &OwnedFd, data: &[u8]) {
    let mut off = 0;
    while off < data.len() {
        // SAFETY: the pointer and length describe the unwritten rest of `data`.
        let n = unsafe {
            libc::write(
                fd.as_raw_fd(),
                data[off..].as_ptr().cast(),
                data.len() - off,
            )
        };
        if n <= 0 {
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        off += n as usize;
    }
}

/// Reads what is available from a (non-blocking) descriptor into `buf`; returns the number of
/// bytes read, `Ok(0)` at end of file, and `WouldBlock` when nothing is ready.
pub fn read_fd(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: the pointer and length describe `buf`, which we hold mutably.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(n as usize);
    }
}

/// Registers an owned descriptor (a pidfd) with tokio's reactor, readable-only.
pub fn async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is a valid open descriptor for as long as it lives, and the AsyncFd
    // owns it, so it stays open until after the registration is dropped.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// Restores the default action of SIGPIPE (Rust ignores it), so a client command whose output
/// pipe closes (`sidejob tasks | head`) ends quietly like other Unix tools. Never for the daemon.
pub fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL is always valid.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A user's credentials from the user database: `gid` as their primary group and their
/// supplementary groups (`getgrouplist`). A uid with no entry has no supplementary groups.
pub fn user_creds(uid: u32, gid: u32) -> dirfd::Creds {
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
pub fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails with EBADF if not open.
    cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // Close-on-exec from here on: nothing this process executes may inherit it.
    // SAFETY: F_SETFD on an open descriptor (checked just above).
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) })?;
    // SAFETY: the descriptor is open (checked above) and, by this function's contract, owned
    // by nothing else in this process: it was inherited, and this is the one place that
    // claims it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `flock(2)` on a descriptor: `LOCK_SH`, `LOCK_EX`, `LOCK_UN`, with `LOCK_NB` to fail
/// (`EWOULDBLOCK`) instead of waiting. The lock belongs to the open file description.
pub fn flock(fd: std::os::fd::BorrowedFd<'_>, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: integer arguments only; the descriptor is borrowed, so open for the call.
        match cvt(unsafe { libc::flock(fd.as_raw_fd(), op) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}
