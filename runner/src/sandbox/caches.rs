//! Persistent caches: directories a profile names (`[caches]`) that outlive the run, kept per
//! owner, profile and workspace under the state directory —
//! `<state_dir>/caches/<uid>/<profile>/ws.<key>/<name>`, where `<uid>` is the session's owner
//! (the caller of `sidejob exec`) and `<key>` is drawn from the workspace's path — and shown
//! in the run's view where the profile says (writable, not executable). A Cargo registry, a
//! pip or an npm cache filled by one run is there for the next run of the same user under the
//! same profile in the same workspace, and for nobody else: a file a run leaves there
//! (a tool's configuration, a script a tool sources) reaches only later runs that could have
//! been handed the same file through the workspace itself.
//!
//! Everything above `<name>` is the daemon's (mode 0711, no name in it comes from a caller);
//! `<name>` is handed to the run's user, and only it is in the view, so a run cannot plant
//! anything above it. Caches of the older layout (`<uid>/<profile>/<name>`, kept per owner and
//! profile only) are never used again: `sidejob doctor` lists them with no workspace and
//! `sidejob cache clear` removes them with the rest.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::Profile;

/// `<state_dir>/caches`.
pub(crate) fn root(state_dir: &Path) -> PathBuf {
    state_dir.join("caches")
}

/// What a workspace's directory is called: `ws.` and 32 hex digits of the SHA-256 of its path.
/// A cache's own name has no `.`, so no name of the older layout is ever taken for one.
const WORKSPACE_PREFIX: &str = "ws.";

/// The file in a workspace's directory that names the workspace (for `doctor`).
const WORKSPACE_FILE: &str = ".workspace";

