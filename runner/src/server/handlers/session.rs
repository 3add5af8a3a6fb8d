//! `session.open`, `session.close`, `session.status`, `session.list` (docs/protocol.md).

use std::sync::Arc;

use serde_json::json;

use super::super::rpc::{to_value, Reply};
use super::super::{Daemon, Peer};
use crate::protocol::{
    ErrorKind, RpcError, SessionCloseParams, SessionCloseResult, SessionListResult,
    SessionOpenParams, SessionStatus, SessionStatusParams, TaskState,
};
use crate::session;

pub(super) fn open(d: &Daemon, peer: &Peer, p: SessionOpenParams) -> Result<Reply, RpcError> {
    let ex = &d.executor;
    to_value(session::open(
        ex.registry(),
        ex.config(),
        ex.catalog(),
        &peer.creds(),
        p,
    )?)
}

/// Closes a session and every session below it: their schedules are disarmed and their
/// live tasks cancelled (unless `cancel: false`), then, with `delete`, their directories go.
pub(super) async fn close(
    d: &Arc<Daemon>,
    peer: &Peer,
    p: SessionCloseParams,
) -> Result<Reply, RpcError> {
    let registry = d.executor.registry();
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
        close_one(d, &s)?;
    }
    if p.delete.unwrap_or(false) {
        delete(d, &p.session_id)?;
    }
    to_value(SessionCloseResult {
        session_id: p.session_id,
        closed: true,
        canceled_tasks: canceled,
    })
}

fn close_one(d: &Daemon, s: &crate::registry::SessionRow) -> Result<(), RpcError> {
    if s.is_open() {
        d.executor.registry().close_session(&s.session_id)?;
        d.executor.forget_session(&s.session_id);
    }
    Ok(())
}

/// Closes the sessions that have been idle for `idle` (see [`Registry::idle_sessions`]),
/// with the sessions below them, unless a subscriber named them (someone is still there).
/// Nothing of theirs is live, so nothing is cancelled; opening one again reopens it.
///
/// [`Registry::idle_sessions`]: crate::registry::Registry::idle_sessions
pub(in crate::server) async fn expire_idle(
    d: &Daemon,
    idle: std::time::Duration,
) -> Result<usize, RpcError> {
    let cutoff = crate::ids::rfc3339(std::time::SystemTime::now() - idle);
    let routed = d.hub.routable().await.sessions;
    let registry = d.executor.registry();
    let mut closed = 0;
    for id in registry.idle_sessions(&cutoff)? {
        if routed.binary_search(&id).is_ok() {
            continue;
        }
        for s in session::with_descendants(registry, &id)? {
            close_one(d, &s)?;
        }
        tracing::info!(session_id = %id, "idle session closed");
        closed += 1;
    }
    Ok(closed)
}

pub(super) fn status(d: &Daemon, peer: &Peer, p: SessionStatusParams) -> Result<Reply, RpcError> {
    let registry = d.executor.registry();
    if let Some(id) = p.session_id {
        session::get_for(registry, peer.uid, &id)?;
        return to_value(status_of(d, &id)?);
    }
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

/// `session.list` (its params, if any, are not read).
pub(super) fn list(d: &Daemon, peer: &Peer) -> Result<Reply, RpcError> {
    let owner = (peer.uid != 0).then_some(peer.uid);
    let sessions = d
        .executor
        .registry()
        .list_sessions(owner)?
        .iter()
        .map(|s| s.to_wire())
        .collect();
    to_value(SessionListResult { sessions })
}

/// `session.close` with `delete`: removes the directories the daemon made for a session and
/// the sessions below it, once none of their tasks is live (a close has just asked them to
/// stop; the host retries after they settle). The rows stay, marked `deleted`.
fn delete(d: &Daemon, session_id: &str) -> Result<(), RpcError> {
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
