//! `sidejob mcp` under the official MCP Python SDK (pinned in tests/requirements.txt): the
//! scenarios are in tests/fixtures/mcp/client.py, each run against a real daemon.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sidejob_tests::{kill_processes_mentioning, sidejob_bin, skip_unless, Daemon};

use super::plugins::{built_plugin, daemon_with_plugin_dir, install};

/// A Python with the MCP SDK: $SIDEJOB_TEST_PYTHON, else the virtualenv `.ci/run` makes
/// (target/ci-venv), else python3 if it has `mcp`. In CI its absence is a failure.
pub(crate) fn python() -> Option<PathBuf> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        std::env::var_os("SIDEJOB_TEST_PYTHON").map(PathBuf::from),
        Some(workspace.join("target/ci-venv/bin/python")),
        Some(PathBuf::from("python3")),
    ];
    let found = candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .args(["-c", "import mcp, anyio"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("no Python with the MCP SDK: .ci/run installs tests/requirements.txt into target/ci-venv");
    }
    found
}

fn scenario(d: &Daemon, name: &str, extra: &[&str]) {
    scenario_with_env(d, name, extra, &[]);
}

/// Runs one scenario; false if it was skipped (no SDK here).
fn scenario_with_env(d: &Daemon, name: &str, extra: &[&str], env: &[(&str, &Path)]) -> bool {
    let Some(py) = python() else {
        skip_unless(
            false,
            "the MCP Python SDK is not installed (pip install -r tests/requirements.txt)",
        );
        return false;
    };
    let o = Command::new(py)
        .arg(client_script())
        .arg(name)
        .arg(sidejob_bin())
        .arg(&d.socket)
        .arg(&d.workspace)
        .args(extra)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .stdin(Stdio::null())
        .output()
        .expect("run the MCP client");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.lines().last() == Some("ok"),
        "scenario {name} failed ({:?})\nstdout:\n{out}\nstderr:\n{}\ndaemon log:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr),
        d.log()
    );
    true
}

fn client_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/mcp/client.py")
}

#[test]
fn mcp_sdk_negotiates_lists_annotated_tools_and_returns_structured_results() {
    scenario(&Daemon::start(), "basics", &[]);
}

#[test]
fn mcp_sdk_requests_are_served_concurrently() {
    scenario(&Daemon::start(), "concurrency", &[]);
}

#[test]
fn mcp_sdk_cancelled_request_cancels_its_task() {
    scenario(&Daemon::start(), "cancel", &[]);
}

#[test]
fn mcp_sdk_background_completion_is_a_notification_and_separate_content() {
    scenario(&Daemon::start(), "completions", &[]);
}

#[test]
fn mcp_sdk_new_session_keeps_a_connection_to_itself() {
    scenario(&Daemon::start(), "private_sessions", &[]);
}

#[test]
fn mcp_sdk_session_flag_shares_a_session() {
    scenario(&Daemon::start(), "shared_session", &["shared-by-flag"]);
}

#[test]
fn mcp_sdk_initialize_without_a_daemon_says_how_to_start_one() {
    let mut d = Daemon::start();
    d.terminate();
    scenario(&d, "no_daemon", &[]);
}

#[test]
fn mcp_sdk_plugin_reload_sends_tools_list_changed() {
    let Some(py) = python() else {
        skip_unless(
            false,
            "the MCP Python SDK is not installed (pip install -r tests/requirements.txt)",
        );
        return;
    };
    let (d, dir) = daemon_with_plugin_dir("");
    let mut child = Command::new(py)
        .arg(client_script())
        .arg("list_changed")
        .arg(sidejob_bin())
        .arg(&d.socket)
        .arg(&d.workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the MCP client");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "ready", "{line}");
    install(
        &built_plugin("sidejob_testplugin_greet_v1"),
        dir.path(),
        "greet.so",
        0o644,
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read");
    let status = child.wait().expect("wait");
    assert!(
        status.success() && rest.trim().ends_with("ok"),
        "{status:?}: {rest}\ndaemon log:\n{}",
        d.log()
    );
}

#[test]
fn mcp_sdk_start_daemon_starts_one_when_none_listens() {
    // A daemon's directories, but no daemon: `sidejob mcp --start-daemon` starts it.
    let mut d = Daemon::start();
    d.terminate();
    let state_dir = d.root.path().join("started-state");
    if !scenario_with_env(
        &d,
        "start_daemon",
        &[],
        &[("SIDEJOB_STATE_DIR", state_dir.as_path())],
    ) {
        return;
    }
    // It went on running on its own, with the state directory it was given.
    let started =
        sidejob_tests::Client::connect(&d.socket).ok("daemon.status", serde_json::json!({}));
    assert_eq!(
        started["state_dir"],
        state_dir.display().to_string(),
        "{started}"
    );
    kill_processes_mentioning(&d.socket.display().to_string());
}
