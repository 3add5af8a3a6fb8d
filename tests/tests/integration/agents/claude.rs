//! Claude Code (`claude -p`) with `sidejob mcp` from `--mcp-config`, and `sidejob hook claude`
//! as its `Stop`, `SessionStart` and `UserPromptSubmit` hooks.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use serde_json::json;
use sidejob_tests::agents::{client, isolated, say, spawn_logged, ModelServer};
use sidejob_tests::{sidejob_bin, Daemon};

use super::*;

struct Claude {
    bin: PathBuf,
    home: PathBuf,
    workspace: PathBuf,
    /// `--mcp-config` (with `--strict-mcp-config`); `None`: the workspace's own `.mcp.json`.
    mcp_config: Option<PathBuf>,
    settings: Option<PathBuf>,
    url: String,
    socket: PathBuf,
}

/// Which of Claude Code's hooks run `sidejob hook claude`.
#[derive(Clone, Copy, PartialEq)]
enum Hooks {
    None,
    /// `Stop`, `SessionStart` and `UserPromptSubmit`: what `sidejob integrate claude` installs.
    Sidejob,
    /// `SessionStart` and `UserPromptSubmit` only.
    Start,
}

impl Claude {
    /// `None` (the skip recorded) without Claude Code.
    fn new(d: &Daemon, server: &ModelServer, hooks: Hooks) -> Option<Claude> {
        let bin = client("claude")?;
        let home = d.root.path().join("claude-home");
        std::fs::create_dir_all(&home).expect("home");
        let sidejob = sidejob_bin();
        let mcp_config = home.join("mcp.json");
        std::fs::write(
            &mcp_config,
            json!({"mcpServers": {"sidejob": {
                "command": sidejob,
                "args": ["--socket", d.socket, "mcp"],
            }}})
            .to_string(),
        )
        .expect("mcp config");
        let hook = json!([{"hooks": [{"type": "command", "command": format!(
            "'{}' --socket '{}' hook claude",
            sidejob.display(),
            d.socket.display()
        )}]}]);
        let hooks = match hooks {
            Hooks::None => None,
            Hooks::Sidejob => {
                Some(json!({"Stop": hook, "SessionStart": hook, "UserPromptSubmit": hook}))
            }
            Hooks::Start => Some(json!({"SessionStart": hook, "UserPromptSubmit": hook})),
        };
        let settings = hooks.map(|h| {
            let s = home.join(format!(
                "settings-{}.json",
                h.as_object().map_or(0, |m| m.len())
            ));
            std::fs::write(&s, json!({ "hooks": h }).to_string()).expect("settings");
            s
        });
        Some(Claude {
            bin,
            home,
            workspace: d.workspace.clone(),
            mcp_config: Some(mcp_config),
            settings,
            url: server.url(),
            socket: d.socket.clone(),
        })
    }

    /// Claude Code configured by `sidejob integrate claude` in the workspace, nothing else
    /// (the daemon named by `SIDEJOB_SOCKET`, which hooks and servers inherit).
    fn integrated(d: &Daemon, server: &ModelServer) -> Option<Claude> {
        let mut c = Claude::new(d, server, Hooks::None)?;
        let ws = d.workspace.display().to_string();
        let o = d.cli(&["integrate", "claude", "--workspace", &ws]);
        assert!(
            o.status.success(),
            "sidejob integrate claude failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        c.mcp_config = None;
        Some(c)
    }
}

impl Agent for Claude {
    fn spawn(&self, prompt: &str, dir: &Path) -> Child {
        let mut cmd = Command::new(&self.bin);
        isolated(&mut cmd, &self.home);
        cmd.args(["-p", prompt, "--output-format", "json"])
            .args(["--allowedTools", "mcp__sidejob"])
            .env("SIDEJOB_SOCKET", &self.socket)
            .env("ANTHROPIC_BASE_URL", &self.url)
            .env("ANTHROPIC_API_KEY", "dummy")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            // The first request waits for the MCP servers, and offers their tools at once
            // (not behind tool search).
            .env("MCP_CONNECTION_NONBLOCKING", "false")
            .env("ENABLE_TOOL_SEARCH", "false")
            .current_dir(&self.workspace);
        if let Some(m) = &self.mcp_config {
            cmd.arg("--strict-mcp-config").arg("--mcp-config").arg(m);
        }
        if let Some(s) = &self.settings {
            cmd.arg("--settings").arg(s);
        }
        spawn_logged(&mut cmd, dir)
    }

