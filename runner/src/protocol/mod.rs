//! Wire types of the host protocol (docs/protocol.md): JSON-RPC 2.0 envelopes, error codes, and the
//! `*Params` / `*Result` shapes of every method. No I/O lives here.

mod input;
mod types;

pub(crate) use input::*;
pub(crate) use types::*;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version `initialize` reports.
pub(crate) const PROTOCOL_VERSION: u32 = 1;

/// The longest line (request or reply) a peer may send, newline excluded.
pub(crate) const MAX_LINE_BYTES: usize = 1024 * 1024;

/// Every method a host may call, in the order `docs/protocol.md` documents them.
pub(crate) const METHODS: &[&str] = &[
    "initialize",
    "session.open",
    "session.close",
    "session.status",
    "session.list",
    "tool.list",
    "tool.call",
    "task.list",
    "task.get",
    "task.output",
    "task.wait",
    "task.cancel",
    "task.message",
    "task.answer",
    "task.background",
    "events.subscribe",
    "inbox.list",
    "inbox.ack",
    "schedule.create",
    "schedule.list",
    "schedule.cancel",
    "daemon.status",
];

/// An incoming request. `id` is absent for notifications, which get no reply.
#[derive(Debug, Deserialize)]
pub(crate) struct Request {
    pub jsonrpc: Option<String>,
    #[serde(default)]
    pub id: Option<Value>,
    pub method: Option<Value>,
    #[serde(default)]
    pub params: Option<Value>,
}

/// A reply: exactly one of `result` or `error`.
#[derive(Debug, Serialize)]
pub(crate) struct Response {
    pub jsonrpc: &'static str,
    pub id: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl Response {
    pub(crate) fn ok(id: Value, result: Value) -> Response {
        Response {
            jsonrpc: "2.0",
            id,
            result: Some(result),
            error: None,
        }
    }

    pub(crate) fn err(id: Value, error: RpcError) -> Response {
        Response {
            jsonrpc: "2.0",
            id,
            result: None,
            error: Some(error),
        }
    }
}

/// A JSON-RPC error object. Application errors carry `data.kind`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// The error kinds of docs/protocol.md, with their codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    ParseError,
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    NotFound,
    PermissionDenied,
    SandboxUnavailable,
    LimitExceeded,
    InvalidState,
    Internal,
}

impl ErrorKind {
    pub fn code(self) -> i64 {
        match self {
            ErrorKind::ParseError => -32700,
            ErrorKind::InvalidRequest => -32600,
            ErrorKind::MethodNotFound => -32601,
            ErrorKind::InvalidParams => -32602,
            ErrorKind::Internal => -32603,
            ErrorKind::NotFound => -32001,
            ErrorKind::PermissionDenied => -32002,
            ErrorKind::SandboxUnavailable => -32003,
            ErrorKind::LimitExceeded => -32004,
            ErrorKind::InvalidState => -32005,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::ParseError => "parse_error",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::MethodNotFound => "method_not_found",
            ErrorKind::InvalidParams => "invalid_params",
            ErrorKind::Internal => "internal",
            ErrorKind::NotFound => "not_found",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::SandboxUnavailable => "sandbox_unavailable",
            ErrorKind::LimitExceeded => "limit_exceeded",
            ErrorKind::InvalidState => "invalid_state",
        }
    }
}

impl RpcError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> RpcError {
        RpcError {
            code: kind.code(),
            message: message.into(),
            data: Some(serde_json::json!({ "kind": kind.name() })),
        }
    }

    /// Adds a `hint` (how to fix it) to `data`.
    pub fn with_hint(mut self, hint: impl Into<String>) -> RpcError {
        if let Some(Value::Object(map)) = self.data.as_mut() {
            map.insert("hint".into(), Value::String(hint.into()));
        }
        self
    }

    /// The `data.kind` of this error, if it has one.
    pub fn kind(&self) -> Option<&str> {
        self.data.as_ref()?.get("kind")?.as_str()
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.kind().unwrap_or("error"))?;
        if let Some(hint) = self
            .data
            .as_ref()
            .and_then(|d| d.get("hint"))
            .and_then(Value::as_str)
        {
            write!(f, "\nhint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RpcError {}

#[cfg(test)]
mod doc_check;
