//! The session tree: a subagent's child session below its caller's (`parent_session_id`),
//! at most [`MAX_DEPTH`] levels deep (docs/plugins.md, subagent).

use crate::config::Config;
use crate::protocol::SessionOpenParams;
use crate::registry::{Registry, SessionRow};

use super::{open, owner_creds, SessionError};

/// How many sessions may lie above a subagent's child session.
pub(crate) const MAX_DEPTH: u32 = 3;

/// The child session of a subagent task (derived from its id, so it needs no column).
pub(crate) fn child_session_id(task_id: &str) -> String {
    format!("sub-{}", task_id.to_ascii_lowercase())
}

/// How many sessions lie above `s`.
pub(crate) fn depth_of(registry: &Registry, s: &SessionRow) -> u32 {
    let mut depth = 0;
    let mut parent = s.parent_session_id.clone();
    while let Some(p) = parent {
        depth += 1;
        if depth > 64 {
            break; // a cycle cannot be made through the protocol; do not loop on a corrupt one
        }
        parent = registry
            .get_session(&p)
            .ok()
            .flatten()
            .and_then(|r| r.parent_session_id);
    }
    depth
}

/// The top of the session tree `session_id` is in (itself for a host's own session).
pub(crate) fn root_session(registry: &Registry, session_id: &str) -> String {
    let mut current = session_id.to_owned();
    for _ in 0..64 {
        match registry
            .get_session(&current)
            .ok()
            .flatten()
            .and_then(|s| s.parent_session_id)
        {
            Some(parent) => current = parent,
            None => break,
        }
    }
    current
}

/// Opens the child session of subagent task `task_id` below `parent`, under `profile` — the
/// subagent's own effective profile, so a subagent narrowed to `read-only` cannot get the
/// parent session's wider profile back through its child session.
pub(crate) fn open_child(
    registry: &Registry,
    cfg: &Config,
    catalog: &crate::sandbox::Catalog,
    parent: &SessionRow,
    profile: &str,
    task_id: &str,
) -> Result<SessionRow, SessionError> {
    let depth = depth_of(registry, parent) + 1;
    if depth > MAX_DEPTH {
        return Err(SessionError::InvalidParams(format!(
            "a subagent may not start another one here: session {} is already {} levels below the host's (the limit is {MAX_DEPTH})",
            parent.session_id,
            depth - 1
        )));
    }
    let id = child_session_id(task_id);
    open(
        registry,
        cfg,
        catalog,
        &owner_creds(parent, None),
        SessionOpenParams {
            session_id: Some(id.clone()),
            workspace: parent.workspace.clone(),
            session_dir: None,
            profile: Some(profile.to_owned()),
            // Services handed over to the parent wake it the way its own tasks do.
            proactive_wake: Some(parent.proactive_wake),
            parent_session_id: Some(parent.session_id.clone()),
            adopt: None,
        },
    )
    .map_err(|e| SessionError::InvalidParams(format!("cannot open the subagent's session: {e}")))?;
    registry
        .get_session(&id)?
        .ok_or_else(|| SessionError::NotFound(id))
}

/// A session and every session below it (children, grandchildren, …).
pub(crate) fn with_descendants(
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
