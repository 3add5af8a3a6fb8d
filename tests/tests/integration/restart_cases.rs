//! More of what survives a daemon crash: many runs at once, results already delivered, and
//! the event sequence hosts resume from.

use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::push::{is_notification_for, is_update};
use sidejob_tests::{wait_until, Client, Daemon, Gate};

fn background(c: &mut Client, s: &str, cmd: &str) -> String {
    let r = c.bash(s, cmd, json!({"background": true}));
    assert_eq!(r["status"], "running", "{r}");
    r["task_id"].as_str().expect("task id").to_owned()
}

/// Reads `host`'s stream up to the wake of a task started after everything else.
fn read_to_sentinel(host: &mut Client, starter: &mut Client, s: &str) -> Vec<Value> {
    let sentinel = background(starter, s, "echo sentinel");
    host.read_until(
        Duration::from_secs(30),
        "the sentinel's wake",
        is_notification_for(&sentinel),
    )
}

/// `kill -9` with 100 runs in flight: every one is re-attached after the restart, half of
/// them finish while the daemon is down and half after it is back, and all 100 settle with
/// their own exit codes and their whole output.
#[test]
fn a_hundred_runs_in_flight_survive_a_kill_and_settle_with_their_true_codes() {
    const RUNS: usize = 100;
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let (down, up) = (
        Gate::new(&d.workspace, "down"),
        Gate::new(&d.workspace, "up"),
    );
    let ids: Vec<String> = (0..RUNS)
        .map(|i| {
            let gate = if i % 2 == 0 { &down } else { &up };
            let r = c.bash(
                &s,
                &format!(
                    "echo start-{i}; {}; echo end-{i}; exit {}",
                    gate.wait_cmd(),
                    i % 7
                ),
                json!({"background": true, "wake": "silent"}),
            );
            r["task_id"].as_str().expect("id").to_owned()
        })
        .collect();
    // Every run is under way (it has printed) before the daemon dies.
    for (i, id) in ids.iter().enumerate() {
        let log = d
            .state_dir
            .join(format!("sessions/{s}/.background/{id}/output.log"));
        assert!(
            wait_until(Duration::from_secs(60), || {
                std::fs::read_to_string(&log).is_ok_and(|o| o == format!("start-{i}\n"))
            }),
            "run {i} never started"
        );
    }
    d.kill9();
    down.open();
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let result = d
            .state_dir
            .join(format!("sessions/{s}/.background/{id}/result.json"));
        assert!(
            wait_until(Duration::from_secs(60), || result.exists()),
            "run {i} did not finish while the daemon was down"
        );
    }
    d.restart();
    let mut c = d.client();
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        assert_eq!(
            c.task(id)["state"],
            "running",
            "run {i} was not re-attached"
        );
    }
    up.open();
    for (i, id) in ids.iter().enumerate() {
        let t = c.wait_settled(id);
        let code = i % 7;
        let want = if code == 0 { "succeeded" } else { "failed" };
        assert_eq!(t["state"], want, "run {i}: {t}");
        assert_eq!(t["exit_code"], code, "run {i}: {t}");
        assert_eq!(c.output(id), format!("start-{i}\nend-{i}\n"), "run {i}");
    }
}

/// A result returned inline is delivered: a crash right after it must not turn it into a
/// wake when the daemon comes back.
#[test]
fn an_inline_result_followed_by_a_crash_never_wakes() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "echo inline; exit 3", json!({}));
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["exit_code"], 3, "{r}");
    let id = r["task_id"].as_str().expect("id").to_owned();
    d.kill9();
    d.restart();
    let mut host = d.client();
    host.ok("events.subscribe", json!({"session_ids": [s]}));
    let mut c = d.client();
    let pushes = read_to_sentinel(&mut host, &mut c, &s);
    let woken = pushes
        .iter()
        .filter(|m| is_notification_for(&id)(m))
        .count();
    assert_eq!(woken, 0, "the inline result woke the host: {pushes:#?}");
    let t = c.task(&id);
    assert_eq!(t["delivery"], "inline", "{t}");
    let inbox = c.ok("inbox.list", json!({"session_id": s}));
    assert!(
        inbox["notifications"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["task_id"] != id.as_str()),
        "{inbox}"
    );
}

