//! The MCP Inspector's CLI mode (`mcp-inspector --cli`, npm `@modelcontextprotocol/inspector`):
//! one connection per invocation, so each call is a new `sidejob mcp` run in the workspace.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};
use sidejob_tests::agents::{client, finish, isolated, spawn_logged};
use sidejob_tests::{sidejob_bin, unique_sleep, Daemon};

use super::*;

struct Inspector {
    bin: PathBuf,
    home: PathBuf,
    workspace: PathBuf,
    socket: PathBuf,
}

impl Inspector {
    fn new(d: &Daemon) -> Option<Inspector> {
        Some(Inspector {
            bin: client("mcp-inspector")?,
            home: d.root.path().join("inspector-home"),
            workspace: d.workspace.clone(),
            socket: d.socket.clone(),
        })
    }

    fn command(&self, method_args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        isolated(&mut cmd, &self.home);
        cmd.arg("--cli")
            .arg(sidejob_bin())
            .arg("--socket")
            .arg(&self.socket)
            .arg("mcp")
            .args(method_args)
            .current_dir(&self.workspace);
        cmd
    }

    /// One invocation; its JSON answer.
    fn ask(&self, method_args: &[&str]) -> Value {
        let dir = next_run_dir(&self.home.join("runs"));
        let mut cmd = self.command(method_args);
        let ran = finish(spawn_logged(&mut cmd, &dir), &dir, RUN_LIMIT);
        assert!(
            ran.status.is_some_and(|s| s.success()),
            "mcp-inspector {method_args:?} failed: {}",
            ran.describe()
        );
        serde_json::from_str(&ran.stdout)
            .unwrap_or_else(|e| panic!("mcp-inspector printed no JSON ({e}): {}", ran.describe()))
    }

    fn bash(&self, command: &str, extra: &[&str]) -> Value {
        let arg = format!("command={command}");
        let mut args = vec![
            "--method",
            "tools/call",
            "--tool-name",
            "bash",
            "--tool-arg",
            &arg,
        ];
        args.extend_from_slice(extra);
        self.ask(&args)
    }
}

/// The completions a result carries (`structuredContent.background_completions`).
fn completions(result: &Value) -> Vec<Value> {
    result["structuredContent"]["background_completions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn inspector_lists_the_tools_and_runs_a_call() {
    let d = Daemon::start();
    let Some(i) = Inspector::new(&d) else {
        return;
    };
    let listed = i.ask(&["--method", "tools/list"]);
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    for n in ["bash", "job_list", "job_output", "job_wait", "job_stop"] {
        assert!(names.contains(&n), "{n} missing from {listed}");
    }
    let ran = i.bash("echo inline-$((6*7))", &[]);
    assert_eq!(ran["structuredContent"]["output"], "inline-42\n", "{ran}");
    assert_eq!(ran["isError"], false, "{ran}");
}

#[test]
fn inspector_next_connection_gets_the_job_the_last_left_once() {
    let d = Daemon::start();
    let Some(i) = Inspector::new(&d) else {
        return;
    };
    let started = i.bash(JOB, &["--tool-arg", "yield_after_ms=100"]);
    assert_eq!(
        started["structuredContent"]["status"], "running",
        "{started}"
    );
    let job = started["structuredContent"]["task_id"]
        .as_str()
        .expect("task_id")
        .to_owned();
    d.client().wait_settled_quietly(&job);
    let next = i.bash("echo next", &[]);
    let got = completions(&next);
    assert!(
        got.len() == 1
            && got[0]["task_id"] == job.as_str()
            && got[0]["text"].to_string().contains(JOB_MARKER),
        "the next connection's first result should carry the job: {next}"
    );
    let again = i.bash("echo again", &[]);
    assert!(completions(&again).is_empty(), "delivered twice: {again}");
}

#[test]
fn inspector_killed_mid_call_leaves_no_job_running() {
    let d = Daemon::start();
    let Some(i) = Inspector::new(&d) else {
        return;
    };
    let sleep = unique_sleep();
    let arg = format!("command=sleep {sleep}");
    let dir = next_run_dir(&i.home.join("runs"));
    let mut cmd = i.command(&[
        "--method",
        "tools/call",
        "--tool-name",
        "bash",
        "--tool-arg",
        &arg,
        "--tool-arg",
        "yield_after_ms=120000",
    ]);
    let child = spawn_logged(&mut cmd, &dir);
    check_abandoned(&d, child, &sleep, "(no model: the call is the inspector's)");
}

#[test]
fn inspector_twenty_connections_in_one_workspace_all_get_their_tools() {
    let d = Daemon::start_with_config(FEW_SESSIONS);
    let Some(i) = Inspector::new(&d) else {
        return;
    };
    for n in 0..20 {
        let ran = i.bash("echo run-$((6*7))", &[]);
        assert_eq!(
            ran["structuredContent"]["output"],
            json!("run-42\n"),
            "connection {n}: {ran}\ndaemon log (tail):\n{}",
            tail(&d.log(), 20)
        );
    }
}
