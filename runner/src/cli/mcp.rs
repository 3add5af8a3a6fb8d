//! `sidejob mcp`: an MCP server on stdio, so any MCP-capable agent can use sidejob's tools.
//!
//! Each daemon tool is offered as an MCP tool (with `background` and `yield_after_ms` added to
//! its schema), plus `job_list`, `job_output`, `job_wait` and `job_stop` for background work.
//! MCP has no way to start a turn, so wakes ride along: every tool result ends with the
//! session's unread notifications (which are then acked), and `job_wait` blocks on a task.

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{Client, ClientError};

const PROTOCOL_VERSION: &str = "2024-11-05";

pub fn run(socket: &Path, session: Option<String>) -> Result<i32> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let session = session.unwrap_or_else(|| super::commands::default_session(&cwd));
    let mut client = Client::connect(socket)?;
    client.call(
        "session.open",
        json!({"session_id": session, "workspace": cwd}),
    )?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let msg: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                reply(
                    &mut out,
                    Value::Null,
                    Err((-32700, format!("parse error: {e}"))),
                )?;
                continue;
            }
        };
        let Some(id) = msg.get("id").cloned() else {
            continue;
        }; // notifications need no answer
        let method = msg["method"].as_str().unwrap_or("");
        let params = msg.get("params").cloned().unwrap_or(json!({}));
        let result = match method {
            "initialize" => Ok(json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": "sidejob", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "Shell work runs in a sandbox. Calls that take longer than yield_after_ms return a job id and keep running; finished background jobs are reported at the end of later tool results. Run waits on CI, deploys and servers with background: true."
            })),
            "ping" => Ok(json!({})),
            "tools/list" => tools_list(&mut client).map_err(|e| (-32603, e.to_string())),
            "tools/call" => Ok(tools_call(&mut client, &session, &params)),
            other => Err((-32601, format!("unknown method {other:?}"))),
        };
        reply(&mut out, id, result)?;
    }
    Ok(0)
}

fn reply(out: &mut impl Write, id: Value, result: Result<Value, (i64, String)>) -> Result<()> {
    let msg = match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    };
    writeln!(out, "{msg}")?;
    out.flush()?;
    Ok(())
}

fn job_tools() -> Vec<Value> {
    let id = json!({"type": "string", "description": "The job's task id"});
    vec![
        json!({"name": "job_list", "description": "List this session's jobs: running ones and recent finished ones.", "inputSchema": {"type": "object", "properties": {}}}),
        json!({"name": "job_output", "description": "Read a job's output (the last 64 KiB unless offset is given).", "inputSchema": {"type": "object", "properties": {"task_id": id, "offset": {"type": "integer"}}, "required": ["task_id"]}}),
        json!({"name": "job_wait", "description": "Wait for a job to finish (up to timeout_ms, default 30000) and report how it ended.", "inputSchema": {"type": "object", "properties": {"task_id": id, "timeout_ms": {"type": "integer"}}, "required": ["task_id"]}}),
        json!({"name": "job_stop", "description": "Stop a job: SIGTERM to all of it, SIGKILL after a grace.", "inputSchema": {"type": "object", "properties": {"task_id": id}, "required": ["task_id"]}}),
    ]
}

fn tools_list(client: &mut Client) -> Result<Value, ClientError> {
    let listed = client.call("tool.list", json!({}))?;
    let mut tools: Vec<Value> = listed["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            let mut schema = t["input_schema"].clone();
            if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
                props.insert("background".into(), json!({"type": "boolean", "description": "Run in the background now; the result is reported when it finishes"}));
                props.insert("yield_after_ms".into(), json!({"type": "integer", "description": "Move to the background after this long (default 30000)"}));
            }
            json!({"name": t["name"], "description": t["description"], "inputSchema": schema})
        })
        .collect();
    tools.extend(job_tools());
    Ok(json!({"tools": tools}))
}

fn text_result(text: String, is_error: bool) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": is_error})
}

