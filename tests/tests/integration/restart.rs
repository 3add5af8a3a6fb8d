//! Runs survive the daemon (ARCHITECTURE.md, issue 2 §7): re-attach, settle from result.json, `lost`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::push::is_notification_for;
use sidejob_tests::{
    pids_mentioning, pids_running, process_alive, signal, unique_sleep, wait_until, Client, Daemon,
    Gate,
};

fn run_dir(r: &Value) -> PathBuf {
    Path::new(r["output_path"].as_str().expect("output_path"))
        .parent()
        .expect("run dir")
        .to_path_buf()
}

/// A run's private directory, `<runs_dir>/<task_id>`, from its public one
/// `<state_dir>/sessions/<session>/.background/<task_id>` (the daemon chose the session's
/// directory).
fn private_dir(run_dir: &Path) -> PathBuf {
    let task = run_dir.file_name().expect("task id");
    sidejob_tests::runs_dir(run_dir.ancestors().nth(4).expect("state dir")).join(task)
}

/// The supervisor's pid, from `supervisor.pid` in the run's private directory (once it has
/// written it).
fn supervisor_pid(run_dir: &Path) -> i32 {
    sidejob_tests::supervisor_pid(&private_dir(run_dir))
}

/// Starts a background task in `s` and reads `host`'s stream up to its wake: everything
/// pushed before it is returned, so wakes are counted at the end, not in a window.
fn read_to_sentinel(host: &mut Client, starter: &mut Client, s: &str) -> Vec<Value> {
    let r = starter.bash(s, "echo sentinel", json!({"background": true}));
    let sentinel = r["task_id"].as_str().expect("id").to_owned();
    host.read_until(
        Duration::from_secs(30),
        "the sentinel's wake",
        is_notification_for(&sentinel),
    )
}

/// The run is held on a gate across `kill -9` and the restart, so it is provably still live
/// when the daemon comes back (re-attached, not settled from a result it left meanwhile);
/// released after, it settles with its own exit code and wakes the host once.
#[test]
fn a_detached_run_survives_a_daemon_kill_and_settles_after_restart() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "release");
    let r = c.bash(
        &s,
        &format!("echo before; {}; echo done; exit 5", gate.wait_cmd()),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    // The run is under way before the daemon dies.
    let pid = supervisor_pid(&run_dir(&r));
    d.kill9();
    assert!(process_alive(pid), "the supervisor died with the daemon");
    d.restart();
    let mut c = d.client();
    let mut host = d.client();
    host.ok("events.subscribe", json!({"session_ids": [s]}));
    let t = c.task(&id);
    assert_eq!(t["state"], "running", "re-attached, still live: {t}");
    assert!(!run_dir(&r).join("result.json").exists());
    gate.open();
    let t = c.wait_settled_quietly(&id);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "exit_code", "{t}");
    assert_eq!(t["exit_code"], 5);
    assert_eq!(t["delivery"], "wake", "{t}");
    assert_eq!(c.output(&id), "before\ndone\n");
    let pushes = read_to_sentinel(&mut host, &mut c, &s);
    let wakes = pushes
        .iter()
        .filter(|m| is_notification_for(&id)(m))
        .count();
    assert_eq!(wakes, 1, "{pushes:#?}");
    let inbox = c.ok("inbox.list", json!({"session_id": s}));
    let in_inbox = inbox["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["task_id"] == id.as_str())
        .count();
    assert_eq!(in_inbox, 1, "{inbox}");
}

#[test]
fn a_run_that_finished_while_the_daemon_was_down_is_settled_from_result_json() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // It finishes only once the daemon is gone.
    let gate = Gate::new(&d.workspace, "finish");
    let r = c.bash(
        &s,
        &format!("{}; echo fin; exit 6", gate.wait_cmd()),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    let dir = run_dir(&r);
    supervisor_pid(&dir);
    d.kill9();
    gate.open();
    assert!(
        wait_until(Duration::from_secs(10), || dir.join("result.json").exists()),
        "the supervisor did not finish the run without the daemon"
    );
    d.restart();
    let mut c = d.client();
    let t = c.task(&id);
    assert_eq!(t["state"], "failed", "settled at start-up: {t}");
    assert_eq!(t["reason"], "exit_code");
    assert_eq!(t["exit_code"], 6);
    assert_eq!(
        t["delivery"], "wake",
        "nobody had received it, so it wakes the host: {t}"
    );
    assert_eq!(c.output(&id), "fin\n");
}

