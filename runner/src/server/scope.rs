//! Who a request comes from, and what it may reach (docs/security.md). Every rule that differs
//! between the control socket and a bridge is here, so the handlers are the same for both:
//!
//! - a **host** is a uid on the control socket: its own sessions and their tasks (root:
//!   every one, and another user's session to work in only with `adopt`), every method;
//! - a **bridge** is a run calling back (docs/plugins.md, "The bridge"): only the methods `Method::for_bridges` names,
//!   only its scope's session (another session's task is `not_found`, as if it did not
//!   exist; another `session_id` is `permission_denied`), never a profile wider than the
//!   run's own, and never a schedule.

use std::sync::Arc;

use serde_json::{json, Value};

use super::Peer;
use crate::bridge::Scope;
use crate::executor::CallRequest;
use crate::ids;
use crate::protocol::{ErrorKind, Method, RpcError, ToolCallParams, WakeMode};
use crate::registry::{Registry, SessionRow, TaskRow};
use crate::session;

#[derive(Debug, Clone)]
pub(super) enum Caller {
    Host(Peer),
    Bridge(Arc<Scope>),
}

impl Caller {
    /// Whether this daemon serves the caller at all. An unprivileged daemon cannot run
    /// anything as another user: whatever it did for them would be done with its own user's
    /// authority. It serves its own user (and root) only. A bridge is a run this daemon
    /// started.
    pub(super) fn admitted(&self) -> Result<(), RpcError> {
        let Caller::Host(peer) = self else {
            return Ok(());
        };
        let me = crate::sys::getuid();
        if me != 0 && peer.uid != me && peer.uid != 0 {
            return Err(RpcError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "this daemon runs as uid {me} and serves only that user; uid {} needs a daemon of its own (or a root daemon)",
                    peer.uid
                ),
            ));
        }
        Ok(())
    }

    /// The caller's methods: the protocol's, or the bridge's allow-list.
    pub(super) fn serves(&self, method: Method) -> bool {
        match self {
            Caller::Host(_) => method.for_hosts(),
            Caller::Bridge(_) => method.for_bridges(),
        }
    }

    pub(super) fn method_not_found(&self, method: &str) -> RpcError {
        match self {
            Caller::Host(_) => RpcError::new(
                ErrorKind::MethodNotFound,
                format!("unknown method {method:?}"),
            )
            .with_hint(format!("methods: {}", Method::host_names().join(", "))),
            Caller::Bridge(_) => RpcError::new(
                ErrorKind::MethodNotFound,
                format!("method {method:?} is not served on the bridge"),
            )
            .with_hint(format!(
                "the bridge serves: {}",
                Method::bridge_names().join(", ")
            )),
        }
    }

    /// The host behind a host-only method (routing never gives a bridge one).
    pub(super) fn host(&self) -> Result<&Peer, RpcError> {
        match self {
            Caller::Host(peer) => Ok(peer),
            Caller::Bridge(_) => Err(RpcError::new(
                ErrorKind::MethodNotFound,
                "this method is not served on the bridge",
            )),
        }
    }

    /// The bridge behind a bridge-only method (routing never gives a host one).
    pub(super) fn bridge(&self) -> Result<&Scope, RpcError> {
        match self {
            Caller::Bridge(scope) => Ok(scope),
            Caller::Host(_) => Err(RpcError::new(
                ErrorKind::MethodNotFound,
                "this method is served on a run's bridge only",
            )),
        }
    }

    /// The params as the caller's scope reads them: on a bridge, the `session_id` of a call
    /// or a task list may be left out (it is the bridge's) and may not name another.
    pub(super) fn scoped_params(&self, method: Method, mut p: Value) -> Result<Value, RpcError> {
        let Caller::Bridge(scope) = self else {
            return Ok(p);
        };
        if !matches!(method, Method::ToolCall | Method::TaskList) {
            return Ok(p);
        }
        let Some(obj) = p.as_object_mut() else {
            return Ok(p);
        };
        match obj.get("session_id").and_then(Value::as_str) {
            None => {
                obj.insert("session_id".into(), scope.session_id.clone().into());
            }
            Some(s) if s == scope.session_id => {}
            Some(other) => {
                return Err(RpcError::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "this bridge serves session {} only, not {other}",
                        scope.session_id
                    ),
                ))
            }
        }
        Ok(p)
    }

    /// A session to read (`task.list`): the host's own (root: any); the bridge's own (its
    /// `session_id` was checked by [`Caller::scoped_params`]).
    pub(super) fn session_to_read(
        &self,
        registry: &Registry,
        session_id: &str,
    ) -> Result<(), RpcError> {
        match self {
            Caller::Host(peer) => session::get_for(registry, peer.uid, session_id).map(drop)?,
            Caller::Bridge(scope) if scope.session_id == session_id => {}
            Caller::Bridge(scope) => {
                return Err(RpcError::new(
                    ErrorKind::PermissionDenied,
                    format!("this bridge serves session {} only", scope.session_id),
                ))
            }
        }
        Ok(())
    }

    /// Looks a task up for the caller: a malformed id is invalid; for a host, an unknown one
    /// is not found and another user's denied; for a bridge, anything outside its session
    /// is not found, so a run cannot even learn whether another session's task exists.
    pub(super) fn task(&self, registry: &Registry, task_id: &str) -> Result<TaskRow, RpcError> {
        check_task_id(task_id)?;
        match self {
            Caller::Host(peer) => host_task(registry, peer, task_id),
            Caller::Bridge(scope) => match registry.get_task(task_id)? {
                Some(row) if row.session_id == scope.session_id => Ok(row),
                _ => Err(RpcError::new(
                    ErrorKind::NotFound,
                    format!("task {task_id} not found in session {}", scope.session_id),
                )),
            },
        }
    }

    /// Whether cancelling a monitor task disarms its schedule: a host's may; a bridge never
    /// reaches a schedule (its `task.cancel` of a monitor finds nothing to stop).
    pub(super) fn may_disarm_schedules(&self) -> bool {
        matches!(self, Caller::Host(_))
    }

    /// A `tool.call` as the executor takes it: in a session the caller may start work in,
    /// which must be open; run as the session's owner; for a bridge, bounded by the run's
    /// profile and started as the run's child.
    pub(super) fn call_request(
        &self,
        registry: &Registry,
        p: ToolCallParams,
    ) -> Result<CallRequest, RpcError> {
        match self {
            Caller::Host(peer) => {
                let adopt = p.adopt.unwrap_or(false);
                let sess = session::get_to_work_in(registry, peer.uid, &p.session_id, adopt)?;
                if !sess.is_open() {
                    return Err(RpcError::new(
                        ErrorKind::InvalidState,
                        format!("session {} is closed", p.session_id),
                    )
                    .with_hint("open it again with session.open"));
                }
                let owner = session::owner_creds(&sess, Some(&peer.creds()));
                let wake = p.wake.unwrap_or_default();
                Ok(call(sess, owner, p, None, wake, None))
            }
            Caller::Bridge(scope) => {
                let sess = registry
                    .get_session(&scope.session_id)?
                    .filter(|s| s.is_open())
                    .ok_or_else(|| {
                        RpcError::new(
                            ErrorKind::InvalidState,
                            format!("session {} is closed", scope.session_id),
                        )
                    })?;
                // A subagent's own jobs report through the subagent, not by waking the host;
                // its services are handed over to the parent and wake it as usual.
                let quiet = scope.is_subagent() && !p.service.unwrap_or(false);
                let wake = p.wake.unwrap_or(if quiet {
                    WakeMode::Silent
                } else {
                    WakeMode::OnTerminal
                });
                let owner = session::owner_creds(&sess, None);
                // Nothing started through the bridge is wider than the run that holds it:
                // not its profile, and not the paths and hosts its call was granted.
                if let Some(want) = p.grants.as_ref().filter(|g| !g.is_empty()) {
                    let have = registry
                        .get_task(&scope.caller_task_id)?
                        .and_then(|row| row.grants)
                        .unwrap_or_default();
                    crate::executor::grants_within(want, &have).map_err(|m| {
                        RpcError::new(ErrorKind::PermissionDenied, m.to_string()).with_hint(
                            "a call through a run's bridge may grant only what that run was granted",
                        )
                    })?;
                }
                let ceiling = Some(scope.ceiling.clone());
                let parent = Some(scope.caller_task_id.clone());
                Ok(call(sess, owner, p, ceiling, wake, parent))
            }
        }
    }
}

