//! Yield semantics and deadlines (docs/protocol.md): inline answers, `running` handles, detaching,
//! the interactive deadline, explicit timeouts, the detached cap and `task.background`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use sidejob_tests::{wait_until, Daemon, Gate};

#[test]
fn a_fast_call_completes_inline() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "echo fast", json!({"yield_after_ms": 10_000}));
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "succeeded");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["output"], "fast\n");
    assert_eq!(r["output_truncated"], false);
    assert!(r["duration_ms"].is_u64(), "{r}");
    let id = r["task_id"].as_str().expect("task_id");
    assert_eq!(id.len(), 26, "task ids are ULIDs: {id}");
    let t = c.task(id);
    assert_eq!(t["state"], "succeeded");
    assert_eq!(t["delivery"], "inline");
    assert_eq!(t["kind"], "call");
    assert_eq!(t["tool"], "bash");
    assert_eq!(t["session_id"], s.as_str());
}

#[test]
fn a_slow_call_yields_running_and_keeps_going() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The run cannot end before the test opens the gate, so "running" proves the call
    // returned at the yield, with the run still going.
    let gate = Gate::new(&d.workspace, "finish");
    let started = Instant::now();
    let r = c.bash(
        &s,
        &format!("echo begun; {}; echo finished", gate.wait_cmd()),
        json!({"yield_after_ms": 500}),
    );
    let took = started.elapsed();
    assert_eq!(r["status"], "running", "{r}");
    assert!(
        took >= Duration::from_millis(500),
        "answered before yield_after_ms, after {took:?}"
    );
    // The output so far: all of it on any machine that ran `echo` within the 500 ms (the
    // exact check is in the task.background test, which waits for the line first).
    let so_far = r["output"].as_str().unwrap_or_default();
    assert!("begun\n".starts_with(so_far), "the output so far: {r}");
    let id = r["task_id"].as_str().expect("task_id").to_owned();
    let out_path = r["output_path"].as_str().expect("output_path");
    let res_path = r["result_path"].as_str().expect("result_path");
    assert!(
        out_path.ends_with(&format!(".background/{id}/output.log")),
        "{out_path}"
    );
    assert!(
        res_path.ends_with(&format!(".background/{id}/result.json")),
        "{res_path}"
    );
    assert!(Path::new(out_path).exists());
    assert_eq!(c.task(&id)["state"], "running");

    let t = c.wait_then(&d, &id, || gate.open());
    assert_eq!(t["state"], "succeeded", "nothing is killed on yield: {t}");
    assert_eq!(t["exit_code"], 0);
    assert_eq!(t["delivery"], "wait");
    assert_eq!(c.output(&id), "begun\nfinished\n");
    assert!(Path::new(res_path).exists());
}

/// The run waits for a gate the test opens only after the answer, and the configuration
/// would hold a call in the foreground for ten minutes (longer than the client waits for a
/// reply): `running` can only mean the call detached at once.
fn assert_detaches_at_once(extra: serde_json::Value) {
    let d = Daemon::start_with_config(
        "default_yield_after_ms = 600000\ninteractive_deadline_ms = 600000\n",
    );
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "late");
    let r = c.bash(
        &s,
        &format!("{}; echo late", gate.wait_cmd()),
        extra.clone(),
    );
    assert_eq!(r["status"], "running", "{extra}: {r}");
    let id = r["task_id"].as_str().expect("task_id").to_owned();
    gate.open();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id), "late\n");
    assert_ne!(t["delivery"], "inline");
}

#[test]
fn yield_after_zero_detaches_at_once() {
    assert_detaches_at_once(json!({"yield_after_ms": 0}));
}

#[test]
fn background_true_detaches_at_once() {
    assert_detaches_at_once(json!({"background": true, "yield_after_ms": 600_000}));
}

