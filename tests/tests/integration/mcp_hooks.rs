//! `sidejob hook` and `sidejob integrate`: a completion reaches the model after its turn
//! ended, through the client's own hooks, exactly once (whichever of the hook and `sidejob
//! mcp` takes it first).

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{sidejob_bin, Daemon};

use super::mcp::{reports_of, Mcp};

/// `sidejob hook ARGS` in the daemon's workspace, with `input` on stdin.
fn hook(d: &Daemon, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(sidejob_bin())
        .arg("--socket")
        .arg(&d.socket)
        .arg("hook")
        .args(args)
        .current_dir(&d.workspace)
        .env_remove("CLAUDE_PROJECT_DIR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn claude_event(d: &Daemon, event: &str) -> String {
    json!({"session_id": "c1", "hook_event_name": event, "cwd": d.workspace, "stop_hook_active": false})
        .to_string()
}

fn started_in_background(m: &mut Mcp, command: &str) -> String {
    let r = m.call("bash", json!({"command": command, "background": true}));
    r["structuredContent"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn claudes_stop_hook_keeps_the_turn_until_a_running_job_finishes() {
    let d = Daemon::start();
    let mut m = Mcp::start(&d);
    m.init();
    let job = started_in_background(&mut m, "sleep 1; echo built-after-the-turn");
    // The model ends its turn on "running": Claude Code runs the Stop hook.
    let out = hook(&d, &["claude"], &claude_event(&d, "Stop"));
    assert!(out.status.success(), "{out:?}");
    let said: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(said["decision"], "block", "{said}");
    let reason = said["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("[automatic]")
            && reason.contains(&job)
            && reason.contains("built-after-the-turn"),
        "{reason}"
    );
    // Delivered once: neither the next Stop nor the next tool result repeats it.
    let again = hook(&d, &["claude"], &claude_event(&d, "Stop"));
    assert!(
        again.status.success() && again.stdout.is_empty(),
        "{again:?}"
    );
    let r = m.call("job_list", json!({}));
    assert!(reports_of(&r).is_empty(), "reported twice: {r}");
}

#[test]
fn claudes_stop_hook_lets_the_turn_end_when_nothing_runs() {
    let d = Daemon::start();
    let mut m = Mcp::start(&d);
    m.init();
    m.call("bash", json!({"command": "echo inline"}));
    let out = hook(&d, &["claude", "--wait", "30s"], &claude_event(&d, "Stop"));
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    // And with no daemon at all, the agent is never stopped by the hook.
    let gone = Daemon::prepare("");
    let out = hook(&gone, &["claude"], &claude_event(&gone, "Stop"));
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
}

#[test]
fn claudes_stop_hook_gives_up_waiting_after_its_limit() {
    let d = Daemon::start();
    let mut m = Mcp::start(&d);
    m.init();
    let job = started_in_background(&mut m, &format!("sleep {}", sidejob_tests::unique_sleep()));
    let started = std::time::Instant::now();
    let out = hook(&d, &["claude", "--wait", "1s"], &claude_event(&d, "Stop"));
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    d.client().ok("task.cancel", json!({ "task_id": job }));
}

#[test]
fn a_new_claude_session_is_told_what_finished_since_the_last() {
    let d = Daemon::start();
    let mut m = Mcp::start(&d);
    m.init();
    let job = started_in_background(&mut m, "echo done-while-away");
    drop(m);
    d.client().wait_settled_quietly(&job);
    let out = hook(&d, &["claude"], &claude_event(&d, "SessionStart"));
    let said: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(said["hookSpecificOutput"]["hookEventName"], "SessionStart");
    let context = said["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    assert!(
        context.contains(&job) && context.contains("done-while-away"),
        "{said}"
    );
    let again = hook(&d, &["claude"], &claude_event(&d, "UserPromptSubmit"));
    assert!(again.stdout.is_empty(), "handed over twice: {again:?}");
}

#[test]
fn hook_wait_prints_what_finished_as_json_once() {
    let d = Daemon::start();
    let mut m = Mcp::start(&d);
    m.init();
    let job = started_in_background(&mut m, "sleep 0.5; echo for-a-plugin");
    let out = hook(&d, &["wait", "--json"], "");
    let said: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(said["completions"][0]["task_id"], job.as_str(), "{said}");
    assert!(
        said["text"].as_str().unwrap().contains("for-a-plugin"),
        "{said}"
    );
    let again = hook(&d, &["unread", "--json"], "");
    let said: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(said["completions"], json!([]), "{said}");
}

#[test]
fn integrate_claude_adds_sidejob_and_keeps_the_projects_settings() {
    let d = Daemon::start();
    let ws = &d.workspace;
    std::fs::create_dir_all(ws.join(".claude")).unwrap();
    std::fs::write(
        ws.join(".claude/settings.json"),
        r#"{"model": "keep-me", "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "echo theirs"}]}]}}"#,
    )
    .unwrap();
    let printed = d.cli(&["integrate", "claude", "--print"]);
    assert!(printed.status.success(), "{printed:?}");
    assert!(!ws.join(".mcp.json").exists(), "--print wrote a file");
    for _ in 0..2 {
        let out = d.cli(&["integrate", "claude"]);
        assert!(out.status.success(), "{out:?}");
    }
    let mcp: Value = serde_json::from_slice(&std::fs::read(ws.join(".mcp.json")).unwrap()).unwrap();
    assert_eq!(
        mcp["mcpServers"]["sidejob"]["args"],
        json!(["mcp"]),
        "{mcp}"
    );
    let s: Value =
        serde_json::from_slice(&std::fs::read(ws.join(".claude/settings.json")).unwrap()).unwrap();
    assert_eq!(s["model"], "keep-me", "{s}");
    let stop = s["hooks"]["Stop"].as_array().unwrap();
    assert_eq!(stop.len(), 2, "theirs kept, ours once: {s}");
    assert!(stop[1]["hooks"][0]["command"]
        .as_str()
        .unwrap()
        .ends_with("hook claude"));
    assert_eq!(s["permissions"]["allow"], json!(["mcp__sidejob"]), "{s}");
}
