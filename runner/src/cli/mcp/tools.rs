//! What `sidejob mcp` offers: the daemon's tools (with `background` and `yield_after_ms`
//! added), the `job_*` tools for background work, and how results and background
//! completions are shaped as MCP content.

use rmcp::model::{CallToolResult, ContentBlock, Tool};
use serde_json::{json, Value};

use super::calls::Answer;
use crate::protocol::{Notification, Task, ToolInfo};

/// `structuredContent` of every tool: permissive on purpose (fields may be added).
fn output_schema(properties: Value) -> Value {
    json!({"type": "object", "properties": properties})
}

fn run_output_schema() -> Value {
    output_schema(json!({
        "status": {"type": "string", "enum": ["completed", "running"], "description": "completed: the run ended; running: it goes on in the background as task_id"},
        "task_id": {"type": "string"},
        "state": {"type": "string"},
        "exit_code": {"type": ["integer", "null"]},
        "output": {"type": "string"},
        "output_truncated": {"type": "boolean"},
        "duration_ms": {"type": "integer"},
        "output_path": {"type": "string", "description": "the job's whole output (a running job's grows)"},
        "result_path": {"type": "string", "description": "the job's result.json, written when it settles"},
        "hint": {"type": "string"},
        "next": {"type": "string", "description": "what to do next for a job still running"},
        "background_completions": completions_schema()
    }))
}

fn completions_schema() -> Value {
    json!({
        "type": "array",
        "description": "background jobs of this session that finished since the last result: read each text and continue the work it belongs to; each is reported once",
        "items": {"type": "object", "properties": {
            "id": {"type": "string"}, "task_id": {"type": "string"}, "severity": {"type": "string"},
            "kind": {"type": "string"}, "text": {"type": "string"}, "created_at": {"type": "string"},
            "acked": {"type": "boolean"}
        }}
    })
}

/// What every run tool's description adds: how a long run comes back, true in every
/// client (most end the agent's run with its turn, and show the model no notification).
const RUN_NOTE: &str = "\n\nRuns in sidejob's sandbox. A run still going after yield_after_ms returns status \"running\" with a task_id and keeps running: \
     call job_wait with that task_id before you finish, or keep working: its result comes with your next sidejob tool call. \
     Start servers, watchers and long waits with background: true.";

/// A run's output schema with more properties (`job_wait` answers like a run, and adds
/// the task).
fn run_output_schema_with(extra: Value) -> Value {
    let mut schema = run_output_schema();
    if let (Some(props), Some(more)) = (schema["properties"].as_object_mut(), extra.as_object()) {
        props.extend(more.clone());
    }
    schema
}

fn tool(v: Value) -> Tool {
    // Every field is ours and well-formed; a failure here is a bug caught by the tests.
    serde_json::from_value(v).unwrap_or_else(|e| {
        Tool::new(
            "invalid",
            format!("sidejob built an invalid tool definition: {e}"),
            serde_json::Map::new(),
        )
    })
}

/// A daemon tool as an MCP tool.
pub(super) fn daemon_tool(t: &ToolInfo) -> Tool {
    let mut schema = t.input_schema.clone();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert(
            "background".into(),
            json!({"type": "boolean", "description": "Start it in the background now and get its task_id at once; its result comes with a later sidejob call or job_wait"}),
        );
        props.insert(
            "yield_after_ms".into(),
            json!({"type": "integer", "minimum": 0, "description": format!("Move to the background after this long (default {})", t.default_yield_after_ms)}),
        );
    }
    tool(json!({
        "name": t.name,
        "title": format!("{} (sandboxed)", t.name),
        "description": format!("{}{RUN_NOTE}", t.description),
        "inputSchema": schema,
        "outputSchema": run_output_schema(),
        // A run can change the workspace and, as its profile allows, reach the network.
        "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": true}
    }))
}

