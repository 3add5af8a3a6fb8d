//! One client of the proxy port: SOCKS5 when the first byte says so, HTTP otherwise. The
//! request is parsed ([`super::socks`], [`super::http`]), decided and connected
//! ([`super::Run::open`]), answered, and from then on bytes are only copied.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::http::{self, HttpError, ProxyRequest};
use super::policy::Refusal;
use super::record::Via;
use super::socks::{self, SocksError};
use super::{Refused, Run};

pub(crate) async fn handle(mut client: TcpStream, run: Arc<Run>) -> io::Result<()> {
    let _ = client.set_nodelay(true);
    // One deadline for the whole head, however it is cut up: a client that trickles it
    // byte by byte cannot hold the connection longer than one that sends nothing.
    let deadline = Instant::now() + run.timeouts.head;
    let mut buf = Vec::with_capacity(4096);
    if read_more(&mut client, &mut buf, deadline).await? == 0 {
        return Ok(());
    }
    match buf[0] {
        socks::VERSION | 4 => socks5(client, buf, deadline, &run).await,
        _ => http_request(client, buf, deadline, &run).await,
    }
}

/// Reads what is available (at least one byte unless the stream ended), before the head's
/// deadline.
async fn read_more(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> io::Result<usize> {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout_at(deadline, client.read(&mut chunk))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no whole request in time"))??;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

async fn http_request(
    mut client: TcpStream,
    mut buf: Vec<u8>,
    deadline: Instant,
    run: &Run,
) -> io::Result<()> {
    let (req, head_len) = loop {
        match http::parse(&buf) {
            Ok(Some(parsed)) => break parsed,
            Ok(None) => {
                if read_more(&mut client, &mut buf, deadline).await? == 0 {
                    return Ok(());
                }
            }
            Err(e) => {
                let (target, is_connect) = http::refused_target(&buf);
                let via = if is_connect { Via::Connect } else { Via::Http };
                let target = target.unwrap_or_else(|| NO_TARGET.to_owned());
                run.refuse(&target, None, Refusal::BadRequest, via);
                return http_error(&mut client, &e).await;
            }
        }
    };
    let leftover = buf.split_off(head_len);
    let (host, port, via) = match &req {
        ProxyRequest::Connect { host, port } => (host.clone(), *port, Via::Connect),
        ProxyRequest::Forward { host, port, .. } => (host.clone(), *port, Via::Http),
    };
    let (mut upstream, shown) = match run.open(&host, port, via).await {
        Ok(c) => c,
        Err(Refused::Policy(r)) => {
            let status = match r {
                Refusal::Unresolved => "502 Bad Gateway",
                _ => "403 Forbidden",
            };
            let body = format!("sidejob: {host}:{port}: {}", r.text());
            return write_close(&mut client, &http::response(status, Some(r.code()), &body)).await;
        }
        Err(Refused::Connect(e)) => {
            let body = format!("sidejob: {host}:{port}: cannot connect: {e}");
            return write_close(&mut client, &http::response("502 Bad Gateway", None, &body)).await;
        }
    };
    match &req {
        ProxyRequest::Connect { .. } => client.write_all(http::CONNECTED).await?,
        ProxyRequest::Forward { .. } => {
            let host_header = if port == 80 {
                shown.clone()
            } else {
                format!("{shown}:{port}")
            };
            if let Some(head) = req.upstream_head(&host_header) {
                upstream.write_all(&head).await?;
            }
        }
    }
    upstream.write_all(&leftover).await?;
    tunnel(client, upstream, run).await
}

async fn http_error(client: &mut TcpStream, e: &HttpError) -> io::Result<()> {
    let body = format!("sidejob: {}", e.message());
    write_close(client, &http::response(e.status(), None, &body)).await
}

async fn socks5(
    mut client: TcpStream,
    mut buf: Vec<u8>,
    deadline: Instant,
    run: &Run,
) -> io::Result<()> {
    let greeting_len = loop {
        match socks::greeting(&buf) {
            Ok(Some(n)) => break n,
            Ok(None) => {
                if read_more(&mut client, &mut buf, deadline).await? == 0 {
                    return Ok(());
                }
            }
            Err(e) => {
                let (target, port, via) = match e {
                    SocksError::Version(4) => match socks::socks4_target(&buf) {
                        Some((host, port)) => (host, Some(port), Via::Socks4),
                        None => (NO_TARGET.to_owned(), None, Via::Socks4),
                    },
                    _ => (NO_TARGET.to_owned(), None, Via::Socks5),
                };
                run.refuse(&target, port, socks_refusal(e), via);
                return socks_error(&mut client, e).await;
            }
        }
    };
    client.write_all(&socks::METHOD_NO_AUTH).await?;
    buf.drain(..greeting_len);
    let (req, req_len) = loop {
        match socks::request(&buf) {
            Ok(Some(parsed)) => break parsed,
            Ok(None) => {
                if read_more(&mut client, &mut buf, deadline).await? == 0 {
                    return Ok(());
                }
            }
            Err(e) => {
                let (target, port) = match e {
                    SocksError::BadName => ("(invalid name)".to_owned(), None),
                    _ => socks::refused_target(&buf)
                        .map_or((NO_TARGET.to_owned(), None), |(h, p)| (h, Some(p))),
                };
                run.refuse(&target, port, socks_refusal(e), Via::Socks5);
                return socks_error(&mut client, e).await;
            }
        }
    };
    let leftover = buf.split_off(req_len);
    let host = match &req.dest {
        socks::Dest::Ip(ip) => ip.to_string(),
        socks::Dest::Name(n) => n.clone(),
    };
    let mut upstream = match run.open(&host, req.port, Via::Socks5).await {
        Ok((c, _)) => c,
        Err(Refused::Policy(r)) => {
            let code = match r {
                Refusal::Unresolved => socks::rep::HOST_UNREACHABLE,
                _ => socks::rep::NOT_ALLOWED,
            };
            return write_close(&mut client, &socks::reply(code)).await;
        }
        Err(Refused::Connect(_)) => {
            return write_close(&mut client, &socks::reply(socks::rep::CONNECTION_REFUSED)).await
        }
    };
    client
        .write_all(&socks::reply(socks::rep::SUCCEEDED))
        .await?;
    upstream.write_all(&leftover).await?;
    tunnel(client, upstream, run).await
}

/// The host recorded for a refusal whose request names none that can be read.
const NO_TARGET: &str = "(no target)";

/// The refusal a broken or unsupported SOCKS handshake is recorded as.
fn socks_refusal(e: SocksError) -> Refusal {
    match e {
        SocksError::Version(4) | SocksError::NoAcceptableMethod => Refusal::UnsupportedProtocol,
        SocksError::Command(_) => Refusal::UnsupportedCommand,
        SocksError::BadName => Refusal::BadName,
        SocksError::Version(_)
        | SocksError::Reserved
        | SocksError::AddressType(_)
        | SocksError::BadPort => Refusal::BadRequest,
    }
}

async fn socks_error(client: &mut TcpStream, e: SocksError) -> io::Result<()> {
    write_close(client, &e.reply()).await
}

async fn write_close(client: &mut TcpStream, bytes: &[u8]) -> io::Result<()> {
    client.write_all(bytes).await?;
    client.shutdown().await
}

/// Moves bytes both ways, in the kernel ([`super::splice`]), until the tunnel ends; both
/// sockets are closed then.
async fn tunnel(client: TcpStream, upstream: TcpStream, run: &Run) -> io::Result<()> {
    super::splice::tunnel(&client, &upstream, run.timeouts.idle).await
}
