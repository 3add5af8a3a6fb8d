//! Subagents (docs/plugins.md): a tool whose plan asks for `child_session` runs in a new session
//! below the caller's (at most [`MAX_DEPTH`] levels deep), with a bridge scoped to it. When
//! the agent exits, its task waits for the child's background tasks that are not services,
//! and hands the services over to the parent session, so a subagent that starts a server
//! still reports back. Cancelling the subagent cancels everything below it.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use nix::fcntl::OFlag;

use serde_json::json;
use tracing::{info, warn};

use crate::config::Config;
use crate::executor::{ExecError, Executor};
use crate::protocol::SessionOpenParams;
use crate::registry::{Registry, SessionRow, TaskRow};
use crate::run_dir;
use crate::session;
use crate::sys::dirfd;

/// How many sessions may lie above a subagent's child session.
pub const MAX_DEPTH: u32 = 3;

/// The child session of a subagent task (derived from its id, so it needs no column).
pub fn child_session_id(task_id: &str) -> String {
    format!("sub-{}", task_id.to_ascii_lowercase())
}

/// How many sessions lie above `s`.
pub fn depth_of(registry: &Registry, s: &SessionRow) -> u32 {
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
pub fn root_session(registry: &Registry, session_id: &str) -> String {
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
pub fn open_child(
    registry: &Registry,
    cfg: &Config,
    parent: &SessionRow,
    profile: &str,
    task_id: &str,
) -> Result<SessionRow, ExecError> {
    let depth = depth_of(registry, parent) + 1;
    if depth > MAX_DEPTH {
        return Err(ExecError::InvalidParams(format!(
            "a subagent may not start another one here: session {} is already {} levels below the host's (the limit is {MAX_DEPTH})",
            parent.session_id,
            depth - 1
        )));
    }
    let id = child_session_id(task_id);
    session::open(
        registry,
        cfg,
        &session::owner_creds(parent, None),
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
    .map_err(|e| ExecError::InvalidParams(format!("cannot open the subagent's session: {e}")))?;
    registry
        .get_session(&id)?
        .ok_or_else(|| ExecError::InvalidState(format!("session {id} vanished")))
}

/// The live tasks of a child session and of every session below it.
fn live_below(exec: &Executor, child: &str) -> Vec<TaskRow> {
    let registry = exec.registry();
    let Ok(sessions) = session::with_descendants(registry, child) else {
        return Vec::new();
    };
    sessions
        .iter()
        .flat_map(|s| {
            registry
                .live_tasks_of_session(&s.session_id)
                .unwrap_or_default()
        })
        .collect()
}

/// Cancels every task below subagent task `task_id` (nothing if it is not a subagent).
pub fn cancel_children(exec: &Executor, task_id: &str) {
    let child = child_session_id(task_id);
    let Ok(sessions) = session::with_descendants(exec.registry(), &child) else {
        return;
    };
    for s in sessions {
        if let Err(e) = exec.cancel_session(&s.session_id) {
            warn!(task_id, session_id = %s.session_id, "cannot cancel the subagent's tasks: {e}");
        }
    }
}

/// Runs after a task's supervisor exited and before the task settles. For a subagent: waits
/// for the child's non-service tasks, hands the services over to `parent_session`, records
/// them in `handover.json` and at the end of the output (through the run directory's
/// descriptor `public`), and closes the child session.
pub async fn finish(
    exec: &Executor,
    task_id: &str,
    parent_session: &str,
    public: Option<BorrowedFd<'_>>,
    canceled: bool,
) {
    let child = child_session_id(task_id);
    match exec.registry().get_session(&child) {
        Ok(Some(s)) if s.parent_session_id.as_deref() == Some(parent_session) => {}
        _ => return,
    }
    // A canceled subagent hands nothing over: everything below it is being stopped.
    loop {
        let waiting: Vec<TaskRow> = live_below(exec, &child)
            .into_iter()
            .filter(|t| canceled || !t.service)
            .collect();
        let Some(next) = waiting.first() else { break };
        match exec.settled_signal(&next.task_id) {
            Some(mut rx) => {
                let _ = rx.wait_for(|d| *d).await;
            }
            // Live in the registry but not in the executor (never the case for long).
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let mut handed = Vec::new();
    for t in live_below(exec, &child).into_iter().filter(|t| t.service) {
        match exec.registry().hand_over_task(&t.task_id, parent_session) {
            Ok(_) => handed.push(
                json!({"task_id": t.task_id, "summary": t.summary, "from_session": t.session_id}),
            ),
            Err(e) => warn!(task_id = %t.task_id, "cannot hand the service over: {e}"),
        }
    }
    info!(task_id, child_session = %child, handed_over = handed.len(), "subagent finished");
    if let Some(dir) = public {
        record_handover(exec, task_id, dir, parent_session, &child, &handed);
    }
    if let Err(e) = exec.registry().close_session(&child) {
        warn!(task_id, "cannot close the subagent's session: {e}");
    }
    exec.forget_session(&child);
}

/// `handover.json` and a line at the end of `output.log`, written through the run
/// directory's descriptor as files of the session's owner.
fn record_handover(
    exec: &Executor,
    task_id: &str,
    dir: BorrowedFd<'_>,
    parent_session: &str,
    child: &str,
    handed: &[serde_json::Value],
) {
    let Ok(Some(task)) = exec.registry().get_task(task_id) else {
        return;
    };
    let owner = (task.owner_uid, task.owner_gid);
    let record = json!({"child_session": child, "handed_over": handed});
    if let Err(e) = run_dir::create_file(dir, run_dir::HANDOVER, Some(owner))
        .and_then(|mut f| f.write_all(record.to_string().as_bytes()))
    {
        warn!(task_id, "cannot write handover.json: {e}");
    }
    if handed.is_empty() {
        return;
    }
    let mut line = format!("\n[sidejob] services handed over to session {parent_session}:");
    for h in handed {
        line.push_str(&format!(
            " {} ({})",
            h["task_id"].as_str().unwrap_or(""),
            h["summary"].as_str().unwrap_or("")
        ));
    }
    line.push('\n');
    let appended = dirfd::open_at(
        dir,
        Path::new(run_dir::OUTPUT),
        OFlag::O_WRONLY | OFlag::O_APPEND,
        0,
    )
    .and_then(|fd| {
        let st = dirfd::stat_fd(fd.as_fd())?;
        if !dirfd::is_file(&st) || st.st_uid != task.owner_uid {
            return Err(std::io::Error::other(
                "output.log is not the run's own file",
            ));
        }
        std::fs::File::from(fd).write_all(line.as_bytes())
    });
    if let Err(e) = appended {
        warn!(task_id, "cannot append the hand-over to output.log: {e}");
    }
}
