//! `sidejob mcp`'s promise: a background job's completion reaches the model exactly once (in
//! a later result, or in `job_wait`), in a session that outlives one agent run, and a client
//! that goes away leaves no foreground job behind. Asserted on what the MCP client receives.

use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{pids_running, unique_sleep, wait_until, Daemon};

use super::mcp::{reports_of, text_of, Mcp};

/// A started agent run: `sidejob mcp` after its handshake.
fn agent(d: &Daemon, args: &[&str]) -> Mcp {
    let mut m = Mcp::start_with(d, args);
    let init = m.init();
    assert_eq!(init["serverInfo"]["name"], "sidejob", "{init}");
    m
}

fn task_id(result: &Value) -> String {
    result["structuredContent"]["task_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no task_id in {result}"))
        .to_owned()
}

/// The session `sidejob mcp` works in, from a task of its.
fn session_of(d: &Daemon, task: &str) -> String {
    let t = d.client().ok("task.get", json!({ "task_id": task }));
    t["session_id"].as_str().unwrap().to_owned()
}

fn unread(d: &Daemon, session: &str) -> Vec<Value> {
    let r = d.client().ok(
        "inbox.list",
        json!({"session_id": session, "unread_only": true}),
    );
    r["notifications"].as_array().unwrap().clone()
}

#[test]
fn the_next_agent_run_in_a_workspace_gets_what_the_last_left_unread() {
    let d = Daemon::start();
    let mut first = agent(&d, &[]);
    let started = first.call(
        "bash",
        json!({"command": "echo left-for-the-next-run", "background": true}),
    );
    let job = task_id(&started);
    // The run ends on "running", as `claude -p` does when the model ends its turn.
    drop(first);
    d.client().wait_settled_quietly(&job);

    let mut next = agent(&d, &[]);
    let r = next.call("job_list", json!({}));
    let reports = reports_of(&r);
    assert!(
        reports.len() == 1
            && reports[0].contains(&job)
            && reports[0].contains("left-for-the-next-run"),
        "the completion did not reach the next run: {r}"
    );
    let carried = &r["structuredContent"]["background_completions"];
    assert_eq!(carried[0]["task_id"], job.as_str(), "{r}");
    assert_eq!(
        carried[0]["acked"], true,
        "acked in the result that acks it: {r}"
    );
    let again = next.call("job_list", json!({}));
    assert!(reports_of(&again).is_empty(), "reported twice: {again}");
    assert!(unread(&d, &session_of(&d, &job)).is_empty());
}

#[test]
fn repeated_agent_runs_in_one_workspace_never_reach_the_session_share() {
    // Before: every connection opened a session of its own, so the fourth run here failed
    // `initialize` ("uid 0 has 3 open sessions") and the agent lost its tools.
    let d = Daemon::start_with_config("[per_user]\nsessions = 3\n");
    for i in 0..20 {
        let mut m = agent(&d, &[]);
        let tools = m.request("tools/list", json!({}));
        assert!(
            tools["result"]["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "bash")),
            "run {i} got no tools: {tools}"
        );
        let r = m.call("bash", json!({"command": format!("echo run-{i}")}));
        assert_eq!(text_of(&r), format!("run-{i}\n"), "run {i}: {r}");
    }
}

#[test]
fn a_quick_call_is_never_also_a_wake() {
    let d = Daemon::start();
    let mut m = agent(&d, &[]);
    let mut session = None;
    for i in 0..200 {
        let r = m.call("bash", json!({"command": format!("echo quick-{i}")}));
        assert_eq!(r["structuredContent"]["status"], "completed", "{r}");
        assert!(
            reports_of(&r).is_empty()
                && r["structuredContent"]["background_completions"] == json!([]),
            "call {i} came back with a completion attached: {r}"
        );
        session.get_or_insert_with(|| session_of(&d, &task_id(&r)));
    }
    let session = session.unwrap();
    let all = d
        .client()
        .ok("inbox.list", json!({ "session_id": session }));
    assert_eq!(
        all["notifications"],
        json!([]),
        "quick calls made wakes: {all}"
    );
}

#[test]
fn a_client_that_goes_away_mid_call_leaves_no_job_running() {
    let d = Daemon::start();
    let mut m = agent(&d, &[]);
    // A background job keeps running when the client goes; a foreground one does not.
    let kept = unique_sleep();
    let bg = m.call(
        "bash",
        json!({"command": format!("sleep {kept}"), "background": true}),
    );
    let bg = task_id(&bg);
    let gone = unique_sleep();
    m.send(
        "tools/call",
        json!({"name": "bash", "arguments": {"command": format!("sleep {gone}"), "yield_after_ms": 600_000}}),
    );
    let fg_cmd = format!("sleep {gone}");
    assert!(
        wait_until(Duration::from_secs(10), || !pids_running(&fg_cmd)
            .is_empty()),
        "the foreground call never started"
    );
    // Stdin closes without `notifications/cancelled`, as when `claude -p` is interrupted.
    m.hang_up();
    assert!(
        wait_until(Duration::from_secs(15), || pids_running(&fg_cmd).is_empty()),
        "the abandoned foreground job is still running"
    );
    let mut c = d.client();
    let tasks = c.ok("task.list", json!({ "session_id": session_of(&d, &bg) }));
    let fg = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["summary"].as_str() == Some(fg_cmd.as_str()))
        .cloned()
        .unwrap_or_else(|| panic!("no task for {fg_cmd}: {tasks}"));
    assert!(
        wait_until(Duration::from_secs(10), || {
            c.ok("task.get", json!({"task_id": fg["task_id"]}))["state"] == "canceled"
        }),
        "the abandoned call did not settle canceled: {fg}"
    );
    assert_eq!(
        c.ok("task.get", json!({ "task_id": bg }))["state"],
        "running"
    );
    assert_eq!(pids_running(&format!("sleep {kept}")).len(), 1);
    c.ok("task.cancel", json!({ "task_id": bg }));
}

