//! `sidejob mcp`: an MCP server on stdio, built on the official Rust SDK (`rmcp`), so any
//! MCP-capable agent can use sidejob's tools.
//!
//! - One session per user and workspace (`mcp-<uid>-<hash of the directory>`), so the next
//!   agent run in the same project finds what the last one left unread; `--session ID`
//!   chooses one, `--new-session` makes a fresh one. The daemon closes idle sessions.
//! - Requests are served concurrently (rmcp runs each in its own task). A foreground call
//!   is a foreground `tool.call` on a daemon connection of its own, which the daemon stops
//!   when that connection closes: a cancelled call closes it, and so does this process
//!   ending when the client goes away. Everything else shares one connection ([`Link`]),
//!   made again if the daemon restarts.
//! - A background job's completion is announced at once (`notifications/message`, filtered
//!   by `logging/setLevel`), and every tool result carries the session's unread completions
//!   from the inbox, acked by that result, so each reaches the model once.
//! - Plugin reloads reach the client as `notifications/tools/list_changed`.

mod calls;
mod daemon;
mod tools;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, InitializeRequestParams, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerConfig,
};
#[allow(deprecated)] // logging: still what clients show, through 2025-11-25
use rmcp::model::{LoggingLevel, SetLevelRequestParams};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::protocol::{Notification, ToolInfo};
use daemon::{Daemon, Link};

pub(super) struct McpArgs {
    pub session: Option<String>,
    pub new_session: bool,
    pub adopt: bool,
    pub start_daemon: bool,
}

/// The bytes of output a result carries (the rest is in the job's output.log).
const INLINE_OUTPUT: u64 = 64 * 1024;

struct State {
    link: Link,
    /// Each daemon tool's default `yield_after_ms`.
    yields: Mutex<HashMap<String, u64>>,
    /// The least severe log notification the client wants (`logging/setLevel`), as a rank
    /// of [`level_rank`]; everything by default.
    min_level: AtomicU8,
}

#[derive(Clone)]
struct Server(Arc<State>);

/// Before the daemon is reached, `initialize` answers why it cannot be.
#[derive(Clone)]
struct Unavailable(String);

pub(super) fn run(socket: &Path, a: McpArgs) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(serve(socket, a))
}

/// The session this server works in: the one asked for, a fresh one, or the stable one of
/// this user and directory.
fn session_id(a: &McpArgs) -> Result<String> {
    let uid = crate::sys::getuid();
    if let Some(s) = &a.session {
        return Ok(s.clone());
    }
    if a.new_session {
        return Ok(format!("mcp-{uid}-{}", crate::ids::ulid()));
    }
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    Ok(super::call::derived_session("mcp", uid, &cwd))
}

async fn serve(socket: &Path, a: McpArgs) -> Result<i32> {
    let (push_tx, pushes) = mpsc::unbounded_channel();
    let session = session_id(&a)?;
    let link = match connect(socket, a.start_daemon, push_tx.clone()).await {
        Ok(d) => Link::open(d, socket, session, a.adopt, push_tx).await,
        Err(e) => Err(e),
    };
    let (stdin, stdout) = rmcp::transport::io::stdio_pipes();
    let link = match link {
        Ok(l) => l,
        Err(why) => {
            // The client hears why at `initialize`; say it here too.
            eprintln!("sidejob mcp: {why}");
            let _ = Unavailable(why).serve((stdin, stdout)).await;
            return Ok(1);
        }
    };
    let server = Server(Arc::new(State {
        link,
        yields: Mutex::new(HashMap::new()),
        min_level: AtomicU8::new(0),
    }));
    let running = match server.clone().serve((stdin, stdout)).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sidejob mcp: {e}");
            return Ok(1);
        }
    };
    let peer = running.peer().clone();
    tokio::spawn(relay_pushes(server.0.clone(), peer, pushes));
    running
        .waiting()
        .await
        .context("the MCP connection failed")?;
    // The client went away (stdin closed): returning ends the process, which closes every
    // daemon connection, and so stops the foreground calls still running.
    Ok(0)
}

