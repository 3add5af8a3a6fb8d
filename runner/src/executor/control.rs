//! Acting on live tasks: yield, background, wait, cancel, stdin (docs/protocol.md).

use super::*;
use crate::protocol::TaskListResult;

/// What `task.cancel` with `withdraw` did.
pub(crate) struct Withdrawal {
    pub outcome: CancelOutcome,
    /// A cancel stood and is taken back (now or by an earlier withdrawal); false when none
    /// had reached the run yet.
    pub taken_back: bool,
}

impl Executor {
    /// `task.list`: a session's live tasks and its most recent terminal ones (docs/protocol.md),
    /// optionally only those in `states`.
    pub(crate) fn task_list(
        &self,
        session_id: &str,
        states: Option<&[TaskState]>,
    ) -> Result<TaskListResult, ExecError> {
        const HISTORY: usize = 25;
        let tasks = self
            .registry
            .list_tasks(session_id, HISTORY)?
            .into_iter()
            .filter(|t| states.is_none_or(|s| s.contains(&t.state)))
            .map(|t| t.to_wire())
            .collect();
        Ok(TaskListResult { tasks })
    }

    /// Moves a foreground task to the background if a call still holds it. Returns false if
    /// it already settled (its result is then on its way to the call) or was not foreground.
    pub(crate) fn try_yield(&self, task_id: &str) -> bool {
        let Some(live) = self.get_live(task_id) else {
            return false;
        };
        let mut st = live.lock();
        if st.fg.take().is_none() {
            return false;
        }
        if let Err(e) = self.registry.mark_yielded(task_id, &live.session_id) {
            warn!(task_id, "cannot record the yield: {e}");
        }
        true
    }

    /// `task.background`: tells the blocked call to return `running` now.
    pub(crate) fn background(&self, task_id: &str) -> bool {
        let Some(live) = self.get_live(task_id) else {
            return false;
        };
        let mut st = live.lock();
        let Some(fg) = st.fg.take() else { return false };
        if let Err(e) = self.registry.mark_yielded(task_id, &live.session_id) {
            warn!(task_id, "cannot record the move to the background: {e}");
        }
        let _ = fg.send(FgEvent::Backgrounded);
        true
    }

    /// The result of an inline answer could not be written to the caller: hand it back so a
    /// wait or a wake can deliver it.
    pub(crate) fn undeliver(&self, task_id: &str) {
        match self
            .registry
            .claim_delivery(task_id, Delivery::Inline, Delivery::Pending)
        {
            Ok(true) => info!(
                task_id,
                "inline result could not be written; delivery is pending again"
            ),
            Ok(false) => {}
            Err(e) => warn!(task_id, "cannot return the delivery: {e}"),
        }
    }

    /// `task.wait`: the task as it is when it settles or when `timeout` passes. A terminal
    /// result nobody has received yet is delivered to this wait.
    pub(crate) async fn wait(
        &self,
        task_id: &str,
        timeout: Duration,
    ) -> Result<Option<TaskRow>, ExecError> {
        if let Some(live) = self.get_live(task_id) {
            let rx = {
                let mut st = live.lock();
                (!st.settled).then(|| {
                    let (tx, rx) = oneshot::channel();
                    st.waiters.push(tx);
                    rx
                })
            };
            if let Some(mut rx) = rx {
                let _waiting = crate::metrics::waiting();
                if let Ok(Ok(row)) = tokio::time::timeout(timeout, &mut rx).await {
                    return Ok(Some(row));
                }
                // Timed out. Decide under the task's lock whether this wait got the result
                // after all (the settle counted it as a waiter and sent the row) or leaves
                // empty-handed (then it must not be counted: close it first).
                let _st = live.lock();
                if let Ok(row) = rx.try_recv() {
                    return Ok(Some(row));
                }
                rx.close();
            }
        }
        let Some(row) = self.registry.get_task(task_id)? else {
            return Ok(None);
        };
        if row.state.is_terminal()
            && row.delivery == Some(Delivery::Pending)
            && self
                .registry
                .claim_delivery(task_id, Delivery::Pending, Delivery::Wait)?
        {
            return Ok(self.registry.get_task(task_id)?);
        }
        Ok(Some(row))
    }

