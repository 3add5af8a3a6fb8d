//! `sidejob call` as a person uses it: it waits for the end and exits with the command's
//! code, streams output, Ctrl+C cancels (on a real pseudo-terminal), yielding is opt-in.

use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};
use sidejob_tests::{sidejob_bin, Daemon};

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(o),
        stderr(o)
    )
}

/// The task id `call --background` prints alone on stdout.
fn background(d: &Daemon, command: &str) -> String {
    let o = d.cli(&["call", "--background", "--", command]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let id = stdout(&o);
    assert_eq!(
        id.trim().len(),
        26,
        "only the id on stdout: {}",
        describe(&o)
    );
    assert_eq!(id.lines().count(), 1, "{}", describe(&o));
    id.trim().to_owned()
}

#[test]
fn call_outlasts_the_yield_and_the_interactive_deadline_and_exits_with_the_code() {
    // A foreground tool.call on this daemon would yield after 100 ms and be stopped at
    // 500 ms; a person's `call` waits for the end all the same.
    let d =
        Daemon::start_with_config("default_yield_after_ms = 100\ninteractive_deadline_ms = 500\n");
    let o = d.cli(&["call", "--", "echo begun; sleep 1.2; echo done; exit 9"]);
    assert_eq!(o.status.code(), Some(9), "{}", describe(&o));
    assert_eq!(stdout(&o), "begun\ndone\n", "{}", describe(&o));
    assert_eq!(stderr(&o), "", "nothing else when stderr is not a terminal");
    // Its result went to the call: no wake was left in the inbox.
    let inbox = d.cli(&["inbox", "--unread", "--json"]);
    let v: Value = serde_json::from_slice(&inbox.stdout).expect("JSON");
    assert_eq!(v["notifications"], json!([]), "{v}");
}

#[test]
fn quick_calls_leave_no_wake_in_the_inbox() {
    // A run that ends before `call`'s wait reaches the daemon makes a wake; `call` showed the
    // result, so it acks that wake. Before, a few of these 80 (four at a time, so that some
    // runs end before their wait arrives) left one unread each.
    let d = Daemon::start();
    std::thread::scope(|s| {
        for t in 0..4 {
            let d = &d;
            s.spawn(move || {
                for i in 0..20 {
                    let o = d.cli(&["call", "--", &format!("echo {t}-{i}")]);
                    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
                    assert_eq!(stdout(&o), format!("{t}-{i}\n"), "{}", describe(&o));
                }
            });
        }
    });
    let inbox = d.cli(&["inbox", "--unread", "--json"]);
    let v: Value = serde_json::from_slice(&inbox.stdout).expect("JSON");
    assert_eq!(v["notifications"], json!([]), "{v}");
}

#[test]
fn ctrl_c_cancels_the_run_and_output_streams_while_it_runs() {
    let d = Daemon::start();
    // "started" reaches the terminal while the command still sleeps: it is streamed.
    let o = d.cli_on_a_terminal(
        &["expect:started", "send:ctrl-c"],
        &["call", "--", "echo started; sleep 300"],
    );
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(130), "{out}");
    assert!(out.contains("canceling"), "{out}");
    let tasks = d.cli(&["tasks", "--json", "--all"]);
    let v: Value = serde_json::from_slice(&tasks.stdout).expect("JSON");
    let t = &v["tasks"][0];
    assert_eq!(t["state"], "canceled", "{v}");
    assert_eq!(t["summary"], "echo started; sleep 300");
}

#[test]
fn a_second_ctrl_c_leaves_the_run_going_and_prints_its_id() {
    // Before, the second Ctrl+C said "left … running" but the cancel went on: the run was
    // killed when its grace ran out, and call exited 130 either way.
    let d = Daemon::start_with_config("cancel_grace_ms = 1000\n");
    let o = d.cli_on_a_terminal(
        &[
            "expect:started",
            "send:ctrl-c",
            "expect:Ctrl+C again",
            "send:ctrl-c",
        ],
        // It ignores SIGTERM, and runs well past the grace.
        &[
            "call",
            "--",
            "trap '' TERM; echo started; for i in $(seq 40); do sleep 0.1; done; echo survived",
        ],
    );
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(75), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("left ") && l.contains("running"))
        .unwrap_or_else(|| panic!("no detach message: {out}"));
    let id = line
        .split_whitespace()
        .find(|w| w.len() == 26)
        .unwrap_or_else(|| panic!("no id in {line}"));
    // Left running for real: it outlives the grace and ends as it ends.
    let mut c = d.client();
    let t = c.wait_settled(id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert!(c.output(id).contains("survived"), "{t}");
}

