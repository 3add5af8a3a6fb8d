//! Start-up recovery: no `running` row survives a restart unexamined (ARCHITECTURE.md).
//!
//! For every task a previous daemon left live: a `result.json` settles it; a supervisor that
//! is still the same process (pidfd opened first, then its start time compared, so a reused pid
//! is never mistaken for it) is watched again; a task that never started is started now; and
//! anything else is settled `failed/lost`.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

use super::{lost_settlement, settlement_from_result, ExecError, Executor, Live};
use crate::protocol::{FailReason, TaskState};
use crate::sandbox::LaunchPlan;
use crate::supervisor::RunResult;
use crate::sys;

/// What recovery did, for the log and for tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    pub settled_from_result: usize,
    pub reattached: usize,
    pub restarted: usize,
    pub lost: usize,
}

pub fn recover(ex: &Arc<Executor>) -> Result<Recovered, ExecError> {
    let mut out = Recovered::default();
    let rows = ex.registry.tasks_in_states(&[
        TaskState::Queued,
        TaskState::Running,
        TaskState::AwaitingInput,
    ])?;
    // Queued tasks start after every re-attached run holds its slot again.
    let mut to_start = Vec::new();
    for row in rows {
        let live = Live::new(&row);
        ex.live_map().insert(row.task_id.clone(), live.clone());
        let run_dir = Path::new(&row.run_dir).to_path_buf();
        let settle = |s| {
            let settled = {
                let mut st = live.lock();
                ex.settle_locked(&live, &mut st, s)
            };
            ex.finish(&live, settled);
        };
        if let Ok(Some(result)) = RunResult::read(&run_dir.join("result.json")) {
            settle(settlement_from_result(&result));
            out.settled_from_result += 1;
            continue;
        }
        let recorded = row
            .supervisor_pid
            .zip(row.supervisor_start_time)
            .or_else(|| read_pid_file(&run_dir));
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
                    let ex2 = ex.clone();
                    // A re-attached run counts against the concurrency bounds like any other.
                    let permits = ex.try_slots(&row.session_id);
                    tokio::spawn(async move {
                        ex2.watch(live, pidfd, None).await;
                        drop(permits);
                    });
                    out.reattached += 1;
                }
                None => {
                    // It may have finished between the two looks.
                    match RunResult::read(&run_dir.join("result.json")) {
                        Ok(Some(result)) => {
                            settle(settlement_from_result(&result));
                            out.settled_from_result += 1;
                        }
                        _ => {
                            settle(lost_settlement(FailReason::Lost, format!("supervisor (pid {pid}) ended without writing result.json while sidejob was down")));
                            out.lost += 1;
                        }
                    }
                }
            }
            continue;
        }
        if row.state == TaskState::Queued {
            match std::fs::read(run_dir.join("plan.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<LaunchPlan>(&b).ok())
            {
                Some(plan) => {
                    to_start.push((live, plan));
                    out.restarted += 1;
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
        settle(lost_settlement(
            FailReason::Lost,
            "no supervisor was recorded for this run".into(),
        ));
        out.lost += 1;
    }
    for (live, plan) in to_start {
        info!(task_id = %live.task_id, "starting a task queued before the restart");
        // A stdin pipe cannot outlive the daemon that held its write end.
        ex.enqueue(live, plan, None);
    }
    Ok(out)
}

fn read_pid_file(run_dir: &Path) -> Option<(i32, u64)> {
    let text = std::fs::read_to_string(run_dir.join("supervisor.pid")).ok()?;
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
    if sys::poll_readable(&[fd.as_raw_fd()], 0).ok()?.first() == Some(&true) {
        return None;
    }
    sys::async_fd(fd).ok().map(Arc::new)
}
