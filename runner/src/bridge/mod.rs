//! The bridge (docs/plugins.md): a per-run Unix socket through which a sandboxed script calls
//! tools of its own session. This module owns the sockets and their lifetime, the [`Scope`]
//! a bridge acts in, the questions runs ask (`input.rs`) and subagents' child sessions
//! (`subagent.rs`); it speaks no protocol itself. Each connection is handed to the daemon's
//! one RPC core (`server/`), which serves it with the same handlers as the control socket,
//! restricted to the scope: the run's session, the bridge's methods (`Method::for_bridges`), and the run's profile as
//! the ceiling of everything started through it.
//!
//! The socket is `<bridge dir>/<task_id>/sock` (`run::dir::socket_dir`): the directory is named
//! in the launch plan (`bridge_socket`, for the sandbox to mount) and the socket is exported
//! as `SIDEJOB_BRIDGE`. Mounting the directory, not the socket, lets a restarted daemon bind
//! the socket again where the run sees it ([`Bridges::after_restart`]). Both are removed when
//! the run settles. The executor knows none of this: [`Bridges`] is its [`RunHooks`].

mod input;
mod subagent;
#[cfg(test)]
mod tests;

pub(crate) use input::Questions;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, info, info_span, warn, Instrument};

use crate::executor::{ExecError, Executor, HookFuture, RunEnd, RunExtras, RunHooks, RunStart};
use crate::protocol::TaskState;
use crate::registry::TaskRow;
use crate::session::{self, SessionError};

/// Who a bridge acts for. Derived from the registry's row of the task that holds it (never
/// from a file a run or its caller could write), so a restarted daemon serves it again with
/// exactly the authority it had.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    /// The session whose tasks the bridge may see and start.
    pub session_id: String,
    /// The task whose run holds the bridge (parent of the tasks it starts).
    pub caller_task_id: String,
    /// The session the caller task itself belongs to (differs for a subagent).
    pub caller_session_id: String,
    /// The session owner (questions and wakes go to them).
    pub owner_uid: u32,
    /// The caller task's effective profile: the widest any call through the bridge may have.
    pub ceiling: String,
    /// The uid/gid the run runs as (owner of the socket); `None` keeps the daemon's.
    pub run_as: (Option<u32>, Option<u32>),
}

impl Scope {
    /// The scope of a task's bridge, if it has one.
    pub(crate) fn of_task(row: &TaskRow) -> Option<Scope> {
        Some(Scope {
            session_id: row.bridge_session_id.clone()?,
            caller_task_id: row.task_id.clone(),
            caller_session_id: row.session_id.clone(),
            owner_uid: row.owner_uid,
            ceiling: row.profile.clone(),
            run_as: (row.run_uid, row.run_gid),
        })
    }

    /// The bridge of a subagent's run serves the subagent's child session.
    pub(crate) fn is_subagent(&self) -> bool {
        self.session_id != self.caller_session_id
    }
}

/// Serves one connection to a bridge, with the bridge's scope (the daemon's RPC core).
pub(crate) type Serve = Arc<dyn Fn(Arc<Scope>, UnixStream) + Send + Sync>;

/// The daemon's bridges: the executor's [`RunHooks`], and what the handlers of
/// `task.request_input` and `task.answer` need.
pub(crate) struct Bridges {
    me: Weak<Bridges>,
    serve: Serve,
    questions: input::Questions,
}

impl Bridges {
    /// `serve` answers each connection to any bridge.
    pub(crate) fn new(serve: Serve) -> Arc<Bridges> {
        Arc::new_cyclic(|me| Bridges {
            me: me.clone(),
            serve,
            questions: input::Questions::default(),
        })
    }

    /// The questions runs ask through their bridges (`task.request_input`), which the host
    /// answers (`task.answer`).
    pub(crate) fn questions(&self) -> &Questions {
        &self.questions
    }

    /// At start-up, after recovery: no task stays `awaiting_input` (its question died with
    /// the previous daemon), and the bridges of the runs a previous daemon left running are
    /// served again. The sandbox mounted each run's bridge directory, so a socket bound there
    /// again is the one the run sees; who it acts for comes from the task's registry row.
    /// Connections open at the restart are gone (their calls raise an error).
    pub(crate) fn after_restart(&self, exec: &Arc<Executor>) {
        input::abandon_after_restart(exec);
        let Ok(live) = exec.registry().tasks_in_states(&[
            TaskState::Queued,
            TaskState::Running,
            TaskState::AwaitingInput,
        ]) else {
            return;
        };
        for t in live {
            let Some(scope) = Scope::of_task(&t) else {
                continue;
            };
            let reopened = crate::run::dir::socket_dir(&t.task_id).and_then(|dir| {
                make_private_dir(&dir, scope.run_as)?;
                let listener = bind(&socket_in(&dir), scope.run_as)?;
                Ok((listener, dir))
            });
            match reopened {
                Ok((listener, dir)) => {
                    info!(task_id = %t.task_id, "bridge served again after the restart");
                    self.listen(exec, listener, dir, scope);
                }
                Err(e) => warn!(task_id = %t.task_id, "cannot serve the bridge again: {e}"),
            }
        }
    }

