//! The relay of a run with a network allow-list: a small single-threaded process inside the
//! run's network namespace that listens on the run's loopback — 127.0.0.1:3128 for the proxy
//! (HTTP and SOCKS5) and 127.0.0.1:53 for DNS (UDP and TCP) — and hands every connection and
//! query to the egress proxy outside (`crate::egress`) over the run's Unix socket, passing the
//! accepted socket itself (`SCM_RIGHTS`). It reads nothing a client sends, so it decides
//! nothing and has nothing to get wrong: the proxy decides.
//!
//! The run's init binds the sockets ([`bind`]) right after it made the network namespace (port
//! 53 needs its privilege) and forks the relay ([`spawn`]) once the view is in place, so the
//! socket path it connects to is the one in the view. The relay then drops to the run's user
//! with no capabilities and `no_new_privs`: it holds nothing the command does not (the command
//! could connect to the same socket), so the command gains nothing by reaching it.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::egress::{kind, DNS_PORT, PROXY_PORT};
use crate::sys::{self, sandbox as ssys, Fork};

/// The relay's listening sockets, bound inside the run's network namespace.
pub struct Listeners {
    proxy: TcpListener,
    dns_tcp: TcpListener,
    dns_udp: UdpSocket,
}

/// Binds the proxy and DNS ports on the run's loopback (which must be up).
pub fn bind() -> io::Result<Listeners> {
    let lo = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let l = Listeners {
        proxy: TcpListener::bind(lo(PROXY_PORT))?,
        dns_tcp: TcpListener::bind(lo(DNS_PORT))?,
        dns_udp: UdpSocket::bind(lo(DNS_PORT))?,
    };
    l.proxy.set_nonblocking(true)?;
    l.dns_tcp.set_nonblocking(true)?;
    l.dns_udp.set_nonblocking(true)?;
    Ok(l)
}

/// Who the relay runs as.
pub struct RelayUser {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub last_cap: u32,
}

/// Forks the relay; returns its pid. `socket` is the proxy's socket as the view shows it.
pub fn spawn(listeners: Listeners, socket: &Path, user: &RelayUser) -> io::Result<i32> {
    match sys::fork()? {
        Fork::Parent(pid) => Ok(pid), // the listeners close here: only the relay keeps them
        Fork::Child => {
            if let Err(e) = confine(&listeners, user) {
                let _ = writeln!(io::stderr(), "sidejob relay: {e}");
                sys::exit_now(1);
            }
            relay(&listeners, socket)
        }
    }
}

/// The relay keeps only its sockets (not init's pipes: the supervisor must see them close
/// when the run ends) and gives up every privilege.
fn confine(l: &Listeners, user: &RelayUser) -> io::Result<()> {
    sys::set_parent_death_signal(libc::SIGKILL)?;
    let keep = [
        l.proxy.as_raw_fd(),
        l.dns_tcp.as_raw_fd(),
        l.dns_udp.as_raw_fd(),
    ];
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open {
        if fd > 2 && !keep.contains(&fd) {
            // Init's descriptors (pipes to the supervisor); this process never uses them and
            // ends with exit_now, so nothing closes them again.
            let _ = nix::unistd::close(fd);
        }
    }
    ssys::drop_bounding_and_ambient_caps(user.last_cap)?;
    if let (Some(uid), Some(gid)) = (user.uid, user.gid) {
        sys::drop_to(uid, gid)?;
    }
    ssys::clear_caps()?;
    ssys::set_no_new_privs()
}

fn relay(l: &Listeners, socket: &Path) -> ! {
    let socket: PathBuf = socket.to_path_buf();
    let fds = [
        l.proxy.as_raw_fd(),
        l.dns_tcp.as_raw_fd(),
        l.dns_udp.as_raw_fd(),
    ];
    let mut buf = vec![0u8; crate::egress::dns::MAX_MESSAGE];
    loop {
        let ready = match sys::poll_readable(&fds, -1) {
            Ok(r) => r,
            Err(_) => sys::exit_now(1),
        };
        if ready[0] {
            accept_all(&l.proxy, kind::PROXY, &socket);
        }
        if ready[1] {
            accept_all(&l.dns_tcp, kind::DNS_TCP, &socket);
        }
        if ready[2] {
            while let Ok((n, from)) = l.dns_udp.recv_from(&mut buf) {
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
                msg.extend_from_slice(&buf[..n]);
                // A query that cannot be handed over is dropped: the client retries or fails.
                let _ = hand_over(&socket, &msg, l.dns_udp.as_fd());
            }
        }
    }
}

/// Accepts every pending connection and hands each to the proxy; one that cannot be handed
/// over is closed (fail closed: never connected any other way).
fn accept_all(listener: &TcpListener, kind: u8, socket: &Path) {
    while let Ok((stream, _)) = listener.accept() {
        let _ = hand_over(socket, &[kind], stream.as_fd());
    }
}

fn hand_over(socket: &Path, msg: &[u8], fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    let mut s = UnixStream::connect(socket)?;
    let sent = crate::sys::fdpass::send_with_fd(s.as_fd(), msg, fd)?;
    s.write_all(&msg[sent..])?;
    s.shutdown(std::net::Shutdown::Write)
}
