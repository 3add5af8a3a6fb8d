//! Bad input (docs/protocol.md): each case gets its specified error, the connection keeps working, and
//! every other client carries on.

use serde_json::{json, Value};
use sidejob_tests::{Client, Daemon, UNKNOWN_TASK_ID};

/// A daemon, the connection that misbehaves, and a bystander connected before it does.
struct Fixture {
    d: Daemon,
    bad: Client,
    other: Client,
    session: String,
}

fn fixture() -> Fixture {
    let d = Daemon::start();
    let mut other = d.client();
    let session = d.open_session(&mut other);
    let bad = d.client();
    Fixture {
        d,
        bad,
        other,
        session,
    }
}

/// Sends one raw line and returns the error object of the reply (which must be an error).
fn raw_error(c: &mut Client, line: &[u8]) -> Value {
    let mut bytes = line.to_vec();
    bytes.push(b'\n');
    c.send_raw(&bytes).expect("write");
    let msg = c.read_message().expect("a reply to the bad line");
    assert_eq!(msg["jsonrpc"], "2.0", "{msg}");
    assert!(msg.get("result").is_none(), "{msg}");
    msg["error"].clone()
}

fn assert_error(err: &Value, code: i64, kind: &str) {
    assert_eq!(err["code"], code, "{err}");
    assert_eq!(err["data"]["kind"], kind, "{err}");
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{err}"
    );
}

impl Fixture {
    /// The misbehaving connection still answers a good request, and the bystander still runs
    /// commands.
    fn assert_all_well(&mut self) {
        let init = self.bad.ok("initialize", json!({"protocol_version": 1}));
        assert_eq!(init["protocol_version"], 1);
        let s = self.d.open_session(&mut self.bad);
        let r = self.bad.bash(&s, "echo still-here", json!({}));
        assert_eq!(r["output"], "still-here\n", "{r}");
        self.assert_other_well();
    }

    fn assert_other_well(&mut self) {
        let r = self.other.bash(&self.session, "echo bystander", json!({}));
        assert_eq!(r["status"], "completed", "{r}");
        assert_eq!(r["output"], "bystander\n", "{r}");
    }
}

