//! Connections (docs/protocol.md, "Framing"): the control socket's (peer credentials, the
//! user's shares, pushes) and a bridge's (its scope, replies only). Both are read as lines of
//! at most `MAX_LINE_BYTES`, each answered by the RPC core (`rpc.rs`) in a task of its own,
//! and written by one writer that hands back any inline result it could not write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};
use tracing::{debug, debug_span, warn, Instrument};

use super::rpc::{self, Outgoing};
use super::scope::Caller;
use super::{shares, Conn, Daemon, Peer};
use crate::bridge::Scope;
use crate::executor::Executor;
use crate::protocol::{ErrorKind, RpcError, MAX_LINE_BYTES};
use crate::wake::PushChannel;

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// How many bytes of waiting pushes one write may carry.
const PUSH_BATCH_BYTES: usize = 256 * 1024;

/// How a connection's lines are read.
struct Reading {
    /// The user's share (control socket): the bytes of an unfinished line count against it.
    share: Option<shares::Connection>,
    /// A begun line must be finished within this (control socket).
    line_timeout: Option<Duration>,
}

impl Reading {
    fn hold(&mut self, bytes: usize) -> bool {
        self.share.as_mut().is_none_or(|s| s.hold(bytes))
    }
}

/// What a connection pushes besides replies (control socket): `task.updated`,
/// `notification`, `tools.changed`, and `events.gap` once when its queue overflowed.
struct Pushes {
    lines: mpsc::Receiver<String>,
    gap: watch::Receiver<Option<i64>>,
}

/// A connection to the control socket.
pub(super) async fn control(d: Arc<Daemon>, stream: UnixStream) {
    let Some(creds) = peer_creds(&stream) else {
        return;
    };
    let (push, lines) = mpsc::channel::<String>(d.executor.config().push_queue.max(1));
    let (gap_tx, gap) = watch::channel(None);
    let conn_id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let peer = Peer {
        uid: creds.uid,
        gid: creds.gid,
        groups: creds.groups,
        conn: Some(Conn {
            id: conn_id,
            channel: PushChannel { push, gap: gap_tx },
            tools_watched: Default::default(),
        }),
    };
    // Debug-level: see the request span (rpc.rs) for why, and for the uid at info level.
    let span = debug_span!("connection", uid = peer.uid, conn = conn_id);
    async move {
        debug!("connected");
        let cfg = d.executor.config();
        let share = match d
            .shares
            .connect(peer.uid, &cfg.per_user, cfg.max_connections)
        {
            Ok(share) => share,
            Err(why) => {
                let err = RpcError::new(ErrorKind::LimitExceeded, why.to_string());
                let mut line = Outgoing::error(Value::Null, err).line;
                line.push('\n');
                let mut stream = stream;
                let _ = stream.write_all(line.as_bytes()).await;
                return;
            }
        };
        let reading = Reading {
            share: Some(share),
            line_timeout: Some(Duration::from_millis(cfg.per_user.line_timeout_ms.max(1))),
        };
        let pushes = Pushes { lines, gap };
        serve(&d, Caller::Host(peer), stream, reading, Some(pushes)).await;
        debug!("disconnected");
    }
    .instrument(span)
    .await
}

/// A connection to a run's bridge: the same core, the bridge's scope.
pub(super) async fn bridge(d: Arc<Daemon>, scope: Arc<Scope>, stream: UnixStream) {
    let reading = Reading {
        share: None,
        line_timeout: None,
    };
    serve(&d, Caller::Bridge(scope), stream, reading, None).await;
}

/// Who is on the other end of the control socket (`SO_PEERCRED`, `SO_PEERGROUPS`).
fn peer_creds(stream: &UnixStream) -> Option<crate::sys::dirfd::Creds> {
    match stream.peer_cred() {
        // An unprivileged daemon can only act as its own user: root connecting to it is
        // served as that user (everything it does runs with that user's authority anyway).
        Ok(c) if c.uid() == 0 && crate::sys::getuid() != 0 => Some(crate::sys::dirfd::Creds::own()),
        Ok(c) => Some(crate::sys::dirfd::Creds {
            uid: c.uid(),
            gid: c.gid(),
            groups: {
                use std::os::fd::AsFd;
                crate::sys::peer_groups(stream.as_fd()).unwrap_or_else(|_| vec![c.gid()])
            },
        }),
        Err(e) => {
            warn!("cannot read peer credentials: {e}");
            None
        }
    }
}

