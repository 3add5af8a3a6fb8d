//! What each MCP tool call does against the daemon: a run (a foreground `tool.call` on a
//! connection of its own, cancelled by closing it; or a background one), or one of the
//! `job_*` tools; and the background completions a result carries, taken from the inbox.

use rmcp::service::{RequestContext, RoleServer};
use serde_json::{json, Value};

use super::daemon::Daemon;
use super::{tools, Server, INLINE_OUTPUT};
use crate::protocol::{CompletedCall, Notification, RpcError, Task, TaskState, ToolCallResult};

/// The most output `job_output` / `job_wait` return at once (`max_bytes`).
const MAX_OUTPUT: u64 = 1 << 20;

pub(super) fn rpc_error(e: RpcError) -> String {
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

/// What a tool call answers: the text for `content`, the `structuredContent`, whether it is
/// an error, and the task whose outcome it reports (whose own completion is then not
/// reported apart). An answer that a job is still running reports none: if the job ends
/// before the result is put together, its completion comes with this result.
pub(super) struct Answer {
    pub text: String,
    pub structured: Value,
    pub is_error: bool,
    pub task_id: Option<String>,
}

impl Answer {
    fn error(text: String) -> Answer {
        Answer {
            text,
            structured: json!({}),
            is_error: true,
            task_id: None,
        }
    }
}

/// The guidance a `running` result carries, in `structuredContent.next` and its text: the
/// only way a job's result reaches the model in clients that end the run with the turn.
fn still_running(task_id: &str) -> String {
    format!(
        "Job {task_id} is still running in the background. Before you finish, call job_wait with task_id \"{task_id}\" to get its result; \
         or keep working: its result comes with your next sidejob tool call."
    )
}

/// The answer that job `task_id` is still running, with its output so far and `fields`
/// added to `structuredContent`. It reports no task's outcome (see [`Answer`]): a job that
/// ends between the daemon's reply and this result has its completion taken from the inbox
/// for this result, and would otherwise be acked there and never shown.
fn running(task_id: &str, output: String, fields: Value) -> Answer {
    let next = still_running(task_id);
    let mut structured =
        json!({"status": "running", "task_id": task_id, "output": output, "next": next});
    if let (Some(all), Value::Object(more)) = (structured.as_object_mut(), fields) {
        all.extend(more);
    }
    Answer {
        text: format!("{output}\n[{next}]"),
        structured,
        is_error: false,
        task_id: None,
    }
}

impl Server {
    /// This session's unread notifications, oldest first, acked by this call: only those
    /// this call acked itself are returned (another client of the session, a hook or
    /// `sidejob inbox --ack` may take some first), so each reaches one result.
    pub(super) async fn take_completions(&self) -> Vec<Notification> {
        let link = &self.0.link;
        let Ok(listed) = link
            .call(
                "inbox.list",
                json!({"session_id": link.session, "unread_only": true}),
            )
            .await
        else {
            return Vec::new();
        };
        let unread: Vec<Notification> =
            serde_json::from_value(listed["notifications"].clone()).unwrap_or_default();
        if unread.is_empty() {
            return unread;
        }
        let ids: Vec<&str> = unread.iter().map(|n| n.id.as_str()).collect();
        let Ok(acked) = link.call("inbox.ack", json!({ "ids": ids })).await else {
            return Vec::new();
        };
        crate::cli::hook::taken(unread, &acked)
    }

    async fn output_tail(&self, task_id: &str, max: u64) -> (String, bool) {
        let q = json!({"task_id": task_id, "tail_bytes": max, "max_bytes": max});
        match self.0.link.call("task.output", q).await {
            Ok(p) => (
                p["data"].as_str().unwrap_or("").to_owned(),
                p["offset"].as_u64().unwrap_or(0) > 0,
            ),
            Err(_) => (String::new(), false),
        }
    }

    pub(super) async fn run_tool(
        &self,
        name: &str,
        mut args: Value,
        ctx: &RequestContext<RoleServer>,
    ) -> Answer {
        let link = &self.0.link;
        let mut background = false;
        let mut yield_ms = None;
        if let Some(obj) = args.as_object_mut() {
            if let Some(b) = obj.remove("background").and_then(|v| v.as_bool()) {
                background = b;
            }
            yield_ms = obj.remove("yield_after_ms").and_then(|v| v.as_u64());
        }
        let mut call = json!({"session_id": link.session, "tool": name, "args": args});
        if link.adopt {
            call["adopt"] = json!(true);
        }
        let reply = if background {
            call["background"] = json!(true);
            link.call("tool.call", call).await
        } else {
            // A foreground call: the daemon decides once whether it completes inline or
            // yields, so a quick run is never also a wake. On a connection of its own that
            // this server closes when the client cancels, and that closes with this process
            // when the client goes away: either way the daemon stops the run.
            if let Some(y) = yield_ms {
                call["yield_after_ms"] = json!(y);
            }
            call["on_disconnect"] = json!("cancel");
            // Refused here, before a connection is made for it.
            if let Err(e) = super::daemon::check_size(call.to_string().len()) {
                return Answer::error(rpc_error(e));
            }
            let fg = match link.get().await {
                Ok(_) => Daemon::connect_quiet(&link.socket).await.map_err(|e| {
                    RpcError::new(
                        crate::protocol::ErrorKind::Internal,
                        format!("cannot connect to the sidejob daemon: {e}"),
                    )
                }),
                Err(e) => Err(e),
            };
            let fg = match fg {
                Ok(fg) => fg,
                Err(e) => return Answer::error(rpc_error(e)),
            };
            tokio::select! {
                r = fg.call("tool.call", call) => r,
                _ = ctx.ct.cancelled() => {
                    drop(fg);
                    return Answer::error("the call was cancelled; its run is stopped".into());
                }
            }
        };
        match reply.map(serde_json::from_value::<ToolCallResult>) {
            Ok(Ok(ToolCallResult::Completed(c))) => completed_call(&c),
            Ok(Ok(ToolCallResult::Running(r))) => running(
                &r.task_id,
                r.output,
                json!({"output_path": r.output_path, "result_path": r.result_path}),
            ),
            Ok(Err(e)) => Answer::error(format!("unexpected tool.call result: {e}")),
            Err(e) => Answer::error(rpc_error(e)),
        }
    }

    /// A `job_*` tool. Each acts only on a job of this connection's session.
    pub(super) async fn job_tool(&self, name: &str, args: &Value) -> Answer {
        let link = &self.0.link;
        if name == "job_list" {
            return match link
                .call("task.list", json!({ "session_id": link.session }))
                .await
            {
                Ok(r) => {
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
                    Answer {
                        text,
                        structured: json!({ "jobs": tasks }),
                        is_error: false,
                        task_id: None,
                    }
                }
                Err(e) => Answer::error(rpc_error(e)),
            };
        }
        let Some(task_id) = args["task_id"].as_str() else {
            return Answer::error(format!("{name} needs a task_id"));
        };
        let task = match self.own_task(task_id).await {
            Ok(t) => t,
            Err(e) => return Answer::error(e),
        };
        let max = args["max_bytes"]
            .as_u64()
            .unwrap_or(INLINE_OUTPUT)
            .min(MAX_OUTPUT);
        let outcome = match name {
            "job_output" => {
                let mut q = json!({"task_id": task_id, "max_bytes": max});
                match args.get("offset").and_then(Value::as_u64) {
                    Some(o) => q["offset"] = json!(o),
                    None => q["tail_bytes"] = json!(max),
                }
                link.call("task.output", q).await.map(|r| {
                    let data = r["data"].as_str().unwrap_or("").to_owned();
                    Answer {
                        text: data.clone(),
                        structured: json!({"output": data, "next_offset": r["next_offset"], "eof": r["eof"]}),
                        is_error: false,
                        task_id: None,
                    }
                })
            }
            "job_wait" => {
                let timeout = args.get("timeout_ms").cloned().unwrap_or(json!(30_000));
                let waited = link
                    .call(
                        "task.wait",
                        json!({"task_id": task_id, "timeout_ms": timeout}),
                    )
                    .await;
                match waited.map(serde_json::from_value::<Task>) {
                    Ok(Ok(t)) => Ok(self.finished_or_not(&t, max).await),
                    Ok(Err(e)) => Ok(Answer::error(format!("unexpected task.wait result: {e}"))),
                    Err(e) => Err(e),
                }
            }
            "job_stop" => {
                // The agent asked for the stop: it hears the outcome here, not in a wake.
                let stopped = link
                    .call("task.cancel", json!({"task_id": task_id, "wake": "silent"}))
                    .await;
                match stopped {
                    Ok(r) => {
                        let result = r["result"].as_str().unwrap_or("?").to_owned();
                        // Takes the result (a wait), so the task is not left undelivered.
                        let now = link
                            .call("task.wait", json!({"task_id": task_id, "timeout_ms": 0}))
                            .await
                            .ok()
                            .and_then(|t| serde_json::from_value::<Task>(t).ok())
                            .unwrap_or(task);
                        Ok(Answer {
                            text: format!(
                                "{}: {}",
                                result.replace('_', " "),
                                tools::describe_task(&now)
                            ),
                            structured: json!({"task_id": task_id, "result": result, "state": now.state}),
                            is_error: false,
                            task_id: Some(task_id.to_owned()),
                        })
                    }
                    Err(e) => Err(e),
                }
            }
            other => Ok(Answer::error(format!("unknown tool {other}"))),
        };
        outcome.unwrap_or_else(|e| Answer::error(rpc_error(e)))
    }

    /// A task of this connection's session, or why not: another session's id is as good as
    /// unknown here.
    async fn own_task(&self, task_id: &str) -> Result<Task, String> {
        let link = &self.0.link;
        let not_here = || format!("no job {task_id} in this session (job_list shows its jobs)");
        let got = link
            .call("task.get", json!({ "task_id": task_id }))
            .await
            .map_err(|e| match e.data.as_ref().and_then(|d| d["kind"].as_str()) {
                Some("not_found" | "permission_denied") => not_here(),
                _ => rpc_error(e),
            })?;
        let task: Task =
            serde_json::from_value(got).map_err(|e| format!("unexpected task.get result: {e}"))?;
        if task.session_id != link.session {
            return Err(not_here());
        }
        Ok(task)
    }

    /// `job_wait`'s answer: a settled job with its output, or one still running.
    async fn finished_or_not(&self, t: &Task, max: u64) -> Answer {
        if !t.state.is_terminal() {
            let (output, _) = self.output_tail(&t.task_id, max).await;
            return running(&t.task_id, output, json!({"state": t.state, "task": t}));
        }
        let (output, cut) = self.output_tail(&t.task_id, max).await;
        let failed = t.state != TaskState::Succeeded;
        let mut text = format!("{}\n{output}", tools::describe_task(t));
        if failed {
            push_failure(
                &mut text,
                t.reason.map(|r| r.as_str()).unwrap_or(t.state.as_str()),
                t.exit_code,
                t.error.as_deref(),
            );
        }
        Answer {
            text,
            structured: json!({
                "status": "completed",
                "task_id": t.task_id,
                "state": t.state,
                "exit_code": t.exit_code,
                "output": output,
                "output_truncated": cut || t.output_truncated.unwrap_or(false),
                "duration_ms": t.duration_ms.unwrap_or(0),
                "result_path": t.result_path,
                "task": t,
            }),
            is_error: false,
            task_id: Some(t.task_id.clone()),
        }
    }
}

/// `[reason, exit code N]` and the error, after the output.
fn push_failure(text: &mut String, why: &str, exit_code: Option<i32>, error: Option<&str>) {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "[{why}{}]",
        exit_code
            .map(|c| format!(", exit code {c}"))
            .unwrap_or_default()
    ));
    if let Some(e) = error {
        text.push_str(&format!("\n{e}"));
    }
}

