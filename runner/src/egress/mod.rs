//! The egress proxy: how a run with a network allow-list reaches the hosts it may reach, and
//! only those (see `docs/network.md`).
//!
//! The run has its own network namespace with only `lo` up. Its init binds 127.0.0.1:
//! [`PROXY_PORT`] (HTTP and SOCKS5) and 127.0.0.1:53 (DNS, UDP and TCP) there and hands the
//! listening sockets to the run's supervisor, whose poll loop is the relay
//! (`sandbox::linux::netns`): every connection it accepts — the socket itself, passed as a
//! descriptor — goes to this proxy over the run's Unix socket, which is not in the run's view.
//! The proxy, outside the sandbox (in the daemon, or in a process `sidejob exec` forks),
//! decides on the name the client asked for ([`policy`]), resolves it on the host, checks the
//! addresses, connects, and then only moves bytes ([`splice`]). Refusals are answered clearly
//! (HTTP 403, a SOCKS refusal, DNS `REFUSED`) and recorded ([`record`]).
//!
//! The relay reads nothing a client sends and decides nothing; everything is decided here, so
//! a relay the command builds for itself, in front of the loopback ports, gains nothing.

pub(crate) mod dns;
pub(crate) mod http;
pub(crate) mod policy;
pub(crate) mod proxy;
pub(crate) mod record;
pub(crate) mod share;
pub(crate) mod socks;
pub(crate) mod splice;
pub(crate) mod standalone;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info};

use policy::Refusal;
pub(crate) use policy::{Policy, PolicyWidening};
use record::{NetworkViolation, Recorder, Via};

/// The proxy's port on the run's loopback (HTTP `CONNECT`, absolute-form HTTP and SOCKS5).
pub(crate) const PROXY_PORT: u16 = 3128;
/// The DNS responder's port on the run's loopback (UDP and TCP).
pub(crate) const DNS_PORT: u16 = 53;
/// The socket's name in the egress directory.
pub(crate) const SOCKET: &str = "sock";

/// The first byte of each connection from the relay says what the passed socket is.
pub(crate) mod kind {
    /// A TCP connection to the proxy port.
    pub(crate) const PROXY: u8 = b'P';
    /// A TCP connection to the DNS port (length-prefixed messages).
    pub(crate) const DNS_TCP: u8 = b'T';
    /// One UDP query: the relay's UDP socket is passed, followed by the client's address
    /// (family 4 or 6, the address, the port) and the query.
    pub(crate) const DNS_UDP: u8 = b'U';
}

/// Connections one run may have open through the proxy at once; more are closed at once.
const MAX_CONNECTIONS: usize = 256;
/// How long resolving a name on the host, or connecting to it, may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Addresses the DNS responder remembers handing out (see [`Run::remember`]).
const MAX_ANSWERED: usize = 4096;

/// The egress part of a launch plan: the policy, and where the run's socket lives on the
/// host (the supervisor relays to it; the run's view does not hold it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EgressPlan {
    pub policy: Policy,
    /// The host directory holding the socket; filled in by whoever serves the proxy (the
    /// daemon, or `sidejob exec`) before the plan is written.
    pub socket_dir: PathBuf,
}

/// The proxy settings a run with an allow-list gets, in both cases (tools read one or the
/// other), overriding anything the caller passed.
pub(crate) fn proxy_env() -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{PROXY_PORT}");
    let socks = format!("socks5h://127.0.0.1:{PROXY_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1".to_owned();
    let mut env = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
        ("NO_PROXY", &no_proxy),
    ] {
        env.push((name.to_owned(), value.clone()));
        env.push((name.to_ascii_lowercase(), value.clone()));
    }
    env
}

/// How long the proxy waits for its clients (`[egress]` in the daemon's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// For a client's whole request head (HTTP, or the SOCKS5 handshake), and for the
    /// relay's first message.
    pub head: Duration,
    /// For a tunnel in which neither side sends anything.
    pub idle: Duration,
}

impl Timeouts {
    /// `[egress] head_timeout_ms` and `idle_timeout_ms` (at least a millisecond each).
    pub(crate) fn from_ms(head_ms: u64, idle_ms: u64) -> Timeouts {
        Timeouts {
            head: Duration::from_millis(head_ms.max(1)),
            idle: Duration::from_millis(idle_ms.max(1)),
        }
    }
}

/// `[egress]`'s defaults: 30 s for a request head, 10 min for an idle tunnel.
pub(crate) const DEFAULT_HEAD_TIMEOUT_MS: u64 = 30_000;
pub(crate) const DEFAULT_IDLE_TIMEOUT_MS: u64 = 600_000;

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts::from_ms(DEFAULT_HEAD_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS)
    }
}

