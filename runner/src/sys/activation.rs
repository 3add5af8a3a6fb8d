//! Socket activation: taking over the listening socket a service manager passed us.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;

use super::cvt;

fn sockopt(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of an int and a socklen_t, which is what
    // these SOL_SOCKET options return; the kernel rejects a descriptor that is not a socket.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(value)
}

/// Takes ownership of inherited descriptor `fd` as a listening Unix stream socket. Refuses
/// (and leaves `fd` alone) if it is anything else, so a wrong unit file is an error, not a
/// daemon that accepts on a stray descriptor.
pub(crate) fn inherited_unix_listener(fd: RawFd) -> io::Result<UnixListener> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_owned());
    if sockopt(fd, libc::SO_DOMAIN)? != libc::AF_UNIX {
        return Err(invalid("not a Unix-domain socket"));
    }
    if sockopt(fd, libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err(invalid("not a stream socket"));
    }
    if sockopt(fd, libc::SO_ACCEPTCONN)? == 0 {
        return Err(invalid("not listening"));
    }
    // SAFETY: the service manager handed this descriptor to this process (LISTEN_PID names
    // us), it was checked above to be a listening socket, and nothing else in the process
    // takes ownership of it: the daemon calls this once, at start-up.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(UnixListener::from(owned))
}
