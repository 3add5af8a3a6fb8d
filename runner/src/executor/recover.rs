//! Start-up recovery: no `running` row survives a restart unexamined (ARCHITECTURE.md).
//!
//! For every task a previous daemon left live: a `result.json` settles it; a supervisor that
//! is still the same process (pidfd opened first, then its start time compared, so a reused pid
//! is never mistaken for it) is watched again; a task that never started is started now; and
//! anything else is settled `failed/lost`.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

use super::{lost_settlement, settlement_from_result, ExecError, Executor, Live};
use crate::protocol::{FailReason, TaskState};
use crate::run_dir::{self, PrivateDir};
use crate::sandbox::LaunchPlan;
use crate::sys;

/// What recovery did, for the log and for tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Recovered {
    pub settled_from_result: usize,
    pub reattached: usize,
    pub restarted: usize,
    pub lost: usize,
}

pub(super) fn recover(ex: &Arc<Executor>) -> Result<Recovered, ExecError> {
    let mut out = Recovered::default();
    let rows = ex.registry.tasks_in_states(&[
        TaskState::Queued,
        TaskState::Running,
        TaskState::AwaitingInput,
    ])?;
    // Queued tasks start after every re-attached run holds its slot again.
    let mut to_start = Vec::new();
    for row in rows {
        let private = PrivateDir::new(&ex.cfg.runs_dir(), &row.task_id);
        let public = Path::new(&row.run_dir)
            .parent()
            .and_then(Path::parent)
            .and_then(|session_dir| {
                run_dir::open_public(session_dir, row.owner_uid, &row.task_id).ok()
            });
        let live = Live::new(&row, private, public);
        ex.live_map().insert(row.task_id.clone(), live.clone());
        let settle = |s| ex.settle_and_finish(&live, live.lock(), s);
        // The run directory's result.json is its owner's to write: it settles a task only once
        // the task's supervisor is known to be gone, never in place of a live one.
        let from_result_or_lost = |why: String| match live.read_result() {
            Ok(Some(result)) => (settlement_from_result(&result), true),
            Ok(None) => (lost_settlement(FailReason::Lost, why), false),
            Err(e) => (
                lost_settlement(FailReason::Lost, format!("{why}; result.json: {e}")),
                false,
            ),
        };
        let recorded = row
            .supervisor_pid
            .zip(row.supervisor_start_time)
            .or_else(|| read_pid_file(&live.private));
        if let Some((pid, start)) = recorded {
            match attach(pid, start) {
                Some(pidfd) => {
                    live.lock().supervisor = Some(pidfd.clone());
                    if row.state == TaskState::Queued {
                        let _ = ex.registry.mark_started(
                            &row.task_id,
                            &row.session_id,
                            pid,
                            start,
                            &crate::ids::now_rfc3339(),
                        );
                    }
                    info!(task_id = %row.task_id, pid, "re-attached to a running supervisor");
                    ex.reopen_egress(&row);
                    let ex2 = ex.clone();
                    // A re-attached run counts against the concurrency bounds like any other.
                    let permits = ex.try_slots(&row.session_id, row.owner_uid);
                    tokio::spawn(async move {
                        let watched = super::Watched {
                            pidfd,
                            child: None,
                            report: None,
                        };
                        ex2.watch(live, watched).await;
                        drop(permits);
                    });
                    out.reattached += 1;
                }
                None => {
                    let (s, from_result) = from_result_or_lost(format!(
                        "supervisor (pid {pid}) ended without writing result.json while sidejob was down"
                    ));
                    settle(s);
                    if from_result {
                        out.settled_from_result += 1;
                    } else {
                        out.lost += 1;
                    }
                }
            }
            continue;
        }
        if row.state == TaskState::Queued {
            // Never started: the plan is in the private directory, where only the daemon
            // writes.
            match std::fs::read(live.private.plan())
                .ok()
                .and_then(|b| serde_json::from_slice::<LaunchPlan>(&b).ok())
            {
                Some(_) if live.public.is_some() => {
                    ex.reopen_egress(&row);
                    to_start.push(live);
                    out.restarted += 1;
                }
                Some(_) => {
                    settle(lost_settlement(
                        FailReason::Lost,
                        "the run directory is gone or is not the session owner's".into(),
                    ));
                    out.lost += 1;
                }
                None => {
                    settle(lost_settlement(
                        FailReason::Lost,
                        "the launch plan is missing".into(),
                    ));
                    out.lost += 1;
                }
            }
            continue;
        }
        warn!(task_id = %row.task_id, "running task has no supervisor on record");
        let (s, from_result) =
            from_result_or_lost("no supervisor was recorded for this run".into());
        settle(s);
        if from_result {
            out.settled_from_result += 1;
        } else {
            out.lost += 1;
        }
    }
    for live in to_start {
        info!(task_id = %live.task_id, "starting a task queued before the restart");
        // A stdin pipe cannot outlive the daemon that held its write end.
        ex.enqueue(live, None);
    }
    Ok(out)
}

fn read_pid_file(private: &PrivateDir) -> Option<(i32, u64)> {
    let text = std::fs::read_to_string(private.pid_file()).ok()?;
    let mut it = text.split_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// A pidfd for `pid` if it is still the process that started at `start`.
fn attach(pid: i32, start: u64) -> Option<Arc<AsyncFd<std::os::fd::OwnedFd>>> {
    let fd = sys::pidfd_open(pid).ok()?;
    // The pidfd pins the process: if the start time matches now, the pidfd is the supervisor.
    if sys::process_start_time(pid).ok()? != start {
        return None;
    }
    // Already exited (a zombie nobody reaped yet): there is nothing to watch.
    if sys::poll_readable(&[Some(fd.as_fd())], 0).ok()?.first() == Some(&true) {
        return None;
    }
    sys::async_fd(fd).ok().map(Arc::new)
}
