//! opencode (`opencode run`) with a provider on the scripted model (Chat Completions through
//! `@ai-sdk/openai-compatible`), `sidejob mcp` as its `"mcp"` server, and the plugin
//! `integrations/opencode/sidejob.js` in the workspace's `.opencode/plugin/`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use serde_json::json;
use sidejob_tests::agents::{call, client, isolated, say, spawn_logged, ModelServer};
use sidejob_tests::{sidejob_bin, Daemon};

use super::*;

struct Opencode {
    bin: PathBuf,
    home: PathBuf,
    workspace: PathBuf,
    socket: PathBuf,
}

/// Whether the sidejob plugin is installed in the workspace.
#[derive(Clone, Copy, PartialEq)]
enum Plugin {
    None,
    Sidejob,
}

impl Opencode {
    /// `None` (the skip recorded) without opencode.
    fn new(d: &Daemon, server: &ModelServer, plugin: Plugin) -> Option<Opencode> {
        let bin = client("opencode")?;
        let home = d.root.path().join("opencode-home");
        std::fs::create_dir_all(&home).expect("home");
        let config = json!({
            "$schema": "https://opencode.ai/config.json",
            "model": "scripted/scripted",
            "provider": {"scripted": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "scripted",
                "options": {"baseURL": format!("{}/v1", server.url()), "apiKey": "dummy"},
                "models": {"scripted": {"name": "scripted", "tool_call": true}},
            }},
            "mcp": {"sidejob": {
                "type": "local",
                "command": [sidejob_bin(), "--socket", d.socket, "mcp"],
                "enabled": true,
            }},
        });
        std::fs::write(d.workspace.join("opencode.json"), config.to_string()).expect("config");
        if plugin == Plugin::Sidejob {
            let dir = d.workspace.join(".opencode/plugin");
            std::fs::create_dir_all(&dir).expect("plugin dir");
            std::fs::copy(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../integrations/opencode/sidejob.js"),
                dir.join("sidejob.js"),
            )
            .expect("install the plugin");
        }
        Some(Opencode {
            bin,
            home,
            workspace: d.workspace.clone(),
            socket: d.socket.clone(),
        })
    }
}

impl Opencode {
    /// `opencode <args>` in the workspace with the test's environment.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        isolated(&mut cmd, &self.home);
        cmd.args(args)
            .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
            .env("OPENCODE_DISABLE_SHARE", "1")
            .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
            // What the plugin runs `sidejob hook ...` with.
            .env("SIDEJOB_BIN", sidejob_bin())
            .env("SIDEJOB_SOCKET", &self.socket)
            .current_dir(&self.workspace);
        cmd
    }
}

impl Agent for Opencode {
    fn spawn(&self, prompt: &str, dir: &Path) -> Child {
        spawn_logged(&mut self.command(&["run", prompt]), dir)
    }

    fn run_dir(&self) -> PathBuf {
        next_run_dir(&self.home.join("runs"))
    }
}

fn opencode(
    steps: Vec<serde_json::Value>,
    config: &str,
    loop_steps: bool,
    plugin: Plugin,
) -> Option<(Daemon, ModelServer, Opencode)> {
    let (d, server) = setup(config, steps, loop_steps);
    let c = Opencode::new(&d, &server, plugin)?;
    Some((d, server, c))
}

#[test]
fn opencode_inline_call_sends_the_model_its_output() {
    let Some((d, server, c)) = opencode(inline_script(), "", false, Plugin::None) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_inline(&server);
}

#[test]
fn opencode_yielded_job_reaches_the_model_once_on_its_next_call() {
    let Some((d, server, c)) = opencode(keeps_working_script(), "", false, Plugin::None) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_keeps_working(&server);
}

#[test]
fn opencode_job_wait_result_carries_the_job_once() {
    let Some((d, server, c)) = opencode(job_wait_script(), "", false, Plugin::None) else {
        return;
    };
    expect_ok(&c.run("run it"), &server, &d);
    check_job_wait(&server);
}

#[test]
fn opencode_plugin_hands_the_next_run_the_job_the_last_one_ended_on() {
    // Run 1 ends its turn on a running job (steps 0-1) and `opencode run` exits; the plugin
    // adds the job's completion to run 2's first message, so the model has it at step 2,
    // before any call of its own (the call's result must not repeat it).
    let after = vec![call("bash", json!({"command": "echo next"})), say("done")];
    let Some((d, server, c)) = opencode(ends_turn_script(after), "", false, Plugin::Sidejob) else {
        return;
    };
    expect_ok(&c.run("start it"), &server, &d);
    d.client().wait_settled_quietly(&running_job(&server));
    expect_ok(&c.run("go on"), &server, &d);
    check_delivered_once_at(&server, 2);
}

#[test]
fn opencode_killed_mid_call_leaves_no_job_running() {
    let sleep = long_sleep();
    let Some((d, server, c)) = opencode(abandoned_script(&sleep), "", false, Plugin::None) else {
        return;
    };
    let dir = c.run_dir();
    let child = c.spawn("run it", &dir);
    check_abandoned(&d, child, &sleep, &server.summary());
}

/// opencode takes seconds of CPU to start (the others well under one), so fewer runs: still
/// more than the four sessions the daemon allows.
#[test]
fn opencode_six_runs_in_one_workspace_all_get_their_tools() {
    let Some((d, server, c)) = opencode(repeated_script(), FEW_SESSIONS, true, Plugin::None) else {
        return;
    };
    check_repeated_runs(&c, &server, &d, 6);
}

/// One HTTP request to `opencode serve` on 127.0.0.1:`port`; the response body.
fn http(port: u16, method: &str, path: &str, body: &serde_json::Value) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to opencode");
    s.set_read_timeout(Some(RUN_LIMIT)).expect("timeout");
    let body = body.to_string();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or(out)
}

#[test]
fn opencode_plugin_prompts_an_idle_served_session_with_the_job_its_turn_ended_on() {
    // Under `opencode serve` the process outlives the turn: when the session goes idle on a
    // running job, the plugin waits for it and prompts the session with its completion (the
    // model has it at step 2, once).
    let steps = ends_turn_script(vec![say("got it")]);
    let Some((d, server, c)) = opencode(steps, "", false, Plugin::Sidejob) else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dir = c.run_dir();
    let port_arg = port.to_string();
    let serve = sidejob_tests::agents::Served(spawn_logged(
        &mut c.command(&["serve", "--port", &port_arg]),
        &dir,
    ));
    let listening = wait_until(RUN_LIMIT, || {
        std::fs::read_to_string(dir.join("stdout")).is_ok_and(|o| o.contains("listening"))
    });
    assert!(listening, "opencode serve never listened");
    let session: serde_json::Value =
        serde_json::from_str(&http(port, "POST", "/session", &json!({}))).expect("a session");
    let id = session["id"].as_str().expect("session id").to_owned();
    http(
        port,
        "POST",
        &format!("/session/{id}/message"),
        &json!({"parts": [{"type": "text", "text": "start it"}]}),
    );
    let prompted = wait_until(RUN_LIMIT, || server.turns().len() >= 3);
    drop(serve);
    assert!(
        prompted,
        "the plugin never prompted the idle session:\n{}\ndaemon log (tail):\n{}",
        server.summary(),
        tail(&d.log(), 20)
    );
    check_delivered_once_at(&server, 2);
}
