//! Calls → runs: submitting, yielding, settling, waiting, cancelling (docs/protocol.md).
//!
//! Exactly-once delivery: each live task has one mutex. The settle path, the yield path and
//! `task.background` all take it, and the settle path decides — once, under it — whether the
//! result goes inline (a foreground call still holds the task), to `task.wait` callers, or
//! stays `pending` for a wake. After that, later claims of a `pending` result go through the
//! registry's conditional update.

mod call;
mod control;
mod hints;
mod lanes;
mod output;
mod recover;
mod spawn;

use control::stdin_writer;
use hints::{with_hint, Polling};
use lanes::Lane;

pub use output::{excerpt, page, tail, task_page};

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
            mode: if foreground {
                "foreground"
            } else {
                "background"
            }
            .into(),
            run_dir: run_dir.display().to_string(),
            service: req.service || tool_plan.service,
            parent_task_id: req.parent_task_id.clone(),
            timeout_ms: req.timeout_ms,
            stdin: req.stdin,
            wake: req.wake.as_str().into(),
            occurrence_key: req.occurrence_key.clone(),
            profile,
            ..TaskRow::new(
                task_id.clone(),
                &req.session,
                req.tool.clone(),
                TaskKind::Call,
                tool_plan.summary,
                req.args.to_string(),
            )
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
        self.start_or_queue(live, plan, stdin_pipe);
        Ok((row, rx))
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
        crate::metrics::settled(s.state);
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

    /// Re-attaches to the runs of a previous daemon (see `recover.rs`).
    pub fn recover(self: &Arc<Self>) -> Result<recover::Recovered, ExecError> {
        recover::recover(self)
    }
}

pub(crate) fn settlement_from_result(r: &RunResult) -> Settlement {
    crate::metrics::violations_seen(r.violations.len());
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
