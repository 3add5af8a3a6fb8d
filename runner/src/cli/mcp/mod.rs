//! `sidejob mcp`: an MCP server on stdio, built on the official Rust SDK (`rmcp`), so any
//! MCP-capable agent can use sidejob's tools.
//!
//! - One session per MCP connection (`mcp-<uid>-<ulid>`), shared only with `--session ID`.
//! - Requests are served concurrently (rmcp runs each in its own task); they share one
//!   daemon connection, matched by id.
//! - A tool call starts its run detached and waits for it on the daemon (`task.wait`), so
//!   its task id is known at once: `notifications/cancelled` cancels that task.
//! - A background job's completion arrives as its own MCP notification
//!   (`notifications/message`) as soon as it happens, and as a separate, labelled content
//!   block on the next tool result (then it is acked).
//! - Plugin reloads reach the client as `notifications/tools/list_changed`.

mod calls;
mod daemon;
mod tools;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, InitializeRequestParams,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::protocol::{Notification, ToolInfo};
use daemon::Daemon;

pub(super) struct McpArgs {
    pub session: Option<String>,
    pub adopt: bool,
    pub start_daemon: bool,
}

/// The bytes of output a result carries (the rest is in the job's output.log).
const INLINE_OUTPUT: u64 = 64 * 1024;

struct State {
    /// `Err`: why there is no daemon; `initialize` answers it.
    daemon: std::result::Result<Arc<Daemon>, String>,
    session: String,
    adopt: bool,
    /// Background completions not yet shown in a result.
    unreported: Mutex<Vec<Notification>>,
    /// Each daemon tool's default `yield_after_ms`.
    yields: Mutex<HashMap<String, u64>>,
}

#[derive(Clone)]
struct Server(Arc<State>);

pub(super) fn run(socket: &Path, a: McpArgs) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(serve(socket, a))
}

async fn serve(socket: &Path, a: McpArgs) -> Result<i32> {
    let (push_tx, pushes) = mpsc::unbounded_channel();
    let session = a
        .session
        .clone()
        .unwrap_or_else(|| format!("mcp-{}-{}", crate::sys::getuid(), crate::ids::ulid()));
    let daemon = connect(socket, a.start_daemon, push_tx)
        .await
        .map_err(|e| e.to_string());
    let daemon = match daemon {
        Ok(d) => open_session(&d, &session, a.adopt).await.map(|_| d),
        Err(e) => Err(e),
    };
    let server = Server(Arc::new(State {
        daemon,
        session,
        adopt: a.adopt,
        unreported: Mutex::new(Vec::new()),
        yields: Mutex::new(HashMap::new()),
    }));
    let (stdin, stdout) = rmcp::transport::io::stdio_pipes();
    let running = match server.clone().serve((stdin, stdout)).await {
        Ok(r) => r,
        Err(e) => {
            // The client has the reason (the initialize error); say it here too.
            if let Err(why) = &server.0.daemon {
                eprintln!("sidejob mcp: {why}");
            } else {
                eprintln!("sidejob mcp: {e}");
            }
            return Ok(1);
        }
    };
    let peer = running.peer().clone();
    tokio::spawn(relay_pushes(server.0.clone(), peer, pushes));
    running
        .waiting()
        .await
        .context("the MCP connection failed")?;
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

async fn open_session(d: &Daemon, session: &str, adopt: bool) -> std::result::Result<(), String> {
    let cwd: PathBuf =
        std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    let mut p = json!({"session_id": session, "workspace": cwd});
    if adopt {
        p["adopt"] = json!(true);
    }
    d.call("session.open", p)
        .await
        .map_err(|e| format!("cannot open session {session}: {}", e.message))?;
    d.call("events.subscribe", json!({ "session_ids": [session] }))
        .await
        .map_err(|e| format!("cannot subscribe to session {session}: {}", e.message))?;
    Ok(())
}

/// Daemon pushes → MCP notifications: a completion is announced at once (and kept for the
/// next result); a change of tools is `notifications/tools/list_changed`.
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
                if n.acked || n.session_id != state.session {
                    continue;
                }
                {
                    let mut un = state.unreported.lock().unwrap_or_else(|e| e.into_inner());
                    if un.iter().any(|x| x.id == n.id) {
                        continue;
                    }
                    un.push(n.clone());
                }
                let level = match n.severity.as_str() {
                    "error" => "error",
                    "warn" => "warning",
                    "action_required" => "alert",
                    "success" => "notice",
                    _ => "info",
                };
                let param = serde_json::from_value(json!({
                    "level": level,
                    "logger": "sidejob",
                    "data": {"kind": n.kind, "task_id": n.task_id, "severity": n.severity, "text": n.text, "notification_id": n.id}
                }));
                if let Ok(param) = param {
                    #[allow(deprecated)] // still the notification clients show, through 2025-11-25
                    let _ = peer.notify_logging_message(param).await;
                }
            }
            Some("tools.changed") => {
                let _ = peer.notify_tool_list_changed().await;
            }
            _ => {}
        }
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let info = json!({
            "protocolVersion": ProtocolVersion::LATEST_WITH_INITIALIZE,
            "capabilities": {"tools": {"listChanged": true}, "logging": {}},
            "serverInfo": {"name": "sidejob", "title": "sidejob", "version": env!("CARGO_PKG_VERSION")},
            "instructions": "Shell work runs in a sandbox. A call still running after yield_after_ms returns a job id and keeps running; \
                             when a background job finishes you get a notification, and the next tool result carries it as a separate \
                             content block. Run waits on CI, deploys and servers with background: true; use job_wait / job_output / job_stop."
        });
        serde_json::from_value(info).unwrap_or_else(|_| InitializeResult::new(Default::default()))
    }

    /// Every revision this SDK knows that still has the `initialize` handshake: the
    /// completions and tool-list notifications are pushed on the session that it opens.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<InitializeResult, McpError> {
        if let Err(why) = &self.0.daemon {
            return Err(McpError::internal_error(why.clone(), None));
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, McpError> {
        let d = self.daemon()?;
        let listed = d
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
        let d = self.daemon()?.clone();
        let name = request.name.to_string();
        let args = Value::Object(request.arguments.unwrap_or_default());
        let (text, structured, is_error) = match name.as_str() {
            "job_list" | "job_output" | "job_wait" | "job_stop" => {
                self.job_tool(&d, &name, &args).await
            }
            _ => self.run_tool(&d, &name, args, &context).await,
        };
        let completions = self.take_completions(&d).await;
        let result: CallToolResult = tools::result(text, structured, is_error, &completions);
        Ok(result.into())
    }
}
