//! `task.cancel` (docs/protocol.md): SIGTERM to the whole run, SIGKILL after the grace, no process of the
//! run survives; and what a command leaves behind when it exits on its own.

use std::time::{Duration, Instant};

use serde_json::json;
use sidejob_tests::{pids_mentioning, pids_running, unique_sleep, wait_until, Daemon};

#[test]
fn cancel_stops_setsid_and_double_forked_processes() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mark = unique_sleep();
    let cmd = format!("setsid sleep {mark} & (sleep {mark} &); sleep {mark} & echo ready; wait");
    let r = c.bash(&s, &cmd, json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    c.wait_for_output(&id, "ready");
    assert!(
        wait_until(Duration::from_secs(10), || pids_running(&format!(
            "sleep {mark}"
        ))
        .len()
            == 3),
        "expected 3 sleeps, found {:?}",
        pids_running(&format!("sleep {mark}"))
    );
    // sleep dies on SIGTERM, so the cancel needs no grace: with a ten-minute grace, an
    // answer within the client's read timeout means SIGKILL was not waited for.
    c.set_read_timeout(Duration::from_secs(60));
    let res = c.ok("task.cancel", json!({"task_id": id, "grace_ms": 600_000}));
    assert_eq!(res["result"], "canceled", "{res}");
    assert_eq!(res["task_id"], id.as_str());
    let t = c.task(&id);
    assert_eq!(t["state"], "canceled", "{t}");
    assert!(t.get("reason").is_none_or(|r| r.is_null()), "{t}");
    let left = pids_mentioning(&mark);
    assert!(
        left.is_empty(),
        "processes of the canceled run survive: {left:?}"
    );
}

#[test]
fn a_process_ignoring_sigterm_is_killed_after_the_grace() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mark = unique_sleep();
    let cmd = format!("trap '' TERM; sleep {mark} & echo ready; while :; do sleep 0.05; done");
    let r = c.bash(&s, &cmd, json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    c.wait_for_output(&id, "ready");
    assert!(wait_until(Duration::from_secs(10), || pids_running(
        &format!("sleep {mark}")
    )
    .len()
        == 1));
    let started = Instant::now();
    let res = c.ok("task.cancel", json!({"task_id": id, "grace_ms": 700}));
    let took = started.elapsed();
    // Canceled (not cancellation_pending): SIGKILL came; and not before the grace.
    assert_eq!(res["result"], "canceled", "{res}");
    assert!(
        took >= Duration::from_millis(700),
        "SIGKILL came before the 700 ms grace; cancel took {took:?}"
    );
    assert_eq!(c.task(&id)["state"], "canceled");
    let left = pids_mentioning(&mark);
    assert!(left.is_empty(), "the run survives: {left:?}");
}

#[test]
fn the_configured_grace_applies_when_cancel_names_none() {
    let d = Daemon::start_with_config("cancel_grace_ms = 600\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(
        &s,
        "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    c.wait_for_output(&id, "ready");
    let started = Instant::now();
    let res = c.ok("task.cancel", json!({"task_id": id}));
    let took = started.elapsed();
    assert_eq!(res["result"], "canceled", "{res}");
    // The property is a duration: at least the configured 600 ms, and short of the built-in
    // 5 s default it replaces (the bound is that default, not a guess at the machine).
    assert!(took >= Duration::from_millis(600), "{took:?}");
    assert!(
        took < Duration::from_millis(5_000),
        "the built-in 5 s grace applied, not the configured one: {took:?}"
    );
}

#[test]
fn cancel_of_a_settled_task_is_already_terminal() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "exit 3", json!({}));
    let id = r["task_id"].as_str().expect("id");
    let res = c.ok("task.cancel", json!({"task_id": id}));
    assert_eq!(res["result"], "already_terminal", "{res}");
    let t = c.task(id);
    assert_eq!(
        t["state"], "failed",
        "cancel must not rewrite a settled task: {t}"
    );
    assert_eq!(t["exit_code"], 3);
}

#[test]
fn cancel_of_a_blocked_foreground_call_answers_the_call_as_canceled() {
    let d = Daemon::start();
    let mut a = d.client();
    let s = d.open_session(&mut a);
    let sess = s.clone();
    let caller = std::thread::spawn(move || {
        a.bash(
            &sess,
            "echo ready; sleep 30",
            json!({"yield_after_ms": 60_000}),
        )
    });
    let mut b = d.client();
    let mut id = String::new();
    assert!(wait_until(Duration::from_secs(10), || {
        let list = b.ok("task.list", json!({"session_id": s}));
        id = list["tasks"][0]["task_id"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        list["tasks"][0]["state"] == "running"
    }));
    let res = b.ok("task.cancel", json!({"task_id": id, "grace_ms": 500}));
    assert_eq!(res["result"], "canceled", "{res}");
    let r = caller.join().expect("caller");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "canceled", "{r}");
    assert_eq!(b.task(&id)["delivery"], "inline");
}

#[test]
fn a_command_that_leaves_a_process_behind_settles_promptly_and_reports_it() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mark = unique_sleep();
    // The background sleep holds the output pipe open for 300 s; the run must not wait for
    // its EOF. Waiting for it would outlast the 20 s yield: the answer would be `running`.
    let r = c.bash(
        &s,
        &format!("sleep {mark} & echo started"),
        json!({"yield_after_ms": 20_000}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "succeeded", "{r}");
    assert_eq!(r["output"], "started\n");
    let t = c.task(r["task_id"].as_str().expect("id"));
    assert!(
        t["leftover_processes"].as_u64().is_some_and(|n| n >= 1),
        "{t}"
    );
    let result: serde_json::Value = serde_json::from_slice(
        &std::fs::read(t["result_path"].as_str().expect("result_path")).expect("result.json"),
    )
    .expect("json");
    assert!(
        result["leftover_processes"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{result}"
    );
    let left = pids_mentioning(&mark);
    assert!(left.is_empty(), "the leftover sleep survives: {left:?}");
}

#[test]
fn a_withdrawal_says_whether_it_took_a_cancel_back_and_one_taken_back_leaves_the_run_going() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let cmd = "trap '' TERM; echo ready; for i in $(seq 30); do sleep 0.1; done; echo survived";
    let r = c.bash(&s, cmd, json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    c.wait_for_output(&id, "ready");
    // No cancel has reached the run: withdrawn, but nothing was taken back (what lets
    // `sidejob call` tell a withdrawal that overtook its cancel from one that stopped it).
    let w = c.ok("task.cancel", json!({"task_id": id, "withdraw": true}));
    assert_eq!(w["result"], "withdrawn", "{w}");
    assert_eq!(w["taken_back"], false, "{w}");
    // A cancel with a grace shorter than the run, sent without waiting for its answer.
    let mut canceler = d.client();
    canceler.send_value(&json!({"jsonrpc": "2.0", "id": 1, "method": "task.cancel",
        "params": {"task_id": id, "grace_ms": 800}}));
    let taken = wait_until(Duration::from_secs(10), || {
        let w = c.ok("task.cancel", json!({"task_id": id, "withdraw": true}));
        assert_eq!(w["result"], "withdrawn", "{w}");
        w["taken_back"] == true
    });
    assert!(taken, "the cancel never reached the run");
    // Taken back: the run outlives the grace and ends as it ends.
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert!(c.output(&id).contains("survived"), "{t}");
    // A cancel answers only once the run has wound down: here, when it ended on its own.
    let answer = canceler.reply_to(json!(1)).expect("cancel answered");
    assert_ne!(answer["result"], "canceled", "{answer}");
}