async fn connect(
    socket: &Path,
    start: bool,
    pushes: mpsc::UnboundedSender<Value>,
) -> std::result::Result<Arc<Daemon>, String> {
    match Daemon::connect(socket, pushes.clone()).await {
        Ok(d) => return Ok(d),
        Err(e) if !start => {
            let why = match e.kind() {
                std::io::ErrorKind::NotFound => "no socket there".to_owned(),
                std::io::ErrorKind::ConnectionRefused => {
                    "the socket is left over from a daemon that stopped".to_owned()
                }
                _ => e.to_string(),
            };
            return Err(format!(
                "no sidejob daemon is listening on {} ({why}); start one with `sidejob serve`, or run `sidejob mcp --start-daemon`",
                socket.display(),
            ));
        }
        Err(_) => {}
    }
    start_daemon(socket)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match Daemon::connect(socket, pushes.clone()).await {
            Ok(d) => return Ok(d),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(format!(
                    "started `sidejob serve` but it did not listen on {} within 20 s ({e})",
                    socket.display()
                ))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// `sidejob serve` on `socket`, detached from this process (its own process group, no
/// stdio: stdout is the MCP channel).
fn start_daemon(socket: &Path) -> std::result::Result<(), String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the sidejob binary: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve")
        .arg("--socket")
        .arg(socket)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn()
        .map(|_| ())
        .map_err(|e| format!("cannot start `sidejob serve`: {e}"))
}

/// The MCP logging levels, least severe first.
#[allow(deprecated)]
fn level_rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// The level a notification of this severity is logged at.
#[allow(deprecated)]
fn level_of(severity: &str) -> LoggingLevel {
    match severity {
        "error" => LoggingLevel::Error,
        "warn" => LoggingLevel::Warning,
        "action_required" => LoggingLevel::Alert,
        "success" => LoggingLevel::Notice,
        _ => LoggingLevel::Info,
    }
}

/// Daemon pushes → MCP notifications: a completion is announced at once (at or above the
/// client's level; the inbox keeps it for the next result either way); a change of tools is
/// `notifications/tools/list_changed`.
async fn relay_pushes(
    state: Arc<State>,
    peer: rmcp::Peer<RoleServer>,
    mut pushes: mpsc::UnboundedReceiver<Value>,
) {
    while let Some(msg) = pushes.recv().await {
        match msg["method"].as_str() {
            Some("notification") => {
                let Ok(n) =
                    serde_json::from_value::<Notification>(msg["params"]["notification"].clone())
                else {
                    continue;
                };
                let level = level_of(&n.severity);
                if n.acked
                    || n.session_id != state.link.session
                    || level_rank(level) < state.min_level.load(Ordering::Relaxed)
                {
                    continue;
                }
                #[allow(deprecated)]
                let param = rmcp::model::LoggingMessageNotificationParam::new(
                    level,
                    json!({"kind": n.kind, "task_id": n.task_id, "severity": n.severity, "text": n.text, "notification_id": n.id}),
                )
                .with_logger("sidejob");
                #[allow(deprecated)]
                let _ = peer.notify_logging_message(param).await;
            }
            Some("tools.changed") => {
                let _ = peer.notify_tool_list_changed().await;
            }
            _ => {}
        }
    }
}

/// What `initialize` says about the server, with or without a daemon.
fn info() -> ServerConfig {
    let info = json!({
        "protocolVersion": ProtocolVersion::LATEST_WITH_INITIALIZE,
        "capabilities": {"tools": {"listChanged": true}, "logging": {}},
        "serverInfo": {"name": "sidejob", "title": "sidejob", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Shell work runs in a sandbox. A call still running after yield_after_ms returns status \"running\" with a task_id and keeps running. \
                         Before you finish, call job_wait with that task_id; or keep working: finished jobs are reported, once, with your next sidejob tool call \
                         (structuredContent.background_completions). Start servers, watchers and long waits with background: true; use job_output / job_stop for them."
    });
    serde_json::from_value(info).unwrap_or_else(|_| InitializeResult::new(Default::default()))
}

/// Every revision this SDK knows that still has the `initialize` handshake: the
/// completions and tool-list notifications are pushed on the session that it opens.
fn protocol_versions() -> Cow<'static, [ProtocolVersion]> {
    Cow::Borrowed(ProtocolVersion::known_up_to(
        &ProtocolVersion::LATEST_WITH_INITIALIZE,
    ))
}

impl ServerHandler for Unavailable {
    fn get_info(&self) -> ServerConfig {
        info()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        protocol_versions()
    }

    async fn initialize(
        &self,
        _request: InitializeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<InitializeResult, McpError> {
        Err(McpError::internal_error(self.0.clone(), None))
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        info()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        protocol_versions()
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<(), McpError> {
        self.0
            .min_level
            .store(level_rank(request.level), Ordering::Relaxed);
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, McpError> {
        let listed = self
            .0
            .link
            .call("tool.list", json!({}))
            .await
            .map_err(|e| McpError::internal_error(calls::rpc_error(e), None))?;
        let infos: Vec<ToolInfo> =
            serde_json::from_value(listed["tools"].clone()).map_err(|e| {
                McpError::internal_error(format!("unexpected tool.list result: {e}"), None)
            })?;
        *self.0.yields.lock().unwrap_or_else(|e| e.into_inner()) = infos
            .iter()
            .map(|t| (t.name.clone(), t.default_yield_after_ms))
            .collect();
        let mut tools: Vec<_> = infos.iter().map(tools::daemon_tool).collect();
        tools.extend(tools::job_tools());
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let args = Value::Object(request.arguments.unwrap_or_default());
        let answer = match name.as_str() {
            "job_list" | "job_output" | "job_wait" | "job_stop" => {
                self.job_tool(&name, &args).await
            }
            _ => self.run_tool(&name, args, &context).await,
        };
        let completions = self.take_completions().await;
        Ok(tools::result(answer, &completions).into())
    }
}