    /// Asks a run to stop without waiting for it (see [`Executor::stop`]). False if it had
    /// already settled.
    pub(crate) fn request_cancel(&self, task_id: &str, why: Option<String>) -> bool {
        self.stop(task_id, StopReason::Canceled, self.cfg.cancel_grace_ms, why)
    }

    /// Waits up to `timeout` for a task to settle; true if it has.
    pub(crate) async fn settled_within(&self, task_id: &str, timeout: Duration) -> bool {
        let Some(live) = self.get_live(task_id) else {
            return true;
        };
        let mut done = live.done.subscribe();
        let settled = tokio::time::timeout(timeout, done.wait_for(|d| *d))
            .await
            .is_ok();
        settled
    }

    /// Asks a run to stop: SIGTERM to the whole run, SIGKILL after `grace_ms` (the supervisor
    /// escalates, so this holds even if the daemon dies meanwhile). A task still queued is
    /// settled as canceled at once.
    pub(super) fn stop(
        &self,
        task_id: &str,
        reason: StopReason,
        grace_ms: u64,
        message: Option<String>,
    ) -> bool {
        let Some(live) = self.get_live(task_id) else {
            return false;
        };
        let st = live.lock();
        if st.settled {
            return false;
        }
        match st.supervisor.clone() {
            Some(pidfd) => {
                let req = CancelRequest {
                    reason,
                    grace_ms,
                    message,
                    withdrawn: false,
                };
                if let Err(e) = req.write(&live.private) {
                    warn!(
                        task_id,
                        "cannot write {}: {e}",
                        live.private.cancel().display()
                    );
                }
                if let Err(e) = sys::pidfd_send_signal(pidfd.get_ref(), libc::SIGTERM) {
                    // ESRCH: the supervisor is already gone; its watcher settles the task.
                    info!(task_id, "signal to supervisor: {e}");
                }
            }
            None => {
                let mut s = lost_settlement(FailReason::Lost, String::new());
                s.state = TaskState::Canceled;
                s.reason = None;
                s.error = message;
                self.settle_and_finish(&live, st, s);
            }
        }
        true
    }

    /// `task.cancel`. With [`WakeMode::Silent`] the caller reads the outcome itself: the
    /// stop it asked for makes no wake (a `task.wait` takes the result).
    pub(crate) async fn cancel(
        &self,
        task_id: &str,
        grace_ms: Option<u64>,
        wake: WakeMode,
    ) -> Result<CancelOutcome, ExecError> {
        let grace = grace_ms.unwrap_or(self.cfg.cancel_grace_ms);
        // Cancelling a subagent cancels everything below it (see `RunHooks::canceling`).
        self.hooks().canceling(self, task_id);
        let mut done = match self.get_live(task_id) {
            Some(live) => {
                if wake == WakeMode::Silent {
                    live.lock().silenced = true;
                }
                live.done.subscribe()
            }
            None => return Ok(CancelOutcome::AlreadyTerminal),
        };
        if !self.stop(task_id, StopReason::Canceled, grace, None) {
            return Ok(CancelOutcome::AlreadyTerminal);
        }
        let limit = Duration::from_millis(grace.saturating_add(2_000));
        let _ = tokio::time::timeout(limit, done.wait_for(|d| *d)).await;
        let row = self.registry.get_task(task_id)?;
        Ok(match row.map(|r| r.state) {
            Some(TaskState::Canceled) => CancelOutcome::Canceled,
            Some(s) if s.is_terminal() => CancelOutcome::AlreadyTerminal,
            _ => CancelOutcome::CancellationPending,
        })
    }

