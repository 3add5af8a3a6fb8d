//! `sidejob serve` (issue 2 §2): the socket, stale sockets, a second daemon, SIGTERM.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::{Command, Stdio};

use serde_json::json;
use sidejob_tests::{sidejob_bin, Daemon};

#[test]
fn the_socket_is_created_with_mode_0660() {
    let d = Daemon::start();
    let meta = std::fs::metadata(&d.socket).expect("socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    let mut c = d.client();
    let init = c.ok("initialize", json!({"protocol_version": 1}));
    assert_eq!(init["protocol_version"], 1);
    assert_eq!(init["server"]["name"], "sidejob");
}

#[test]
fn a_stale_socket_file_is_replaced() {
    let mut d = Daemon::prepare("");
    std::fs::create_dir_all(d.socket.parent().expect("dir")).expect("socket dir");
    // A socket file whose listener is gone: what a crashed daemon leaves.
    drop(std::os::unix::net::UnixListener::bind(&d.socket).expect("bind"));
    assert!(d.socket.exists());
    assert!(std::os::unix::net::UnixStream::connect(&d.socket).is_err());
    d.launch();
    let mut c = d.client();
    assert_eq!(c.ok("initialize", json!({}))["protocol_version"], 1);
}

#[test]
fn a_second_daemon_on_a_live_socket_exits_1_with_a_clear_message() {
    let d = Daemon::start();
    let other_state = d.root.path().join("other-state");
    let o = Command::new(sidejob_bin())
        .arg("serve")
        .arg("--socket")
        .arg(&d.socket)
        .arg("--state-dir")
        .arg(&other_state)
        .stdin(Stdio::null())
        .output()
        .expect("run a second serve");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("already listening") && stderr.contains(&d.socket.display().to_string()),
        "the error should say a daemon is already listening on the socket: {stderr}"
    );
    // The first daemon is unharmed and still owns its socket.
    let mut c = d.client();
    assert_eq!(c.ok("initialize", json!({}))["protocol_version"], 1);
}

#[test]
fn a_second_daemon_on_the_same_state_directory_exits_1() {
    let d = Daemon::start();
    let other_socket = d.root.path().join("run/second.sock");
    let o = Command::new(sidejob_bin())
        .arg("serve")
        .arg("--socket")
        .arg(&other_socket)
        .arg("--state-dir")
        .arg(&d.state_dir)
        .stdin(Stdio::null())
        .output()
        .expect("run a second serve");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("state directory"), "{stderr}");
    let mut c = d.client();
    assert_eq!(c.ok("initialize", json!({}))["protocol_version"], 1);
}

#[test]
fn sigterm_stops_the_daemon_and_leaves_runs_to_settle() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The run outlives the daemon for certain: it goes on only once the gate opens, after
    // the daemon has stopped.
    let gate = sidejob_tests::Gate::new(&d.workspace, "after");
    let r = c.bash(
        &s,
        &format!("{}; echo after", gate.wait_cmd()),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    let run_dir = std::path::Path::new(r["output_path"].as_str().expect("path"))
        .parent()
        .expect("run dir")
        .to_path_buf();
    drop(c);
    assert_eq!(d.terminate(), Some(0), "SIGTERM is a clean stop");
    let pid = sidejob_tests::supervisor_pid(&d.private_dir(&id));
    assert!(
        sidejob_tests::process_alive(pid),
        "the run's supervisor died with the daemon"
    );
    assert!(!run_dir.join("result.json").exists(), "the run ended early");
    gate.open();
    assert!(d.state_dir.join("sidejob.db").exists());
    assert!(
        d.private_dir(&id).join("plan.json").exists(),
        "the run's private files stay"
    );
    assert!(run_dir.exists(), "the run's directory stays");
    assert!(
        std::os::unix::net::UnixStream::connect(&d.socket).is_err(),
        "nobody listens any more"
    );
    d.launch();
    let mut c = d.client();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id), "after\n");
}

#[test]
fn a_bad_config_file_is_refused_with_its_line() {
    let d = Daemon::prepare("max_running = 4\nno_such_key = 1\n");
    let o = Command::new(sidejob_bin())
        .arg("serve")
        .arg("--socket")
        .arg(&d.socket)
        .arg("--state-dir")
        .arg(&d.state_dir)
        .arg("--config")
        .arg(d.config_path().expect("config"))
        .stdin(Stdio::null())
        .output()
        .expect("run serve");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("line 2") && stderr.contains("no_such_key"),
        "{stderr}"
    );
}

