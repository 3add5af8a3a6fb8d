//! Parameters and results of every method, and the Task shape (SPEC §11).
//! Fields may be added, never renamed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Task states (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Queued,
    Running,
    AwaitingInput,
    Scheduled,
    Succeeded,
    Failed,
    Canceled,
}

impl TaskState {
    pub fn is_terminal(self) -> bool {
        match self {
            TaskState::Succeeded | TaskState::Failed | TaskState::Canceled => true,
            TaskState::Queued
            | TaskState::Running
            | TaskState::AwaitingInput
            | TaskState::Scheduled => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Running => "running",
            TaskState::AwaitingInput => "awaiting_input",
            TaskState::Scheduled => "scheduled",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<TaskState> {
        serde_json::from_value(Value::String(s.to_owned())).ok()
    }
}

/// Why a task failed (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailReason {
    ExitCode,
    Signal,
    Timeout,
    Lost,
    SpawnError,
    SandboxError,
}

impl FailReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::ExitCode => "exit_code",
            FailReason::Signal => "signal",
            FailReason::Timeout => "timeout",
            FailReason::Lost => "lost",
            FailReason::SpawnError => "spawn_error",
            FailReason::SandboxError => "sandbox_error",
        }
    }

    pub fn parse(s: &str) -> Option<FailReason> {
        serde_json::from_value(Value::String(s.to_owned())).ok()
    }
}

/// Who received a terminal result (SPEC §4): `pending` until someone does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    Inline,
    Wait,
    Wake,
    Pending,
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Inline => "inline",
            Delivery::Wait => "wait",
            Delivery::Wake => "wake",
            Delivery::Pending => "pending",
        }
    }

    pub fn parse(s: &str) -> Option<Delivery> {
        serde_json::from_value(Value::String(s.to_owned())).ok()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    Call,
    Monitor,
}

/// The Task shape returned by `task.get`, `task.wait` and `task.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub task_id: String,
    pub session_id: String,
    pub tool: String,
    pub kind: TaskKind,
    pub state: TaskState,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<FailReason>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub signal: Option<i32>,
    pub summary: String,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ended_at: Option<String>,
    pub output_path: String,
    pub result_path: String,
    pub delivery: Option<Delivery>,
    pub service: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parent_task_id: Option<String>,
    /// Added fields: how long the run took, and what it left behind.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub output_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub output_truncated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub leftover_processes: Option<u32>,
    /// Why the run could not be started or was lost, when it was.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    pub profile: String,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct InitializeParams {
    #[serde(default)]
    pub protocol_version: Option<u32>,
    #[serde(default)]
    pub client: Option<Value>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct InitializeResult {
    pub protocol_version: u32,
    pub server: ServerInfo,
    pub uid: u32,
    pub methods: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ServerInfo {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOpenParams {
    #[serde(default)]
    pub session_id: Option<String>,
    pub workspace: String,
    #[serde(default)]
    pub session_dir: Option<String>,
    #[serde(default)]
    pub profile: Option<String>,
    #[serde(default)]
    pub proactive_wake: Option<bool>,
    #[serde(default)]
    pub parent_session_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SessionOpenResult {
    pub session_id: String,
    pub session_dir: String,
    pub workspace: String,
    pub profile: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionCloseParams {
    pub session_id: String,
    #[serde(default)]
    pub cancel: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SessionCloseResult {
    pub session_id: String,
    pub closed: bool,
    pub canceled_tasks: Vec<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SessionStatusParams {
    #[serde(default)]
    pub session_id: Option<String>,
}

/// One session's activity. `session.status` with a `session_id` returns one of these;
/// without one it returns `{sessions: [..]}` for every session the caller owns.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SessionStatus {
    pub session_id: String,
    pub active: bool,
    pub running: u32,
    pub queued: u32,
    pub awaiting_input: u32,
    pub scheduled: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SessionInfo {
    pub session_id: String,
    pub owner_uid: u32,
    pub workspace: String,
    pub session_dir: String,
    pub profile: String,
    pub proactive_wake: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parent_session_id: Option<String>,
    pub state: String,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub closed_at: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SessionListResult {
    pub sessions: Vec<SessionInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolInfo {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub supports_background: bool,
    pub default_yield_after_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ToolListResult {
    pub tools: Vec<ToolInfo>,
}

/// How the command's stdin is wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StdinMode {
    #[default]
    Null,
    Pipe,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallParams {
    pub session_id: String,
    pub tool: String,
    #[serde(default)]
    pub args: Value,
    #[serde(default)]
    pub yield_after_ms: Option<u64>,
    #[serde(default)]
    pub background: Option<bool>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub stdin: Option<StdinMode>,
    #[serde(default)]
    pub service: Option<bool>,
    #[serde(default)]
    pub profile: Option<String>,
}

/// `tool.call`'s result: either the finished run, or a handle to the one still running.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ToolCallResult {
    Completed(CompletedCall),
    Running(RunningCall),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompletedCall {
    pub task_id: String,
    pub state: TaskState,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<FailReason>,
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub signal: Option<i32>,
    pub output: String,
    pub output_truncated: bool,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    pub output_path: String,
    pub result_path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
    /// The tool plugin's rendering of the result for the model, when it has one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rendered: Option<String>,
pub struct RunningCall {
    pub task_id: String,
    pub output: String,
    pub output_path: String,
    pub result_path: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hint: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskListParams {
    pub session_id: String,
    #[serde(default)]
    pub states: Option<Vec<TaskState>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TaskListResult {
    pub tasks: Vec<Task>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskIdParams {
    pub task_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskOutputParams {
    pub task_id: String,
    #[serde(default)]
    pub offset: Option<u64>,
    #[serde(default)]
    pub max_bytes: Option<u64>,
    #[serde(default)]
    pub tail_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TaskOutputResult {
    pub data: String,
    pub offset: u64,
    pub next_offset: u64,
    pub size: u64,
    pub eof: bool,
    pub truncated: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskWaitParams {
    pub task_id: String,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskCancelParams {
    pub task_id: String,
    #[serde(default)]
    pub grace_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    Canceled,
    CancellationPending,
    AlreadyTerminal,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TaskCancelResult {
    pub task_id: String,
    pub result: CancelOutcome,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskMessageParams {
    pub task_id: String,
    #[serde(default)]
    pub data: String,
    #[serde(default)]
    pub eof: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TaskMessageResult {
    pub task_id: String,
    pub queued_bytes: u64,
    pub eof: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TaskBackgroundResult {
    pub task_id: String,
    /// `true` if a blocked foreground call was moved to the background now; `false` if the
    /// task was already in the background or had settled.
    pub backgrounded: bool,
    pub state: TaskState,
}
