//! `sidejob hook`: hands a workspace's background completions to an agent client through the
//! client's own hooks and plugins, so they reach the model even after its turn ended (most
//! clients end the agent's run with the turn, and show the model no MCP notification).
//!
//! The session is the one `sidejob mcp` works in for that user and directory; what a hook
//! hands over it acks, keeping only what it acked itself, so each completion reaches the
//! model once, whichever of the hook and `sidejob mcp` takes it first.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::args::HookKindArg as HookKind;
use super::Client;
use crate::protocol::{Notification, Task, TaskState};

pub(super) struct HookArgs {
    pub workspace: Option<PathBuf>,
    pub wait: Duration,
    pub json: bool,
}

pub(super) fn run(socket: &Path, kind: HookKind, a: HookArgs) -> Result<i32> {
    match kind {
        HookKind::Claude => claude(socket, a),
        HookKind::Wait | HookKind::Unread => {
            let workspace = match a.workspace {
                Some(w) => w,
                None => std::env::current_dir().context("cannot read the current directory")?,
            };
            let wait = matches!(kind, HookKind::Wait).then_some(a.wait);
            let taken = Inbox::of(socket, &workspace)?.take(wait)?;
            print(&taken, a.json);
            Ok(0)
        }
    }
}

fn print(taken: &[Notification], json: bool) {
    if json {
        let list: Vec<Value> = taken
            .iter()
            .map(|n| json!({"id": n.id, "task_id": n.task_id, "text": n.text}))
            .collect();
        println!("{}", json!({"completions": list, "text": joined(taken)}));
    } else if !taken.is_empty() {
        println!("{}", joined(taken));
    }
}

fn joined(taken: &[Notification]) -> String {
    taken
        .iter()
        .map(|n| n.text.trim_end())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// A Claude Code hook (`Stop`, `SessionStart`, `UserPromptSubmit`). At `Stop`, while the
/// session has background jobs running, it waits for one to finish (up to `--wait`) and
/// keeps the turn going with what finished; at the start of a session or a prompt it adds
/// what finished meanwhile to the model's context. Nothing to hand over: no output.
fn claude(socket: &Path, a: HookArgs) -> Result<i32> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .context("cannot read the hook's input")?;
    let hook: Value = serde_json::from_str(&input).context("the hook's input is not JSON")?;
    let event = hook["hook_event_name"].as_str().unwrap_or("").to_owned();
    // The project's directory (where Claude Code started `sidejob mcp`), not wherever a
    // command has since moved the shell.
    let workspace = a
        .workspace
        .or_else(|| std::env::var_os("CLAUDE_PROJECT_DIR").map(PathBuf::from))
        .or_else(|| hook["cwd"].as_str().map(PathBuf::from))
        .map_or_else(std::env::current_dir, Ok)
        .context("cannot read the current directory")?;
    let inbox = match Inbox::of(socket, &workspace) {
        Ok(i) => i,
        // No daemon: nothing of sidejob's to hand over, and the agent must not be stopped.
        Err(e) => {
            eprintln!("sidejob hook: {e:#}");
            return Ok(0);
        }
    };
    let out = match event.as_str() {
        "Stop" | "SubagentStop" => {
            let taken = inbox.take(Some(a.wait))?;
            (!taken.is_empty()).then(|| json!({"decision": "block", "reason": joined(&taken)}))
        }
        "SessionStart" | "UserPromptSubmit" => {
            let taken = inbox.take(None)?;
            (!taken.is_empty()).then(|| {
                json!({"hookSpecificOutput": {"hookEventName": event, "additionalContext": joined(&taken)}})
            })
        }
        _ => None,
    };
    if let Some(out) = out {
        println!("{out}");
    }
    Ok(0)
}

/// What of `unread` (`inbox.list`, newest first) this caller's `inbox.ack` took: only those
/// it acked itself (another reader may take some first), oldest first, marked acked. The
/// one rule by which the hooks and `sidejob mcp` hand each completion over once.
pub(super) fn taken(mut unread: Vec<Notification>, ack_reply: &Value) -> Vec<Notification> {
    let acked: Vec<String> = serde_json::from_value(ack_reply["acked"].clone()).unwrap_or_default();
    unread.retain(|n| acked.contains(&n.id));
    unread.reverse();
    for n in &mut unread {
        n.acked = true;
    }
    unread
}

/// The unread completions of one workspace's MCP session.
struct Inbox {
    client: Client,
    session: String,
}

impl Inbox {
    fn of(socket: &Path, workspace: &Path) -> Result<Inbox> {
        let client = Client::connect(socket)?;
        let session = super::call::derived_session("mcp", crate::sys::getuid(), workspace);
        Ok(Inbox { client, session })
    }

    /// What is unread now; with `wait`, and nothing unread, first waits (up to `wait`) while
    /// a background job of the session is still running, for the next completion.
    fn take(mut self, wait: Option<Duration>) -> Result<Vec<Notification>> {
        let taken = self.take_unread()?;
        let Some(wait) = wait else {
            return Ok(taken);
        };
        if !taken.is_empty() || !self.has_live_jobs()? {
            return Ok(taken);
        }
        let deadline = Instant::now() + wait;
        // Subscribing pushes what is still unacked, so a job that ends just before this is
        // not missed.
        self.client
            .call("events.subscribe", json!({ "session_ids": [self.session] }))?;
        eprintln!(
            "sidejob: waiting up to {} s for the background jobs of session {}",
            wait.as_secs(),
            self.session
        );
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            self.client.set_read_timeout(Some(left))?;
            match self.client.next_push() {
                Ok(Some(p)) if p["method"] == "notification" => {
                    self.client.set_read_timeout(None)?;
                    let taken = self.take_unread()?;
                    if !taken.is_empty() {
                        return Ok(taken);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return Ok(Vec::new()),
                // Timed out: let the turn end.
                Err(_) => return Ok(Vec::new()),
            }
        }
    }

    /// Unread notifications, oldest first, acked: only those this call acked itself.
    fn take_unread(&mut self) -> Result<Vec<Notification>> {
        let listed = match self.client.call(
            "inbox.list",
            json!({"session_id": self.session, "unread_only": true}),
        ) {
            Ok(l) => l,
            // No such session yet: nothing was ever started there.
            Err(e) if e.kind() == Some("not_found") => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let unread: Vec<Notification> = serde_json::from_value(listed["notifications"].clone())
            .context("unexpected inbox.list result")?;
        if unread.is_empty() {
            return Ok(unread);
        }
        let ids: Vec<&str> = unread.iter().map(|n| n.id.as_str()).collect();
        let acked = self.client.call("inbox.ack", json!({ "ids": ids }))?;
        Ok(taken(unread, &acked))
    }

    /// Whether a job the model started in the background is still going (services, which
    /// run until stopped, do not count).
    fn has_live_jobs(&mut self) -> Result<bool> {
        let r = match self.client.call(
            "task.list",
            json!({"session_id": self.session, "states": ["queued", "running", "awaiting_input"]}),
        ) {
            Ok(r) => r,
            Err(e) if e.kind() == Some("not_found") => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let tasks: Vec<Task> =
            serde_json::from_value(r["tasks"].clone()).context("unexpected task.list result")?;
        Ok(tasks
            .iter()
            .any(|t| !t.service && !matches!(t.state, TaskState::Scheduled)))
    }
}
