//! What a run is allowed to do, as data (sandbox-profiles/README.md): profiles ([`profile`]), where they come
//! from ([`catalog`]), how one becomes the sandbox part of a launch plan ([`resolve`]), and
//! the launch plan the daemon (or `sidejob exec`) writes and the supervisor carries out.
//! Pure: nothing here touches the system; [`linux`] applies a plan.

pub(crate) mod caches;
pub(crate) mod catalog;
pub(crate) mod layer;
pub(crate) mod linux;
pub(crate) mod profile;
pub(crate) mod resolve;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub(crate) use catalog::Catalog;
pub(crate) use profile::{Network, Profile, RunAs};
pub(crate) use resolve::{MountSpec, SandboxPlan};

/// The tail of the output kept once `max_output_bytes` is reached (docs/protocol.md).
pub(crate) const OUTPUT_TAIL_BYTES: u64 = 1024 * 1024;

/// Where a run's output is copied besides `output.log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Tee {
    #[default]
    None,
    /// The supervisor's stdout (`sidejob exec`).
    Stdout,
    /// Its stderr (`sidejob exec --json`, whose stdout holds only the result).
    Stderr,
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
    /// Also copy the output to the supervisor's stdout or stderr (`sidejob exec`).
    #[serde(default)]
    pub tee: Tee,
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
    /// `argv` in `cwd` with exactly `env`, inside `sandbox`, its files in `run_dir`. Until the
    /// builder says otherwise: a fresh task id, the session named after the tool, the public
    /// files in `run_dir` too and left the supervisor's, the supervisor's credentials, no
    /// timeout, [`DEFAULT_KILL_GRACE_MS`], [`DEFAULT_MAX_OUTPUT_BYTES`], no bridge.
    pub(crate) fn builder(
        tool: &str,
        profile: &str,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: PathBuf,
        run_dir: PathBuf,
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
            output_dir: run_dir.clone(),
            run_dir,
            output_owner: None,
            caller: None,
            uid: None,
            gid: None,
            timeout_ms: None,
            kill_grace_ms: DEFAULT_KILL_GRACE_MS,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            tee: Tee::None,
            bridge_socket: None,
            sandbox,
        })
    }

    /// `output.log` as hosts see its path.
    pub(crate) fn output_path(&self) -> PathBuf {
        self.output_dir.join(crate::run_dir::OUTPUT)
    }

    pub(crate) fn private_dir(&self) -> crate::run_dir::PrivateDir {
        crate::run_dir::PrivateDir::at(self.run_dir.clone())
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
        self.0.output_dir = dir;
        self.0.output_owner = owner;
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

    pub(crate) fn bridge(mut self, socket_dir: Option<PathBuf>) -> Self {
        self.0.bridge_socket = socket_dir;
        self
    }

    pub(crate) fn build(self) -> LaunchPlan {
        self.0
    }
}

/// A user's home directory for `{home}`, looked up in the password database the first time a
/// profile needs it: most profiles never name it, and the lookup (NSS: `/etc/passwd` read
/// anew, or a directory service asked) is a tenth of a millisecond on a run's path.
pub(crate) struct Home {
    uid: Option<u32>,
    dir: std::cell::OnceCell<Option<PathBuf>>,
}

impl Home {
    /// `uid`'s home, not looked up yet.
    pub(crate) fn of(uid: u32) -> Home {
        Home {
            uid: Some(uid),
            dir: std::cell::OnceCell::new(),
        }
    }

    /// A home already known (or known to be none).
    pub(crate) fn known(dir: Option<PathBuf>) -> Home {
        Home {
            uid: None,
            dir: std::cell::OnceCell::from(dir),
        }
    }

    pub(crate) fn get(&self) -> Option<&std::path::Path> {
        self.dir
            .get_or_init(|| self.uid.and_then(home_of))
            .as_deref()
    }
}

/// A user's home directory, from the password database (never from `$HOME`, which the caller
/// controls). `{home}` in a profile stands for it.
pub(crate) fn home_of(uid: u32) -> Option<PathBuf> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.dir)
        .filter(|d| d.is_absolute() && d != std::path::Path::new("/"))
}

/// Is a host path in the view a plan builds (below one of its mounts' sources)?
pub(crate) fn in_view(path: &std::path::Path, plan: &SandboxPlan) -> bool {
    plan.mounts
        .iter()
        .any(|m| m.source.as_ref().is_some_and(|s| path.starts_with(s)))
}

/// Resolves a command name against a `PATH` value, as `execvp` would.
pub(crate) fn resolve_program(name: &str, path_var: &str) -> Option<PathBuf> {
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
pub(crate) enum CallSandboxError {
    /// An unknown or invalid profile, or one wider than the session's.
    #[error("{0}")]
    Invalid(String),
    /// The profile needs a layer this host lacks (`sandbox_unavailable`, -32003).
    #[error("{0}")]
    Unavailable(String),
}

/// The sandbox side of one daemon call, ready to go into its [`LaunchPlan`].
#[derive(Debug, Clone)]
pub(crate) struct CallSandbox {
    pub profile: String,
    pub sandbox: SandboxPlan,
    /// The scrubbed environment (the daemon passes nothing of its own).
    pub env: Vec<(String, String)>,
    pub run_as: RunAs,
    pub timeout_ms: Option<u64>,
    pub kill_grace_ms: Option<u64>,
    pub max_output_bytes: Option<u64>,
}

/// What the administrator grants one kind of run beyond its profile (`[subagent]`: the
/// agent's configuration and model API hosts), applied after the profile was checked against
/// the session's, and to that run only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Grants {
    pub readable: Vec<String>,
    pub executable: Vec<String>,
    pub writable: Vec<String>,
    pub egress: Option<crate::egress::Policy>,
    pub env: Vec<(String, String)>,
}

