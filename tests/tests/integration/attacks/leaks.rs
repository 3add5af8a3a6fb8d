//! Class 6 of issue 8: the smaller leaks. `sidejob exec` never hands the caller's terminal to
//! the command (stdin is /dev/null, or a pipe with `--stdin`), and the procfs entries that
//! container runtimes mask read as empty inside a run.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::json;
use sidejob_tests::{sidejob_bin, Daemon, TempDir};

use sidejob_tests::{skip_without, Need};

/// Runs argv on a fresh pseudo-terminal (as an interactive shell would have it: the
/// terminal is stdin, stdout and stderr) and returns what appeared on the terminal.
fn on_a_terminal(argv: &[&str]) -> String {
    const PTY: &str = r#"
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
out = b""
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace"))
"#;
    let o = Command::new("python3")
        .args(["-c", PTY])
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .expect("python3 pty");
    String::from_utf8_lossy(&o.stdout).replace('\r', "")
}

/// Which of the command's descriptors 0, 1 and 2 are a terminal.
const WHICH_TTY: &str =
    "for f in 0 1 2; do if test -t $f; then echo fd$f=tty; else echo fd$f=notty; fi; done";

#[test]
fn attack_exec_never_hands_the_terminal_to_the_command() {
    if skip_without(&[Need::Root]) || skip_without(&[Need::Python3]) {
        return;
    }
    let ws = TempDir::new("tty-ws");
    let bin = sidejob_bin().display().to_string();
    let ws_path = ws.path().display().to_string();
    // Positive control: on this pseudo-terminal a plain command sees a terminal.
    let control = on_a_terminal(&["sh", "-c", WHICH_TTY]);
    assert!(control.contains("fd0=tty"), "control: {control:?}");

    let seen = on_a_terminal(&[
        &bin,
        "exec",
        "--workspace",
        &ws_path,
        "--",
        "sh",
        "-c",
        WHICH_TTY,
    ]);
    for fd in ["fd0", "fd1", "fd2"] {
        assert!(
            seen.contains(&format!("{fd}=notty")),
            "sidejob exec gave the command the terminal ({fd}): {seen:?}"
        );
    }
    // With --stdin the command reads the caller's input, through a pipe, never the terminal.
    let seen = on_a_terminal(&[
        &bin,
        "exec",
        "--stdin",
        "--workspace",
        &ws_path,
        "--",
        "sh",
        "-c",
        WHICH_TTY,
    ]);
    assert!(seen.contains("fd0=notty"), "with --stdin: {seen:?}");

    let mut child = Command::new(sidejob_bin())
        .args(["exec", "--stdin", "--workspace", &ws_path, "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sidejob exec --stdin");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"piped data\n")
        .expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "piped data\n", "{o:?}");
}

/// `/proc/keys` (the keyrings the reader may view: root's, for a root run) and
/// `/proc/timer_list` (every process's timers) read empty in a run.
#[test]
fn attack_proc_keys_and_timer_list_read_empty_inside_a_run() {
    if skip_without(&[Need::Root]) {
        return;
    }
    const READ: &str = "for f in keys timer_list sched_debug; do printf '%s=' $f; cat /proc/$f 2>/dev/null | wc -c; done";
    // Positive control: on the host they are not empty.
    let host = |f: &str| std::fs::read(format!("/proc/{f}")).map_or(0, |b| b.len());
    let mut entries = vec!["timer_list"];
    if host("keys") > 0 {
        entries.push("keys");
    } else {
        eprintln!("NOTE: /proc/keys is empty on this host; checking timer_list only");
    }
    assert!(
        host("timer_list") > 0,
        "control: /proc/timer_list is empty on the host"
    );

    let ws = TempDir::new("proc-ws");
    let o = Command::new(sidejob_bin())
        .arg("exec")
        .arg("--workspace")
        .arg(ws.path())
        .args(["--", "sh", "-c", READ])
        .stdin(Stdio::null())
        .output()
        .expect("sidejob exec");
    let by_exec = String::from_utf8_lossy(&o.stdout).into_owned();

    let d = Daemon::start();
    let mut c = d.client();
    let s = c.open_session_in(ws.path());
    let r = c.bash(&s, READ, json!({}));
    let by_daemon = r["output"].as_str().unwrap_or("").to_owned();

    for (how, out) in [("sidejob exec", &by_exec), ("a root session", &by_daemon)] {
        for f in &entries {
            assert!(
                out.lines().any(|l| l == format!("{f}=0")),
                "/proc/{f} is not empty in {how}: {out:?}"
            );
        }
    }
}
