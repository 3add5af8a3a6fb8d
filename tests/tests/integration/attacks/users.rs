//! Issue 9, the parts on main: one socket user cannot take another's session id, root acts
//! in another user's session only when it says so (and then as that user), a run's narrowed
//! profile bounds what it starts through its bridge, and a restarted daemon takes a bridge's
//! scope from the registry, never from a file in a directory the caller controls.

use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{wait_until, Client};

use super::{
    as_nobody, daemon, nobody, open_with_own_session_dir, present, refused, Gate, NobodyDir, NOBODY,
};
use sidejob_tests::{skip_without, Need};

#[test]
fn attack_reserved_session_ids_cannot_be_squatted() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    for id in ["cli-0-5f2a9c", "mcp-0-5f2a9c", "cli-0-x"] {
        refused(
            &mut n,
            "session.open",
            json!({"session_id": id, "workspace": ws.path()}),
            "permission_denied",
        );
    }
    // Positive control: their own reserved ids are theirs.
    let r = n.ok(
        "session.open",
        json!({"session_id": format!("cli-{NOBODY}-5f2a9c"), "workspace": ws.path()}),
    );
    assert_eq!(r["owner_uid"], NOBODY, "{r}");
    // And root's stay free for root, who gets its own session there.
    let mut c = d.client();
    let r = c.ok(
        "session.open",
        json!({"session_id": "cli-0-5f2a9c", "workspace": d.workspace}),
    );
    assert_eq!(r["owner_uid"], 0, "{r}");
    let r = c.bash("cli-0-5f2a9c", "id -u", json!({}));
    assert_eq!(r["output"], "0\n", "{r}");
    // Root does not take a user's reserved id either.
    refused(
        &mut c,
        "session.open",
        json!({"session_id": format!("cli-{NOBODY}-other"), "workspace": d.workspace}),
        "permission_denied",
    );
}

#[test]
fn attack_root_acts_in_another_users_session_only_when_adopting() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    n.ok(
        "session.open",
        json!({"session_id": "theirs", "workspace": ws.path()}),
    );
    let mut c = d.client();
    let open = json!({"session_id": "theirs", "workspace": ws.path()});
    refused(&mut c, "session.open", open.clone(), "permission_denied");
    let call = json!({"session_id": "theirs", "tool": "bash", "args": {"command": "id -u > by-root; id -u"}});
    refused(&mut c, "tool.call", call.clone(), "permission_denied");
    let marker = ws.join("scheduled");
    let schedule = json!({"session_id": "theirs", "delay_ms": 0,
        "action": {"call": {"tool": "bash", "args": {"command": format!("id -u > {}", marker.display())}}}});
    refused(
        &mut c,
        "schedule.create",
        schedule.clone(),
        "permission_denied",
    );
    assert!(
        !present(&ws.join("by-root")) && !present(&marker),
        "a refused call ran"
    );

    // With adopt: root acts there, visibly, and everything runs as the session's owner.
    let mut open = open;
    open["adopt"] = json!(true);
    let r = c.ok("session.open", open);
    assert_eq!(r["owner_uid"], NOBODY, "{r}");
    let mut call = call;
    call["adopt"] = json!(true);
    let r = c.ok("tool.call", call);
    assert_eq!(r["state"], "succeeded", "{r}");
    assert_eq!(r["output"], format!("{NOBODY}\n"), "{r}");
    assert_eq!(super::mode_uid(&ws.join("by-root")).1, NOBODY);
    let mut schedule = schedule;
    schedule["adopt"] = json!(true);
    c.ok("schedule.create", schedule);
    assert!(
        wait_until(Duration::from_secs(60), || std::fs::read_to_string(&marker)
            .is_ok_and(|s| !s.is_empty())),
        "the adopted schedule did not fire"
    );
    assert_eq!(
        std::fs::read_to_string(&marker).expect("marker"),
        format!("{NOBODY}\n")
    );
    // The owner sees root's work in their session, and a notice that root adopted it.
    let tasks = n.ok("task.list", json!({"session_id": "theirs"}));
    assert!(
        tasks["tasks"].as_array().is_some_and(|t| !t.is_empty()),
        "{tasks}"
    );
    let inbox = n.ok("inbox.list", json!({"session_id": "theirs"}));
    let adopted: Vec<&Value> = inbox["notifications"]
        .as_array()
        .expect("notifications")
        .iter()
        .filter(|x| x["kind"] == "adopted")
        .collect();
    assert_eq!(adopted.len(), 3, "one notice per adopting request: {inbox}");
    assert!(
        adopted[0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("uid 0")),
        "{inbox}"
    );
}

