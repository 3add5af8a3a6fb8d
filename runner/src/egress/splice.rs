//! The proxy's tunnels: once a connection is decided, bytes move between the two sockets with
//! `splice(2)` through a pipe, inside the kernel, instead of being copied through the proxy's
//! memory. A large download through the proxy then costs little more than one straight from
//! the server (see `docs/network.md`, Costs).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::fcntl::{splice, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How much one `splice` call may move, and the pipe's size.
const CHUNK: usize = 1 << 20;

/// Once one side has ended, how long the other may stay quiet before the tunnel is closed.
const HALF_CLOSED_IDLE: Duration = Duration::from_secs(10);

/// Moves bytes both ways until the tunnel ends, which is when:
/// - both sides are done, or one fails (a reset, a broken pipe);
/// - one side is done and the other has sent nothing for [`HALF_CLOSED_IDLE`] (a client
///   that went away, in front of a server that keeps its end open, is not waited on for
///   ever; a half-close, `shutdown(SHUT_WR)`, still gets its answer);
/// - neither side has sent anything for `idle`.
pub(crate) async fn tunnel(a: &TcpStream, b: &TcpStream, idle: Duration) -> io::Result<()> {
    let activity = Activity::new();
    let ab = pump(a, b, &activity);
    let ba = pump(b, a, &activity);
    tokio::pin!(ab, ba);
    let rest = tokio::select! {
        r = &mut ab => {
            r?;
            ba
        }
        r = &mut ba => {
            r?;
            ab
        }
        () = activity.quiet_for(idle) => return Ok(()),
    };
    activity.touch();
    tokio::select! {
        r = rest => r,
        () = activity.quiet_for(idle.min(HALF_CLOSED_IDLE)) => Ok(()),
    }
}

/// When bytes last moved through a tunnel, either way.
struct Activity {
    start: Instant,
    /// Milliseconds after `start`.
    last: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing has moved for `quiet`.
    async fn quiet_for(&self, quiet: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last.load(Ordering::Relaxed));
            let end = last + quiet;
            if Instant::now() >= end {
                return;
            }
            tokio::time::sleep_until(end).await;
        }
    }
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
async fn pump(from: &TcpStream, to: &TcpStream, activity: &Activity) -> io::Result<()> {
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
                    Ok(Some(n)) => {
                        in_pipe += n;
                        activity.touch();
                    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A client and a server, and the proxy's two sockets between them.
    async fn tunnel_ends() -> (TcpStream, TcpStream, TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (proxy_client, _) = l.accept().await.unwrap();
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_upstream = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        (client, proxy_client, proxy_upstream, server)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_gone_in_front_of_a_server_that_keeps_its_end_open_ends_the_tunnel() {
        let (mut client, pc, pu, mut server) = tunnel_ends().await;
        let t0 = Instant::now();
        let tunnel = tokio::spawn(async move { tunnel(&pc, &pu, Duration::from_secs(3600)).await });
        // Control: bytes pass both ways while both sides are there.
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        server.write_all(b"pong").await.unwrap();
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
        // The client goes away; the server keeps its end open and says nothing.
        drop(client);
        tunnel.await.unwrap().unwrap();
        assert!(t0.elapsed() <= HALF_CLOSED_IDLE + Duration::from_secs(1));
        // The proxy's sockets are closed: the server reads the end.
        assert_eq!(server.read(&mut got).await.unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_where_nothing_moves_is_closed_after_the_idle_timeout() {
        let (mut client, pc, pu, mut server) = tunnel_ends().await;
        let t0 = Instant::now();
        let tunnel = tokio::spawn(async move { tunnel(&pc, &pu, Duration::from_secs(60)).await });
        tunnel.await.unwrap().unwrap();
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_secs(60) && waited < Duration::from_secs(61));
        let mut buf = [0u8; 1];
        assert_eq!(server.read(&mut buf).await.unwrap(), 0);
        assert_eq!(client.read(&mut buf).await.unwrap(), 0);
    }
}