/// The resolver configuration in the run's view.
pub(crate) const RESOLV_CONF: &str = "# sidejob: the run's DNS responder answers the names its network.allow list allows\nnameserver 127.0.0.1\noptions timeout:2 attempts:2\n";

/// One run's proxy state: its policy, its refusals and the addresses its DNS responder gave
/// out. Each run has its own, so a daemon serving many runs keeps their decisions apart.
pub(crate) struct Run {
    pub task_id: String,
    pub policy: Policy,
    recorder: Recorder,
    answered: Mutex<HashMap<IpAddr, String>>,
    slots: Arc<Semaphore>,
    pub timeouts: Timeouts,
    /// The daemon's count of proxied connections and the uid this run's count against.
    share: Option<(Arc<share::Shares>, u32)>,
}

/// What one admitted connection holds until it ends: a slot of its run and, in the daemon,
/// its owner's share.
struct Admitted {
    _slot: OwnedSemaphorePermit,
    _share: Option<share::Ticket>,
}

/// Why a connection was not made.
#[derive(Debug)]
pub(crate) enum Refused {
    Policy(Refusal),
    Connect(io::Error),
}

impl Run {
    /// `record_path`: the run's `network.jsonl` in its private directory.
    pub(crate) fn new(
        task_id: &str,
        policy: Policy,
        record_path: &std::path::Path,
    ) -> io::Result<Run> {
        Ok(Run {
            task_id: task_id.to_owned(),
            policy,
            recorder: Recorder::open(record_path)?,
            answered: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            timeouts: Timeouts::default(),
            share: None,
        })
    }

    pub(crate) fn with_timeouts(mut self, timeouts: Timeouts) -> Run {
        self.timeouts = timeouts;
        self
    }

    /// Counts the run's connections against `uid`'s share of the daemon's.
    pub(crate) fn with_share(mut self, shares: Arc<share::Shares>, uid: u32) -> Run {
        self.share = Some((shares, uid));
        self
    }

    /// A slot for one more connection, or `None` (and it is closed) when the run has
    /// [`MAX_CONNECTIONS`] open or its owner their whole share.
    fn admit(&self) -> Option<Admitted> {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            debug!(task_id = %self.task_id, "too many connections; closing one");
            return None;
        };
        let share = match &self.share {
            Some((shares, uid)) => match shares.take(*uid) {
                Ok(ticket) => Some(ticket),
                Err(full) => {
                    debug!(task_id = %self.task_id, "closing a connection: {full}");
                    return None;
                }
            },
            None => None,
        };
        Some(Admitted {
            _slot: slot,
            _share: share,
        })
    }

    /// Records a refusal as a violation (unless it is only a name that does not resolve)
    /// and logs it: at `info` the first time, at `debug` when it repeats, so a run that keeps
    /// knocking fills neither the record nor the log. Called before the client is answered.
    pub(crate) fn refuse(&self, host: &str, port: Option<u16>, refusal: Refusal, via: Via) {
        let first = !refusal.is_violation()
            || self
                .recorder
                .record(&NetworkViolation::new(host, port, refusal, via));
        if first {
            info!(task_id = %self.task_id, host, port, reason = refusal.code(), ?via, "egress refused");
        } else {
            debug!(task_id = %self.task_id, host, port, reason = refusal.code(), ?via, "egress refused again");
        }
    }

    /// Remembers that the DNS responder answered `name` with `ip`, so a client that resolved
    /// first and then asks the proxy for the address (SOCKS5 without remote names, `CONNECT
    /// 1.2.3.4:443`) is decided on the name.
    pub(crate) fn remember(&self, ip: IpAddr, name: &str) {
        let mut map = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_ANSWERED && !map.contains_key(&ip) {
            return;
        }
        map.insert(ip, name.to_owned());
    }

    fn answered_name(&self, ip: IpAddr) -> Option<String> {
        self.answered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ip)
            .cloned()
    }

    /// Decides on `raw_host:port` and connects: the name is checked, resolved on the host
    /// (static `hosts` first), every address checked, and the first allowed one that answers
    /// is used — the address that was checked is the one connected to. Returns the
    /// connection and the host as normalised. A policy refusal is recorded here.
    pub(crate) async fn open(
        &self,
        raw_host: &str,
        port: u16,
        via: Via,
    ) -> Result<(tokio::net::TcpStream, String), Refused> {
        let refuse = |host: &str, r: Refusal| {
            self.refuse(host, Some(port), r, via);
            Refused::Policy(r)
        };
        let host = match policy::normalize(raw_host) {
            Ok(h) => h,
            Err(r) => return Err(refuse(raw_host, r)),
        };
        let shown = host.to_string();
        let addrs: Vec<IpAddr> = match &host {
            policy::Host::Ip(ip) => match self.policy.check_target(&host, port) {
                Ok(()) => vec![*ip],
                Err(Refusal::IpLiteral) => match self.answered_name(*ip) {
                    // An address this run's DNS responder gave for an allowed name.
                    Some(name) => {
                        if let Err(r) = self.policy.check_name(&name, Some(port)) {
                            return Err(refuse(&format!("{shown} ({name})"), r));
                        }
                        if let Err(r) = self.policy.check_addr(*ip, Some(port)) {
                            return Err(refuse(&format!("{shown} ({name})"), r));
                        }
                        vec![*ip]
                    }
                    None => return Err(refuse(&shown, Refusal::IpLiteral)),
                },
                Err(r) => return Err(refuse(&shown, r)),
            },
            policy::Host::Name(name) => {
                if let Err(r) = self.policy.check_target(&host, port) {
                    return Err(refuse(&shown, r));
                }
                let resolved = match self.resolve(name).await {
                    Ok(a) if !a.is_empty() => a,
                    _ => return Err(refuse(&shown, Refusal::Unresolved)),
                };
                self.policy
                    .usable_addrs(resolved, Some(port))
                    .map_err(|r| refuse(&shown, r.unwrap_or(Refusal::Unresolved)))?
            }
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for ip in addrs {
            match tokio::time::timeout(
                CONNECT_TIMEOUT,
                tokio::net::TcpStream::connect(SocketAddr::new(ip, port)),
            )
            .await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, shown));
                }
                Ok(Err(e)) => last = e,
                Err(_) => last = io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
            }
        }
        debug!(task_id = %self.task_id, host = %shown, port, "connect failed: {last}");
        Err(Refused::Connect(last))
    }

    /// The addresses of an allowed name: the profile's static `hosts`, else the host's
    /// resolver. Only ever called for names the policy allows, so nothing else is looked up.
    pub(crate) async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        if let Some(ip) = self.policy.static_host(name) {
            return Ok(vec![policy::canonical(ip)]);
        }
        let found = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((name, 0)))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "lookup timed out"))??;
        let mut out: Vec<IpAddr> = Vec::new();
        for a in found {
            let ip = policy::canonical(a.ip());
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
        Ok(out)
    }
}