pub(super) fn job_tools() -> Vec<Tool> {
    let id = json!({"type": "string", "description": "The job's task id"});
    let read_only = json!({"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false});
    let max_bytes = json!({"type": "integer", "minimum": 1, "maximum": 1048576});
    vec![
        tool(json!({
            "name": "job_list",
            "title": "List jobs",
            "description": "List this session's jobs: running ones and recent finished ones.",
            "inputSchema": {"type": "object", "properties": {}},
            "outputSchema": output_schema(json!({"jobs": {"type": "array"}, "background_completions": completions_schema()})),
            "annotations": read_only
        })),
        tool(json!({
            "name": "job_output",
            "title": "Read a job's output",
            "description": "Read a job's output: the last max_bytes (default 65536) unless offset is given.",
            "inputSchema": {"type": "object", "properties": {"task_id": id, "offset": {"type": "integer", "minimum": 0}, "max_bytes": max_bytes}, "required": ["task_id"]},
            "outputSchema": output_schema(json!({"output": {"type": "string"}, "next_offset": {"type": "integer"}, "eof": {"type": "boolean"}, "background_completions": completions_schema()})),
            "annotations": read_only
        })),
        tool(json!({
            "name": "job_wait",
            "title": "Wait for a job",
            "description": "Wait for a job to finish (up to timeout_ms, default 30000) and get how it ended with the last max_bytes of its output (default 65536). Its result is then not reported again.",
            "inputSchema": {"type": "object", "properties": {"task_id": id, "timeout_ms": {"type": "integer", "minimum": 0}, "max_bytes": max_bytes}, "required": ["task_id"]},
            "outputSchema": run_output_schema_with(json!({"task": {"type": "object"}})),
            "annotations": read_only
        })),
        tool(json!({
            "name": "job_stop",
            "title": "Stop a job",
            "description": "Stop a job: SIGTERM to all of it, SIGKILL after a grace. Answers how it ended; a stop you asked for is not reported again.",
            "inputSchema": {"type": "object", "properties": {"task_id": id}, "required": ["task_id"]},
            "outputSchema": output_schema(json!({"task_id": {"type": "string"}, "result": {"type": "string"}, "state": {"type": "string"}, "background_completions": completions_schema()})),
            "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true, "openWorldHint": false}
        })),
    ]
}

pub(super) fn describe_task(t: &Task) -> String {
    let mut s = format!("job {}: {}", t.task_id, t.state.as_str());
    if let Some(c) = t.exit_code {
        s.push_str(&format!(" (exit code {c})"));
    }
    s.push_str(&format!("; whole output: {}", t.output_path));
    s
}

/// A result: this call's own text first, then each background completion as its own,
/// labelled content block (never mixed into the text of this call), and the same in
/// `structuredContent.background_completions` (the only part some clients show the model).
pub(super) fn result(answer: Answer, completions: &[Notification]) -> CallToolResult {
    let Answer {
        text,
        mut structured,
        is_error,
        task_id,
    } = answer;
    // The answer's own task (a job_wait or job_stop of it) was just reported: its wake, if
    // it had one, was taken with the others and is not repeated apart.
    let others: Vec<&Notification> = completions
        .iter()
        .filter(|n| task_id.is_none() || n.task_id != task_id)
        .collect();
    let mut content = vec![ContentBlock::text(text)];
    for n in &others {
        let block = json!({
            "type": "text",
            "text": format!(
                "[background job update — not part of this call's output]\n{}",
                n.text.trim_end()
            ),
            "annotations": {"audience": ["assistant"], "priority": 0.9},
            "_meta": {"sidejob/notification": {"id": n.id, "task_id": n.task_id, "severity": n.severity, "kind": n.kind}}
        });
        if let Ok(b) = serde_json::from_value(block) {
            content.push(b);
        }
    }
    if let Some(obj) = structured.as_object_mut() {
        obj.insert("background_completions".into(), json!(others));
    }
    let mut r = if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    // Errors carry no structured content: clients check it against the output schema.
    if !is_error {
        r.structured_content = Some(structured);
    }
    r
}
