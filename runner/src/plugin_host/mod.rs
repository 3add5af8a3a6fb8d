//! The tools sidejob offers. Tools are planners: they describe themselves and turn a call's
//! arguments into a launch plan; they never start processes (SPEC §10). The plugin issue loads
//! them from `.so` files; until then the `bash` tool is built in.

mod bash;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::protocol::ToolInfo;

/// What a tool needs to know about the call it plans.
pub struct PlanContext<'a> {
    pub workspace: &'a Path,
    pub session_id: &'a str,
    pub task_id: &'a str,
}

/// A tool's plan for one call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    pub argv: Vec<String>,
    /// Added to the scrubbed base environment.
    pub env: Vec<(String, String)>,
    /// Working directory (inside the workspace).
    pub cwd: PathBuf,
    /// One line for task lists.
    pub summary: String,
}

/// Why a call's arguments were refused; shown to the host as `invalid_params`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

pub trait Planner: Send + Sync {
    fn describe(&self) -> ToolInfo;
    fn plan(&self, args: &Value, ctx: &PlanContext) -> Result<ToolPlan, PlanError>;
}

/// Every tool, by name.
pub struct ToolHost {
    tools: Vec<Box<dyn Planner>>,
}

impl Default for ToolHost {
    fn default() -> Self {
        ToolHost {
            tools: vec![Box::new(bash::Bash)],
        }
    }
}

impl ToolHost {
    pub fn list(&self) -> Vec<ToolInfo> {
        self.tools.iter().map(|t| t.describe()).collect()
    }

    pub fn get(&self, name: &str) -> Option<&dyn Planner> {
        self.tools
            .iter()
            .find(|t| t.describe().name == name)
            .map(|b| b.as_ref())
    }
}

/// Resolves `workdir` (relative to the workspace, or absolute) and refuses anything that
/// lands outside the workspace once symlinks are followed.
pub fn resolve_workdir(workspace: &Path, workdir: Option<&str>) -> Result<PathBuf, PlanError> {
    let Some(dir) = workdir.filter(|d| !d.is_empty()) else {
        return Ok(workspace.to_path_buf());
    };
    let joined = workspace.join(dir);
    let real = joined
        .canonicalize()
        .map_err(|e| PlanError(format!("workdir {}: {e}", joined.display())))?;
    let root = workspace
        .canonicalize()
        .map_err(|e| PlanError(format!("workspace {}: {e}", workspace.display())))?;
    if !real.starts_with(&root) {
        return Err(PlanError(format!(
            "workdir {} is outside the workspace {}",
            real.display(),
            root.display()
        )));
    }
    if !real.is_dir() {
        return Err(PlanError(format!(
            "workdir {} is not a directory",
            real.display()
        )));
    }
    Ok(real)
}
