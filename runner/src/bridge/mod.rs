//! The bridge (docs/plugins.md): a per-run Unix socket through which a sandboxed script calls tools
//! of its own session. It speaks the host protocol (newline-delimited JSON-RPC 2.0) but
//! serves only [`BRIDGE_METHODS`], and only for the run's session: a task of another session
//! is refused as if it did not exist, and every other method is `method_not_found`. The socket
//! is `<bridge dir>/<task_id>/sock` (see [`run_bridge_dir`]): the directory is named in the
//! launch plan (`bridge_socket`, for the sandbox to mount) and the socket is exported as
//! `SIDEJOB_BRIDGE`. Mounting the directory, not the socket, lets a restarted daemon bind the
//! socket again where the run sees it ([`reopen_after_restart`]). Both are removed when the run
//! settles. Tasks started through it get the calling task as `parent_task_id`.

mod input;
pub mod subagent;

pub use input::{abandon_after_restart, answer};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info_span, warn, Instrument};

use crate::config::Config;
use crate::executor::{task_page, CallRequest, ExecError, Executor};
use crate::ids;
use crate::plugin_host::ToolPlan;
use crate::protocol::*;
use crate::registry::{SessionRow, TaskRow};
use crate::run_dir::PrivateDir;
use crate::sandbox::{MountSpec, SandboxPlan};

/// The longest `task.wait` a bridge honours (a run's own deadline still applies).
const MAX_WAIT_MS: u64 = 24 * 3600 * 1000;

/// Who a bridge acts for. Derived from the registry's row of the task that holds it (never
/// from a file a run or its caller could write), so a restarted daemon serves it again with
/// exactly the authority it had.
#[derive(Debug, Clone)]
pub struct Scope {
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
    pub fn of_task(row: &TaskRow) -> Option<Scope> {
        Some(Scope {
            session_id: row.bridge_session_id.clone()?,
            caller_task_id: row.task_id.clone(),
            caller_session_id: row.session_id.clone(),
            owner_uid: row.owner_uid,
            ceiling: row.profile.clone(),
            run_as: (row.run_uid, row.run_gid),
        })
    }
}

/// The directory of a run's bridge: `<bridge dir>/<task_id>`, holding the socket `sock`. Not
/// in the run directory, whose path can exceed the 108 bytes a socket address holds.
pub fn run_bridge_dir(task_id: &str) -> std::io::Result<PathBuf> {
    Ok(bridge_dir()?.join(task_id))
}

/// The socket in a run's bridge directory.
fn socket_in(dir: &Path) -> PathBuf {
    dir.join("sock")
}