#[test]
fn sigint_stops_the_daemon_cleanly_too() {
    let mut d = Daemon::start();
    // Once a request has been answered the daemon is fully up.
    d.client().ok("initialize", json!({}));
    sidejob_tests::signal(d.pid() as i32, libc::SIGINT);
    // SIGINT alone must stop it: nothing else is sent.
    let status = d
        .wait_exit(std::time::Duration::from_secs(30))
        .expect("the daemon is still running 30 s after SIGINT");
    assert_eq!(status.code(), Some(0), "SIGINT is a clean stop: {status}");
    assert!(
        std::os::unix::net::UnixStream::connect(&d.socket).is_err(),
        "nobody listens any more"
    );
}

#[test]
fn a_sigterm_as_soon_as_the_socket_accepts_is_a_clean_stop() {
    // Daemon::start returns as soon as the socket accepts a connection: a service manager
    // may send SIGTERM from that moment on, and it must already be handled.
    let mut d = Daemon::start();
    assert_eq!(
        d.terminate(),
        Some(0),
        "killed by the signal instead of stopping"
    );
}

#[test]
fn the_daemon_does_not_leak_descriptors_across_runs() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
            .expect("fd dir")
            .count()
    };
    // Warm up: the database, the runtime and the connection are open by now.
    c.bash(&s, "true", json!({}));
    c.bash(&s, "true", json!({"stdin": "pipe", "background": true}));
    let before = fds();
    for i in 0..40 {
        match i % 4 {
            0 => {
                c.bash(&s, "echo x", json!({}));
            }
            1 => {
                let r = c.bash(&s, "cat", json!({"stdin": "pipe", "background": true}));
                c.ok(
                    "task.message",
                    json!({"task_id": r["task_id"], "data": "y", "eof": true}),
                );
                c.wait_settled(r["task_id"].as_str().expect("id"));
            }
            2 => {
                let r = c.bash(&s, "sleep 30", json!({"background": true}));
                c.ok(
                    "task.cancel",
                    json!({"task_id": r["task_id"], "grace_ms": 100}),
                );
            }
            _ => {
                let r = c.bash(&s, "sleep 0.1", json!({"yield_after_ms": 0}));
                c.wait_settled(r["task_id"].as_str().expect("id"));
            }
        }
    }
    let after = fds();
    assert!(
        after <= before + 2,
        "the daemon holds {after} descriptors after 40 runs, {before} before"
    );
}

/// Kills a daemon started by hand (and its runs) when the test ends, pass or fail.
struct Reap(std::process::Child, std::path::PathBuf);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        sidejob_tests::kill_processes_mentioning(&self.1.display().to_string());
    }
}

#[test]
fn an_unprivileged_daemon_needs_no_flags_and_uses_the_xdg_directories() {
    use sidejob_tests::{skip_without, Need};
    use std::os::unix::process::CommandExt;
    // Root starts the daemon as another uid, which needs a user namespace of its own.
    if skip_without(&[Need::Root, Need::UserNamespaces]) {
        return;
    }
    const NOBODY: u32 = 65534;
    let root = sidejob_tests::TempDir::new("xdg");
    let (runtime, state, home, ws) = (
        root.path().join("runtime"),
        root.path().join("state"),
        root.path().join("home"),
        root.path().join("ws"),
    );
    for dir in [&runtime, &state, &home, &ws] {
        std::fs::create_dir_all(dir).expect("dir");
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).expect("chown");
    }
    let env = |cmd: &mut Command| {
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &home)
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("XDG_STATE_HOME", &state)
            .uid(NOBODY)
            .gid(NOBODY)
            .current_dir(&ws)
            .stdin(Stdio::null());
    };
    let mut serve = Command::new(sidejob_bin());
    serve.arg("serve");
    env(&mut serve);
    let log = std::fs::File::create(root.path().join("daemon.log")).expect("log");
    let child = serve
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn serve");
    let _reap = Reap(child, root.path().to_path_buf());
    let socket = runtime.join("sidejob/sidejob.sock");
    assert!(
        sidejob_tests::wait_until(std::time::Duration::from_secs(20), || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        }),
        "no socket at {}; log:\n{}",
        socket.display(),
        std::fs::read_to_string(root.path().join("daemon.log")).unwrap_or_default()
    );
    // The socket accepts before the registry is open; an answer comes after.
    let init = sidejob_tests::Client::connect(&socket).ok("initialize", json!({}));
    assert_eq!(init["protocol_version"], 1, "{init}");
    assert!(
        state.join("sidejob/sidejob.db").exists(),
        "state under $XDG_STATE_HOME/sidejob"
    );
    let mut call = Command::new(sidejob_bin());
    call.args(["call", "--", "id -u; pwd"]);
    env(&mut call);
    let o = call.output().expect("sidejob call");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("{NOBODY}\n{}\n", ws.canonicalize().expect("ws").display())
    );
}