/// Reads requests until the peer hangs up or a line is refused (which closes the
/// connection); each is answered in a task of its own, so a blocking call does not hold up
/// the next line.
async fn serve(
    d: &Arc<Daemon>,
    caller: Caller,
    stream: UnixStream,
    mut reading: Reading,
    pushes: Option<Pushes>,
) {
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
    let writer = tokio::spawn(write_loop(wr, rx, pushes, d.executor.clone()).in_current_span());
    let (closed_tx, closed_rx) = watch::channel(false);
    // Nothing is buffered while the connection is idle; a long line grows `line` only while
    // it is read.
    let mut reader = LineReader {
        rd,
        pending: Vec::new(),
    };
    let mut line = Vec::new();
    loop {
        match read_line(&mut reader, &mut line, &mut reading).await {
            Ok(Line::Complete) if line.iter().all(u8::is_ascii_whitespace) => {}
            Ok(Line::Complete) => {
                let text = std::mem::take(&mut line);
                answer(d, &caller, &tx, &closed_rx, text);
            }
            Ok(Line::Eof) => break,
            Ok(refused) => {
                let _ = tx.send(Outgoing::error(Value::Null, refusal(refused, &reading)));
                break;
            }
            Err(e) => {
                debug!("read failed: {e}");
                break;
            }
        }
    }
    let _ = closed_tx.send(true);
    if let Caller::Host(Peer {
        conn: Some(conn), ..
    }) = &caller
    {
        d.hub.unsubscribe(conn.id).await;
    }
    drop(caller);
    drop(tx);
    let _ = writer.await;
}

/// Answers one request line in a task of its own. `closed` tells the handler when the
/// connection goes away (a blocked `tool.call` then moves to the background).
fn answer(
    d: &Arc<Daemon>,
    caller: &Caller,
    tx: &mpsc::UnboundedSender<Outgoing>,
    closed: &watch::Receiver<bool>,
    text: Vec<u8>,
) {
    let (d, caller, tx, mut closed) = (d.clone(), caller.clone(), tx.clone(), closed.clone());
    tokio::spawn(
        async move {
            let closed = async move {
                let _ = closed.wait_for(|c| *c).await;
            };
            if let Some(out) = rpc::handle_line(&d, &caller, &text, closed).await {
                if let Err(mpsc::error::SendError(out)) = tx.send(out) {
                    if let Some(task) = out.inline_task {
                        d.executor.undeliver(&task);
                    }
                }
            }
        }
        .in_current_span(),
    );
}

/// The error a refused line is answered with before the connection closes.
fn refusal(line: Line, reading: &Reading) -> RpcError {
    let why = match (line, &reading.share, reading.line_timeout) {
        (Line::TimedOut, _, Some(timeout)) => format!(
            "a request line was not finished within {} ms (per_user.line_timeout_ms); the connection is closed",
            timeout.as_millis()
        ),
        (Line::OverShare, Some(share), _) => share.over_message(),
        (Line::TooLong | Line::TimedOut | Line::OverShare | Line::Complete | Line::Eof, ..) => {
            let msg = format!("line exceeds {MAX_LINE_BYTES} bytes; the connection is closed");
            return RpcError::new(ErrorKind::InvalidRequest, msg);
        }
    };
    RpcError::new(ErrorKind::LimitExceeded, why)
}

/// Writes replies and pushes to the connection. Replies come first; pushes wait in a bounded
/// queue (see `wake`); a gap is announced once. A reply that cannot be written hands its
/// inline result back (`Executor::undeliver`), so a wait or a wake delivers it.
async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    pushes: Option<Pushes>,
    exec: Arc<Executor>,
) {
    let (mut lines, mut gap) = match pushes {
        Some(p) => (Some(p.lines), Some(p.gap)),
        None => (None, None),
    };
    let mut broken = false;
    loop {
        let (line, inline_task) = tokio::select! {
            biased;
            out = rx.recv() => match out {
                Some(out) => (out.line, out.inline_task),
                None => break,
            },
            Some(push) = next_push(&mut lines) => (push, None),
            Some(from_seq) = next_gap(&mut gap) => {
                let params = serde_json::json!(crate::protocol::EventsGapNotification { from_seq });
                (serde_json::json!({"jsonrpc": "2.0", "method": "events.gap", "params": params}).to_string(), None)
            }
        };
        if !broken {
            let mut bytes = line.into_bytes();
            bytes.push(b'\n');
            // Pushes waiting behind this one go out in the same write: a subscriber under
            // load gets many lines per system call instead of one.
            if inline_task.is_none() {
                if let Some(lines) = lines.as_mut() {
                    while bytes.len() < PUSH_BATCH_BYTES {
                        let Ok(more) = lines.try_recv() else { break };
                        bytes.extend_from_slice(more.as_bytes());
                        bytes.push(b'\n');
                    }
                }
            }
            if wr.write_all(&bytes).await.is_ok() {
                continue;
            }
            broken = true;
        }
        // The caller is gone: whatever this reply carried inline must be delivered another way.
        if let Some(task) = inline_task {
            exec.undeliver(&task);
        }
    }
}

