//! A new network namespace made on another CPU while this process goes on with other work.
//!
//! Making a network namespace is the dearest step of a sandbox's start: about 0.4 ms of
//! kernel work (every per-namespace subsystem and its sysctl tables), which nothing else of
//! the start depends on until init joins it. `sidejob exec` starts [`Ahead`] first thing and
//! collects the namespace just before it forks the run's init, so on a machine with a second
//! CPU that work overlaps its own preparation instead of following it.
//!
//! The maker is a child process sharing this one's memory and descriptor table
//! (`CLONE_VM | CLONE_FILES`, no `CLONE_THREAD`: it is never one of this process's threads,
//! so a fork after [`Ahead::finish`] still sees a single-threaded process). It runs nothing
//! but a few system calls, made directly (no libc wrapper, so not even `errno`, which lives
//! in this process's thread-local storage, is written), on a stack of its own:
//!
//! 1. it waits on a futex until this process has moved it to another CPU (left where it was
//!    born, it would run on this process's CPU and delay it by the whole 0.4 ms; should this
//!    process come to wait for it while that CPU is busy, it may run anywhere again);
//! 2. `unshare(CLONE_NEWNET)`;
//! 3. `open("/proc/thread-self/ns/net")`, which lands in the shared descriptor table;
//! 4. it lets go of that table (`unshare(CLONE_FILES)`, then `close_range` on its own copy:
//!    it holds no descriptor of this process's from here on) and asks to be killed when this
//!    process ends (`PR_SET_PDEATHSIG`);
//! 5. it stores the descriptor (or the negated error) where this process reads it, and waits
//!    to be killed.
//!
//! Step 5 makes this process's own exit cheaper. The last process to let go of a memory map
//! tears it down: for `sidejob exec` that took about 0.15 ms, plus a TLB shoot-down on the
//! other CPU, between its `exit` and the moment whoever waits for it could go on. With the
//! maker still holding the map, this process only drops its share; the maker, killed as this
//! process ends, tears it down on its own CPU, after the waiter has been told. Should step 4
//! fail, the maker exits after step 5 instead.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use super::cpu;
use super::spawn::{clone_with_signals_blocked, ChildStack};

/// The maker's stack: it makes a few calls and no allocation.
const STACK: usize = 16 * 1024;

/// `Shared::result` until the maker has stored its own.
const PENDING: i32 = i32::MIN;

/// `Shared::result` once this process has taken the descriptor.
const TAKEN: i32 = i32::MIN + 1;

/// How long this process waits for the maker between checks that it is still alive.
const CHECK_EVERY_NS: libc::c_long = 10_000_000;

/// What the maker and this process share (never freed while the maker may be alive).
struct Shared {
    /// 0 until the maker may go on.
    gate: AtomicU32,
    /// The namespace's descriptor, the negated error number, [`PENDING`] or [`TAKEN`];
    /// written by the maker once, then by this process only.
    result: AtomicI32,
    /// Always 0: the word the maker waits on once it is done.
    park: AtomicU32,
    /// This process's pid, for the maker to check that it is still its parent.
    parent: i32,
}

/// A network namespace being made by a child process (see the module's documentation).
pub(crate) struct Ahead {
    pid: i32,
    /// Both are left alone (leaked) while the maker may still run on them, freed once it is
    /// known to be gone (see `Drop`).
    shared: ManuallyDrop<Box<Shared>>,
    stack: ManuallyDrop<ChildStack>,
    reaped: bool,
}

impl Ahead {
    /// Starts the maker; returns at once. Fails where the maker cannot be started (or on an
    /// architecture whose system calls are not written below): the caller makes its
    /// namespace the usual way then.
    pub(crate) fn start() -> io::Result<Ahead> {
        if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        let mut ahead = Ahead {
            pid: 0,
            shared: ManuallyDrop::new(Box::new(Shared {
                gate: AtomicU32::new(0),
                result: AtomicI32::new(PENDING),
                park: AtomicU32::new(0),
                parent: std::process::id() as i32,
            })),
            stack: ManuallyDrop::new(ChildStack::new(STACK)?),
            reaped: true,
        };
        let arg = &**ahead.shared as *const Shared as *mut libc::c_void;
        // SAFETY: `Shared` is boxed, so it stays put, and `Ahead` neither frees it nor
        // unmaps the stack while the maker may be alive (see `Drop`). The maker touches
        // nothing else of this process's memory and makes its calls without libc. No exit
        // signal: it is reaped with `__WALL` (or by whoever inherits it), and this process's
        // SIGCHLD stays its run's.
        let pid = unsafe {
            clone_with_signals_blocked(maker, &ahead.stack, libc::CLONE_VM | libc::CLONE_FILES, arg)
        }?;
        ahead.pid = pid;
        ahead.reaped = false;
        move_elsewhere(pid);
        ahead.shared.gate.store(1, Ordering::Release);
        futex(&ahead.shared.gate, libc::FUTEX_WAKE, 1, None);
        Ok(ahead)
    }