fn code(c: &mut Client, session: &str, script: &str, extra: Value) -> Value {
    let mut p = json!({"session_id": session, "tool": "code",
        "args": {"language": "python", "code": script}, "yield_after_ms": 120_000});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        p[k] = v;
    }
    c.ok("tool.call", p)
}

#[test]
fn attack_a_narrowed_code_run_cannot_write_through_its_bridge() {
    if skip_without(&[Need::Python3]) {
        return;
    }
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let s = n.open_session_in(ws.path());
    let script = |file: &str| {
        format!(
            r#"
try:
    r = tools.bash("echo x > {file}; echo rc=$?")
    print("bridge call:", r.get("state"), r.get("output", "").strip())
except ToolError as e:
    print("bridge call refused:", e)
try:
    r = tools.bash("echo x > {file}-wider; echo rc=$?", {{"profile": "workspace-write"}})
    print("wider bridge call:", r.get("state"), r.get("output", "").strip())
except ToolError as e:
    print("wider bridge call refused:", e)
try:
    open("{file}-direct", "w").write("x")
    print("direct write: ok")
except OSError as e:
    print("direct write:", e)
"#
        )
    };
    let narrowed = code(
        &mut n,
        &s,
        &script("narrowed"),
        json!({"profile": "read-only"}),
    );
    eprintln!("narrowed: {}", narrowed["output"]);
    assert!(
        !present(&ws.join("narrowed-direct")),
        "premise: the read-only run wrote the workspace itself: {narrowed}"
    );
    assert!(
        !present(&ws.join("narrowed")),
        "the read-only run wrote the workspace through its bridge: {narrowed}"
    );
    assert!(
        !present(&ws.join("narrowed-wider")),
        "the read-only run widened a bridge call back to workspace-write: {narrowed}"
    );
    // Positive control: the same under the session's workspace-write writes both ways.
    let wide = code(&mut n, &s, &script("wide"), json!({}));
    assert_eq!(wide["state"], "succeeded", "{wide}");
    assert!(present(&ws.join("wide")), "control: {wide}");
    assert!(present(&ws.join("wide-direct")), "control: {wide}");
}

