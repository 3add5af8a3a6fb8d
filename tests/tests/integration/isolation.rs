//! Isolation between users (docs/protocol.md): `SO_PEERCRED`; a uid sees and touches only its own
//! sessions. Needs root (to connect as another uid); skipped otherwise.

use std::os::unix::fs::chown;

use serde_json::{json, Value};
use sidejob_tests::{skip_without, Daemon, Need};

pub(crate) const NOBODY: u32 = 65534;

/// Lets uid `NOBODY` reach the socket (the daemon makes it 0660, root-owned).
pub(crate) fn open_socket_to_everyone(d: &Daemon) {
    d.let_everyone_connect();
}

/// Runs `sidejob rpc METHOD PARAMS` as `NOBODY`: `Ok(result)` or `Err(stderr)`.
pub(crate) fn rpc_as_nobody(d: &Daemon, method: &str, params: Value) -> Result<Value, String> {
    let o = d.cli_as(NOBODY, NOBODY, &["rpc", method, &params.to_string()]);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    if o.status.success() {
        Ok(serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{method}: not JSON ({e}): {stderr}")))
    } else {
        Err(stderr)
    }
}

fn assert_denied(d: &Daemon, method: &str, params: Value) {
    match rpc_as_nobody(d, method, params.clone()) {
        Ok(v) => panic!("uid {NOBODY} was allowed {method} {params}: {v}"),
        Err(stderr) => assert!(
            stderr.contains("(permission_denied)"),
            "{method} {params} should be permission_denied: {stderr}"
        ),
    }
}

#[test]
fn another_user_is_denied_roots_sessions_and_tasks() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "sleep 30", json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    open_socket_to_everyone(&d);

    // The socket itself works for that user.
    let init = rpc_as_nobody(&d, "initialize", json!({})).expect("initialize as nobody");
    assert_eq!(init["uid"], NOBODY);

    assert_denied(&d, "task.get", json!({"task_id": id}));
    assert_denied(&d, "task.output", json!({"task_id": id}));
    assert_denied(&d, "task.wait", json!({"task_id": id, "timeout_ms": 10}));
    assert_denied(&d, "task.cancel", json!({"task_id": id}));
    assert_denied(&d, "task.message", json!({"task_id": id, "data": "x"}));
    assert_denied(&d, "task.background", json!({"task_id": id}));
    assert_denied(&d, "session.status", json!({"session_id": s}));
    assert_denied(&d, "task.list", json!({"session_id": s}));
    assert_denied(&d, "session.close", json!({"session_id": s}));
    assert_denied(
        &d,
        "tool.call",
        json!({"session_id": s, "tool": "bash", "args": {"command": "id -u"}}),
    );
    assert_denied(
        &d,
        "session.open",
        json!({"session_id": s, "workspace": d.workspace}),
    );
    // Listing shows none of root's sessions.
    let list = rpc_as_nobody(&d, "session.list", json!({})).expect("session.list");
    assert_eq!(list["sessions"], json!([]), "{list}");

    // Root's task is untouched.
    let t = c.task(&id);
    assert_eq!(t["state"], "running", "{t}");
    c.ok("task.cancel", json!({"task_id": id, "grace_ms": 100}));
}

#[test]
fn another_user_runs_commands_as_itself_in_its_own_session() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = Daemon::start();
    open_socket_to_everyone(&d);
    let ws = d.root.path().join("nobody-ws");
    std::fs::create_dir_all(&ws).expect("workspace");
    chown(&ws, Some(NOBODY), Some(NOBODY)).expect("chown");
    let opened = rpc_as_nobody(
        &d,
        "session.open",
        json!({"session_id": "nobody-s", "workspace": ws}),
    )
    .expect("session.open as nobody");
    assert_eq!(opened["session_id"], "nobody-s");
    let r = rpc_as_nobody(
        &d,
        "tool.call",
        json!({"session_id": "nobody-s", "tool": "bash",
               "args": {"command": "id -u; id -g; pwd; touch mine && stat -c %u mine"}}),
    )
    .expect("tool.call as nobody");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "succeeded", "{r}");
    let canonical = ws.canonicalize().expect("canonical");
    assert_eq!(
        r["output"],
        format!("{NOBODY}\n{NOBODY}\n{}\n{NOBODY}\n", canonical.display()),
        "{r}"
    );
    // Root sees the other user's session (root sees all).
    let mut c = d.client();
    let list = c.ok("session.list", json!({}));
    let sessions = list["sessions"].as_array().expect("sessions");
    let theirs = sessions
        .iter()
        .find(|s| s["session_id"] == "nobody-s")
        .expect("root lists nobody's session");
    assert_eq!(theirs["owner_uid"], NOBODY);
    let t = c.task(r["task_id"].as_str().expect("id"));
    assert_eq!(t["state"], "succeeded");
}

/// The same refusals as seen by a host speaking the protocol (not through the CLI's text):
/// each is a JSON-RPC error with code -32002 and `data.kind` `permission_denied`.
#[test]
fn another_users_requests_get_permission_denied_as_a_json_rpc_error() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = sidejob_tests::Gate::new(&d.workspace, "never");
    let r = c.bash(&s, &gate.wait_cmd(), json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    d.let_everyone_connect();
    let mut other = d.client_as(NOBODY, NOBODY);
    for (method, params) in [
        ("task.get", json!({"task_id": id})),
        ("task.cancel", json!({"task_id": id})),
        ("task.wait", json!({"task_id": id, "timeout_ms": 10})),
        ("session.status", json!({"session_id": s})),
        (
            "tool.call",
            json!({"session_id": s, "tool": "bash", "args": {"command": "id -u"}}),
        ),
        (
            "schedule.create",
            json!({"session_id": s, "delay_ms": 1, "action": {"prompt": "x"}}),
        ),
    ] {
        let e = other
            .call(method, params.clone())
            .expect_err("another uid's request must be refused");
        assert_eq!(e["code"], -32002, "{method} {params}: {e}");
        assert_eq!(e["data"]["kind"], "permission_denied", "{method}: {e}");
    }
    assert_eq!(c.task(&id)["state"], "running", "root's task is untouched");
    c.ok("task.cancel", json!({"task_id": id, "grace_ms": 100}));
}

#[test]
fn daemon_wide_counters_are_roots_and_say_so_to_anyone_else() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "exit 3", json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    c.wait_settled(&id);

    let root = c.ok("daemon.status", json!({}));
    assert_eq!(root["daemon_wide_counters"], true, "{root}");
    assert!(root["tasks"]["failed"].as_u64().unwrap_or(0) >= 1, "{root}");

    open_socket_to_everyone(&d);
    let other = rpc_as_nobody(&d, "daemon.status", json!({})).expect("daemon.status as nobody");
    assert_eq!(other["daemon_wide_counters"], false, "{other}");
    assert_eq!(other["tasks"]["failed"].as_u64().unwrap_or(0), 0, "{other}");
    assert_eq!(other["wakes_pushed"], 0, "{other}");
    assert_eq!(other["violations"], 0, "{other}");
}
