//! How runs and requests fail when something other than the command goes wrong: a run that
//! cannot be started (`spawn_error`), a sandbox that cannot be built (`sandbox_error`), a
//! cancel that cannot finish in time (`cancellation_pending`), and the daemon's own state
//! failing under a request (`internal`, -32603) without taking the daemon down.

use std::time::Duration;

use serde_json::json;
use sidejob_tests::{signal, wait_until, Daemon, Gate, TempDir};

/// A profile that shows the system but lets nothing outside the workspace be executed.
const NO_EXEC: &str = r#"description = "nothing outside the workspace may be executed"
[paths]
readable = ["/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache"]
executable = ["{workspace}"]
writable = ["{workspace}", "{tmp}"]
[env.set]
PATH = "/usr/bin:/bin"
HOME = "{workspace}"
"#;

#[test]
fn a_program_the_sandbox_will_not_execute_fails_with_spawn_error() {
    let profiles = TempDir::new("profiles");
    std::fs::write(profiles.path().join("no-exec.toml"), NO_EXEC).unwrap();
    let d = Daemon::start_with_config(&format!(
        "profiles_dir = \"{}\"\n",
        profiles.path().display()
    ));
    let mut c = d.client();
    let s = c.ok(
        "session.open",
        json!({"workspace": d.workspace, "profile": "no-exec"}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = c.bash(&s, "echo never", json!({}));
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "failed", "{r}");
    assert_eq!(r["reason"], "spawn_error", "{r}");
    assert!(r["exit_code"].is_null(), "the command never ran: {r}");
    let t = c.task(r["task_id"].as_str().unwrap());
    assert_eq!(t["reason"], "spawn_error", "{t}");
    // Control: the same call in a default session runs.
    let ok = d.open_session(&mut c);
    assert_eq!(c.bash(&ok, "echo ran", json!({}))["output"], "ran\n");
}

#[test]
fn a_working_directory_gone_before_the_run_starts_fails_with_sandbox_error() {
    let d = Daemon::start_with_config("max_running = 1\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    std::fs::create_dir_all(d.workspace.join("sub")).unwrap();
    // The first run holds the only slot, so the second waits as queued with its directory
    // checked; the directory goes before it starts.
    let gate = Gate::new(&d.workspace, "slot");
    let first = c.bash(&s, &gate.wait_cmd(), json!({"background": true}));
    let first = first["task_id"].as_str().unwrap().to_owned();
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "bash", "args": {"command": "pwd", "workdir": "sub"},
               "background": true}),
    );
    let second = r["task_id"].as_str().unwrap().to_owned();
    assert_eq!(c.task(&second)["state"], "queued");
    std::fs::remove_dir(d.workspace.join("sub")).unwrap();
    gate.open();
    assert_eq!(c.wait_settled(&first)["state"], "succeeded");
    let t = c.wait_settled(&second);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "sandbox_error", "{t}");
    assert!(t["exit_code"].is_null(), "{t}");
}

#[test]
fn a_cancel_that_cannot_finish_in_time_is_cancellation_pending() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "never");
    let r = c.bash(&s, &gate.wait_cmd(), json!({"background": true}));
    let id = r["task_id"].as_str().unwrap().to_owned();
    let pid_file = d.private_dir(&id).join("supervisor.pid");
    assert!(wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
    }));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // A stopped supervisor cannot act on the cancel: the run outlives the grace.
    signal(pid, libc::SIGSTOP);
    let res = c.ok("task.cancel", json!({"task_id": id, "grace_ms": 0}));
    let t = c.task(&id);
    signal(pid, libc::SIGCONT);
    assert_eq!(res["result"], "cancellation_pending", "{res}");
    assert_eq!(t["state"], "running", "{t}");
    // Let go, the supervisor carries the cancel out.
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "canceled", "{t}");
    assert_eq!(
        c.ok("task.cancel", json!({"task_id": id}))["result"],
        "already_terminal"
    );
}

/// The registry's session directory is replaced by a file behind the daemon's back: opening a
/// session fails inside the daemon, which answers -32603 `internal` and carries on.
#[test]
fn a_failure_inside_the_daemon_is_an_internal_error_and_the_daemon_carries_on() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let sessions = d.state_dir.join("sessions");
    let aside = d.state_dir.join("sessions.aside");
    std::fs::rename(&sessions, &aside).unwrap();
    std::fs::write(&sessions, b"not a directory").unwrap();
    let e = c
        .call("session.open", json!({"workspace": d.workspace}))
        .expect_err("session.open cannot create its directory");
    std::fs::remove_file(&sessions).unwrap();
    std::fs::rename(&aside, &sessions).unwrap();
    assert_eq!(e["code"], -32603, "{e}");
    assert_eq!(e["data"]["kind"], "internal", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("sessions"),
        "the error names the path: {e}"
    );
    // The daemon, this connection and the existing session carry on.
    assert_eq!(
        c.bash(&s, "echo still-here", json!({}))["output"],
        "still-here\n"
    );
    d.open_session(&mut c);
}

/// A `session_dir` the caller names that cannot be a directory is the caller's mistake, and
/// the protocol has a code for that: `invalid_params`, not the daemon's own `internal`.
#[test]
fn a_session_dir_that_cannot_be_created_is_invalid_params() {
    let d = Daemon::start();
    let mut c = d.client();
    let file = d.root.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let (code, kind) = c.err(
        "session.open",
        json!({"workspace": d.workspace, "session_dir": file.join("session")}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
}
