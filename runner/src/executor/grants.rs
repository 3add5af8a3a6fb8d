//! A call's `grants` (docs/protocol.md, `tool.call`): extra paths and hosts for one run,
//! checked before anything of the call is made. Paths are the caller's authority, checked
//! with their credentials (`sandbox::linux::caller_path::check_grant`); hosts are the
//! daemon's network, so a non-root caller may allow only what `[grants] allow` lists.

use std::path::{Component, Path, PathBuf};

use super::*;
use crate::egress::policy::RuleError;
use crate::protocol::CallGrants;
use crate::sandbox::call::Grants;
use crate::sandbox::linux::caller_path::{check_grant, GrantAccess};

impl Executor {
    /// The call's grants as the sandbox takes them, each path and host checked for the
    /// session's owner; `None` when the call asks for nothing.
    pub(super) fn caller_grants(&self, req: &CallRequest) -> Result<Option<Grants>, ExecError> {
        let Some(g) = req.grants.as_ref().filter(|g| !g.is_empty()) else {
            return Ok(None);
        };
        let off_limits = self.grant_off_limits();
        let mut out = Grants::default();
        for (list, access, into) in [
            (&g.readable, GrantAccess::Read, &mut out.readable),
            (&g.writable, GrantAccess::Write, &mut out.writable),
        ] {
            for path in list {
                let path = absolute_path(path, access)?;
                check_grant(Path::new(&path), access, &req.owner, &off_limits)
                    .map_err(|e| ExecError::PermissionDenied(e.to_string()))?;
                into.push(path);
            }
        }
        if !g.allow.is_empty() {
            out.egress = Some(self.allowed_hosts(&g.allow, req.session.owner_uid)?);
        }
        Ok(Some(out))
    }

    /// The daemon's own directories, which no grant may lead into, onto or above: the state
    /// directory (the registry, every run's private half, other users' sessions), the
    /// sessions' directory when it is elsewhere, and the sockets' directories.
    fn grant_off_limits(&self) -> Vec<PathBuf> {
        let mut dirs = self.socket_dirs.clone();
        for d in [self.cfg.state_dir.clone(), self.cfg.sessions_dir()] {
            let d = d.canonicalize().unwrap_or(d);
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        dirs
    }

    /// The hosts a call allows, as a policy: any host for a root session, else only those
    /// `[grants] allow` covers.
    fn allowed_hosts(
        &self,
        hosts: &[String],
        owner_uid: u32,
    ) -> Result<crate::egress::Policy, ExecError> {
        let granted = crate::egress::Policy::allowing(hosts)
            .map_err(|m| ExecError::InvalidParams(format!("grants.allow {m}")))?;
        if owner_uid == 0 {
            return Ok(granted);
        }
        let ceiling = self
            .cfg
            .grants
            .policy()
            .map_err(|m| ExecError::InvalidParams(format!("the daemon's config: {m}")))?;
        for (rule, text) in granted.allow.iter().zip(hosts) {
            let one = crate::egress::Policy {
                allow: vec![rule.clone()],
                ..Default::default()
            };
            if one.check_narrows(&ceiling).is_err() {
                let listed = if self.cfg.grants.allow.is_empty() {
                    "it lists none".to_owned()
                } else {
                    format!("it lists {}", self.cfg.grants.allow.join(", "))
                };
                return Err(ExecError::PermissionDenied(format!(
                    "cannot grant host {text}: it is not in the daemon's [grants] allow ({listed}); \
                     an administrator adds it there, or a profile allows it with [network] allow"
                )));
            }
        }
        Ok(granted)
    }
}

/// A granted path as the daemon keeps it: absolute, without `.` or `..`, without a trailing
/// slash (the command line resolves relative paths against its working directory).
fn absolute_path(path: &str, access: GrantAccess) -> Result<String, ExecError> {
    let key = match access {
        GrantAccess::Read => "grants.readable",
        GrantAccess::Write => "grants.writable",
    };
    // `Path::components` would drop a `.` silently; a granted path names itself exactly.
    let plain = !path.split('/').any(|seg| seg == "." || seg == "..");
    if !path.starts_with('/') || !plain || path.contains('\0') {
        return Err(ExecError::InvalidParams(format!(
            "{key} {path:?}: name an absolute path without \".\" or \"..\""
        )));
    }
    // One spelling per path: no repeated or trailing slashes.
    let mut out = PathBuf::from("/");
    for c in Path::new(path).components() {
        if let Component::Normal(n) = c {
            out.push(n);
        }
    }
    Ok(out.to_string_lossy().into_owned())
}

/// Is `want` no wider than `have` (a run's own grants, for what it starts through its
/// bridge)? Each path must be one the run was granted, with the same access (a readable
/// one may also be one it could write), each host one it could reach.
pub(crate) fn within(want: &CallGrants, have: &CallGrants) -> Result<(), NotGranted> {
    for p in &want.readable {
        if !have.readable.contains(p) && !have.writable.contains(p) {
            return Err(NotGranted::Readable(p.clone()));
        }
    }
    for p in &want.writable {
        if !have.writable.contains(p) {
            return Err(NotGranted::Writable(p.clone()));
        }
    }
    let parse = |hosts| crate::egress::Policy::allowing(hosts).map_err(NotGranted::Entry);
    Ok(parse(&want.allow)?.check_narrows(&parse(&have.allow)?)?)
}

/// What a call through a run's bridge asks for beyond the run's own grants ([`within`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotGranted {
    #[error("grants.readable {0}: the run making this call was not granted it")]
    Readable(String),
    #[error("grants.writable {0}: the run making this call was not granted it")]
    Writable(String),
    #[error("grants.allow {0}")]
    Entry(RuleError),
    #[error("grants: {0} (the run making this call was not granted it)")]
    Host(#[from] crate::egress::PolicyWidening),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn grants(r: &[&str], w: &[&str], a: &[&str]) -> CallGrants {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        CallGrants {
            readable: v(r),
            writable: v(w),
            allow: v(a),
        }
    }

    #[test]
    fn granted_paths_are_absolute_and_plain() {
        let r = GrantAccess::Read;
        assert_eq!(absolute_path("/srv/data/", r).unwrap(), "/srv/data");
        assert_eq!(absolute_path("/", r).unwrap(), "/");
        assert_eq!(absolute_path("//srv//data", r).unwrap(), "/srv/data");
        for bad in ["srv", "/srv/../etc", "/srv/./x", "", "./x"] {
            assert!(absolute_path(bad, r).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_nested_call_gets_at_most_what_its_run_was_granted() {
        let have = grants(&["/srv/a"], &["/srv/w"], &["*.example.org"]);
        assert!(within(
            &grants(&["/srv/a", "/srv/w"], &["/srv/w"], &["api.example.org:443"]),
            &have
        )
        .is_ok());
        assert!(within(&grants(&["/srv/b"], &[], &[]), &have).is_err());
        assert!(within(&grants(&[], &["/srv/a"], &[]), &have).is_err());
        assert!(within(&grants(&["/srv/a/sub"], &[], &[]), &have).is_err());
        let e = within(&grants(&[], &[], &["evil.test"]), &have).unwrap_err();
        assert!(e.to_string().contains("evil.test"), "{e}");
        assert!(within(
            &grants(&[], &[], &["x.example.org"]),
            &CallGrants::default()
        )
        .is_err());
    }
}
