//! What each MCP tool call does against the daemon: a run (started detached, then waited
//! for up to its yield, cancelled if the client cancels), or one of the `job_*` tools.

use std::sync::Arc;

use rmcp::service::{RequestContext, RoleServer};
use rmcp::ErrorData as McpError;
use serde_json::{json, Value};

use super::daemon::Daemon;
use super::{tools, Server, INLINE_OUTPUT};
use crate::protocol::{Notification, Task, TaskState, ToolCallResult};

pub(super) fn rpc_error(e: crate::protocol::RpcError) -> String {
    match e
        .data
        .as_ref()
        .and_then(|d| d.get("hint"))
        .and_then(Value::as_str)
    {
        Some(h) => format!("{}; {h}", e.message),
        None => e.message,
    }
}

impl Server {
    pub(super) fn daemon(&self) -> std::result::Result<&Arc<Daemon>, McpError> {
        self.0
            .daemon
            .as_ref()
            .map_err(|e| McpError::internal_error(e.clone(), None))
    }

    /// Takes the completions to report with a result, and acks them.
    pub(super) async fn take_completions(&self, d: &Daemon) -> Vec<Notification> {
        let taken: Vec<Notification> =
            std::mem::take(&mut *self.0.unreported.lock().unwrap_or_else(|e| e.into_inner()));
        if !taken.is_empty() {
            let ids: Vec<&str> = taken.iter().map(|n| n.id.as_str()).collect();
            let _ = d.call("inbox.ack", json!({ "ids": ids })).await;
        }
        taken
    }

    pub(super) async fn output_tail(&self, d: &Daemon, task_id: &str) -> (String, bool) {
        match d
            .call("task.output", json!({"task_id": task_id, "tail_bytes": INLINE_OUTPUT, "max_bytes": INLINE_OUTPUT}))
            .await
        {
            Ok(p) => (
                p["data"].as_str().unwrap_or("").to_owned(),
                p["offset"].as_u64().unwrap_or(0) > 0,
            ),
            Err(_) => (String::new(), false),
        }
    }

    pub(super) async fn run_tool(
        &self,
        d: &Daemon,
        name: &str,
        mut args: Value,
        ctx: &RequestContext<RoleServer>,
    ) -> (String, Value, bool) {
        let mut background = false;
        let mut yield_ms = self
            .0
            .yields
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .copied()
            .unwrap_or(30_000);
        if let Some(obj) = args.as_object_mut() {
            if let Some(b) = obj.remove("background").and_then(|v| v.as_bool()) {
                background = b;
            }
            if let Some(y) = obj.remove("yield_after_ms").and_then(|v| v.as_u64()) {
                yield_ms = y;
            }
        }
        let mut call =
            json!({"session_id": self.0.session, "tool": name, "args": args, "background": true});
        if self.0.adopt {
            call["adopt"] = json!(true);
        }
        let started = match d.call("tool.call", call).await {
            Ok(r) => r,
            Err(e) => return (rpc_error(e), json!({}), true),
        };
        let task_id = match serde_json::from_value::<ToolCallResult>(started) {
            Ok(ToolCallResult::Running(r)) => r.task_id,
            Ok(ToolCallResult::Completed(c)) => {
                let text = c.error.clone().unwrap_or_else(|| c.output.clone());
                return (
                    text,
                    json!({"status": "completed", "task_id": c.task_id, "state": c.state}),
                    true,
                );
            }
            Err(e) => return (format!("unexpected tool.call result: {e}"), json!({}), true),
        };
        if !background && yield_ms > 0 {
            let waited = tokio::select! {
                w = d.call("task.wait", json!({"task_id": task_id, "timeout_ms": yield_ms})) => w,
                _ = ctx.ct.cancelled() => {
                    let _ = d.call("task.cancel", json!({ "task_id": task_id })).await;
                    return (format!("job {task_id} was canceled"), json!({"status": "completed", "task_id": task_id, "state": "canceled"}), true);
                }
            };
            if let Ok(task) = waited.and_then(|t| {
                serde_json::from_value::<Task>(t).map_err(|e| {
                    crate::protocol::RpcError::new(
                        crate::protocol::ErrorKind::Internal,
                        e.to_string(),
                    )
                })
            }) {
                if task.state.is_terminal() {
                    return self.completed(d, &task).await;
                }
            }
        }
        let (output, _) = self.output_tail(d, &task_id).await;
        let text = format!(
            "{output}\n[still running in the background as job {task_id}; you will be told when it finishes, or use job_wait / job_output]"
        );
        (
            text,
            json!({"status": "running", "task_id": task_id, "output": output}),
            false,
        )
    }

