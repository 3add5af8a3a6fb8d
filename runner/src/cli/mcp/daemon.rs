//! An async client of the control socket for `sidejob mcp`: requests from concurrent MCP
//! calls share one connection (matched by id), and the daemon's pushes go to one channel.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use crate::protocol::RpcError;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, RpcError>>>>>;

pub(super) struct Daemon {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
}

fn lost() -> RpcError {
    RpcError::new(
        crate::protocol::ErrorKind::Internal,
        "the connection to the sidejob daemon was lost; restart the MCP server once the daemon is back",
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
        let d = Arc::new(Daemon {
            writer: tokio::sync::Mutex::new(wr),
            pending: pending.clone(),
            next_id: AtomicU64::new(1),
        });
        tokio::spawn(async move {
            let mut lines = BufReader::new(rd).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                match msg.get("id").and_then(Value::as_u64) {
                    Some(id) if msg.get("method").is_none() => {
                        let reply = match msg.get("error") {
                            Some(e) => {
                                Err(serde_json::from_value(e.clone()).unwrap_or_else(|_| lost()))
                            }
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
            pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
        });
        Ok(d)
    }

    /// Sends one request and waits for its reply.
    pub(super) async fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let mut line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        line.push('\n');
        let written = self.writer.lock().await.write_all(line.as_bytes()).await;
        if written.is_err() {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            return Err(lost());
        }
        rx.await.unwrap_or_else(|_| Err(lost()))
    }
}
