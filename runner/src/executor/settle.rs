//! A run from its start to its settlement: the supervisor started and watched, its report
//! read, the result recorded and delivered once (inline, to a wait, or left for a wake), and
//! what the run held given back.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

use crate::ids;
use crate::protocol::{Delivery, FailReason, TaskState, WakeMode};
use crate::registry::{NotificationRow, RegistryError, Settlement};
use crate::run::cancel::{CancelRequest, StopReason};
use crate::run::result::RunResult;
use crate::sys;

use super::{egress, tail, Executor, FgEvent, Live, LiveState, RunEnd, Settled};

impl Executor {
    /// Starts the supervisor (unless the task was canceled meanwhile) and records it; a
    /// supervisor that cannot start settles the task as `spawn_error`.
    pub(super) fn start(&self, live: &Arc<Live>, stdin_pipe: Option<OwnedFd>) -> Option<Watched> {
        let mut st = live.lock();
        if st.settled {
            return None; // canceled while queued
        }
        let watched = match self.start_supervisor(live, stdin_pipe, &mut st) {
            Ok(started) => started,
            Err(e) => {
                let s = lost_settlement(
                    FailReason::SpawnError,
                    format!("cannot start the supervisor: {e}"),
                );
                self.settle_and_finish(live, st, s);
                return None;
            }
        };
        let pid = watched.child.unwrap_or(0);
        let start_time = sys::process_start_time(pid).unwrap_or(0);
        if let Err(e) = self.registry.mark_started(
            &live.task_id,
            &live.session_id,
            pid,
            start_time,
            &ids::now_rfc3339(),
        ) {
            warn!(task_id = %live.task_id, "cannot record the run's start: {e}");
        }
        Some(watched)
    }