/// The next push line; never, for a connection without pushes (or once they end).
async fn next_push(lines: &mut Option<mpsc::Receiver<String>>) -> Option<String> {
    match lines {
        Some(lines) => lines.recv().await,
        None => std::future::pending().await,
    }
}

/// The sequence number a gap starts at, once the connection's push queue overflowed.
async fn next_gap(gap: &mut Option<watch::Receiver<Option<i64>>>) -> Option<i64> {
    let Some(gap) = gap else {
        return std::future::pending().await;
    };
    loop {
        if gap.changed().await.is_err() {
            return std::future::pending().await;
        }
        if let Some(from_seq) = *gap.borrow_and_update() {
            return Some(from_seq);
        }
    }
}

enum Line {
    Complete,
    TooLong,
    /// The user's unfinished lines would take more than `per_user.buffered_bytes`.
    OverShare,
    /// A line was begun and not finished within `per_user.line_timeout_ms`.
    TimedOut,
    Eof,
}

/// A connection's read side. Bytes read past a line wait in `pending`; an idle connection
/// holds no buffer at all (thousands of them would otherwise hold a read buffer each, and
/// leave the heap scattered when they close).
struct LineReader {
    rd: OwnedReadHalf,
    pending: Vec<u8>,
}

impl LineReader {
    /// Waits until bytes are pending; `false` at the end of the stream.
    async fn fill(&mut self) -> std::io::Result<bool> {
        while self.pending.is_empty() {
            self.rd.readable().await?;
            // On the stack, not in the connection's task: it is not held across the await.
            let mut chunk = [0u8; 8 * 1024];
            match self.rd.try_read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn consume(&mut self, n: usize) {
        if n >= self.pending.len() {
            self.pending = Vec::new();
        } else {
            self.pending.drain(..n);
        }
    }
}

/// Reads one newline-terminated line of at most [`MAX_LINE_BYTES`] into `buf`. The bytes of a
/// line not yet complete count against the user's share, and a line must be finished within
/// the timeout of its first byte.
async fn read_line(
    r: &mut LineReader,
    buf: &mut Vec<u8>,
    reading: &mut Reading,
) -> std::io::Result<Line> {
    buf.clear();
    let _ = reading.hold(0);
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let more = match deadline {
            None => r.fill().await?,
            Some(at) => match tokio::time::timeout_at(at, r.fill()).await {
                Ok(read) => read?,
                Err(_) => {
                    let _ = reading.hold(0);
                    buf.clear();
                    return Ok(Line::TimedOut);
                }
            },
        };
        if !more {
            return Ok(if buf.is_empty() {
                Line::Eof
            } else {
                Line::Complete
            });
        }
        let avail = &r.pending;
        if let Some(i) = avail.iter().position(|&b| b == b'\n') {
            let too_long = buf.len() + i > MAX_LINE_BYTES;
            if !too_long {
                buf.extend_from_slice(&avail[..i]);
            }
            r.consume(i + 1);
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Complete
            });
        }
        let n = avail.len();
        if buf.len() + n > MAX_LINE_BYTES {
            r.consume(n);
            return Ok(Line::TooLong);
        }
        if !reading.hold(buf.len() + n) {
            let _ = reading.hold(0);
            buf.clear();
            return Ok(Line::OverShare);
        }
        buf.extend_from_slice(avail);
        r.consume(n);
        if let Some(timeout) = reading.line_timeout {
            deadline.get_or_insert_with(|| tokio::time::Instant::now() + timeout);
        }
    }
}