/// Before a restart, uid 65534 plants `bridge.json` (the file an older daemon rebuilt a
/// bridge from) in its own run directory, naming root's session and uid 0. After the restart
/// the run's bridge still serves only its own session, as its own uid.
#[test]
fn attack_a_restarted_daemon_takes_no_bridge_scope_from_files() {
    if skip_without(&[Need::Python3]) {
        return;
    }
    let Some(mut d) = daemon() else { return };
    let mut c = d.client();
    let root_ws = sidejob_tests::TempDir::new("root-ws");
    c.ok(
        "session.open",
        json!({"session_id": "root-s", "workspace": root_ws.path()}),
    );
    let mut n = nobody(&d);
    let (ws, _home, sd) = open_with_own_session_dir(&mut n, "nb");
    let gate = Gate::new(ws.path());
    let script = format!(
        r#"
import json, os, time
open("{ready}", "w").close()
while not os.path.exists("{gate}"):
    time.sleep(0.02)
out = {{}}
r = tools.bash("id -u")
out["uid"] = r.get("output", "").strip()
out["task"] = r.get("task_id")
def kind(method, params):
    try:
        tools.rpc(method, params)
        return "ok"
    except ToolError as e:
        return e.error.get("data", {{}}).get("kind", str(e))
out["root session"] = kind("tool.call", {{"session_id": "root-s", "tool": "bash", "args": {{"command": "id -u > {root_marker}"}}}})
out["root list"] = kind("task.list", {{"session_id": "root-s"}})
print(json.dumps(out))
"#,
        ready = gate.ready.display(),
        gate = gate.gate.display(),
        root_marker = root_ws.path().join("from-bridge").display(),
    );
    let r = code(&mut n, "nb", &script, json!({"background": true}));
    let id = r["task_id"].as_str().expect("task_id").to_owned();
    gate.wait_ready(&mut n, &id);

    let forged = json!({"session_id": "root-s", "caller_task_id": id, "caller_session_id": "root-s",
        "owner_uid": 0, "owner_gid": 0, "run_as": [NOBODY, NOBODY], "ceiling": "workspace-write"});
    let run_dir = sd.join(".background").join(&id);
    as_nobody(&format!(
        "rm -f {dir}/bridge.json; printf '%s' '{forged}' > {dir}/bridge.json",
        dir = run_dir.display()
    ));
    d.restart();
    // A reply on the control socket means start-up (recovery, bridges served again, the
    // socket handed to its group) is done.
    super::socket_handed_to_group(&d);
    let mut n = nobody(&d);
    gate.open();
    let t = n.wait_settled(&id);
    let output = n.output(&id);
    assert_eq!(t["state"], "succeeded", "{t}\n{output}\n{}", d.log());
    let out: Value =
        serde_json::from_str(output.trim()).unwrap_or_else(|e| panic!("{e}: {output}"));
    assert_eq!(
        out["uid"],
        NOBODY.to_string(),
        "bridge calls after the restart: {out}"
    );
    assert_eq!(out["root session"], "permission_denied", "{out}");
    assert_eq!(out["root list"], "permission_denied", "{out}");
    assert!(!present(&root_ws.path().join("from-bridge")));
    // The call it made is a task of its own session, a child of the run.
    let child = n.task(out["task"].as_str().expect("task id"));
    assert_eq!(child["session_id"], "nb", "{child}");
    assert_eq!(child["parent_task_id"], id.as_str(), "{child}");
    let root_tasks = d.client().ok("task.list", json!({"session_id": "root-s"}));
    assert_eq!(root_tasks["tasks"], json!([]), "{root_tasks}");
}

/// The CLI (and `sidejob mcp`) derive their session id from the working directory and the
/// caller's uid (`cli-<uid>-<hash of cwd>`), an id reserved for that uid: uid 65534 cannot
/// open the id root's CLI will use in root's project first, and root's `sidejob call` there
/// works.
#[test]
fn another_user_cannot_squat_the_session_id_roots_cli_derives() {
    let Some(d) = daemon() else { return };
    // Learn the id root's CLI derives in its workspace, from a throwaway daemon.
    let id = {
        let probe = sidejob_tests::Daemon::start();
        std::fs::remove_dir(&probe.workspace).expect("rm");
        std::os::unix::fs::symlink(&d.workspace, &probe.workspace).expect("same cwd");
        let o = probe.cli(&["call", "--", "true"]);
        assert!(o.status.success(), "{o:?}");
        let list = probe.client().ok("session.list", json!({}));
        list["sessions"][0]["session_id"]
            .as_str()
            .expect("session id")
            .to_owned()
    };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let squat = n.call(
        "session.open",
        json!({"session_id": id, "workspace": ws.path()}),
    );
    let o = d.cli(&["call", "--", "echo", "root's command"]);
    assert!(
        o.status.success(),
        "root's `sidejob call` failed after uid {NOBODY} opened {id} ({squat:?}): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "root's command\n");
}
