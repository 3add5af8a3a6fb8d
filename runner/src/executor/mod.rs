//! Calls → runs: submitting, yielding, settling, waiting, cancelling (docs/protocol.md).
//!
//! Exactly-once delivery: each live task has one mutex. The settle path, the yield path and
//! `task.background` all take it, and the settle path decides — once, under it — whether the
//! result goes inline (a foreground call still holds the task), to `task.wait` callers, or
//! stays `pending` for a wake. After that, later claims of a `pending` result go through the
//! registry's conditional update.

mod call;
mod control;
mod egress;
mod hints;
mod hooks;
mod lanes;
mod output;
mod plan_files;
mod recover;
mod spawn;
mod submit;
#[cfg(test)]
mod tests;

use control::stdin_writer;
use hints::{with_hint, Polling};
use lanes::Lane;

pub(crate) use hooks::{HookFuture, RunEnd, RunExtras, RunHooks, RunStart};
pub(crate) use output::{excerpt, tail, task_page};

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{info, warn};

use crate::config::Config;
use crate::ids;
use crate::plugin_host::{PlanContext, ToolHost};
use crate::protocol::{
    CancelOutcome, CompletedCall, Delivery, FailReason, RunningCall, StdinMode, TaskKind,
    TaskState, ToolCallResult, WakeMode,
};
use crate::registry::{NotificationRow, Registry, RegistryError, SessionRow, Settlement, TaskRow};
use crate::run_dir::{self, PrivateDir};
use crate::sandbox::{self, LaunchPlan};
use crate::supervisor::{CancelRequest, RunResult, StopReason};
use crate::sys;
use crate::sys::dirfd::Creds;

/// Bytes a task's stdin queue may hold before `task.message` is refused.
const MAX_QUEUED_STDIN: u64 = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{0}")]
    InvalidParams(String),
    #[error("{0}")]
    InvalidState(String),
    #[error("{0}")]
    LimitExceeded(String),
    /// The profile needs a sandbox layer this host lacks.
    #[error("{0}")]
    SandboxUnavailable(String),
    #[error("{step} {path}: {source}")]
    Io {
        step: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// What [`Executor::settle_locked`] did.
enum Settled {
    /// Recorded (or settled before): finish the task once its lock is released.
    Now,
    /// Not recorded yet: a retry finishes the task once it is.
    Later,
}

/// What the blocked foreground call hears about its task.
pub(crate) enum FgEvent {
    Settled(Box<TaskRow>),
    Backgrounded,
}

/// One `tool.call`, after the server has checked who may make it.
pub(crate) struct CallRequest {
    /// The session owner's credentials: the run's paths (its workspace above all) are
    /// opened with them, and the run runs as this user when the daemon is root.
    pub owner: Creds,
    pub session: SessionRow,
    pub tool: String,
    pub args: serde_json::Value,
    pub yield_after_ms: Option<u64>,
    pub background: bool,
    pub timeout_ms: Option<u64>,
    pub stdin: StdinMode,
    pub service: bool,
    pub profile: Option<String>,
    /// The widest profile this call may have: the effective profile of the run that made it
    /// (through its bridge, or as a subagent's child session). `None`: the session's.
    pub ceiling: Option<String>,
    /// Whether a background completion wakes the host.
    pub wake: WakeMode,
    /// The task that started this one (a schedule's monitor, a bridge caller).
    pub parent_task_id: Option<String>,
    /// For schedule occurrences: makes the occurrence start at most once.
    pub occurrence_key: Option<String>,
}

struct StdinChunk {
    data: Vec<u8>,
    eof: bool,
}

#[derive(Default)]
struct LiveState {
    /// Present while a `tool.call` blocks on this task.
    fg: Option<oneshot::Sender<FgEvent>>,
    waiters: Vec<oneshot::Sender<TaskRow>>,
    settled: bool,
    /// The supervisor's pidfd, once it runs.
    supervisor: Option<Arc<AsyncFd<OwnedFd>>>,
    stdin: Option<mpsc::UnboundedSender<StdinChunk>>,
}

/// A task that has not settled yet.
struct Live {
    task_id: String,
    session_id: String,
    owner_uid: u32,
    /// `<state_dir>/runs/<task_id>`: plan, cancel request, supervisor pid and log.
    private: PrivateDir,
    /// `<session_dir>/.background/<task_id>`, opened when it was made (or, after a restart,
    /// without following symlinks): the supervisor writes output.log and result.json
    /// through it and the daemon reads result.json back through it.
    public: Option<OwnedFd>,
    state: Mutex<LiveState>,
    done: watch::Sender<bool>,
    stdin_queued: Arc<AtomicU64>,
    wake: WakeMode,
}

impl Live {
    fn new(row: &TaskRow, private: PrivateDir, public: Option<OwnedFd>) -> Arc<Live> {
        Arc::new(Live {
            task_id: row.task_id.clone(),
            session_id: row.session_id.clone(),
            owner_uid: row.owner_uid,
            private,
            public,
            state: Mutex::new(LiveState::default()),
            done: watch::channel(false).0,
            stdin_queued: Arc::new(AtomicU64::new(0)),
            wake: row.wake,
        })
    }

    fn lock(&self) -> MutexGuard<'_, LiveState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run's result.json, if it wrote one that describes this task.
    fn read_result(&self) -> std::io::Result<Option<RunResult>> {
        let Some(dir) = &self.public else {
            return Ok(None);
        };
        let result = run_dir::read_result(dir.as_fd(), self.owner_uid)?;
        match result {
            Some(r) if r.task_id != self.task_id || r.session_id != self.session_id => {
                Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "result.json describes task {} of session {}",
                        r.task_id, r.session_id
                    ),
                ))
            }
            other => Ok(other),
        }
    }
}

