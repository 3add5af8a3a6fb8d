//! One handler per method of the host protocol (docs/protocol.md).

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::{Daemon, Peer};
use crate::executor::{task_page, CallRequest, ExecError};
use crate::ids;
use crate::protocol::*;
use crate::registry::{RegistryError, TaskRow};
use crate::session::{self, SessionError};

/// The longest `task.wait` honoured.
const MAX_WAIT_MS: u64 = 24 * 3600 * 1000;

/// What a handler answers: a result (and, for an inline `tool.call`, the task whose delivery
/// depends on the reply reaching the host), or an error.
pub struct Reply {
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

pub(super) fn params<T: DeserializeOwned>(method: &str, p: Value) -> Result<T, RpcError> {
    serde_json::from_value(p)
        .map_err(|e| RpcError::new(ErrorKind::InvalidParams, format!("{method}: {e}")))
}

pub(super) fn to_value<T: serde::Serialize>(v: T) -> Result<Reply, RpcError> {
    serde_json::to_value(v)
        .map(Reply::from)
        .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))
}

/// Looks a task up for `peer`: a malformed id is invalid, an unknown one not found, another
/// user's one denied.
fn task_for(d: &Daemon, peer: &Peer, task_id: &str) -> Result<TaskRow, RpcError> {
    if !ids::is_valid_task_id(task_id) {
        return Err(RpcError::new(
            ErrorKind::InvalidParams,
            format!("invalid task id {task_id:?}: task ids are 26-character ULIDs"),
        ));
    }
    let row =
        d.executor.registry().get_task(task_id)?.ok_or_else(|| {
            RpcError::new(ErrorKind::NotFound, format!("task {task_id} not found"))
        })?;
    if !session::may_access(peer.uid, row.owner_uid) {
        return Err(RpcError::new(
            ErrorKind::PermissionDenied,
            format!("task {task_id} belongs to another user"),
        ));
    }
    Ok(row)
}