impl Grants {
    fn apply(&self, p: &mut Profile) {
        let add = |list: &mut Vec<String>, paths: &[String]| {
            for path in paths {
                if !list.contains(path) {
                    list.push(path.clone());
                }
            }
        };
        add(&mut p.readable, &self.readable);
        add(&mut p.executable, &self.executable);
        add(&mut p.readable, &self.writable);
        add(&mut p.writable, &self.writable);
        if let Some(policy) = &self.egress {
            if p.network != Network::Host {
                p.network = Network::Loopback;
                p.egress.get_or_insert_with(Default::default).extend(policy);
            }
        }
        for (k, v) in &self.env {
            p.env_set.retain(|(name, _)| name != k);
            p.env_set.push((k.clone(), v.clone()));
        }
    }
}

/// Who a run runs as: the profile's fixed ids, else the session owner when the daemon is root
/// (root runs other users' commands as those users), else the daemon's own ids (`None`).
pub(crate) fn run_ids(run_as: RunAs, owner: (u32, u32)) -> (Option<u32>, Option<u32>) {
    match run_as {
        RunAs::Ids { uid, gid } => (Some(uid), Some(gid)),
        RunAs::Caller if crate::sys::getuid() == 0 && owner.0 != 0 => {
            (Some(owner.0), Some(owner.1))
        }
        RunAs::Caller => (None, None),
    }
}

/// Loads a profile by name and checks that this host can enforce it and that a session owned
/// by `owner_uid` may use it (see [`Profile::check_run_as_for`]).
pub(crate) fn check_profile(
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
    let missing = linux::Availability::cached().missing(profile.network, &profile.limits);
    if !missing.is_empty() && !profile.best_effort {
        return Err(CallSandboxError::Unavailable(format!(
            "profile {name:?} needs sandbox layers this host lacks: {}; use a profile with best_effort = true to run without them",
            linux::describe_missing(&missing)
        )));
    }
    Ok(profile)
}

/// Is profile `name` no wider than `ceiling` (both from the catalog)?
pub(crate) fn narrows(
    catalog: &Catalog,
    name: &str,
    ceiling: &str,
    owner_uid: u32,
) -> Result<bool, CallSandboxError> {
    let p = check_profile(catalog, name, owner_uid)?;
    let c = check_profile(catalog, ceiling, owner_uid)?;
    Ok(p.name == c.name || p.check_narrows(&c).is_ok())
}

/// The run a daemon call is for: where, for whom, and what it is granted.
pub(crate) struct CallFor<'a> {
    pub workspace: &'a std::path::Path,
    pub session_dir: &'a std::path::Path,
    /// The session owner's uid and gid.
    pub owner: (u32, u32),
    /// The daemon's state directory (for the profile's caches).
    pub state_dir: &'a std::path::Path,
    pub grants: Option<&'a Grants>,
}

/// Resolves the session's profile, or the narrower one a call names, for a daemon run in a
/// session owned by `owner_uid`. Profiles are read again for every run (an edit applies
/// without a restart), so the owner is checked against them here, not only at `session.open`.
/// `{home}` is the session owner's home from the password database; the profile's caches are
/// the session owner's in this workspace, made for the user the run runs as.
pub(crate) fn for_call(
    catalog: &Catalog,
    session_profile: &str,
    call_profile: Option<&str>,
    run: &CallFor<'_>,
) -> Result<CallSandbox, CallSandboxError> {
    let owner_uid = run.owner.0;
    let session = check_profile(catalog, session_profile, owner_uid)?;
    let mut profile = match call_profile {
        Some(name) if name != session.name => {
            let p = check_profile(catalog, name, owner_uid)?;
            p.check_narrows(&session).map_err(|m| {
                CallSandboxError::Invalid(format!(
                    "{m}; a call may only narrow its session's profile"
                ))
            })?;
            p
        }
        _ => session,
    };
    if let Some(g) = run.grants {
        g.apply(&mut profile);
    }
    let home = Home::of(owner_uid);
    let (uid, gid) = run_ids(profile.run_as, run.owner);
    let ids = (
        uid.unwrap_or_else(crate::sys::getuid),
        gid.unwrap_or_else(crate::sys::getgid),
    );
    let caches =
        caches::prepare(run.state_dir, owner_uid, run.workspace, ids, &profile).map_err(|e| {
            CallSandboxError::Invalid(format!(
                "cannot prepare the caches of profile {:?}: {e}",
                profile.name
            ))
        })?;
    let r = resolve::resolve(
        &profile,
        &resolve::Context {
            workspace: run.workspace,
            session_dir: Some(run.session_dir),
            home: &home,
            caller_env: &[],
            caches: caches.as_deref(),
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
