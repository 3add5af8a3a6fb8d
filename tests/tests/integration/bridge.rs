//! The bridge (docs/plugins.md): scoped to the run's session, only the listed methods, and no way
//! to the control socket through it.

use serde_json::{json, Value};
use sidejob_tests::{Client, Daemon};

use crate::code::code;

/// Runs a Python script with the code tool, which must succeed, and reads the JSON object it
/// prints.
fn python_json(d: &Daemon, c: &mut Client, session: &str, script: &str) -> Value {
    let r = code(
        c,
        session,
        "python",
        script,
        json!({"yield_after_ms": 60_000}),
    );
    assert_eq!(r["state"], "succeeded", "{r}\n{}", d.log());
    serde_json::from_str(r["output"].as_str().unwrap().trim()).expect("script output")
}

#[test]
fn the_bridge_refuses_other_sessions_tasks_and_every_method_not_listed() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Python3]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let other = d.open_session(&mut c);
    let foreign = c.bash(&other, "echo secret", json!({}));
    let foreign_id = foreign["task_id"].as_str().unwrap();
    let s = d.open_session(&mut c);
    let script = format!(
        r#"
import json
def kind(method, params):
    try:
        tools.rpc(method, params)
        return "ok"
    except ToolError as e:
        return e.error.get("data", {{}}).get("kind", "?")
out = {{}}
for m in ["task.get", "task.output", "task.wait", "task.cancel"]:
    out[m] = kind(m, {{"task_id": "{foreign_id}"}})
out["tool.call other session"] = kind("tool.call", {{"session_id": "{other}", "tool": "bash", "args": {{"command": "true"}}}})
out["task.list other session"] = kind("task.list", {{"session_id": "{other}"}})
for m in ["initialize", "session.open", "session.close", "session.list", "session.status", "tool.list",
          "task.message", "task.answer", "task.background", "events.subscribe", "inbox.list", "inbox.ack",
          "schedule.create", "no.such.method"]:
    out[m] = kind(m, {{}})
out["own task.list"] = kind("task.list", {{}})
print(json.dumps(out))
"#
    );
    let out = python_json(&d, &mut c, &s, &script);
    for m in ["task.get", "task.output", "task.wait", "task.cancel"] {
        assert_eq!(out[m], "not_found", "{m}: {out}");
    }
    assert_eq!(out["tool.call other session"], "permission_denied", "{out}");
    assert_eq!(out["task.list other session"], "permission_denied", "{out}");
    for m in [
        "initialize",
        "session.open",
        "session.close",
        "session.list",
        "session.status",
        "tool.list",
        "task.message",
        "task.answer",
        "task.background",
        "events.subscribe",
        "inbox.list",
        "inbox.ack",
        "schedule.create",
        "no.such.method",
    ] {
        assert_eq!(out[m], "method_not_found", "{m}: {out}");
    }
    assert_eq!(out["own task.list"], "ok", "{out}");
    // The other session's task was not touched.
    assert_eq!(c.task(foreign_id)["state"], "succeeded");
}

#[test]
fn a_run_cannot_reach_the_control_socket_through_the_bridge() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Python3]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let control = d.socket.display().to_string();
    let script = format!(
        r#"
import os, socket, json
bridge = os.environ["SIDEJOB_BRIDGE"]
res = {{"bridge_is_control": os.path.realpath(bridge) == os.path.realpath("{control}")}}
# Whatever the bridge is asked, it never forwards to the control socket's methods.
for m in ["session.list", "session.open", "events.subscribe"]:
    try:
        tools.rpc(m, {{}})
        res[m] = "ok"
    except ToolError as e:
        res[m] = e.error.get("data", {{}}).get("kind")
# And the control socket itself is not in the run's view.
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("{control}")
    res["direct"] = "connected"
except OSError as e:
    res["direct"] = type(e).__name__
print(json.dumps(res))
"#
    );
    let out = python_json(&d, &mut c, &s, &script);
    assert_eq!(out["bridge_is_control"], false, "{out}");
    for m in ["session.list", "session.open", "events.subscribe"] {
        assert_eq!(out[m], "method_not_found", "{out}");
    }
    assert_ne!(
        out["direct"], "connected",
        "the control socket is reachable from the run: {out}"
    );
}

