//! What a run is allowed to do, as data (sandbox-profiles/README.md): profiles ([`profile`]), where they come
//! from ([`catalog`]), and how one becomes the sandbox part of a launch plan ([`resolve`];
//! the plan itself is `run::plan`). Pure: nothing here touches the system; [`linux`]
//! applies a plan.

pub(crate) mod caches;
pub(crate) mod call;
pub(crate) mod catalog;
pub(crate) mod layer;
pub(crate) mod linux;
pub(crate) mod profile;
pub(crate) mod resolve;

use std::path::PathBuf;

pub(crate) use catalog::Catalog;
pub(crate) use profile::{Network, Profile, RunAs};
pub(crate) use resolve::{MountSpec, SandboxPlan};

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