pub async fn dispatch(
    d: &Arc<Daemon>,
    peer: &Peer,
    method: &str,
    p: Value,
    closed: impl std::future::Future<Output = ()>,
) -> Result<Reply, RpcError> {
    let registry = d.executor.registry();
    // An unprivileged daemon cannot run anything as another user: whatever it did for them
    // would be done with its own user's authority. It serves its own user (and root) only.
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
    match method {
        "initialize" => {
            let p: InitializeParams = params(method, p)?;
            if let Some(v) = p.protocol_version.filter(|v| *v != PROTOCOL_VERSION) {
                return Err(RpcError::new(
                    ErrorKind::InvalidParams,
                    format!(
                        "unsupported protocol_version {v}; this server speaks {PROTOCOL_VERSION}"
                    ),
                ));
            }
            to_value(InitializeResult {
                protocol_version: PROTOCOL_VERSION,
                server: ServerInfo {
                    name: "sidejob".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                },
                uid: peer.uid,
                methods: METHODS.iter().map(|m| m.to_string()).collect(),
            })
        }
        "session.open" => {
            let p: SessionOpenParams = params(method, p)?;
            to_value(session::open(
                registry,
                d.executor.config(),
                &peer.creds(),
                p,
            )?)
        }
        "session.close" => {
            let p: SessionCloseParams = params(method, p)?;
            session::get_for(registry, peer.uid, &p.session_id)?;
            let mut canceled = Vec::new();
            for s in session::with_descendants(registry, &p.session_id)? {
                if p.cancel.unwrap_or(true) {
                    for sched in registry
                        .list_schedules(&s.session_id)?
                        .into_iter()
                        .filter(|x| x.enabled)
                    {
                        d.scheduler.disarm(&sched.schedule_id).await?;
                        canceled.push(sched.task_id);
                    }
                    canceled.extend(d.executor.cancel_session(&s.session_id)?);
                }
                if s.is_open() {
                    registry.close_session(&s.session_id)?;
                    d.executor.forget_session(&s.session_id);
                }
            }
            if p.delete.unwrap_or(false) {
                delete_sessions(d, &p.session_id)?;
            }
            to_value(SessionCloseResult {
                session_id: p.session_id,
                closed: true,
                canceled_tasks: canceled,
            })
        }
        "session.status" => {
            let p: SessionStatusParams = params(method, p)?;
            match p.session_id {
                Some(id) => {
                    session::get_for(registry, peer.uid, &id)?;
                    to_value(status_of(d, &id)?)
                }
                None => {
                    let owner = (peer.uid != 0).then_some(peer.uid);
                    let mut out = Vec::new();
                    for s in registry
                        .list_sessions(owner)?
                        .into_iter()
                        .filter(|s| s.is_open())
                    {
                        out.push(status_of(d, &s.session_id)?);
                    }
                    to_value(json!({ "sessions": out }))
                }
            }
        }
        "session.list" => {
            let _: SessionStatusParams = params(method, p).unwrap_or_default();
            let owner = (peer.uid != 0).then_some(peer.uid);
            let sessions = registry
                .list_sessions(owner)?
                .iter()
                .map(|s| s.to_wire())
                .collect();
            to_value(SessionListResult { sessions })
        }
        "tool.list" => to_value(ToolListResult {
            tools: d.executor.tools().list(),
            plugin_errors: d.executor.tools().errors(),
        }),
        "tool.call" => {
            let p: ToolCallParams = params(method, p)?;
            let sess = session::get_to_work_in(
                registry,
                peer.uid,
                &p.session_id,
                p.adopt.unwrap_or(false),
            )?;
            if !sess.is_open() {
                return Err(RpcError::new(
                    ErrorKind::InvalidState,
                    format!("session {} is closed", p.session_id),
                )
                .with_hint("open it again with session.open"));
            }
            let req = CallRequest {
                owner: session::owner_creds(&sess, Some(&peer.creds())),
                session: sess,
                tool: p.tool,
                args: if p.args.is_null() { json!({}) } else { p.args },
                yield_after_ms: p.yield_after_ms,
                background: p.background.unwrap_or(false),
                timeout_ms: p.timeout_ms,
                stdin: p.stdin.unwrap_or_default(),
                service: p.service.unwrap_or(false),
                profile: p.profile,
                ceiling: None,
                wake: p.wake.unwrap_or_default(),
                parent_task_id: None,
                occurrence_key: None,
            };
            let result = d.executor.call(req, closed).await?;
            let inline_task = match &result {
                ToolCallResult::Completed(c) => Some(c.task_id.clone()),
                ToolCallResult::Running(_) => None,
            };
            let mut reply = to_value(result)?;
            reply.inline_task = inline_task;
            Ok(reply)
        }
        "task.list" => {
            let p: TaskListParams = params(method, p)?;
            session::get_for(registry, peer.uid, &p.session_id)?;
            to_value(d.executor.task_list(&p.session_id, p.states.as_deref())?)
        }
        "task.get" => {
            let p: TaskIdParams = params(method, p)?;
            to_value(task_for(d, peer, &p.task_id)?.to_wire())
        }
        "task.output" => {
            let p: TaskOutputParams = params(method, p)?;
            to_value(task_page(&task_for(d, peer, &p.task_id)?, &p))
        }
        "task.wait" => {
            let p: TaskWaitParams = params(method, p)?;
            task_for(d, peer, &p.task_id)?;
            let timeout = Duration::from_millis(p.timeout_ms.unwrap_or(30_000).min(MAX_WAIT_MS));
            // A wait whose host has hung up stops waiting, so it never takes a result that
            // nobody will read (the result then goes to a wake or a later wait).
            let waited = tokio::select! {
                w = d.executor.wait(&p.task_id, timeout) => w?,
                _ = closed => return Err(RpcError::new(ErrorKind::InvalidState, "the connection closed")),
            };
            let row = waited.ok_or_else(|| {
                RpcError::new(ErrorKind::NotFound, format!("task {} not found", p.task_id))
            })?;
            to_value(row.to_wire())
        }
        "task.cancel" => {
            let p: TaskCancelParams = params(method, p)?;
            let row = task_for(d, peer, &p.task_id)?;
            let result = match (row.kind, registry.schedule_of_task(&p.task_id)?) {
                (TaskKind::Monitor, Some(s)) if row.state == TaskState::Scheduled => {
                    d.scheduler.disarm(&s.schedule_id).await?
                }
                (TaskKind::Monitor, _) => CancelOutcome::AlreadyTerminal,
                (TaskKind::Call, _) => d.executor.cancel(&p.task_id, p.grace_ms).await?,
            };
            to_value(TaskCancelResult {
                task_id: p.task_id,
                result,
            })
        }
        "task.message" => {
            let p: TaskMessageParams = params(method, p)?;
            task_for(d, peer, &p.task_id)?;
            let eof = p.eof.unwrap_or(false);
            let queued = d.executor.message(&p.task_id, p.data.as_bytes(), eof)?;
            to_value(TaskMessageResult {
                task_id: p.task_id,
                queued_bytes: queued,
                eof,
            })
        }
        "task.answer" => {
            let p: TaskAnswerParams = params(method, p)?;
            task_for(d, peer, &p.task_id)?;
            let state = crate::bridge::answer(&d.executor, &p.task_id, p.answer)?;
            to_value(TaskAnswerResult {
                task_id: p.task_id,
                state,
            })
        }
        "task.background" => {
            let p: TaskIdParams = params(method, p)?;
            let row = task_for(d, peer, &p.task_id)?;
            let backgrounded = d.executor.background(&p.task_id);
            let state = registry
                .get_task(&p.task_id)?
                .map(|r| r.state)
                .unwrap_or(row.state);
            to_value(TaskBackgroundResult {
                task_id: p.task_id,
                backgrounded,
                state,
            })
        }
        "events.subscribe" => super::wakes::events_subscribe(d, peer, p).await,
        "inbox.list" => super::wakes::inbox_list(d, peer, p),
        "inbox.ack" => super::wakes::inbox_ack(d, peer, p),
        "schedule.create" => super::wakes::schedule_create(d, peer, p),
        "schedule.list" => super::wakes::schedule_list(d, peer, p),
        "schedule.cancel" => super::wakes::schedule_cancel(d, peer, p).await,
        "daemon.status" => super::status::daemon_status(d, peer, p),
        other => Err(RpcError::new(
            ErrorKind::MethodNotFound,
            format!("unknown method {other:?}"),
        )
        .with_hint(format!("methods: {}", METHODS.join(", ")))),
    }
}