    pub(super) fn start_supervisor(
        &self,
        live: &Live,
        stdin_pipe: Option<OwnedFd>,
        st: &mut LiveState,
    ) -> std::io::Result<Watched> {
        let public = live.public.as_ref().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the run directory could not be opened",
            )
        })?;
        let stdin_read = match stdin_pipe {
            Some(r) => Some(r),
            // A plugin's plan may give the command fixed stdin (plan_files.rs).
            None => std::fs::File::open(live.private.stdin())
                .ok()
                .map(OwnedFd::from),
        };
        let (report_r, report_w) = sys::pipe()?;
        let pid = self.spawner.spawn_supervisor(
            &live.private,
            live.netns_key.as_deref(),
            public.as_fd(),
            stdin_read,
            report_w,
        )?;
        // The child is ours and unreaped, so its pid cannot have been reused yet.
        let pidfd = Arc::new(sys::async_fd(sys::pidfd_open(pid)?)?);
        sys::set_nonblocking(&report_r, true)?;
        let report = sys::async_fd(report_r)?;
        st.supervisor = Some(pidfd.clone());
        Ok(Watched {
            pidfd,
            child: Some(pid),
            report: Some(report),
        })
    }

    /// Settles the run as soon as its supervisor reports (or, with no report, once it is
    /// gone), then reaps the supervisor if it is this daemon's child.
    pub(super) async fn watch(&self, live: Arc<Live>, w: Watched) {
        // The supervisor's own word, sent once output.log and result.json are complete; it
        // names this task or it is no report.
        let reported = match &w.report {
            Some(pipe) => read_report(pipe, &w.pidfd)
                .await
                .filter(|r| r.task_id == live.task_id && r.session_id == live.session_id),
            None => None,
        };
        if let Some(result) = reported {
            self.settle_run(&live, settlement_from_result(&result))
                .await;
            // Making its files durable and exiting is the supervisor's last step; the slot
            // it holds is given back once it is gone.
            if let Err(e) = w.pidfd.readable().await {
                warn!(task_id = %live.task_id, "cannot watch the supervisor: {e}");
            }
            if let Some(pid) = w.child {
                let _ = sys::waitpid(pid, false);
            }
            return;
        }
        if let Err(e) = w.pidfd.readable().await {
            warn!(task_id = %live.task_id, "cannot watch the supervisor: {e}");
        }
        let status = w
            .child
            .and_then(|pid| sys::waitpid(pid, false).ok().flatten());
        let settlement = match live.read_result() {
            Ok(Some(result)) => settlement_from_result(&result),
            Ok(None) | Err(_) if CancelRequest::requested(&live.private) => {
                // Stopped before it had set up its signal handling, so before the command
                // started: settle as the stop asked.
                let req = CancelRequest::read(&live.private);
                let mut s = lost_settlement(FailReason::Timeout, String::new());
                match req.as_ref().map(|r| r.reason) {
                    Some(StopReason::Timeout) => s.error = req.and_then(|r| r.message),
                    Some(StopReason::Canceled) | None => {
                        s.state = TaskState::Canceled;
                        s.reason = None;
                        s.error = req.and_then(|r| r.message);
                    }
                }
                s
            }
            Ok(None) | Err(_) => {
                let log = std::fs::read_to_string(live.private.log()).unwrap_or_default();
                let log = log.trim();
                match status {
                    Some((_, sys::Exit::Code(2))) => lost_settlement(
                        FailReason::SpawnError,
                        format!("the supervisor could not start the run: {log}"),
                    ),
                    _ => lost_settlement(
                        FailReason::Lost,
                        format!(
                            "the supervisor ended without writing result.json ({}){}",
                            match status {
                                Some((_, sys::Exit::Code(c))) => format!("exit code {c}"),
                                Some((_, sys::Exit::Signal(s))) => format!("signal {s}"),
                                None => "not our child".into(),
                            },
                            if log.is_empty() {
                                String::new()
                            } else {
                                format!(": {log}")
                            }
                        ),
                    ),
                }
            }
        };
        self.settle_run(&live, settlement).await;
    }

    /// Settles a run whose outcome is known.
    pub(super) async fn settle_run(&self, live: &Arc<Live>, settlement: Settlement) {
        // A subagent waits for its child session's tasks first (see `RunHooks::ending`).
        let end = RunEnd {
            task_id: &live.task_id,
            session_id: &live.session_id,
            public: live.public.as_ref().map(|f| f.as_fd()),
            canceled: CancelRequest::requested(&live.private),
        };
        self.hooks().ending(self, end).await;
        let settled = self.settle_locked(live, &mut live.lock(), settlement);
        if let Settled::Now = settled {
            // Whoever waited for the result (a foreground call, a `task.wait`) was woken on
            // this thread and runs as soon as this task yields: it answers first, then the
            // subscribers hear of it from this thread, and the run's files are cleaned up
            // after.
            tokio::task::yield_now().await;
            if let Some(hub) = self.hub.get() {
                hub.publish_now();
            }
            self.finish(live);
        }
    }

    /// Records the terminal state and decides delivery. Must be called with the task's lock
    /// held; after [`Settled::Now`] the caller releases the lock and calls
    /// [`Executor::finish`]. When the registry cannot record it (a full disk, say),
    /// nothing is decided or delivered: the task stays as it is, with nothing contradicting
    /// it, and the settlement is tried again until it is recorded ([`Settled::Later`]).
    pub(super) fn settle_locked(
        &self,
        live: &Arc<Live>,
        st: &mut LiveState,
        s: Settlement,
    ) -> Settled {
        match self.attempt_settle(live, st, &s) {
            Ok(()) => Settled::Now,
            Err(e) => {
                warn!(
                    task_id = %live.task_id,
                    registry = %self.registry.path().display(),
                    "cannot record the settlement ({e}); trying again until it is recorded"
                );
                self.retry_settle(live.clone(), s);
                Settled::Later
            }
        }
    }

    /// One try at [`Executor::settle_locked`] (nothing to do if it had settled already).
    pub(super) fn attempt_settle(
        &self,
        live: &Live,
        st: &mut LiveState,
        s: &Settlement,
    ) -> Result<(), RegistryError> {
        if st.settled {
            return Ok(());
        }
        st.waiters.retain(|w| !w.is_closed());
        let mut s = s.clone();
        s.delivery = if st.fg.as_ref().is_some_and(|f| !f.is_closed()) {
            Delivery::Inline
        } else if !st.waiters.is_empty() {
            Delivery::Wait
        } else if live.wake == WakeMode::OnTerminal && !st.silenced {
            Delivery::Wake
        } else {
            Delivery::Pending
        };
        let wake = match s.delivery {
            Delivery::Wake => self.wake_notification(live, &s),
            Delivery::Inline | Delivery::Wait | Delivery::Pending => None,
        };
        let row = self
            .registry
            .settle(&live.task_id, &live.session_id, &s, wake.as_ref())?;
        // Recorded: from here on the decision stands.
        st.settled = true;
        crate::metrics::settled(s.state);
        let fg = st.fg.take().filter(|f| !f.is_closed());
        let Some(row) = row else {
            return Ok(());
        };
        info!(task_id = %live.task_id, state = row.state.as_str(), delivery = s.delivery.as_str(), "task settled");
        if let (Some(n), Some(kept)) = (row.output_bytes, self.kept_map().get_mut(&row.owner_uid)) {
            if row
                .public_dir
                .starts_with(&self.cfg.sessions_dir().display().to_string())
            {
                *kept += n;
            }
        }
        if let Some(fg) = fg {
            let _ = fg.send(FgEvent::Settled(Box::new(row.clone())));
        }
        for w in st.waiters.drain(..) {
            let _ = w.send(row.clone());
        }
        st.stdin = None;
        st.supervisor = None;
        Ok(())
    }

    /// Tries a settlement the registry could not record again, backing off to every 10 s,
    /// until it is recorded; then finishes the task.
    pub(super) fn retry_settle(&self, live: Arc<Live>, s: Settlement) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(200);
            loop {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
                let attempt = {
                    let mut st = live.lock();
                    me.attempt_settle(&live, &mut st, &s)
                };
                match attempt {
                    Ok(()) => {
                        info!(task_id = %live.task_id, "the settlement is recorded now");
                        me.finish(&live);
                        return;
                    }
                    Err(e) => {
                        warn!(task_id = %live.task_id, "still cannot record the settlement: {e}")
                    }
                }
            }
        });
    }

    /// Settles with the task's lock held and, if that was recorded, finishes it after.
    pub(super) fn settle_and_finish(
        &self,
        live: &Arc<Live>,
        st: MutexGuard<'_, LiveState>,
        s: Settlement,
    ) {
        let mut st = st;
        let settled = self.settle_locked(live, &mut st, s);
        drop(st);
        if let Settled::Now = settled {
            self.finish(live);
        }
    }

    /// The wake of a background completion: an `[automatic]` prompt, or a one-line notice
    /// for sessions with `proactive_wake = false`.
    pub(super) fn wake_notification(&self, live: &Live, s: &Settlement) -> Option<NotificationRow> {
        let task = self.registry.get_task(&live.task_id).ok().flatten()?;
        let session = self.registry.get_session(&live.session_id).ok().flatten()?;
        let output = tail(&task, 4096);
        let (severity, kind, text) =
            crate::wake::text::completion(&task, s, session.proactive_wake, &output);
        Some(NotificationRow {
            id: ids::ulid(),
            session_id: task.session_id.clone(),
            owner_uid: session.owner_uid,
            task_id: Some(task.task_id.clone()),
            severity,
            kind,
            text,
            created_at: ids::now_rfc3339(),
            acked: false,
            acked_at: None,
            occurrence_key: None,
        })
    }

    /// After settling: wake cancel-waiters, forget the live entry and remove the run's
    /// private directory (the task's result is in the registry and its public half).
    pub(super) fn finish(&self, live: &Live) {
        let _ = live.done.send(true);
        // Nothing runs any more after a crowd of runs (the map grew for it): the daemon gives
        // back to the system what their bookkeeping used. SQLite's caches go first, or the
        // pages they hold keep the heap from shrinking; then the allocator's free memory,
        // which it keeps for reuse otherwise. After a run or a few, nothing is given back:
        // the next call would only take it again.
        let crowd_gone = {
            let mut map = self.live_map();
            map.remove(&live.task_id);
            let gone = map.is_empty() && map.capacity() >= CROWD;
            if gone {
                map.shrink_to_fit();
            }
            gone
        };
        live.private.remove();
        // Its proxy's socket, too (also when it was settled at start-up, with nobody serving).
        egress::forget(&live.task_id);
        if crowd_gone {
            self.registry.release_memory();
            sys::trim_heap();
        }
    }
}