fn tools_call(client: &mut Client, session: &str, p: &Value) -> Value {
    let name = p["name"].as_str().unwrap_or("");
    let mut args = p.get("arguments").cloned().unwrap_or(json!({}));
    let outcome = match name {
        "job_list" => client.call("task.list", json!({"session_id": session})).map(|r| {
            let lines: Vec<String> = r["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| format!("{} {} {}", t["task_id"].as_str().unwrap_or("?"), t["state"].as_str().unwrap_or("?"), t["summary"].as_str().unwrap_or("")))
                .collect();
            (if lines.is_empty() { "no jobs".to_owned() } else { lines.join("\n") }, false)
        }),
        "job_output" => {
            let mut q = json!({"task_id": args["task_id"], "max_bytes": 65536});
            match args.get("offset").and_then(Value::as_u64) {
                Some(o) => q["offset"] = json!(o),
                None => q["tail_bytes"] = json!(65536),
            }
            client.call("task.output", q).map(|r| (r["data"].as_str().unwrap_or("").to_owned(), false))
        }
        "job_wait" => client
            .call("task.wait", json!({"task_id": args["task_id"], "timeout_ms": args.get("timeout_ms").cloned().unwrap_or(json!(30_000))}))
            .map(|t| (describe_task(&t), t["state"] == "failed")),
        "job_stop" => client.call("task.cancel", json!({"task_id": args["task_id"]})).map(|r| (r["result"].as_str().unwrap_or("?").to_owned(), false)),
        tool => {
            let mut call = json!({"session_id": session, "tool": tool});
            if let Some(obj) = args.as_object_mut() {
                for key in ["background", "yield_after_ms"] {
                    if let Some(v) = obj.remove(key) {
                        call[key] = v;
                    }
                }
            }
            call["args"] = args;
            client.call("tool.call", call).map(|r| match r["status"].as_str() {
                Some("completed") => {
                    let mut text = r["output"].as_str().unwrap_or("").to_owned();
                    if r["state"] != "succeeded" {
                        text.push_str(&format!("\n[{}{}]", r["reason"].as_str().unwrap_or("failed"), r["exit_code"].as_i64().map(|c| format!(", exit code {c}")).unwrap_or_default()));
                    }
                    if let Some(h) = r["hint"].as_str() {
                        text.push_str(&format!("\nhint: {h}"));
                    }
                    (text, r["state"] != "succeeded")
                }
                _ => (
                    format!(
                        "{}\n[still running in the background as job {}; you will be told when it finishes, or use job_wait / job_output]",
                        r["output"].as_str().unwrap_or(""),
                        r["task_id"].as_str().unwrap_or("?")
                    ),
                    false,
                ),
            })
        }
    };
    let (mut text, is_error) = match outcome {
        Ok(x) => x,
        Err(e) => (e.to_string(), true),
    };
    // Wakes: finished background work, reported once.
    if let Ok(inbox) = client.call(
        "inbox.list",
        json!({"session_id": session, "unread_only": true}),
    ) {
        let notes: Vec<&Value> = inbox["notifications"]
            .as_array()
            .map(|a| a.iter().rev().collect())
            .unwrap_or_default();
        if !notes.is_empty() {
            text.push_str("\n\n");
            for n in &notes {
                text.push_str(n["text"].as_str().unwrap_or(""));
                text.push('\n');
            }
            let ids: Vec<&Value> = notes.iter().map(|n| &n["id"]).collect();
            let _ = client.call("inbox.ack", json!({"ids": ids}));
        }
    }
    text_result(text, is_error)
}

fn describe_task(t: &Value) -> String {
    let mut s = format!(
        "job {} is {}",
        t["task_id"].as_str().unwrap_or("?"),
        t["state"].as_str().unwrap_or("?")
    );
    if let Some(c) = t["exit_code"].as_i64() {
        s.push_str(&format!(" (exit code {c})"));
    }
    if let Some(p) = t["output_path"].as_str() {
        s.push_str(&format!("; output: {p}"));
    }
    s
}
