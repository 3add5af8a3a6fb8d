//! Starting processes: from the (multi-threaded) daemon, `posix_spawn`, which never runs our
//! code in the child, with exactly the descriptors we name at exactly the numbers we name;
//! from the (single-threaded) spawner, [`fork_sibling`], a fork whose child is the daemon's;
//! from the supervisor, [`lean_fork`] for the run's init; from init, [`spawn_sharing_memory`]
//! for the command.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
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
pub(crate) fn dup_at_least(fd: BorrowedFd<'_>, min: RawFd) -> io::Result<OwnedFd> {
    let new = fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(min))?;
    // SAFETY: fcntl just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Starts `program` with `args` and an empty environment, in a process group of its own,
/// with default signal dispositions and an empty signal mask. `fds[i]` becomes descriptor
/// `i` of the child (0 = stdin, …); nothing else is inherited (everything this process opens
/// is close-on-exec, and the child closes what is above its own descriptors first thing).
/// Returns the child's pid; the caller reaps it.
pub(crate) fn spawn(program: &Path, args: &[&OsStr], fds: &[BorrowedFd<'_>]) -> io::Result<i32> {
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

/// `fork(2)` with `CLONE_PARENT`: the child is a child of this process's *parent*, as if the
/// parent had forked it — it reports its exit to the parent, which reaps it and may
/// `pidfd_open` it with no chance of a reused pid. The spawner uses it so that the daemon
/// owns every supervisor exactly as if it had started it itself. See [`raw_fork`].
pub(crate) fn fork_sibling() -> io::Result<super::Fork> {
    raw_fork(libc::CLONE_PARENT)
}

/// `fork(2)` straight to the kernel, for the run's init, which lives as long as the run:
/// glibc's fork wrapper writes its lock words and thread list in the child (pages of libc's
/// and the dynamic loader's data), each write a private copy of a page for every run. See
/// [`raw_fork`].
pub(crate) fn lean_fork() -> io::Result<super::Fork> {
    raw_fork(0)
}

/// The stack [`spawn_sharing_memory`]'s child runs on, above a guard page.
const SHARED_CHILD_STACK: usize = 256 * 1024;

/// Runs `child` in a new process that shares this one's memory until it execs or exits,
/// this process suspended meanwhile (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does): no
/// page tables are copied and no page is copied on write, which a fork of the run's init
/// costs about 0.2 ms per command. Returns the child's pid.
///
/// The child runs on a stack of its own, with every signal blocked (this process's mask is
/// put back when the child is gone), so no handler of this process runs in it before it has
/// reset its dispositions. It has its own descriptor table, credentials, signal dispositions
/// and working directory, as a forked child has. What it must not do: return (it execs or
/// exits; one that returns exits with 127), block on this process, or change what this
/// process holds: whatever it writes to memory, this process sees. It may allocate (this
/// process is single-threaded, so no lock is held; what it does not free is left behind, a
/// few kilobytes).
pub(crate) fn spawn_sharing_memory(child: &mut dyn FnMut()) -> io::Result<i32> {
    extern "C" fn trampoline(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `&mut dyn FnMut` below, alive until this child execs or exits
        // (this process is suspended until then).
        let child = unsafe { &mut *(arg as *mut &mut dyn FnMut()) };
        child();
        // It execs or exits; should it return, the child exits as a failed exec does.
        127
    }
    super::single_threaded()?;
    let stack = ChildStack::new(SHARED_CHILD_STACK)?;
    let mut child = child;
    // SAFETY: CLONE_VFORK returns only once the child has exec'd or exited, so `child` and
    // the stack outlive its use of them; the trampoline only calls `child`.
    unsafe {
        clone_with_signals_blocked(
            trampoline,
            &stack,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &mut child as *mut &mut dyn FnMut() as *mut libc::c_void,
        )
    }
}

/// A stack for a child that shares this process's memory (`CLONE_VM`): a private mapping
/// above a guard page (an overflowing child faults), unmapped when dropped, which its owner
/// must not let happen while the child may still run on it.
pub(crate) struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

impl ChildStack {
    const GUARD: usize = 4096;

    pub(crate) fn new(size: usize) -> io::Result<ChildStack> {
        let len = size + Self::GUARD;
        // SAFETY: a fresh private anonymous mapping, owned by the value returned.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the mapping's lowest page, made the guard.
        if unsafe { libc::mprotect(base, Self::GUARD, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The child's first stack pointer: the mapping's end (stacks grow down), page-aligned.
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping, which `add` may point at.
        unsafe { (self.base as *mut u8).add(self.len) as *mut libc::c_void }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the owner guarantees no child runs on it.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// `clone(f, stack, flags, arg)` with every signal blocked in the child, so no handler of
/// this process runs on its stack before it has reset its dispositions or exited (this
/// thread's mask is put back at once). Returns the child's pid.
///
/// # Safety
/// As `clone(2)` with `CLONE_VM`: `f` runs on `stack` in this process's memory, so `stack`,
/// `arg` and whatever `f` touches must outlive the child, and `f` must be safe to run beside
/// this process (or with it suspended, under `CLONE_VFORK`).
pub(crate) unsafe fn clone_with_signals_blocked(
    f: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    stack: &ChildStack,
    flags: libc::c_int,
    arg: *mut libc::c_void,
) -> io::Result<i32> {
    let old = SigSet::all().thread_swap_mask(nix::sys::signal::SigmaskHow::SIG_SETMASK)?;
    // SAFETY: the caller vouches for `f`, `arg` and the flags; the stack is a live mapping.
    let pid = unsafe { libc::clone(f, stack.top(), flags, arg) };
    let cloned = if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    };
    let _ = old.thread_set_mask();
    cloned
}

/// `clone(flags | SIGCHLD)` with no new stack, without glibc's wrapper. Refused unless this
/// process has exactly one thread (see [`super::fork`]).
///
/// Raw: neither libc nor nix wraps `clone` without a new stack.
fn raw_fork(flags: libc::c_int) -> io::Result<super::Fork> {
    super::single_threaded()?;
    // SAFETY: clone with no new stack and no shared memory is fork: the child runs on a
    // copy of this process's memory from this very instruction. The process has one thread
    // (checked above), so the copy holds no lock another thread owned. glibc's fork wrapper
    // is not used, so glibc's per-thread record in the child keeps the parent's thread id:
    // nothing the child runs (the supervisor and init: single-threaded, no pthread mutexes,
    // and a glibc whose raise() asks the kernel for the thread id) reads it, and the child's
    // own forks (glibc's) set it right for their children. The pointer arguments are null.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(super::Fork::Child),
        pid => Ok(super::Fork::Parent(pid as i32)),
    }
}

/// Puts `fds[i]` at descriptor `i` (close-on-exec cleared there), whatever numbers they
/// have now, and closes the originals. For the spawner's forked child, before it becomes
/// the supervisor: the caller must own nothing at `0..fds.len()` besides stdio (which is
/// replaced).
pub(crate) fn place_fds(fds: Vec<OwnedFd>) -> io::Result<()> {
    // Each is copied above every target first, so one dup2 never clobbers a source another
    // still needs; the originals are closed before anything lands on their numbers.
    let high: Vec<OwnedFd> = fds
        .iter()
        .map(|fd| dup_at_least(fd.as_fd(), fds.len() as RawFd + 3))
        .collect::<io::Result<_>>()?;
    drop(fds);
    for (target, fd) in high.iter().enumerate() {
        // SAFETY: dup2 onto a number nothing in this process owns (the caller's contract,
        // and the originals were just closed) or onto stdio, which std does not close; the
        // new descriptor is left for the process to claim by its number
        // (`take_inherited_fd`).
        if unsafe { libc::dup2(fd.as_raw_fd(), target as RawFd) } == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes the calling process the leader of a process group of its own (as
/// `POSIX_SPAWN_SETPGROUP` does for [`spawn`]).
pub(crate) fn own_process_group() -> io::Result<()> {
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
    Ok(())
}

/// Names the calling thread (`comm` in `/proc`, what `ps -o comm` and `top` show): a
/// supervisor forked by the spawner keeps the spawner's command line, so its name tells
/// them apart.
pub(crate) fn set_name(name: &std::ffi::CStr) -> io::Result<()> {
    nix::sys::prctl::set_name(name)?;
    Ok(())
}