/// Serves a run's socket until `stop` resolves: every connection from the relay is handled
/// on its own task, within the run's share of connections. The tasks are the run's: when
/// `stop` resolves (the run settled), every connection still open is ended and its sockets
/// closed, whatever its peers do.
pub(crate) async fn serve(
    listener: UnixListener,
    run: Arc<Run>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Some(admitted) = run.admit() else {
                        continue;
                    };
                    let run = run.clone();
                    connections.spawn(async move {
                        if let Err(e) = from_relay(stream, &run).await {
                            debug!(task_id = %run.task_id, "egress connection: {e}");
                        }
                        drop(admitted);
                    });
                }
                Err(e) => {
                    tracing::warn!(task_id = %run.task_id, "egress accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = &mut stop => break,
        }
    }
    if !connections.is_empty() {
        debug!(task_id = %run.task_id, open = connections.len(), "the run is over; closing its connections");
    }
    connections.shutdown().await;
}

/// One connection from the relay: the first message carries the kind byte and the socket.
/// A peer that sends nothing (or, for a UDP query, never finishes) is dropped after the head
/// timeout, so it cannot hold one of the run's connections.
async fn from_relay(stream: UnixStream, run: &Arc<Run>) -> io::Result<()> {
    let head_timeout = run.timeouts.head;
    let mut buf = vec![0u8; 1 + 1 + 16 + 2 + dns::MAX_MESSAGE];
    let first = tokio::time::timeout(head_timeout, first_message(&stream, &mut buf))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "nothing from the relay"))?;
    let (n, mut fds) = first?;
    if n == 0 || fds.len() != 1 {
        return Err(io::Error::other(format!(
            "expected one kind byte and one descriptor, got {n} bytes and {} descriptors",
            fds.len()
        )));
    }
    let fd = fds.remove(0);
    match buf[0] {
        // The relay's connection has done its work once the socket is here: not held open
        // beside it.
        kind::PROXY => {
            drop(stream);
            proxy::handle(stream_socket(fd)?, run.clone()).await
        }
        kind::DNS_TCP => {
            drop(stream);
            dns::serve_tcp(stream_socket(fd)?, run.clone()).await
        }
        kind::DNS_UDP => {
            let mut data = buf[1..n].to_vec();
            let mut rest = stream;
            let limit = (1 + 16 + 2 + dns::MAX_MESSAGE) as u64;
            tokio::time::timeout(head_timeout, (&mut rest).take(limit).read_to_end(&mut data))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "an unfinished query"))??;
            udp_query(fd, &data, run).await
        }
        other => Err(io::Error::other(format!("unknown kind {other:#x}"))),
    }
}

