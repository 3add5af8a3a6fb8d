//! The proxy's tunnels: once a connection is decided, bytes move between the two sockets with
//! `splice(2)` through a pipe, inside the kernel, instead of being copied through the proxy's
//! memory. A large download through the proxy then costs little more than one straight from
//! the server (see `docs/network.md`, Costs).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{splice, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// How much one `splice` call may move, and the pipe's size.
const CHUNK: usize = 1 << 20;

/// Moves bytes both ways until both sides are done (or one fails).
pub(crate) async fn tunnel(a: &TcpStream, b: &TcpStream) -> io::Result<()> {
    tokio::try_join!(pump(a, b), pump(b, a)).map(drop)
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::OFlag;
    let (r, w) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
    // A bigger pipe means fewer calls; the default (64 KiB) still works if this is refused.
    let _ = nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(CHUNK as i32));
    Ok((r, w))
}

/// One direction: `from` → pipe → `to`, then `to`'s write side is shut when `from` ends.
/// Filling and draining overlap: the pipe is filled whenever it has room and `from` has
/// data, and drained whenever it holds data and `to` has room, so neither socket waits on
/// the other.
async fn pump(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    let (pr, pw) = pipe()?;
    let capacity = nix::fcntl::fcntl(&pw, nix::fcntl::FcntlArg::F_GETPIPE_SZ)
        .map(|n| n as usize)
        .unwrap_or(64 * 1024);
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    let mut in_pipe = 0usize;
    let mut ended = false;
    // EAGAIN from filling means the socket is empty or the pipe is full (it counts page
    // slots, not bytes); with data in the pipe it may be the latter, so the socket keeps its
    // readiness and the pipe is drained before trying again.
    let mut maybe_full = false;
    loop {
        if ended && in_pipe == 0 {
            // The end of `from`, and all of it passed on: tell `to` there is no more.
            let _ = nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write);
            return Ok(());
        }
        let can_fill = !ended && !maybe_full && in_pipe < capacity;
        let can_drain = in_pipe > 0;
        tokio::select! {
            r = from.readable(), if can_fill => {
                r?;
                let filled = from.try_io(Interest::READABLE, || {
                    match splice(from, None, &pw, None, capacity - in_pipe, flags) {
                        Ok(n) => Ok(Some(n)),
                        Err(nix::errno::Errno::EAGAIN) if in_pipe > 0 => Ok(None),
                        Err(e) => Err(io::Error::from(e)),
                    }
                });
                match filled {
                    Ok(Some(0)) => ended = true,
                    Ok(Some(n)) => in_pipe += n,
                    Ok(None) => maybe_full = true,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            r = to.writable(), if can_drain => {
                r?;
                match to.try_io(Interest::WRITABLE, || {
                    splice(&pr, None, to, None, in_pipe, flags).map_err(io::Error::from)
                }) {
                    Ok(n) => {
                        in_pipe -= n;
                        maybe_full = false;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
}
