//! Where profiles come from: the shipped ones are compiled in (so `sidejob serve` and
//! `sidejob exec` need no configuration), and a profile directory on disk, if there is one,
//! overrides them by name and adds its own.
//!
//! Profiles are policy, so an on-disk one is read only from a file that nobody but root or the
//! daemon's user could have written: opened by descriptor without following symlinks, the file
//! and every directory above it checked (`sys::fs`, the same rule as plugins). A file that
//! fails the rule, like one that does not validate, leaves the last valid version in force.
//!
//! The daemon owns one catalog for its life (`Executor::catalog`): it keeps the last valid
//! version of each on-disk profile, and each file's checked layer by its text, so a call
//! reads the files again (trust is checked every time, an edit applies at once) but parses
//! and checks only what changed.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing::{info, warn};

use super::layer::Layer;
use super::profile::{self, Profile, ProfileError};
use crate::sys::fs::{Refusal, TrustedDir};

/// The shipped profiles, compiled in from `sandbox-profiles/`.
const SHIPPED: &[(&str, &str)] = &[
    (
        "read-only",
        include_str!("../../../sandbox-profiles/read-only.toml"),
    ),
    (
        "workspace-write",
        include_str!("../../../sandbox-profiles/workspace-write.toml"),
    ),
    ("ci", include_str!("../../../sandbox-profiles/ci.toml")),
    (
        "network",
        include_str!("../../../sandbox-profiles/network.toml"),
    ),
    (
        "ci-net",
        include_str!("../../../sandbox-profiles/ci-net.toml"),
    ),
    ("rust", include_str!("../../../sandbox-profiles/rust.toml")),
    (
        "python",
        include_str!("../../../sandbox-profiles/python.toml"),
    ),
    ("node", include_str!("../../../sandbox-profiles/node.toml")),
    (
        "agent",
        include_str!("../../../sandbox-profiles/agent.toml"),
    ),
];

#[derive(Debug, thiserror::Error)]
pub(crate) enum CatalogError {
    #[error("unknown profile {name:?}; known: {}", known.join(", "))]
    Unknown { name: String, known: Vec<String> },
    #[error("invalid profile name {0:?}: use letters, digits, '-' and '_'")]
    BadName(String),
    #[error("cannot read profile {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid profile {0}")]
    Invalid(#[from] ProfileError),
    /// The file, or a directory above it, could have been written by someone other than root
    /// or the daemon's user (or is a symlink): a profile is policy, so it is not read.
    #[error("refusing profile {path}: {reason}")]
    Untrusted { path: PathBuf, reason: String },
}

/// The profiles a daemon or `sidejob exec` can use.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    dir: Option<PathBuf>,
    /// The last version of each on-disk profile that validated, by path.
    last_good: Mutex<HashMap<PathBuf, Profile>>,
    /// Each file's parsed and checked layer, by file name and text.
    layers: Mutex<HashMap<(String, String), Layer>>,
}

