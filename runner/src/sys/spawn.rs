//! Starting a process from the (multi-threaded) daemon: `posix_spawn`, which never runs our
//! code in the child, with exactly the descriptors we name at exactly the numbers we name.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Frees a `posix_spawn` attribute or file-action object on every path out.
struct Guard<T> {
    obj: T,
    destroy: unsafe extern "C" fn(*mut T) -> libc::c_int,
}

impl<T> Drop for Guard<T> {
    fn drop(&mut self) {
        // SAFETY: `obj` was initialised by the matching `*_init` call before the guard was
        // made, and is destroyed exactly once, here.
        unsafe { (self.destroy)(&mut self.obj) };
    }
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "argument holds a NUL byte"))
}

/// Starts `program` with `args` and an empty environment, in a process group of its own,
/// with default signal dispositions and an empty signal mask. `fds[i]` becomes descriptor
/// `i` of the child (0 = stdin, …); nothing else is inherited (everything this process opens
/// is close-on-exec, and the child closes what is above its own descriptors first thing).
/// Returns the child's pid; the caller reaps it.
pub fn spawn(program: &Path, args: &[&OsStr], fds: &[BorrowedFd<'_>]) -> io::Result<i32> {
    let prog = cstring(program.as_os_str())?;
    let mut argv_c = vec![prog.clone()];
    for a in args {
        argv_c.push(cstring(a)?);
    }
    let mut argv: Vec<*mut libc::c_char> = argv_c.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let envp: [*mut libc::c_char; 1] = [std::ptr::null_mut()];

    // The sources are first copied above every target number, so one dup2 can never clobber
    // a source another still needs (the daemon's own descriptor 3 may be a source, say).
    let high: Vec<OwnedFd> = fds
        .iter()
        .map(|fd| {
            // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor (>= the given minimum) for an
            // open one we borrow; we own the result.
            let r = unsafe {
                libc::fcntl(
                    fd.as_raw_fd(),
                    libc::F_DUPFD_CLOEXEC,
                    fds.len() as libc::c_int + 3,
                )
            };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                // SAFETY: fcntl just returned this new descriptor; nothing else owns it.
                Ok(unsafe { OwnedFd::from_raw_fd(r) })
            }
        })
        .collect::<io::Result<_>>()?;

    let mut actions = Guard {
        // SAFETY: a plain C struct; zeroed storage is what the *_init function initialises.
        obj: unsafe { std::mem::zeroed::<libc::posix_spawn_file_actions_t>() },
        destroy: libc::posix_spawn_file_actions_destroy,
    };
    // SAFETY: initialises the object in place; it is destroyed by the guard.
    check(unsafe { libc::posix_spawn_file_actions_init(&mut actions.obj) })?;
    for (target, src) in high.iter().enumerate() {
        // SAFETY: the object is initialised; both are plain descriptor numbers (dup2 in the
        // child clears close-on-exec on the target).
        check(unsafe {
            libc::posix_spawn_file_actions_adddup2(
                &mut actions.obj,
                src.as_raw_fd(),
                target as RawFd,
            )
        })?;
    }

    let mut attr = Guard {
        // SAFETY: a plain C struct; zeroed storage is what the *_init function initialises.
        obj: unsafe { std::mem::zeroed::<libc::posix_spawnattr_t>() },
        destroy: libc::posix_spawnattr_destroy,
    };
    // SAFETY: initialises the object in place; it is destroyed by the guard.
    check(unsafe { libc::posix_spawnattr_init(&mut attr.obj) })?;
    // SAFETY: zeroed sigset_t storage initialised by sigemptyset/sigfillset before use.
    let (mut empty, mut all) = unsafe {
        (
            std::mem::zeroed::<libc::sigset_t>(),
            std::mem::zeroed::<libc::sigset_t>(),
        )
    };
    // SAFETY: the sets are valid storage; these only write within them.
    unsafe {
        libc::sigemptyset(&mut empty);
        libc::sigfillset(&mut all);
    }
    let flags =
        libc::POSIX_SPAWN_SETPGROUP | libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
    // SAFETY: the attribute object is initialised; the sets are initialised and outlive the
    // calls (they are copied into the object).
    unsafe {
        check(libc::posix_spawnattr_setflags(
            &mut attr.obj,
            flags as libc::c_short,
        ))?;
        check(libc::posix_spawnattr_setpgroup(&mut attr.obj, 0))?;
        check(libc::posix_spawnattr_setsigmask(&mut attr.obj, &empty))?;
        check(libc::posix_spawnattr_setsigdefault(&mut attr.obj, &all))?;
    }

    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is valid for the call: the program and argv strings (and the
    // NULL-terminated arrays of pointers to them) live until after it returns, the
    // environment is an empty NULL-terminated array, and both objects are initialised.
    check(unsafe {
        libc::posix_spawn(
            &mut pid,
            prog.as_ptr(),
            &actions.obj,
            &attr.obj,
            argv.as_mut_ptr(),
            envp.as_ptr(),
        )
    })?;
    drop(high);
    Ok(pid)
}
