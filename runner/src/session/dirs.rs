//! The paths a caller names at `session.open` — the workspace and, optionally, the session
//! directory — checked and made with the caller's authority, never the daemon's (see
//! `docs/security.md`).
//!
//! - The workspace is resolved and opened with the caller's filesystem credentials, so the
//!   search permission of every parent counts: a path the caller cannot reach is refused
//!   just as it would be for them. It must not be, hold or lie inside a directory only the
//!   daemon may use (its state, the sessions, the bridges, the control socket).
//! - A session directory the caller names must be theirs: an absolute path with no `.` or
//!   `..`, no symlink on the way, owned and writable by them, outside the workspace and the
//!   daemon's directories. If it does not exist it is made with the caller's credentials, so
//!   the daemon never makes anything a caller could not have made.
//! - A session directory the daemon chooses is `<sessions_dir>/<id>`, made by the daemon and
//!   handed to the caller (mode 0700).

use std::io;
use std::os::fd::AsFd;
use std::path::{Component, Path, PathBuf};

use super::SessionError;
use crate::config::Config;
use crate::registry::health::FoundSession;
use crate::sys::dirfd::{self, Creds};

pub(crate) use crate::run::dir::BACKGROUND;

fn invalid(msg: String) -> SessionError {
    SessionError::InvalidParams(msg)
}

/// Why a directory cannot be used, as the caller should read it.
fn io_refusal(what: &str, path: &str, e: &io::Error) -> SessionError {
    match e.raw_os_error() {
        Some(libc::ELOOP) => invalid(format!(
            "{what} {path} passes through a symlink; name the real directory"
        )),
        Some(libc::EACCES) | Some(libc::EPERM) => SessionError::PermissionDenied(format!(
            "{what} {path}: you cannot open it (permission denied)"
        )),
        Some(libc::ENOENT) => invalid(format!("{what} {path} does not exist")),
        Some(libc::ENOTDIR) => invalid(format!("{what} {path} is not a directory")),
        _ => invalid(format!("{what} {path}: {e}")),
    }
}

/// An absolute path with no `.` or `..` component (trailing slashes dropped).
fn plain_absolute(what: &str, path: &str) -> Result<PathBuf, SessionError> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(invalid(format!("{what} {path:?} must be an absolute path")));
    }
    if p.components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        || path.split('/').any(|c| c == ".")
    {
        return Err(invalid(format!(
            "{what} {path:?} must not contain \".\" or \"..\"; name the directory itself"
        )));
    }
    Ok(p.components().collect())
}

/// `a` is `b`, or one holds the other.
fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The daemon's own directories, canonical where they exist.
fn daemon_dirs(cfg: &Config) -> Vec<(&'static str, PathBuf)> {
    cfg.daemon_dirs()
        .into_iter()
        .map(|(what, p)| (what, p.canonicalize().unwrap_or(p)))
        .collect()
}

