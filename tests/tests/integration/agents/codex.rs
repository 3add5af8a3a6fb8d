//! Codex (`codex exec`) with a model provider on the scripted model (`wire_api = "responses"`:
//! this Codex speaks no other) and `sidejob mcp` in `[mcp_servers.sidejob]`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use serde_json::json;
use sidejob_tests::agents::{call, client, isolated, say, spawn_logged, ModelServer};
use sidejob_tests::{sidejob_bin, Daemon};

use super::*;

struct Codex {
    bin: PathBuf,
    home: PathBuf,
    workspace: PathBuf,
}

impl Codex {
    /// `None` (the skip recorded) without Codex.
    fn new(d: &Daemon, server: &ModelServer) -> Option<Codex> {
        let bin = client("codex")?;
        let home = d.root.path().join("codex-home");
        let codex_home = home.join(".codex");
        std::fs::create_dir_all(&codex_home).expect("CODEX_HOME");
        // Without default_tools_approval_mode = "approve" every MCP call fails under
        // approval_policy = "never" ("MCP tool call requires approval").
        let config = format!(
            r#"model = "scripted"
model_provider = "scripted"
approval_policy = "never"

[model_providers.scripted]
name = "scripted"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"

[mcp_servers.sidejob]
command = {sidejob}
args = ["--socket", {socket}, "mcp"]
default_tools_approval_mode = "approve"
supports_parallel_tool_calls = true
tool_timeout_sec = 600
"#,
            url = server.url(),
            sidejob = json!(sidejob_bin()),
            socket = json!(d.socket),
        );
        std::fs::write(codex_home.join("config.toml"), config).expect("config.toml");
        Some(Codex {
            bin,
            home,
            workspace: d.workspace.clone(),
        })
    }
}

impl Agent for Codex {
    fn spawn(&self, prompt: &str, dir: &Path) -> Child {
        let mut cmd = Command::new(&self.bin);
        isolated(&mut cmd, &self.home);
        cmd.args(["exec", "--skip-git-repo-check", prompt])
            .env("CODEX_HOME", self.home.join(".codex"))
            .env("SCRIPTED_API_KEY", "dummy")
            .current_dir(&self.workspace);
        spawn_logged(&mut cmd, dir)
    }

    fn run_dir(&self) -> PathBuf {
        next_run_dir(&self.home.join("runs"))
    }
}

fn codex(
    steps: Vec<serde_json::Value>,
    config: &str,
    loop_steps: bool,
) -> Option<(Daemon, ModelServer, Codex)> {
    let (d, server) = setup(config, steps, loop_steps);
    let c = Codex::new(&d, &server)?;
    Some((d, server, c))
}

#[test]
fn codex_inline_call_sends_the_model_its_output() {
    let Some((d, server, c)) = codex(inline_script(), "", false) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_inline(&server);
}

#[test]
fn codex_yielded_job_reaches_the_model_once_on_its_next_call() {
    let Some((d, server, c)) = codex(keeps_working_script(), "", false) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_keeps_working(&server);
}

#[test]
fn codex_job_wait_result_carries_the_job_once() {
    let Some((d, server, c)) = codex(job_wait_script(), "", false) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_job_wait(&server);
}

#[test]
fn codex_next_exec_hears_of_the_job_the_last_one_ended_on() {
    // Run 1 ends its turn on a running job (steps 0-1) and `codex exec` exits; run 2, in the
    // same workspace, makes a call (step 2) whose result carries the job (seen at step 3).
    let after = vec![call("bash", json!({"command": "echo next"})), say("done")];
    let Some((d, server, c)) = codex(ends_turn_script(after), "", false) else {
        return;
    };
    expect_ok(&c.run("start it"), &server, &d);
    d.client().wait_settled_quietly(&running_job(&server));
    expect_ok(&c.run("go on"), &server, &d);
    check_delivered_once_at(&server, 3);
}

#[test]
fn codex_killed_mid_call_leaves_no_job_running() {
    let sleep = long_sleep();
    let Some((d, server, c)) = codex(abandoned_script(&sleep), "", false) else {
        return;
    };
    let dir = c.run_dir();
    let child = c.spawn("run it", &dir);
    check_abandoned(&d, child, &sleep, &server.summary());
}

#[test]
fn codex_twenty_runs_in_one_workspace_all_get_their_tools() {
    let Some((d, server, c)) = codex(repeated_script(), FEW_SESSIONS, true) else {
        return;
    };
    check_repeated_runs(&c, &server, &d, 20);
}
