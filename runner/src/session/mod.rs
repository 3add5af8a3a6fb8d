//! Sessions: ids, directories, ownership.
//!
//! A session id is a global name, so two rules keep one user from taking another's:
//! the ids the CLI and `sidejob mcp` derive (`cli-<uid>-…`, `mcp-<uid>-…`) are reserved for
//! that uid, and root — who may see every session — acts in a session another uid owns only
//! when it asks to (`adopt: true`), and then as that user, never as root.

pub(crate) mod dirs;
#[cfg(test)]
mod tests;
mod tree;

pub(crate) use tree::{child_session_id, depth_of, open_child, root_session, with_descendants};

use std::path::PathBuf;

use tracing::info;

use crate::config::Config;
use crate::ids;
use crate::protocol::{SessionOpenParams, SessionOpenResult};
use crate::registry::{Holding, Registry, RegistryError, SessionRow};
use crate::sandbox;
use crate::sys::dirfd::Creds;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    InvalidParams(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    LimitExceeded(String),
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

/// Can `uid` see a session owned by `owner`? Root sees all.
pub(crate) fn may_access(uid: u32, owner: u32) -> bool {
    uid == 0 || uid == owner
}

fn belongs_to_another(session_id: &str, owner: u32) -> SessionError {
    SessionError::PermissionDenied(format!(
        "session {session_id} belongs to another user (uid {owner})"
    ))
}

/// The uid a session id is reserved for: `cli-<uid>-…` and `mcp-<uid>-…` are the ids the
/// command line and the MCP server derive for that user.
pub(crate) fn reserved_for(session_id: &str) -> Option<u32> {
    let rest = session_id
        .strip_prefix("cli-")
        .or_else(|| session_id.strip_prefix("mcp-"))?;
    let (uid, _) = rest.split_once('-')?;
    uid.parse().ok()
}

fn check_id(session_id: &str) -> Result<(), SessionError> {
    if ids::is_valid_session_id(session_id) {
        Ok(())
    } else {
        Err(SessionError::InvalidParams(format!(
            "invalid session id {session_id:?}: use 1-64 of [A-Za-z0-9_-]"
        )))
    }
}

/// Looks a session up for `uid` to read: not found, or not theirs, are both errors.
pub(crate) fn get_for(
    registry: &Registry,
    uid: u32,
    session_id: &str,
) -> Result<SessionRow, SessionError> {
    check_id(session_id)?;
    let row = registry
        .get_session(session_id)?
        .ok_or_else(|| SessionError::NotFound(session_id.to_owned()))?;
    if !may_access(uid, row.owner_uid) {
        return Err(belongs_to_another(session_id, row.owner_uid));
    }
    Ok(row)
}

/// Looks a session up for `uid` to start work in (`tool.call`, `schedule.create`). Root
/// starts work in another user's session only with `adopt`; the work is then that user's.
pub(crate) fn get_to_work_in(
    registry: &Registry,
    uid: u32,
    session_id: &str,
    adopt: bool,
) -> Result<SessionRow, SessionError> {
    let row = get_for(registry, uid, session_id)?;
    if uid != row.owner_uid {
        if !adopt {
            return Err(SessionError::PermissionDenied(format!(
                "session {session_id} belongs to uid {}; as root, pass adopt: true to act in it (as that user)",
                row.owner_uid
            )));
        }
        info!(
            session_id,
            owner_uid = row.owner_uid,
            "root adopts another user's session"
        );
        // The owner sees it too: a notice in the session's inbox.
        let notice = crate::registry::NotificationRow {
            id: ids::ulid(),
            session_id: session_id.to_owned(),
            owner_uid: row.owner_uid,
            task_id: None,
            severity: "warn".into(),
            kind: "adopted".into(),
            text: format!(
                "uid {uid} (root) acted in this session with adopt: true; what it starts here runs as uid {}",
                row.owner_uid
            ),
            created_at: ids::now_rfc3339(),
            acked: false,
            acked_at: None,
            occurrence_key: None,
        };
        registry.notify(&notice)?;
    }
    Ok(row)
}

/// The credentials a session's paths are used with: its owner's. When the owner is the
/// peer on the socket, its own credentials (groups as it has them now); otherwise (root
/// adopting, a schedule firing, a restarted daemon) the owner's entry in the user database.
pub(crate) fn owner_creds(row: &SessionRow, peer: Option<&Creds>) -> Creds {
    match peer {
        Some(p) if p.uid == row.owner_uid => p.clone(),
        _ => crate::sys::user_creds(row.owner_uid, row.owner_gid),
    }
}

/// Held while `session.open` looks a session up and makes it.
static OPENING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `session.open`: creates the session, or reopens one the caller already owns.
pub(crate) fn open(
    registry: &Registry,
    cfg: &Config,
    catalog: &sandbox::Catalog,
    caller: &Creds,
    p: SessionOpenParams,
) -> Result<SessionOpenResult, SessionError> {
    let uid = caller.uid;
    let session_id = p
        .session_id
        .clone()
        .unwrap_or_else(|| format!("s-{}", ids::ulid().to_ascii_lowercase()));
    check_id(&session_id)?;
    let profile = p
        .profile
        .clone()
        .unwrap_or_else(|| cfg.default_profile.clone());
    // Known, valid and enforceable on this host: a session never starts with a profile its
    // runs would be refused under.
    sandbox::call::check_profile(catalog, &profile, uid).map_err(|e| match e {
        sandbox::call::CallSandboxError::Invalid(m) => SessionError::InvalidParams(m),
        sandbox::call::CallSandboxError::Unavailable(m) => SessionError::SandboxUnavailable(m),
    })?;
    if let Some(parent) = &p.parent_session_id {
        get_for(registry, uid, parent)?;
    }
    // One at a time from here: two opens of one new id (two `sidejob call`s started together
    // in one directory) would both find it missing, and the second one's insert fail.
    let _one_at_a_time = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(existing) = registry.get_session(&session_id)? {
        return reopen(registry, cfg, caller, existing, &p, &profile);
    }
    if let Some(owner) = reserved_for(&session_id).filter(|o| *o != uid) {
        return Err(SessionError::PermissionDenied(format!(
            "session id {session_id} is reserved for uid {owner} (ids starting cli-<uid>- or mcp-<uid>- belong to that user); choose another id"
        )));
    }
    if p.parent_session_id.is_none() {
        let open = registry.count_of(uid, Holding::OpenSessions)?;
        if open >= cfg.per_user.sessions as u64 {
            return Err(SessionError::LimitExceeded(format!(
                "uid {uid} has {open} open sessions: per_user.sessions ({}) is reached; close some with session.close",
                cfg.per_user.sessions
            )));
        }
    }
    let workspace = dirs::check_workspace(cfg, caller, &p.workspace)?;
    let session_dir = dirs::make_session_dir(
        cfg,
        caller,
        &session_id,
        p.session_dir.as_deref(),
        &workspace,
    )?;
    let row = SessionRow {
        session_id: session_id.clone(),
        owner_uid: uid,
        owner_gid: caller.gid,
        workspace: workspace.display().to_string(),
        session_dir: session_dir.display().to_string(),
        profile: profile.clone(),
        proactive_wake: p.proactive_wake.unwrap_or(true),
        parent_session_id: p.parent_session_id,
        state: crate::protocol::SessionState::Open,
        created_at: ids::now_rfc3339(),
        closed_at: None,
    };
    registry.insert_session(&row)?;
    Ok(SessionOpenResult {
        session_id,
        session_dir: row.session_dir,
        workspace: row.workspace,
        profile,
        owner_uid: Some(uid),
    })
}

/// `session.open` of a session that exists: the caller must be allowed to work in it, and
/// its workspace and directory stay what they were (a deleted one's directory is made again).
/// A session rebuilt from its directory (`sidejob registry rebuild`) may have no record of
/// its workspace or profile: the first reopening names them, checked as a new session's
/// (`profile` is the one asked for, or the default).
fn reopen(
    registry: &Registry,
    cfg: &Config,
    caller: &Creds,
    existing: SessionRow,
    p: &SessionOpenParams,
    profile: &str,
) -> Result<SessionOpenResult, SessionError> {
    let uid = caller.uid;
    let session_id = existing.session_id.clone();
    get_to_work_in(registry, uid, &session_id, p.adopt.unwrap_or(false))?;
    let workspace =
        dirs::check_workspace(cfg, &owner_creds(&existing, Some(caller)), &p.workspace)?;
    let asked = workspace.display().to_string();
    let unknown = existing.workspace.is_empty();
    if !unknown && existing.workspace != asked {
        return Err(SessionError::InvalidParams(format!(
            "session {session_id} already exists with workspace {}; open a new session for another workspace",
            existing.workspace
        )));
    }
    if let Some(asked) = p.session_dir.as_deref() {
        if std::path::Path::new(asked) != std::path::Path::new(&existing.session_dir) {
            return Err(SessionError::InvalidParams(format!(
                "session {session_id} already exists with session_dir {}; leave session_dir out (or name that one) to reopen it",
                existing.session_dir
            )));
        }
    }
    if existing.state == crate::protocol::SessionState::Deleted {
        // Its directory was removed: make it again (only the daemon's own are deleted).
        dirs::make_session_dir(
            cfg,
            &owner_creds(&existing, Some(caller)),
            &session_id,
            None,
            &workspace,
        )?;
    }
    let named = unknown.then_some(asked);
    let named_profile = existing.profile.is_empty().then(|| profile.to_owned());
    if !existing.is_open() || named.is_some() || named_profile.is_some() {
        registry.reopen_session(&session_id, named.as_deref(), named_profile.as_deref())?;
    }
    Ok(SessionOpenResult {
        session_id,
        session_dir: existing.session_dir,
        workspace: named.unwrap_or(existing.workspace),
        profile: named_profile.unwrap_or(existing.profile),
        owner_uid: Some(existing.owner_uid),
    })
}
