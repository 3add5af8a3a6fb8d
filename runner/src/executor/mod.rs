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
mod grants;
mod hints;
mod hooks;
mod instance;
mod lanes;
mod output;
mod plan_files;
mod recover;
mod settle;
mod spawn;
mod submit;
#[cfg(test)]
mod tests;

use control::stdin_writer;
pub(crate) use grants::within as grants_within;
use hints::{with_hint, Polling};
use lanes::Lane;
use settle::{lost_settlement, settlement_from_result, Watched};

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
    CancelOutcome, CompletedCall, Delivery, FailReason, OnDisconnect, RunningCall, StderrMode,
    StdinMode, TaskKind, TaskState, ToolCallResult, WakeMode,
};
use crate::registry::{Holding, Registry, RegistryError, SessionRow, TaskRow};
use crate::run::cancel::{CancelRequest, StopReason};
use crate::run::dir::{PrivateDir, RunsDirs};
use crate::run::result::RunResult;
use crate::sandbox;
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
    /// Something the caller may not grant (a path they cannot use, a host outside
    /// `[grants] allow`).
    #[error("{0}")]
    PermissionDenied(String),
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
    /// What the call becomes if its caller goes away while it is in the foreground.
    pub on_disconnect: OnDisconnect,
    /// Whether the command's stderr gets a pipe of its own.
    pub stderr: StderrMode,
    /// What the caller grants this run beyond its profile (`tool.call` `grants`), already
    /// bounded by its scope (a bridge's: its run's own grants).
    pub grants: Option<crate::protocol::CallGrants>,
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
    /// Its owner stopped it and reads the outcome itself (`task.cancel` with `wake:
    /// silent`): its settlement makes no wake.
    silenced: bool,
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
    /// The shared offline network namespace the run may join (see `supervisor::spawner`).
    netns_key: Option<String>,
}

impl Live {
    fn new(
        row: &TaskRow,
        private: PrivateDir,
        public: Option<OwnedFd>,
        netns_key: Option<String>,
    ) -> Arc<Live> {
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
            netns_key,
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
        let result = crate::run::result::read(dir.as_fd(), self.owner_uid)?;
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

/// Refuses new work while the daemon is close to its descriptor limit, keeping the rest for
/// what it has started (settling runs, replies, the registry): a call is refused with
/// `limit_exceeded`, never failed half-way by "too many open files".
fn check_descriptors() -> Result<(), ExecError> {
    let limit = crate::sys::descriptor_limit();
    let reserve = (limit / 8).max(64);
    // Counting reads an entry per open descriptor, at every call: with a thousand runs
    // going that was a fifth of the daemon's CPU. The table's size bounds the count.
    if crate::sys::descriptor_table_size().is_ok_and(|size| size.saturating_add(reserve) < limit) {
        return Ok(());
    }
    let open = match crate::sys::open_descriptors() {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => limit,
        // Not countable (no /proc): the calls themselves will say.
        Err(_) => return Ok(()),
    };
    if open.saturating_add(reserve) >= limit {
        return Err(ExecError::LimitExceeded(format!(
            "the daemon has {open} of its {limit} descriptors open and keeps {reserve} for the runs it has; try again once some settle"
        )));
    }
    Ok(())
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
    /// Each user's connections through the egress proxy (`per_user.egress_connections`).
    egress_shares: Arc<crate::egress::share::Shares>,
    polling: Polling,
    /// The socket directories no run may be handed (`Config::socket_dirs`), resolved once.
    socket_dirs: Vec<PathBuf>,
    /// Where the runs' private halves are.
    runs: RunsDirs,
    /// What the layer above hears of each run (set once, before any run starts).
    hooks: std::sync::OnceLock<Arc<dyn RunHooks>>,
    /// The hub, told to push as soon as a run has settled (set once, by the daemon).
    hub: std::sync::OnceLock<Arc<crate::wake::Hub>>,
}

impl Executor {
    pub(crate) fn new(
        cfg: Arc<Config>,
        registry: Arc<Registry>,
        tools: Arc<ToolHost>,
        exe: PathBuf,
        runs: RunsDirs,
    ) -> Arc<Executor> {
        let profiles_dir = cfg
            .profiles_dir
            .clone()
            .or_else(sandbox::Catalog::default_dir);
        Arc::new_cyclic(|me| Executor {
            me: me.clone(),
            global: Arc::new(Semaphore::new(cfg.max_running.max(1))),
            spawner: spawn::Spawner::new(exe, runs.current().to_path_buf()),
            runs,
            egress_shares: crate::egress::share::Shares::new(cfg.per_user.egress_connections),
            catalog: Arc::new(sandbox::Catalog::new(profiles_dir)),
            socket_dirs: cfg.socket_dirs(),
            cfg,
            registry,
            tools,
            live: Mutex::new(HashMap::new()),
            per_session: Mutex::new(HashMap::new()),
            per_user: Mutex::new(HashMap::new()),
            kept: Mutex::new(HashMap::new()),
            polling: Polling::default(),
            hooks: std::sync::OnceLock::new(),
            hub: std::sync::OnceLock::new(),
        })
    }

    /// Registers the hooks the executor calls as runs start, end and are cancelled. Once,
    /// before the first run (recovery included); a second call is refused.
    pub(crate) fn set_hooks(&self, hooks: Arc<dyn RunHooks>) -> Result<(), ExecError> {
        self.hooks
            .set(hooks)
            .map_err(|_| ExecError::InvalidState("the executor's run hooks are set already".into()))
    }

    /// The hub whose pushes a settlement sends at once (`Hub::publish_now`). Once.
    pub(crate) fn set_hub(&self, hub: Arc<crate::wake::Hub>) {
        let _ = self.hub.set(hub);
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
        check_descriptors()?;
        let pu = &self.cfg.per_user;
        let uid = session.owner_uid;
        // The queue first: it is almost always short, and while it has room the running
        // calls, however many, need no counting.
        let queued = self.registry.count_of(uid, Holding::QueuedCalls)?;
        if queued >= pu.queued as u64 {
            let running = self.registry.count_of(uid, Holding::RunningCalls)?;
            if running >= pu.running as u64 {
                return Err(ExecError::LimitExceeded(format!(
                    "uid {uid} has {running} runs running and {queued} waiting: per_user.queued ({}) is reached; wait for some to settle or cancel them",
                    pu.queued
                )));
            }
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

    /// Stops the process that forks supervisors (see `spawn.rs`); the next run starts it again.
    pub(crate) fn stop_spawner(&self) {
        self.spawner.stop();
    }

    /// Re-attaches to the runs of a previous daemon (see `recover.rs`).
    pub(crate) fn recover(self: &Arc<Self>) -> Result<recover::Recovered, ExecError> {
        recover::recover(self)
    }
}