/// More distinct texts than this and the memo of layers starts again (edits pile up).
const MAX_LAYERS: usize = 256;

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Catalog {
    /// `dir`: the on-disk profile directory, if any (it need not exist).
    pub(crate) fn new(dir: Option<PathBuf>) -> Catalog {
        Catalog {
            dir,
            ..Catalog::default()
        }
    }

    /// The on-disk profile directory, if any.
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The profile directory used when none is configured: `$SIDEJOB_PROFILES_DIR`, else
    /// `/etc/sidejob/sandbox-profiles` for root, else
    /// `$XDG_CONFIG_HOME/sidejob/sandbox-profiles` (or `~/.config/...`).
    pub(crate) fn default_dir() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("SIDEJOB_PROFILES_DIR").filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        if crate::sys::getuid() == 0 {
            return Some(PathBuf::from("/etc/sidejob/sandbox-profiles"));
        }
        let config = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
        Some(config.join("sidejob/sandbox-profiles"))
    }

    /// A profile by name: the on-disk file first, then the shipped one. A profile that
    /// `extends` another is laid over it (see `profile::Layer::onto`); an unknown parent or a
    /// cycle is refused with the file and line of its `extends`.
    pub(crate) fn get(&self, name: &str) -> Result<Profile, CatalogError> {
        self.get_chain(name, &mut Vec::new())
    }

    fn get_chain(&self, name: &str, chain: &mut Vec<String>) -> Result<Profile, CatalogError> {
        if !valid_name(name) {
            return Err(CatalogError::BadName(name.into()));
        }
        if let Some(dir) = &self.dir {
            let path = dir.join(format!("{name}.toml"));
            match read_trusted(dir, &format!("{name}.toml")) {
                Ok(Some(text)) => {
                    let built = self.build(name, &path.display().to_string(), &text, chain);
                    return self.keep_last_good(name, &path, built);
                }
                Ok(None) => {}
                Err(e) => return self.keep_last_good(name, &path, Err(e)),
            }
        }
        match SHIPPED.iter().find(|(n, _)| *n == name) {
            Some((n, text)) => self.build(n, &format!("sandbox-profiles/{n}.toml"), text, chain),
            None => Err(CatalogError::Unknown {
                name: name.into(),
                known: self.names(),
            }),
        }
    }

    /// Parses and checks one file, then lays it over the profile it extends.
    fn build(
        &self,
        name: &str,
        file: &str,
        text: &str,
        chain: &mut Vec<String>,
    ) -> Result<Profile, CatalogError> {
        let layer = self.layer(file, text)?;
        let Some((parent, line)) = layer.extends.clone() else {
            return Ok(layer.onto(Profile::empty(name), name));
        };
        let at = |message: String| ProfileError {
            file: file.into(),
            line,
            field: "extends".into(),
            message,
        };
        chain.push(name.to_owned());
        if chain.contains(&parent) {
            let mut cycle = chain.clone();
            cycle.push(parent.clone());
            chain.pop();
            return Err(at(format!("{parent:?} makes a cycle: {}", cycle.join(" → "))).into());
        }
        let base = self.get_chain(&parent, chain);
        chain.pop();
        let base = base.map_err(|e| match e {
            CatalogError::Unknown { known, .. } => CatalogError::Invalid(at(format!(
                "unknown profile {parent:?}; known: {}",
                known.join(", ")
            ))),
            CatalogError::BadName(n) => {
                CatalogError::Invalid(at(format!("{n:?}: not a profile name")))
            }
            other => other,
        })?;
        Ok(layer.onto(base, name))
    }

    /// The checked layer of `file` holding `text`, parsed once per distinct text.
    fn layer(&self, file: &str, text: &str) -> Result<Layer, ProfileError> {
        let key = (file.to_owned(), text.to_owned());
        if let Some(l) = lock(&self.layers).get(&key) {
            return Ok(l.clone());
        }
        let layer = profile::parse(file, text)?.layer(file, text)?;
        let mut memo = lock(&self.layers);
        if memo.len() >= MAX_LAYERS {
            memo.clear();
        }
        memo.insert(key, layer.clone());
        Ok(layer)
    }

    /// A profile from a file (`sidejob exec --profile ./mine.toml`); named after the file. It
    /// may extend a profile of this catalog.
    pub(crate) fn load_file(&self, path: &Path) -> Result<Profile, CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
            path: path.into(),
            source,
        })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "custom".into());
        self.build(&name, &path.display().to_string(), &text, &mut Vec::new())
    }

    /// A name, or a path when the argument has a '/' or ends in `.toml`.
    pub(crate) fn get_or_file(&self, name_or_path: &str) -> Result<Profile, CatalogError> {
        if name_or_path.contains('/') || name_or_path.ends_with(".toml") {
            self.load_file(Path::new(name_or_path))
        } else {
            self.get(name_or_path)
        }
    }

    /// Every profile name, shipped and on disk, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = SHIPPED.iter().map(|(n, _)| (*n).to_owned()).collect();
        if let Some(Ok(entries)) = self.dir.as_ref().map(std::fs::read_dir) {
            for e in entries.flatten() {
                let file = e.file_name().to_string_lossy().into_owned();
                if let Some(n) = file.strip_suffix(".toml").filter(|n| valid_name(n)) {
                    if !names.iter().any(|x| x == n) {
                        names.push(n.to_owned());
                    }
                }
            }
        }
        names.sort();
        names
    }

    /// Loads every on-disk profile now, so an edit is validated (and logged) when it is made,
    /// not when a run first needs it. Returns one line per profile.
    pub(crate) fn refresh(&self) -> Vec<String> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for name in self.names() {
            let path = dir.join(format!("{name}.toml"));
            // symlink_metadata: a symlink is reported (as refused), even a dangling one.
            if std::fs::symlink_metadata(&path).is_err() {
                continue;
            }
            out.push(match self.get(&name) {
                Ok(_) => format!("profile {name}: ok"),
                Err(e) => format!("profile {name}: {e}"),
            });
        }
        out
    }

    /// An on-disk profile that did not load (refused, unreadable, or invalid — its own file or a
    /// profile it extends): the last version that loaded stays in force, with a warning that
    /// says why; a profile never loaded is an error. One that loads becomes the last good one.
    fn keep_last_good(
        &self,
        name: &str,
        path: &Path,
        built: Result<Profile, CatalogError>,
    ) -> Result<Profile, CatalogError> {
        let mut cache = lock(&self.last_good);
        match built {
            Ok(p) => {
                if cache.get(path).is_some_and(|old| old != &p) {
                    info!(profile = name, path = %path.display(), "profile changed: the new version is in force");
                }
                cache.insert(path.to_path_buf(), p.clone());
                Ok(p)
            }
            Err(e) => match cache.get(path) {
                Some(previous) => {
                    warn!(
                        profile = name,
                        "{e}; keeping the previous version until it is fixed"
                    );
                    Ok(previous.clone())
                }
                None => Err(e),
            },
        }
    }

    /// The shipped profiles' names and texts.
    #[cfg(test)]
    pub(crate) fn shipped() -> &'static [(&'static str, &'static str)] {
        SHIPPED
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads `dir/file` by descriptor, checked like a plugin (see `sys::fs`): no symlink on the
/// way, and the file and every directory above it owned by root or the daemon's uid and not
/// writable by group or others. `Ok(None)`: there is no such file (or no such directory).
fn read_trusted(dir: &Path, file: &str) -> Result<Option<String>, CatalogError> {
    let path = dir.join(file);
    let refused = |why: Refusal| CatalogError::Untrusted {
        path: path.clone(),
        reason: format!("{why}; {}", why.hint()),
    };
    let dir = match TrustedDir::open(dir) {
        Ok(d) => d,
        Err(why) if why.is_missing() => return Ok(None),
        Err(why) => return Err(refused(why)),
    };
    let mut f = match dir.open_file(OsStr::new(file)) {
        Ok(f) => f,
        Err(why) if why.is_missing() => return Ok(None),
        Err(why) => return Err(refused(why)),
    };
    let mut text = String::new();
    f.read_to_string(&mut text)
        .map_err(|source| CatalogError::Read {
            path: path.clone(),
            source,
        })?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scratch::ScratchDir;

    #[test]
    fn every_shipped_profile_loads() {
        let c = Catalog::new(None);
        for (name, _) in Catalog::shipped() {
            let p = c.get(name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&p.name, name);
        }
        assert!(matches!(c.get("nope"), Err(CatalogError::Unknown { .. })));
        assert!(matches!(c.get("../etc"), Err(CatalogError::BadName(_))));
    }

    #[test]
    fn each_text_is_parsed_once_and_an_edit_is_parsed_again() {
        let scratch = ScratchDir::new("catalog-memo");
        let dir = scratch.path();
        let c = Catalog::new(Some(dir.to_path_buf()));
        let memo = |c: &Catalog| lock(&c.layers).len();
        c.get("rust").unwrap();
        let chain = memo(&c);
        assert!(chain >= 3, "rust extends ci-net, which extends ci: {chain}");
        c.get("rust").unwrap();
        assert_eq!(memo(&c), chain, "the same texts are not parsed again");
        std::fs::write(dir.join("ci.toml"), "description = \"mine\"\n").unwrap();
        assert_eq!(c.get("ci").unwrap().description, "mine");
        assert_eq!(memo(&c), chain + 1, "the edited file is parsed");
    }

    #[test]
    fn shipped_profiles_only_narrow_what_they_claim() {
        let c = Catalog::new(None);
        let ww = c.get("workspace-write").unwrap();
        c.get("read-only").unwrap().check_narrows(&ww).unwrap();
        assert!(c.get("network").unwrap().check_narrows(&ww).is_err());
    }

    #[test]
    fn an_on_disk_profile_overrides_and_adds() {
        let scratch = ScratchDir::new("catalog");
        let dir = scratch.path();
        std::fs::write(dir.join("ci.toml"), "description = \"mine\"\n").unwrap();
        std::fs::write(dir.join("extra.toml"), "network = \"loopback\"\n").unwrap();
        std::fs::write(dir.join("broken.toml"), "[limits]\npids = -1\n").unwrap();
        let c = Catalog::new(Some(dir.to_path_buf()));
        assert_eq!(c.get("ci").unwrap().description, "mine");
        assert!(c.names().contains(&"extra".to_owned()));
        let e = c.get("broken").unwrap_err().to_string();
        assert!(e.contains("broken.toml:2: limits.pids"), "{e}");
    }

    #[test]
    fn an_edit_that_does_not_validate_keeps_the_previous_version() {
        let scratch = ScratchDir::new("catalog-edit");
        let dir = scratch.path();
        let c = Catalog::new(Some(dir.to_path_buf()));
        std::fs::write(dir.join("mine.toml"), "description = \"v1\"\n").unwrap();
        assert_eq!(c.get("mine").unwrap().description, "v1");
        std::fs::write(dir.join("mine.toml"), "[limits]\npids = -1\n").unwrap();
        assert_eq!(
            c.get("mine").unwrap().description,
            "v1",
            "the broken edit must not take effect"
        );
        assert!(c
            .refresh()
            .iter()
            .any(|l| l.starts_with("profile mine: ok")));
        std::fs::write(dir.join("mine.toml"), "description = \"v2\"\n").unwrap();
        assert_eq!(c.get("mine").unwrap().description, "v2");
        // A profile that never validated is an error, not a silent fallback.
        std::fs::write(dir.join("never.toml"), "[limits]\npids = -1\n").unwrap();
        assert!(c.get("never").is_err());
    }

    #[test]
    fn a_profile_others_could_write_is_refused_and_the_previous_stays() {
        use std::os::unix::fs::PermissionsExt;
        let chmod = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let scratch = ScratchDir::with_mode("catalog-trust", 0o755);
        let dir = scratch.path();
        let c = Catalog::new(Some(dir.to_path_buf()));
        let mine = dir.join("mine.toml");
        std::fs::write(&mine, "description = \"v1\"\n").unwrap();
        chmod(&mine, 0o644);
        assert_eq!(c.get("mine").unwrap().description, "v1");

        // Group-writable: refused, v1 stays in force.
        std::fs::write(&mine, "description = \"v2\"\n").unwrap();
        chmod(&mine, 0o664);
        assert_eq!(c.get("mine").unwrap().description, "v1");
        // A symlink in its place: not followed.
        let elsewhere = dir.join("elsewhere.txt");
        std::fs::write(&elsewhere, "description = \"v3\"\n").unwrap();
        std::fs::remove_file(&mine).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &mine).unwrap();
        assert_eq!(c.get("mine").unwrap().description, "v1");
        // The directory writable by others: nothing in it is read.
        std::fs::remove_file(&mine).unwrap();
        std::fs::write(&mine, "description = \"v4\"\n").unwrap();
        chmod(&mine, 0o644);
        chmod(dir, 0o777);
        assert_eq!(c.get("mine").unwrap().description, "v1");
        // A profile never read is an error that names the rule and the fix, even for a
        // shipped name: the directory may hold an override that cannot be trusted.
        let e = c.get("ci").unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "refusing profile {}",
                dir.join("ci.toml").display()
            )) && e.contains("its directory is world-writable")
                && e.contains("chmod go-w"),
            "{e}"
        );
        chmod(dir, 0o755);
        assert_eq!(c.get("mine").unwrap().description, "v4");
    }

    #[test]
    fn a_profile_extends_another_and_adds_or_narrows() {
        let scratch = ScratchDir::new("catalog-ext");
        let dir = scratch.path();
        std::fs::write(
            dir.join("mine.toml"),
            "extends = \"ci\"\n[paths]\nreadable = [\"{home}/.cargo\"]\n[limits]\nmemory = \"1GiB\"\n[network]\nallow = [\"crates.io:443\"]\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("deeper.toml"),
            "extends = \"mine\"\n[network]\ndeny = [\"crates.io\"]\n",
        )
        .unwrap();
        let c = Catalog::new(Some(dir.to_path_buf()));
        let ci = c.get("ci").unwrap();
        let mine = c.get("mine").unwrap();
        assert_eq!(mine.extends.as_deref(), Some("ci"));
        assert!(mine.readable.contains(&"{home}/.cargo".to_owned()));
        assert!(ci.readable.iter().all(|p| mine.readable.contains(p)));
        assert_eq!(mine.limits.memory, Some(1 << 30));
        assert_eq!(
            mine.limits.pids, ci.limits.pids,
            "limits it does not set are kept"
        );
        assert_eq!(mine.network_name(), "allow-list");
        let deeper = c.get("deeper").unwrap();
        let policy = deeper.egress.unwrap();
        assert_eq!((policy.allow.len(), policy.deny.len()), (1, 1));
    }

    #[test]
    fn unknown_parents_and_cycles_are_refused_with_file_and_line() {
        let scratch = ScratchDir::new("catalog-cyc");
        let dir = scratch.path();
        std::fs::write(dir.join("a.toml"), "description = \"a\"\nextends = \"b\"\n").unwrap();
        std::fs::write(dir.join("b.toml"), "\n\nextends = \"a\"\n").unwrap();
        std::fs::write(dir.join("orphan.toml"), "extends = \"nope\"\n").unwrap();
        std::fs::write(dir.join("me.toml"), "extends = \"me\"\n").unwrap();
        let c = Catalog::new(Some(dir.to_path_buf()));
        let e = c.get("a").unwrap_err().to_string();
        assert!(
            e.contains("b.toml:3: extends:") && e.contains("a → b → a"),
            "{e}"
        );
        let e = c.get("orphan").unwrap_err().to_string();
        assert!(
            e.contains("orphan.toml:1: extends: unknown profile \"nope\""),
            "{e}"
        );
        let e = c.get("me").unwrap_err().to_string();
        assert!(
            e.contains("me.toml:1: extends:") && e.contains("cycle"),
            "{e}"
        );
    }

    #[test]
    fn shipped_toolchain_profiles_keep_ci_and_reach_only_the_registries() {
        let c = Catalog::new(None);
        let ci = c.get("ci").unwrap();
        for name in ["ci-net", "rust", "python", "node"] {
            let p = c.get(name).unwrap();
            assert_eq!(p.limits, ci.limits, "{name} keeps ci's limits");
            assert_eq!(p.timeout_ms, ci.timeout_ms);
            assert_eq!(p.network_name(), "allow-list", "{name}");
            let allow: Vec<String> = p
                .egress
                .unwrap()
                .allow
                .iter()
                .map(|r| r.to_string())
                .collect();
            assert!(
                allow.contains(&"index.crates.io:443".to_owned()),
                "{name}: {allow:?}"
            );
            assert!(allow.contains(&"pypi.org:443".to_owned()));
            assert!(allow.contains(&"registry.npmjs.org:443".to_owned()));
        }
        assert!(!c.get("rust").unwrap().caches.is_empty());
        // The agent profile narrows workspace-write, so a default session may start one.
        let ww = c.get("workspace-write").unwrap();
        c.get("agent").unwrap().check_narrows(&ww).unwrap();
        // An allow-list is wider than none, narrower than host.
        let net = c.get("network").unwrap();
        c.get("ci-net").unwrap().check_narrows(&ci).unwrap_err();
        let mut no_limits = c.get("ci-net").unwrap();
        no_limits.limits = net.limits;
        no_limits.timeout_ms = None;
        no_limits.env_allow.clone_from(&net.env_allow);
        no_limits.check_narrows(&net).unwrap();
    }
}
