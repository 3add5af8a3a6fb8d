//! Containment through the daemon: runs started by `tool.call` (foreground and background) go
//! into the same sandbox as `sidejob exec`, and the daemon's own files are out of reach.

use serde_json::{json, Value};
use sidejob_tests::{skip_without, Client, Daemon, Need};

use crate::containment::{
    assert_holds_only_the_view, mounts_of_namespace, probe_bin, profile_with, sleeper, RenamedOver,
};

struct Setup {
    d: Daemon,
    c: Client,
    s: String,
    probe: String,
}

fn setup() -> Option<Setup> {
    if skip_without(&[Need::Root]) {
        return None;
    }
    let d = Daemon::start();
    let probe = d.workspace.join("probe");
    std::fs::copy(probe_bin(), &probe).expect("copy probe");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    Some(Setup {
        probe: probe.display().to_string(),
        d,
        c,
        s,
    })
}

/// Runs the probe through `tool.call` and returns its report and the task.
fn probe(st: &mut Setup, args: &str, extra: Value) -> (Value, Value) {
    let r = st.c.bash(&st.s, &format!("{} {args}", st.probe), extra);
    let task_id = r["task_id"].as_str().expect("task id").to_owned();
    let task = st.c.wait_settled(&task_id);
    let out = st.c.output(&task_id);
    let report = out
        .lines()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or_else(|| panic!("no probe report in {out:?}; task {task}"));
    (report, task)
}

#[test]
fn a_daemon_run_is_confined_like_exec_in_the_foreground_and_the_background() {
    let Some(mut st) = setup() else { return };
    let secret = st.d.root.path().join("secret.txt");
    std::fs::write(&secret, "TOP-SECRET").unwrap();
    for extra in [json!({}), json!({"background": true})] {
        let (r, _) = probe(
            &mut st,
            &format!("read {}", secret.display()),
            extra.clone(),
        );
        assert_eq!(r["errno"], libc::ENOENT, "{extra}: {r}");
        let (r, _) = probe(&mut st, "ptrace 1", extra.clone());
        assert_eq!(r["errno"], libc::EPERM, "{extra}: {r}");
        let planted = format!("write {}/planted x", st.d.root.path().display());
        // Under /tmp the write lands in the run's private tmpfs, never on the host.
        let (_, _) = probe(&mut st, &planted, extra.clone());
        assert!(!st.d.root.path().join("planted").exists());
        let (r, _) = probe(&mut st, "write /etc/planted x", extra.clone());
        assert_eq!(r["ok"], false, "{r}");
        assert!(!std::path::Path::new("/etc/planted").exists());
        // Control: the workspace is writable.
        let made = st.d.workspace.join("made");
        let (r, _) = probe(&mut st, &format!("write {} ok", made.display()), extra);
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(std::fs::read_to_string(&made).unwrap(), "ok");
    }
}

#[test]
fn the_control_socket_state_dir_and_other_sessions_are_out_of_reach() {
    let Some(mut st) = setup() else { return };
    let sock = st.d.socket.display().to_string();
    let (r, _) = probe(&mut st, &format!("unix {sock}"), json!({}));
    assert_eq!(r["errno"], libc::ENOENT, "{r}");
    let ls_state = format!("ls {}", st.d.state_dir.display());
    let (r, _) = probe(&mut st, &ls_state, json!({}));
    assert_eq!(r["errno"], libc::ENOENT, "{r}");
    // Another session's directory (and our own) are not in the view either.
    let other = st.c.ok(
        "session.open",
        json!({"workspace": st.d.workspace, "session_id": "other-session"}),
    );
    let other_dir = other["session_dir"].as_str().unwrap().to_owned();
    let (r, _) = probe(&mut st, &format!("ls {other_dir}"), json!({}));
    assert_eq!(r["errno"], libc::ENOENT, "{r}");
    // Control: the socket is there and answers on the host.
    let mut c2 = st.d.client();
    c2.ok("session.list", json!({}));
}