/// `crate::config::default_bridge_dir()`, created 0711 (the runs' users must reach their
/// socket) and refused if it is not ours.
fn bridge_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let uid = crate::sys::getuid();
    let dir = crate::config::default_bridge_dir();
    match std::fs::create_dir(&dir) {
        Ok(()) => std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a directory owned by uid {uid} and writable only by it",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Daemon configuration handed to plugins as `context.config`.
pub fn plugin_config(cfg: &Config) -> Value {
    json!({ "subagent": cfg.subagent })
}

/// What a plan's extras add to its launch: files written, a child session opened, a bridge
/// bound (served once the task is live, see [`Extras::serve`]).
pub struct Extras {
    pub env: Vec<(String, String)>,
    pub bridge_socket: Option<PathBuf>,
    /// Where the plan's files were written (in the run's private directory), if it has any.
    pub files_dir: Option<PathBuf>,
    bridge: Option<(UnixListener, PathBuf, Scope)>,
}

impl Extras {
    /// Adds the plan's files to the run's view, read-only, at the same path
    /// (`context.tmp_dir`), so a plan can name its files in its argv.
    pub fn with_files_mount(&self, mut sandbox: SandboxPlan) -> SandboxPlan {
        if let Some(dir) = &self.files_dir {
            sandbox.mounts.push(MountSpec {
                source: Some(dir.clone()),
                target: dir.clone(),
                exec: true,
                write: false,
                required: true,
                as_caller: false,
            });
        }
        sandbox
    }

    /// The session the run's bridge is scoped to (recorded in the task's row).
    pub fn bridge_session_id(&self) -> Option<String> {
        self.bridge.as_ref().map(|(_, _, s)| s.session_id.clone())
    }

    /// Starts serving the bridge, if the plan has one. Call once the task is live.
    pub fn serve(self, exec: &Arc<Executor>) {
        if let Some((listener, path, scope)) = self.bridge {
            serve(exec, listener, path, scope);
        }
    }
}

/// Carries out the parts of a tool's plan that happen before the run starts. `profile` is
/// the run's effective profile: its child session (if any) gets it, and it bounds every call
/// made through the bridge.
pub fn prepare(
    exec: &Executor,
    session: &SessionRow,
    profile: &str,
    run_as: (Option<u32>, Option<u32>),
    task_id: &str,
    private: &PrivateDir,
    plan: &ToolPlan,
) -> Result<Extras, ExecError> {
    let io = |step: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| ExecError::Io { step, path, source }
    };
    let mut env = Vec::new();
    let mut files_dir = None;
    if !plan.files.is_empty() {
        let dir = private.files();
        std::fs::create_dir(&dir).map_err(io("create plan file directory", &dir))?;
        for f in &plan.files {
            // Plugins are trusted code, but a plan's file names come from a call's arguments
            // as often as not: each must stay beneath the files directory.
            let rel = Path::new(&f.path);
            if rel.is_absolute()
                || rel
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(ExecError::InvalidParams(format!(
                    "the tool's plan names a file {:?} outside its files directory",
                    f.path
                )));
            }
            let path = dir.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io("create plan file directory", parent))?;
            }
            std::fs::write(&path, &f.content).map_err(io("write plan file", &path))?;
            if f.executable {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                    .map_err(io("make plan file executable", &path))?;
            }
        }
        chown_tree(&dir, run_as).map_err(io("hand plan files to the run's user", &dir))?;
        files_dir = Some(dir);
    }
    if let Some(data) = &plan.stdin {
        std::fs::write(private.stdin(), data)
            .map_err(io("write the plan's stdin", &private.stdin()))?;
    }
    let mut scope_session = session.session_id.clone();
    if plan.child_session {
        let child =
            subagent::open_child(exec.registry(), exec.config(), session, profile, task_id)?;
        env.push(("SIDEJOB_CHILD_SESSION_ID".into(), child.session_id.clone()));
        scope_session = child.session_id;
    }
    let mut bridge = None;
    let mut bridge_socket = None;
    if plan.bridge || plan.child_session {
        let dir =
            run_bridge_dir(task_id).map_err(io("prepare bridge directory", private.path()))?;
        make_private_dir(&dir, run_as).map_err(io("create bridge directory", &dir))?;
        let path = socket_in(&dir);
        let listener = bind(&path, run_as).map_err(io("bind bridge socket", &path))?;
        let scope = Scope {
            session_id: scope_session,
            caller_task_id: task_id.into(),
            caller_session_id: session.session_id.clone(),
            owner_uid: session.owner_uid,
            ceiling: profile.to_owned(),
            run_as,
        };
        env.push(("SIDEJOB_BRIDGE".into(), path.display().to_string()));
        bridge_socket = Some(dir.clone());
        bridge = Some((listener, dir, scope));
    }
    Ok(Extras {
        env,
        bridge_socket,
        files_dir,
        bridge,
    })
}

/// Hands a tree to the user the run runs as (nothing to do when it runs as the daemon). The
/// tree is the daemon's own (in the run's private directory), so following paths is safe.
fn chown_tree(path: &Path, (uid, gid): (Option<u32>, Option<u32>)) -> std::io::Result<()> {
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, uid, gid)?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for e in std::fs::read_dir(path)? {
            chown_tree(&e?.path(), (uid, gid))?;
        }
    }
    Ok(())
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

/// At start-up: serves again the bridges of the runs a previous daemon left running. The
/// sandbox mounted each run's bridge directory, so a socket bound there again is the one the
/// run sees. Who the bridge acts for comes from the task's registry row. Connections open at
/// the restart are gone (their calls raise an error).
pub fn reopen_after_restart(exec: &Arc<Executor>) {
    use crate::protocol::TaskState;
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
        let reopened = run_bridge_dir(&t.task_id).and_then(|dir| {
            make_private_dir(&dir, scope.run_as)?;
            let listener = bind(&socket_in(&dir), scope.run_as)?;
            Ok((listener, dir))
        });
        match reopened {
            Ok((listener, dir)) => {
                tracing::info!(task_id = %t.task_id, "bridge served again after the restart");
                serve(exec, listener, dir, scope);
            }
            Err(e) => warn!(task_id = %t.task_id, "cannot serve the bridge again: {e}"),
        }
    }
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

/// Serves a bound bridge until its run settles, then removes its directory.
fn serve(exec: &Arc<Executor>, listener: UnixListener, path: PathBuf, scope: Scope) {
    let exec = exec.clone();
    let span =
        info_span!("bridge", task_id = %scope.caller_task_id, session_id = %scope.session_id);
    tokio::spawn(
        async move {
            let Some(mut done) = exec.settled_signal(&scope.caller_task_id) else {
                let _ = std::fs::remove_dir_all(&path);
                return;
            };
            let scope = Arc::new(scope);
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            let (exec, scope) = (exec.clone(), scope.clone());
                            tokio::spawn(async move { connection(exec, scope, stream).await });
                        }
                        Err(e) => {
                            warn!("bridge accept failed: {e}");
                            break;
                        }
                    },
                    _ = done.wait_for(|d| *d) => break,
                }
            }
            input::abandon(&scope.caller_task_id);
            let _ = std::fs::remove_dir_all(&path);
            debug!("bridge closed");
        }
        .instrument(span),
    );
}

