//! The JSON documents that cross the plugin boundary. Both sides parse them with serde;
//! unknown keys are ignored, so either side may be newer than the other.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What `describe()` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginInfo {
    /// The plugin's name (`[a-z0-9_-]+`); also names its copy in the state directory.
    pub name: String,
    pub version: String,
    pub tools: Vec<ToolSpec>,
}

/// One tool, as `tool.list` shows it to hosts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the call's `args`.
    pub input_schema: Value,
    #[serde(default = "yes")]
    pub supports_background: bool,
    #[serde(default = "default_yield")]
    pub default_yield_after_ms: u64,
}

fn yes() -> bool {
    true
}

fn default_yield() -> u64 {
    30_000
}

/// What the daemon tells `plan()` about the call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanContext {
    pub session_id: String,
    pub task_id: String,
    /// The session's workspace (absolute, symlinks resolved).
    pub workspace: String,
    pub session_dir: String,
    /// The run's private temporary directory: `files` land here.
    pub tmp_dir: String,
    /// The session's sandbox profile.
    pub profile: String,
    /// How many sessions lie above this one (0 for a host's own session).
    #[serde(default)]
    pub depth: u32,
    /// Daemon configuration meant for plugins (for example `{"subagent": {"command": [..]}}`).
    #[serde(default)]
    pub config: Value,
}

/// What `plan()` returns: how to run the call. Only `argv` is required.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchPlan {
    /// The command; `argv[0]` is looked up in `PATH` when it has no slash.
    pub argv: Vec<String>,
    /// Added to the run's scrubbed environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory, relative to the workspace (or absolute inside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Bytes written to the command's stdin, which is then closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Files written into the run's private tmp before it starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<PlanFile>,
    /// A narrower profile than the session's, if the tool needs less.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Give the run a bridge socket (`SIDEJOB_BRIDGE`) to call tools of its session.
    #[serde(default)]
    pub bridge: bool,
    /// Run the command as a child session of the caller's (subagents); its bridge is scoped
    /// to the child session.
    #[serde(default)]
    pub child_session: bool,
    /// Mark the task as a service (a long-lived server).
    #[serde(default)]
    pub service: bool,
    /// One line for task lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// A file to place in the run's private tmp.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanFile {
    /// A relative path inside the private tmp (no `..`).
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub executable: bool,
}

/// What `render()` receives: the finished task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenderInput {
    pub tool: String,
    pub state: String,
    #[serde(default)]
    pub exit_code: Option<i32>,
    pub output: String,
    /// Everything else the daemon knows (the Task shape of the host protocol).
    #[serde(default)]
    pub task: Value,
}
