//! Passing descriptors over Unix sockets (`SCM_RIGHTS`): the run's network relay hands each
//! connection it accepts inside the run's network namespace to the egress proxy outside.
//! `nix` builds and parses the messages; the one `unsafe` here takes ownership of the
//! descriptors the kernel installed in this process.

use std::io;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};

/// The most descriptors one message may carry; more are closed by the kernel (`MSG_CTRUNC`).
pub(crate) const MAX_FDS: usize = 8;

/// Sends `data` with `fd` attached. Returns how many bytes of `data` were sent.
pub(crate) fn send_with_fd(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fd: BorrowedFd<'_>,
) -> io::Result<usize> {
    send_with_fds(sock, data, &[fd])
}

/// Sends `data` with every one of `fds` attached (at most [`MAX_FDS`]).
pub(crate) fn send_with_fds(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    socket::sendmsg::<UnixAddr>(
        sock.as_raw_fd(),
        &[IoSlice::new(data)],
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io::Error::from)
}

/// Sends `data` alone.
pub(crate) fn send(sock: BorrowedFd<'_>, data: &[u8]) -> io::Result<usize> {
    socket::send(sock.as_raw_fd(), data, MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)
}

/// Receives into `buf`, with any descriptors that came along (close-on-exec). `Ok((0, _))`
/// is the end of the stream.
pub(crate) fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: the kernel installed `fd` in this process for this message
                // (SCM_RIGHTS); nothing else knows of it, so taking ownership is sound and
                // it is closed exactly once, when the OwnedFd drops.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok((msg.bytes, fds))
}
