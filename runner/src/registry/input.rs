//! Registry changes made for the bridge: a task waiting for the host's answer
//! (`awaiting_input`), and tasks a subagent hands over to its parent session.

use super::{obj, Entity, Event, Op, Registry, Result};
use crate::protocol::TaskState;
use crate::registry::NotificationRow;

impl Registry {
    /// `running → awaiting_input`, with an `action_required` notification (the request's
    /// prompt and schema), all in one transaction. Returns false (and changes
    /// nothing) unless the task is `running`.
    pub(crate) fn mark_awaiting_input(
        &self,
        task_id: &str,
        session_id: &str,
        notice: Option<&NotificationRow>,
    ) -> Result<bool> {
        self.write(|tx| {
            let state: Option<String> = tx
                .query_row(
                    "SELECT state FROM tasks WHERE task_id = ?1",
                    [task_id],
                    |r| r.get(0),
                )
                .ok();
            if state.as_deref() != Some(TaskState::Running.as_str()) {
                return Ok(false);
            }
            let patch = obj([("state", TaskState::AwaitingInput.as_str().into())]);
            Self::apply(
                tx,
                Event::TaskInputRequested,
                Entity::Task,
                task_id,
                session_id,
                Op::Update,
                &patch,
            )?;
            if let Some(n) = notice {
                n.insert(tx)?;
            }
            Ok(true)
        })
    }

    /// `awaiting_input → running` once the host answered (or the request was abandoned).
    /// Returns false unless the task was `awaiting_input`.
    pub(crate) fn mark_input_answered(&self, task_id: &str, session_id: &str) -> Result<bool> {
        self.leave_awaiting_input(task_id, session_id, Event::TaskInputAnswered)
    }

    /// A question that cannot be answered any more (its bridge died with the previous
    /// daemon): `awaiting_input → running`. Returns false unless the task was waiting.
    pub(crate) fn abandon_input(&self, task_id: &str, session_id: &str) -> Result<bool> {
        self.leave_awaiting_input(task_id, session_id, Event::TaskInputAbandoned)
    }

    fn leave_awaiting_input(&self, task_id: &str, session_id: &str, event: Event) -> Result<bool> {
        self.write(|tx| {
            let state: Option<String> = tx
                .query_row(
                    "SELECT state FROM tasks WHERE task_id = ?1",
                    [task_id],
                    |r| r.get(0),
                )
                .ok();
            if state.as_deref() != Some(TaskState::AwaitingInput.as_str()) {
                return Ok(false);
            }
            let patch = obj([("state", TaskState::Running.as_str().into())]);
            Self::apply(
                tx,
                event,
                Entity::Task,
                task_id,
                session_id,
                Op::Update,
                &patch,
            )?;
            Ok(true)
        })
    }

    /// Moves a task to another session (a subagent's service handed over to the parent).
    pub(crate) fn hand_over_task(&self, task_id: &str, to_session: &str) -> Result<i64> {
        self.write(|tx| {
            let patch = obj([("session_id", to_session.into())]);
            Self::apply(
                tx,
                Event::TaskHandedOver,
                Entity::Task,
                task_id,
                to_session,
                Op::Update,
                &patch,
            )
        })
    }
}
