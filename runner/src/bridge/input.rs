//! `task.request_input` and `task.answer`: a run asks the host a question through its bridge;
//! its task is `awaiting_input` (recorded with an `action_required` notification) until the
//! host answers, and the answer is the result of the run's request.
//!
//! Pending questions live in the daemon's memory ([`Questions`], owned by `Bridges`): if the
//! daemon restarts, the bridge (and the question) is gone with it, and the run sees its
//! connection close.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::Scope;
use crate::executor::Executor;
use crate::ids;
use crate::protocol::{
    ErrorKind, RpcError, TaskRequestInputParams, TaskRequestInputResult, TaskState,
};
use crate::registry::NotificationRow;

struct Pending {
    session_id: String,
    answer: oneshot::Sender<Value>,
}

/// Open questions, by the asking task's id (at most one per task).
#[derive(Default)]
pub(crate) struct Questions(Mutex<HashMap<String, Pending>>);

impl Questions {
    fn pending(&self) -> MutexGuard<'_, HashMap<String, Pending>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves a run's `task.request_input`: blocks (this request only) until the host answers.
    pub(crate) async fn request(
        &self,
        exec: &Executor,
        scope: &Scope,
        p: TaskRequestInputParams,
        closed: impl std::future::Future<Output = ()>,
    ) -> Result<Value, RpcError> {
        let task_id = scope.caller_task_id.clone();
        let (tx, rx) = oneshot::channel();
        {
            let mut map = self.pending();
            if map.contains_key(&task_id) {
                return Err(RpcError::new(
                    ErrorKind::InvalidState,
                    format!("task {task_id} is already waiting for an answer"),
                ));
            }
            map.insert(
                task_id.clone(),
                Pending {
                    session_id: scope.caller_session_id.clone(),
                    answer: tx,
                },
            );
        }
        // The host subscribes to its own session, not to the child sessions of its subagents: the
        // question goes to the top of the caller's session tree.
        let notice = NotificationRow {
        id: ids::ulid(),
        session_id: crate::session::root_session(exec.registry(), &scope.caller_session_id),
        owner_uid: scope.owner_uid,
        task_id: Some(task_id.clone()),
        severity: "action_required".into(),
        kind: "action_required".into(),
        text: format!(
            "task {task_id} asks: {}\nanswer with task.answer {{\"task_id\": \"{task_id}\", \"answer\": …}}; the answer's JSON Schema: {}",
            p.prompt, p.schema
        ),
        created_at: ids::now_rfc3339(),
        acked: false,
        acked_at: None,
        occurrence_key: None,
    };
        let registry = exec.registry();
        match registry.mark_awaiting_input(&task_id, &scope.caller_session_id, Some(&notice)) {
            Ok(true) => info!(task_id, "awaiting input"),
            Ok(false) => {
                self.pending().remove(&task_id);
                return Err(RpcError::new(
                    ErrorKind::InvalidState,
                    format!("task {task_id} is not running, so it cannot wait for input"),
                ));
            }
            Err(e) => {
                self.pending().remove(&task_id);
                return Err(RpcError::new(ErrorKind::Internal, e.to_string()));
            }
        }
        tokio::select! {
            answer = rx => match answer {
                Ok(answer) => serde_json::to_value(TaskRequestInputResult { answer })
                    .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string())),
                Err(_) => Err(RpcError::new(ErrorKind::InvalidState, "the question was abandoned")),
            },
            _ = closed => {
                // The run hung up: it no longer waits.
                if self.pending().remove(&task_id).is_some() {
                    if let Err(e) = registry.mark_input_answered(&task_id, &scope.caller_session_id) {
                        warn!(task_id, "cannot record the abandoned question: {e}");
                    }
                }
                Err(RpcError::new(ErrorKind::InvalidState, "connection closed"))
            }
        }
    }

    /// `task.answer`: hands `answer` to the run that asked, and the task is `running` again.
    pub(crate) fn answer(
        &self,
        exec: &Executor,
        task_id: &str,
        answer: Value,
    ) -> Result<TaskState, RpcError> {
        let Some(p) = self.pending().remove(task_id) else {
            return Err(RpcError::new(
            ErrorKind::InvalidState,
            format!("task {task_id} is not waiting for an answer"),
        )
        .with_hint("a task asks with task.request_input through its bridge; its state is then awaiting_input"));
        };
        exec.registry()
            .mark_input_answered(task_id, &p.session_id)
            .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))?;
        if p.answer.send(answer).is_err() {
            warn!(task_id, "the run stopped waiting before the answer arrived");
        }
        Ok(exec
            .registry()
            .get_task(task_id)
            .ok()
            .flatten()
            .map(|t| t.state)
            .unwrap_or(TaskState::Running))
    }

    /// Drops the open question of a run that ended.
    pub(super) fn abandon(&self, task_id: &str) {
        self.pending().remove(task_id);
    }
}

/// At start-up: the questions of the previous daemon died with its bridges (the runs saw
/// their connection close), so no task stays `awaiting_input`.
pub(super) fn abandon_after_restart(exec: &Executor) {
    let Ok(waiting) = exec.registry().tasks_in_states(&[TaskState::AwaitingInput]) else {
        return;
    };
    for t in waiting {
        match exec.registry().abandon_input(&t.task_id, &t.session_id) {
            Ok(true) => {
                info!(task_id = %t.task_id, "its question died with the previous daemon; running again")
            }
            Ok(false) => {}
            Err(e) => warn!(task_id = %t.task_id, "cannot clear awaiting_input: {e}"),
        }
    }
}
