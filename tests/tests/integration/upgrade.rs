//! In-place upgrade (docs/protocol.md, "Upgrading in place"): SIGHUP re-executes the daemon
//! in its own process, with the same socket and the same runs, and refuses a binary it cannot
//! trust or that does not run.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{process_alive, sidejob_bin, skip_unless, wait_until, Daemon, Gate};

const PLUGINS: [&str; 3] = [
    "libsidejob_plugin_bash.so",
    "libsidejob_plugin_code.so",
    "libsidejob_plugin_subagent.so",
];

/// Where the daemon looks for a staged binary.
fn staged(d: &Daemon) -> PathBuf {
    d.state_dir.join("upgrade/bin/sidejob")
}

/// Stages `binary` (mode `mode`) with the shipped plugins beside it, as
/// `install.sh --prefix <state_dir>/upgrade` would lay them out.
fn stage(d: &Daemon, binary: &Path, mode: u32) -> PathBuf {
    let dir = d.state_dir.join("upgrade/bin");
    std::fs::create_dir_all(&dir).expect("staging directory");
    for p in [d.state_dir.join("upgrade"), dir.clone()] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let target = staged(d);
    let _ = std::fs::remove_file(&target);
    std::fs::copy(binary, &target).expect("stage the binary");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let built = sidejob_bin();
    let built = built.parent().expect("target dir");
    for name in PLUGINS {
        let from = [built.join(name), built.join("deps").join(name)]
            .into_iter()
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{name} is not built"));
        std::fs::copy(from, dir.join(name)).expect("stage a plugin");
    }
    target
}

fn exe_of(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).expect("the daemon's exe")
}

/// SIGHUPs the daemon and waits until its log says what came of it (`needle`), the
/// `count`-th time.
fn hup_until(d: &Daemon, needle: &str, count: usize) {
    sidejob_tests::signal(d.pid() as i32, libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(30), || d.log().matches(needle).count()
            >= count),
        "the daemon never logged {needle:?} after SIGHUP; log:\n{}",
        d.log()
    );
}

/// The children of `pid` that have exited and that nobody reaped.
fn zombie_children(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in children
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
        {
            let stat = std::fs::read_to_string(format!("/proc/{c}/stat")).unwrap_or_default();
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next());
            if state == Some("Z") {
                out.push(c);
            }
        }
    }
    out
}

fn status_pid(d: &Daemon) -> Value {
    d.client().ok("daemon.status", json!({}))["pid"].clone()
}

/// Skips (saying why) unless root: a staged binary must be root's.
fn not_root() -> bool {
    skip_unless(
        sidejob_tests::is_root(),
        "needs root (the staged binary must be root's)",
    )
}

/// Starts `command` in the background in session `s`; its task id.
fn background(c: &mut sidejob_tests::Client, s: &str, command: &str) -> String {
    c.bash(s, command, json!({"background": true}))["task_id"]
        .as_str()
        .expect("id")
        .to_owned()
}

/// A daemon, a client with a session, and a gate its runs wait on; `None` (the test is
/// skipped) when not root.
fn gated_daemon() -> Option<(Daemon, sidejob_tests::Client, String, Gate)> {
    if not_root() {
        return None;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "release");
    Some((d, c, s, gate))
}

#[test]
fn sighup_re_executes_the_staged_binary_and_runs_settle_with_their_exit_codes() {
    let Some((d, mut c, s, gate)) = gated_daemon() else {
        return;
    };
    let failing = background(
        &mut c,
        &s,
        &format!("echo before; {}; echo after; exit 5", gate.wait_cmd()),
    );
    let passing = background(&mut c, &s, &format!("{}; seq 1 3000", gate.wait_cmd()));
    let supervisors: Vec<i32> = [&failing, &passing]
        .iter()
        .map(|id| sidejob_tests::supervisor_pid(&d.private_dir(id)))
        .collect();
    let pid = d.pid();
    assert_eq!(status_pid(&d), json!(pid));
    let before = exe_of(pid);
    // A client waiting across the upgrade: its connection closes, and it connects again.
    let waiting = Command::new(sidejob_bin())
        .arg("--socket")
        .arg(&d.socket)
        .args(["wait", &failing])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sidejob wait");
    let target = stage(&d, &sidejob_bin(), 0o755);
    hup_until(&d, "upgraded in place", 1);
    assert_eq!(exe_of(pid), target, "not re-executed from the staged file");
    assert_ne!(before, target);
    // The same process, on the same socket path, with the runs still under way.
    assert_eq!(status_pid(&d), json!(pid));
    for s in &supervisors {
        assert!(
            process_alive(*s),
            "supervisor {s} did not outlive the upgrade"
        );
    }
    let mut c = d.client();
    assert_eq!(c.task(&failing)["state"], "running");
    gate.open();
    let t = c.wait_settled_quietly(&failing);
    assert_eq!(
        (&t["state"], &t["reason"], &t["exit_code"]),
        (&json!("failed"), &json!("exit_code"), &json!(5)),
        "{t}"
    );
    assert_eq!(c.output(&failing), "before\nafter\n");
    let t = c.wait_settled_quietly(&passing);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(t["exit_code"], 0, "{t}");
    let expected: String = (1..=3000).map(|i| format!("{i}\n")).collect();
    assert_eq!(c.output(&passing), expected);
    let waited = waiting.wait_with_output().expect("sidejob wait");
    assert_eq!(
        waited.status.code(),
        Some(5),
        "sidejob wait across the upgrade: {}{}",
        String::from_utf8_lossy(&waited.stdout),
        String::from_utf8_lossy(&waited.stderr)
    );
    // Reaped, not left as zombies of the new image.
    for s in &supervisors {
        assert!(
            wait_until(Duration::from_secs(10), || !Path::new(&format!(
                "/proc/{s}"
            ))
            .exists()),
            "supervisor {s} was not reaped"
        );
    }
    // Nor is anything else of the first image's (its spawner) left unreaped.
    assert!(
        wait_until(Duration::from_secs(10), || zombie_children(pid).is_empty()),
        "zombie children of the daemon: {:?}",
        zombie_children(pid)
    );
    // New runs start from the new image.
    let r = c.bash(&s, "echo again", json!({}));
    assert_eq!(r["exit_code"], 0, "{r}");
}

