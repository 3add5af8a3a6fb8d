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

/// Declares [`Method`]: each method's variant, its wire name and who is served it.
macro_rules! methods {
    ($($variant:ident = $name:literal: $host:literal, $bridge:literal;)*) => {
        /// A method of the protocol (docs/protocol.md) or the bridge (docs/plugins.md), in
        /// the order docs/protocol.md documents them. Requests are routed on it, so a method
        /// without a handler does not compile.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Method {
            $($variant,)*
        }

        impl Method {
            pub(crate) const ALL: &'static [Method] = &[$(Method::$variant,)*];

            /// Its name on the wire.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(Method::$variant => $name,)*
                }
            }

            pub(crate) fn from_name(name: &str) -> Option<Method> {
                match name {
                    $($name => Some(Method::$variant),)*
                    _ => None,
                }
            }

            /// Served on the control socket.
            pub(crate) fn for_hosts(self) -> bool {
                match self {
                    $(Method::$variant => $host,)*
                }
            }

            /// Served on a run's bridge.
            pub(crate) fn for_bridges(self) -> bool {
                match self {
                    $(Method::$variant => $bridge,)*
                }
            }
        }
    };
}

methods! {
    // variant = name: hosts, bridges;
    Initialize = "initialize": true, false;
    SessionOpen = "session.open": true, false;
    SessionClose = "session.close": true, false;
    SessionStatus = "session.status": true, false;
    SessionList = "session.list": true, false;
    ToolList = "tool.list": true, false;
    ToolCall = "tool.call": true, true;
    TaskList = "task.list": true, true;
    TaskGet = "task.get": true, true;
    TaskOutput = "task.output": true, true;
    TaskWait = "task.wait": true, true;
    TaskCancel = "task.cancel": true, true;
    TaskMessage = "task.message": true, false;
    TaskAnswer = "task.answer": true, false;
    TaskBackground = "task.background": true, false;
    TaskRequestInput = "task.request_input": false, true;
    EventsSubscribe = "events.subscribe": true, false;
    InboxList = "inbox.list": true, false;
    InboxAck = "inbox.ack": true, false;
    ScheduleCreate = "schedule.create": true, false;
    ScheduleList = "schedule.list": true, false;
    ScheduleCancel = "schedule.cancel": true, false;
    DaemonStatus = "daemon.status": true, false;
}

impl Method {
    /// The names of the methods hosts are served, in documented order.
    pub(crate) fn host_names() -> Vec<&'static str> {
        Method::ALL
            .iter()
            .filter(|m| m.for_hosts())
            .map(|m| m.name())
            .collect()
    }

    /// The names of the methods a bridge serves.
    pub(crate) fn bridge_names() -> Vec<&'static str> {
        Method::ALL
            .iter()
            .filter(|m| m.for_bridges())
            .map(|m| m.name())
            .collect()
    }
}

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
