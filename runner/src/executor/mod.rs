//! Calls → runs: submitting, yielding, settling, waiting, cancelling (SPEC §4).
//!
//! Exactly-once delivery: each live task has one mutex. The settle path, the yield path and
//! `task.background` all take it, and the settle path decides — once, under it — whether the
//! result goes inline (a foreground call still holds the task), to `task.wait` callers, or
//! stays `pending` for a wake. After that, later claims of a `pending` result go through the
//! registry's conditional update.

mod hints;
mod output;
mod recover;
mod spawn;

use hints::{with_hint, Polling};

pub use output::{excerpt, page, tail};

use std::collections::HashMap;
use std::os::fd::OwnedFd;
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
use crate::sandbox::{self, LaunchPlan};
use crate::supervisor::{CancelRequest, RunResult, StopReason};
use crate::sys;

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

/// What the blocked foreground call hears about its task.
pub enum FgEvent {
    Settled(Box<TaskRow>),
    Backgrounded,
}

/// One `tool.call`, after the server has checked who may make it.
pub struct CallRequest {
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub session: SessionRow,
    pub tool: String,
    pub args: serde_json::Value,
    pub yield_after_ms: Option<u64>,
    pub background: bool,
    pub timeout_ms: Option<u64>,
    pub stdin: StdinMode,
    pub service: bool,
    pub profile: Option<String>,
    /// Whether a background completion wakes the host.
    pub wake: WakeMode,
    /// The task that started this one (a schedule's monitor, a bridge caller).
    pub parent_task_id: Option<String>,
    /// For schedule occurrences: makes the occurrence start at most once.
    pub occurrence_key: Option<String>,
}

/// A session's slots and its queue of calls waiting for one.
#[derive(Clone)]
struct Lane {
    slots: Arc<Semaphore>,
    queue: mpsc::UnboundedSender<Queued>,
    waiting: Arc<AtomicUsize>,
}

/// A call waiting for a slot.
struct Queued {
    live: Arc<Live>,
    plan: LaunchPlan,
    stdin: Option<OwnedFd>,
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
    run_dir: PathBuf,
    state: Mutex<LiveState>,
    done: watch::Sender<bool>,
    stdin_queued: Arc<AtomicU64>,
    wake: WakeMode,
}

impl Live {
    fn new(row: &TaskRow) -> Arc<Live> {
        Arc::new(Live {
            task_id: row.task_id.clone(),
            session_id: row.session_id.clone(),
            run_dir: PathBuf::from(&row.run_dir),
            state: Mutex::new(LiveState::default()),
            done: watch::channel(false).0,
            stdin_queued: Arc::new(AtomicU64::new(0)),
            wake: if row.wake == WakeMode::Silent.as_str() {
                WakeMode::Silent
            } else {
                WakeMode::OnTerminal
            },
        })
    }

    fn lock(&self) -> MutexGuard<'_, LiveState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct Executor {
    cfg: Arc<Config>,
    registry: Arc<Registry>,
    tools: Arc<ToolHost>,
    exe: PathBuf,
    live: Mutex<HashMap<String, Arc<Live>>>,
    global: Arc<Semaphore>,
    per_session: Mutex<HashMap<String, Lane>>,
    polling: Polling,
}

