//! Profile → plan: placeholders replaced by the run's real paths, paths merged into one list
//! of mounts, the environment built from the allow-list and the fixed values. Pure.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::profile::{Limits, Network, Profile};
use super::Home;

/// One path of the mount view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MountSpec {
    /// The host path; `None` is a fresh, empty tmpfs (the run's private `/tmp`).
    pub source: Option<PathBuf>,
    /// Where it appears in the view (the same path as on the host, except `/tmp`).
    pub target: PathBuf,
    pub exec: bool,
    pub write: bool,
    /// A required path that is missing fails the run; others are left out of the view.
    pub required: bool,
    /// A path the caller named or owns (`{workspace}`, `{session_dir}`, `{home}`): opened
    /// with the caller's credentials, so the view holds nothing the caller could not open.
    #[serde(default)]
    pub as_caller: bool,
}

/// The sandbox part of a launch plan: what the supervisor builds for the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SandboxPlan {
    pub mounts: Vec<MountSpec>,
    /// Absolute paths (inside the workspace) mounted read-only over the writable workspace.
    pub protected: Vec<PathBuf>,
    pub network: Network,
    pub limits: Limits,
    pub best_effort: bool,
    /// A network allow-list: the proxy's policy and socket (`network` is `Loopback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::EgressPlan>,
    /// Directories no caller's path may lead into (the control socket's, the bridges'):
    /// a `{home}` symlink there would hand the run a socket outside its bridge's scope.
    /// Filled in by whoever knows them (the daemon, `sidejob exec`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub off_limits: Vec<PathBuf>,
}

/// The run-specific values placeholders stand for.
pub(crate) struct Context<'a> {
    pub workspace: &'a Path,
    pub session_dir: Option<&'a Path>,
    /// The caller's home directory, from the password database.
    pub home: &'a Home,
    /// The caller's environment, filtered through the profile's allow-list.
    pub caller_env: &'a [(String, String)],
    /// Where the caches of this owner, profile and workspace live (`sandbox::caches::dir_for`);
    /// `None` leaves the profile's caches out (a probe of the profile, not a run).
    pub caches: Option<&'a Path>,
}

/// What resolution yields besides the sandbox itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolved {
    pub sandbox: SandboxPlan,
    pub env: Vec<(String, String)>,
    pub timeout_ms: Option<u64>,
    pub kill_grace_ms: Option<u64>,
}

/// Where the run's private tmp appears inside the view.
pub(crate) const VIEW_TMP: &str = "/tmp";

enum Target {
    Host(PathBuf),
    Tmp,
    Skip,
}

/// A profile that cannot be resolved for a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResolveError {
    /// A path starts with a placeholder the profile format does not have.
    #[error("unknown placeholder {0}")]
    UnknownPlaceholder(String),
}

fn substitute(path: &str, ctx: &Context) -> Result<Target, ResolveError> {
    let (base, rest) = match path.find('}') {
        Some(end) if path.starts_with('{') => {
            (&path[..=end], path[end + 1..].trim_start_matches('/'))
        }
        _ => return Ok(Target::Host(PathBuf::from(path))),
    };
    let join = |root: &Path| {
        if rest.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rest)
        }
    };
    Ok(match base {
        "{workspace}" => Target::Host(join(ctx.workspace)),
        "{session_dir}" => match ctx.session_dir {
            Some(d) => Target::Host(join(d)),
            None => Target::Skip,
        },
        "{home}" => match ctx.home.get() {
            Some(h) => Target::Host(join(h)),
            None => Target::Skip,
        },
        // The private tmp is one fresh tmpfs; paths below it need no mount of their own.
        "{tmp}" => Target::Tmp,
        other => return Err(ResolveError::UnknownPlaceholder(other.into())),
    })
}