#[test]
fn a_call_may_narrow_its_sessions_profile_but_not_widen_it() {
    let Some(mut st) = setup() else { return };
    // Wider: host network from a workspace-write session.
    let (code, kind) = st.c.err(
        "tool.call",
        json!({"session_id": st.s, "tool": "bash", "args": {"command": "true"}, "profile": "network"}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    // Unknown profiles are refused at session.open.
    let (code, _) = st.c.err(
        "session.open",
        json!({"workspace": st.d.workspace, "profile": "no-such-profile"}),
    );
    assert_eq!(code, -32602);
    // Narrower: read-only runs, and cannot write the workspace.
    let f = st.d.workspace.join("file");
    std::fs::write(&f, "orig").unwrap();
    let (r, task) = probe(
        &mut st,
        &format!("write {} x", f.display()),
        json!({"profile": "read-only"}),
    );
    assert_eq!(r["ok"], false, "{r} {task}");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "orig");
    // Control: the session's own profile writes.
    let (r, _) = probe(&mut st, &format!("write {} x", f.display()), json!({}));
    assert_eq!(r["ok"], true);
}

#[test]
fn a_daemon_runs_result_names_its_sandbox_layers_and_profile() {
    let Some(mut st) = setup() else { return };
    let r = st.c.bash(&st.s, "true", json!({}));
    let task = st.c.wait_settled(r["task_id"].as_str().unwrap());
    let result_path = task["result_path"].as_str().unwrap().to_owned();
    let result: Value = serde_json::from_slice(&std::fs::read(&result_path).unwrap()).unwrap();
    assert_eq!(result["profile"], "workspace-write");
    let layers: Vec<&str> = result["sandbox_layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for l in [
        "mount_view",
        "landlock_fs",
        "seccomp",
        "pid_namespace",
        "net_namespace",
    ] {
        assert!(layers.contains(&l), "{l}: {layers:?}");
    }
}

#[test]
fn the_daemons_environment_does_not_reach_a_run() {
    let Some(mut st) = setup() else { return };
    let (r, _) = probe(&mut st, "env", json!({}));
    let env = r["detail"].as_str().unwrap();
    assert!(env.contains("SIDEJOB_TASK_ID="), "{env}");
    assert!(
        !env.contains("SIDEJOB_LOG"),
        "the daemon's own variable leaked: {env}"
    );
    let (r, _) = probe(&mut st, "environs", json!({}));
    assert!(
        !r["detail"].as_str().unwrap().contains("SIDEJOB_LOG"),
        "{r}"
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
fn an_unprivileged_daemon_refuses_what_it_cannot_enforce_and_runs_best_effort_profiles() {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    // Root starts the daemon as another uid, which needs a user namespace of its own.
    if skip_without(&[Need::Root, Need::UserNamespaces]) {
        return;
    }
    const NOBODY: u32 = 65534;
    let root = sidejob_tests::TempDir::new("unpriv");
    let dirs = ["runtime", "state", "home", "ws", "profiles"].map(|d| root.path().join(d));
    for dir in &dirs {
        std::fs::create_dir_all(dir).unwrap();
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let [runtime, state, home, ws, profiles] = dirs;
    // Best effort: a memory limit this daemon cannot enforce (no delegated cgroup) is skipped
    // and the result says which layers were active.
    std::fs::write(
        profiles.join("lenient.toml"),
        "best_effort = true\n[paths]\nreadable = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", \"/etc/ld.so.cache\"]\n\
         executable = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\"]\nwritable = [\"{workspace}\", \"{tmp}\"]\n\
         [limits]\nmemory = \"256MiB\"\n",
    )
    .unwrap();
    let log = std::fs::File::create(root.path().join("daemon.log")).unwrap();
    let child = Command::new(sidejob_tests::sidejob_bin())
        .arg("serve")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &home)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("XDG_STATE_HOME", &state)
        .env("SIDEJOB_PROFILES_DIR", &profiles)
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir(&ws)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let _reap = Reap(child, root.path().to_path_buf());
    let socket = runtime.join("sidejob/sidejob.sock");
    assert!(
        sidejob_tests::wait_until(std::time::Duration::from_secs(20), || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        }),
        "no socket; log:\n{}",
        std::fs::read_to_string(root.path().join("daemon.log")).unwrap_or_default()
    );
    let mut c = Client::connect(&socket);
    // ci needs cgroups: refused, naming the layer.
    let e = c
        .call("session.open", json!({"workspace": ws, "profile": "ci"}))
        .expect_err("ci cannot be enforced without a delegated cgroup");
    assert_eq!(e["code"], -32003, "{e}");
    assert_eq!(e["data"]["kind"], "sandbox_unavailable", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("cgroup_memory"),
        "{e}"
    );
    // The best-effort profile runs, and says what it had.
    let s = c.ok(
        "session.open",
        json!({"workspace": ws, "profile": "lenient"}),
    );
    let r = c.ok(
        "tool.call",
        json!({"session_id": s["session_id"], "tool": "bash", "args": {"command": "id -u"}}),
    );
    assert_eq!(r["state"], "succeeded", "{r}");
    assert_eq!(r["output"], format!("{NOBODY}\n"));
    let result: Value =
        serde_json::from_slice(&std::fs::read(r["result_path"].as_str().unwrap()).unwrap())
            .unwrap();
    let layers: Vec<&str> = result["sandbox_layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(!layers.contains(&"cgroup_memory"), "{layers:?}");
    for l in ["user_namespace", "mount_view", "landlock_fs", "seccomp"] {
        assert!(layers.contains(&l), "{l}: {layers:?}");
    }
    // Control: the default profile needs nothing this daemon lacks.
    c.ok("session.open", json!({"workspace": ws}));
}

#[test]
fn a_workspace_swapped_for_a_symlink_is_refused_not_followed() {
    let Some(mut st) = setup() else { return };
    let elsewhere = st.d.root.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    // Control: the session's workspace is writable as it is.
    let ok = format!("write {}/ok x", st.d.workspace.display());
    let (r, _) = probe(&mut st, &ok, json!({}));
    assert_eq!(r["ok"], true, "{r}");
    // Swap the workspace for a symlink to another directory, behind the daemon's back.
    let real = st.d.root.path().join("workspace.real");
    std::fs::rename(&st.d.workspace, &real).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &st.d.workspace).unwrap();
    let cmd = format!(
        "{}/probe write {}/planted x",
        real.display(),
        st.d.workspace.display()
    );
    let r = st.c.bash(&st.s, &cmd, json!({}));
    let task = st.c.wait_settled(r["task_id"].as_str().unwrap());
    assert_eq!(task["state"], "failed", "{task}");
    assert!(
        !elsewhere.join("planted").exists(),
        "the symlink's target was written"
    );
}

/// A file a profile lists that is renamed over (as `useradd` does to /etc/passwd) while a
/// daemon's runs start: each sees the file as it is now. The daemon's runs copy the file's
/// mount before they leave the host's mount namespace for a copy of the bare one, so a
/// file renamed over in between is opened and copied again in the host's: the same as
/// `containment::a_listed_file_renamed_over_while_runs_start_is_bound_as_it_is_now` checks
/// for `sidejob exec`.
#[test]
fn a_listed_file_renamed_over_while_daemon_runs_start_is_bound_as_it_is_now() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let outside = sidejob_tests::TempDir::new("outside");
    let listed = outside.path().join("listed.txt");
    std::fs::write(&listed, "v0\n").expect("write");
    let profiles = outside.path().join("profiles");
    std::fs::create_dir(&profiles).expect("mkdir");
    let body = profile_with("", "").replacen(
        "\"/etc/group\"]",
        &format!("\"/etc/group\", \"{}\"]", listed.display()),
        1,
    );
    std::fs::write(profiles.join("listed.toml"), body).expect("profile");
    let d = Daemon::start_with_config(&format!("profiles_dir = {:?}\n", profiles));
    let mut c = d.client();
    let s = c.ok(
        "session.open",
        json!({"workspace": d.workspace, "profile": "listed"}),
    )["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let renamer = RenamedOver::start(&listed);
    let mut failures = Vec::new();
    for _ in 0..40 {
        let r = c.bash(&s, &format!("cat {}", listed.display()), json!({}));
        let task_id = r["task_id"].as_str().expect("task id").to_owned();
        let task = c.wait_settled(&task_id);
        let out = c.output(&task_id);
        if task["state"] != "succeeded" || !out.starts_with('v') {
            failures.push(format!("{task} {out:?}"));
        }
    }
    renamer.stop();
    assert!(
        failures.is_empty(),
        "{} of 40 runs failed: {failures:?}",
        failures.len()
    );
}

/// A daemon run's mount namespace holds the view and nothing of the host's tree, seen from
/// that namespace's root: the same as
/// `containment::the_hosts_tree_is_detached_from_the_runs_mount_namespace` checks for
/// `sidejob exec`, for a run that a supervisor forked by the spawner started.
#[test]
fn a_daemon_runs_mount_namespace_holds_nothing_of_the_hosts_tree() {
    let Some(mut st) = setup() else { return };
    let pause = sidejob_tests::unique_sleep();
    let r = st.c.bash(
        &st.s,
        &format!("sleep {pause}"),
        json!({"background": true}),
    );
    let task_id = r["task_id"].as_str().expect("task id").to_owned();
    let mounts = mounts_of_namespace(sleeper(&pause));
    let _ = st.c.call("task.cancel", json!({"task_id": task_id}));
    assert_holds_only_the_view(&mounts);
}