#[test]
fn a_supervisor_killed_while_the_daemon_is_down_settles_as_lost() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mark = unique_sleep();
    let r = c.bash(&s, &format!("sleep {mark}"), json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    let pid = supervisor_pid(&run_dir(&r));
    assert!(wait_until(Duration::from_secs(10), || pids_running(
        &format!("sleep {mark}")
    )
    .len()
        == 1));
    d.kill9();
    signal(pid, libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || !process_alive(pid)
            && pids_mentioning(&mark).is_empty()),
        "killing the supervisor must take the run with it: {:?}",
        pids_mentioning(&mark)
    );
    d.restart();
    let mut c = d.client();
    let t = c.task(&id);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "lost", "{t}");
    let listed = c.ok("task.list", json!({"session_id": s, "states": ["running"]}));
    assert_eq!(
        listed["tasks"],
        json!([]),
        "no running row survives a restart: {listed}"
    );
}

#[test]
fn killing_the_supervisor_kills_the_whole_run_and_settles_it_lost() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mark = unique_sleep();
    let r = c.bash(
        &s,
        &format!("setsid sleep {mark} & (sleep {mark} &); sleep {mark}"),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    let pid = supervisor_pid(&run_dir(&r));
    assert!(wait_until(Duration::from_secs(10), || pids_running(
        &format!("sleep {mark}")
    )
    .len()
        == 3));
    signal(pid, libc::SIGKILL);
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "lost", "{t}");
    assert!(
        wait_until(Duration::from_secs(5), || pids_mentioning(&mark).is_empty()),
        "the run outlived its supervisor: {:?}",
        pids_mentioning(&mark)
    );
}

#[test]
fn a_run_keeps_writing_output_while_the_daemon_is_down() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // line1 before the kill, the rest only after it (the gate opens once the daemon is gone).
    let gate = Gate::new(&d.workspace, "more");
    let r = c.bash(
        &s,
        &format!(
            "echo line1; {}; for i in 2 3 4 5; do echo line$i; done",
            gate.wait_cmd()
        ),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    let dir = run_dir(&r);
    supervisor_pid(&dir);
    assert!(wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(dir.join("output.log")).is_ok_and(|o| o == "line1\n")
    }));
    d.kill9();
    gate.open();
    assert!(wait_until(Duration::from_secs(10), || dir
        .join("result.json")
        .exists()));
    d.restart();
    let mut c = d.client();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id), "line1\nline2\nline3\nline4\nline5\n");
}

#[test]
fn a_yielded_call_whose_daemon_died_can_still_be_waited_on() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "end");
    // Silent, so the result waits for task.wait whichever reaches the daemon first: the
    // wait sent below or the settle the gate lets happen.
    let r = c.bash(
        &s,
        &format!("{}; echo waited", gate.wait_cmd()),
        json!({"yield_after_ms": 200, "wake": "silent"}),
    );
    assert_eq!(r["status"], "running", "{r}");
    let id = r["task_id"].as_str().expect("id").to_owned();
    d.kill9();
    d.restart();
    let mut c = d.client();
    assert_eq!(c.task(&id)["state"], "running");
    let t = c.wait_then(&d, &id, || gate.open());
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(t["delivery"], "wait", "{t}");
    assert_eq!(c.output(&id), "waited\n");
}

#[test]
fn a_foreground_call_cut_off_by_a_daemon_crash_settles_after_restart_and_stays_pending() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mut caller = d.client();
    let gate = Gate::new(&d.workspace, "end");
    caller.send_value(&json!({"jsonrpc": "2.0", "id": 1, "method": "tool.call",
        "params": {"session_id": s, "tool": "bash", "args": {"command": format!("echo begun; {}; echo ended", gate.wait_cmd())},
                   "yield_after_ms": 60_000}}));
    let mut id = String::new();
    assert!(wait_until(Duration::from_secs(10), || {
        let list = c.ok("task.list", json!({"session_id": s}));
        id = list["tasks"][0]["task_id"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        list["tasks"][0]["state"] == "running"
    }));
    d.kill9();
    assert!(
        caller.read_message().is_none(),
        "the caller's connection ends with the daemon"
    );
    d.restart();
    let mut c = d.client();
    assert_eq!(c.task(&id)["state"], "running", "re-attached");
    gate.open();
    let mut t = Value::Null;
    assert!(
        wait_until(Duration::from_secs(20), || {
            t = c.task(&id);
            t["state"] == "succeeded"
        }),
        "{t}"
    );
    assert_eq!(
        t["delivery"], "wake",
        "the caller never got it, so a wake must: {t}"
    );
    assert_eq!(c.output(&id), "begun\nended\n");
}

