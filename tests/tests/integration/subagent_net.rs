//! A real agent as `subagent`: installed under its user's home (not passed inline), run under
//! the shipped `agent` profile with the `[subagent]` grants — its configuration under
//! `{home}` and its model API host through the allow-list — while the jobs it starts get none
//! of that. A second agent that calls a host it may not reach is refused, and its task says so.

use std::path::PathBuf;

use serde_json::json;
use sidejob_tests::net::HttpServer;
use sidejob_tests::Daemon;
use sidejob_tests::{skip_without, Need};

/// The agent's directory under root's home, removed on drop.
struct Installed(PathBuf);

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn root_home() -> PathBuf {
    let out = std::process::Command::new("getent")
        .args(["passwd", "0"])
        .output()
        .expect("getent");
    PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(':')
            .nth(5)
            .unwrap_or("/root"),
    )
}

fn setup(srv: &HttpServer) -> Option<(Daemon, Installed)> {
    if skip_without(&[Need::Root, Need::Python3]) {
        return None;
    }
    let port = srv.port;
    let dir_name = format!(
        ".sidejob-test-agent-{}-{}",
        std::process::id(),
        sidejob_tests::unique_sleep().replace('.', "")
    );
    let dir = root_home().join(&dir_name);
    std::fs::create_dir_all(&dir).unwrap();
    let installed = Installed(dir.clone());
    std::fs::write(
        dir.join("agent.py"),
        include_str!("../../fixtures/home_agent.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("config-good.json"),
        format!("{{\"model_api\": \"http://models.test:{port}\"}}"),
    )
    .unwrap();
    std::fs::write(
        dir.join("config-stray.json"),
        format!("{{\"model_api\": \"http://evil.test:{port}\"}}"),
    )
    .unwrap();
    let d = Daemon::start_with_config(&format!(
        r#"[subagent]
command = ["python3", "{agent}"]
readable = ["{{home}}/{dir_name}"]
allow = ["models.test", "127.0.0.1:{port}"]
hosts = {{ "models.test" = "127.0.0.1", "evil.test" = "127.0.0.1" }}
env = {{ HOME = "{{home}}", AGENT_DIR_NAME = "{dir_name}" }}
"#,
        agent = dir.join("agent.py").display()
    ));
    Some((d, installed))
}

#[test]
fn an_agent_from_its_home_calls_its_model_api_and_starts_a_job_without_its_grants() {
    let srv = HttpServer::start();
    let Some((d, installed)) = setup(&srv) else {
        return;
    };
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "subagent", "args": {"prompt": "go", "agent": "good"}, "yield_after_ms": 60_000}),
    );
    assert_eq!(r["status"], "completed", "{r}\n{}", d.log());
    let out = r["output"].as_str().unwrap();
    assert_eq!(r["state"], "succeeded", "{out}");
    assert!(
        out.contains(&format!("config from {}", installed.0.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "model said: hello /v1/complete via models.test:{}",
            srv.port
        )),
        "{out}"
    );
    // The job ran in the child session, under the agent profile without the grants.
    assert!(out.contains("succeeded"), "{out}");
    assert!(out.contains("job: no agent config"), "{out}");
    assert!(out.contains("job: no network"), "{out}");
    let agent = c.task(r["task_id"].as_str().unwrap());
    assert_eq!(agent["profile"], "agent", "{agent}");
    assert!(agent["violations"].is_null(), "{agent}");
    assert_eq!(
        srv.seen(),
        vec![format!("GET /v1/complete host=models.test:{}", srv.port)]
    );
}

#[test]
fn an_agent_calling_a_host_it_may_not_reach_is_refused_and_its_task_says_so() {
    let srv = HttpServer::start();
    let Some((d, _installed)) = setup(&srv) else {
        return;
    };
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "subagent", "args": {"prompt": "go", "agent": "stray"}, "yield_after_ms": 60_000}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    let out = r["output"].as_str().unwrap();
    assert!(
        out.contains("model refused: 403 sidejob: evil.test:"),
        "{out}"
    );
    let task = c.task(r["task_id"].as_str().unwrap());
    assert_eq!(
        task["violations"],
        format!("network refused: evil.test:{} (not_allowed)", srv.port),
        "{task}"
    );
    assert!(srv.seen().is_empty(), "{:?}", srv.seen());
    // A caller under a narrower profile than `agent` keeps its own for the agent (read-only
    // here), with the grants: the model API is still reached.
    let ro = c.ok(
        "session.open",
        json!({"workspace": d.workspace, "profile": "read-only"}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = c.ok(
        "tool.call",
        json!({"session_id": ro, "tool": "subagent", "args": {"prompt": "go", "agent": "good"}, "yield_after_ms": 60_000}),
    );
    let task = c.task(r["task_id"].as_str().unwrap());
    assert_eq!(task["profile"], "read-only", "{task}");
    assert!(
        r["output"].as_str().unwrap().contains("model said: hello"),
        "{r}"
    );
}
