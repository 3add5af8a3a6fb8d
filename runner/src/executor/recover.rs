//! Start-up recovery: no `running` row survives a restart unexamined (ARCHITECTURE.md).
//!
//! For every task a previous daemon left live: a `result.json` settles it; a supervisor that
//! is still the same process (pidfd opened first, then its start time compared, so a reused pid
//! is never mistaken for it) is watched again (and reaped, if it is still this process's child
//! after an in-place upgrade); a task that never started is started now; and
//! anything else is settled `failed/lost`.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

use super::{lost_settlement, settlement_from_result, ExecError, Executor, Live};
use crate::protocol::{FailReason, TaskState};
use crate::run::dir::PrivateDir;
use crate::run::plan::LaunchPlan;
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
    // A reboot or a container restart since the previous daemon started ends every run: a
    // run lost that way says so.
    let state_dir = &ex.cfg.state_dir;
    let here = super::instance::Instance::current();
    let moved = here
        .as_ref()
        .zip(super::instance::Instance::recorded(state_dir))
        .and_then(|(now, before)| now.ended_runs_of(&before));
    if let Some(e) = here
        .as_ref()
        .map(|h| h.record(state_dir))
        .and_then(Result::err)
    {
        warn!("cannot record where this daemon's runs live: {e}");
    }
    // Queued tasks start after every re-attached run holds its slot again.
    let mut to_start = Vec::new();
    for row in rows {
        match recover_one(ex, &row, moved) {
            Outcome::Reattached => out.reattached += 1,
            Outcome::Settled { from_result: true } => out.settled_from_result += 1,
            Outcome::Settled { from_result: false } => out.lost += 1,
            Outcome::Restart(live) => {
                to_start.push(live);
                out.restarted += 1;
            }
        }
    }
    for live in to_start {
        info!(task_id = %live.task_id, "starting a task queued before the restart");
        // A stdin pipe cannot outlive the daemon that held its write end.
        ex.enqueue(live, None);
    }
    Ok(out)
}

/// What became of one task a previous daemon left live.
enum Outcome {
    Reattached,
    Settled {
        from_result: bool,
    },
    /// Never started: to start once every re-attached run holds its slot.
    Restart(Arc<Live>),
}

/// `moved`: why no run of the previous daemon can be alive any more, if none can.
fn recover_one(
    ex: &Arc<Executor>,
    row: &crate::registry::TaskRow,
    moved: Option<&'static str>,
) -> Outcome {
    let private = ex.runs.existing_private(&row.task_id);
    let public = Path::new(&row.public_dir)
        .parent()
        .and_then(Path::parent)
        .and_then(|session_dir| {
            crate::run::dir::open_public(session_dir, row.owner_uid, &row.task_id).ok()
        });
    // A run started again here makes its own network namespace.
    let live = Live::new(row, private, public, None);
    ex.live_map().insert(row.task_id.clone(), live.clone());
    let recorded = row
        .supervisor_pid
        .zip(row.supervisor_start_time)
        .or_else(|| read_pid_file(&live.private));
    match recorded {
        Some((pid, start)) => match attach(pid, start) {
            Some(pidfd) => {
                reattach(ex, row, live, pid, start, pidfd);
                Outcome::Reattached
            }
            None => settle_from_result_or_lost(
                ex,
                &live,
                match moved {
                    Some(why) => format!("its supervisor (pid {pid}) is gone: {why}"),
                    None => format!("supervisor (pid {pid}) ended without writing result.json while sidejob was down"),
                },
            ),
        },
        None if row.state == TaskState::Queued => {
            // A registry restored from a backup can be older than its runs: a result means
            // the run happened, and it is never run twice.
            if let Ok(Some(result)) = live.read_result() {
                ex.settle_and_finish(&live, live.lock(), settlement_from_result(&result));
                return Outcome::Settled { from_result: true };
            }
            // Never started: the plan is in the private directory, where only the daemon
            // writes.
            let plan = std::fs::read(live.private.plan())
                .ok()
                .and_then(|b| serde_json::from_slice::<LaunchPlan>(&b).ok());
            let why = match (plan, moved) {
                (Some(_), _) if live.public.is_some() => {
                    ex.reopen_egress(row);
                    return Outcome::Restart(live);
                }
                (Some(_), _) => "the run directory is gone or is not the session owner's".into(),
                // A root daemon keeps it in /dev/shm, which a reboot empties.
                (None, Some(moved)) => format!("its launch plan is gone: {moved}"),
                (None, None) => "the launch plan is missing".into(),
            };
            ex.settle_and_finish(&live, live.lock(), lost_settlement(FailReason::Lost, why));
            Outcome::Settled { from_result: false }
        }
        None => {
            warn!(task_id = %row.task_id, "running task has no supervisor on record");
            settle_from_result_or_lost(ex, &live, "no supervisor was recorded for this run".into())
        }
    }
}

/// Watches a supervisor that outlived the previous daemon, as if this one had started it.
fn reattach(
    ex: &Arc<Executor>,
    row: &crate::registry::TaskRow,
    live: Arc<Live>,
    pid: i32,
    start: u64,
    pidfd: Arc<AsyncFd<std::os::fd::OwnedFd>>,
) {
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
    ex.reopen_egress(row);
    let ex2 = ex.clone();
    // A re-attached run counts against the concurrency bounds like any other.
    let permits = ex.try_slots(&row.session_id, row.owner_uid);
    tokio::spawn(async move {
        // After an in-place upgrade (`server/upgrade/`) the supervisor is still this
        // process's child, and it is reaped as one; after a crash it is someone else's.
        let watched = super::Watched {
            pidfd,
            child: sys::is_child(pid).then_some(pid),
            report: None,
        };
        ex2.watch(live, watched).await;
        drop(permits);
    });
}

/// Settles a task whose supervisor is known to be gone: from the run's `result.json` (its
/// owner's to write, so it never stands in for a live supervisor), or `failed/lost` for `why`.
fn settle_from_result_or_lost(ex: &Executor, live: &Arc<Live>, why: String) -> Outcome {
    let (s, from_result) = match live.read_result() {
        Ok(Some(result)) => (settlement_from_result(&result), true),
        Ok(None) => (lost_settlement(FailReason::Lost, why), false),
        Err(e) => (
            lost_settlement(FailReason::Lost, format!("{why}; result.json: {e}")),
            false,
        ),
    };
    ex.settle_and_finish(live, live.lock(), s);
    Outcome::Settled { from_result }
}

pub(super) fn read_pid_file(private: &PrivateDir) -> Option<(i32, u64)> {
    private.check().ok()?;
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
    // Already exited (a zombie nobody reaped yet): there is nothing to watch. A zombie of
    // this process's own (one that ended during an in-place upgrade) is reaped here: the
    // pidfd pins it, so the pid is still that supervisor's.
    if sys::poll_readable(&[Some(fd.as_fd())], 0).ok()?.first() == Some(&true) {
        if sys::is_child(pid) {
            let _ = sys::waitpid(pid, false);
        }
        return None;
    }
    sys::async_fd(fd).ok().map(Arc::new)
}