async fn first_message(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || {
            crate::sys::fdpass::recv_with_fds(stream.as_fd(), buf)
        }) {
            Ok(got) => return Ok(got),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A passed descriptor that must be a TCP socket.
fn stream_socket(fd: OwnedFd) -> io::Result<tokio::net::TcpStream> {
    check_inet(&fd, nix::sys::socket::SockType::Stream)?;
    let s = std::net::TcpStream::from(fd);
    s.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(s)
}

/// Refuses anything but an IPv4 or IPv6 socket of the given type: whatever connects to the
/// socket cannot make the proxy use a file, a pipe or a Unix socket.
fn check_inet(fd: &OwnedFd, want: nix::sys::socket::SockType) -> io::Result<()> {
    use nix::sys::socket::{
        getsockname, getsockopt, sockopt, AddressFamily, SockaddrLike, SockaddrStorage,
    };
    use std::os::fd::AsRawFd;
    let not_it =
        || io::Error::other("the passed descriptor is not an inet socket of the expected type");
    let ty = getsockopt(fd, sockopt::SockType).map_err(|_| not_it())?;
    let addr: SockaddrStorage = getsockname(fd.as_raw_fd()).map_err(|_| not_it())?;
    match (ty == want, addr.family()) {
        (true, Some(AddressFamily::Inet | AddressFamily::Inet6)) => Ok(()),
        _ => Err(not_it()),
    }
}

/// Answers one UDP query through the relay's socket, to the client's address.
async fn udp_query(fd: OwnedFd, data: &[u8], run: &Arc<Run>) -> io::Result<()> {
    use nix::sys::socket::{sendto, MsgFlags, SockaddrIn, SockaddrIn6};
    use std::os::fd::AsRawFd;
    check_inet(&fd, nix::sys::socket::SockType::Datagram)?;
    let (client, query) = match data.first() {
        Some(4) if data.len() >= 7 => {
            let ip = std::net::Ipv4Addr::new(data[1], data[2], data[3], data[4]);
            let port = u16::from_be_bytes([data[5], data[6]]);
            (SocketAddr::new(IpAddr::V4(ip), port), &data[7..])
        }
        Some(6) if data.len() >= 19 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&data[1..17]);
            let port = u16::from_be_bytes([data[17], data[18]]);
            (SocketAddr::new(IpAddr::V6(o.into()), port), &data[19..])
        }
        _ => return Err(io::Error::other("a UDP query without its client address")),
    };
    let Some(reply) = dns::answer(run, query, dns::Transport::Udp).await else {
        return Ok(());
    };
    let sent = match client {
        SocketAddr::V4(a) => sendto(
            fd.as_raw_fd(),
            &reply,
            &SockaddrIn::from(a),
            MsgFlags::MSG_DONTWAIT,
        ),
        SocketAddr::V6(a) => sendto(
            fd.as_raw_fd(),
            &reply,
            &SockaddrIn6::from(a),
            MsgFlags::MSG_DONTWAIT,
        ),
    };
    sent.map(drop).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A run, and the directory of its violation record (gone when dropped).
    fn run() -> (Arc<Run>, crate::scratch::ScratchDir) {
        let dir = crate::scratch::ScratchDir::new("egress");
        let run = Run::new("t", Policy::default(), &dir.path().join("network.jsonl")).unwrap();
        (Arc::new(run), dir)
    }

    #[tokio::test]
    async fn only_inet_sockets_of_the_expected_type_are_used() {
        // A Unix socket, a pipe and a file, passed as a proxy connection: refused, unused.
        let (unix, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let (pipe_r, _pipe_w) = crate::sys::pipe().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        for fd in [OwnedFd::from(unix), pipe_r, OwnedFd::from(file)] {
            let (a, b) = UnixStream::pair().unwrap();
            crate::sys::fdpass::send_with_fd(a.as_fd(), &[kind::PROXY], fd.as_fd()).unwrap();
            let e = from_relay(b, &run().0).await.unwrap_err().to_string();
            assert!(e.contains("not an inet socket"), "{e}");
        }
        // A UDP socket is not a proxy connection, nor a TCP one a UDP query.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(check_inet(&OwnedFd::from(udp), nix::sys::socket::SockType::Stream).is_err());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let tcp = OwnedFd::from(tcp);
        assert!(check_inet(&tcp, nix::sys::socket::SockType::Datagram).is_err());
        // Control: a TCP socket is one.
        check_inet(&tcp, nix::sys::socket::SockType::Stream).unwrap();
        // No descriptor, or two: refused.
        let (a, b) = UnixStream::pair().unwrap();
        use tokio::io::AsyncWriteExt;
        let mut a = a;
        a.write_all(&[kind::PROXY]).await.unwrap();
        drop(a);
        assert!(from_relay(b, &run().0).await.is_err());
    }
}
