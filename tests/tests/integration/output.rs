//! Files on disk (docs/protocol.md), the output cap (docs/protocol.md) and `task.output` paging (docs/protocol.md).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sidejob_tests::Daemon;

fn read_json(path: &str) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn output_log_and_result_json_are_written_in_the_run_directory() {
    let d = Daemon::start();
    let mut c = d.client();
    let opened = c.ok("session.open", json!({"workspace": d.workspace}));
    let s = opened["session_id"].as_str().expect("id").to_owned();
    let session_dir = opened["session_dir"]
        .as_str()
        .expect("session_dir")
        .to_owned();
    let r = c.bash(&s, "echo out; echo err >&2; exit 2", json!({}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    let run_dir = Path::new(&session_dir).join(".background").join(&id);
    assert_eq!(
        r["output_path"],
        run_dir.join("output.log").display().to_string()
    );
    assert_eq!(
        r["result_path"],
        run_dir.join("result.json").display().to_string()
    );
    assert!(
        !run_dir.starts_with(&d.workspace),
        "runs never live in the workspace"
    );

    let log = std::fs::read_to_string(run_dir.join("output.log")).expect("output.log");
    assert_eq!(log, "out\nerr\n");
    let res = read_json(r["result_path"].as_str().expect("path"));
    for field in [
        "task_id",
        "session_id",
        "tool",
        "state",
        "reason",
        "exit_code",
        "signal",
        "started_at",
        "ended_at",
        "duration_ms",
        "output_path",
        "output_bytes",
        "output_truncated",
        "leftover_processes",
        "profile",
        "sandbox_layers",
    ] {
        assert!(res.get(field).is_some(), "result.json lacks {field}: {res}");
    }
    assert_eq!(res["task_id"], id.as_str());
    assert_eq!(res["session_id"], s.as_str());
    assert_eq!(res["tool"], "bash");
    assert_eq!(res["state"], "failed");
    assert_eq!(res["reason"], "exit_code");
    assert_eq!(res["exit_code"], 2);
    assert_eq!(res["output_bytes"], 8);
    assert_eq!(res["output_truncated"], false);
    assert_eq!(res["output_path"], r["output_path"]);
    assert!(res["sandbox_layers"].is_array());
    for ts in ["started_at", "ended_at"] {
        let v = res[ts].as_str().expect(ts);
        assert!(
            v.ends_with('Z') && v.contains('T'),
            "{ts} is not RFC 3339 UTC: {v}"
        );
    }
    // No temporary file is left next to it.
    let names: Vec<String> = std::fs::read_dir(&run_dir)
        .expect("run dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
}

#[test]
fn the_output_cap_keeps_head_and_tail_without_slowing_the_command() {
    let d = Daemon::start_with_config("max_output_bytes = 100000\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let started = Instant::now();
    let r = c.bash(
        &s,
        "echo THE-START; yes | head -c 5000000; echo; echo THE-END",
        json!({"yield_after_ms": 60_000}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "succeeded", "the command is never blocked: {r}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(r["output_truncated"], true, "{r}");
    let out_path = r["output_path"].as_str().expect("output_path");
    let log = std::fs::read(out_path).expect("output.log");
    let total = 10 + 5_000_000 + 1 + 8;
    assert!(
        log.len() < 100_000 + 1024 * 1024 + 200,
        "output.log holds {} bytes",
        log.len()
    );
    assert!(log.len() >= 100_000 + 1024 * 1024, "{} bytes", log.len());
    assert!(log.starts_with(b"THE-START\ny\ny\n"));
    assert!(log.ends_with(b"y\n\nTHE-END\n"), "the tail is kept");
    let text = String::from_utf8_lossy(&log);
    assert!(text.contains("[sidejob: output truncated"), "no marker");
    let omitted = total - 100_000 - 1024 * 1024;
    assert!(
        text.contains(&format!("{omitted} bytes omitted")),
        "the marker should say {omitted} bytes were omitted"
    );
    let t = c.task(r["task_id"].as_str().expect("id"));
    assert_eq!(t["output_truncated"], true, "{t}");
    let res = read_json(t["result_path"].as_str().expect("result_path"));
    assert_eq!(res["output_truncated"], true);
    let page = c.ok(
        "task.output",
        json!({"task_id": t["task_id"], "tail_bytes": 8}),
    );
    assert_eq!(page["data"], "THE-END\n");
    assert_eq!(page["truncated"], true);
}

#[test]
fn task_output_pages_by_offset_max_bytes_and_tail_bytes() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "printf 0123456789", json!({}));
    let id = r["task_id"].as_str().expect("id");
    let p = c.ok(
        "task.output",
        json!({"task_id": id, "offset": 3, "max_bytes": 4}),
    );
    assert_eq!(
        p,
        json!({"data": "3456", "offset": 3, "next_offset": 7, "size": 10, "eof": false, "truncated": false})
    );
    let p = c.ok(
        "task.output",
        json!({"task_id": id, "offset": 7, "max_bytes": 100}),
    );
    assert_eq!(p["data"], "789");
    assert_eq!(p["next_offset"], 10);
    assert_eq!(p["eof"], true, "terminal and at the end: {p}");
    let p = c.ok("task.output", json!({"task_id": id, "tail_bytes": 4}));
    assert_eq!(p["data"], "6789");
    assert_eq!(p["offset"], 6);
    assert_eq!(p["eof"], true);
    let p = c.ok("task.output", json!({"task_id": id}));
    assert_eq!(p["data"], "0123456789");
    assert_eq!(p["offset"], 0);
    let p = c.ok("task.output", json!({"task_id": id, "offset": 500}));
    assert_eq!(p["data"], "");
    assert_eq!(p["next_offset"], 10);
    assert_eq!(p["eof"], true);
}

#[test]
fn task_output_is_not_eof_while_the_task_runs() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = sidejob_tests::Gate::new(&d.workspace, "never");
    let r = c.bash(
        &s,
        &format!("echo partial; {}", gate.wait_cmd()),
        json!({"background": true}),
    );
    assert_eq!(r["status"], "running", "{r}");
    let id = r["task_id"].as_str().expect("id").to_owned();
    // The line is in the log once the run has printed it (however long that takes here); the
    // run itself cannot end before the test cancels it.
    assert!(sidejob_tests::wait_until(Duration::from_secs(20), || c
        .output(&id)
        == "partial\n"));
    let p = c.ok("task.output", json!({"task_id": id, "offset": 0}));
    assert_eq!(p["data"], "partial\n");
    assert_eq!(p["next_offset"], p["size"]);
    assert_eq!(p["eof"], false, "the run is still going: {p}");
    c.ok("task.cancel", json!({"task_id": id, "grace_ms": 100}));
    let p = c.ok("task.output", json!({"task_id": id, "offset": 8}));
    assert_eq!(p["eof"], true, "{p}");
}

#[test]
fn invalid_utf8_output_is_replaced_not_refused() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "printf 'a\\377b'", json!({}));
    assert_eq!(r["output"], "a\u{FFFD}b", "{r}");
    let p = c.ok("task.output", json!({"task_id": r["task_id"]}));
    assert_eq!(p["data"], "a\u{FFFD}b");
    assert_eq!(p["size"], 3);
}

#[test]
fn a_long_inline_answer_is_cut_but_output_log_has_all_of_it() {
    let d = Daemon::start_with_config("inline_output_bytes = 200\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "echo FIRST; seq 1 1000; echo LAST", json!({}));
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["output_truncated"], true, "{r}");
    let inline = r["output"].as_str().expect("output");
    assert!(
        inline.starts_with("FIRST\n") && inline.ends_with("LAST\n"),
        "{inline}"
    );
    assert!(inline.len() < 600, "{} bytes inline", inline.len());
    let full = c.output(r["task_id"].as_str().expect("id"));
    assert!(full.starts_with("FIRST\n1\n2\n") && full.ends_with("999\n1000\nLAST\n"));
    let t = c.task(r["task_id"].as_str().expect("id"));
    assert_eq!(
        t["output_truncated"], false,
        "output.log itself is whole: {t}"
    );
}

#[test]
fn task_output_of_a_queued_task_is_empty_and_not_eof() {
    let d = Daemon::start_with_config("max_running = 1\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let first = c.bash(&s, "sleep 30", json!({"background": true}));
    let mut t = Value::Null;
    assert!(sidejob_tests::wait_until(Duration::from_secs(10), || {
        t = c.task(first["task_id"].as_str().unwrap_or(""));
        t["state"] == "running"
    }));
    let queued = c.bash(&s, "echo later", json!({"background": true}));
    let p = c.ok("task.output", json!({"task_id": queued["task_id"]}));
    assert_eq!(
        p,
        json!({"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": false, "truncated": false})
    );
    c.ok(
        "task.cancel",
        json!({"task_id": first["task_id"], "grace_ms": 100}),
    );
}