#[test]
fn an_untrusted_staged_binary_is_refused_and_the_daemon_serves_on() {
    if skip_unless(
        sidejob_tests::is_root(),
        "needs root (to chown the staged binary)",
    ) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let pid = d.pid();
    let before = exe_of(pid);
    let target = stage(&d, &sidejob_bin(), 0o775);
    hup_until(&d, "upgrade refused", 1);
    assert!(d.log().contains("group-writable"), "log:\n{}", d.log());
    // Someone else's file, however its mode.
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::chown(&target, Some(1000), None).expect("chown");
    hup_until(&d, "upgrade refused", 2);
    assert!(d.log().contains("owned by uid 1000"), "log:\n{}", d.log());
    // A symlink to a good binary is not followed.
    std::fs::remove_file(&target).expect("rm");
    std::os::unix::fs::symlink(sidejob_bin(), &target).expect("symlink");
    hup_until(&d, "upgrade refused", 3);
    assert!(d.log().contains("symbolic link"), "log:\n{}", d.log());
    // A staging directory others may write is refused too.
    std::fs::remove_file(&target).expect("rm");
    stage(&d, &sidejob_bin(), 0o755);
    let dir = target.parent().expect("dir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    hup_until(&d, "upgrade refused", 4);
    assert!(d.log().contains("world-writable"), "log:\n{}", d.log());
    // Still the first image, serving.
    assert_eq!(exe_of(pid), before);
    assert!(!d.log().contains("upgraded in place"), "log:\n{}", d.log());
    assert_eq!(status_pid(&d), json!(pid));
    let r = c.bash(&s, "echo still", json!({}));
    assert_eq!(r["exit_code"], 0, "{r}");
}

#[test]
fn a_staged_binary_that_does_not_run_is_reported_and_refused() {
    if not_root() {
        return;
    }
    let d = Daemon::start();
    let check = |binary: Option<&Path>| {
        let mut cmd = Command::new(sidejob_bin());
        cmd.arg("upgrade-check")
            .arg("--state-dir")
            .arg(&d.state_dir);
        if let Some(b) = binary {
            cmd.arg(b);
        }
        let o = cmd.output().expect("sidejob upgrade-check");
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        )
    };
    // A good one passes.
    let target = stage(&d, &sidejob_bin(), 0o755);
    let (code, said) = check(None);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("staged binary") && said.contains("sidejob "),
        "{said}"
    );
    // One that exits non-zero on --version.
    stage(&d, Path::new("/bin/false"), 0o755);
    let (code, said) = check(None);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("does not run") && said.contains("exited with 1"),
        "{said}"
    );
    // One that is not a program at all.
    std::fs::write(&target, b"not a program\n").expect("write");
    let (code, said) = check(None);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("does not run"), "{said}");
    // One that runs but is not sidejob.
    stage(&d, Path::new("/bin/true"), 0o755);
    let (code, said) = check(None);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("is not sidejob"), "{said}");
    // Named on the command line, and not there.
    let (code, said) = check(Some(&d.root.path().join("nothing")));
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("does not exist"), "{said}");
    // `sidejob upgrade` (the unit's reload) runs them before it signals, and does not.
    let state_dir = d.state_dir.to_str().expect("utf-8 path");
    let upgrade = d.cli(&["upgrade", "--state-dir", state_dir]);
    let said = String::from_utf8_lossy(&upgrade.stderr);
    assert_eq!(upgrade.status.code(), Some(1), "{said}");
    assert!(
        said.contains("is not sidejob") && said.contains("not signalled"),
        "{said}"
    );
    // The daemon runs the same checks and serves on.
    let pid = d.pid();
    let before = exe_of(pid);
    assert!(
        !d.log().contains("upgrade refused"),
        "signalled: {}",
        d.log()
    );
    hup_until(&d, "upgrade refused", 1);
    assert!(d.log().contains("is not sidejob"), "log:\n{}", d.log());
    assert_eq!(exe_of(pid), before);
    assert_eq!(status_pid(&d), json!(pid));
}