pub(crate) fn workspace_key(workspace: &Path) -> String {
    let digest = Sha256::digest(workspace.as_os_str().as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{WORKSPACE_PREFIX}{hex}")
}

/// `<state_dir>/caches/<owner>/<profile>/ws.<key>`: the caches of `owner`'s runs under
/// `profile` in `workspace`.
pub(crate) fn dir_for(state_dir: &Path, owner: u32, profile: &str, workspace: &Path) -> PathBuf {
    root(state_dir)
        .join(owner.to_string())
        .join(profile)
        .join(workspace_key(workspace))
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

/// Makes the caches `profile` names for a run of `owner`'s in `workspace` that runs as
/// `run` (uid, gid) and returns their directory (`None` when the profile has none). Each
/// cache is a directory of its own, owned by the run's user (mode 0700).
pub(crate) fn prepare(
    state_dir: &Path,
    owner: u32,
    workspace: &Path,
    run: (u32, u32),
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
    let dir = dir_for(state_dir, owner, &profile.name, workspace);
    std::fs::create_dir_all(state_dir)?;
    let owner_dir = root(state_dir).join(owner.to_string());
    for d in [
        root(state_dir),
        owner_dir.clone(),
        owner_dir.join(&profile.name),
        dir.clone(),
    ] {
        ensure_dir(&d, 0o711)?;
    }
    let named = dir.join(WORKSPACE_FILE);
    if std::fs::symlink_metadata(&named).is_err() {
        let mut line = workspace.as_os_str().as_bytes().to_vec();
        line.push(b'\n');
        std::fs::write(&named, line)?;
    }
    let (uid, gid) = run;
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
    /// The workspace whose runs use it; `None` for a cache of the older layout, which no run
    /// uses any more.
    pub workspace: Option<PathBuf>,
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
            let mut add = |workspace: Option<PathBuf>, name: String, path: PathBuf| {
                out.push(CacheInfo {
                    uid,
                    profile: profile.clone(),
                    workspace,
                    name,
                    bytes: size_of(&path),
                    path,
                });
            };
            for (entry, path) in entries(&profile_dir) {
                if !entry.starts_with(WORKSPACE_PREFIX) {
                    add(None, entry, path);
                    continue;
                }
                let workspace = std::fs::read(path.join(WORKSPACE_FILE)).ok().map(|mut b| {
                    b.pop_if(|c| *c == b'\n');
                    PathBuf::from(<std::ffi::OsString as OsStringExt>::from_vec(b))
                });
                // A workspace's directory whose name file is gone still holds caches of it.
                let workspace = workspace.or_else(|| Some(PathBuf::from(&entry)));
                for (name, cache) in entries(&path) {
                    add(workspace.clone(), name, cache);
                }
            }
        }
    }
    out.sort_by(|a, b| {
        (a.uid, &a.profile, &a.workspace, &a.name).cmp(&(b.uid, &b.profile, &b.workspace, &b.name))
    });
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

/// One cache `clear` removed, or could not.
#[derive(Debug)]
pub(crate) struct Cleared {
    pub cache: CacheInfo,
    pub error: Option<io::Error>,
}

/// Removes the caches of `uid` (every uid when `None`) and `profile` (every profile when
/// `None`), each on its own: one that cannot be removed is reported and the others still
/// are. The removal holds a few descriptors whatever the depth and never follows a symlink
/// a run left (`sys::dirfd::remove_tree_at`).
pub(crate) fn clear(state_dir: &Path, uid: Option<u32>, profile: Option<&str>) -> Vec<Cleared> {
    list(state_dir)
        .into_iter()
        .filter(|c| uid.is_none_or(|u| u == c.uid) && profile.is_none_or(|p| p == c.profile))
        .map(|cache| {
            let error = remove(&cache.path).err();
            Cleared { cache, error }
        })
        .collect()
}

/// Removes one cache: its parent is the daemon's (no caller can rename anything there), the
/// cache itself is its user's.
fn remove(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
    else {
        return Err(io::Error::other(format!(
            "{} names no cache",
            path.display()
        )));
    };
    let parent = crate::sys::dirfd::open_dir(parent)?;
    crate::sys::dirfd::remove_tree_at(parent.as_fd(), name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn caches_are_made_per_owner_profile_and_workspace_listed_and_cleared() {
        let scratch = crate::scratch::ScratchDir::new("caches");
        let state = scratch.path();
        let mut p = Profile::empty("rusty");
        p.caches = vec![
            ("cargo".into(), "/cache/cargo".into()),
            ("pip".into(), "/cache/pip".into()),
        ];
        let (uid, gid) = (crate::sys::getuid(), crate::sys::getgid());
        let (a, b) = (Path::new("/work/a"), Path::new("/work/b"));
        let dir = prepare(state, uid, a, (uid, gid), &p).unwrap().unwrap();
        assert_eq!(dir, dir_for(state, uid, "rusty", a));
        std::fs::write(dir.join("cargo/x"), "12345").unwrap();
        // Again: nothing is lost. Another workspace has caches of its own.
        assert_eq!(
            prepare(state, uid, a, (uid, gid), &p).unwrap(),
            Some(dir.clone())
        );
        let other = prepare(state, uid, b, (uid, gid), &p).unwrap().unwrap();
        assert_ne!(other, dir);
        assert!(!other.join("cargo/x").exists());
        // A cache of the older layout is listed (no workspace) but never used.
        std::fs::create_dir_all(
            state
                .join("caches")
                .join(uid.to_string())
                .join("rusty/cargo"),
        )
        .unwrap();
        let listed = list(state);
        assert_eq!(listed.len(), 5, "{listed:?}");
        assert_eq!(listed[0].workspace, None);
        let in_a: Vec<&CacheInfo> = listed
            .iter()
            .filter(|c| c.workspace.as_deref() == Some(a))
            .collect();
        assert_eq!(in_a.len(), 2);
        assert_eq!(in_a[0].name, "cargo");
        assert!(in_a[0].bytes >= 5);
        assert!(clear(state, Some(uid), Some("other")).is_empty());
        let cleared = clear(state, Some(uid), Some("rusty"));
        assert_eq!(cleared.len(), 5);
        assert!(cleared.iter().all(|c| c.error.is_none()), "{cleared:?}");
        assert!(list(state).is_empty());
        assert_eq!(
            prepare(state, uid, a, (uid, gid), &Profile::empty("none")).unwrap(),
            None
        );
    }

    #[test]
    fn a_deep_tree_is_removed_without_following_its_links() {
        let scratch = crate::scratch::ScratchDir::new("caches-deep");
        let base = scratch.path();
        let outside = base.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let tree = base.join("tree");
        let mut d = tree.clone();
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("top-link")).unwrap();
        // Deeper than a path may be long: made one level at a time, relative to the last.
        let mut fd = crate::sys::dirfd::open_dir(&d).unwrap();
        for _ in 0..600 {
            crate::sys::dirfd::mkdir_at(fd.as_fd(), "a-rather-long-directory-name", 0o700).unwrap();
            fd = crate::sys::dirfd::open_subdir(
                fd.as_fd(),
                Path::new("a-rather-long-directory-name"),
            )
            .unwrap();
        }
        drop(fd);
        d.push("a-rather-long-directory-name");
        std::os::unix::fs::symlink(&outside, d.join("out")).unwrap();
        std::fs::write(d.join("f"), "y").unwrap();
        let parent = crate::sys::dirfd::open_dir(base).unwrap();
        crate::sys::dirfd::remove_tree_at(parent.as_fd(), "tree").unwrap();
        assert!(!tree.exists());
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "x");
    }
}