impl Executor {
    pub fn new(
        cfg: Arc<Config>,
        registry: Arc<Registry>,
        tools: Arc<ToolHost>,
        exe: PathBuf,
    ) -> Arc<Executor> {
        Arc::new(Executor {
            global: Arc::new(Semaphore::new(cfg.max_running.max(1))),
            cfg,
            registry,
            tools,
            exe,
            live: Mutex::new(HashMap::new()),
            per_session: Mutex::new(HashMap::new()),
            polling: Polling::default(),
        })
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn tools(&self) -> &Arc<ToolHost> {
        &self.tools
    }

    pub fn config(&self) -> &Config {
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
    pub fn settled_signal(&self, task_id: &str) -> Option<watch::Receiver<bool>> {
        self.get_live(task_id).map(|l| l.done.subscribe())
    }

    /// Runs a `tool.call` to its answer: inline if the run settles before `yield_after_ms`,
    /// else `running`. `closed` resolves if the caller's connection goes away, in which case
    /// the task moves to the background so its result is not lost.
    pub async fn call(
        self: &Arc<Self>,
        req: CallRequest,
        closed: impl std::future::Future<Output = ()>,
    ) -> Result<ToolCallResult, ExecError> {
        let yield_after = req
            .yield_after_ms
            .or(self.cfg.default_yield_after_ms)
            .unwrap_or_else(|| {
                self.tools
                    .get(&req.tool)
                    .map(|t| t.describe().default_yield_after_ms)
                    .unwrap_or(30_000)
            });
        let detach = req.background || yield_after == 0;
        let hint = self
            .polling
            .observe(&req.session.session_id, &req.args, detach);
        let (row, fg) = self.submit(req, !detach)?;
        let Some(mut fg) = fg else {
            return Ok(with_hint(self.running(&row.task_id, &row), hint));
        };

        let yield_at = tokio::time::sleep(Duration::from_millis(yield_after));
        let deadline_ms = self.cfg.interactive_deadline_ms;
        let deadline = tokio::time::sleep(Duration::from_millis(deadline_ms));
        tokio::pin!(yield_at, deadline, closed);
        let mut deadline_hit = false;
        let mut closed_seen = false;
        loop {
            tokio::select! {
                ev = &mut fg => {
                    return Ok(with_hint(match ev {
                        Ok(FgEvent::Settled(row)) => self.completed(&row, deadline_hit),
                        Ok(FgEvent::Backgrounded) | Err(_) => self.running(&row.task_id, &row),
                    }, hint));
                }
                _ = &mut yield_at => {
                    if self.try_yield(&row.task_id) {
                        return Ok(with_hint(self.running(&row.task_id, &row), hint));
                    }
                    // Settled in the same instant: the result is already on its way to `fg`.
                }
                _ = &mut deadline, if !deadline_hit && deadline_ms < yield_after => {
                    deadline_hit = true;
                    let message = format!(
                        "the call was still in the foreground after the interactive deadline of {} s and was stopped",
                        deadline_ms / 1000
                    );
                    self.stop(&row.task_id, StopReason::Timeout, self.cfg.cancel_grace_ms, Some(message));
                }
                _ = &mut closed, if !closed_seen => {
                    closed_seen = true;
                    if self.try_yield(&row.task_id) {
                        return Ok(self.running(&row.task_id, &row));
                    }
                }
            }
        }
    }

    fn running(&self, task_id: &str, row: &TaskRow) -> ToolCallResult {
        ToolCallResult::Running(RunningCall {
            task_id: task_id.to_owned(),
            output: tail(Path::new(&row.output_path()), self.cfg.inline_output_bytes),
            output_path: row.output_path(),
            result_path: row.result_path(),
            hint: Some(format!(
                "still running in the background; its result will be delivered when it settles (task.wait {{\"task_id\": \"{task_id}\"}} to block on it)"
            )),
        })
    }

    fn completed(&self, row: &TaskRow, deadline_hit: bool) -> ToolCallResult {
        let (output, cut) = excerpt(Path::new(&row.output_path()), self.cfg.inline_output_bytes);
        let hint = (deadline_hit && row.reason == Some(FailReason::Timeout)).then(|| {
            "pass yield_after_ms (for example 30000) or background: true so long commands move to the background instead of being stopped; \
             a background run wakes you when it finishes".to_owned()
        });
        let rendered = self.tools.get(&row.tool).and_then(|t| {
            t.render(&sidejob_plugin_api::json::RenderInput {
                tool: row.tool.clone(),
                state: row.state.as_str().into(),
                exit_code: row.exit_code,
                output: output.clone(),
                task: serde_json::to_value(row.to_wire()).unwrap_or_default(),
            })
        });
        ToolCallResult::Completed(CompletedCall {
            rendered,
            task_id: row.task_id.clone(),
            state: row.state,
            reason: row.reason,
            exit_code: row.exit_code,
            signal: row.signal,
            output,
            output_truncated: row.output_truncated.unwrap_or(false) || cut,
            duration_ms: row.duration_ms.unwrap_or(0),
            hint,
            error: row.error.clone(),
            output_path: row.output_path(),
            result_path: row.result_path(),
        })
    }

    /// Records the task, writes its launch plan and starts driving it. With `foreground`, the
    /// returned receiver hears how it ends (or that it was moved to the background).
    pub fn submit(
        self: &Arc<Self>,
        req: CallRequest,
        foreground: bool,
    ) -> Result<(TaskRow, Option<oneshot::Receiver<FgEvent>>), ExecError> {
        let tool = self.tools.get(&req.tool).ok_or_else(|| {
            ExecError::InvalidParams(format!(
                "unknown tool {:?}; tool.list names the tools there are",
                req.tool
            ))
        })?;
        let task_id = ids::ulid();
        let workspace = PathBuf::from(&req.session.workspace);
        let session_dir = PathBuf::from(&req.session.session_dir);
        let run_dir = session_dir.join(".background").join(&task_id);
        let plugin_config = crate::bridge::plugin_config(&self.cfg);
        let ctx = PlanContext {
            workspace: &workspace,
            session_id: &req.session.session_id,
            task_id: &task_id,
            session_dir: &session_dir,
            tmp_dir: &crate::bridge::tmp_dir(&run_dir),
            profile: &req.session.profile,
            depth: crate::bridge::subagent::depth_of(&self.registry, &req.session),
            config: &plugin_config,
        };
        let tool_plan = tool
            .plan(&req.args, &ctx)
            .map_err(|e| ExecError::InvalidParams(e.0))?;
        // The session's profile, or the narrower one the call (or the tool) names, resolved
        // for this run.
        let sb = sandbox::for_call(
            &req.session.profile,
            req.profile.as_deref().or(tool_plan.profile.as_deref()),
            &workspace,
            &session_dir,
        )
        .map_err(|e| match e {
            sandbox::CallSandboxError::Invalid(m) => ExecError::InvalidParams(m),
            sandbox::CallSandboxError::Unavailable(m) => ExecError::SandboxUnavailable(m),
        })?;
        let profile = sb.profile.clone();

        std::fs::create_dir_all(&run_dir).map_err(|source| ExecError::Io {
            step: "create run directory",
            path: run_dir.clone(),
            source,
        })?;
        // Root runs other users' commands as those users, never as root.
        let (uid, gid) = match sb.run_as {
            sandbox::RunAs::Ids { uid, gid } => (Some(uid), Some(gid)),
            sandbox::RunAs::Caller if sys::getuid() == 0 && req.owner_uid != 0 => {
                (Some(req.owner_uid), Some(req.owner_gid))
            }
            sandbox::RunAs::Caller => (None, None),
        };
        let mut env = sb.env;
        env.push(("SIDEJOB_TASK_ID".into(), task_id.clone()));
        env.push(("SIDEJOB_SESSION_ID".into(), req.session.session_id.clone()));
        let cap = sb.timeout_ms.map_or(self.cfg.detached_cap_ms, |t| {
            t.min(self.cfg.detached_cap_ms)
        });
        // The plan's files, child session and bridge (see bridge/).
        let extras = crate::bridge::prepare(
            self,
            &req.session,
            (req.owner_uid, req.owner_gid),
            (uid, gid),
            &task_id,
            &run_dir,
            &tool_plan,
        )?;
        env.extend(tool_plan.env);
        env.extend(extras.env.iter().cloned());
        let plan = LaunchPlan {
            task_id: task_id.clone(),
            session_id: req.session.session_id.clone(),
            tool: req.tool.clone(),
            profile: profile.clone(),
            argv: tool_plan.argv,
            env,
            cwd: tool_plan.cwd,
            run_dir: run_dir.clone(),
            uid,
            gid,
            timeout_ms: Some(req.timeout_ms.map_or(cap, |t| t.min(cap))),
            kill_grace_ms: sb.kill_grace_ms.unwrap_or(self.cfg.cancel_grace_ms),
            max_output_bytes: sb.max_output_bytes.map_or(self.cfg.max_output_bytes, |m| {
                m.min(self.cfg.max_output_bytes)
            }),
            tee_stdout: false,
            bridge_socket: extras.bridge_socket.clone(),
            sandbox: extras.with_files_mount(sb.sandbox),
        };
        let plan_bytes = serde_json::to_vec_pretty(&plan)
            .map_err(|e| ExecError::InvalidParams(e.to_string()))?;
        std::fs::write(plan.plan_path(), plan_bytes).map_err(|source| ExecError::Io {
            step: "write launch plan",
            path: plan.plan_path(),
            source,
        })?;

        let row = TaskRow {
            task_id: task_id.clone(),
            session_id: req.session.session_id.clone(),
            owner_uid: req.session.owner_uid,
            tool: req.tool.clone(),
            kind: TaskKind::Call,
            state: TaskState::Queued,
            mode: if foreground {
                "foreground"
            } else {
                "background"
            }
            .into(),
            reason: None,
            exit_code: None,
            signal: None,
            summary: tool_plan.summary,
            args: req.args.to_string(),
            created_at: ids::now_rfc3339(),
            started_at: None,
            ended_at: None,
            run_dir: run_dir.display().to_string(),
            delivery: None,
            service: req.service || tool_plan.service,
            parent_task_id: req.parent_task_id.clone(),
            profile,
            timeout_ms: req.timeout_ms,
            stdin: req.stdin,
            supervisor_pid: None,
            supervisor_start_time: None,
            duration_ms: None,
            output_bytes: None,
            output_truncated: None,
            leftover_processes: None,
            error: None,
            wake: req.wake.as_str().into(),
            occurrence_key: req.occurrence_key.clone(),
        };
        self.registry.insert_task(&row)?;
        let live = Live::new(&row);
        let rx = foreground.then(|| {
            let (tx, rx) = oneshot::channel();
            live.lock().fg = Some(tx);
            rx
        });
        self.live_map().insert(task_id.clone(), live.clone());
        extras.serve(self);
        // A piped stdin exists from submission on, so messages to a queued task wait in the
        // pipe for the command to start.
        let stdin_pipe = match req.stdin {
            StdinMode::Pipe => {
                let io = |source| ExecError::Io {
                    step: "create stdin pipe for",
                    path: run_dir.clone(),
                    source,
                };
                let (r, w) = sys::pipe().map_err(io)?;
                live.lock().stdin = Some(stdin_writer(w, live.stdin_queued.clone()).map_err(io)?);
                Some(r)
            }
            StdinMode::Null => None,
        };
        // Start at once when there is a free slot, so the task is `running` by the time the
        // call returns; otherwise it waits as `queued`.
        // Calls already waiting go first: the queue keeps submission order.
        let lane = self.lane(&live.session_id);
        let permits = (lane.waiting.load(Ordering::SeqCst) == 0)
            .then(|| self.try_slots(&live.session_id))
            .flatten();
        match permits {
            Some(permits) => self.start_and_watch(live, &plan, stdin_pipe, permits),
            None => self.enqueue(live, plan, stdin_pipe),
        }
        Ok((row, rx))
    }

    /// The session's lane: its slots and the queue of calls waiting for one, served in
    /// submission order by one task per session.
    fn lane(self: &Arc<Self>, session_id: &str) -> Lane {
        let mut map = self.per_session.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lane) = map.get(session_id) {
            return lane.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let lane = Lane {
            slots: Arc::new(Semaphore::new(self.cfg.max_running_per_session.max(1))),
            queue: tx,
            waiting: Arc::new(AtomicUsize::new(0)),
        };
        map.insert(session_id.to_owned(), lane.clone());
        tokio::spawn(self.clone().serve_lane(lane.clone(), rx));
        lane
    }

    fn session_slots(self: &Arc<Self>, session_id: &str) -> Arc<Semaphore> {
        self.lane(session_id).slots
    }

    /// Queues a call until its session and the daemon have a free slot.
    fn enqueue(self: &Arc<Self>, live: Arc<Live>, plan: LaunchPlan, stdin: Option<OwnedFd>) {
        let lane = self.lane(&live.session_id);
        lane.waiting.fetch_add(1, Ordering::SeqCst);
        if lane.queue.send(Queued { live, plan, stdin }).is_err() {
            lane.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Starts queued calls in order as slots free up.
    async fn serve_lane(self: Arc<Self>, lane: Lane, mut rx: mpsc::UnboundedReceiver<Queued>) {
        while let Some(q) = rx.recv().await {
            if q.live.lock().settled {
                lane.waiting.fetch_sub(1, Ordering::SeqCst);
                continue; // canceled while queued
            }
            let session = lane.slots.clone().acquire_owned().await;
            let global = self.global.clone().acquire_owned().await;
            lane.waiting.fetch_sub(1, Ordering::SeqCst);
            let (Ok(session), Ok(global)) = (session, global) else {
                return;
            };
            self.start_and_watch(q.live, &q.plan, q.stdin, (global, session));
        }
    }

    /// Starts the run now and watches it in the background, holding its slots until it settles.
    fn start_and_watch(
        self: &Arc<Self>,
        live: Arc<Live>,
        plan: &LaunchPlan,
        stdin: Option<OwnedFd>,
        permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    ) {
        if let Some((child, pidfd)) = self.start(&live, plan, stdin) {
            let this = self.clone();
            tokio::spawn(async move {
                this.watch(live, pidfd, Some(child)).await;
                drop(permits);
            });
        }
    }

    /// Starts the supervisor (unless the task was canceled meanwhile) and records it; a
    /// supervisor that cannot start settles the task as `spawn_error`.
    fn start(
        &self,
        live: &Arc<Live>,
        plan: &LaunchPlan,
        stdin_pipe: Option<OwnedFd>,
    ) -> Option<(std::process::Child, Arc<AsyncFd<OwnedFd>>)> {
        let mut st = live.lock();
        if st.settled {
            return None; // canceled while queued
        }
        let (child, pidfd) = match self.start_supervisor(plan, stdin_pipe, &mut st) {
            Ok(started) => started,
            Err(e) => {
                let s = lost_settlement(
                    FailReason::SpawnError,
                    format!("cannot start the supervisor: {e}"),
                );
                let settled = self.settle_locked(live, &mut st, s);
                drop(st);
                self.finish(live, settled);
                return None;
            }
        };
        let pid = child.id() as i32;
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
        Some((child, pidfd))
    }

    fn try_slots(
        self: &Arc<Self>,
        session_id: &str,
    ) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let global = self.global.clone().try_acquire_owned().ok()?;
        let session = self.session_slots(session_id).try_acquire_owned().ok()?;
        Some((global, session))
    }

    fn start_supervisor(
        &self,
        plan: &LaunchPlan,
        stdin_pipe: Option<OwnedFd>,
        st: &mut LiveState,
    ) -> std::io::Result<(std::process::Child, Arc<AsyncFd<OwnedFd>>)> {
        let stdin_read = match stdin_pipe {
            Some(r) => Some(r),
            // A plugin's plan may give the command fixed stdin (bridge::stdin_path).
            None => std::fs::File::open(crate::bridge::stdin_path(&plan.run_dir))
                .ok()
                .map(OwnedFd::from),
        };
        let child = spawn::spawn_supervisor(&self.exe, &plan.run_dir, stdin_read)?;
        // The child is ours and unreaped, so its pid cannot have been reused yet.
        let pidfd = Arc::new(sys::async_fd(sys::pidfd_open(child.id() as i32)?)?);
        st.supervisor = Some(pidfd.clone());
        Ok((child, pidfd))
    }

    /// Waits (without polling) for the supervisor to exit, then settles from result.json.
    async fn watch(
        &self,
        live: Arc<Live>,
        pidfd: Arc<AsyncFd<OwnedFd>>,
        mut child: Option<std::process::Child>,
    ) {
        if let Err(e) = pidfd.readable().await {
            warn!(task_id = %live.task_id, "cannot watch the supervisor: {e}");
        }
        let status = child.as_mut().and_then(|c| c.wait().ok());
        let result_path = live.run_dir.join("result.json");
        let settlement = match RunResult::read(&result_path) {
            Ok(Some(result)) => settlement_from_result(&result),
            Ok(None) | Err(_) if CancelRequest::path(&live.run_dir).exists() => {
                // Stopped before it had set up its signal handling, so before the command
                // started: settle as the stop asked.
                let req: Option<CancelRequest> = std::fs::read(CancelRequest::path(&live.run_dir))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
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
                let log = std::fs::read_to_string(live.run_dir.join("supervisor.log"))
                    .unwrap_or_default();
                let log = log.trim();
                match status.and_then(|s| s.code()) {
                    Some(2) => lost_settlement(
                        FailReason::SpawnError,
                        format!("the supervisor could not start the run: {log}"),
                    ),
                    _ => lost_settlement(
                        FailReason::Lost,
                        format!(
                            "the supervisor ended without writing result.json ({status:?}){}",
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
        // A subagent waits for its child session's tasks first (bridge/subagent.rs).
        crate::bridge::subagent::finish(self, &live.task_id, &live.session_id, &live.run_dir).await;
        let settled = {
            let mut st = live.lock();
            self.settle_locked(&live, &mut st, settlement)
        };
        self.finish(&live, settled);
    }

    /// Records the terminal state and decides delivery. Must be called with the task's lock
    /// held; returns the settled row to hand out after the lock is released.
    fn settle_locked(&self, live: &Live, st: &mut LiveState, mut s: Settlement) -> Option<TaskRow> {
        if st.settled {
            return None;
        }
        st.settled = true;
        let fg = st.fg.take().filter(|f| !f.is_closed());
        st.waiters.retain(|w| !w.is_closed());
        s.delivery = if fg.is_some() {
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
        if let Err(e) = self
            .registry
            .settle(&live.task_id, &live.session_id, &s, wake.as_ref())
        {
            warn!(task_id = %live.task_id, "cannot record the settlement: {e}");
        }
        let row = match self.registry.get_task(&live.task_id) {
            Ok(Some(row)) => row,
            _ => return None,
        };
        info!(task_id = %live.task_id, state = row.state.as_str(), delivery = s.delivery.as_str(), "task settled");
        if let Some(fg) = fg {
            let _ = fg.send(FgEvent::Settled(Box::new(row.clone())));
        }
        for w in st.waiters.drain(..) {
            let _ = w.send(row.clone());
        }
        st.stdin = None;
        st.supervisor = None;
        Some(row)
    }

    /// The wake of a background completion: an `[automatic]` prompt, or a one-line notice
    /// for sessions with `proactive_wake = false`.
    fn wake_notification(&self, live: &Live, s: &Settlement) -> Option<NotificationRow> {
        let task = self.registry.get_task(&live.task_id).ok().flatten()?;
        let session = self.registry.get_session(&live.session_id).ok().flatten()?;
        let output = tail(Path::new(&task.output_path()), 4096);
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

    /// After settling: wake cancel-waiters and forget the live entry.
    fn finish(&self, live: &Live, _settled: Option<TaskRow>) {
        let _ = live.done.send(true);
        self.live_map().remove(&live.task_id);
    }

    /// Moves a foreground task to the background if a call still holds it. Returns false if
    /// it already settled (its result is then on its way to the call) or was not foreground.
    pub fn try_yield(&self, task_id: &str) -> bool {
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
    pub fn background(&self, task_id: &str) -> bool {
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
    pub fn undeliver(&self, task_id: &str) {
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
    pub async fn wait(
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
    pub fn request_cancel(&self, task_id: &str, why: Option<String>) -> bool {
        self.stop(task_id, StopReason::Canceled, self.cfg.cancel_grace_ms, why)
    }

    /// Waits up to `timeout` for a task to settle; true if it has.
    pub async fn settled_within(&self, task_id: &str, timeout: Duration) -> bool {
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
    fn stop(
        &self,
        task_id: &str,
        reason: StopReason,
        grace_ms: u64,
        message: Option<String>,
    ) -> bool {
        let Some(live) = self.get_live(task_id) else {
            return false;
        };
        let mut st = live.lock();
        if st.settled {
            return false;
        }
        match st.supervisor.clone() {
            Some(pidfd) => {
                let req = CancelRequest {
                    reason,
                    grace_ms,
                    message,
                };
                let path = CancelRequest::path(&live.run_dir);
                if let Err(e) = serde_json::to_vec(&req)
                    .map_err(std::io::Error::other)
                    .and_then(|b| std::fs::write(&path, b))
                {
                    warn!(task_id, "cannot write {}: {e}", path.display());
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
                let settled = self.settle_locked(&live, &mut st, s);
                drop(st);
                self.finish(&live, settled);
            }
        }
        true
    }

    /// `task.cancel`.
    pub async fn cancel(
        &self,
        task_id: &str,
        grace_ms: Option<u64>,
    ) -> Result<CancelOutcome, ExecError> {
        let grace = grace_ms.unwrap_or(self.cfg.cancel_grace_ms);
        // Cancelling a subagent cancels everything below it.
        crate::bridge::subagent::cancel_children(self, task_id);
        let mut done = match self.get_live(task_id) {
            Some(live) => live.done.subscribe(),
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

    /// Cancels every live task of a session (session close). Returns their ids.
    pub fn cancel_session(&self, session_id: &str) -> Result<Vec<String>, ExecError> {
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
    pub fn message(&self, task_id: &str, data: &[u8], eof: bool) -> Result<u64, ExecError> {
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

    /// Re-attaches to the runs of a previous daemon (see `recover.rs`).
    pub fn recover(self: &Arc<Self>) -> Result<recover::Recovered, ExecError> {
        recover::recover(self)
    }
}

/// A writer task for a run's stdin pipe; chunks queue in memory so callers never block.
fn stdin_writer(
    w: OwnedFd,
    queued: Arc<AtomicU64>,
) -> std::io::Result<mpsc::UnboundedSender<StdinChunk>> {
    use std::os::fd::AsRawFd;
    sys::set_nonblocking(w.as_raw_fd(), true)?;
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

pub(crate) fn settlement_from_result(r: &RunResult) -> Settlement {
    Settlement {
        state: r.state,
        reason: r.reason,
        exit_code: r.exit_code,
        signal: r.signal,
        ended_at: r.ended_at.clone(),
        started_at: Some(r.started_at.clone()),
        duration_ms: Some(r.duration_ms),
        output_bytes: Some(r.output_bytes),
        output_truncated: Some(r.output_truncated),
        leftover_processes: Some(r.leftover_processes),
        error: r.error.clone(),
        delivery: Delivery::Pending,
    }
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
    }
}