fn check_task_id(task_id: &str) -> Result<(), RpcError> {
    if ids::is_valid_task_id(task_id) {
        return Ok(());
    }
    Err(RpcError::new(
        ErrorKind::InvalidParams,
        format!("invalid task id {task_id:?}: task ids are 26-character ULIDs"),
    ))
}

/// A task for a host: an unknown one is not found, another user's denied.
pub(super) fn host_task(
    registry: &Registry,
    peer: &Peer,
    task_id: &str,
) -> Result<TaskRow, RpcError> {
    check_task_id(task_id)?;
    let row = registry
        .get_task(task_id)?
        .ok_or_else(|| RpcError::new(ErrorKind::NotFound, format!("task {task_id} not found")))?;
    if !session::may_access(peer.uid, row.owner_uid) {
        return Err(RpcError::new(
            ErrorKind::PermissionDenied,
            format!("task {task_id} belongs to another user"),
        ));
    }
    Ok(row)
}

fn call(
    session: SessionRow,
    owner: crate::sys::dirfd::Creds,
    p: ToolCallParams,
    ceiling: Option<String>,
    wake: WakeMode,
    parent_task_id: Option<String>,
) -> CallRequest {
    CallRequest {
        owner,
        session,
        tool: p.tool,
        args: if p.args.is_null() { json!({}) } else { p.args },
        yield_after_ms: p.yield_after_ms,
        background: p.background.unwrap_or(false),
        timeout_ms: p.timeout_ms,
        stdin: p.stdin.unwrap_or_default(),
        service: p.service.unwrap_or(false),
        profile: p.profile,
        ceiling,
        wake,
        parent_task_id,
        occurrence_key: None,
        on_disconnect: p.on_disconnect.unwrap_or_default(),
        stderr: p.stderr.unwrap_or_default(),
        grants: p.grants,
    }
}