async fn connection(exec: Arc<Executor>, scope: Arc<Scope>, stream: UnixStream) {
    let (rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        while let Some(mut line) = rx.recv().await {
            line.push('\n');
            if wr.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    let (closed_tx, closed_rx) = watch::channel(false);
    let mut reader = BufReader::new(rd);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = match (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(n) => n,
            Err(_) => break,
        };
        if n == 0 {
            break;
        }
        if buf.len() > MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
            let err = RpcError::new(
                ErrorKind::InvalidRequest,
                format!("line exceeds {MAX_LINE_BYTES} bytes"),
            );
            let _ = tx.send(encode(&Response::err(Value::Null, err)));
            break;
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let (exec, scope, tx, mut closed) =
            (exec.clone(), scope.clone(), tx.clone(), closed_rx.clone());
        let line = std::mem::take(&mut buf);
        tokio::spawn(async move {
            let closed = async move {
                let _ = closed.wait_for(|c| *c).await;
            };
            if let Some(reply) = handle_line(&exec, &scope, &line, closed).await {
                let _ = tx.send(reply);
            }
        });
    }
    let _ = closed_tx.send(true);
    drop(tx);
    let _ = writer.await;
}

fn encode(r: &Response) -> String {
    serde_json::to_string(r).unwrap_or_else(|e| {
        format!(r#"{{"jsonrpc":"2.0","id":null,"error":{{"code":-32603,"message":"cannot encode reply: {e}"}}}}"#)
    })
}

async fn handle_line(
    exec: &Arc<Executor>,
    scope: &Scope,
    line: &[u8],
    closed: impl std::future::Future<Output = ()>,
) -> Option<String> {
    let value: Value = match serde_json::from_slice(line) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            let e = RpcError::new(ErrorKind::InvalidRequest, "a request must be a JSON object");
            return Some(encode(&Response::err(Value::Null, e)));
        }
        Err(e) => {
            let e = RpcError::new(ErrorKind::ParseError, format!("parse error: {e}"));
            return Some(encode(&Response::err(Value::Null, e)));
        }
    };
    let has_id = value.get("id").is_some();
    let req: Request = match serde_json::from_value(value) {
        Ok(r) => r,
        Err(e) => {
            let e = RpcError::new(ErrorKind::InvalidRequest, format!("invalid request: {e}"));
            return Some(encode(&Response::err(Value::Null, e)));
        }
    };
    let id = req.id.clone().unwrap_or(Value::Null);
    let Some(Value::String(method)) = req.method else {
        let e = RpcError::new(ErrorKind::InvalidRequest, "method must be a string");
        return Some(encode(&Response::err(id, e)));
    };
    let params = match req.params {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) => p,
        Some(_) => {
            let e = RpcError::new(
                ErrorKind::InvalidParams,
                format!("{method}: params must be an object"),
            );
            return Some(encode(&Response::err(id, e)));
        }
    };
    let outcome = dispatch(exec, scope, &method, params, closed)
        .instrument(info_span!("bridge_request", method = %method))
        .await;
    if !has_id {
        return None;
    }
    Some(encode(&match outcome {
        Ok(v) => Response::ok(id, v),
        Err(e) => Response::err(id, e),
    }))
}

fn params<T: DeserializeOwned>(method: &str, p: Value) -> Result<T, RpcError> {
    serde_json::from_value(p)
        .map_err(|e| RpcError::new(ErrorKind::InvalidParams, format!("{method}: {e}")))
}

fn to_value<T: serde::Serialize>(v: T) -> Result<Value, RpcError> {
    serde_json::to_value(v).map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))
}

/// The same error the control socket would give (see `server/dispatch.rs`).
fn exec_err(e: ExecError) -> RpcError {
    e.into()
}

fn internal(e: impl std::fmt::Display) -> RpcError {
    RpcError::new(ErrorKind::Internal, e.to_string())
}