    pub(super) async fn completed(&self, d: &Daemon, t: &Task) -> (String, Value, bool) {
        let (output, cut) = self.output_tail(d, &t.task_id).await;
        let failed = t.state != TaskState::Succeeded;
        let mut text = output.clone();
        if failed {
            let why = t.reason.map(|r| r.as_str()).unwrap_or(t.state.as_str());
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "[{why}{}]",
                t.exit_code
                    .map(|c| format!(", exit code {c}"))
                    .unwrap_or_default()
            ));
            if let Some(e) = &t.error {
                text.push_str(&format!("\n{e}"));
            }
        }
        let structured = json!({
            "status": "completed",
            "task_id": t.task_id,
            "state": t.state,
            "exit_code": t.exit_code,
            "output": output,
            "output_truncated": cut || t.output_truncated.unwrap_or(false),
            "duration_ms": t.duration_ms.unwrap_or(0),
        });
        (text, structured, failed)
    }

    pub(super) async fn job_tool(
        &self,
        d: &Daemon,
        name: &str,
        args: &Value,
    ) -> (String, Value, bool) {
        let task_id = args["task_id"].clone();
        let outcome = match name {
            "job_list" => d
                .call("task.list", json!({ "session_id": self.0.session }))
                .await
                .map(|r| {
                    let tasks: Vec<Task> =
                        serde_json::from_value(r["tasks"].clone()).unwrap_or_default();
                    let lines: Vec<String> = tasks
                        .iter()
                        .map(|t| format!("{} {} {}", t.task_id, t.state.as_str(), t.summary))
                        .collect();
                    let text = if lines.is_empty() {
                        "no jobs".to_owned()
                    } else {
                        lines.join("\n")
                    };
                    (text, json!({ "jobs": tasks }), false)
                }),
            "job_output" => {
                let mut q = json!({"task_id": task_id, "max_bytes": INLINE_OUTPUT});
                match args.get("offset").and_then(Value::as_u64) {
                    Some(o) => q["offset"] = json!(o),
                    None => q["tail_bytes"] = json!(INLINE_OUTPUT),
                }
                d.call("task.output", q).await.map(|r| {
                    let data = r["data"].as_str().unwrap_or("").to_owned();
                    (
                        data.clone(),
                        json!({"output": data, "next_offset": r["next_offset"], "eof": r["eof"]}),
                        false,
                    )
                })
            }
            "job_wait" => {
                let timeout = args.get("timeout_ms").cloned().unwrap_or(json!(30_000));
                d.call(
                    "task.wait",
                    json!({"task_id": task_id, "timeout_ms": timeout}),
                )
                .await
                .map(|t| match serde_json::from_value::<Task>(t.clone()) {
                    Ok(task) => (
                        tools::describe_task(&task),
                        json!({ "task": t }),
                        task.state == TaskState::Failed,
                    ),
                    Err(e) => (format!("unexpected task.wait result: {e}"), json!({}), true),
                })
            }
            "job_stop" => d
                .call("task.cancel", json!({ "task_id": task_id }))
                .await
                .map(|r| {
                    let result = r["result"].as_str().unwrap_or("?").to_owned();
                    (
                        result.replace('_', " "),
                        json!({"task_id": task_id, "result": result}),
                        false,
                    )
                }),
            other => Ok((format!("unknown tool {other}"), json!({}), true)),
        };
        outcome.unwrap_or_else(|e| (rpc_error(e), json!({}), true))
    }
}
