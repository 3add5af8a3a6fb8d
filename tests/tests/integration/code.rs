//! The `code` tool (docs/plugins.md): scripts that call tools through the bridge, and a question
//! answered by the host.

use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{skip_without, wait_until, Client, Daemon, Gate, Need};

pub(crate) fn code(
    c: &mut Client,
    session: &str,
    language: &str,
    script: &str,
    extra: Value,
) -> Value {
    let mut p = json!({"session_id": session, "tool": "code", "args": {"language": language, "code": script}});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        p[k] = v;
    }
    c.ok("tool.call", p)
}

#[test]
fn a_python_script_starts_a_background_job_through_the_bridge_waits_and_returns_its_output() {
    if skip_without(&[Need::Python3]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let script = r#"
job = tools.bash("sleep 0.3; echo from-the-job", {"background": True})
assert job["status"] == "running", job
done = tools.jobs.wait(job["task_id"])
print("state:", done["state"])
print("parent:", done.get("parent_task_id"))
print("output:", tools.jobs.output(job["task_id"]).strip())
print("listed:", any(t["task_id"] == job["task_id"] for t in tools.jobs.list()))
"#;
    let r = code(
        &mut c,
        &s,
        "python",
        script,
        json!({"yield_after_ms": 60_000}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "succeeded", "{r}\n{}", d.log());
    let out = r["output"].as_str().unwrap();
    assert!(out.contains("state: succeeded"), "{out}");
    assert!(out.contains("output: from-the-job"), "{out}");
    assert!(out.contains("listed: True"), "{out}");
    assert!(
        out.contains(&format!("parent: {}", r["task_id"].as_str().unwrap())),
        "{out}"
    );
    // The job is a task of the same session, a child of the script's task.
    let tasks = c.ok("task.list", json!({"session_id": s}))["tasks"]
        .as_array()
        .unwrap()
        .clone();
    let job = tasks
        .iter()
        .find(|t| t["tool"] == "bash")
        .expect("the job is listed");
    assert_eq!(job["parent_task_id"], r["task_id"]);
}

#[test]
fn a_javascript_script_does_the_same_with_promises() {
    if skip_without(&[Need::Node]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let script = r#"
const job = await tools.bash("sleep 0.2; echo js-job", {background: true});
const done = await tools.jobs.wait(job.task_id);
console.log("state:", done.state);
console.log("output:", (await tools.jobs.output(job.task_id)).trim());
"#;
    let r = code(
        &mut c,
        &s,
        "javascript",
        script,
        json!({"yield_after_ms": 60_000}),
    );
    assert_eq!(r["state"], "succeeded", "{r}");
    let out = r["output"].as_str().unwrap();
    assert!(
        out.contains("state: succeeded") && out.contains("output: js-job"),
        "{out}"
    );
}

#[test]
fn a_script_waits_for_input_and_the_host_answers_with_task_answer() {
    if skip_without(&[Need::Python3]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The script asks only once the test opens the gate, so "too early" is certain.
    let gate = Gate::new(&d.workspace, "ask");
    let script = format!(
        r#"
import json
print("started", flush=True)
open({gate:?}).close()
answer = tools.request_input({{"type": "object", "properties": {{"go": {{"type": "boolean"}}}}}}, "Deploy now?")
print("answer:", json.dumps(answer))
"#,
        gate = gate.path().display().to_string()
    );
    let r = code(&mut c, &s, "python", &script, json!({"background": true}));
    let id = r["task_id"].as_str().unwrap().to_owned();
    // Answering before the script has asked is refused, and the script is unharmed.
    assert!(
        wait_until(Duration::from_secs(20), || c
            .output(&id)
            .contains("started")),
        "{}",
        d.log()
    );
    let (code_, kind) = c.err(
        "task.answer",
        json!({"task_id": id, "answer": {"go": false}}),
    );
    assert_eq!((code_, kind.as_str()), (-32005, "invalid_state"));
    assert_eq!(c.task(&id)["state"], "running");
    gate.open();
    let mut probe = d.client();
    assert!(
        wait_until(Duration::from_secs(20), || probe.task(&id)["state"]
            == "awaiting_input"),
        "{}",
        d.log()
    );
    let status = c.ok("session.status", json!({"session_id": s}));
    assert_eq!(status["awaiting_input"], 1, "{status}");
    // The host is told: an action_required notification carries the prompt and the schema.
    let inbox = c.ok("inbox.list", json!({"session_id": s}));
    let asked = inbox["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["task_id"] == id.as_str() && n["severity"] == "action_required")
        .unwrap_or_else(|| panic!("no action_required notification: {inbox}"))
        .clone();
    let text = asked["text"].as_str().unwrap();
    assert!(
        text.contains("Deploy now?") && text.contains("boolean"),
        "{text}"
    );
    let a = c.ok(
        "task.answer",
        json!({"task_id": id, "answer": {"go": true}}),
    );
    assert_eq!(a["state"], "running", "{a}");
    // A second answer has nobody to go to.
    let (code, kind) = c.err("task.answer", json!({"task_id": id, "answer": 1}));
    assert_eq!((code, kind.as_str()), (-32005, "invalid_state"));
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert!(
        c.output(&id).contains(r#"answer: {"go": true}"#),
        "{}",
        c.output(&id)
    );
}

#[test]
fn a_question_open_when_the_daemon_dies_does_not_leave_the_task_awaiting_input() {
    if skip_without(&[Need::Python3]) {
        return;
    }
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let script = r#"
try:
    tools.request_input({"type": "string"}, "Still there?")
    print("answered")
except ToolError as e:
    print("no answer:", e)
"#;
    let r = code(&mut c, &s, "python", script, json!({"background": true}));
    let id = r["task_id"].as_str().unwrap().to_owned();
    assert!(
        wait_until(Duration::from_secs(20), || c.task(&id)["state"]
            == "awaiting_input"),
        "{}",
        d.log()
    );
    d.restart();
    let mut c = d.client();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert!(c.output(&id).contains("no answer:"), "{}", c.output(&id));
}

#[test]
fn a_script_keeps_its_bridge_across_a_daemon_restart() {
    if skip_without(&[Need::Python3]) {
        return;
    }
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let script = r#"
import os, time
tools.jobs.list()
print("connected", flush=True)
while not os.path.exists("restarted"):
    time.sleep(0.02)
for attempt in range(200):
    try:
        r = tools.bash("echo after-restart")
        print("after:", r["output"].strip())
        break
    except ToolError:
        time.sleep(0.05)
"#;
    let r = code(&mut c, &s, "python", script, json!({"background": true}));
    let id = r["task_id"].as_str().unwrap().to_owned();
    assert!(
        wait_until(Duration::from_secs(20), || c
            .output(&id)
            .contains("connected")),
        "{}",
        d.log()
    );
    d.restart();
    std::fs::write(d.workspace.join("restarted"), b"").unwrap();
    let mut c = d.client();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert!(
        c.output(&id).contains("after: after-restart"),
        "{}\n{}",
        c.output(&id),
        d.log()
    );
}