pub(crate) struct Executor {
    /// This executor, for the tasks it spawns (a settlement being retried).
    me: std::sync::Weak<Executor>,
    cfg: Arc<Config>,
    registry: Arc<Registry>,
    tools: Arc<ToolHost>,
    spawner: spawn::Spawner,
    /// The sandbox profiles, for the daemon's life (`profiles_dir`, else the default).
    catalog: Arc<sandbox::Catalog>,
    live: Mutex<HashMap<String, Arc<Live>>>,
    global: Arc<Semaphore>,
    per_session: Mutex<HashMap<String, Lane>>,
    /// Each user's run slots (`per_user.running`), shared by their sessions' lanes.
    per_user: Mutex<HashMap<u32, Arc<Semaphore>>>,
    /// Each user's output kept in the state directory, once counted (see `check_shares`).
    kept: Mutex<HashMap<u32, u64>>,
    polling: Polling,
    /// What the layer above hears of each run (set once, before any run starts).
    hooks: std::sync::OnceLock<Arc<dyn RunHooks>>,
}

impl Executor {
    pub(crate) fn new(
        cfg: Arc<Config>,
        registry: Arc<Registry>,
        tools: Arc<ToolHost>,
        exe: PathBuf,
    ) -> Arc<Executor> {
        let profiles_dir = cfg
            .profiles_dir
            .clone()
            .or_else(sandbox::Catalog::default_dir);
        Arc::new_cyclic(|me| Executor {
            me: me.clone(),
            global: Arc::new(Semaphore::new(cfg.max_running.max(1))),
            spawner: spawn::Spawner::new(exe, cfg.runs_dir()),
            catalog: Arc::new(sandbox::Catalog::new(profiles_dir)),
            cfg,
            registry,
            tools,
            live: Mutex::new(HashMap::new()),
            per_session: Mutex::new(HashMap::new()),
            per_user: Mutex::new(HashMap::new()),
            kept: Mutex::new(HashMap::new()),
            polling: Polling::default(),
            hooks: std::sync::OnceLock::new(),
        })
    }