#[test]
fn a_task_queued_when_the_daemon_died_runs_after_restart() {
    let mut d = Daemon::start_with_config("max_running = 1\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let first = c.bash(&s, "sleep 30", json!({"background": true}));
    let first = first["task_id"].as_str().expect("id").to_owned();
    assert!(wait_until(Duration::from_secs(10), || c.task(&first)
        ["state"]
        == "running"));
    let second = c.bash(&s, "echo queued-then-run", json!({"background": true}));
    let second = second["task_id"].as_str().expect("id").to_owned();
    assert_eq!(c.task(&second)["state"], "queued");
    d.kill9();
    d.restart();
    let mut c = d.client();
    assert_eq!(c.task(&first)["state"], "running", "re-attached");
    assert_eq!(
        c.task(&second)["state"],
        "queued",
        "still bounded by max_running"
    );
    let res = c.ok("task.cancel", json!({"task_id": first, "grace_ms": 100}));
    assert_eq!(
        res["result"], "canceled",
        "a re-attached run can be canceled: {res}"
    );
    let t = c.wait_settled(&second);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&second), "queued-then-run\n");
}

#[test]
fn a_reused_pid_is_never_mistaken_for_the_supervisor() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mark = unique_sleep();
    let r = c.bash(&s, &format!("sleep {mark}"), json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    let dir = run_dir(&r);
    let pid = supervisor_pid(&dir);
    d.kill9();
    signal(pid, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || !process_alive(pid)));
    // Another process now holds a pid the registry (and supervisor.pid) points at. The start
    // time in clock ticks tells them apart; an impostor started within the supervisor's own
    // tick would be indistinguishable, which is no pid reuse a real system can produce, so
    // the test makes sure its impostor started in a later tick.
    let recorded =
        std::fs::read_to_string(private_dir(&dir).join("supervisor.pid")).expect("pid file");
    let start: u64 = recorded
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("start time");
    let mut impostor = loop {
        let mut p = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn impostor");
        if start_time(p.id() as i32) != start {
            break p;
        }
        let _ = p.kill();
        let _ = p.wait();
    };
    let impostor_pid = impostor.id() as i32;
    let db = rusqlite::Connection::open(d.state_dir.join("sidejob.db")).expect("db");
    db.execute(
        "UPDATE tasks SET supervisor_pid = ?1 WHERE task_id = ?2",
        rusqlite::params![impostor_pid, id],
    )
    .expect("point the row at the impostor");
    drop(db);
    std::fs::write(
        private_dir(&dir).join("supervisor.pid"),
        format!("{impostor_pid} {start}\n"),
    )
    .expect("pid file");
    d.restart();
    let mut c = d.client();
    let t = c.task(&id);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "lost", "{t}");
    assert!(
        process_alive(impostor_pid),
        "the daemon must not touch the impostor"
    );
    let _ = impostor.kill();
    let _ = impostor.wait();
}

#[test]
fn the_event_log_still_rebuilds_the_registry_after_recovery() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // `finished` ends while the daemon is down, `alive` after the restart.
    let (down, up) = (
        Gate::new(&d.workspace, "down"),
        Gate::new(&d.workspace, "up"),
    );
    let lost = c.bash(&s, "sleep 30", json!({"background": true}));
    let finished = c.bash(
        &s,
        &format!("{}; echo x", down.wait_cmd()),
        json!({"background": true}),
    );
    let alive = c.bash(&s, &up.wait_cmd(), json!({"background": true}));
    let lost_pid = supervisor_pid(&run_dir(&lost));
    let fin_dir = run_dir(&finished);
    supervisor_pid(&fin_dir);
    supervisor_pid(&run_dir(&alive));
    d.kill9();
    signal(lost_pid, libc::SIGKILL);
    down.open();
    assert!(wait_until(Duration::from_secs(10), || !process_alive(
        lost_pid
    ) && fin_dir
        .join("result.json")
        .exists()));
    d.restart();
    let mut c = d.client();
    assert_eq!(
        c.task(alive["task_id"].as_str().expect("id"))["state"],
        "running"
    );
    up.open();
    c.wait_settled(alive["task_id"].as_str().expect("id"));
    assert_eq!(
        c.task(lost["task_id"].as_str().expect("id"))["reason"],
        "lost"
    );
    assert_eq!(d.terminate(), Some(0));
    let o = std::process::Command::new(sidejob_tests::sidejob_bin())
        .args(["replay", "--check", "--state-dir"])
        .arg(&d.state_dir)
        .output()
        .expect("replay");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A process's start time in clock ticks after boot (field 22 of /proc/PID/stat).
fn start_time(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_comm = &stat[stat.rfind(')').expect("comm") + 2..];
    after_comm
        .split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .expect("starttime")
}