/// How many runs at once make a crowd whose memory is given back once they are all over.
const CROWD: usize = 64;

/// A started supervisor, as its watcher sees it.
pub(super) struct Watched {
    pub(super) pidfd: Arc<AsyncFd<OwnedFd>>,
    /// Its pid when this daemon started it (and so must reap it).
    pub(super) child: Option<i32>,
    /// The read end of its report pipe (`run::fds::SUPERVISOR_REPORT_FD`), when this daemon
    /// started it.
    pub(super) report: Option<AsyncFd<OwnedFd>>,
}

/// Reads the supervisor's report (`RunResult::send`); `None` when it exits without a whole
/// one (it failed before it had a result, or the report did not fit).
async fn read_report(pipe: &AsyncFd<OwnedFd>, pidfd: &AsyncFd<OwnedFd>) -> Option<RunResult> {
    /// A real report is about 1 KiB; the supervisor never sends more than the pipe holds.
    const MAX_REPORT: usize = 1 << 20;
    let mut received = Vec::new();
    let mut buf = [0u8; 8192];
    let mut read_some = |received: &mut Vec<u8>| -> std::io::Result<usize> {
        let n = sys::read_fd(pipe.get_ref(), &mut buf)?;
        received.extend_from_slice(&buf[..n]);
        Ok(n)
    };
    loop {
        tokio::select! {
            ready = pipe.readable() => {
                let mut guard = ready.ok()?;
                match guard.try_io(|_| read_some(&mut received)) {
                    Ok(Ok(0)) | Ok(Err(_)) => return RunResult::from_report(&received),
                    Ok(Ok(_)) => {
                        if let Some(r) = RunResult::from_report(&received) {
                            return Some(r);
                        }
                        if received.len() > MAX_REPORT {
                            return None;
                        }
                    }
                    Err(_would_block) => {}
                }
            }
            _ = pidfd.readable() => {
                // Gone: whatever it wrote is in the pipe already.
                while let Ok(n) = read_some(&mut received) {
                    if n == 0 || received.len() > MAX_REPORT {
                        break;
                    }
                }
                return RunResult::from_report(&received);
            }
        }
    }
}

pub(crate) fn settlement_from_result(r: &RunResult) -> Settlement {
    Settlement::from_result(r)
}

pub(crate) fn lost_settlement(reason: FailReason, error: String) -> Settlement {
    Settlement {
        state: TaskState::Failed,
        reason: Some(reason),
        exit_code: None,
        signal: None,
        ended_at: ids::now_rfc3339(),
        started_at: None,
        duration_ms: None,
        output_bytes: None,
        output_truncated: None,
        leftover_processes: None,
        error: Some(error).filter(|e| !e.is_empty()),
        delivery: Delivery::Pending,
        violations: None,
    }
}
