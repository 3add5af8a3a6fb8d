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
