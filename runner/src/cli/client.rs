//! A small blocking client for the control socket (the CLI needs no async runtime).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::protocol::RpcError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("connection to the daemon failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon sent something that is not JSON-RPC: {0}")]
    Protocol(String),
    #[error("{0}")]
    Rpc(RpcError),
}

pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    pushes: std::collections::VecDeque<Value>,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.into(),
            source,
        })?;
        Ok(Client {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            next_id: 1,
            pushes: Default::default(),
        })
    }

    /// The next server push (`task.updated`, `notification`, `events.gap`); `None` when the
    /// daemon closes the connection.
    pub fn next_push(&mut self) -> Result<Option<Value>, ClientError> {
        if let Some(p) = self.pushes.pop_front() {
            return Ok(Some(p));
        }
        let mut buf = String::new();
        if self.reader.read_line(&mut buf)? == 0 {
            return Ok(None);
        }
        serde_json::from_str(&buf)
            .map(Some)
            .map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Sends one request and waits for its reply.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        loop {
            let mut buf = String::new();
            if self.reader.read_line(&mut buf)? == 0 {
                return Err(ClientError::Protocol(
                    "the daemon closed the connection".into(),
                ));
            }
            let reply: Value =
                serde_json::from_str(&buf).map_err(|e| ClientError::Protocol(e.to_string()))?;
            if reply.get("id") != Some(&json!(id)) {
                if reply.get("method").is_some() {
                    self.pushes.push_back(reply);
                }
                continue;
            }
            if let Some(err) = reply.get("error") {
                let err: RpcError = serde_json::from_value(err.clone())
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                return Err(ClientError::Rpc(err));
            }
            return reply
                .get("result")
                .cloned()
                .ok_or_else(|| ClientError::Protocol("reply has neither result nor error".into()));
        }
    }
}
