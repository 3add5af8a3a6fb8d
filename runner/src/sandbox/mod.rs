//! What a run is allowed to do, as data (sandbox-profiles/README.md): profiles ([`profile`]), where they come
//! from ([`catalog`]), how one becomes the sandbox part of a launch plan ([`resolve`]), and
//! the launch plan the daemon (or `sidejob exec`) writes and the supervisor carries out.
//! Pure: nothing here touches the system; [`linux`] applies a plan.

pub mod catalog;
pub mod linux;
pub mod profile;
pub mod resolve;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use catalog::{Catalog, CatalogError};
pub use profile::{Limits, Network, Profile, ProfileError, RunAs};
pub use resolve::{MountSpec, SandboxPlan};

/// The tail of the output kept once `max_output_bytes` is reached (docs/protocol.md).
pub const OUTPUT_TAIL_BYTES: u64 = 1024 * 1024;

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
    /// The run's private directory (see `run_dir`): the plan lives there, and the sandbox's
    /// root is staged on it.
    pub run_dir: PathBuf,
    /// The run's public directory (`output.log`, `result.json`), as hosts see its path. The
    /// supervisor writes there only through a descriptor (see `supervisor`).
    pub output_dir: PathBuf,
    /// The uid/gid the files the supervisor makes in `output_dir` are handed to (the
    /// session's owner); `None` leaves them the supervisor's.
    #[serde(default)]
    pub output_owner: Option<(u32, u32)>,
    /// The credentials caller paths (`MountSpec::as_caller`) are opened with; `None` uses
    /// the supervisor's own.
    #[serde(default)]
    pub caller: Option<crate::sys::dirfd::Creds>,
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
    /// The run's bridge (docs/plugins.md): a directory holding the socket `sock` that is exported as
    /// `SIDEJOB_BRIDGE`; the sandbox must make this path reachable inside the run's view. A
    /// directory, so a restarted daemon can bind the socket again where the run sees it.
    #[serde(default)]
    pub bridge_socket: Option<PathBuf>,
    /// The sandbox the command runs in. Required: a plan without one is refused rather
    /// than run unconfined.
    pub sandbox: SandboxPlan,
}

impl LaunchPlan {
    /// `output.log` as hosts see its path.
    pub fn output_path(&self) -> PathBuf {
        self.output_dir.join(crate::run_dir::OUTPUT)
    }

    pub fn private_dir(&self) -> crate::run_dir::PrivateDir {
        crate::run_dir::PrivateDir::at(self.run_dir.clone())
    }
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

/// Why a call's sandbox cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum CallSandboxError {
    /// An unknown or invalid profile, or one wider than the session's.
    #[error("{0}")]
    Invalid(String),
    /// The profile needs a layer this host lacks (`sandbox_unavailable`, -32003).
    #[error("{0}")]
    Unavailable(String),
}

/// The sandbox side of one daemon call, ready to go into its [`LaunchPlan`].
#[derive(Debug, Clone)]
pub struct CallSandbox {
    pub profile: String,
    pub sandbox: SandboxPlan,
    /// The scrubbed environment (the daemon passes nothing of its own).
    pub env: Vec<(String, String)>,
    pub run_as: RunAs,
    pub timeout_ms: Option<u64>,
    pub kill_grace_ms: Option<u64>,
    pub max_output_bytes: Option<u64>,
}

/// Loads a profile by name and checks that this host can enforce it and that a session owned
/// by `owner_uid` may use it (see [`Profile::check_run_as_for`]).
pub fn check_profile(
    catalog: &Catalog,
    name: &str,
    owner_uid: u32,
) -> Result<Profile, CallSandboxError> {
    let profile = catalog
        .get(name)
        .map_err(|e| CallSandboxError::Invalid(e.to_string()))?;
    profile
        .check_run_as_for(owner_uid)
        .map_err(CallSandboxError::Invalid)?;
    let probe = resolve::resolve(
        &profile,
        &resolve::Context {
            workspace: std::path::Path::new("/"),
            session_dir: None,
            home: None,
            caller_env: &[],
        },
    )
    .map_err(CallSandboxError::Invalid)?;
    let missing = linux::Availability::cached().missing(&probe.sandbox);
    if !missing.is_empty() && !profile.best_effort {
        return Err(CallSandboxError::Unavailable(format!(
            "profile {name:?} needs sandbox layers this host lacks: {}; use a profile with best_effort = true to run without them",
            linux::describe_missing(&missing)
        )));
    }
    Ok(profile)
}

/// Resolves the session's profile, or the narrower one a call names, for a daemon run in a
/// session owned by `owner_uid`. Profiles are read again for every run (an edit applies
/// without a restart), so the owner is checked against them here, not only at `session.open`.
pub fn for_call(
    session_profile: &str,
    call_profile: Option<&str>,
    owner_uid: u32,
    workspace: &std::path::Path,
    session_dir: &std::path::Path,
) -> Result<CallSandbox, CallSandboxError> {
    let catalog = Catalog::new(Catalog::default_dir());
    let session = check_profile(&catalog, session_profile, owner_uid)?;
    let profile = match call_profile {
        Some(name) if name != session.name => {
            let p = check_profile(&catalog, name, owner_uid)?;
            p.check_narrows(&session).map_err(|m| {
                CallSandboxError::Invalid(format!(
                    "{m}; a call may only narrow its session's profile"
                ))
            })?;
            p
        }
        _ => session,
    };
    let r = resolve::resolve(
        &profile,
        &resolve::Context {
            workspace,
            session_dir: Some(session_dir),
            home: None,
            caller_env: &[],
        },
    )
    .map_err(CallSandboxError::Invalid)?;
    Ok(CallSandbox {
        profile: profile.name.clone(),
        sandbox: r.sandbox,
        env: r.env,
        run_as: profile.run_as,
        timeout_ms: r.timeout_ms,
        kill_grace_ms: r.kill_grace_ms,
        max_output_bytes: profile.limits.output,
    })
}
