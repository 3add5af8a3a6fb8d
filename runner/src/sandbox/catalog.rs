//! Where profiles come from: the shipped ones are compiled in (so `sidejob serve` and
//! `sidejob exec` need no configuration), and a profile directory on disk, if there is one,
//! overrides them by name and adds its own.
//!
//! Profiles are policy, so an on-disk one is read only from a file that nobody but root or the
//! daemon's user could have written: opened by descriptor without following symlinks, the file
//! and every directory above it checked (`sys::fs`, the same rule as plugins). A file that
//! fails the rule, like one that does not validate, leaves the last valid version in force.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use tracing::{info, warn};

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
];

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
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
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    dir: Option<PathBuf>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Catalog {
    /// `dir`: the on-disk profile directory, if any (it need not exist).
    pub fn new(dir: Option<PathBuf>) -> Catalog {
        Catalog { dir }
    }

    /// The profile directory used when none is configured: `$SIDEJOB_PROFILES_DIR`, else
    /// `/etc/sidejob/sandbox-profiles` for root, else
    /// `$XDG_CONFIG_HOME/sidejob/sandbox-profiles` (or `~/.config/...`).
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = CONFIGURED_DIR.get() {
            return Some(dir.clone());
        }
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

    /// A profile by name: the on-disk file first, then the shipped one.
    pub fn get(&self, name: &str) -> Result<Profile, CatalogError> {
        if !valid_name(name) {
            return Err(CatalogError::BadName(name.into()));
        }
        if let Some(dir) = &self.dir {
            let path = dir.join(format!("{name}.toml"));
            match read_trusted(dir, &format!("{name}.toml")) {
                Ok(Some(text)) => return load_keeping_last_good(name, &path, &text),
                Ok(None) => {}
                Err(e) => return keep_last_good_after(name, &path, e),
            }
        }
        match SHIPPED.iter().find(|(n, _)| *n == name) {
            Some((n, text)) => Ok(profile::load(
                n,
                &format!("sandbox-profiles/{n}.toml"),
                text,
            )?),
            None => Err(CatalogError::Unknown {
                name: name.into(),
                known: self.names(),
            }),
        }
    }

    /// A profile from a file (`sidejob exec --profile ./mine.toml`); named after the file.
    pub fn load_file(path: &Path) -> Result<Profile, CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
            path: path.into(),
            source,
        })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "custom".into());
        Ok(profile::load(&name, &path.display().to_string(), &text)?)
    }

    /// A name, or a path when the argument has a '/' or ends in `.toml`.
    pub fn get_or_file(&self, name_or_path: &str) -> Result<Profile, CatalogError> {
        if name_or_path.contains('/') || name_or_path.ends_with(".toml") {
            Self::load_file(Path::new(name_or_path))
        } else {
            self.get(name_or_path)
        }
    }

    /// Every profile name, shipped and on disk, sorted.
    pub fn names(&self) -> Vec<String> {
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

    /// Sets the profile directory for this process (the daemon's `profiles_dir`); call it
    /// once, before profiles are looked up. Later calls are ignored.
    pub fn configure_dir(dir: PathBuf) {
        let _ = CONFIGURED_DIR.set(dir);
    }

    /// Loads every on-disk profile now, so an edit is validated (and logged) when it is made,
    /// not when a run first needs it. Returns one line per profile.
    pub fn refresh(&self) -> Vec<String> {
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

    /// The shipped profiles' names and texts (for `sidejob doctor` and tests).
    pub fn shipped() -> &'static [(&'static str, &'static str)] {
        SHIPPED
    }
}

/// The profile directory the daemon was configured with, if any.
static CONFIGURED_DIR: OnceLock<PathBuf> = OnceLock::new();

/// The last version of each on-disk profile that validated, by path.
fn last_good() -> &'static Mutex<HashMap<PathBuf, Profile>> {
    static LAST_GOOD: OnceLock<Mutex<HashMap<PathBuf, Profile>>> = OnceLock::new();
    LAST_GOOD.get_or_init(Default::default)
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

/// An on-disk profile that cannot be read (refused, or unreadable): the last version that
/// validated stays in force, with a warning that says why; a profile never read is an error.
fn keep_last_good_after(name: &str, path: &Path, e: CatalogError) -> Result<Profile, CatalogError> {
    let cache = last_good().lock().unwrap_or_else(|e| e.into_inner());
    match cache.get(path) {
        Some(previous) => {
            warn!(
                profile = name,
                "{e}; keeping the previous version until it is fixed"
            );
            Ok(previous.clone())
        }
        None => Err(e),
    }
}

/// Parses and validates an on-disk profile. An edit that does not validate keeps the previous
/// version in force (and says why, once per edit); a profile never valid is an error.
fn load_keeping_last_good(name: &str, path: &Path, text: &str) -> Result<Profile, CatalogError> {
    let mut cache = last_good().lock().unwrap_or_else(|e| e.into_inner());
    match profile::load(name, &path.display().to_string(), text) {
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
                    "{e}; keeping the previous version until the file validates"
                );
                Ok(previous.clone())
            }
            None => Err(e.into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn shipped_profiles_only_narrow_what_they_claim() {
        let c = Catalog::new(None);
        let ww = c.get("workspace-write").unwrap();
        c.get("read-only").unwrap().check_narrows(&ww).unwrap();
        assert!(c.get("network").unwrap().check_narrows(&ww).is_err());
    }

    #[test]
    fn an_on_disk_profile_overrides_and_adds() {
        let dir = std::env::temp_dir().join(format!("sidejob-catalog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ci.toml"), "description = \"mine\"\n").unwrap();
        std::fs::write(dir.join("extra.toml"), "network = \"loopback\"\n").unwrap();
        std::fs::write(dir.join("broken.toml"), "[limits]\npids = -1\n").unwrap();
        let c = Catalog::new(Some(dir.clone()));
        assert_eq!(c.get("ci").unwrap().description, "mine");
        assert!(c.names().contains(&"extra".to_owned()));
        let e = c.get("broken").unwrap_err().to_string();
        assert!(e.contains("broken.toml:2: limits.pids"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_edit_that_does_not_validate_keeps_the_previous_version() {
        let dir = std::env::temp_dir().join(format!("sidejob-catalog-edit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Catalog::new(Some(dir.clone()));
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
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_profile_others_could_write_is_refused_and_the_previous_stays() {
        use std::os::unix::fs::PermissionsExt;
        let chmod = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let dir =
            std::env::temp_dir().join(format!("sidejob-catalog-trust-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        chmod(&dir, 0o755);
        let c = Catalog::new(Some(dir.clone()));
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
        chmod(&dir, 0o777);
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
        chmod(&dir, 0o755);
        assert_eq!(c.get("mine").unwrap().description, "v4");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
