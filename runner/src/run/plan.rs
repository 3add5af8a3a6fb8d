//! `plan.json`: everything the supervisor needs to start, watch and settle one run, written
//! by the daemon (or `sidejob exec`, `sidejob doctor`) into the run's private directory
//! before the run starts, and made in one way only ([`LaunchPlan::builder`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::dir::PrivateDir;
use crate::sandbox::resolve::SandboxPlan;

/// The tail of the output kept once `max_output_bytes` is reached (docs/protocol.md).
pub(crate) const OUTPUT_TAIL_BYTES: u64 = 1024 * 1024;

/// Where a run's output is copied besides `output.log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Tee {
    #[default]
    None,
    /// The supervisor's stdout (`sidejob exec`); with [`Stderr::Separate`], the command's
    /// stderr goes to the supervisor's stderr.
    Stdout,
    /// Its stderr (`sidejob exec --json`, whose stdout holds only the result).
    Stderr,
}

/// Whether the command's stderr shares its stdout's pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Stderr {
    /// One pipe for both (the usual case, and the cheapest): `output.log` alone.
    #[default]
    Merged,
    /// A pipe of its own: `output.log` is still the one interleaved log, and
    /// `output.streams` beside it says which of its ranges came from stderr; a tee to the
    /// supervisor's stdout sends those to its stderr.
    Separate,
}

impl Stderr {
    fn is_merged(&self) -> bool {
        *self == Stderr::Merged
    }
}

/// Everything the supervisor needs to start, watch and settle one run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct LaunchPlan {
    pub task_id: String,
    pub session_id: String,
    pub tool: String,
    pub profile: String,
    /// The command; `argv[0]` is resolved against `PATH` from `env` when it has no slash.
    pub argv: Vec<String>,
    /// The command's whole environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// The run's private directory ([`super::dir::PrivateDir`]): the plan lives there, and
    /// the sandbox's root is staged on it.
    #[serde(alias = "run_dir")]
    pub private_dir: PathBuf,
    /// The run's public directory (`output.log`, `result.json`), as hosts see its path. The
    /// supervisor writes there only through a descriptor (see `supervisor`).
    #[serde(alias = "output_dir")]
    pub public_dir: PathBuf,
    /// The uid/gid the files the supervisor makes in `public_dir` are handed to (the
    /// session's owner); `None` leaves them the supervisor's.
    #[serde(default, alias = "output_owner")]
    pub public_owner: Option<(u32, u32)>,
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
    /// Also copy the output to the supervisor's stdout or stderr (`sidejob exec`).
    #[serde(default)]
    pub tee: Tee,
    /// Whether the command's stderr has a pipe of its own. Left out of the plan when merged,
    /// so a plan that does not ask is the same bytes as before the field existed.
    #[serde(default, skip_serializing_if = "Stderr::is_merged")]
    pub stderr: Stderr,
    /// The run's bridge (docs/plugins.md): a directory holding the socket `sock` that is exported as
    /// `SIDEJOB_BRIDGE`; the sandbox must make this path reachable inside the run's view. A
    /// directory, so a restarted daemon can bind the socket again where the run sees it.
    #[serde(default)]
    pub bridge_socket: Option<PathBuf>,
    /// The sandbox the command runs in. Required: a plan without one is refused rather
    /// than run unconfined.
    pub sandbox: SandboxPlan,
}

/// The SIGTERM → SIGKILL grace of a run whose profile and configuration name none.
pub(crate) const DEFAULT_KILL_GRACE_MS: u64 = 5_000;
/// The head of the output kept in `output.log` when nothing names a smaller one.
pub(crate) const DEFAULT_MAX_OUTPUT_BYTES: u64 = 64 * 1024 * 1024;

impl LaunchPlan {
    /// The one way a plan is made (the daemon's submission, `sidejob exec`, `sidejob doctor`):
    /// `argv` in `cwd` with exactly `env`, inside `sandbox`, its files in `private_dir`. Until the
    /// builder says otherwise: a fresh task id, the session named after the tool, the public
    /// files in `private_dir` too and left the supervisor's, the supervisor's credentials, no
    /// timeout, [`DEFAULT_KILL_GRACE_MS`], [`DEFAULT_MAX_OUTPUT_BYTES`], no bridge.
    pub(crate) fn builder(
        tool: &str,
        profile: &str,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: PathBuf,
        private_dir: PathBuf,
        sandbox: SandboxPlan,
    ) -> PlanBuilder {
        PlanBuilder(LaunchPlan {
            task_id: crate::ids::ulid(),
            session_id: tool.to_owned(),
            tool: tool.to_owned(),
            profile: profile.to_owned(),
            argv,
            env,
            cwd,
            public_dir: private_dir.clone(),
            private_dir,
            public_owner: None,
            caller: None,
            uid: None,
            gid: None,
            timeout_ms: None,
            kill_grace_ms: DEFAULT_KILL_GRACE_MS,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            tee: Tee::None,
            stderr: Stderr::Merged,
            bridge_socket: None,
            sandbox,
        })
    }

    /// `output.log` as hosts see its path.
    pub(crate) fn output_path(&self) -> PathBuf {
        self.public_dir.join(super::dir::OUTPUT)
    }

    /// The private directory, to name its files.
    pub(crate) fn private(&self) -> PrivateDir {
        PrivateDir::at(self.private_dir.clone())
    }
}

/// What differs from [`LaunchPlan::builder`]'s defaults; `None` keeps a default.
pub(crate) struct PlanBuilder(LaunchPlan);

impl PlanBuilder {
    pub(crate) fn task(mut self, task_id: &str, session_id: &str) -> Self {
        self.0.task_id = task_id.to_owned();
        self.0.session_id = session_id.to_owned();
        self
    }

    /// Where `output.log` and `result.json` go (as hosts see the path), handed to `owner`.
    pub(crate) fn public_dir(mut self, dir: PathBuf, owner: Option<(u32, u32)>) -> Self {
        self.0.public_dir = dir;
        self.0.public_owner = owner;
        self
    }

    /// The credentials the caller's paths are opened with.
    pub(crate) fn caller(mut self, creds: crate::sys::dirfd::Creds) -> Self {
        self.0.caller = Some(creds);
        self
    }

    pub(crate) fn run_as(mut self, uid: Option<u32>, gid: Option<u32>) -> Self {
        (self.0.uid, self.0.gid) = (uid, gid);
        self
    }

    pub(crate) fn timeout_ms(mut self, ms: Option<u64>) -> Self {
        self.0.timeout_ms = ms;
        self
    }

    pub(crate) fn kill_grace_ms(mut self, ms: Option<u64>) -> Self {
        self.0.kill_grace_ms = ms.unwrap_or(self.0.kill_grace_ms);
        self
    }

    pub(crate) fn max_output_bytes(mut self, bytes: Option<u64>) -> Self {
        self.0.max_output_bytes = bytes.unwrap_or(self.0.max_output_bytes);
        self
    }

    /// Also copies the output to the supervisor's stdout or stderr (`sidejob exec`).
    pub(crate) fn tee(mut self, to: Tee) -> Self {
        self.0.tee = to;
        self
    }

    /// Gives the command's stderr a pipe of its own (see [`Stderr`]).
    pub(crate) fn stderr(mut self, stderr: Stderr) -> Self {
        self.0.stderr = stderr;
        self
    }

    pub(crate) fn bridge(mut self, socket_dir: Option<PathBuf>) -> Self {
        self.0.bridge_socket = socket_dir;
        self
    }

    pub(crate) fn build(self) -> LaunchPlan {
        self.0
    }
}