#[test]
fn malformed_json_gets_parse_error() {
    let mut f = fixture();
    let err = raw_error(&mut f.bad, br#"{"jsonrpc": "2.0", "id": 1, "method": "#);
    assert_error(&err, -32700, "parse_error");
    let err = raw_error(&mut f.bad, b"not json at all");
    assert_error(&err, -32700, "parse_error");
    f.assert_all_well();
}

#[test]
fn a_number_instead_of_an_object_is_an_invalid_request() {
    let mut f = fixture();
    let err = raw_error(&mut f.bad, b"42");
    assert_error(&err, -32600, "invalid_request");
    let err = raw_error(&mut f.bad, br#""a string""#);
    assert_error(&err, -32600, "invalid_request");
    f.assert_all_well();
}

#[test]
fn an_array_instead_of_an_object_is_an_invalid_request() {
    let mut f = fixture();
    let err = raw_error(
        &mut f.bad,
        br#"[{"jsonrpc": "2.0", "id": 1, "method": "initialize"}]"#,
    );
    assert_error(&err, -32600, "invalid_request");
    f.assert_all_well();
}

#[test]
fn a_missing_jsonrpc_member_is_an_invalid_request() {
    let mut f = fixture();
    f.bad
        .send_value(&json!({"id": 7, "method": "initialize", "params": {}}));
    let msg = f.bad.read_message().expect("reply");
    assert_eq!(msg["id"], 7, "the reply names the request's id: {msg}");
    assert_error(&msg["error"], -32600, "invalid_request");
    f.assert_all_well();
}

#[test]
fn a_wrong_jsonrpc_version_is_an_invalid_request() {
    let mut f = fixture();
    f.bad
        .send_value(&json!({"jsonrpc": "1.0", "id": 8, "method": "initialize"}));
    let msg = f.bad.read_message().expect("reply");
    assert_eq!(msg["id"], 8, "{msg}");
    assert_error(&msg["error"], -32600, "invalid_request");
    f.assert_all_well();
}

#[test]
fn an_unknown_method_is_method_not_found() {
    let mut f = fixture();
    let (code, kind) = f.bad.err("task.frobnicate", json!({}));
    assert_eq!((code, kind.as_str()), (-32601, "method_not_found"));
    f.assert_all_well();
}

#[test]
fn tool_call_without_session_id_is_invalid_params() {
    let mut f = fixture();
    let (code, kind) = f.bad.err(
        "tool.call",
        json!({"tool": "bash", "args": {"command": "true"}}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    f.assert_all_well();
}

#[test]
fn tool_call_with_arguments_of_the_wrong_type_is_invalid_params() {
    let mut f = fixture();
    let s = f.session.clone();
    for params in [
        json!({"session_id": s, "tool": "bash", "args": {"command": 42}}),
        json!({"session_id": s, "tool": "bash", "args": "echo hi"}),
        json!({"session_id": s, "tool": "bash", "args": {}}),
        json!({"session_id": s, "tool": "bash", "args": {"command": "true"}, "yield_after_ms": "soon"}),
        json!({"session_id": s, "tool": "bash", "args": {"command": "true"}, "stdin": "tty"}),
        json!({"session_id": 17, "tool": "bash", "args": {"command": "true"}}),
    ] {
        let (code, kind) = f.bad.err("tool.call", params.clone());
        assert_eq!(
            (code, kind.as_str()),
            (-32602, "invalid_params"),
            "{params}"
        );
    }
    let (code, kind) = f.bad.err(
        "task.wait",
        json!({"task_id": UNKNOWN_TASK_ID, "timeout_ms": -5}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    f.assert_all_well();
}

#[test]
fn params_as_an_array_are_invalid_params() {
    let mut f = fixture();
    let (code, kind) = f.bad.err("task.get", json!([UNKNOWN_TASK_ID]));
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    let (code, kind) = f.bad.err("session.open", json!("/tmp"));
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    f.assert_all_well();
}

/// The protocol document: a line over 1 MiB is `invalid_request`, "the connection is then
/// closed after the reply" (the rest of such a line cannot be framed, so nothing after it on
/// that connection could be trusted).
#[test]
fn a_line_over_one_mebibyte_is_refused_and_other_clients_carry_on() {
    let mut f = fixture();
    let mut line =
        br#"{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"client": ""#.to_vec();
    line.extend(std::iter::repeat_n(b'a', 1024 * 1024 + 100));
    line.extend_from_slice(b"\"}}\n");
    // The server may stop reading (and close) as soon as the line is too long, so the rest of
    // the write can fail; the reply must still arrive.
    let _ = f.bad.send_raw(&line);
    let msg = f
        .bad
        .read_message()
        .expect("an error reply before any close");
    assert_error(&msg["error"], -32600, "invalid_request");
    assert!(msg["id"].is_null(), "the line had no readable id: {msg}");
    // Then the server closes the connection: a request sent now is never answered.
    let _ = f
        .bad
        .send_raw(b"{\"jsonrpc\": \"2.0\", \"id\": 99, \"method\": \"initialize\"}\n");
    assert!(
        f.bad.wait_closed(std::time::Duration::from_secs(30)),
        "the connection is still open 30 s after an oversized line"
    );
    assert!(
        f.bad.pushes.is_empty(),
        "nothing may follow the error on that connection: {:?}",
        f.bad.pushes
    );
    f.assert_other_well();
    // A new connection from the same user works too.
    let mut fresh = f.d.client();
    assert_eq!(fresh.ok("initialize", json!({}))["protocol_version"], 1);
}

#[test]
fn a_line_of_exactly_one_mebibyte_is_accepted() {
    let f = fixture();
    let mut c = f.d.client();
    let head = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"client":""#;
    let tail = br#""}}"#;
    let mut line = head.to_vec();
    line.extend(std::iter::repeat_n(
        b'a',
        1024 * 1024 - head.len() - tail.len(),
    ));
    line.extend_from_slice(tail);
    assert_eq!(line.len(), 1024 * 1024);
    line.push(b'\n');
    c.send_raw(&line).expect("write");
    let msg = c.read_message().expect("reply");
    assert_eq!(msg["result"]["protocol_version"], 1, "{msg}");
}

#[test]
fn session_ids_that_try_path_traversal_are_invalid_params() {
    let mut f = fixture();
    let ws = f.d.workspace.display().to_string();
    for bad in ["../x", "a/b", "..", "../../etc", "x\u{0}y", ""] {
        let (code, kind) = f
            .bad
            .err("session.open", json!({"session_id": bad, "workspace": ws}));
        assert_eq!((code, kind.as_str()), (-32602, "invalid_params"), "{bad:?}");
        for (method, params) in [
            ("session.status", json!({"session_id": bad})),
            ("session.close", json!({"session_id": bad})),
            ("task.list", json!({"session_id": bad})),
            (
                "tool.call",
                json!({"session_id": bad, "tool": "bash", "args": {"command": "true"}}),
            ),
        ] {
            let (code, kind) = f.bad.err(method, params);
            assert_eq!(
                (code, kind.as_str()),
                (-32602, "invalid_params"),
                "{method} {bad:?}"
            );
        }
    }
    assert!(!f.d.state_dir.join("x").exists());
    assert!(!f.d.state_dir.join("sessions/a").exists());
    f.assert_all_well();
}

#[test]
fn unknown_well_formed_task_ids_are_not_found() {
    let mut f = fixture();
    for (method, params) in [
        ("task.get", json!({"task_id": UNKNOWN_TASK_ID})),
        (
            "task.output",
            json!({"task_id": UNKNOWN_TASK_ID, "offset": 0}),
        ),
        (
            "task.wait",
            json!({"task_id": UNKNOWN_TASK_ID, "timeout_ms": 10}),
        ),
        ("task.cancel", json!({"task_id": UNKNOWN_TASK_ID})),
        (
            "task.message",
            json!({"task_id": UNKNOWN_TASK_ID, "data": "x"}),
        ),
        ("task.background", json!({"task_id": UNKNOWN_TASK_ID})),
    ] {
        let (code, kind) = f.bad.err(method, params);
        assert_eq!((code, kind.as_str()), (-32001, "not_found"), "{method}");
    }
    f.assert_all_well();
}

#[test]
fn malformed_task_ids_are_invalid_params() {
    let mut f = fixture();
    for bad in [
        "",
        "abc",
        "../../../etc/passwd",
        "01ARZ3NDEKTSV4RRFFQ69G5FA/",
        "01ARZ3NDEKTSV4RRFFQ69G5FAVX",
    ] {
        for method in ["task.get", "task.output", "task.cancel", "task.background"] {
            let (code, kind) = f.bad.err(method, json!({"task_id": bad}));
            assert_eq!(
                (code, kind.as_str()),
                (-32602, "invalid_params"),
                "{method} {bad:?}"
            );
        }
    }
    let (code, kind) = f.bad.err("task.get", json!({"task_id": 12345}));
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    f.assert_all_well();
}

#[test]
fn tool_call_on_a_closed_session_is_invalid_state() {
    let mut f = fixture();
    let s = f.d.open_session(&mut f.bad);
    let closed = f.bad.ok("session.close", json!({"session_id": s}));
    assert_eq!(closed["closed"], true, "{closed}");
    let (code, kind) = f.bad.err(
        "tool.call",
        json!({"session_id": s, "tool": "bash", "args": {"command": "true"}}),
    );
    assert_eq!((code, kind.as_str()), (-32005, "invalid_state"));
    f.assert_all_well();
}

#[test]
fn an_unknown_tool_is_invalid_params() {
    let mut f = fixture();
    let (code, kind) = f.bad.err(
        "tool.call",
        json!({"session_id": f.session, "tool": "no-such-tool", "args": {}}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    f.assert_all_well();
}

#[test]
fn an_unknown_session_is_not_found() {
    let mut f = fixture();
    let (code, kind) = f.bad.err(
        "tool.call",
        json!({"session_id": "never-opened", "tool": "bash", "args": {"command": "true"}}),
    );
    assert_eq!((code, kind.as_str()), (-32001, "not_found"));
    let (code, kind) = f
        .bad
        .err("task.list", json!({"session_id": "never-opened"}));
    assert_eq!((code, kind.as_str()), (-32001, "not_found"));
    f.assert_all_well();
}