/// The bridge runs the control socket's RPC core: a line that is not a JSON-RPC 2.0 request
/// with a string, number or null id is refused the same way (docs/protocol.md), and a
/// notification gets no reply.
#[test]
fn the_bridge_checks_every_envelope_as_the_control_socket_does() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Python3]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let script = r#"
import json, os, socket
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["SIDEJOB_BRIDGE"])
    return s, s.makefile("rb")
def raw(line):
    s, f = connect()
    s.sendall(line.encode() + b"\n")
    reply = json.loads(f.readline())
    s.close()
    return {"id": reply.get("id"), "kind": reply.get("error", {}).get("data", {}).get("kind"), "ok": "result" in reply}
out = {
    "no_version": raw('{"id": 1, "method": "task.list", "params": {}}'),
    "old_version": raw('{"jsonrpc": "1.0", "id": 2, "method": "task.list"}'),
    "object_id": raw('{"jsonrpc": "2.0", "id": {"a": 1}, "method": "task.list"}'),
    "array_id": raw('{"jsonrpc": "2.0", "id": [4], "method": "task.list"}'),
    "batch": raw('[{"jsonrpc": "2.0", "id": 3, "method": "task.list"}]'),
    "not_json": raw('{'),
    "params_list": raw('{"jsonrpc": "2.0", "id": 5, "method": "task.list", "params": [1]}'),
    "good": raw('{"jsonrpc": "2.0", "id": "x", "method": "task.list"}'),
}
s, f = connect()
s.sendall(b'{"jsonrpc": "2.0", "method": "task.list"}\n{"jsonrpc": "2.0", "id": 9, "method": "task.list"}\n')
out["after_notification"] = json.loads(f.readline()).get("id")
print(json.dumps(out))
"#;
    let out = python_json(&d, &mut c, &s, script);
    let refused = |case: &str, id: Value, kind: &str| {
        assert_eq!(out[case]["id"], id, "{case}: {out}");
        assert_eq!(out[case]["kind"], kind, "{case}: {out}");
        assert_eq!(out[case]["ok"], false, "{case}: {out}");
    };
    refused("no_version", json!(1), "invalid_request");
    refused("old_version", json!(2), "invalid_request");
    refused("object_id", json!(null), "invalid_request");
    refused("array_id", json!(null), "invalid_request");
    refused("batch", json!(null), "invalid_request");
    refused("not_json", json!(null), "parse_error");
    refused("params_list", json!(5), "invalid_params");
    assert_eq!(
        out["good"],
        json!({"id": "x", "kind": null, "ok": true}),
        "{out}"
    );
    // The notification was served without a reply: the first line is the request's.
    assert_eq!(out["after_notification"], 9, "{out}");
}

/// A result answered inline through the bridge whose reply cannot be written (the script
/// shut its side for reading) is handed back, not marked delivered: the host still gets it.
#[test]
fn a_bridge_result_whose_reply_cannot_be_written_is_delivered_later() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Python3]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let script = r#"
import json, os, socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["SIDEJOB_BRIDGE"])
# The daemon's reply on this connection cannot be written (EPIPE); it can still read.
s.shutdown(socket.SHUT_RD)
call = {"jsonrpc": "2.0", "id": 1, "method": "tool.call",
        "params": {"tool": "bash", "args": {"command": "echo lost-reply"}, "yield_after_ms": 60000}}
s.sendall(json.dumps(call).encode() + b"\n")
deadline = time.monotonic() + 30
job = None
while time.monotonic() < deadline:
    job = next((t for t in tools.jobs.list() if t["tool"] == "bash"), None)
    if job and job["state"] == "succeeded" and job.get("delivery") != "inline":
        break
    time.sleep(0.02)
s.close()
print(json.dumps({"task_id": job and job["task_id"], "state": job and job["state"], "delivery": job and job.get("delivery")}))
"#;
    let out = python_json(&d, &mut c, &s, script);
    assert_eq!(out["state"], "succeeded", "{out}");
    assert_eq!(
        out["delivery"], "pending",
        "the unwritten reply left the result marked delivered: {out}"
    );
    // Delivered later: the host's wait takes it.
    let job = out["task_id"].as_str().unwrap();
    let waited = c.ok("task.wait", json!({"task_id": job, "timeout_ms": 5_000}));
    assert_eq!(waited["delivery"], "wait", "{waited}");
    assert!(c.ok("task.output", json!({"task_id": job}))["data"]
        .as_str()
        .unwrap()
        .contains("lost-reply"));
}