#[test]
fn a_cancelled_call_stops_its_run_without_a_wake() {
    let d = Daemon::start();
    let mut m = agent(&d, &[]);
    let sleep = unique_sleep();
    let id = m.send(
        "tools/call",
        json!({"name": "bash", "arguments": {"command": format!("sleep {sleep}")}}),
    );
    let cmd = format!("sleep {sleep}");
    assert!(wait_until(Duration::from_secs(10), || !pids_running(&cmd).is_empty()));
    m.notify(
        "notifications/cancelled",
        json!({"requestId": id, "reason": "user pressed escape"}),
    );
    assert!(
        wait_until(Duration::from_secs(15), || pids_running(&cmd).is_empty()),
        "the cancelled call's run is still going"
    );
    // The connection goes on, and the stop is no wake.
    let r = m.call("bash", json!({"command": "echo after"}));
    assert_eq!(text_of(&r), "after\n", "{r}");
    assert!(reports_of(&r).is_empty(), "{r}");
    assert!(unread(&d, &session_of(&d, &task_id(&r))).is_empty());
}

#[test]
fn job_wait_returns_the_output_and_takes_the_completion() {
    let d = Daemon::start();
    let mut m = agent(&d, &[]);
    // Still running when job_wait starts waiting: the wait takes it.
    let r = m.call(
        "bash",
        json!({"command": "sleep 0.3; echo waited-for", "yield_after_ms": 0}),
    );
    assert_eq!(r["structuredContent"]["status"], "running", "{r}");
    assert!(
        r["structuredContent"]["next"]
            .as_str()
            .unwrap()
            .contains("job_wait"),
        "{r}"
    );
    let job = task_id(&r);
    let w = m.call("job_wait", json!({"task_id": job, "timeout_ms": 20_000}));
    assert_eq!(w["structuredContent"]["status"], "completed", "{w}");
    assert_eq!(w["structuredContent"]["exit_code"], 0, "{w}");
    assert!(
        text_of(&w).contains("waited-for"),
        "job_wait returned no output: {w}"
    );
    // Settled before job_wait asked (a wake was made): job_wait reports it, once.
    let r = m.call(
        "bash",
        json!({"command": "echo before-the-wait", "background": true}),
    );
    let early = task_id(&r);
    d.client().wait_settled_quietly(&early);
    let w = m.call("job_wait", json!({"task_id": early, "timeout_ms": 20_000}));
    assert!(text_of(&w).contains("before-the-wait"), "{w}");
    assert!(
        reports_of(&w).is_empty(),
        "its own completion repeated beside it: {w}"
    );
    for _ in 0..3 {
        let r = m.call("job_list", json!({}));
        assert!(reports_of(&r).is_empty(), "reported again: {r}");
    }
    assert!(unread(&d, &session_of(&d, &early)).is_empty());
}

#[test]
fn job_stop_makes_no_wake_for_the_stop_the_agent_asked_for() {
    let d = Daemon::start();
    let mut m = agent(&d, &[]);
    let r = m.call(
        "bash",
        json!({"command": format!("sleep {}", unique_sleep()), "background": true}),
    );
    let job = task_id(&r);
    let s = m.call("job_stop", json!({ "task_id": job }));
    assert_eq!(s["structuredContent"]["result"], "canceled", "{s}");
    assert_eq!(s["structuredContent"]["state"], "canceled", "{s}");
    let after = m.call("job_list", json!({}));
    assert!(
        reports_of(&after).is_empty(),
        "the stop came back as a wake: {after}"
    );
    let session = session_of(&d, &job);
    let all = d
        .client()
        .ok("inbox.list", json!({ "session_id": session }));
    assert_eq!(all["notifications"], json!([]), "{all}");
}

