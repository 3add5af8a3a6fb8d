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
    match Method::from_name(method).unwrap_or_else(|| panic!("{method} is no method")) {
        Method::Initialize => {
            params::<InitializeParams>(method, req);
            same::<InitializeResult>(&what, result);
        }
        Method::SessionOpen => {
            params::<SessionOpenParams>(method, req);
            same::<SessionOpenResult>(&what, result);
        }
        Method::SessionClose => {
            params::<SessionCloseParams>(method, req);
            same::<SessionCloseResult>(&what, result);
        }
        Method::SessionStatus => {
            params::<SessionStatusParams>(method, req);
            same::<SessionStatus>(&what, result);
        }
        Method::SessionList => same::<SessionListResult>(&what, result),
        Method::ToolList => same::<ToolListResult>(&what, result),
        Method::ToolCall => {
            params::<ToolCallParams>(method, req);
            same::<ToolCallResult>(&what, result);
        }
        Method::TaskList => {
            params::<TaskListParams>(method, req);
            same::<TaskListResult>(&what, result);
        }
        Method::TaskGet => {
            params::<TaskIdParams>(method, req);
            same::<Task>(&what, result);
        }
        Method::TaskOutput => {
            params::<TaskOutputParams>(method, req);
            same::<TaskOutputResult>(&what, result);
        }
        Method::TaskWait => {
            params::<TaskWaitParams>(method, req);
            same::<Task>(&what, result);
        }
        Method::TaskCancel => {
            params::<TaskCancelParams>(method, req);
            same::<TaskCancelResult>(&what, result);
        }
        Method::TaskMessage => {
            params::<TaskMessageParams>(method, req);
            same::<TaskMessageResult>(&what, result);
        }
        Method::TaskAnswer => {
            params::<TaskAnswerParams>(method, req);
            same::<TaskAnswerResult>(&what, result);
        }
        Method::TaskBackground => {
            params::<TaskIdParams>(method, req);
            same::<TaskBackgroundResult>(&what, result);
        }
        Method::EventsSubscribe => {
            params::<EventsSubscribeParams>(method, req);
            same::<EventsSubscribeResult>(&what, result);
        }
        Method::InboxList => {
            params::<InboxListParams>(method, req);
            same::<InboxListResult>(&what, result);
        }
        Method::InboxAck => {
            params::<InboxAckParams>(method, req);
            same::<InboxAckResult>(&what, result);
        }
        Method::ScheduleCreate => {
            params::<ScheduleCreateParams>(method, req);
            same::<ScheduleCreateResult>(&what, result);
        }
        Method::ScheduleList => {
            params::<ScheduleListParams>(method, req);
            same::<ScheduleListResult>(&what, result);
        }
        Method::ScheduleCancel => {
            params::<ScheduleCancelParams>(method, req);
            same::<ScheduleCancelResult>(&what, result);
        }
        Method::DaemonStatus => {
            params::<DaemonStatusParams>(method, req);
            same::<DaemonStatusResult>(&what, result);
        }
        Method::TaskRequestInput => {
            panic!("docs/protocol.md documents {method}, which hosts are not served")
        }
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
            "tools.changed" => same::<ToolsChangedNotification>(&what, &msg["params"]),
            other => panic!("docs/protocol.md documents a push {other} the server never sends"),
        }
    }
    assert_eq!(
        pushes.len(),
        4,
        "task.updated, notification, events.gap and tools.changed must be documented"
    );
    let documented: Vec<&str> = secs.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(
        documented,
        Method::host_names(),
        "docs/protocol.md must document every method, in order"
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

/// The field names a derived `Deserialize` struct accepts: it hands them to
/// `deserialize_struct`, which this deserializer records and then refuses.
fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Probe<'a>(&'a std::cell::Cell<&'static [&'static str]>);
    impl<'de> de::Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.0.set(fields);
            Err(de::Error::custom("probed"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let cell = std::cell::Cell::new(&[][..]);
    let _ = T::deserialize(Probe(&cell));
    cell.get()
}

/// The prose of each `### \`method\`` section (up to its first example).
fn prose(doc: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_prose = false;
    for line in doc.lines() {
        if let Some(rest) = line.strip_prefix("### ") {
            out.push((rest.trim_matches('`').to_owned(), String::new()));
            in_prose = true;
        } else if line.starts_with("```") || line.starts_with("## ") {
            in_prose = false;
        } else if in_prose {
            if let Some(last) = out.last_mut() {
                last.1.push_str(line);
                last.1.push('\n');
            }
        }
    }
    out
}

#[test]
fn every_parameter_of_every_method_is_named_in_its_section() {
    let doc = doc();
    let sections = prose(&doc);
    let text = |m: &str| {
        sections
            .iter()
            .find(|(name, _)| name == m)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("docs/protocol.md has no section for {m}"))
    };
    let check = |m: &str, fields: &[&str]| {
        let t = text(m);
        for f in fields {
            assert!(
                t.contains(&format!("{f}?"))
                    || t.contains(&format!("{f},"))
                    || t.contains(&format!("{f}}}"))
                    || t.contains(&format!("`{f}`")),
                "docs/protocol.md: the {m} section does not name its parameter {f}"
            );
        }
    };
    check("initialize", fields_of::<InitializeParams>());
    check("session.open", fields_of::<SessionOpenParams>());
    check("session.close", fields_of::<SessionCloseParams>());
    check("session.status", fields_of::<SessionStatusParams>());
    check("tool.call", fields_of::<ToolCallParams>());
    check("task.list", fields_of::<TaskListParams>());
    check("task.get", fields_of::<TaskIdParams>());
    check("task.output", fields_of::<TaskOutputParams>());
    check("task.wait", fields_of::<TaskWaitParams>());
    check("task.cancel", fields_of::<TaskCancelParams>());
    check("task.message", fields_of::<TaskMessageParams>());
    check("task.answer", fields_of::<TaskAnswerParams>());
    check("task.background", fields_of::<TaskIdParams>());
    check("events.subscribe", fields_of::<EventsSubscribeParams>());
    check("inbox.list", fields_of::<InboxListParams>());
    check("inbox.ack", fields_of::<InboxAckParams>());
    check("schedule.create", fields_of::<ScheduleCreateParams>());
    check("schedule.list", fields_of::<ScheduleListParams>());
    check("schedule.cancel", fields_of::<ScheduleCancelParams>());
    assert!(
        fields_of::<ToolCallParams>().contains(&"wake"),
        "the probe reads field names"
    );
}

#[test]
fn the_documented_initialize_lists_every_method_the_daemon_serves() {
    let doc = doc();
    let init = sections(&doc)
        .into_iter()
        .find(|(m, _)| m == "initialize")
        .expect("initialize section");
    let listed: Vec<String> = serde_json::from_value(init.1[1]["result"]["methods"].clone())
        .expect("initialize reply lists methods");
    assert_eq!(
        listed,
        Method::host_names(),
        "docs/protocol.md: initialize's methods"
    );
}