    /// Waits for the maker (by now usually long done) and returns the namespace.
    pub(crate) fn finish(mut self) -> io::Result<OwnedFd> {
        match self.wait() {
            // SAFETY: the maker opened this descriptor in our table and holds no copy of it.
            fd if fd >= 0 => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            // Killed before it could say (SIGKILL: every other signal is blocked in it).
            PENDING => Err(io::Error::from_raw_os_error(libc::EIO)),
            TAKEN => Err(io::Error::from_raw_os_error(libc::EBADF)),
            err => Err(io::Error::from_raw_os_error(-err)),
        }
    }

    /// Waits until the maker has stored its result or is gone; takes the result (a
    /// descriptor is this process's from then on, [`TAKEN`] left in its place).
    fn wait(&mut self) -> i32 {
        let mut widened = false;
        loop {
            let r = self.shared.result.load(Ordering::Acquire);
            if r != PENDING {
                return self.shared.result.swap(TAKEN, Ordering::Acquire);
            }
            if self.reaped {
                return PENDING;
            }
            // Still at work (or not yet started: the other CPU may be busy): this CPU is about
            // to wait, so let the maker run anywhere this process could before it stayed on
            // one CPU (see `cpu::stay_here`).
            if !widened {
                if let Ok(set) = cpu::usable() {
                    let _ = cpu::allow(self.pid, &set);
                }
                widened = true;
            }
            // SAFETY: polls for our own child; the status pointer is null.
            let gone = unsafe {
                libc::waitpid(self.pid, std::ptr::null_mut(), libc::__WALL | libc::WNOHANG)
            };
            let no_child =
                gone < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
            if gone == self.pid || no_child {
                // Gone; but it may have stored its result just before.
                self.reaped = true;
                continue;
            }
            let timeout = libc::timespec {
                tv_sec: 0,
                tv_nsec: CHECK_EVERY_NS,
            };
            futex(
                &self.shared.result,
                libc::FUTEX_WAIT,
                PENDING,
                Some(&timeout),
            );
        }
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        let fd = self.wait();
        if fd >= 0 {
            // SAFETY: a namespace nobody collected: ours to close.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        if self.reaped {
            // SAFETY: the maker is gone; nothing else uses these.
            unsafe {
                ManuallyDrop::drop(&mut self.shared);
                ManuallyDrop::drop(&mut self.stack);
            }
        }
        // Otherwise the maker waits on them until this process ends (see the module's
        // documentation): they are left to the exit.
    }
}

/// `futex(2)` on one of the 32-bit atomic words of [`Shared`]: `op` (a wait while the word
/// holds `val`, until `timeout` if given; or a wake of `val` waiters), private to this
/// process's memory. From this process only: it goes through libc (the maker uses `raw`).
fn futex<T>(word: &T, op: libc::c_int, val: i32, timeout: Option<&libc::timespec>) {
    debug_assert_eq!(std::mem::size_of::<T>(), 4);
    let timeout = timeout.map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a futex call on a live, aligned 32-bit word of ours; the timeout, if any, is
    // borrowed for the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const T,
            op | libc::FUTEX_PRIVATE_FLAG,
            val,
            timeout,
        )
    };
}

/// Lets `pid` run on any CPU this process may use except the current one, when there is
/// another. Best effort: where it fails, the maker runs here, later.
fn move_elsewhere(pid: i32) {
    if let Some(set) = cpu::elsewhere() {
        let _ = cpu::allow(pid, &set);
    }
}

