//! `result.json` (docs/protocol.md): written once, atomically, by the supervisor.

use std::io::Write;
use std::path::Path;

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
    /// Reads a result.json; `Ok(None)` if there is none (yet).
    pub fn read(path: &Path) -> std::io::Result<Option<RunResult>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes to a temporary file, fsyncs it, renames it into place and fsyncs the directory,
    /// so a reader sees either no result or the whole of it.
    pub fn write_atomically(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            crate::sys::fsync_dir(dir)?;
        }
        Ok(())
    }
}