/// `session.close` with `delete`: removes the directories the daemon made for a session and
/// the sessions below it, once none of their tasks is live (a close has just asked them to
/// stop; the host retries after they settle). The rows stay, marked `deleted`.
fn delete_sessions(d: &Daemon, session_id: &str) -> Result<(), RpcError> {
    let registry = d.executor.registry();
    let sessions_dir = d.executor.config().sessions_dir();
    let all = session::with_descendants(registry, session_id)?;
    for s in &all {
        if !std::path::Path::new(&s.session_dir).starts_with(&sessions_dir) {
            return Err(RpcError::new(
                ErrorKind::InvalidParams,
                format!(
                    "session {} keeps its runs in {}, a directory you chose: delete removes only directories the daemon made (remove yours yourself)",
                    s.session_id, s.session_dir
                ),
            ));
        }
        if !registry.live_tasks_of_session(&s.session_id)?.is_empty() {
            return Err(RpcError::new(
                ErrorKind::InvalidState,
                format!("session {} still has runs winding down", s.session_id),
            )
            .with_hint("call session.close with delete: true again once they have settled"));
        }
    }
    for s in &all {
        // The daemon's own tree (in its 0700 state directory); remove_dir_all never follows a
        // symlink it meets.
        match std::fs::remove_dir_all(&s.session_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(RpcError::new(
                    ErrorKind::Internal,
                    format!("cannot remove {}: {e}", s.session_dir),
                ))
            }
        }
        registry.mark_session_deleted(&s.session_id)?;
        d.executor.forget_kept_output(s.owner_uid);
    }
    Ok(())
}

fn status_of(d: &Daemon, session_id: &str) -> Result<SessionStatus, RpcError> {
    let mut st = SessionStatus {
        session_id: session_id.to_owned(),
        active: false,
        running: 0,
        queued: 0,
        awaiting_input: 0,
        scheduled: 0,
    };
    for (state, n) in d.executor.registry().count_states(session_id)? {
        match state {
            TaskState::Running => st.running += n,
            TaskState::Queued => st.queued += n,
            TaskState::AwaitingInput => st.awaiting_input += n,
            TaskState::Scheduled => st.scheduled += n,
            TaskState::Succeeded | TaskState::Failed | TaskState::Canceled => {}
        }
    }
    st.active = st.running + st.queued + st.awaiting_input > 0;
    Ok(st)
}
