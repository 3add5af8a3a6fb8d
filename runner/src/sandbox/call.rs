//! A daemon call's sandbox: the session's profile (or the narrower one the call names),
//! checked against this host and the session's owner, with what the administrator grants
//! the call's kind of run, resolved for the run. Above [`super::linux`], whose probe of the
//! host it asks.

use super::profile::{Network, Profile, RunAs};
use super::{caches, linux, resolve, Catalog, Home, SandboxPlan};
use crate::run::plan::{LaunchPlan, PlanBuilder};

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

impl CallSandbox {
    /// `profile` resolved for one run in `ctx`. With [`CallSandbox::plan`], the one way a
    /// profile and a command become a launch plan: for the daemon's calls, `sidejob exec` and
    /// `sidejob doctor`'s trial run alike.
    pub(crate) fn resolve(
        profile: &Profile,
        ctx: &resolve::Context,
    ) -> Result<CallSandbox, resolve::ResolveError> {
        let r = resolve::resolve(profile, ctx)?;
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

    /// The launch plan of `tool` running `argv` in `cwd` under this sandbox, with the
    /// profile's limits; the caller adds what its kind of run has of its own.
    pub(crate) fn plan(
        self,
        tool: &str,
        argv: Vec<String>,
        cwd: std::path::PathBuf,
        private_dir: std::path::PathBuf,
    ) -> PlanBuilder {
        LaunchPlan::builder(
            tool,
            &self.profile,
            argv,
            self.env,
            cwd,
            private_dir,
            self.sandbox,
        )
        .timeout_ms(self.timeout_ms)
        .kill_grace_ms(self.kill_grace_ms)
        .max_output_bytes(self.max_output_bytes)
    }
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

/// Marks the mounts of a caller's grants as the caller's: the run's init opens them with
/// the caller's credentials (`sandbox::linux::caller_path`), never as root, even where a
/// profile lists the same path.
fn mark_as_caller(sandbox: &mut SandboxPlan, g: &Grants) {
    let theirs = |src: &std::path::Path| {
        g.readable
            .iter()
            .chain(&g.writable)
            .any(|p| std::path::Path::new(p) == src)
    };
    // The workspace (the one required mount) is the caller's already, opened with no
    // symlink on the way.
    for m in &mut sandbox.mounts {
        if !m.required && m.source.as_deref().is_some_and(theirs) {
            m.as_caller = true;
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
        .map_err(|e| CallSandboxError::Invalid(e.to_string()))?;
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
    /// What the caller grants this call (`tool.call` `grants`): its paths are the caller's,
    /// opened as the caller by the run's init, whatever profile entry they meet.
    pub caller_grants: Option<&'a Grants>,
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
    if let Some(g) = run.caller_grants {
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
    let mut sb = CallSandbox::resolve(
        &profile,
        &resolve::Context {
            workspace: run.workspace,
            session_dir: Some(run.session_dir),
            home: &home,
            caller_env: &[],
            caches: caches.as_deref(),
        },
    )
    .map_err(|e| CallSandboxError::Invalid(e.to_string()))?;
    if let Some(g) = run.caller_grants {
        mark_as_caller(&mut sb.sandbox, g);
    }
    Ok(sb)
}