/// Replaces placeholders in an environment value, in one pass from left to right: what a
/// placeholder is replaced with is never looked at again (a workspace whose path holds the
/// text `{tmp}` stays that path). A placeholder with no value here is left as it is.
fn substitute_value(value: &str, ctx: &Context) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let tail = &rest[open..];
        let value_of = |name: &str| -> Option<String> {
            match name {
                "{workspace}" => Some(ctx.workspace.to_string_lossy().into_owned()),
                "{tmp}" => Some(VIEW_TMP.to_owned()),
                "{session_dir}" => ctx.session_dir.map(|d| d.to_string_lossy().into_owned()),
                "{home}" => ctx.home.get().map(|h| h.to_string_lossy().into_owned()),
                _ => None,
            }
        };
        let found = tail
            .find('}')
            .map(|close| &tail[..=close])
            .and_then(|name| Some((name.len(), value_of(name)?)));
        match found {
            Some((len, v)) => {
                out.push_str(&v);
                rest = &tail[len..];
            }
            None => {
                out.push('{');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn env_allowed(name: &str, allow: &[String]) -> bool {
    allow.iter().any(|a| match a.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => a == name,
    })
}

pub(crate) fn resolve(profile: &Profile, ctx: &Context) -> Result<Resolved, ResolveError> {
    Ok(Resolved {
        sandbox: SandboxPlan {
            mounts: mounts_of(profile, ctx)?,
            protected: profile
                .protected
                .iter()
                .map(|rel| ctx.workspace.join(rel))
                .collect(),
            network: profile.network,
            limits: profile.limits,
            best_effort: profile.best_effort,
            off_limits: Vec::new(),
            // The socket directory is filled in by whoever serves the proxy.
            egress: profile
                .egress
                .clone()
                .map(|policy| crate::egress::EgressPlan {
                    policy,
                    socket_dir: PathBuf::new(),
                }),
        },
        env: env_of(profile, ctx),
        timeout_ms: profile.timeout_ms,
        kill_grace_ms: profile.kill_grace_ms,
    })
}

/// The view's mounts: what the profile makes readable, executable and writable, and its
/// caches, parents before children.
fn mounts_of(profile: &Profile, ctx: &Context) -> Result<Vec<MountSpec>, ResolveError> {
    let mut mounts: Vec<MountSpec> = Vec::new();
    let mut add = |path: &str, exec: bool, write: bool| -> Result<(), ResolveError> {
        let (source, target, required) = match substitute(path, ctx)? {
            Target::Skip => return Ok(()),
            Target::Tmp => (None, PathBuf::from(VIEW_TMP), false),
            Target::Host(p) => {
                let required = path == "{workspace}";
                (Some(p.clone()), p, required)
            }
        };
        let as_caller = source.is_some() && path.starts_with('{');
        match mounts
            .iter_mut()
            .find(|m| m.target == target && m.source == source)
        {
            Some(m) => {
                m.exec |= exec;
                m.write |= write;
                m.as_caller |= as_caller;
            }
            None => mounts.push(MountSpec {
                source,
                target,
                exec,
                write,
                required,
                as_caller,
            }),
        }
        Ok(())
    };
    for p in &profile.readable {
        add(p, false, false)?;
    }
    for p in &profile.executable {
        add(p, true, false)?;
    }
    for p in &profile.writable {
        add(p, false, true)?;
    }
    // Caches: a directory of their own under the state directory, where the profile says.
    if let Some(root) = ctx.caches {
        for (name, at) in &profile.caches {
            let target = match substitute(at, ctx)? {
                Target::Host(t) => t,
                Target::Tmp | Target::Skip => continue,
            };
            mounts.retain(|m| m.target != target);
            mounts.push(MountSpec {
                source: Some(root.join(name)),
                target,
                exec: false,
                write: true,
                required: true,
                as_caller: false,
            });
        }
    }
    // Parents before children, so a child mount lands on top of its parent's.
    mounts.sort_by_key(|m| m.target.components().count());
    Ok(mounts)
}

/// The command's whole environment: the profile's fixed values, the caller's variables the
/// profile lets through, and an allow-list run's proxy settings.
fn env_of(profile: &Profile, ctx: &Context) -> Vec<(String, String)> {
    // Fixed values first; an allowed variable the caller sets replaces its fixed default.
    let mut env: Vec<(String, String)> = profile
        .env_set
        .iter()
        .map(|(k, v)| (k.clone(), substitute_value(v, ctx)))
        .collect();
    for (k, v) in ctx.caller_env {
        if env_allowed(k, &profile.env_allow) {
            env.retain(|(name, _)| name != k);
            env.push((k.clone(), v.clone()));
        }
    }
    // An allow-list run's proxy settings win over anything passed through: the proxy is the
    // only way out of the run's network namespace.
    if profile.egress.is_some() {
        for (k, v) in crate::egress::proxy_env() {
            env.retain(|(name, _)| *name != k);
            env.push((k, v));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::profile::load;

    #[test]
    fn placeholders_in_values_are_replaced_once() {
        let ctx = Context {
            workspace: Path::new("/w/{tmp}/{session_dir}"),
            session_dir: Some(Path::new("/s/{home}")),
            home: &Home::known(Some(PathBuf::from("/h"))),
            caller_env: &[],
            caches: None,
        };
        assert_eq!(
            substitute_value("{workspace}:{tmp}:{session_dir}:{home}:{nope}:{", &ctx),
            "/w/{tmp}/{session_dir}:/tmp:/s/{home}:/h:{nope}:{"
        );
        let no_home = Context {
            home: &Home::known(None),
            ..ctx
        };
        assert_eq!(substitute_value("x{home}y", &no_home), "x{home}y");
    }

    #[test]
    fn the_home_is_looked_up_only_for_a_profile_that_names_it() {
        let resolve_with = |text: &str, home: &Home| {
            let p = load("t", "t.toml", text).unwrap();
            let ctx = Context {
                workspace: Path::new("/w"),
                session_dir: None,
                home,
                caller_env: &[],
                caches: None,
            };
            resolve(&p, &ctx).unwrap()
        };
        let home = Home::of(0);
        resolve_with("[paths]\nreadable=[\"/usr\", \"{workspace}\"]\n", &home);
        assert!(
            home.dir.get().is_none(),
            "looked up for a profile without {{home}}"
        );
        resolve_with("[paths]\nreadable=[\"/usr\", \"{home}/.cargo\"]\n", &home);
        assert_eq!(home.dir.get(), Some(&crate::sandbox::home_of(0)));
    }

    #[test]
    fn placeholders_resolve_and_paths_merge() {
        let p = load(
            "t",
            "t.toml",
            "[paths]\nreadable=[\"/usr\", \"{home}/.cargo\", \"{session_dir}\"]\nexecutable=[\"/usr\", \"{workspace}\", \"{tmp}\"]\nwritable=[\"{workspace}\", \"{tmp}\"]\nprotected=[\".git/hooks\"]\n[env]\nallow=[\"TERM\", \"LC_*\"]\nset={HOME=\"{workspace}\", TMPDIR=\"{tmp}\"}\n",
        )
        .unwrap();
        let caller = vec![
            ("TERM".to_owned(), "xterm".to_owned()),
            ("LC_ALL".to_owned(), "C".to_owned()),
            ("SECRET".to_owned(), "x".to_owned()),
            ("HOME".to_owned(), "/root".to_owned()),
        ];
        let r = resolve(
            &p,
            &Context {
                workspace: Path::new("/w"),
                session_dir: None,
                home: &Home::known(None),
                caller_env: &caller,
                caches: None,
            },
        )
        .unwrap();
        let targets: Vec<_> = r
            .sandbox
            .mounts
            .iter()
            .map(|m| m.target.display().to_string())
            .collect();
        assert_eq!(targets, vec!["/usr", "/w", "/tmp"]);
        let w = &r.sandbox.mounts[1];
        assert!(w.write && w.exec && w.required);
        assert!(r.sandbox.mounts[2].source.is_none());
        assert_eq!(r.sandbox.protected, vec![PathBuf::from("/w/.git/hooks")]);
        let env: std::collections::HashMap<_, _> = r.env.into_iter().collect();
        assert_eq!(env.get("TERM").map(String::as_str), Some("xterm"));
        assert_eq!(env.get("LC_ALL").map(String::as_str), Some("C"));
        assert_eq!(env.get("HOME").map(String::as_str), Some("/w"));
        assert_eq!(env.get("TMPDIR").map(String::as_str), Some("/tmp"));
        assert!(!env.contains_key("SECRET"));
    }
}
