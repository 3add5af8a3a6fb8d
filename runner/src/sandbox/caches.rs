//! Persistent caches: directories a profile names (`[caches]`) that outlive the run, kept per
//! uid and profile under the state directory — `<state_dir>/caches/<uid>/<profile>/<name>` —
//! and shown in the run's view where the profile says (writable, not executable). A Cargo
//! registry, a pip or an npm cache filled by one run is there for the next run of the same
//! user under the same profile, and for nobody else.
//!
//! Everything above `<name>` is the daemon's (mode 0711, no name in it comes from a caller);
//! `<name>` is handed to the run's user, and only it is in the view, so a run cannot plant
//! anything above it. `sidejob doctor` lists the caches; `sidejob cache clear` removes them.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::Profile;

/// `<state_dir>/caches`.
pub(crate) fn root(state_dir: &Path) -> PathBuf {
    state_dir.join("caches")
}

/// `<state_dir>/caches/<uid>/<profile>`.
pub(crate) fn dir_for(state_dir: &Path, uid: u32, profile: &str) -> PathBuf {
    root(state_dir).join(uid.to_string()).join(profile)
}

fn valid_profile_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A directory of ours: made 0711 if missing; refused if it is a symlink or not a directory.
fn ensure_dir(path: &Path, mode: u32) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(path)?;
            if meta.is_dir() {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "{} is not a directory",
                    path.display()
                )))
            }
        }
        Err(e) => Err(e),
    }
}

/// Makes the caches `profile` names for a run as `uid`/`gid` and returns their directory
/// (`None` when the profile has none). Each cache is a directory of its own, owned by the
/// run's user (mode 0700).
pub(crate) fn prepare(
    state_dir: &Path,
    uid: u32,
    gid: u32,
    profile: &Profile,
) -> io::Result<Option<PathBuf>> {
    if profile.caches.is_empty() {
        return Ok(None);
    }
    if !valid_profile_name(&profile.name) {
        return Err(io::Error::other(format!(
            "profile {:?} keeps caches but its name is not letters, digits, '-' and '_'",
            profile.name
        )));
    }
    let dir = dir_for(state_dir, uid, &profile.name);
    std::fs::create_dir_all(state_dir)?;
    for d in [
        root(state_dir),
        root(state_dir).join(uid.to_string()),
        dir.clone(),
    ] {
        ensure_dir(&d, 0o711)?;
    }
    for (name, _) in &profile.caches {
        let c = dir.join(name);
        ensure_dir(&c, 0o700)?;
        let meta = std::fs::symlink_metadata(&c)?;
        if meta.uid() != uid || meta.gid() != gid {
            std::os::unix::fs::lchown(&c, Some(uid), Some(gid))?;
        }
    }
    Ok(Some(dir))
}

/// One cache as `doctor` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct CacheInfo {
    pub uid: u32,
    pub profile: String,
    pub name: String,
    pub path: PathBuf,
    pub bytes: u64,
}

/// Every cache under `state_dir`, with its size (symlinks are not followed).
pub(crate) fn list(state_dir: &Path) -> Vec<CacheInfo> {
    let mut out = Vec::new();
    let entries = |p: &Path| -> Vec<(String, PathBuf)> {
        std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                    .collect()
            })
            .unwrap_or_default()
    };
    for (uid, uid_dir) in entries(&root(state_dir)) {
        let Ok(uid) = uid.parse::<u32>() else {
            continue;
        };
        for (profile, profile_dir) in entries(&uid_dir) {
            for (name, path) in entries(&profile_dir) {
                out.push(CacheInfo {
                    uid,
                    profile: profile.clone(),
                    name,
                    bytes: size_of(&path),
                    path,
                });
            }
        }
    }
    out.sort_by(|a, b| (a.uid, &a.profile, &a.name).cmp(&(b.uid, &b.profile, &b.name)));
    out
}

/// Bytes in a tree, without following symlinks.
fn size_of(path: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        total += meta.len();
        if meta.is_dir() {
            if let Ok(d) = std::fs::read_dir(&p) {
                stack.extend(d.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

/// Removes the caches of `uid` (every uid when `None`) and `profile` (every profile when
/// `None`); returns what was removed. The removal does not follow symlinks a run left.
pub(crate) fn clear(
    state_dir: &Path,
    uid: Option<u32>,
    profile: Option<&str>,
) -> io::Result<Vec<CacheInfo>> {
    let mut removed = Vec::new();
    for c in list(state_dir) {
        if uid.is_some_and(|u| u != c.uid) || profile.is_some_and(|p| p != c.profile) {
            continue;
        }
        std::fs::remove_dir_all(&c.path)?;
        removed.push(c);
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn caches_are_made_per_uid_and_profile_listed_and_cleared() {
        let scratch = crate::scratch::ScratchDir::new("caches");
        let state = scratch.path();
        let mut p = Profile::empty("rusty");
        p.caches = vec![
            ("cargo".into(), "/cache/cargo".into()),
            ("pip".into(), "/cache/pip".into()),
        ];
        let (uid, gid) = (crate::sys::getuid(), crate::sys::getgid());
        let dir = prepare(state, uid, gid, &p).unwrap().unwrap();
        assert_eq!(dir, dir_for(state, uid, "rusty"));
        std::fs::write(dir.join("cargo/x"), "12345").unwrap();
        // Again: nothing is lost.
        prepare(state, uid, gid, &p).unwrap();
        let listed = list(state);
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].name, "cargo");
        assert!(listed[0].bytes >= 5);
        assert!(clear(state, Some(uid), Some("other")).unwrap().is_empty());
        assert_eq!(clear(state, Some(uid), Some("rusty")).unwrap().len(), 2);
        assert!(list(state).is_empty());
        assert_eq!(
            prepare(state, uid, gid, &Profile::empty("none")).unwrap(),
            None
        );
    }
}
