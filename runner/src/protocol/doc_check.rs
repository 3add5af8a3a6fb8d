//! Keeps `docs/protocol.md` in step with the wire types: every method has a section, and
//! every example request and reply parses into its `*Params` / `*Result` type and serialises
//! back to exactly the documented JSON.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::*;

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `(method, [json blocks])` for every `### \`method\`` section.
fn sections(doc: &str) -> Vec<(String, Vec<Value>)> {
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    let mut in_block = false;
    let mut block = String::new();
    for line in doc.lines() {
        if let Some(rest) = line.strip_prefix("### ") {
            // "### `method`" documents a method; "### Push `method`" a server push.
            out.push((
                rest.trim_matches('`').replace("Push `", "push:"),
                Vec::new(),
            ));
            continue;
        }
        if line.trim() == "```json" {
            in_block = true;
            block.clear();
        } else if in_block && line.trim() == "```" {
            in_block = false;
            let v: Value = serde_json::from_str(&block)
                .unwrap_or_else(|e| panic!("bad JSON in docs ({e}):\n{block}"));
            if let Some(last) = out.last_mut() {
                last.1.push(v);
            }
        } else if in_block {
            block.push_str(line);
            block.push('\n');
        }
    }
    out
}

/// Parses `v` as `T` and checks it serialises back to the same JSON.
fn same<T: DeserializeOwned + Serialize>(what: &str, v: &Value) {
    let parsed: T =
        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{what}: {e}\n{v}"));
    let back = serde_json::to_value(&parsed).expect("serialise");
    assert_eq!(
        &back, v,
        "{what}: the documented JSON and the wire type differ"
    );
}

fn params<T: DeserializeOwned>(what: &str, v: &Value) {
    let p = v
        .get("params")
        .cloned()
        .unwrap_or(Value::Object(Default::default()));
    if let Err(e) = serde_json::from_value::<T>(p) {
        panic!("{what}: documented params do not parse: {e}\n{v}");
    }
}

fn check(method: &str, req: &Value, reply: &Value) {
    assert_eq!(req["jsonrpc"], "2.0", "{method}: request");
    assert_eq!(
        req["method"], method,
        "{method}: request names another method"
    );
    assert_eq!(reply["id"], req["id"], "{method}: reply id");
    let result = reply
        .get("result")
        .unwrap_or_else(|| panic!("{method}: reply has no result"));
    let what = format!("{method} result");
    match method {
        "initialize" => {
            params::<InitializeParams>(method, req);
            same::<InitializeResult>(&what, result);
        }
        "session.open" => {
            params::<SessionOpenParams>(method, req);
            same::<SessionOpenResult>(&what, result);
        }
        "session.close" => {
            params::<SessionCloseParams>(method, req);
            same::<SessionCloseResult>(&what, result);
        }
        "session.status" => {
            params::<SessionStatusParams>(method, req);
            same::<SessionStatus>(&what, result);
        }
        "session.list" => same::<SessionListResult>(&what, result),
        "tool.list" => same::<ToolListResult>(&what, result),
        "tool.call" => {
            params::<ToolCallParams>(method, req);
            same::<ToolCallResult>(&what, result);
        }
        "task.list" => {
            params::<TaskListParams>(method, req);
            same::<TaskListResult>(&what, result);
        }
        "task.get" => {
            params::<TaskIdParams>(method, req);
            same::<Task>(&what, result);
        }
        "task.output" => {
            params::<TaskOutputParams>(method, req);
            same::<TaskOutputResult>(&what, result);
        }
        "task.wait" => {
            params::<TaskWaitParams>(method, req);
            same::<Task>(&what, result);
        }
        "task.cancel" => {
            params::<TaskCancelParams>(method, req);
            same::<TaskCancelResult>(&what, result);
        }
        "task.message" => {
            params::<TaskMessageParams>(method, req);
            same::<TaskMessageResult>(&what, result);
        }
        "task.answer" => {
            params::<TaskAnswerParams>(method, req);
            same::<TaskAnswerResult>(&what, result);
        }
        "task.background" => {
            params::<TaskIdParams>(method, req);
            same::<TaskBackgroundResult>(&what, result);
        }
        "events.subscribe" => {
            params::<EventsSubscribeParams>(method, req);
            same::<EventsSubscribeResult>(&what, result);
        }
        "inbox.list" => {
            params::<InboxListParams>(method, req);
            same::<InboxListResult>(&what, result);
        }
        "inbox.ack" => {
            params::<InboxAckParams>(method, req);
            same::<InboxAckResult>(&what, result);
        }
        "schedule.create" => {
            params::<ScheduleCreateParams>(method, req);
            same::<ScheduleCreateResult>(&what, result);
        }
        "schedule.list" => {
            params::<ScheduleListParams>(method, req);
            same::<ScheduleListResult>(&what, result);
        }
        "schedule.cancel" => {
            params::<ScheduleCancelParams>(method, req);
            same::<ScheduleCancelResult>(&what, result);
        }
        other => panic!("docs/protocol.md documents {other}, which the server does not serve"),
    }
}

#[test]
fn every_method_is_documented_with_a_request_and_reply_that_match_the_wire_types() {
    let doc = doc();
    let secs = sections(&doc);
    let (pushes, secs): (Vec<_>, Vec<_>) =
        secs.into_iter().partition(|(m, _)| m.starts_with("push:"));
    for (push, blocks) in &pushes {
        let name = push.trim_start_matches("push:");
        assert_eq!(blocks.len(), 1, "{push}: one example expected");
        let msg = &blocks[0];
        assert_eq!(msg["method"], name, "{push}: example names another method");
        assert!(msg.get("id").is_none(), "{push}: a push has no id");
        let what = format!("{name} push");
        match name {
            "task.updated" => same::<TaskUpdatedNotification>(&what, &msg["params"]),
            "notification" => same::<NotificationNotification>(&what, &msg["params"]),
            "events.gap" => same::<EventsGapNotification>(&what, &msg["params"]),
            other => panic!("docs/protocol.md documents a push {other} the server never sends"),
        }
    }
    assert_eq!(
        pushes.len(),
        3,
        "task.updated, notification and events.gap must be documented"
    );
    let documented: Vec<&str> = secs.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(
        documented, METHODS,
        "docs/protocol.md must document every method, in METHODS order"
    );
    for (method, blocks) in &secs {
        assert!(
            !blocks.is_empty() && blocks.len() % 2 == 0,
            "{method}: needs request/reply pairs, found {} blocks",
            blocks.len()
        );
        for pair in blocks.chunks(2) {
            check(method, &pair[0], &pair[1]);
        }
    }
}

#[test]
fn documented_errors_use_the_specified_codes() {
    let doc = doc();
    for (kind, code) in [
        (ErrorKind::ParseError, -32700),
        (ErrorKind::InvalidRequest, -32600),
        (ErrorKind::MethodNotFound, -32601),
        (ErrorKind::InvalidParams, -32602),
        (ErrorKind::NotFound, -32001),
        (ErrorKind::PermissionDenied, -32002),
        (ErrorKind::SandboxUnavailable, -32003),
        (ErrorKind::LimitExceeded, -32004),
        (ErrorKind::InvalidState, -32005),
    ] {
        assert_eq!(kind.code(), code);
        let row = format!("| {code} | `{}` |", kind.name());
        assert!(
            doc.contains(&row),
            "docs/protocol.md lacks the error row {row}"
        );
    }
}
