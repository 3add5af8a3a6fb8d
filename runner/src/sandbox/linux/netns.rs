//! The relay of a run with a network allow-list: it listens on the run's loopback —
//! 127.0.0.1:3128 for the proxy (HTTP and SOCKS5) and 127.0.0.1:53 for DNS (UDP and TCP) — and
//! hands every connection and query to the egress proxy (`crate::egress`) over the run's Unix
//! socket, passing the accepted socket itself (`SCM_RIGHTS`). It reads nothing a client sends
//! (a UDP query is forwarded as it came), so it decides nothing and has nothing to get wrong:
//! the proxy decides.
//!
//! The run's init binds the sockets ([`bind`]) right after it made the network namespace (a
//! socket stays in the namespace it was made in, whoever holds it) and sends them to the
//! supervisor ([`send`]), before any of the command's code runs. The supervisor's poll loop
//! is the relay ([`Relay`]): no process of its own to start or to stop, and it outlives a
//! daemon restart as the run does, connecting to the socket's host path each time, so a
//! restarted daemon that binds the socket again is reached again. The socket is not in the
//! run's view at all: the only way the command has to the proxy is the loopback ports.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::socket::{self as ns, MsgFlags, SockFlag, SockType, UnixAddr};

use crate::egress::{kind, DNS_PORT, PROXY_PORT};

/// The relay's listening sockets, bound inside the run's network namespace.
pub(crate) struct Listeners {
    proxy: TcpListener,
    dns_tcp: TcpListener,
    dns_udp: UdpSocket,
}

/// Binds the proxy and DNS ports on the run's loopback (which must be up). Runs in init,
/// which still has the privilege port 53 needs.
pub(crate) fn bind() -> io::Result<Listeners> {
    let lo = |port| SocketAddr::from(([127, 0, 0, 1], port));
    Ok(Listeners {
        proxy: TcpListener::bind(lo(PROXY_PORT))?,
        dns_tcp: TcpListener::bind(lo(DNS_PORT))?,
        dns_udp: UdpSocket::bind(lo(DNS_PORT))?,
    })
}

/// A channel from init to the supervisor for the listening sockets (made before the fork).
pub(crate) fn channel() -> io::Result<(OwnedFd, OwnedFd)> {
    ns::socketpair(
        ns::AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)
}

/// Init's side: sends the listening sockets to the supervisor (they close here).
pub(crate) fn send(l: Listeners, chan: &OwnedFd) -> io::Result<()> {
    let fds = [
        l.proxy.as_raw_fd(),
        l.dns_tcp.as_raw_fd(),
        l.dns_udp.as_raw_fd(),
    ];
    let cmsg = [ns::ControlMessage::ScmRights(&fds)];
    ns::sendmsg::<UnixAddr>(
        chan.as_raw_fd(),
        &[IoSlice::new(b"L")],
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map(drop)
    .map_err(io::Error::from)
}

/// The supervisor's side: the listening sockets, served from its poll loop.
pub(crate) struct Relay {
    proxy: TcpListener,
    dns_tcp: TcpListener,
    dns_udp: UdpSocket,
    /// The proxy's socket, by its host path.
    socket: PathBuf,
    buf: Vec<u8>,
}

impl Relay {
    /// Receives the listening sockets init sent over `chan` (readable by now).
    pub(crate) fn receive(chan: &OwnedFd, socket: &Path) -> io::Result<Relay> {
        let mut byte = [0u8; 1];
        let (n, fds) = crate::sys::fdpass::recv_with_fds(chan.as_fd(), &mut byte)?;
        let [proxy, dns_tcp, dns_udp]: [OwnedFd; 3] = fds
            .try_into()
            .map_err(|_| io::Error::other("init did not send the relay's three sockets"))?;
        if n != 1 || byte[0] != b'L' {
            return Err(io::Error::other("an unexpected message from init"));
        }
        let relay = Relay {
            proxy: TcpListener::from(proxy),
            dns_tcp: TcpListener::from(dns_tcp),
            dns_udp: UdpSocket::from(dns_udp),
            socket: socket.to_path_buf(),
            buf: vec![0u8; crate::egress::dns::MAX_MESSAGE],
        };
        relay.proxy.set_nonblocking(true)?;
        relay.dns_tcp.set_nonblocking(true)?;
        relay.dns_udp.set_nonblocking(true)?;
        Ok(relay)
    }

    /// The descriptors to poll for readability, in the order [`Relay::ready`] takes them.
    pub(crate) fn fds(&self) -> [BorrowedFd<'_>; 3] {
        [
            self.proxy.as_fd(),
            self.dns_tcp.as_fd(),
            self.dns_udp.as_fd(),
        ]
    }

    /// Hands over what is waiting on the ready sockets. Never blocks: a connection or query
    /// that cannot be handed over at once (no daemon, a full backlog) is closed or dropped —
    /// the run's network fails closed, never open.
    pub(crate) fn ready(&mut self, ready: [bool; 3]) {
        // Bounded per wake-up, like the output, so a flood cannot starve the rest of the loop.
        const BATCH: usize = 64;
        if ready[0] {
            for _ in 0..BATCH {
                let Ok((s, _)) = self.proxy.accept() else {
                    break;
                };
                let _ = hand_over(&self.socket, &[kind::PROXY], s.as_fd());
            }
        }
        if ready[1] {
            for _ in 0..BATCH {
                let Ok((s, _)) = self.dns_tcp.accept() else {
                    break;
                };
                let _ = hand_over(&self.socket, &[kind::DNS_TCP], s.as_fd());
            }
        }
        if ready[2] {
            for _ in 0..BATCH {
                let Ok((n, from)) = self.dns_udp.recv_from(&mut self.buf) else {
                    break;
                };
                let mut msg = vec![kind::DNS_UDP];
                match from {
                    SocketAddr::V4(a) => {
                        msg.push(4);
                        msg.extend_from_slice(&a.ip().octets());
                    }
                    SocketAddr::V6(a) => {
                        msg.push(6);
                        msg.extend_from_slice(&a.ip().octets());
                    }
                }
                msg.extend_from_slice(&from.port().to_be_bytes());
                msg.extend_from_slice(&self.buf[..n]);
                let _ = hand_over(&self.socket, &msg, self.dns_udp.as_fd());
            }
        }
    }
}

/// One connection to the proxy's socket: `msg` with `fd` attached, then the end of the
/// stream. Non-blocking throughout; a message that does not go out whole is abandoned.
fn hand_over(socket: &Path, msg: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let s = ns::socket(
        ns::AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    ns::connect(s.as_raw_fd(), &UnixAddr::new(socket)?)?;
    let sent = crate::sys::fdpass::send_with_fd(s.as_fd(), msg, fd)?;
    if sent != msg.len() {
        return Err(io::Error::other(
            "the proxy's socket took part of a message",
        ));
    }
    ns::shutdown(s.as_raw_fd(), ns::Shutdown::Write).map_err(io::Error::from)
}