    /// Accepts connections to a bound bridge until its run settles, then removes its
    /// directory and drops the run's open question.
    fn listen(&self, exec: &Arc<Executor>, listener: UnixListener, dir: PathBuf, scope: Scope) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let exec = exec.clone();
        let span =
            info_span!("bridge", task_id = %scope.caller_task_id, session_id = %scope.session_id);
        tokio::spawn(
            async move {
                let Some(mut done) = exec.settled_signal(&scope.caller_task_id) else {
                    let _ = std::fs::remove_dir_all(&dir);
                    return;
                };
                let scope = Arc::new(scope);
                loop {
                    tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _)) => (me.serve)(scope.clone(), stream),
                            Err(e) => {
                                warn!("bridge accept failed: {e}");
                                break;
                            }
                        },
                        _ = done.wait_for(|d| *d) => break,
                    }
                }
                me.questions.abandon(&scope.caller_task_id);
                let _ = std::fs::remove_dir_all(&dir);
                debug!("bridge closed");
            }
            .instrument(span),
        );
    }
}

impl RunHooks for Bridges {
    /// A plan's child session (a subagent's) and its bridge, bound now and served once the
    /// task is live.
    fn prepare(&self, exec: &Executor, run: &RunStart<'_>) -> Result<RunExtras, ExecError> {
        let mut extras = RunExtras::default();
        let mut scope_session = run.session.session_id.clone();
        if run.plan.child_session {
            let child = session::open_child(
                exec.registry(),
                exec.config(),
                exec.catalog(),
                run.session,
                run.profile,
                run.task_id,
            )
            .map_err(child_error)?;
            extras
                .env
                .push(("SIDEJOB_CHILD_SESSION_ID".into(), child.session_id.clone()));
            scope_session = child.session_id;
        }
        if !(run.plan.bridge || run.plan.child_session) {
            return Ok(extras);
        }
        let io = |step: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| ExecError::Io { step, path, source }
        };
        let dir = crate::run::dir::socket_dir(run.task_id)
            .map_err(io("prepare bridge directory", Path::new(run.task_id)))?;
        make_private_dir(&dir, run.run_as).map_err(io("create bridge directory", &dir))?;
        let path = socket_in(&dir);
        let listener = bind(&path, run.run_as).map_err(io("bind bridge socket", &path))?;
        let scope = Scope {
            session_id: scope_session,
            caller_task_id: run.task_id.into(),
            caller_session_id: run.session.session_id.clone(),
            owner_uid: run.session.owner_uid,
            ceiling: run.profile.to_owned(),
            run_as: run.run_as,
        };
        extras
            .env
            .push(("SIDEJOB_BRIDGE".into(), path.display().to_string()));
        extras.bridge_socket = Some(dir.clone());
        extras.bridge_session_id = Some(scope.session_id.clone());
        let me = self.me.clone();
        extras.on_live = Some(Box::new(move |exec: &Arc<Executor>| {
            if let Some(me) = me.upgrade() {
                me.listen(exec, listener, dir, scope);
            }
        }));
        Ok(extras)
    }

    fn ending<'a>(&'a self, exec: &'a Executor, run: RunEnd<'a>) -> HookFuture<'a> {
        Box::pin(subagent::finish(exec, run))
    }

    fn canceling(&self, exec: &Executor, task_id: &str) {
        subagent::cancel_children(exec, task_id);
    }
}

/// A child session that cannot be opened refuses the call (`invalid_params`, as before the
/// session tree moved to `session/`).
fn child_error(e: SessionError) -> ExecError {
    match e {
        SessionError::Registry(e) => ExecError::Registry(e),
        SessionError::NotFound(id) => ExecError::InvalidState(format!("session {id} vanished")),
        other => ExecError::InvalidParams(other.to_string()),
    }
}

/// The socket in a run's bridge directory.
fn socket_in(dir: &Path) -> PathBuf {
    dir.join("sock")
}

/// A bridge directory only the run's user may enter (mode 0700).
fn make_private_dir(dir: &Path, (uid, gid): (Option<u32>, Option<u32>)) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::chown(dir, uid, gid)?;
    }
    Ok(())
}

/// Binds a bridge socket only the run's user may connect to.
fn bind(path: &Path, (uid, gid): (Option<u32>, Option<u32>)) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::chown(path, uid, gid)?;
    }
    Ok(listener)
}
