//! The one RPC core (docs/protocol.md, "Framing"): a request line is checked as a JSON-RPC 2.0
//! envelope, routed for its caller (`handlers/`), and its reply encoded. The control socket
//! and every bridge run through here, so both answer a malformed line the same way; what
//! differs is only the caller's scope (`scope.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{info_span, Instrument};

use super::scope::Caller;
use super::{handlers, Daemon};
use crate::executor::ExecError;
use crate::protocol::{ErrorKind, Request, Response, RpcError};
use crate::registry::RegistryError;
use crate::schedule::ScheduleError;
use crate::session::SessionError;

/// The longest `task.wait` honoured (a run's own deadline still applies).
const MAX_WAIT_MS: u64 = 24 * 3600 * 1000;
/// How long a `task.wait` without `timeout_ms` waits.
const DEFAULT_WAIT_MS: u64 = 30_000;

/// The time a `task.wait` asking for `timeout_ms` waits.
pub(super) fn wait_timeout(timeout_ms: Option<u64>) -> Duration {
    Duration::from_millis(timeout_ms.unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS))
}

/// What a handler answers: a result (and, for an inline `tool.call`, the task whose delivery
/// depends on the reply reaching the caller), or an error.
pub(super) struct Reply {
    pub result: Value,
    pub inline_task: Option<String>,
}

impl From<Value> for Reply {
    fn from(result: Value) -> Reply {
        Reply {
            result,
            inline_task: None,
        }
    }
}

/// A line to write, and the task whose inline delivery rides on it: if the line cannot be
/// written, the task's result is handed back (`Executor::undeliver`).
pub(super) struct Outgoing {
    pub line: String,
    pub inline_task: Option<String>,
}

impl Outgoing {
    pub(super) fn error(id: Value, err: RpcError) -> Outgoing {
        Outgoing {
            line: encode(&Response::err(id, err)),
            inline_task: None,
        }
    }
}

/// A method's params as its typed `*Params`.
pub(super) fn parse<T: DeserializeOwned>(method: &str, p: Value) -> Result<T, RpcError> {
    serde_json::from_value(p)
        .map_err(|e| RpcError::new(ErrorKind::InvalidParams, format!("{method}: {e}")))
}

/// A result as a reply.
pub(super) fn to_value<T: serde::Serialize>(v: T) -> Result<Reply, RpcError> {
    serde_json::to_value(v)
        .map(Reply::from)
        .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))
}

pub(super) fn encode(r: &Response) -> String {
    serde_json::to_string(r).unwrap_or_else(|e| {
        format!(r#"{{"jsonrpc":"2.0","id":null,"error":{{"code":-32603,"message":"cannot encode reply: {e}"}}}}"#)
    })
}

/// A checked envelope: the id to answer with (absent for a notification), the method and
/// its params (an object).
struct Envelope {
    id: Option<Value>,
    method: String,
    params: Value,
}

/// Checks one line as a JSON-RPC 2.0 request; an error carries the id to answer with.
fn envelope(line: &[u8]) -> Result<Envelope, (Value, RpcError)> {
    let invalid = |id: Value, m: &str| (id, RpcError::new(ErrorKind::InvalidRequest, m));
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        let e = RpcError::new(ErrorKind::ParseError, format!("parse error: {e}"));
        (Value::Null, e)
    })?;
    if value.is_array() {
        return Err(invalid(
            Value::Null,
            "batch requests are not supported; send one object per line",
        ));
    }
    if !value.is_object() {
        return Err(invalid(Value::Null, "a request must be a JSON object"));
    }
    let has_id = value.get("id").is_some();
    let req: Request = serde_json::from_value(value)
        .map_err(|e| invalid(Value::Null, &format!("invalid request: {e}")))?;
    let id = req.id.unwrap_or(Value::Null);
    if !matches!(id, Value::Null | Value::String(_) | Value::Number(_)) {
        return Err(invalid(
            Value::Null,
            "id must be a string, a number or null",
        ));
    }
    if req.jsonrpc.as_deref() != Some("2.0") {
        return Err(invalid(id, "jsonrpc must be \"2.0\""));
    }
    let Some(Value::String(method)) = req.method else {
        return Err(invalid(id, "method must be a string"));
    };
    let params = match req.params {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(p @ Value::Object(_)) => p,
        Some(_) => {
            let msg = format!("{method}: params must be an object");
            return Err((id, RpcError::new(ErrorKind::InvalidParams, msg)));
        }
    };
    Ok(Envelope {
        id: has_id.then_some(id),
        method,
        params,
    })
}

