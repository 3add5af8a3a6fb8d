//! Yield semantics and deadlines (docs/protocol.md): inline answers, `running` handles, detaching,
//! the interactive deadline, explicit timeouts, the detached cap and `task.background`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use sidejob_tests::{wait_until, Daemon};

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
    let started = Instant::now();
    let r = c.bash(
        &s,
        "echo begun; sleep 1.5; echo finished",
        json!({"yield_after_ms": 500}),
    );
    let took = started.elapsed();
    assert_eq!(r["status"], "running", "{r}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(1400),
        "yielded after {took:?}"
    );
    assert_eq!(r["output"], "begun\n", "the output so far: {r}");
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

    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "nothing is killed on yield: {t}");
    assert_eq!(t["exit_code"], 0);
    assert_eq!(t["delivery"], "wait");
    assert_eq!(c.output(&id), "begun\nfinished\n");
    assert!(Path::new(res_path).exists());
}

fn assert_detaches_at_once(extra: serde_json::Value) {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let started = Instant::now();
    let r = c.bash(&s, "sleep 1; echo late", extra.clone());
    assert_eq!(r["status"], "running", "{extra}: {r}");
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "{extra}: detaching took {:?}",
        started.elapsed()
    );
    let id = r["task_id"].as_str().expect("task_id").to_owned();
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
    assert_detaches_at_once(json!({"background": true, "yield_after_ms": 60_000}));
}

#[test]
fn the_interactive_deadline_ends_a_foreground_call_and_names_the_fix() {
    let d = Daemon::start_with_config("interactive_deadline_ms = 1500\ncancel_grace_ms = 500\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let started = Instant::now();
    let r = c.bash(
        &s,
        "echo waiting; sleep 30",
        json!({"yield_after_ms": 60_000}),
    );
    let took = started.elapsed();
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "failed", "{r}");
    assert_eq!(r["reason"], "timeout", "{r}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_millis(5000),
        "the deadline hit after {took:?}"
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
    let r = c.bash(
        &s,
        "sleep 1.5; echo survived",
        json!({"yield_after_ms": 200}),
    );
    assert_eq!(r["status"], "running", "{r}");
    let id = r["task_id"].as_str().expect("id").to_owned();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id), "survived\n");
}

#[test]
fn an_explicit_timeout_stops_a_detached_run() {
    let d = Daemon::start_with_config("cancel_grace_ms = 500\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(
        &s,
        "sleep 30",
        json!({"background": true, "timeout_ms": 700}),
    );
    assert_eq!(r["status"], "running");
    let id = r["task_id"].as_str().expect("id").to_owned();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "timeout", "{t}");
    let ms = t["duration_ms"].as_u64().expect("duration_ms");
    assert!((600..5000).contains(&ms), "stopped after {ms} ms");
}

#[test]
fn an_explicit_timeout_stops_a_foreground_call() {
    let d = Daemon::start_with_config("cancel_grace_ms = 500\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let started = Instant::now();
    let r = c.bash(
        &s,
        "sleep 30",
        json!({"yield_after_ms": 20_000, "timeout_ms": 700}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "failed");
    assert_eq!(r["reason"], "timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_detached_cap_stops_background_and_yielded_runs() {
    let d = Daemon::start_with_config("detached_cap_ms = 1000\ncancel_grace_ms = 500\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let bg = c.bash(&s, "sleep 30", json!({"background": true}));
    let yielded = c.bash(&s, "sleep 30", json!({"yield_after_ms": 200}));
    assert_eq!(bg["status"], "running");
    assert_eq!(yielded["status"], "running");
    for r in [bg, yielded] {
        let id = r["task_id"].as_str().expect("id").to_owned();
        let t = c.wait_settled(&id);
        assert_eq!(t["state"], "failed", "{t}");
        assert_eq!(t["reason"], "timeout", "{t}");
        let ms = t["duration_ms"].as_u64().expect("duration_ms");
        assert!((900..6000).contains(&ms), "capped after {ms} ms");
    }
}

#[test]
fn an_explicit_timeout_longer_than_the_detached_cap_is_capped() {
    let d = Daemon::start_with_config("detached_cap_ms = 800\ncancel_grace_ms = 300\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(
        &s,
        "sleep 30",
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
    let blocked = std::thread::spawn(move || {
        let started = Instant::now();
        let r = a.bash(
            &sess,
            "echo moving; sleep 2; echo moved",
            json!({"yield_after_ms": 60_000}),
        );
        (r, started.elapsed(), a)
    });
    let mut b = d.client();
    // The call's task appears in the session's list once the daemon has taken it.
    let mut id = String::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let list = b.ok("task.list", json!({"session_id": s}));
            match list["tasks"].as_array().and_then(|t| t.first()) {
                Some(t) if t["state"] == "running" => {
                    id = t["task_id"].as_str().unwrap_or("").to_owned();
                    true
                }
                _ => false,
            }
        }),
        "the blocked call's task never showed up as running"
    );
    let moved = b.ok("task.background", json!({"task_id": id}));
    assert_eq!(moved["backgrounded"], true, "{moved}");
    let (r, took, mut a) = blocked.join().expect("caller thread");
    assert_eq!(r["status"], "running", "{r}");
    assert_eq!(r["task_id"], id.as_str());
    assert!(
        took < Duration::from_millis(1900),
        "the call returned after {took:?}"
    );
    // A second move is a no-op; the run carries on and settles normally.
    let again = b.ok("task.background", json!({"task_id": id}));
    assert_eq!(again["backgrounded"], false, "{again}");
    let t = a.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(a.output(&id), "moving\nmoved\n");
    assert_ne!(t["delivery"], "inline");
}

#[test]
fn the_configured_default_yield_applies_when_the_call_names_none() {
    let d = Daemon::start_with_config("default_yield_after_ms = 300\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let started = Instant::now();
    let r = c.bash(&s, "sleep 3", json!({}));
    assert_eq!(
        r["status"],
        "running",
        "default_yield_after_ms = 300 should yield a 3 s call (took {:?}): {r}",
        started.elapsed()
    );
    assert!(started.elapsed() < Duration::from_millis(2_000));
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
