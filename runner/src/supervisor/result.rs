//! `result.json` (docs/protocol.md): written once, atomically, by the supervisor.

use std::os::fd::BorrowedFd;

use serde::{Deserialize, Serialize};

use crate::protocol::{FailReason, TaskState};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    pub task_id: String,
    pub session_id: String,
    pub tool: String,
    pub state: TaskState,
    pub reason: Option<FailReason>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_at: String,
    pub ended_at: String,
    pub duration_ms: u64,
    pub output_path: String,
    pub output_bytes: u64,
    pub output_truncated: bool,
    pub leftover_processes: u32,
    pub profile: String,
    pub sandbox_layers: Vec<String>,
    /// Resource violations seen during the run (`timeout`, `output_cap`, …).
    #[serde(default)]
    pub violations: Vec<String>,
    /// What went wrong, when the run could not start or was stopped by sidejob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RunResult {
    /// Writes `result.json` into the run's public directory atomically and durably (a fresh
    /// temporary file, fsync, rename, fsync of the directory: a reader sees no result or the
    /// whole of it), handed to `owner`.
    pub fn write_atomically(
        &self,
        dir: BorrowedFd<'_>,
        owner: Option<(u32, u32)>,
    ) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        crate::sys::dirfd::write_atomically_at(dir, crate::run_dir::RESULT, &bytes, 0o600, owner)
    }
}