/// `seq` is the registry's event sequence: after a restart it goes on from where it was,
/// so a host that resumes with `since_seq` gets what it missed and nothing it already had.
#[test]
fn seq_continues_across_a_restart_and_since_seq_resumes_there() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let first = c.ok("events.subscribe", json!({"session_ids": [s]}))["seq"]
        .as_i64()
        .expect("seq");
    let before = background(&mut c, &s, "echo before");
    let seen = c.wait_push(
        Duration::from_secs(30),
        "before settles",
        is_update(&before, "succeeded"),
    );
    let last_seen = seen["params"]["seq"].as_i64().expect("seq");
    assert!(last_seen > first, "{seen}");
    // A task that changes while nobody is connected: the daemon dies before it ends.
    let gate = Gate::new(&d.workspace, "missed");
    let missed = background(&mut c, &s, &format!("{}; echo missed", gate.wait_cmd()));
    assert!(wait_until(Duration::from_secs(20), || d
        .private_dir(&missed)
        .join("supervisor.pid")
        .exists()));
    d.kill9();
    d.restart();
    let mut c = d.client();
    let mut h = d.client();
    let now = h.ok("events.subscribe", json!({"session_ids": [s]}))["seq"]
        .as_i64()
        .expect("seq");
    assert!(
        now >= last_seen,
        "seq went back from {last_seen} to {now} across the restart"
    );
    gate.open();
    let u = h.wait_push(
        Duration::from_secs(30),
        "missed settles",
        is_update(&missed, "succeeded"),
    );
    let settled_seq = u["params"]["seq"].as_i64().expect("seq");
    assert!(settled_seq > now, "{u}");
    // A host that saw up to `last_seen` before the crash resumes there: it gets the missed
    // task's latest state, and not the task it had already seen settle.
    let mut back = d.client();
    back.ok(
        "events.subscribe",
        json!({"session_ids": [s], "since_seq": last_seen}),
    );
    let sentinel = background(&mut c, &s, "echo sentinel");
    let replay = back.read_until(
        Duration::from_secs(30),
        "the sentinel's update",
        is_update(&sentinel, "succeeded"),
    );
    let updates = |task: &str| {
        replay
            .iter()
            .filter(|m| m["method"] == "task.updated" && m["params"]["task"]["task_id"] == task)
            .map(|m| m["params"]["seq"].as_i64().unwrap())
            .collect::<Vec<_>>()
    };
    assert!(!updates(&missed).is_empty(), "{replay:#?}");
    assert!(
        updates(&missed).iter().all(|seq| *seq > last_seen),
        "{replay:#?}"
    );
    assert!(
        updates(&before).is_empty(),
        "replayed a change the host had already seen: {replay:#?}"
    );
}

/// A container (or pod) restart kills the container's whole cgroup, every supervisor with
/// it, and the next daemon starts in a new PID namespace: its runs settle `failed/lost`
/// saying so, not as if the supervisor had died on its own. Played here by killing the
/// supervisor with the daemon and making the recorded PID namespace another one.
#[test]
fn runs_ended_by_a_container_restart_settle_lost_saying_so() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "never");
    let id = background(&mut c, &s, &gate.wait_cmd());
    let supervisor = sidejob_tests::supervisor_pid(&d.private_dir(&id));
    let record = d.state_dir.join("daemon.instance");
    let text = std::fs::read_to_string(&record).expect("the daemon records where runs live");
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{text}");
    d.kill9();
    // Its whole process group: the supervisor and the run.
    sidejob_tests::signal(-supervisor, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || {
        !sidejob_tests::process_alive(supervisor)
    }));
    std::fs::write(&record, format!("{} 1 {}\n", fields[0], fields[2])).expect("rewrite");
    d.restart();
    let mut c = d.client();
    let t = c.wait_settled_quietly(&id);
    assert_eq!(
        (&t["state"], &t["reason"]),
        (&json!("failed"), &json!("lost")),
        "{t}"
    );
    let error = t["error"].as_str().unwrap_or("");
    assert!(
        error.contains("container (or pod) it ran in was restarted"),
        "{t}"
    );
    // And a plain restart is not taken for one.
    let again = background(&mut c, &s, &gate.wait_cmd());
    let supervisor = sidejob_tests::supervisor_pid(&d.private_dir(&again));
    d.kill9();
    sidejob_tests::signal(-supervisor, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || {
        !sidejob_tests::process_alive(supervisor)
    }));
    d.restart();
    let t = d.client().wait_settled_quietly(&again);
    let error = t["error"].as_str().unwrap_or("");
    assert!(error.contains("ended without writing result.json"), "{t}");
}