/// A task of the bridge's session; any other task is reported as not found, so a run cannot
/// even learn whether another session's task exists.
fn scoped_task(exec: &Executor, scope: &Scope, task_id: &str) -> Result<TaskRow, RpcError> {
    if !ids::is_valid_task_id(task_id) {
        return Err(RpcError::new(
            ErrorKind::InvalidParams,
            format!("invalid task id {task_id:?}: task ids are 26-character ULIDs"),
        ));
    }
    match exec.registry().get_task(task_id).map_err(internal)? {
        Some(row) if row.session_id == scope.session_id => Ok(row),
        _ => Err(RpcError::new(
            ErrorKind::NotFound,
            format!("task {task_id} not found in session {}", scope.session_id),
        )),
    }
}

/// Takes a `session_id` the caller may have sent: it must be the bridge's own.
fn own_session(scope: &Scope, p: &mut Value) -> Result<(), RpcError> {
    let Some(obj) = p.as_object_mut() else {
        return Ok(());
    };
    match obj.get("session_id").and_then(Value::as_str) {
        None => {
            obj.insert("session_id".into(), scope.session_id.clone().into());
            Ok(())
        }
        Some(s) if s == scope.session_id => Ok(()),
        Some(other) => Err(RpcError::new(
            ErrorKind::PermissionDenied,
            format!(
                "this bridge serves session {} only, not {other}",
                scope.session_id
            ),
        )),
    }
}

async fn dispatch(
    exec: &Arc<Executor>,
    scope: &Scope,
    method: &str,
    mut p: Value,
    closed: impl std::future::Future<Output = ()>,
) -> Result<Value, RpcError> {
    let registry = exec.registry();
    match method {
        "tool.call" => {
            own_session(scope, &mut p)?;
            let p: ToolCallParams = params(method, p)?;
            let session = registry
                .get_session(&scope.session_id)
                .map_err(internal)?
                .filter(|s| s.is_open())
                .ok_or_else(|| {
                    RpcError::new(
                        ErrorKind::InvalidState,
                        format!("session {} is closed", scope.session_id),
                    )
                })?;
            let req = CallRequest {
                owner: crate::session::owner_creds(&session, None),
                session,
                tool: p.tool,
                args: if p.args.is_null() { json!({}) } else { p.args },
                yield_after_ms: p.yield_after_ms,
                background: p.background.unwrap_or(false),
                timeout_ms: p.timeout_ms,
                stdin: p.stdin.unwrap_or_default(),
                service: p.service.unwrap_or(false),
                profile: p.profile,
                // Nothing started through the bridge is wider than the run that holds it.
                ceiling: Some(scope.ceiling.clone()),
                // A subagent's own jobs report through the subagent, not by waking the host;
                // its services are handed over to the parent and wake it as usual.
                wake: p.wake.unwrap_or(
                    if scope.session_id != scope.caller_session_id && !p.service.unwrap_or(false) {
                        WakeMode::Silent
                    } else {
                        WakeMode::OnTerminal
                    },
                ),
                parent_task_id: Some(scope.caller_task_id.clone()),
                occurrence_key: None,
            };
            let result = exec.call(req, closed).await.map_err(exec_err)?;
            to_value(result)
        }
        "task.list" => {
            own_session(scope, &mut p)?;
            let p: TaskListParams = params(method, p)?;
            to_value(exec.task_list(&scope.session_id, p.states.as_deref())?)
        }
        "task.get" => {
            let p: TaskIdParams = params(method, p)?;
            to_value(scoped_task(exec, scope, &p.task_id)?.to_wire())
        }
        "task.output" => {
            let p: TaskOutputParams = params(method, p)?;
            to_value(task_page(&scoped_task(exec, scope, &p.task_id)?, &p))
        }
        "task.wait" => {
            let p: TaskWaitParams = params(method, p)?;
            scoped_task(exec, scope, &p.task_id)?;
            let timeout = Duration::from_millis(p.timeout_ms.unwrap_or(30_000).min(MAX_WAIT_MS));
            let row = exec
                .wait(&p.task_id, timeout)
                .await
                .map_err(exec_err)?
                .ok_or_else(|| {
                    RpcError::new(ErrorKind::NotFound, format!("task {} not found", p.task_id))
                })?;
            to_value(row.to_wire())
        }
        "task.cancel" => {
            let p: TaskCancelParams = params(method, p)?;
            scoped_task(exec, scope, &p.task_id)?;
            let result = exec
                .cancel(&p.task_id, p.grace_ms)
                .await
                .map_err(exec_err)?;
            to_value(TaskCancelResult {
                task_id: p.task_id,
                result,
            })
        }
        "task.request_input" => {
            let p: TaskRequestInputParams = params(method, p)?;
            input::request(exec, scope, p, closed).await
        }
        other => Err(RpcError::new(
            ErrorKind::MethodNotFound,
            format!("method {other:?} is not served on the bridge"),
        )
        .with_hint(format!("the bridge serves: {}", BRIDGE_METHODS.join(", ")))),
    }
}