#[test]
fn yield_after_leaves_the_run_in_the_background_and_says_so() {
    let d = Daemon::start();
    let o = d.cli(&["call", "--yield-after", "2s", "--", "echo early; sleep 300"]);
    assert_eq!(o.status.code(), Some(75), "{}", describe(&o));
    assert_eq!(stdout(&o), "early\n", "{}", describe(&o));
    let err = stderr(&o);
    let id = err
        .split_whitespace()
        .find(|w| w.len() == 26)
        .unwrap_or_else(|| panic!("no id: {err}"))
        .to_owned();
    assert!(err.contains("sidejob logs -f"), "{err}");
    let mut c = d.client();
    assert_eq!(c.task(&id)["state"], "running");
    let o = d.cli(&["cancel", "--grace", "100ms", &id[..14]]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
}

#[test]
fn background_prints_only_the_id_so_a_shell_can_capture_it() {
    let d = Daemon::start();
    let id = background(&d, "echo captured; exit 4");
    let o = d.cli(&["wait", &id]);
    assert_eq!(o.status.code(), Some(4), "{}", describe(&o));
    let o = d.cli(&["logs", &id]);
    assert_eq!(stdout(&o), "captured\n");
}

#[test]
fn call_takes_env_stdin_a_profile_and_other_tools() {
    let d = Daemon::start();
    let o = Command::new(sidejob_bin())
        .arg("--socket")
        .arg(&d.socket)
        .args([
            "call",
            "--env",
            "GREETING=hello",
            "--env",
            "FROM_HERE",
            "--",
            "echo $GREETING $FROM_HERE",
        ])
        .env("FROM_HERE", "inherited")
        .current_dir(&d.workspace)
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(stdout(&o), "hello inherited\n", "{}", describe(&o));

    let mut child = Command::new(sidejob_bin())
        .arg("--socket")
        .arg(&d.socket)
        .args(["call", "--stdin", "--", "tr a-z A-Z"])
        .current_dir(&d.workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"piped through\n")
        .expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_eq!(stdout(&o), "PIPED THROUGH\n", "{}", describe(&o));

    let o = d.cli(&["call", "--profile", "read-only", "--", "touch made-here"]);
    assert_ne!(o.status.code(), Some(0), "read-only: {}", describe(&o));
    assert!(!d.workspace.join("made-here").exists());

    let o = d.cli(&[
        "call",
        "--tool",
        "bash",
        "--args",
        r#"{"command": "echo via-tool"}"#,
    ]);
    assert_eq!(stdout(&o), "via-tool\n", "{}", describe(&o));
    let o = d.cli(&["call", "--tool", "bash", "--args", "[1]"]);
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    assert!(stderr(&o).contains("JSON object"), "{}", describe(&o));
}

#[test]
fn the_cli_session_is_per_user_and_directory() {
    let d = Daemon::start();
    let id = background(&d, "true");
    let mut c = d.client();
    let session = c.task(&id)["session_id"]
        .as_str()
        .expect("session")
        .to_owned();
    // SAFETY: getuid cannot fail.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::getuid() };
    let prefix = format!("cli-{uid}-");
    assert!(
        session.starts_with(&prefix) && session.len() == prefix.len() + 8,
        "{session}"
    );
}

#[test]
fn without_dashes_call_says_how_to_pass_a_command() {
    let d = Daemon::start();
    let o = d.cli(&["call", "echo", "-n", "hi"]);
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("sidejob call -- echo -n hi"), "{err}");
}