    fn run_dir(&self) -> PathBuf {
        next_run_dir(&self.home.join("runs"))
    }
}

fn claude(steps: Vec<serde_json::Value>) -> Option<(Daemon, ModelServer, Claude)> {
    claude_with(steps, "", false, Hooks::None)
}

fn claude_with(
    steps: Vec<serde_json::Value>,
    config: &str,
    loop_steps: bool,
    hooks: Hooks,
) -> Option<(Daemon, ModelServer, Claude)> {
    let (d, server) = setup(config, steps, loop_steps);
    let c = Claude::new(&d, &server, hooks)?;
    Some((d, server, c))
}

#[test]
fn claude_inline_call_sends_the_model_its_output() {
    let Some((d, server, c)) = claude(inline_script()) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_inline(&server);
}

#[test]
fn claude_yielded_job_reaches_the_model_once_on_its_next_call() {
    let Some((d, server, c)) = claude(keeps_working_script()) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_keeps_working(&server);
}

#[test]
fn claude_job_wait_result_carries_the_job_once() {
    let Some((d, server, c)) = claude(job_wait_script()) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_job_wait(&server);
}

#[test]
fn claude_stop_hook_brings_back_the_job_a_turn_ended_on() {
    // Step 1 ends the turn on a running job: the Stop hook waits for it and blocks the stop
    // with its wake, which the model gets at step 2.
    let steps = ends_turn_script(vec![say("got it")]);
    let Some((d, server, c)) = claude_with(steps, "", false, Hooks::Sidejob) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_delivered_once_at(&server, 2);
}

#[test]
fn claude_session_start_hook_hands_the_next_run_the_job_the_last_one_ended_on() {
    // Run 1 (no hooks) ends its turn on a running job; run 2's hooks hand its completion to
    // the model with the first request (step 2), once though two hooks run.
    let steps = ends_turn_script(vec![say("got it")]);
    let Some((d, server, first)) = claude_with(steps, "", false, Hooks::None) else {
        return;
    };
    expect_ok(&first.run("start it"), &server, &d);
    d.client().wait_settled_quietly(&running_job(&server));
    let next = Claude::new(&d, &server, Hooks::Start).expect("claude");
    expect_ok(&next.run("go on"), &server, &d);
    check_delivered_once_at(&server, 2);
}

#[test]
fn claude_configured_by_sidejob_integrate_gets_the_job_its_turn_ended_on() {
    // What `sidejob integrate claude` writes, as written: the project's .mcp.json serves the
    // tools and its Stop hook brings the job back (step 2).
    let (d, server) = setup("", ends_turn_script(vec![say("got it")]), false);
    let Some(c) = Claude::integrated(&d, &server) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_delivered_once_at(&server, 2);
}

#[test]
fn claude_killed_mid_call_leaves_no_job_running() {
    let sleep = long_sleep();
    let Some((d, server, c)) = claude(abandoned_script(&sleep)) else {
        return;
    };
    let dir = c.run_dir();
    let child = c.spawn("run it", &dir);
    check_abandoned(&d, child, &sleep, &server.summary());
}

#[test]
fn claude_twenty_runs_in_one_workspace_all_get_their_tools() {
    let Some((d, server, c)) = claude_with(repeated_script(), FEW_SESSIONS, true, Hooks::None)
    else {
        return;
    };
    check_repeated_runs(&c, &server, &d, 20);
}