/// Resolves the workspace as the caller and checks it; returns its canonical path.
pub(crate) fn check_workspace(
    cfg: &Config,
    caller: &Creds,
    path: &str,
) -> Result<PathBuf, SessionError> {
    let requested = plain_absolute("workspace", path)?;
    let real = dirfd::as_caller(Some(caller), || {
        let real = std::fs::canonicalize(&requested)?;
        // The canonical path must open with no symlink on the way (a run's view is built the
        // same way), and be a directory.
        let fd = dirfd::open_dir(&real)?;
        if !dirfd::is_dir(&dirfd::stat_fd(fd.as_fd())?) {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(real)
    })
    .map_err(|e| io_refusal("workspace", path, &e))?;
    // A run's view makes its own /dev and /proc, and takes no /sys from the host (no shipped
    // profile lists it): a workspace there would be hidden, and every run would fail to
    // start in it.
    let not_from_host = crate::sandbox::linux::view::MADE_ANEW
        .iter()
        .chain(&["sys"]);
    if let Some(own) = not_from_host
        .map(|d| Path::new("/").join(d))
        .find(|d| real.starts_with(d))
    {
        return Err(invalid(format!(
            "workspace {} is under {}, which a run's view replaces with its own; choose a directory elsewhere",
            real.display(),
            own.display()
        )));
    }
    for (what, dir) in daemon_dirs(cfg) {
        if overlaps(&real, &dir) {
            return Err(invalid(format!(
                "workspace {} {} {what} ({}); a run would see the daemon's files: choose a directory apart from it",
                real.display(),
                if dir.starts_with(&real) { "holds" } else { "lies inside" },
                dir.display()
            )));
        }
    }
    Ok(real)
}

/// Makes or checks the session directory and its `.background`; returns its path.
pub(crate) fn make_session_dir(
    cfg: &Config,
    caller: &Creds,
    session_id: &str,
    requested: Option<&str>,
    workspace: &Path,
) -> Result<PathBuf, SessionError> {
    match requested {
        Some(path) => callers_session_dir(cfg, caller, path, workspace),
        None => daemons_session_dir(cfg, caller, session_id),
    }
}

fn callers_session_dir(
    cfg: &Config,
    caller: &Creds,
    path: &str,
    workspace: &Path,
) -> Result<PathBuf, SessionError> {
    let dir = plain_absolute("session_dir", path)?;
    if dir.starts_with(workspace) {
        return Err(invalid(format!(
            "session_dir {} is inside the workspace {}; runs write there, so choose a directory outside it",
            dir.display(),
            workspace.display()
        )));
    }
    for (what, d) in daemon_dirs(cfg) {
        if overlaps(&dir, &d) {
            return Err(invalid(format!(
                "session_dir {} overlaps {what} ({}); leave session_dir out to let the daemon choose one there",
                dir.display(),
                d.display()
            )));
        }
    }
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(invalid(format!("session_dir {path:?} cannot be /")));
    };
    let name = name.to_string_lossy().into_owned();
    let uid = caller.uid;
    dirfd::as_caller(Some(caller), || {
        let parent = dirfd::open_dir(parent)?;
        let fd = dirfd::ensure_subdir(parent.as_fd(), &name, 0o700, None)?;
        let st = dirfd::stat_fd(fd.as_fd())?;
        if st.st_uid != uid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("it belongs to uid {}, not to you (uid {uid})", st.st_uid),
            ));
        }
        if st.st_mode & 0o200 == 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "it is not writable by you",
            ));
        }
        dirfd::ensure_subdir(fd.as_fd(), BACKGROUND, 0o700, None)?;
        Ok(())
    })
    .map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied if e.raw_os_error().is_none() => {
            SessionError::PermissionDenied(format!("session_dir {path}: {e}"))
        }
        _ => io_refusal("session_dir", path, &e),
    })?;
    Ok(dir)
}

fn daemons_session_dir(
    cfg: &Config,
    caller: &Creds,
    session_id: &str,
) -> Result<PathBuf, SessionError> {
    let sessions = cfg.sessions_dir();
    let fail = |source| SessionError::Dir {
        path: sessions.join(session_id),
        source,
    };
    let base = dirfd::open_dir(&sessions).map_err(fail)?;
    let owner = (caller.uid, caller.gid);
    let fd = dirfd::ensure_subdir(base.as_fd(), session_id, 0o700, Some(owner)).map_err(fail)?;
    // Left by an earlier session of that id (whose registry row is gone): only its owner's.
    let st = dirfd::stat_fd(fd.as_fd()).map_err(fail)?;
    if st.st_uid != caller.uid {
        return Err(SessionError::PermissionDenied(format!(
            "the directory {} belongs to uid {}; open the session under another id",
            sessions.join(session_id).display(),
            st.st_uid
        )));
    }
    dirfd::ensure_subdir(fd.as_fd(), BACKGROUND, 0o700, Some(owner)).map_err(fail)?;
    Ok(sessions.join(session_id))
}

/// The session directories under `sessions_dir` (`<sessions_dir>/<id>`) and the results of
/// their runs, for `sidejob registry rebuild`: each directory's owner is its session's, and
/// a result counts only if it names the session and the run directory it was read from
/// (and belongs to the owner: `run::result::read`).
pub(crate) fn found_on_disk(sessions_dir: &Path) -> Vec<FoundSession> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(sessions_dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Some(session_id) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !crate::ids::is_valid_session_id(&session_id) {
            continue;
        }
        let dir = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        let results = crate::run::dir::run_ids(&dir)
            .into_iter()
            .filter_map(|task_id| {
                let fd = crate::run::dir::open_public(&dir, meta.uid(), &task_id).ok()?;
                let res = crate::run::result::read(fd.as_fd(), meta.uid()).ok()??;
                (res.task_id == task_id && res.session_id == session_id).then_some(res)
            })
            .collect();
        found.push(FoundSession {
            session_id,
            owner_uid: meta.uid(),
            owner_gid: meta.gid(),
            dir,
            results,
        });
    }
    found
}
