//! Parameters and results of every method, and the Task shape (docs/protocol.md).
//! Fields may be added, never renamed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::names::named;

named! {
    /// Session states (docs/protocol.md).
    pub(crate) enum SessionState {
        Open = "open",
        Closed = "closed",
        /// Closed, and its directory removed (`session.close {delete: true}`).
        Deleted = "deleted",
    }
}

named! {
    /// Task states (docs/protocol.md).
    pub enum TaskState {
        Queued = "queued",
        Running = "running",
        AwaitingInput = "awaiting_input",
        Scheduled = "scheduled",
        Succeeded = "succeeded",
        Failed = "failed",
        Canceled = "canceled",
    }
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
}

named! {
    /// Why a task failed (docs/protocol.md).
    pub enum FailReason {
        ExitCode = "exit_code",
        Signal = "signal",
        Timeout = "timeout",
        Lost = "lost",
        SpawnError = "spawn_error",
        SandboxError = "sandbox_error",
    }
}

named! {
    /// Who received a terminal result (docs/protocol.md): `pending` until someone does.
    pub enum Delivery {
        Inline = "inline",
        Wait = "wait",
        Wake = "wake",
        Pending = "pending",
    }
}

named! {
    pub enum TaskKind {
        Call = "call",
        Monitor = "monitor",
    }
}

/// Extra access a `tool.call` asks for, for its own run only (`grants`): paths the caller
/// may read or write on the host, checked with the caller's credentials before anything is
/// started, and hosts within the daemon's `[grants] allow`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallGrants {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readable: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable: Vec<String>,
    /// `host`, `host:port`, `*.suffix`, an address or a range, as a profile's
    /// `[network] allow`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
}

