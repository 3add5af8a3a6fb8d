//! What the executor tells the layer above it about a run's life, without knowing that layer
//! (ARCHITECTURE.md: calls run in one direction). The daemon registers one [`RunHooks`] (the
//! bridges, `bridge/`) before any run starts; the executor calls it when a run is prepared,
//! before it settles and when it is cancelled. Without one, a plan that needs a bridge or a
//! child session is refused.

use std::future::Future;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use super::{ExecError, Executor};
use crate::plugin_host::ToolPlan;
use crate::registry::SessionRow;

/// A run about to be launched: its plan is checked, its directories exist, its task is not
/// recorded yet.
pub(crate) struct RunStart<'a> {
    pub task_id: &'a str,
    pub session: &'a SessionRow,
    /// The run's effective profile: a child session gets it, and it bounds every call made
    /// through the run's bridge.
    pub profile: &'a str,
    /// The uid/gid the run runs as (`None` keeps the daemon's).
    pub run_as: (Option<u32>, Option<u32>),
    pub plan: &'a ToolPlan,
}

/// What the hooks add to a run's launch.
#[derive(Default)]
pub(crate) struct RunExtras {
    pub env: Vec<(String, String)>,
    /// The directory holding the run's bridge socket, mounted into its view.
    pub bridge_socket: Option<PathBuf>,
    /// The session the run's bridge is scoped to (recorded in the task's row).
    pub bridge_session_id: Option<String>,
    /// Called once the task is live (recorded, and known to [`Executor::settled_signal`]).
    pub on_live: Option<OnLive>,
}

/// A run whose supervisor has exited and whose task has not settled yet.
pub(crate) struct RunEnd<'a> {
    pub task_id: &'a str,
    pub session_id: &'a str,
    /// The run's public directory (`output.log`, `result.json`).
    pub public: Option<BorrowedFd<'a>>,
    /// A stop was asked for.
    pub canceled: bool,
}

/// What [`RunExtras::on_live`] does once the task is live.
pub(super) type OnLive = Box<dyn FnOnce(&Arc<Executor>) + Send>;

pub(crate) type HookFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

pub(crate) trait RunHooks: Send + Sync {
    /// Before the run is recorded: what its plan asks beyond the command (a child session,
    /// a bridge). An error refuses the call.
    fn prepare(&self, exec: &Executor, run: &RunStart<'_>) -> Result<RunExtras, ExecError>;

    /// After the run's supervisor exited, before its task settles (a subagent waits for its
    /// child session here). The task settles when the future ends.
    fn ending<'a>(&'a self, exec: &'a Executor, run: RunEnd<'a>) -> HookFuture<'a>;

    /// `task.cancel` of a live task, before the run is asked to stop.
    fn canceling(&self, exec: &Executor, task_id: &str);
}

/// The hooks of an executor nobody registered any with: plain runs only.
pub(super) struct NoHooks;

impl RunHooks for NoHooks {
    fn prepare(&self, _: &Executor, run: &RunStart<'_>) -> Result<RunExtras, ExecError> {
        if run.plan.bridge || run.plan.child_session {
            return Err(ExecError::InvalidParams(
                "this executor serves no bridges, so it cannot run a plan that asks for one".into(),
            ));
        }
        Ok(RunExtras::default())
    }

    fn ending<'a>(&'a self, _: &'a Executor, _: RunEnd<'a>) -> HookFuture<'a> {
        Box::pin(std::future::ready(()))
    }

    fn canceling(&self, _: &Executor, _: &str) {}
}
