//! A small blocking client for the control socket (the CLI needs no async runtime).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::protocol::RpcError;

/// How long [`Client::call_again_if_lost`] tries to reach the daemon again: an upgrade in
/// place or a supervised restart takes a second or two.
const RECONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(30);
/// The pause between two tries.
const RECONNECT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no sidejob daemon is listening on {path} ({reason}); start one with `sidejob serve`, join the group of a shared daemon's socket (/run/sidejob/sidejob.sock, used when you run none), or point --socket / SIDEJOB_SOCKET at the one you run")]
    NoDaemon { path: PathBuf, reason: &'static str },
    #[error("cannot connect to the daemon at {path}: permission denied; the socket is mode 0660, so run as its owner or a member of its group")]
    Denied { path: PathBuf },
    #[error("cannot connect to the daemon at {path}: {reason}")]
    Connect { path: PathBuf, reason: String },
    #[error("the connection to the daemon failed: {0}")]
    Io(String),
    #[error("the daemon closed the connection")]
    Closed,
    #[error("the daemon sent something that is not JSON-RPC: {0}")]
    Protocol(String),
    #[error("{}", rpc_line(.0))]
    Rpc(RpcError),
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> ClientError {
        ClientError::Io(e.to_string())
    }
}

impl ClientError {
    /// The connection was lost (or could not be made) as it is while the daemon restarts or
    /// re-executes itself in place: worth connecting again.
    fn is_lost_connection(&self) -> bool {
        matches!(
            self,
            ClientError::Closed | ClientError::Io(_) | ClientError::NoDaemon { .. }
        )
    }

    /// The daemon's error kind (`not_found`, `invalid_state`, ...), when it answered one.
    pub fn kind(&self) -> Option<&str> {
        match self {
            ClientError::Rpc(e) => e.kind(),
            _ => None,
        }
    }
}

/// An error reply as one line: the message, its kind (what scripts match on), then the
/// daemon's hint after a semicolon.
fn rpc_line(e: &RpcError) -> String {
    let mut line = match e.kind() {
        Some(kind) => format!("{} ({kind})", e.message),
        None => e.message.clone(),
    };
    if let Some(hint) = e
        .data
        .as_ref()
        .and_then(|d| d.get("hint"))
        .and_then(Value::as_str)
    {
        line.push_str("; ");
        line.push_str(hint);
    }
    line
}

pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    pushes: std::collections::VecDeque<Value>,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ClientError::NoDaemon {
                path: path.into(),
                reason: "no socket there",
            },
            std::io::ErrorKind::ConnectionRefused => ClientError::NoDaemon {
                path: path.into(),
                reason: "the socket is left over from a daemon that stopped",
            },
            std::io::ErrorKind::PermissionDenied => ClientError::Denied { path: path.into() },
            _ => ClientError::Connect {
                path: path.into(),
                reason: e.to_string(),
            },
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

    /// How long a read (a reply, [`Client::next_push`]) may wait; `None`: for ever.
    pub(crate) fn set_read_timeout(&self, t: Option<std::time::Duration>) -> std::io::Result<()> {
        self.reader.get_ref().set_read_timeout(t)
    }

    /// Sends one request and waits for its reply.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.send(method, params)?;
        self.reply(id)
    }

    /// [`Client::call`] for a request that may be sent twice (`task.wait`, `task.get`,
    /// `task.output`: reads): when the connection is lost, as it is while the daemon
    /// upgrades in place or restarts, it connects to `socket` again (for up to
    /// [`RECONNECT_FOR`]) and sends the request once more. Pushes are not carried over.
    pub(crate) fn call_again_if_lost(
        &mut self,
        socket: &Path,
        method: &str,
        params: Value,
    ) -> Result<Value, ClientError> {
        let mut lost = match self.call(method, params.clone()) {
            Err(e) if e.is_lost_connection() => e,
            other => return other,
        };
        let deadline = std::time::Instant::now() + RECONNECT_FOR;
        loop {
            if std::time::Instant::now() >= deadline {
                return Err(lost);
            }
            std::thread::sleep(RECONNECT_PAUSE);
            match Client::connect(socket).and_then(|mut c| {
                let got = c.call(method, params.clone());
                *self = c;
                got
            }) {
                Err(e) if e.is_lost_connection() => lost = e,
                other => return other,
            }
        }
    }

    /// Sends one request (the daemon has it once this returns); [`Client::reply`] reads the
    /// answer.
    pub(crate) fn send(&mut self, method: &str, params: Value) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        Ok(id)
    }

    /// The reply to request `id` (pushes that come first are kept for [`Client::next_push`]).
    pub(crate) fn reply(&mut self, id: u64) -> Result<Value, ClientError> {
        loop {
            let mut buf = String::new();
            if self.reader.read_line(&mut buf)? == 0 {
                return Err(ClientError::Closed);
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

impl Client {
    /// The full id of the task `given` names: a whole id, or a prefix that starts exactly
    /// one task id among those the daemon lists for the caller (as docker and git accept).
    pub fn resolve_task(&mut self, given: &str) -> Result<String, anyhow::Error> {
        let wanted = given.trim().to_ascii_uppercase();
        if crate::ids::is_valid_task_id(&wanted) {
            return Ok(wanted);
        }
        if wanted.is_empty() {
            anyhow::bail!(
                "give a task id (or the first characters of one); `sidejob tasks` lists them"
            );
        }
        let mut matches: Vec<String> = Vec::new();
        for t in self.all_tasks(None)? {
            if t.task_id.starts_with(&wanted) && !matches.contains(&t.task_id) {
                matches.push(t.task_id);
            }
        }
        match matches.len() {
            1 => Ok(matches.remove(0)),
            0 => anyhow::bail!(
                "no task id starts with {given}; `sidejob tasks --all` lists the tasks you can see"
            ),
            n => anyhow::bail!(
                "{given} is ambiguous: {n} task ids start with it ({}); give more characters",
                matches
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if n > 3 { ", …" } else { "" }
            ),
        }
    }

    /// Every task the daemon lists in the caller's sessions (or in `session`).
    pub fn all_tasks(
        &mut self,
        session: Option<&str>,
    ) -> Result<Vec<crate::protocol::Task>, anyhow::Error> {
        let sessions: Vec<String> = match session {
            Some(s) => vec![s.to_owned()],
            None => {
                let list: crate::protocol::SessionListResult =
                    serde_json::from_value(self.call("session.list", json!({}))?)?;
                list.sessions.into_iter().map(|s| s.session_id).collect()
            }
        };
        let mut all = Vec::new();
        for s in sessions {
            let r: crate::protocol::TaskListResult =
                serde_json::from_value(self.call("task.list", json!({ "session_id": s }))?)?;
            all.extend(r.tasks);
        }
        Ok(all)
    }
}