impl CallGrants {
    pub fn is_empty(&self) -> bool {
        self.readable.is_empty() && self.writable.is_empty() && self.allow.is_empty()
    }
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
    /// What the call was granted beyond its profile (`tool.call` `grants`), when anything.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub grants: Option<CallGrants>,
    /// What the run ran into, in one line: limits it hit and network connections or lookups
    /// its allow-list refused (the details are in `result.json` `violations`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub violations: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct InitializeParams {
    #[serde(default)]
    pub protocol_version: Option<u32>,
    #[serde(default)]
    pub client: Option<Value>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct InitializeResult {
    pub protocol_version: u32,
    pub server: ServerInfo,
    pub uid: u32,
    pub methods: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ServerInfo {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionOpenParams {
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
    /// Root only: reopen a session another uid owns (and act in it as that user).
    #[serde(default)]
    pub adopt: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct SessionOpenResult {
    pub session_id: String,
    pub session_dir: String,
    pub workspace: String,
    pub profile: String,
    /// Whose session it is (differs from the caller's uid only when root adopted it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionCloseParams {
    pub session_id: String,
    #[serde(default)]
    pub cancel: Option<bool>,
    /// Also remove the session's directory (one the daemon chose) and its runs' output.
    #[serde(default)]
    pub delete: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SessionCloseResult {
    pub session_id: String,
    pub closed: bool,
    pub canceled_tasks: Vec<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionStatusParams {
    #[serde(default)]
    pub session_id: Option<String>,
}

/// One session's activity. `session.status` with a `session_id` returns one of these;
/// without one it returns `{sessions: [..]}` for every session the caller owns.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct SessionStatus {
    pub session_id: String,
    pub active: bool,
    pub running: u32,
    pub queued: u32,
    pub awaiting_input: u32,
    pub scheduled: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct SessionInfo {
    pub session_id: String,
    pub owner_uid: u32,
    pub workspace: String,
    pub session_dir: String,
    pub profile: String,
    pub proactive_wake: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parent_session_id: Option<String>,
    pub state: SessionState,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub closed_at: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SessionListResult {
    pub sessions: Vec<SessionInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ToolInfo {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub supports_background: bool,
    pub default_yield_after_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ToolListResult {
    pub tools: Vec<ToolInfo>,
    /// Why plugin files were not loaded (one line each), when some were not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugin_errors: Vec<String>,
}

/// Whether a `tool.call` is still blocked on its task (the registry's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TaskMode {
    Foreground,
    #[default]
    Background,
}

/// How the command's stdin is wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StdinMode {
    #[default]
    Null,
    Pipe,
}

/// Whether the command's stderr is kept apart from its stdout (`output.log` is one
/// interleaved log either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StderrMode {
    #[default]
    Merged,
    /// Its own pipe: `task.output` with `streams: true` says which text came from which.
    Separate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCallParams {
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
    /// `on_terminal` (default): a background completion wakes the host; `silent`: it does not.
    #[serde(default)]
    pub wake: Option<WakeMode>,
    /// Root only: start the call in a session another uid owns (it runs as that user).
    #[serde(default)]
    pub adopt: Option<bool>,
    /// What becomes of the call if its connection goes away while it is in the foreground:
    /// `background` (default) keeps it running with its result delivered later; `cancel`
    /// stops it (an MCP client that went away is not coming back for the result).
    #[serde(default)]
    pub on_disconnect: Option<OnDisconnect>,
    /// `separate`: the command's stderr gets a pipe of its own (default `merged`).
    #[serde(default)]
    pub stderr: Option<StderrMode>,
    /// Extra paths and hosts for this run only (see [`CallGrants`]).
    #[serde(default)]
    pub grants: Option<CallGrants>,
}

/// What a foreground call becomes when its caller's connection goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OnDisconnect {
    #[default]
    Background,
    Cancel,
}

/// `tool.call`'s result: either the finished run, or a handle to the one still running.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub(crate) enum ToolCallResult {
    Completed(CompletedCall),
    Running(RunningCall),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct CompletedCall {
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
    /// The tool plugin's rendering of the result for the model, when it has one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rendered: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct RunningCall {
    pub task_id: String,
    pub output: String,
    pub output_path: String,
    pub result_path: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hint: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskListParams {
    pub session_id: String,
    #[serde(default)]
    pub states: Option<Vec<TaskState>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskListResult {
    pub tasks: Vec<Task>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskIdParams {
    pub task_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskOutputParams {
    pub task_id: String,
    #[serde(default)]
    pub offset: Option<u64>,
    #[serde(default)]
    pub max_bytes: Option<u64>,
    #[serde(default)]
    pub tail_bytes: Option<u64>,
    /// Also answer `segments`: the page cut by the stream each part came from.
    #[serde(default)]
    pub streams: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct TaskOutputResult {
    pub data: String,
    pub offset: u64,
    pub next_offset: u64,
    pub size: u64,
    pub eof: bool,
    pub truncated: bool,
    /// With `streams: true`: `data` in order, in parts of one stream each.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub segments: Option<Vec<OutputSegment>>,
}

/// The command's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OutputStream {
    Stdout,
    Stderr,
}

/// A part of a `task.output` page that came from one stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct OutputSegment {
    pub stream: OutputStream,
    pub text: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskWaitParams {
    pub task_id: String,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskCancelParams {
    pub task_id: String,
    #[serde(default)]
    pub grace_ms: Option<u64>,
    /// `silent`: the caller reads the outcome itself (`task.cancel` waits for it, `task.wait`
    /// takes it), so the stop it asked for makes no wake. Default `on_terminal`.
    #[serde(default)]
    pub wake: Option<WakeMode>,
    /// Take back an earlier cancel whose grace has not run out: the run is not killed.
    #[serde(default)]
    pub withdraw: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CancelOutcome {
    Canceled,
    CancellationPending,
    AlreadyTerminal,
    /// A monitor whose schedule is now disabled.
    Disarmed,
    /// `withdraw`: no cancel stands (it was taken back within its grace, or none was asked).
    Withdrawn,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskCancelResult {
    pub task_id: String,
    pub result: CancelOutcome,
    /// With `withdraw` and `withdrawn`: whether a cancel stood and is taken back (false: none
    /// had reached the run yet, e.g. one sent a moment before on another connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_back: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskMessageParams {
    pub task_id: String,
    #[serde(default)]
    pub data: String,
    #[serde(default)]
    pub eof: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskMessageResult {
    pub task_id: String,
    pub queued_bytes: u64,
    pub eof: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskBackgroundResult {
    pub task_id: String,
    /// `true` if a blocked foreground call was moved to the background now; `false` if the
    /// task was already in the background or had settled.
    pub backgrounded: bool,
    pub state: TaskState,
}

/// A durable inbox entry (docs/protocol.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Notification {
    pub id: String,
    pub session_id: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub task_id: Option<String>,
    /// `info | success | warn | error | action_required`
    pub severity: String,
    /// `wake` (an `[automatic]` prompt), `notice`, `schedule`, `action_required`
    pub kind: String,
    pub text: String,
    pub created_at: String,
    pub acked: bool,
}

/// Whether a background completion wakes the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WakeMode {
    #[default]
    OnTerminal,
    Silent,
}

impl WakeMode {}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsSubscribeParams {
    #[serde(default)]
    pub session_ids: Option<Vec<String>>,
    #[serde(default)]
    pub since_seq: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EventsSubscribeResult {
    /// The sessions this connection now receives pushes for (`null`: every session the caller
    /// owns, including ones opened later).
    pub session_ids: Option<Vec<String>>,
    /// The newest seq at the time of subscribing.
    pub seq: i64,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct InboxListParams {
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub unread_only: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct InboxListResult {
    pub notifications: Vec<Notification>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InboxAckParams {
    pub ids: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct InboxAckResult {
    /// Ids acked by this call.
    pub acked: Vec<String>,
    /// Ids that were already acked.
    pub already_acked: Vec<String>,
}

/// Push: a task changed state.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskUpdatedNotification {
    pub seq: i64,
    pub task: Task,
}

/// Push: a new inbox entry (a wake, a notice, a scheduled prompt).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct NotificationNotification {
    pub seq: i64,
    pub notification: Notification,
}

/// Push: this connection fell behind and missed pushes from `from_seq` on; subscribe again
/// with `since_seq` set to the last seq it saw.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EventsGapNotification {
    pub from_seq: i64,
}

/// Push (to connections that called `events.subscribe`): the tools on offer changed (a plugin
/// was added, removed or reloaded); call `tool.list` again.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolsChangedNotification {}

/// What happens to occurrences that fell due while the daemon was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CatchUp {
    /// Deliver one occurrence for all that were missed.
    #[default]
    Once,
    /// Deliver every missed occurrence.
    All,
    /// Deliver none of them; resume at the next one.
    Skip,
}

impl CatchUp {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CatchUp::Once => "once",
            CatchUp::All => "all",
            CatchUp::Skip => "skip",
        }
    }
}

/// A schedule's action: deliver a prompt as a wake, or start a tool call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum ScheduleAction {
    Prompt(String),
    Call(ScheduledCall),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScheduledCall {
    pub tool: String,
    #[serde(default)]
    pub args: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake: Option<WakeMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScheduleCreateParams {
    pub session_id: String,
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// RFC 3339.
    #[serde(default)]
    pub at: Option<String>,
    #[serde(default)]
    pub every_ms: Option<u64>,
    /// Five fields: minute hour day-of-month month day-of-week.
    #[serde(default)]
    pub cron: Option<String>,
    /// IANA time zone for `cron` (default UTC).
    #[serde(default)]
    pub timezone: Option<String>,
    #[serde(default)]
    pub max_occurrences: Option<u32>,
    #[serde(default)]
    pub catch_up: Option<CatchUp>,
    pub action: ScheduleAction,
    /// Root only: arm it in a session another uid owns (its calls run as that user).
    #[serde(default)]
    pub adopt: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ScheduleCreateResult {
    pub schedule_id: String,
    pub task_id: String,
    /// When it first fires (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_due_at: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScheduleListParams {
    pub session_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ScheduleInfo {
    pub schedule_id: String,
    pub session_id: String,
    pub task_id: String,
    pub trigger: Value,
    pub action: ScheduleAction,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_occurrences: Option<u32>,
    pub catch_up: CatchUp,
    pub occurrences: u32,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_due_at: Option<String>,
    pub enabled: bool,
    pub created_at: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ScheduleListResult {
    pub schedules: Vec<ScheduleInfo>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScheduleCancelParams {
    pub schedule_id: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ScheduleCancelResult {
    pub schedule_id: String,
    pub result: CancelOutcome,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct DaemonStatusParams {}

/// `daemon.status`: what the daemon is, what it has loaded, and counters a monitoring agent
/// can scrape. Task counts cover the sessions the caller may see (all of them for root).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct DaemonStatusResult {
    pub version: String,
    pub pid: u32,
    pub started_at: String,
    pub uptime_ms: u64,
    pub socket: String,
    /// `true` when the listening socket came from the service manager (socket activation).
    pub socket_activated: bool,
    pub state_dir: String,
    pub tools: Vec<ToolSource>,
    /// Plugin files that were refused, one line each.
    pub plugin_errors: Vec<String>,
    /// Sandbox profiles on disk that do not load, one line each.
    pub profile_errors: Vec<String>,
    /// Open sessions.
    pub sessions: u32,
    /// Tasks by state, every state listed (zero included).
    pub tasks: std::collections::BTreeMap<String, u32>,
    /// Calls waiting for a free run slot (`queued`).
    pub queue_depth: u32,
    /// Notifications pushed to at least one subscribed host since the daemon started.
    pub wakes_pushed: u64,
    /// Resource limits runs hit (`timeout`, `output_cap`, `memory`, …) since the daemon started.
    pub violations: u64,
    /// `task.wait` calls waiting for a live run to settle, now.
    #[serde(default)]
    pub waits: u64,
    /// Whether the daemon-wide counters (terminal states, `wakes_pushed`, `violations`, `waits`) were
    /// given: to root, and to the user an unprivileged daemon serves; zeros to anyone else.
    #[serde(default)]
    pub daemon_wide_counters: bool,
}

/// A tool and the plugin file it was loaded from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ToolSource {
    pub name: String,
    pub plugin: String,
}
