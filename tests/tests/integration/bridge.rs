//! The bridge (docs/plugins.md): scoped to the run's session, only the listed methods, and no way
//! to the control socket through it.

use serde_json::json;
use sidejob_tests::Daemon;

use crate::code::code;

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
    let r = code(
        &mut c,
        &s,
        "python",
        &script,
        json!({"yield_after_ms": 60_000}),
    );
    assert_eq!(r["state"], "succeeded", "{r}");
    let out: serde_json::Value =
        serde_json::from_str(r["output"].as_str().unwrap().trim()).expect("script output");
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
    let r = code(
        &mut c,
        &s,
        "python",
        &script,
        json!({"yield_after_ms": 60_000}),
    );
    assert_eq!(r["state"], "succeeded", "{r}");
    let out: serde_json::Value =
        serde_json::from_str(r["output"].as_str().unwrap().trim()).expect("script output");
    assert_eq!(out["bridge_is_control"], false, "{out}");
    for m in ["session.list", "session.open", "events.subscribe"] {
        assert_eq!(out[m], "method_not_found", "{out}");
    }
    assert_ne!(
        out["direct"], "connected",
        "the control socket is reachable from the run: {out}"
    );
}