#[test]
fn the_interactive_deadline_ends_a_foreground_call_and_names_the_fix() {
    let d = Daemon::start_with_config("interactive_deadline_ms = 1500\ncancel_grace_ms = 500\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The run never ends on its own (its gate stays shut): only the deadline can end it.
    let gate = Gate::new(&d.workspace, "never");
    let started = Instant::now();
    let r = c.bash(
        &s,
        &format!("echo waiting; {}", gate.wait_cmd()),
        json!({"yield_after_ms": 60_000}),
    );
    let took = started.elapsed();
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "failed", "{r}");
    assert_eq!(r["reason"], "timeout", "{r}");
    assert!(
        took >= Duration::from_millis(1500),
        "the deadline hit early, after {took:?}"
    );
    let advice = format!("{} {}", r["hint"], r["error"]);
    assert!(advice.contains("yield_after_ms"), "{r}");
    assert!(advice.contains("background"), "{r}");
    assert_eq!(r["output"], "waiting\n");
    let t = c.task(r["task_id"].as_str().expect("id"));
    assert_eq!(t["state"], "failed");
    assert_eq!(t["reason"], "timeout");
    assert_eq!(t["delivery"], "inline");
}

#[test]
fn the_interactive_deadline_does_not_apply_once_a_call_has_yielded() {
    let d = Daemon::start_with_config("interactive_deadline_ms = 800\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The gate opens once the run is provably past the deadline: a task.wait that times out
    // after it still finds the run going.
    let gate = Gate::new(&d.workspace, "survive");
    let r = c.bash(
        &s,
        &format!("{}; echo survived", gate.wait_cmd()),
        json!({"yield_after_ms": 200}),
    );
    assert_eq!(r["status"], "running", "{r}");
    let id = r["task_id"].as_str().expect("id").to_owned();
    let started = Instant::now();
    let t = c.wait_for(&id, 1_500);
    assert!(started.elapsed() >= Duration::from_millis(1_500));
    assert_eq!(
        t["state"], "running",
        "the deadline ended a yielded call: {t}"
    );
    gate.open();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id), "survived\n");
}

#[test]
fn an_explicit_timeout_stops_a_detached_run() {
    let d = Daemon::start_with_config("cancel_grace_ms = 500\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "never");
    let r = c.bash(
        &s,
        &gate.wait_cmd(),
        json!({"background": true, "timeout_ms": 700}),
    );
    assert_eq!(r["status"], "running");
    let id = r["task_id"].as_str().expect("id").to_owned();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "timeout", "{t}");
    let ms = t["duration_ms"].as_u64().expect("duration_ms");
    assert!(ms >= 600, "stopped before its timeout, after {ms} ms");
}