/// A run that settled inline.
fn completed_call(c: &CompletedCall) -> Answer {
    let failed = c.state != TaskState::Succeeded;
    let mut text = c.output.clone();
    if failed {
        let why = c.reason.map(|r| r.as_str()).unwrap_or(c.state.as_str());
        push_failure(&mut text, why, c.exit_code, c.error.as_deref());
    }
    if let Some(h) = &c.hint {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("[hint: {h}]"));
    }
    let mut structured = json!({
        "status": "completed",
        "task_id": c.task_id,
        "state": c.state,
        "exit_code": c.exit_code,
        "output": c.output,
        "output_truncated": c.output_truncated,
        "duration_ms": c.duration_ms,
    });
    if let Some(h) = &c.hint {
        structured["hint"] = json!(h);
    }
    Answer {
        text,
        structured,
        is_error: failed,
        task_id: Some(c.task_id.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion_of(task_id: &str) -> Notification {
        Notification {
            id: "n-1".into(),
            session_id: "s-1".into(),
            task_id: Some(task_id.into()),
            severity: "success".into(),
            kind: "wake".into(),
            text: format!("[automatic] job {task_id} succeeded"),
            created_at: "2026-12-07T00:00:00Z".into(),
            acked: false,
        }
    }

    fn reported(r: &rmcp::model::CallToolResult) -> Vec<Value> {
        r.structured_content.as_ref().expect("structured")["background_completions"]
            .as_array()
            .expect("background_completions")
            .clone()
    }

    /// A job that ends between the daemon's "running" reply and the result: its completion,
    /// taken from the inbox for this result, is in it (it was once dropped as the answer's own).
    #[test]
    fn a_running_answer_carries_its_own_jobs_completion_taken_with_it() {
        let r = tools::result(
            running("T1", "so far".into(), json!({})),
            &[completion_of("T1")],
        );
        assert_eq!(reported(&r).len(), 1, "{:?}", r.structured_content);
        assert_eq!(r.content.len(), 2, "its own text and the update");
    }

    /// An answer that reports its task's outcome does not report its completion again.
    #[test]
    fn a_completed_answer_does_not_repeat_its_own_completion() {
        let c: CompletedCall = serde_json::from_value(json!({
            "task_id": "T1", "state": "succeeded", "exit_code": 0, "output": "done\n",
            "output_truncated": false, "duration_ms": 1, "output_path": "/o", "result_path": "/r"
        }))
        .expect("a completed call");
        let r = tools::result(
            completed_call(&c),
            &[completion_of("T1"), completion_of("T2")],
        );
        let ids: Vec<_> = reported(&r).iter().map(|n| n["task_id"].clone()).collect();
        assert_eq!(ids, [json!("T2")]);
    }
}
