//! Sessions: ids, directories, ownership (docs/protocol.md).

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::ids;
use crate::protocol::{SessionOpenParams, SessionOpenResult};
use crate::registry::{Registry, RegistryError, SessionRow};
use crate::sandbox;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    InvalidParams(String),
    #[error("session {0} belongs to another user")]
    PermissionDenied(String),
    #[error("session {0} not found")]
    NotFound(String),
    /// The profile needs a sandbox layer this host lacks.
    #[error("{0}")]
    SandboxUnavailable(String),
    #[error("cannot create session directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// Can `uid` see and touch a session owned by `owner`? Root sees all.
pub fn may_access(uid: u32, owner: u32) -> bool {
    uid == 0 || uid == owner
}

/// Looks a session up for `uid`: not found, or not theirs, are both errors.
pub fn get_for(
    registry: &Registry,
    uid: u32,
    session_id: &str,
) -> Result<SessionRow, SessionError> {
    if !ids::is_valid_session_id(session_id) {
        return Err(SessionError::InvalidParams(format!(
            "invalid session id {session_id:?}: use 1-64 of [A-Za-z0-9_-]"
        )));
    }
    let row = registry
        .get_session(session_id)?
        .ok_or_else(|| SessionError::NotFound(session_id.to_owned()))?;
    if !may_access(uid, row.owner_uid) {
        return Err(SessionError::PermissionDenied(session_id.to_owned()));
    }
    Ok(row)
}

/// `session.open`: creates the session, or reopens one the caller already owns.
pub fn open(
    registry: &Registry,
    cfg: &Config,
    uid: u32,
    p: SessionOpenParams,
) -> Result<SessionOpenResult, SessionError> {
    let session_id = p
        .session_id
        .unwrap_or_else(|| format!("s-{}", ids::ulid().to_ascii_lowercase()));
    if !ids::is_valid_session_id(&session_id) {
        return Err(SessionError::InvalidParams(format!(
            "invalid session id {session_id:?}: use 1-64 of [A-Za-z0-9_-]"
        )));
    }
    let workspace = absolute_dir("workspace", &p.workspace)?;
    let profile = p.profile.unwrap_or_else(|| cfg.default_profile.clone());
    // Known, valid and enforceable on this host: a session never starts with a profile its
    // runs would be refused under.
    sandbox::check_profile(
        &sandbox::Catalog::new(sandbox::Catalog::default_dir()),
        &profile,
    )
    .map_err(|e| match e {
        sandbox::CallSandboxError::Invalid(m) => SessionError::InvalidParams(m),
        sandbox::CallSandboxError::Unavailable(m) => SessionError::SandboxUnavailable(m),
    })?;
    if let Some(parent) = &p.parent_session_id {
        get_for(registry, uid, parent)?;
    }
    if let Some(existing) = registry.get_session(&session_id)? {
        if !may_access(uid, existing.owner_uid) {
            return Err(SessionError::PermissionDenied(session_id));
        }
        if existing.workspace != workspace.display().to_string() {
            return Err(SessionError::InvalidParams(format!(
                "session {session_id} already exists with workspace {}; open a new session for another workspace",
                existing.workspace
            )));
        }
        if !existing.is_open() {
            registry.reopen_session(&session_id)?;
        }
        return Ok(SessionOpenResult {
            session_id,
            session_dir: existing.session_dir,
            workspace: existing.workspace,
            profile: existing.profile,
        });
    }
    let session_dir = match p.session_dir {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if !dir.is_absolute() {
                return Err(SessionError::InvalidParams(format!(
                    "session_dir {} must be an absolute path",
                    dir.display()
                )));
            }
            dir
        }
        None => cfg.sessions_dir().join(&session_id),
    };
    std::fs::create_dir_all(session_dir.join(".background")).map_err(|source| {
        SessionError::Dir {
            path: session_dir.clone(),
            source,
        }
    })?;
    let session_dir = session_dir
        .canonicalize()
        .map_err(|source| SessionError::Dir {
            path: session_dir.clone(),
            source,
        })?;
    // Runs write into the session directory; it must never be inside the workspace.
    if session_dir.starts_with(&workspace) {
        return Err(SessionError::InvalidParams(format!(
            "session_dir {} is inside the workspace {}; choose a directory outside it",
            session_dir.display(),
            workspace.display()
        )));
    }
    let row = SessionRow {
        session_id: session_id.clone(),
        owner_uid: uid,
        workspace: workspace.display().to_string(),
        session_dir: session_dir.display().to_string(),
        profile: profile.clone(),
        proactive_wake: p.proactive_wake.unwrap_or(true),
        parent_session_id: p.parent_session_id,
        state: "open".into(),
        created_at: ids::now_rfc3339(),
        closed_at: None,
    };
    registry.insert_session(&row)?;
    Ok(SessionOpenResult {
        session_id,
        session_dir: row.session_dir,
        workspace: row.workspace,
        profile,
    })
}

fn absolute_dir(what: &str, path: &str) -> Result<PathBuf, SessionError> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(SessionError::InvalidParams(format!(
            "{what} {path:?} must be an absolute path"
        )));
    }
    let real = p
        .canonicalize()
        .map_err(|e| SessionError::InvalidParams(format!("{what} {path}: {e}")))?;
    if !real.is_dir() {
        return Err(SessionError::InvalidParams(format!(
            "{what} {path} is not a directory"
        )));
    }
    Ok(real)
}

/// A session and every session below it (children, grandchildren, …).
pub fn with_descendants(
    registry: &Registry,
    session_id: &str,
) -> Result<Vec<SessionRow>, SessionError> {
    let all = registry.list_sessions(None)?;
    let mut out: Vec<SessionRow> = all
        .iter()
        .filter(|s| s.session_id == session_id)
        .cloned()
        .collect();
    let mut i = 0;
    while i < out.len() {
        let parent = out[i].session_id.clone();
        out.extend(
            all.iter()
                .filter(|s| s.parent_session_id.as_deref() == Some(parent.as_str()))
                .cloned(),
        );
        i += 1;
    }
    Ok(out)
}