#[test]
fn job_tools_reach_only_the_sessions_own_jobs() {
    let d = Daemon::start();
    let mut mine = agent(&d, &["--new-session"]);
    let mut other = agent(&d, &["--new-session"]);
    let r = mine.call(
        "bash",
        json!({"command": "sleep 0.5; echo mine", "background": true}),
    );
    let job = task_id(&r);
    for tool in ["job_wait", "job_output", "job_stop"] {
        let r = other.call(tool, json!({"task_id": job, "timeout_ms": 10_000}));
        assert!(
            r["isError"] == true && text_of(&r).contains("no job"),
            "{tool} of another session's job: {r}"
        );
    }
    // It ran on, unstopped, and its own session is told.
    d.client().wait_settled_quietly(&job);
    let t = d.client().ok("task.get", json!({ "task_id": job }));
    assert_eq!(t["state"], "succeeded", "{t}");
    assert!(
        wait_until(Duration::from_secs(10), || {
            let r = mine.call("job_list", json!({}));
            reports_of(&r).iter().any(|x| x.contains(&job))
        }),
        "its own session never heard of it"
    );
}

#[test]
fn a_completion_acked_elsewhere_is_not_reported_again() {
    let d = Daemon::start();
    let mut m = agent(&d, &[]);
    let r = m.call(
        "bash",
        json!({"command": "echo read-by-a-hook", "background": true}),
    );
    let job = task_id(&r);
    d.client().wait_settled_quietly(&job);
    // The daemon pushed it to this server; then a hook (here, the CLI) reads it first.
    let session = session_of(&d, &job);
    assert!(wait_until(Duration::from_secs(10), || !unread(
        &d, &session
    )
    .is_empty()));
    let out = d.cli(&[
        "inbox",
        "--session",
        &session,
        "--unread",
        "--ack",
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let r = m.call("job_list", json!({}));
    assert!(
        reports_of(&r).is_empty(),
        "acked elsewhere, reported here too: {r}"
    );
}

#[test]
fn logging_set_level_is_served_and_filters_the_notifications() {
    let d = Daemon::start();
    let mut m = agent(&d, &[]);
    let r = m.request("logging/setLevel", json!({"level": "error"}));
    assert!(r.get("error").is_none(), "logging/setLevel refused: {r}");
    let ok = task_id(&m.call("bash", json!({"command": "true", "background": true})));
    let bad = task_id(&m.call("bash", json!({"command": "exit 4", "background": true})));
    d.client().wait_settled_quietly(&ok);
    d.client().wait_settled_quietly(&bad);
    let logged = |m: &Mcp, id: &str| {
        m.notifications
            .iter()
            .any(|n| n["method"] == "notifications/message" && n["params"]["data"]["task_id"] == id)
    };
    assert!(
        wait_until(Duration::from_secs(10), || {
            m.request("ping", json!({}));
            logged(&m, &bad)
        }),
        "the failure (level error) was not logged: {:?}",
        m.notifications
    );
    assert!(
        !logged(&m, &ok),
        "a success (notice) passed the error level"
    );
}

#[test]
fn an_oversized_call_is_refused_and_the_connection_kept() {
    let d = Daemon::start();
    let mut m = agent(&d, &[]);
    let big = "x".repeat(1_200_000);
    let r = m.call("bash", json!({"command": format!("echo {big}")}));
    assert!(
        r["isError"] == true && text_of(&r).contains("at most 1024 KiB"),
        "{}",
        &text_of(&r)[..200.min(text_of(&r).len())]
    );
    let r = m.call("bash", json!({"command": "echo still-connected"}));
    assert_eq!(text_of(&r), "still-connected\n", "{r}");
}

#[test]
fn a_restarted_daemon_is_reached_again() {
    let mut d = Daemon::start();
    let mut m = agent(&d, &[]);
    assert_eq!(
        text_of(&m.call("bash", json!({"command": "echo one"}))),
        "one\n"
    );
    d.restart();
    let r = m.call("bash", json!({"command": "echo two"}));
    assert_eq!(text_of(&r), "two\n", "{r}");
}

#[test]
fn idle_sessions_are_closed_and_reopened_on_use() {
    let d = Daemon::start_with_config("session_idle_ms = 300\n");
    let mut c = d.client();
    let open = |c: &mut sidejob_tests::Client, ws: &std::path::Path| {
        c.ok(
            "session.open",
            json!({"session_id": "idle-one", "workspace": ws}),
        )["session_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let idle = open(&mut c, &d.workspace);
    let busy = {
        let ws = d.workspace.join("busy");
        std::fs::create_dir_all(&ws).unwrap();
        c.open_session_in(&ws)
    };
    let sleeping = c.bash(
        &busy,
        &format!("sleep {}", unique_sleep()),
        json!({"background": true}),
    );
    let state = |c: &mut sidejob_tests::Client, id: &str| {
        let all = c.ok("session.list", json!({}));
        all["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["session_id"] == id)
            .map(|s| s["state"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert!(
        wait_until(Duration::from_secs(10), || state(&mut c, &idle) == "closed"),
        "the idle session was never closed"
    );
    assert_eq!(
        state(&mut c, &busy),
        "open",
        "a session with a live run was closed"
    );
    // Opening it again reopens it, and it works as before.
    assert_eq!(open(&mut c, &d.workspace), idle);
    assert_eq!(state(&mut c, &idle), "open");
    let r = c.bash(&idle, "echo back", json!({}));
    assert_eq!(r["output"], "back\n", "{r}");
    c.ok("task.cancel", json!({"task_id": sleeping["task_id"]}));
}