    /// Registers the hooks the executor calls as runs start, end and are cancelled. Once,
    /// before the first run (recovery included); a second call is refused.
    pub(crate) fn set_hooks(&self, hooks: Arc<dyn RunHooks>) -> Result<(), ExecError> {
        self.hooks
            .set(hooks)
            .map_err(|_| ExecError::InvalidState("the executor's run hooks are set already".into()))
    }

    /// The sandbox profiles this daemon uses.
    pub(crate) fn catalog(&self) -> &Arc<sandbox::Catalog> {
        &self.catalog
    }

    fn hooks(&self) -> &dyn RunHooks {
        match self.hooks.get() {
            Some(h) => h.as_ref(),
            None => &hooks::NoHooks,
        }
    }

    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub(crate) fn tools(&self) -> &Arc<ToolHost> {
        &self.tools
    }

    pub(crate) fn config(&self) -> &Config {
        &self.cfg
    }

    fn live_map(&self) -> MutexGuard<'_, HashMap<String, Arc<Live>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get_live(&self, task_id: &str) -> Option<Arc<Live>> {
        self.live_map().get(task_id).cloned()
    }

    /// Becomes true once the task settles; `None` if it is not live. Observing it claims
    /// no delivery (unlike `task.wait`).
    pub(crate) fn settled_signal(&self, task_id: &str) -> Option<watch::Receiver<bool>> {
        self.get_live(task_id).map(|l| l.done.subscribe())
    }

    /// Refuses a call its session's owner has no share left for: too many calls waiting, or
    /// too much output kept in the state directory (`[per_user]`).
    fn check_shares(&self, session: &SessionRow) -> Result<(), ExecError> {
        let pu = &self.cfg.per_user;
        let uid = session.owner_uid;
        let u = self.registry.usage_of(uid)?;
        if u.running >= pu.running as u64 && u.queued >= pu.queued as u64 {
            return Err(ExecError::LimitExceeded(format!(
                "uid {uid} has {} runs running and {} waiting: per_user.queued ({}) is reached; wait for some to settle or cancel them",
                u.running, u.queued, pu.queued
            )));
        }
        let sessions_dir = self.cfg.sessions_dir().display().to_string();
        if session.session_dir.starts_with(&sessions_dir) {
            let kept = self.kept_output(uid)?;
            if kept >= pu.output_bytes {
                return Err(ExecError::LimitExceeded(format!(
                    "uid {uid} keeps {kept} bytes of output in the state directory: per_user.output_bytes ({}) is reached; free some with session.close {{\"delete\": true}}",
                    pu.output_bytes
                )));
            }
        }
        Ok(())
    }

    fn kept_map(&self) -> MutexGuard<'_, HashMap<u32, u64>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A user's output kept in the state directory: counted from the registry once, then
    /// kept up to date as their runs settle.
    fn kept_output(&self, uid: u32) -> Result<u64, ExecError> {
        if let Some(n) = self.kept_map().get(&uid) {
            return Ok(*n);
        }
        let n = self
            .registry
            .kept_output(uid, &self.cfg.sessions_dir().display().to_string())?;
        Ok(*self.kept_map().entry(uid).or_insert(n))
    }

    /// A user's output was deleted: count it again from the registry when next needed.
    pub(crate) fn forget_kept_output(&self, uid: u32) {
        self.kept_map().remove(&uid);
    }

    /// Starts the supervisor (unless the task was canceled meanwhile) and records it; a
    /// supervisor that cannot start settles the task as `spawn_error`.
    fn start(&self, live: &Arc<Live>, stdin_pipe: Option<OwnedFd>) -> Option<Watched> {
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

    fn start_supervisor(
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
        let pid =
            self.spawner
                .spawn_supervisor(&live.private, public.as_fd(), stdin_read, report_w)?;
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
    async fn watch(&self, live: Arc<Live>, w: Watched) {
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
    async fn settle_run(&self, live: &Arc<Live>, settlement: Settlement) {
        // A subagent waits for its child session's tasks first (see `RunHooks::ending`).
        let end = RunEnd {
            task_id: &live.task_id,
            session_id: &live.session_id,
            public: live.public.as_ref().map(|f| f.as_fd()),
            canceled: CancelRequest::requested(&live.private),
        };
        self.hooks().ending(self, end).await;
        self.settle_and_finish(live, live.lock(), settlement);
    }

    /// Records the terminal state and decides delivery. Must be called with the task's lock
    /// held; after [`Settled::Now`] the caller releases the lock and calls
    /// [`Executor::finish`]. When the registry cannot record it (a full disk, say),
    /// nothing is decided or delivered: the task stays as it is, with nothing contradicting
    /// it, and the settlement is tried again until it is recorded ([`Settled::Later`]).
    fn settle_locked(&self, live: &Arc<Live>, st: &mut LiveState, s: Settlement) -> Settled {
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
    fn attempt_settle(
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
        } else if live.wake == WakeMode::OnTerminal {
            Delivery::Wake
        } else {
            Delivery::Pending
        };
        let wake = match s.delivery {
            Delivery::Wake => self.wake_notification(live, &s),
            Delivery::Inline | Delivery::Wait | Delivery::Pending => None,
        };
        self.registry
            .settle(&live.task_id, &live.session_id, &s, wake.as_ref())?;
        // Recorded: from here on the decision stands.
        st.settled = true;
        crate::metrics::settled(s.state);
        let fg = st.fg.take().filter(|f| !f.is_closed());
        let Some(row) = self.registry.get_task(&live.task_id)? else {
            return Ok(());
        };
        info!(task_id = %live.task_id, state = row.state.as_str(), delivery = s.delivery.as_str(), "task settled");
        if let (Some(n), Some(kept)) = (row.output_bytes, self.kept_map().get_mut(&row.owner_uid)) {
            if row
                .run_dir
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
    fn retry_settle(&self, live: Arc<Live>, s: Settlement) {
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
    fn settle_and_finish(&self, live: &Arc<Live>, st: MutexGuard<'_, LiveState>, s: Settlement) {
        let mut st = st;
        let settled = self.settle_locked(live, &mut st, s);
        drop(st);
        if let Settled::Now = settled {
            self.finish(live);
        }
    }

    /// The wake of a background completion: an `[automatic]` prompt, or a one-line notice
    /// for sessions with `proactive_wake = false`.
    fn wake_notification(&self, live: &Live, s: &Settlement) -> Option<NotificationRow> {
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
    fn finish(&self, live: &Live) {
        let _ = live.done.send(true);
        let idle = {
            let mut map = self.live_map();
            map.remove(&live.task_id);
            map.is_empty()
        };
        live.private.remove();
        // Its proxy's socket, too (also when it was settled at start-up, with nobody serving).
        egress::forget(&live.task_id);
        // Nothing runs any more: give back to the system what the runs' bookkeeping used
        // (the allocator keeps freed memory otherwise, and the daemon would stay at its peak).
        if idle {
            sys::trim_heap();
        }
    }

    /// Re-attaches to the runs of a previous daemon (see `recover.rs`).
    pub(crate) fn recover(self: &Arc<Self>) -> Result<recover::Recovered, ExecError> {
        recover::recover(self)
    }
}

/// A started supervisor, as its watcher sees it.
struct Watched {
    pidfd: Arc<AsyncFd<OwnedFd>>,
    /// Its pid when this daemon started it (and so must reap it).
    child: Option<i32>,
    /// The read end of its report pipe (`run_dir::SUPERVISOR_REPORT_FD`), when this daemon
    /// started it.
    report: Option<AsyncFd<OwnedFd>>,
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
