//! Subagents (docs/plugins.md): a tool whose plan asks for `child_session` runs in a new session
//! below the caller's (at most `session::MAX_DEPTH` levels deep), with a bridge scoped to it. When
//! the agent exits, its task waits for the child's background tasks that are not services,
//! and hands the services over to the parent session, so a subagent that starts a server
//! still reports back. Cancelling the subagent cancels everything below it.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::fcntl::OFlag;

use serde_json::json;
use tracing::{info, warn};

use crate::executor::{Executor, RunEnd};
use crate::registry::TaskRow;
use crate::session::{self, child_session_id};
use crate::sys::dirfd;

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
pub(super) fn cancel_children(exec: &Executor, task_id: &str) {
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

/// Runs after a task's supervisor exited and before the task settles (the executor's
/// `RunHooks::ending`). For a subagent: waits for the child's non-service tasks, hands the
/// services over to the parent session, records them in `handover.json` and at the end of
/// the output (through the run directory's descriptor), and closes the child session.
///
/// The hand-over line is appended after the supervisor wrote `result.json` (whose
/// `output_bytes` therefore does not count it): the supervisor's result is final when it
/// exits, and the services are only known once the child's other tasks have settled.
pub(super) async fn finish(exec: &Executor, run: RunEnd<'_>) {
    let child = child_session_id(run.task_id);
    match exec.registry().get_session(&child) {
        Ok(Some(s)) if s.parent_session_id.as_deref() == Some(run.session_id) => {}
        _ => return,
    }
    // A canceled subagent hands nothing over: everything below it is being stopped.
    wait_below(exec, &child, run.canceled).await;
    let mut handed = Vec::new();
    for t in live_below(exec, &child).into_iter().filter(|t| t.service) {
        match exec.registry().hand_over_task(&t.task_id, run.session_id) {
            Ok(_) => handed.push(
                json!({"task_id": t.task_id, "summary": t.summary, "from_session": t.session_id}),
            ),
            Err(e) => warn!(task_id = %t.task_id, "cannot hand the service over: {e}"),
        }
    }
    info!(task_id = run.task_id, child_session = %child, handed_over = handed.len(), "subagent finished");
    if let Some(dir) = run.public {
        record_handover(exec, run.task_id, dir, run.session_id, &child, &handed);
    }
    if let Err(e) = exec.registry().close_session(&child) {
        warn!(
            task_id = run.task_id,
            "cannot close the subagent's session: {e}"
        );
    }
    exec.forget_session(&child);
}

/// Waits until no task below `child` is live but services (every task, with `all`), by the
/// executor's settle signals. A task recorded but not live in the executor yet (between its
/// row and its live entry) is waited for by the registry's next change: its start, its
/// settlement, or anything else that makes looking again worth it.
async fn wait_below(exec: &Executor, child: &str, all: bool) {
    let mut changes = exec.registry().subscribe_seq();
    loop {
        changes.borrow_and_update();
        let waiting: Vec<TaskRow> = live_below(exec, child)
            .into_iter()
            .filter(|t| all || !t.service)
            .collect();
        let Some(next) = waiting.first() else { return };
        match exec.settled_signal(&next.task_id) {
            Some(mut settled) => {
                let _ = settled.wait_for(|d| *d).await;
            }
            None => {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        }
    }
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
    if let Err(e) = crate::run::dir::create_file(dir, crate::run::dir::HANDOVER, Some(owner))
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
        Path::new(crate::run::dir::OUTPUT),
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
