//! Command-line behaviour that needs no daemon. (Daemon tests live in the workspace's
//! `tests/` harness; this file also makes `cargo test` build the `sidejob` binary they use.)

use std::process::Command;

fn sidejob() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sidejob"))
}

#[test]
fn help_teaches_the_commands() {
    let out = sidejob().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["serve", "call", "tasks", "logs", "wait", "cancel", "replay"] {
        assert!(text.contains(cmd), "--help does not mention {cmd}:\n{text}");
    }
    assert!(
        !text.contains("supervise"),
        "the internal supervise command must stay hidden"
    );
}

#[test]
fn client_without_a_daemon_says_where_it_looked() {
    let out = sidejob()
        .args(["--socket", "/nonexistent/sidejob.sock", "tasks"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no sidejob daemon is listening on /nonexistent/sidejob.sock")
            && err.contains("start one with `sidejob serve`"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn replay_requires_check() {
    let out = sidejob().arg("replay").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "clap usage error expected");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--check"));
}
