//! `tool.list`, `tool.call` and `task.*` (docs/protocol.md): the same handlers for a host and a
//! run's bridge; what each may reach is its [`Caller`]'s.

use std::future::Future;
use std::sync::Arc;

use super::super::rpc::{to_value, wait_timeout, Reply};
use super::super::scope::{host_task, Caller};
use super::super::{Daemon, Peer};
use crate::executor::task_page;
use crate::protocol::{
    CancelOutcome, ErrorKind, RpcError, TaskAnswerParams, TaskAnswerResult, TaskBackgroundResult,
    TaskCancelParams, TaskCancelResult, TaskIdParams, TaskKind, TaskListParams, TaskMessageParams,
    TaskMessageResult, TaskOutputParams, TaskRequestInputParams, TaskState, TaskWaitParams,
    ToolCallParams, ToolCallResult, ToolListResult,
};

pub(super) fn tools(d: &Daemon) -> Result<Reply, RpcError> {
    to_value(ToolListResult {
        tools: d.executor.tools().list(),
        plugin_errors: d.executor.tools().errors(),
    })
}

/// `tool.call`. An inline answer carries its task, so a reply that cannot be written hands
/// the result back (`rpc::Outgoing`).
pub(super) async fn call(
    d: &Arc<Daemon>,
    caller: &Caller,
    p: ToolCallParams,
    closed: impl Future<Output = ()>,
) -> Result<Reply, RpcError> {
    let req = caller.call_request(d.executor.registry(), p)?;
    let result = d.executor.call(req, closed).await?;
    let inline_task = match &result {
        ToolCallResult::Completed(c) => Some(c.task_id.clone()),
        ToolCallResult::Running(_) => None,
    };
    let mut reply = to_value(result)?;
    reply.inline_task = inline_task;
    Ok(reply)
}

pub(super) fn list(d: &Daemon, caller: &Caller, p: TaskListParams) -> Result<Reply, RpcError> {
    caller.session_to_read(d.executor.registry(), &p.session_id)?;
    to_value(d.executor.task_list(&p.session_id, p.states.as_deref())?)
}

pub(super) fn get(d: &Daemon, caller: &Caller, p: TaskIdParams) -> Result<Reply, RpcError> {
    to_value(caller.task(d.executor.registry(), &p.task_id)?.to_wire())
}

pub(super) fn output(d: &Daemon, caller: &Caller, p: TaskOutputParams) -> Result<Reply, RpcError> {
    let row = caller.task(d.executor.registry(), &p.task_id)?;
    to_value(task_page(&row, &p))
}

/// `task.wait`. A wait whose caller has hung up stops waiting, so it never takes a result
/// that nobody will read (the result then goes to a wake or a later wait).
pub(super) async fn wait(
    d: &Daemon,
    caller: &Caller,
    p: TaskWaitParams,
    closed: impl Future<Output = ()>,
) -> Result<Reply, RpcError> {
    caller.task(d.executor.registry(), &p.task_id)?;
    let waited = tokio::select! {
        w = d.executor.wait(&p.task_id, wait_timeout(p.timeout_ms)) => w?,
        _ = closed => return Err(RpcError::new(ErrorKind::InvalidState, "the connection closed")),
    };
    let row = waited.ok_or_else(|| {
        RpcError::new(ErrorKind::NotFound, format!("task {} not found", p.task_id))
    })?;
    to_value(row.to_wire())
}

/// `task.cancel`: a call's run is stopped; a scheduled monitor's schedule is disarmed (by a
/// host: a bridge never reaches a schedule).
pub(super) async fn cancel(
    d: &Daemon,
    caller: &Caller,
    p: TaskCancelParams,
) -> Result<Reply, RpcError> {
    let registry = d.executor.registry();
    let row = caller.task(registry, &p.task_id)?;
    let mut taken_back = None;
    let result = match (row.kind, registry.schedule_of_task(&p.task_id)?) {
        (TaskKind::Monitor, Some(s))
            if row.state == TaskState::Scheduled && caller.may_disarm_schedules() =>
        {
            d.scheduler.disarm(&s.schedule_id).await?
        }
        (TaskKind::Monitor, _) => CancelOutcome::AlreadyTerminal,
        (TaskKind::Call, _) if p.withdraw.unwrap_or(false) => {
            let w = d.executor.withdraw_cancel(&p.task_id)?;
            taken_back = (w.outcome == CancelOutcome::Withdrawn).then_some(w.taken_back);
            w.outcome
        }
        (TaskKind::Call, _) => {
            let wake = p.wake.unwrap_or_default();
            d.executor.cancel(&p.task_id, p.grace_ms, wake).await?
        }
    };
    to_value(TaskCancelResult {
        task_id: p.task_id,
        result,
        taken_back,
    })
}

/// `task.message` (a host's only: a run writes to its own jobs' stdin itself).
pub(super) fn message(d: &Daemon, peer: &Peer, p: TaskMessageParams) -> Result<Reply, RpcError> {
    host_task(d.executor.registry(), peer, &p.task_id)?;
    let eof = p.eof.unwrap_or(false);
    let queued = d.executor.message(&p.task_id, p.data.as_bytes(), eof)?;
    to_value(TaskMessageResult {
        task_id: p.task_id,
        queued_bytes: queued,
        eof,
    })
}

/// `task.answer`: the host answers the question a run asked through its bridge.
pub(super) fn answer(d: &Daemon, peer: &Peer, p: TaskAnswerParams) -> Result<Reply, RpcError> {
    host_task(d.executor.registry(), peer, &p.task_id)?;
    let state = d
        .bridges
        .questions()
        .answer(&d.executor, &p.task_id, p.answer)?;
    to_value(TaskAnswerResult {
        task_id: p.task_id,
        state,
    })
}

/// `task.background` (a host's only: it moves a call the host is blocked on).
pub(super) fn background(d: &Daemon, peer: &Peer, p: TaskIdParams) -> Result<Reply, RpcError> {
    let row = host_task(d.executor.registry(), peer, &p.task_id)?;
    let backgrounded = d.executor.background(&p.task_id);
    let state = d
        .executor
        .registry()
        .get_task(&p.task_id)?
        .map(|r| r.state)
        .unwrap_or(row.state);
    to_value(TaskBackgroundResult {
        task_id: p.task_id,
        backgrounded,
        state,
    })
}

/// `task.request_input` (a run's bridge only): blocks until the host answers.
pub(super) async fn request_input(
    d: &Daemon,
    caller: &Caller,
    p: TaskRequestInputParams,
    closed: impl Future<Output = ()>,
) -> Result<Reply, RpcError> {
    let scope = caller.bridge()?;
    let answer = d
        .bridges
        .questions()
        .request(&d.executor, scope, p, closed)
        .await?;
    Ok(answer.into())
}
