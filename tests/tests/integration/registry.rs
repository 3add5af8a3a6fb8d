//! The registry (ARCHITECTURE.md): the event log rebuilds the rows (`sidejob replay --check`), and
//! `task.list` history.

use std::process::Command;

use serde_json::json;
use sidejob_tests::{sidejob_bin, Daemon};

fn replay_check(d: &Daemon) -> std::process::Output {
    Command::new(sidejob_bin())
        .args(["replay", "--check", "--state-dir"])
        .arg(&d.state_dir)
        .output()
        .expect("run sidejob replay")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn replay_check_passes_after_a_mixed_workload_and_fails_after_tampering() {
    let mut d = Daemon::start_with_config("cancel_grace_ms = 300\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // Inline success and failure, a yielded run, a waited background run, a cancel, a timeout,
    // a closed session with a live task, and a reopened session.
    c.bash(&s, "echo ok", json!({}));
    c.bash(&s, "exit 9", json!({}));
    let y = c.bash(&s, "sleep 0.5", json!({"yield_after_ms": 100}));
    let bg = c.bash(&s, "echo bg", json!({"background": true}));
    let live = c.bash(&s, "sleep 30", json!({"background": true}));
    c.ok("task.cancel", json!({"task_id": live["task_id"]}));
    let to = c.bash(
        &s,
        "sleep 30",
        json!({"background": true, "timeout_ms": 300}),
    );
    for r in [&y, &bg, &to] {
        c.wait_settled(r["task_id"].as_str().expect("id"));
    }
    let s2 = d.open_session(&mut c);
    c.bash(&s2, "sleep 30", json!({"background": true}));
    c.ok("session.close", json!({"session_id": s2}));
    c.ok(
        "session.open",
        json!({"session_id": s2, "workspace": d.workspace}),
    );
    let done = c.bash(&s2, "echo again", json!({}));
    assert_eq!(done["state"], "succeeded");

    let o = replay_check(&d);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // Stop the daemon, then change a row behind the event log's back.
    assert_eq!(d.terminate(), Some(0));
    let db = rusqlite::Connection::open(d.state_dir.join("sidejob.db")).expect("open db");
    let id = done["task_id"].as_str().expect("id");
    let n = db
        .execute(
            "UPDATE tasks SET exit_code = 77 WHERE task_id = ?1",
            rusqlite::params![id],
        )
        .expect("tamper");
    assert_eq!(n, 1);
    drop(db);
    let o = replay_check(&d);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(id),
        "the difference names the task: {}",
        text(&o)
    );
}

#[test]
fn replay_check_notices_a_row_without_events() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "true", json!({}));
    assert_eq!(d.terminate(), Some(0));
    let db = rusqlite::Connection::open(d.state_dir.join("sidejob.db")).expect("open db");
    // A copy of the task under a new id, inserted without an event.
    let id = r["task_id"].as_str().expect("id");
    let last = if id.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{last}", &id[..25]);
    let n = db
        .execute(
            "INSERT INTO tasks SELECT * FROM tasks WHERE task_id = ?1",
            rusqlite::params![id],
        )
        .err();
    assert!(n.is_some(), "the primary key refuses a plain copy");
    db.execute_batch(&format!(
        "CREATE TEMP TABLE t AS SELECT * FROM tasks WHERE task_id = '{id}';
         UPDATE t SET task_id = '{forged}';
         INSERT INTO tasks SELECT * FROM t;"
    ))
    .expect("forge a row");
    drop(db);
    let o = replay_check(&d);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&forged),
        "{}",
        text(&o)
    );
}

#[test]
fn task_list_shows_live_tasks_and_the_25_most_recent_terminal_ones() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mut finished = Vec::new();
    for i in 0..30 {
        let r = c.bash(&s, &format!("echo {i}"), json!({}));
        assert_eq!(r["state"], "succeeded");
        finished.push(r["task_id"].as_str().expect("id").to_owned());
    }
    let mut live = Vec::new();
    for _ in 0..2 {
        let r = c.bash(&s, "sleep 30", json!({"background": true}));
        live.push(r["task_id"].as_str().expect("id").to_owned());
    }
    let list = c.ok("task.list", json!({"session_id": s}));
    let ids: Vec<String> = list["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["task_id"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(ids.len(), 27, "2 live + 25 terminal: {ids:?}");
    for l in &live {
        assert!(ids.contains(l), "live task {l} missing");
    }
    for old in &finished[..5] {
        assert!(!ids.contains(old), "{old} is older than the 25 most recent");
    }
    for recent in &finished[5..] {
        assert!(
            ids.contains(recent),
            "{recent} is one of the 25 most recent"
        );
    }
    let running = c.ok(
        "task.list",
        json!({"session_id": s, "states": ["queued", "running"]}),
    );
    assert_eq!(
        running["tasks"].as_array().map(Vec::len),
        Some(2),
        "{running}"
    );
    for l in &live {
        c.ok("task.cancel", json!({"task_id": l, "grace_ms": 100}));
    }
}

#[test]
fn a_live_task_older_than_the_history_is_still_listed() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let old = c.bash(&s, "sleep 30", json!({"background": true}));
    let old = old["task_id"].as_str().expect("id").to_owned();
    for i in 0..27 {
        c.bash(&s, &format!("echo {i}"), json!({}));
    }
    let list = c.ok("task.list", json!({"session_id": s}));
    let tasks = list["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 26, "1 live + 25 terminal");
    assert!(tasks.iter().any(|t| t["task_id"] == old.as_str()));
    c.ok("task.cancel", json!({"task_id": old, "grace_ms": 100}));
}

#[test]
fn every_state_change_of_a_yielded_task_is_in_the_event_log() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "sleep 0.5", json!({"yield_after_ms": 100}));
    assert_eq!(r["status"], "running");
    let id = r["task_id"].as_str().expect("id").to_owned();
    c.wait_settled(&id);
    assert_eq!(d.terminate(), Some(0));
    let db = rusqlite::Connection::open(d.state_dir.join("sidejob.db")).expect("open db");
    let mode: String = db
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal_mode");
    assert_eq!(mode.to_lowercase(), "wal");
    let mut stmt = db
        .prepare("SELECT kind FROM events WHERE entity_id = ?1 ORDER BY seq")
        .expect("prepare");
    let kinds: Vec<String> = stmt
        .query_map([&id], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    // The wait receives the result as it settles, or (if it reached the daemon after the
    // settle, which a loaded machine allows) claims it just after: then one delivery event.
    let expected = [
        "task.submitted",
        "task.started",
        "task.yielded",
        "task.settled",
    ];
    assert!(
        kinds == expected
            || (kinds[..kinds.len().min(4)] == expected && kinds[4..] == ["task.delivered"]),
        "{kinds:?}"
    );
    for table in ["sessions", "tasks", "events"] {
        let n: i64 = db
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .expect("sqlite_master");
        assert_eq!(n, 1, "table {table}");
    }
}
