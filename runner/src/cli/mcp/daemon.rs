//! An async client of the control socket for `sidejob mcp`: requests from concurrent MCP
//! calls share one connection (matched by id), and the daemon's pushes go to one channel.
//! [`Link`] is that connection with the session opened on it, made again when it is lost;
//! a foreground call gets a connection of its own ([`Daemon::connect`]), so that closing it
//! is how the call is cancelled.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::{ErrorKind, RpcError};

/// The daemon reads at most this much per request line (and closes a connection that sends
/// more), so a longer request is refused here instead.
const MAX_LINE: usize = 1 << 20;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, RpcError>>>>>;

pub(super) struct Daemon {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
    /// Set once the daemon's end is gone: the next request goes on a new connection.
    closed: Arc<AtomicBool>,
    reader: tokio::task::AbortHandle,
}

impl Drop for Daemon {
    /// Closes both halves of the connection: for a foreground call, that is its cancel.
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn lost() -> RpcError {
    RpcError::new(
        ErrorKind::Internal,
        "the connection to the sidejob daemon was lost; the next call connects again",
    )
}

impl Daemon {
    /// Connects; pushes (`task.updated`, `notification`, `tools.changed`, ...) go to `pushes`.
    pub(super) async fn connect(
        socket: &Path,
        pushes: mpsc::UnboundedSender<Value>,
    ) -> std::io::Result<Arc<Daemon>> {
        let stream = UnixStream::connect(socket).await?;
        let (rd, wr) = stream.into_split();
        let pending: Pending = Default::default();
        let closed = Arc::new(AtomicBool::new(false));
        let reader = tokio::spawn(read_loop(rd, pending.clone(), closed.clone(), pushes));
        Ok(Arc::new(Daemon {
            writer: tokio::sync::Mutex::new(wr),
            pending,
            next_id: AtomicU64::new(1),
            closed,
            reader: reader.abort_handle(),
        }))
    }

    /// Connects for requests only: pushes are dropped.
    pub(super) async fn connect_quiet(socket: &Path) -> std::io::Result<Arc<Daemon>> {
        Daemon::connect(socket, mpsc::unbounded_channel().0).await
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Sends one request and waits for its reply. A request longer than the daemon takes is
    /// refused without being sent, so the connection (and every other call on it) stays.
    pub(super) async fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        line.push('\n');
        if line.len() > MAX_LINE {
            return Err(RpcError::new(
                ErrorKind::InvalidParams,
                format!(
                    "this call's arguments are {} KiB; sidejob takes at most {} KiB per call",
                    line.len() / 1024,
                    MAX_LINE / 1024
                ),
            )
            .with_hint("write large inputs to a file in the workspace and pass its path"));
        }
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let written = self.writer.lock().await.write_all(line.as_bytes()).await;
        if written.is_err() {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            self.closed.store(true, Ordering::Release);
            return Err(lost());
        }
        rx.await.unwrap_or_else(|_| Err(lost()))
    }
}

async fn read_loop(
    rd: tokio::net::unix::OwnedReadHalf,
    pending: Pending,
    closed: Arc<AtomicBool>,
    pushes: mpsc::UnboundedSender<Value>,
) {
    let mut lines = BufReader::new(rd).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        match msg.get("id").and_then(Value::as_u64) {
            Some(id) if msg.get("method").is_none() => {
                let reply = match msg.get("error") {
                    Some(e) => Err(serde_json::from_value(e.clone()).unwrap_or_else(|_| lost())),
                    None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
                };
                let waiter = pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                if let Some(w) = waiter {
                    let _ = w.send(reply);
                }
            }
            _ => {
                let _ = pushes.send(msg);
            }
        }
    }
    // The daemon is gone: fail every request still waiting.
    closed.store(true, Ordering::Release);
    pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// The connection `sidejob mcp` keeps, with its session opened and subscribed to. When the
/// daemon goes away (a restart, an upgrade), the next request connects again, reopens the
/// session and subscribes again: unacked completions are pushed again on that subscribe.
pub(super) struct Link {
    pub socket: PathBuf,
    pub session: String,
    pub adopt: bool,
    workspace: PathBuf,
    pushes: mpsc::UnboundedSender<Value>,
    current: tokio::sync::Mutex<Arc<Daemon>>,
}

impl Link {
    pub(super) async fn open(
        daemon: Arc<Daemon>,
        socket: &Path,
        session: String,
        adopt: bool,
        pushes: mpsc::UnboundedSender<Value>,
    ) -> Result<Link, String> {
        let workspace = std::env::current_dir()
            .map_err(|e| format!("cannot read the current directory: {e}"))?;
        let link = Link {
            socket: socket.to_owned(),
            session,
            adopt,
            workspace,
            pushes,
            current: tokio::sync::Mutex::new(daemon.clone()),
        };
        link.open_session(&daemon)
            .await
            .map_err(super::calls::rpc_error)?;
        Ok(link)
    }

    async fn open_session(&self, d: &Daemon) -> Result<(), RpcError> {
        let session = &self.session;
        let mut p = json!({"session_id": session, "workspace": self.workspace});
        if self.adopt {
            p["adopt"] = json!(true);
        }
        d.call("session.open", p).await.map_err(|e| {
            let message = format!("cannot open session {session}: {}", e.message);
            RpcError { message, ..e }
        })?;
        d.call("events.subscribe", json!({ "session_ids": [session] }))
            .await
            .map_err(|e| {
                let message = format!("cannot subscribe to session {session}: {}", e.message);
                RpcError { message, ..e }
            })?;
        Ok(())
    }

    /// The live connection, made again (session reopened, subscribed) if it was lost.
    pub(super) async fn get(&self) -> Result<Arc<Daemon>, RpcError> {
        let mut current = self.current.lock().await;
        if current.is_closed() {
            let d = Daemon::connect(&self.socket, self.pushes.clone())
                .await
                .map_err(|e| {
                    RpcError::new(
                        ErrorKind::Internal,
                        format!(
                            "the sidejob daemon on {} is not reachable ({e}); start it again with `sidejob serve`",
                            self.socket.display()
                        ),
                    )
                })?;
            self.open_session(&d).await?;
            *current = d;
        }
        Ok(current.clone())
    }

    pub(super) async fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.get().await?.call(method, params).await
    }
}