#[test]
fn an_explicit_timeout_stops_a_foreground_call() {
    let d = Daemon::start_with_config("cancel_grace_ms = 500\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The gate never opens and the call would stay in the foreground for ten minutes: a
    // completed answer can only come from the timeout.
    let gate = Gate::new(&d.workspace, "never");
    let r = c.bash(
        &s,
        &gate.wait_cmd(),
        json!({"yield_after_ms": 600_000, "timeout_ms": 700}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "failed");
    assert_eq!(r["reason"], "timeout");
}

#[test]
fn the_detached_cap_stops_background_and_yielded_runs() {
    let d = Daemon::start_with_config("detached_cap_ms = 1000\ncancel_grace_ms = 500\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "never");
    let bg = c.bash(&s, &gate.wait_cmd(), json!({"background": true}));
    let yielded = c.bash(&s, &gate.wait_cmd(), json!({"yield_after_ms": 200}));
    assert_eq!(bg["status"], "running");
    assert_eq!(yielded["status"], "running");
    for r in [bg, yielded] {
        let id = r["task_id"].as_str().expect("id").to_owned();
        let t = c.wait_settled(&id);
        assert_eq!(t["state"], "failed", "{t}");
        assert_eq!(t["reason"], "timeout", "{t}");
        let ms = t["duration_ms"].as_u64().expect("duration_ms");
        assert!(ms >= 900, "capped before the cap, after {ms} ms");
    }
}

#[test]
fn an_explicit_timeout_longer_than_the_detached_cap_is_capped() {
    let d = Daemon::start_with_config("detached_cap_ms = 800\ncancel_grace_ms = 300\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "never");
    let r = c.bash(
        &s,
        &gate.wait_cmd(),
        json!({"background": true, "timeout_ms": 60_000}),
    );
    let t = c.wait_settled(r["task_id"].as_str().expect("id"));
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "timeout", "{t}");
}

#[test]
fn task_background_moves_a_blocked_call_to_the_background_now() {
    let d = Daemon::start();
    let mut a = d.client();
    let s = d.open_session(&mut a);
    let sess = s.clone();
    // The run goes on only once the test opens its gate, after the call has answered.
    let gate = Gate::new(&d.workspace, "moved");
    let cmd = format!("echo moving; {}; echo moved", gate.wait_cmd());
    let blocked = std::thread::spawn(move || {
        let r = a.bash(&sess, &cmd, json!({"yield_after_ms": 600_000}));
        (r, a)
    });
    let mut b = d.client();
    // The call's task appears in the session's list once the daemon has taken it, and its
    // first line in the log once the run has printed it.
    let mut id = String::new();
    assert!(
        wait_until(Duration::from_secs(20), || {
            let list = b.ok("task.list", json!({"session_id": s}));
            match list["tasks"].as_array().and_then(|t| t.first()) {
                Some(t) if t["state"] == "running" => {
                    id = t["task_id"].as_str().unwrap_or("").to_owned();
                    b.output(&id) == "moving\n"
                }
                _ => false,
            }
        }),
        "the blocked call's task never showed up as running with its first line"
    );
    let moved = b.ok("task.background", json!({"task_id": id}));
    assert_eq!(moved["backgrounded"], true, "{moved}");
    let (r, mut a) = blocked.join().expect("caller thread");
    assert_eq!(r["status"], "running", "{r}");
    assert_eq!(r["task_id"], id.as_str());
    assert_eq!(r["output"], "moving\n", "the output so far: {r}");
    // A second move is a no-op; the run carries on and settles normally.
    let again = b.ok("task.background", json!({"task_id": id}));
    assert_eq!(again["backgrounded"], false, "{again}");
    gate.open();
    let t = a.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(a.output(&id), "moving\nmoved\n");
    assert_ne!(t["delivery"], "inline");
}

#[test]
fn the_configured_default_yield_applies_when_the_call_names_none() {
    // Without the configured 300 ms the built-in 30 s default would apply, and the 20 s
    // interactive deadline would end the call first (completed, failed/timeout): `running`
    // can only come from the configured default. The run waits for a gate that never opens.
    let d = Daemon::start_with_config(
        "default_yield_after_ms = 300\ninteractive_deadline_ms = 20000\ncancel_grace_ms = 100\n",
    );
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "never");
    let started = Instant::now();
    let r = c.bash(&s, &gate.wait_cmd(), json!({}));
    assert_eq!(
        r["status"], "running",
        "default_yield_after_ms = 300 should yield the call: {r}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[test]
fn a_command_killed_by_a_signal_fails_with_reason_signal() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "echo before; kill -KILL $$", json!({}));
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "failed");
    assert_eq!(r["reason"], "signal", "{r}");
    assert_eq!(r["signal"], 9, "{r}");
    assert_eq!(r["output"], "before\n");
}

#[test]
fn a_workdir_outside_the_workspace_is_refused() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let (code, kind) = c.err(
        "tool.call",
        json!({"session_id": s, "tool": "bash", "args": {"command": "pwd", "workdir": "../.."}}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    std::fs::create_dir_all(d.workspace.join("sub")).expect("subdir");
    let r = c.bash(
        &s,
        "pwd",
        json!({"args": {"command": "pwd", "workdir": "sub"}}),
    );
    let ws = d.workspace.canonicalize().expect("canonical");
    assert_eq!(r["output"], format!("{}/sub\n", ws.display()), "{r}");
}