    /// `task.cancel` with `withdraw`: takes back a cancel whose grace has not run out, so
    /// the supervisor does not kill the run (`sidejob call`'s second Ctrl+C). `Withdrawn`
    /// when no cancel of the caller's stands any more (none was asked for, or it is taken
    /// back); `CancellationPending` for a stop that cannot be taken back (a timeout).
    pub(crate) fn withdraw_cancel(&self, task_id: &str) -> Result<Withdrawal, ExecError> {
        let answer = |outcome, taken_back| {
            Ok(Withdrawal {
                outcome,
                taken_back,
            })
        };
        let Some(live) = self.get_live(task_id) else {
            return answer(CancelOutcome::AlreadyTerminal, false);
        };
        let st = live.lock();
        if st.settled {
            return answer(CancelOutcome::AlreadyTerminal, false);
        }
        let req = match CancelRequest::read(&live.private) {
            None => return answer(CancelOutcome::Withdrawn, false),
            Some(r) if r.withdrawn => return answer(CancelOutcome::Withdrawn, true),
            Some(r) if r.reason != StopReason::Canceled => {
                return answer(CancelOutcome::CancellationPending, false)
            }
            Some(r) => r,
        };
        // Not started yet: a cancel of a queued run settled it at once, so it is started.
        let Some(pidfd) = st.supervisor.clone() else {
            return answer(CancelOutcome::CancellationPending, false);
        };
        let back = CancelRequest {
            withdrawn: true,
            ..req
        };
        back.write(&live.private).map_err(|source| ExecError::Io {
            step: "write",
            path: live.private.cancel(),
            source,
        })?;
        if let Err(e) = sys::pidfd_send_signal(pidfd.get_ref(), libc::SIGTERM) {
            info!(task_id, "signal to supervisor: {e}");
        }
        info!(task_id, "cancel withdrawn");
        answer(CancelOutcome::Withdrawn, true)
    }

    /// Cancels every live task of a session (session close). Returns their ids.
    pub(crate) fn cancel_session(&self, session_id: &str) -> Result<Vec<String>, ExecError> {
        let ids: Vec<String> = self
            .registry
            .live_tasks_of_session(session_id)?
            .into_iter()
            .map(|r| r.task_id)
            .collect();
        for id in &ids {
            self.stop(
                id,
                StopReason::Canceled,
                self.cfg.cancel_grace_ms,
                Some("the session was closed".into()),
            );
        }
        Ok(ids)
    }

    /// `task.message`: queue bytes for the task's stdin (never blocks).
    pub(crate) fn message(&self, task_id: &str, data: &[u8], eof: bool) -> Result<u64, ExecError> {
        let live = self
            .get_live(task_id)
            .ok_or_else(|| ExecError::InvalidState(format!("task {task_id} has settled")))?;
        let st = live.lock();
        let Some(tx) = st.stdin.as_ref() else {
            return Err(ExecError::InvalidState(format!(
                "task {task_id} has no open stdin (start it with stdin: \"pipe\"; after eof, stdin is closed)"
            )));
        };
        let queued = live.stdin_queued.load(Ordering::Relaxed);
        if queued + data.len() as u64 > MAX_QUEUED_STDIN {
            return Err(ExecError::LimitExceeded(format!(
                "{queued} bytes are already waiting for task {task_id}'s stdin"
            )));
        }
        live.stdin_queued
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        tx.send(StdinChunk {
            data: data.to_vec(),
            eof,
        })
        .map_err(|_| ExecError::InvalidState(format!("task {task_id}'s stdin is closed")))?;
        drop(st);
        if eof {
            live.lock().stdin = None;
        }
        Ok(data.len() as u64)
    }
}

/// A writer task for a run's stdin pipe; chunks queue in memory so callers never block.
pub(super) fn stdin_writer(
    w: OwnedFd,
    queued: Arc<AtomicU64>,
) -> std::io::Result<mpsc::UnboundedSender<StdinChunk>> {
    sys::set_nonblocking(&w, true)?;
    let mut pipe = tokio::net::unix::pipe::Sender::from_owned_fd(w)?;
    let (tx, mut rx) = mpsc::unbounded_channel::<StdinChunk>();
    tokio::spawn(async move {
        while let Some(chunk) = rx.recv().await {
            let ok = pipe.write_all(&chunk.data).await.is_ok();
            queued.fetch_sub(chunk.data.len() as u64, Ordering::Relaxed);
            if !ok || chunk.eof {
                break;
            }
        }
        // Dropping the pipe closes the command's stdin.
    });
    Ok(tx)
}