/// The maker's whole life (see the module's documentation). Returning exits it (glibc's
/// `clone` makes the `exit` call).
extern "C" fn maker(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the boxed `Shared`, alive until this process ends or reaps the maker.
    let shared = unsafe { &*(arg as *const Shared) };
    // A futex wait on a word while it holds 0 (no timeout), or a wake of one waiter.
    let futex = |word: *const u32, op: libc::c_int| {
        // SAFETY: `word` is one of `Shared`'s live 32-bit atomic words.
        unsafe {
            raw::syscall4(
                libc::SYS_futex,
                word as usize,
                (op | libc::FUTEX_PRIVATE_FLAG) as usize,
                if op == libc::FUTEX_WAKE { 1 } else { 0 },
                0,
            )
        }
    };
    while shared.gate.load(Ordering::Acquire) == 0 {
        futex(shared.gate.as_ptr(), libc::FUTEX_WAIT);
    }
    // SAFETY: unshare takes flags only.
    let mut r = unsafe { raw::syscall4(libc::SYS_unshare, libc::CLONE_NEWNET as usize, 0, 0, 0) };
    if r == 0 {
        const PATH: &[u8] = b"/proc/thread-self/ns/net\0";
        // SAFETY: a NUL-terminated path in static memory.
        r = unsafe {
            raw::syscall4(
                libc::SYS_openat,
                libc::AT_FDCWD as usize,
                PATH.as_ptr() as usize,
                (libc::O_RDONLY | libc::O_CLOEXEC) as usize,
                0,
            )
        };
    }
    // SAFETY: unshare takes flags; close_range closes this process's own copy of the table;
    // prctl and getppid take numbers.
    let keep = unsafe {
        raw::syscall4(libc::SYS_unshare, libc::CLONE_FILES as usize, 0, 0, 0) == 0
            && raw::syscall4(libc::SYS_close_range, 0, u32::MAX as usize, 0, 0) == 0
            && raw::syscall4(
                libc::SYS_prctl,
                libc::PR_SET_PDEATHSIG as usize,
                libc::SIGKILL as usize,
                0,
                0,
            ) == 0
            && raw::syscall4(libc::SYS_getppid, 0, 0, 0, 0) == shared.parent as isize
    };
    shared.result.store(r as i32, Ordering::Release);
    futex(shared.result.as_ptr() as *const u32, libc::FUTEX_WAKE);
    if keep {
        // What is left for it is tearing down this process's memory, after this process
        // has ended: that may wait until its CPU has nothing else to do.
        static IDLE: libc::sched_param = libc::sched_param { sched_priority: 0 };
        // SAFETY: the parameters are in static memory.
        unsafe {
            raw::syscall4(
                libc::SYS_sched_setscheduler,
                0,
                libc::SCHED_IDLE as usize,
                &IDLE as *const libc::sched_param as usize,
                0,
            )
        };
        // Woken only spuriously: the word stays 0, and the maker ends by being killed.
        loop {
            futex(shared.park.as_ptr(), libc::FUTEX_WAIT);
        }
    }
    0
}

/// System calls without libc: the result, or the negated error number (`errno` untouched).
mod raw {
    /// # Safety
    /// As for the system call `n` with these arguments.
    pub(super) unsafe fn syscall4(
        n: libc::c_long,
        a: usize,
        b: usize,
        c: usize,
        d: usize,
    ) -> isize {
        let ret: isize;
        // SAFETY: the architecture's system call convention; the caller vouches for the call.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") n as isize => ret,
                in("rdi") a,
                in("rsi") b,
                in("rdx") c,
                in("r10") d,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        // SAFETY: as above.
        #[cfg(target_arch = "aarch64")]
        unsafe {
            std::arch::asm!(
                "svc 0",
                in("x8") n,
                inlateout("x0") a as isize => ret,
                in("x1") b,
                in("x2") c,
                in("x3") d,
                options(nostack),
            );
        }
        // Never reached: [`super::Ahead::start`] refuses on other architectures.
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let _ = (n, a, b, c, d);
            ret = -(libc::ENOSYS as isize);
        }
        ret
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn netns_of(fd: &OwnedFd) -> io::Result<u64> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))?.ino())
    }

    #[test]
    fn makes_a_namespace_of_its_own_and_leaves_ours_alone() {
        let ours = std::fs::metadata("/proc/thread-self/ns/net").map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.ino()
        });
        let ahead = match Ahead::start() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("skipped: cannot start the maker here: {e}");
                return;
            }
        };
        match ahead.finish() {
            Ok(fd) => {
                let made = netns_of(&fd).unwrap_or(0);
                assert_ne!(made, 0);
                assert_ne!(Some(made), ours.as_ref().ok().copied());
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("skipped: no privilege for a network namespace here: {e}");
            }
            Err(e) => panic!("the maker failed: {e}"),
        }
        let after = std::fs::metadata("/proc/thread-self/ns/net").map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.ino()
        });
        assert_eq!(ours.ok(), after.ok());
    }

    #[test]
    fn a_namespace_not_collected_is_closed() {
        let count = || std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        let Ok(ahead) = Ahead::start() else {
            eprintln!("skipped: cannot start the maker here");
            return;
        };
        // The maker is done long before this (it needs well under a millisecond).
        std::thread::sleep(std::time::Duration::from_millis(200));
        if ahead.shared.result.load(Ordering::Acquire) < 0 {
            eprintln!("skipped: no network namespace could be made here");
            return;
        }
        let before = count();
        drop(ahead);
        assert_eq!(count(), before - 1);
    }
}