/// `systemctl reload` as the unit defines it (`ExecReload=/usr/local/bin/sidejob upgrade`) on
/// a socket-activated `Type=notify` daemon: `sidejob upgrade` returns once the new image
/// serves, after RELOADING=1 and READY=1 from it; the socket the service manager passed is
/// still served (and still there after a stop), the run settled with its own exit code.
/// (deploy_systemd.rs does the same under systemd itself.)
#[test]
fn a_socket_activated_daemon_reloads_in_place_as_systemd_expects() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/sidejob.service"),
    )
    .expect("the unit");
    assert!(
        unit.lines()
            .any(|l| l.trim() == "ExecReload=/usr/local/bin/sidejob upgrade"),
        "the unit's reload is not `sidejob upgrade`"
    );
    let root = sidejob_tests::TempDir::new("reload");
    std::fs::create_dir_all(root.path().join("run")).expect("run dir");
    let path = root.path().join("run/given.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let notify = super::deploy::Notify::new(root.path());
    let mut child = super::deploy::serve_activated(&listener, &root.path().join("state"), &notify);
    assert_eq!(notify.next(), "READY=1");
    drop(listener);
    let ws = root.path().join("workspace");
    std::fs::create_dir(&ws).expect("workspace");
    let mut c = sidejob_tests::Client::connect(&path);
    let s = c.open_session_in(&ws);
    let gate = Gate::new(&ws, "release");
    let id = background(
        &mut c,
        &s,
        &format!("{}; echo reloaded; exit 3", gate.wait_cmd()),
    );
    sidejob_tests::supervisor_pid(&sidejob_tests::runs_dir(&root.path().join("state")).join(&id));
    let upgraded = Command::new(sidejob_bin())
        .arg("upgrade")
        .arg("--socket")
        .arg(&path)
        .arg("--state-dir")
        .arg(root.path().join("state"))
        .output()
        .expect("sidejob upgrade");
    assert!(
        upgraded.status.success()
            && String::from_utf8_lossy(&upgraded.stdout).contains("upgraded in place"),
        "sidejob upgrade: {upgraded:?}"
    );
    let reloading = notify.next();
    assert!(
        reloading.starts_with("RELOADING=1") && reloading.contains("MONOTONIC_USEC="),
        "{reloading}"
    );
    assert_eq!(notify.next(), "READY=1");
    let mut c = sidejob_tests::Client::connect(&path);
    let st = c.ok("daemon.status", json!({}));
    assert_eq!(st["socket_activated"], true, "{st}");
    assert_eq!(st["pid"], json!(child.0.id()), "{st}");
    gate.open();
    let t = c.wait_settled_quietly(&id);
    assert_eq!(
        (&t["state"], &t["exit_code"]),
        (&json!("failed"), &json!(3)),
        "{t}"
    );
    assert_eq!(c.output(&id), "reloaded\n");
    sidejob_tests::signal(child.0.id() as i32, libc::SIGTERM);
    assert_eq!(notify.next(), "STOPPING=1");
    assert!(child.0.wait().expect("wait").success());
    assert!(path.exists(), "the service manager's socket was removed");
}

/// SIGHUPs in a burst: each one that lands while an upgrade is under way (the new image not
/// yet handling the signal) would otherwise end the daemon; it goes on upgrading, the run in
/// flight settles with its own code.
#[test]
fn a_burst_of_sighups_upgrades_again_and_again_without_losing_the_daemon_or_the_run() {
    let Some((d, mut c, s, gate)) = gated_daemon() else {
        return;
    };
    let id = background(
        &mut c,
        &s,
        &format!("{}; echo through; exit 6", gate.wait_cmd()),
    );
    sidejob_tests::supervisor_pid(&d.private_dir(&id));
    let pid = d.pid();
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < deadline {
        sidejob_tests::signal(pid as i32, libc::SIGHUP);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        wait_until(Duration::from_secs(30), || {
            d.log().matches("upgraded in place").count() >= 1
                && std::os::unix::net::UnixStream::connect(&d.socket).is_ok()
        }),
        "log:\n{}",
        d.log()
    );
    assert!(
        process_alive(pid as i32),
        "the daemon died; log:\n{}",
        d.log()
    );
    // A SIGHUP of the burst may still be pending and start one more upgrade: ask through the
    // CLI, which connects again when a connection closes under it.
    gate.open();
    let waited = d.cli(&["wait", &id]);
    assert_eq!(
        waited.status.code(),
        Some(6),
        "{}{}\nlog:\n{}",
        String::from_utf8_lossy(&waited.stdout),
        String::from_utf8_lossy(&waited.stderr),
        d.log()
    );
    let logs = d.cli(&["logs", &id]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "through\n");
    assert!(
        process_alive(pid as i32),
        "the daemon died; log:\n{}",
        d.log()
    );
}
