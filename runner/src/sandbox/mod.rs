//! What a run is allowed to do, as data: the launch plan the daemon writes into the run
//! directory and the supervisor carries out. Pure: nothing here touches the system.
//!
//! The sandbox issue extends [`LaunchPlan`] with the profile's layers (mount view, landlock,
//! seccomp, limits); the supervisor applies whatever the plan names, in one place.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The tail of the output kept once `max_output_bytes` is reached (SPEC §4).
pub const OUTPUT_TAIL_BYTES: u64 = 1024 * 1024;

/// The profiles shipped in `sandbox-profiles/`.
pub const SHIPPED_PROFILES: &[&str] = &["read-only", "workspace-write", "ci", "network"];

/// Everything the supervisor needs to start, watch and settle one run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LaunchPlan {
    pub task_id: String,
    pub session_id: String,
    pub tool: String,
    pub profile: String,
    /// The command; `argv[0]` is resolved against `PATH` from `env` when it has no slash.
    pub argv: Vec<String>,
    /// The command's whole environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// `<session_dir>/.background/<task_id>`: output.log, result.json, plan.json live here.
    pub run_dir: PathBuf,
    /// The uid/gid the command runs as; `None` keeps the supervisor's.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Wall-clock cap from the start of the run.
    pub timeout_ms: Option<u64>,
    /// Default SIGTERM → SIGKILL grace when the cap is reached.
    pub kill_grace_ms: u64,
    /// Head of the output kept in output.log; the last [`OUTPUT_TAIL_BYTES`] are kept too.
    pub max_output_bytes: u64,
    /// Also copy the output to the supervisor's stdout (`sidejob exec`).
    #[serde(default)]
    pub tee_stdout: bool,
}

impl LaunchPlan {
    pub fn output_path(&self) -> PathBuf {
        self.run_dir.join("output.log")
    }

    pub fn result_path(&self) -> PathBuf {
        self.run_dir.join("result.json")
    }

    pub fn plan_path(&self) -> PathBuf {
        self.run_dir.join("plan.json")
    }
}

/// The command's environment when a plan names nothing else: a fixed, scrubbed set.
pub fn base_env(workspace: &str, task_id: &str, session_id: &str) -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOME".into(), workspace.into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("TERM".into(), "dumb".into()),
        ("SIDEJOB_TASK_ID".into(), task_id.into()),
        ("SIDEJOB_SESSION_ID".into(), session_id.into()),
    ]
}

/// Resolves a command name against a `PATH` value, as `execvp` would.
pub fn resolve_program(name: &str, path_var: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_execvp() {
        assert_eq!(resolve_program("/bin/x", ""), Some(PathBuf::from("/bin/x")));
        let sh = resolve_program("sh", "/nonexistent:/usr/bin:/bin").unwrap();
        assert!(sh.ends_with("sh"));
        assert_eq!(
            resolve_program("no-such-program-sidejob", "/usr/bin:/bin"),
            None
        );
    }
}
