//! The command line (README.md): `call`, `tasks`, `logs [-f]`, `wait`, `cancel`.

use std::process::Output;

use serde_json::{json, Value};
use sidejob_tests::Daemon;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(o),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The first ULID-shaped word in the CLI's output.
fn task_id_in(o: &Output) -> String {
    let all = format!("{}\n{}", stdout(o), String::from_utf8_lossy(&o.stderr));
    all.split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| {
            w.len() == 26
                && w.bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        })
        .unwrap_or_else(|| panic!("no task id in the output: {}", describe(o)))
        .to_owned()
}

/// Starts a background call through the CLI and returns its task id.
fn call_background(d: &Daemon, cmd: &str) -> String {
    let o = d.cli(&["call", "--background", "--", cmd]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    task_id_in(&o)
}

#[test]
fn call_passes_the_exit_code_through_and_prints_the_output() {
    let d = Daemon::start();
    let o = d.cli(&["call", "--", "sh", "-c", "echo from-the-run; exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", describe(&o));
    assert_eq!(stdout(&o), "from-the-run\n");
    let o = d.cli(&["call", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
}

#[test]
fn call_json_prints_the_tool_call_result() {
    let d = Daemon::start();
    let o = d.cli(&["call", "--json", "--", "echo j"]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"], "j\n");
}

#[test]
fn call_background_prints_the_task_id_and_wait_passes_its_exit_code_through() {
    let d = Daemon::start();
    // The run ends only once the test has seen it live.
    let gate = sidejob_tests::Gate::new(&d.workspace, "end");
    let id = call_background(&d, &format!("{}; echo bg-out; exit 5", gate.wait_cmd()));
    let mut c = d.client();
    let state = c.task(&id)["state"].clone();
    assert!(state == "running" || state == "queued", "{state}");
    gate.open();
    let o = d.cli(&["wait", &id]);
    assert_eq!(o.status.code(), Some(5), "{}", describe(&o));
    assert!(
        stdout(&o).contains(&id) && stdout(&o).contains("failed"),
        "{}",
        describe(&o)
    );
    let o = d.cli(&["logs", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert_eq!(stdout(&o), "bg-out\n");
}

#[test]
fn wait_exits_zero_for_a_success_and_124_at_its_timeout() {
    let d = Daemon::start();
    let ok = call_background(&d, "true");
    let o = d.cli(&["wait", &ok]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let slow = call_background(&d, "sleep 30");
    let o = d.cli(&["wait", "--timeout", "300ms", &slow]);
    assert_eq!(o.status.code(), Some(124), "{}", describe(&o));
    let o = d.cli(&["cancel", "--grace", "100ms", &slow]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
}

#[test]
fn tasks_json_lists_the_tasks() {
    let d = Daemon::start();
    let id = call_background(&d, "echo listed");
    let o = d.cli(&["tasks", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let tasks = v["tasks"].as_array().expect("tasks");
    assert!(
        tasks
            .iter()
            .any(|t| t["task_id"] == id.as_str() && t["tool"] == "bash"),
        "{v}"
    );
    // The human table names it too.
    let o = d.cli(&["tasks"]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(stdout(&o).starts_with("TASK"), "{}", describe(&o));
    assert!(stdout(&o).contains(&id[..12]), "{}", describe(&o));
}

#[test]
fn logs_follow_prints_everything_until_the_task_settles() {
    let d = Daemon::start();
    // Half the output, then the run waits: `logs -f` must be following a live task when the
    // rest comes.
    let gate = sidejob_tests::Gate::new(&d.workspace, "rest");
    let id = call_background(
        &d,
        &format!(
            "echo line1; echo line2; {}; echo line3; echo line4",
            gate.wait_cmd()
        ),
    );
    let mut follow = std::process::Command::new(sidejob_tests::sidejob_bin())
        .arg("--socket")
        .arg(&d.socket)
        .args(["logs", "-f", &id])
        .current_dir(&d.workspace)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sidejob logs -f");
    let lines = sidejob_tests::Lines::spawn(follow.stdout.take().expect("stdout"));
    let wait = std::time::Duration::from_secs(20);
    for want in ["line1", "line2"] {
        assert_eq!(lines.next_within(wait, want).as_deref(), Some(want));
    }
    assert_eq!(d.client().task(&id)["state"], "running");
    gate.open();
    for want in ["line3", "line4"] {
        assert_eq!(lines.next_within(wait, want).as_deref(), Some(want));
    }
    assert_eq!(lines.next_within(wait, "the end of the stream"), None);
    let status = follow.wait().expect("logs -f");
    assert_eq!(status.code(), Some(0), "{status}");
    let mut c = d.client();
    let t = c.task(&id);
    assert_eq!(
        t["state"], "succeeded",
        "-f returns once the task settled: {t}"
    );
}

#[test]
fn cancel_stops_a_task() {
    let d = Daemon::start();
    let id = call_background(&d, "sleep 30");
    let o = d.cli(&["cancel", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert_eq!(stdout(&o).trim(), format!("{id} canceled"));
    let mut c = d.client();
    assert_eq!(c.task(&id)["state"], "canceled");
    let o = d.cli(&["cancel", "--json", &id]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v, json!({"task_id": id, "result": "already_terminal"}));
}

#[test]
fn cli_errors_name_the_problem_and_exit_nonzero() {
    let d = Daemon::start();
    let o = d.cli(&["wait", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]);
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not found"),
        "{}",
        describe(&o)
    );
    let missing = d.root.path().join("nowhere.sock");
    let o = std::process::Command::new(sidejob_tests::sidejob_bin())
        .arg("--socket")
        .arg(&missing)
        .arg("tasks")
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&missing.display().to_string()),
        "{}",
        describe(&o)
    );
}

#[test]
fn the_cli_finds_the_socket_through_sidejob_socket_and_stays_quiet_off_a_terminal() {
    let d = Daemon::start();
    let o = std::process::Command::new(sidejob_tests::sidejob_bin())
        .args(["call", "--", "echo via-env"])
        .env("SIDEJOB_SOCKET", &d.socket)
        .current_dir(&d.workspace)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert_eq!(stdout(&o), "via-env\n");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "",
        "no spinner or progress when stderr is not a terminal"
    );
}

#[test]
fn call_reuses_one_session_per_directory() {
    let d = Daemon::start();
    let a = call_background(&d, "true");
    let b = call_background(&d, "true");
    let mut c = d.client();
    let (ta, tb) = (c.task(&a), c.task(&b));
    assert_eq!(ta["session_id"], tb["session_id"]);
    let o = d.cli(&["call", "--session", "named-one", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let o = d.cli(&["tasks", "--session", "named-one", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["tasks"][0]["session_id"], "named-one");
}
