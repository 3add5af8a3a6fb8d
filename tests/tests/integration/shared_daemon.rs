//! One root daemon serving a host's users: a user with no daemon of their own reaches the
//! shared one on the system socket, and says so.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use sidejob_tests::{sidejob_bin, skip_unless, Daemon, NOBODY};

const SYSTEM_SOCKET: &str = "/run/sidejob/sidejob.sock";

/// `sidejob ARGS` as uid 65534 with a bare environment: no `SIDEJOB_SOCKET`, no
/// `XDG_RUNTIME_DIR`, so the CLI looks for the user's own socket, then the system one.
fn as_nobody(workspace: &Path, args: &[&str]) -> std::process::Output {
    Command::new(sidejob_bin())
        .args(args)
        .current_dir(workspace)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .output()
        .expect("run sidejob as uid 65534")
}

#[test]
fn a_user_without_a_daemon_of_their_own_reaches_the_shared_one() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Root]) {
        return;
    }
    if skip_unless(
        !Path::new(SYSTEM_SOCKET).exists(),
        "a daemon already listens on /run/sidejob/sidejob.sock on this host",
    ) {
        return;
    }
    if skip_unless(
        !Path::new(&format!("/tmp/sidejob-{NOBODY}/sidejob.sock")).exists(),
        "uid 65534 has a daemon of its own here",
    ) {
        return;
    }
    let mut d = Daemon::prepare("");
    d.socket = SYSTEM_SOCKET.into();
    d.launch();
    d.let_everyone_connect();
    let ws = d.nobody_workspace("ws");
    let status = as_nobody(&ws, &["status"]);
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{status:?}");
    assert!(
        out.contains(SYSTEM_SOCKET) && out.contains("shared system daemon"),
        "status does not say which daemon it used:\n{out}"
    );
    let call = as_nobody(&ws, &["call", "--", "echo", "from-a-group-member"]);
    assert!(call.status.success(), "{call:?}");
    assert_eq!(
        String::from_utf8_lossy(&call.stdout),
        "from-a-group-member\n"
    );
    drop(d);
    let _ = std::fs::remove_file(SYSTEM_SOCKET);
}

#[test]
fn call_profile_runs_under_a_profile_wider_than_the_default_and_tasks_shows_it() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Python3]) {
        return;
    }
    let d = Daemon::start();
    // `python` widens the default profile (its toolchain's paths): before, a call could
    // only narrow its session's profile, so this was refused.
    let out = d.cli(&[
        "call",
        "--profile",
        "python",
        "--",
        "python3",
        "-c",
        "print(6 * 7)",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    // The directory's default session is untouched by it.
    let plain = d.cli(&["call", "--", "echo", "plain"]);
    assert!(plain.status.success(), "{plain:?}");
    let tasks = String::from_utf8_lossy(&d.cli(&["tasks"]).stdout).into_owned();
    let line = |needle: &str| {
        tasks
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no task {needle}:\n{tasks}"))
            .to_owned()
    };
    assert!(line("print(6 * 7)").contains(" python "), "{tasks}");
    assert!(line("echo plain").contains(" workspace-write "), "{tasks}");
    assert!(tasks.lines().next().unwrap().contains("PROFILE"), "{tasks}");
}

#[test]
fn an_unprivileged_exec_refused_for_cgroups_is_told_how_to_delegate_one() {
    if sidejob_tests::skip_without(&[
        sidejob_tests::Need::Root,
        sidejob_tests::Need::UserNamespaces,
    ]) {
        return;
    }
    let ws = sidejob_tests::TempDir::new("exec-ci");
    std::os::unix::fs::chown(ws.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    let out = as_nobody(ws.path(), &["exec", "--profile", "ci", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("cgroup_memory") && err.contains("systemd-run --user --scope -p Delegate=yes"),
        "the refusal names no fix:\n{err}"
    );
}

#[test]
fn a_run_keeps_the_callers_supplementary_groups() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Root]) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    // A project shared through a group: root's directory, group-writable for group 4242,
    // which uid 65534 is a member of (as `SO_PEERGROUPS` says at connect).
    const TEAM: u32 = 4242;
    let d = Daemon::start();
    d.let_everyone_connect();
    let ws = d.root.path().join("team-project");
    std::fs::create_dir_all(&ws).unwrap();
    std::os::unix::fs::chown(&ws, Some(0), Some(TEAM)).unwrap();
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o2770)).unwrap();
    let stream =
        sidejob_tests::connect_with_groups(&d.socket, NOBODY, NOBODY, &[NOBODY, TEAM]).unwrap();
    let mut c = sidejob_tests::Client::from_stream(stream);
    let s = c.open_session_in(&ws);
    let r = c.bash(
        &s,
        "id -G; echo shared > written-by-the-team && echo wrote",
        serde_json::json!({}),
    );
    assert_eq!(
        r["exit_code"], 0,
        "the member could not write its group's workspace: {r}"
    );
    let out = r["output"].as_str().unwrap();
    assert!(out.split_whitespace().any(|g| g == "4242"), "{out}");
    let made = ws.join("written-by-the-team");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "shared\n");
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&made).unwrap()),
        NOBODY
    );
    // Control: the same user without the group cannot write there.
    let mut outsider = d.nobody();
    let s = outsider.open_session_in(&ws);
    let r = outsider.bash(&s, "echo x > by-an-outsider", serde_json::json!({}));
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(!ws.join("by-an-outsider").exists());
}