/// Answers one line for `caller`; `None` for notifications (no `id`), which get no reply
/// (and so can deliver nothing inline).
pub(super) async fn handle_line(
    d: &Arc<Daemon>,
    caller: &Caller,
    line: &[u8],
    closed: impl Future<Output = ()>,
) -> Option<Outgoing> {
    let req = match envelope(line) {
        Ok(req) => req,
        Err((id, err)) => return Some(Outgoing::error(id, err)),
    };
    // Who asks is on the request's span: a connection's own span is debug-level, since a
    // span's data is kept for reuse, and thousands of idle connections would leave it
    // scattered through the heap after they close.
    let span = match caller {
        Caller::Host(peer) => info_span!("request", uid = peer.uid, method = %req.method),
        Caller::Bridge(_) => info_span!("request", method = %req.method),
    };
    let outcome = handlers::route(d, caller, &req.method, req.params, closed)
        .instrument(span)
        .await;
    let Some(id) = req.id else {
        if let Ok(Reply {
            inline_task: Some(task),
            ..
        }) = &outcome
        {
            d.executor.undeliver(task);
        }
        return None;
    };
    Some(match outcome {
        Ok(reply) => Outgoing {
            line: encode(&Response::ok(id, reply.result)),
            inline_task: reply.inline_task,
        },
        Err(err) => Outgoing::error(id, err),
    })
}

impl From<SessionError> for RpcError {
    fn from(e: SessionError) -> RpcError {
        let kind = match &e {
            SessionError::InvalidParams(_) => ErrorKind::InvalidParams,
            SessionError::PermissionDenied(_) => ErrorKind::PermissionDenied,
            SessionError::LimitExceeded(_) => ErrorKind::LimitExceeded,
            SessionError::NotFound(_) => ErrorKind::NotFound,
            SessionError::SandboxUnavailable(_) => ErrorKind::SandboxUnavailable,
            SessionError::Dir { .. } | SessionError::Registry(_) => ErrorKind::Internal,
        };
        RpcError::new(kind, e.to_string())
    }
}

impl From<ExecError> for RpcError {
    fn from(e: ExecError) -> RpcError {
        let kind = match &e {
            ExecError::InvalidParams(_) => ErrorKind::InvalidParams,
            ExecError::InvalidState(_) => ErrorKind::InvalidState,
            ExecError::LimitExceeded(_) => ErrorKind::LimitExceeded,
            ExecError::PermissionDenied(_) => ErrorKind::PermissionDenied,
            ExecError::SandboxUnavailable(_) => ErrorKind::SandboxUnavailable,
            ExecError::Io { .. } | ExecError::Registry(_) => ErrorKind::Internal,
        };
        RpcError::new(kind, e.to_string())
    }
}

impl From<RegistryError> for RpcError {
    fn from(e: RegistryError) -> RpcError {
        RpcError::new(ErrorKind::Internal, e.to_string())
    }
}

impl From<ScheduleError> for RpcError {
    fn from(e: ScheduleError) -> RpcError {
        match e {
            ScheduleError::Invalid(m) => RpcError::new(ErrorKind::InvalidParams, m),
            ScheduleError::Registry(e) => e.into(),
            ScheduleError::Exec(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(line: &str) -> (Value, i64) {
        match envelope(line.as_bytes()) {
            Ok(_) => panic!("{line} was accepted"),
            Err((id, e)) => (id, e.code),
        }
    }

    #[test]
    fn an_envelope_must_be_json_rpc_2_0_with_a_scalar_id() {
        assert_eq!(refused("{"), (Value::Null, ErrorKind::ParseError.code()));
        assert_eq!(
            refused("[]"),
            (Value::Null, ErrorKind::InvalidRequest.code())
        );
        assert_eq!(
            refused("3"),
            (Value::Null, ErrorKind::InvalidRequest.code())
        );
        let no_version = r#"{"id": 7, "method": "task.list"}"#;
        assert_eq!(
            refused(no_version),
            (7.into(), ErrorKind::InvalidRequest.code())
        );
        let old = r#"{"jsonrpc": "1.0", "id": "a", "method": "task.list"}"#;
        assert_eq!(refused(old), ("a".into(), ErrorKind::InvalidRequest.code()));
        let object_id = r#"{"jsonrpc": "2.0", "id": {"x": 1}, "method": "task.list"}"#;
        assert_eq!(
            refused(object_id),
            (Value::Null, ErrorKind::InvalidRequest.code())
        );
        let no_method = r#"{"jsonrpc": "2.0", "id": 1, "method": 5}"#;
        assert_eq!(
            refused(no_method),
            (1.into(), ErrorKind::InvalidRequest.code())
        );
        let list_params = r#"{"jsonrpc": "2.0", "id": 1, "method": "m", "params": []}"#;
        assert_eq!(
            refused(list_params),
            (1.into(), ErrorKind::InvalidParams.code())
        );
    }

    #[test]
    fn a_request_without_an_id_is_a_notification() {
        let n = envelope(br#"{"jsonrpc": "2.0", "method": "task.list"}"#).unwrap();
        assert!(n.id.is_none());
        assert_eq!(n.params, serde_json::json!({}));
        let r = envelope(br#"{"jsonrpc": "2.0", "id": null, "method": "m"}"#).unwrap();
        assert_eq!(r.id, Some(Value::Null));
    }

    #[test]
    fn a_wait_is_thirty_seconds_unless_asked_and_a_day_at_most() {
        assert_eq!(wait_timeout(None), Duration::from_secs(30));
        assert_eq!(wait_timeout(Some(5)), Duration::from_millis(5));
        assert_eq!(wait_timeout(Some(u64::MAX)), Duration::from_secs(24 * 3600));
    }
}
