//! Wire types of the bridge (docs/plugins.md): the methods a run may call on its per-run socket,
//! `task.request_input` (a run asks the host a question) and `task.answer` (the host answers).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::TaskState;

/// `task.request_input` (bridge only): puts the calling task in `awaiting_input` until the
/// host answers with `task.answer`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskRequestInputParams {
    /// What is being asked, shown to the host.
    pub prompt: String,
    /// JSON Schema the answer should satisfy (advisory; shown to the host).
    #[serde(default)]
    pub schema: Value,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskRequestInputResult {
    pub answer: Value,
}

/// `task.answer`: answers the pending `task.request_input` of an `awaiting_input` task.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskAnswerParams {
    pub task_id: String,
    pub answer: Value,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskAnswerResult {
    pub task_id: String,
    /// The task's state after the answer was handed over (normally `running`).
    pub state: TaskState,
}
