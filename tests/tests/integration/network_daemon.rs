//! Network allow-lists through the real daemon: one proxy for every run, each run's decisions
//! its own, refusals on `task.get`, and the proxy served again for runs re-attached after a
//! restart — or closed while there is no daemon, never open.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::net::HttpServer;
use sidejob_tests::{skip_without, Need};
use sidejob_tests::{wait_until, Client, Daemon, TempDir};

/// A daemon whose profile directory holds `profiles` (`name`, `[network]` table), each
/// extending workspace-write.
fn daemon_with(profiles: &[(&str, String)]) -> Option<(Daemon, TempDir)> {
    if skip_without(&[Need::Root]) {
        return None;
    }
    let dir = TempDir::new("profiles");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, network) in profiles {
        std::fs::write(
            dir.path().join(format!("{name}.toml")),
            format!("extends = \"workspace-write\"\n[network]\n{network}\n"),
        )
        .unwrap();
    }
    let d = Daemon::start_with_config(&format!("profiles_dir = \"{}\"\n", dir.path().display()));
    Some((d, dir))
}

fn open(c: &mut Client, d: &Daemon, profile: &str) -> String {
    c.ok(
        "session.open",
        json!({"workspace": d.workspace, "profile": profile}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn result_json(task: &Value) -> Value {
    let text = std::fs::read_to_string(task["result_path"].as_str().unwrap()).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn network_hosts(result: &Value) -> Vec<String> {
    result["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["kind"] == "network")
        .map(|v| format!("{}:{}", v["host"].as_str().unwrap(), v["port"]))
        .collect()
}

fn models(port: u16, extra: &str) -> String {
    format!("allow = [\"models.test\", \"127.0.0.1:{port}\"{extra}]\nhosts = {{ \"models.test\" = \"127.0.0.1\", \"a.test\" = \"127.0.0.1\", \"b.test\" = \"127.0.0.1\" }}")
}

#[test]
fn a_daemon_run_reaches_allowed_names_and_its_task_shows_what_was_refused() {
    let srv = HttpServer::start();
    let port = srv.port;
    let Some((d, _p)) = daemon_with(&[("net", models(port, ""))]) else {
        return;
    };
    let mut c = d.client();
    let s = open(&mut c, &d, "net");
    let cmd = format!(
        "curl -sS -m 10 http://models.test:{port}/fg; curl -sS -m 10 http://a.test:{port}/no"
    );
    // Foreground.
    let r = c.bash(&s, &cmd, json!({"yield_after_ms": 60_000}));
    assert_eq!(r["status"], "completed", "{r}");
    let out = r["output"].as_str().unwrap();
    assert!(
        out.contains(&format!("hello /fg via models.test:{port}")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "sidejob: a.test:{port}: not on the profile's network.allow list"
        )),
        "{out}"
    );
    let task = c.task(r["task_id"].as_str().unwrap());
    assert_eq!(
        task["violations"],
        format!("network refused: a.test:{port} (not_allowed)"),
        "{task}"
    );
    assert_eq!(
        network_hosts(&result_json(&task)),
        vec![format!("a.test:{port}")]
    );
    // Background: the same, delivered later.
    let bg = c.bash(&s, &cmd.replace("/fg", "/bg"), json!({"background": true}));
    let t = c.wait_settled(bg["task_id"].as_str().unwrap());
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(
        t["violations"],
        format!("network refused: a.test:{port} (not_allowed)")
    );
    assert!(srv
        .seen()
        .contains(&format!("GET /bg host=models.test:{port}")));
    // `sidejob call` names the refused host once on stderr, with the profile key that
    // would allow it (the command's own error alone says only that it failed).
    let cli = d.cli(&[
        "call",
        "--profile",
        "net",
        "--",
        "curl",
        "-sS",
        "-m",
        "10",
        &format!("http://a.test:{port}/cli"),
    ]);
    let err = String::from_utf8_lossy(&cli.stderr);
    let named = format!("sidejob: network refused: a.test:{port} (not_allowed)");
    assert_eq!(err.matches(&named).count(), 1, "{err}");
    assert!(err.contains("[network] allow"), "{err}");
    // Control: a run without refusals has no violations field.
    let clean = c.bash(
        &s,
        &format!("curl -sS -m 10 http://models.test:{port}/x"),
        json!({}),
    );
    assert!(c.task(clean["task_id"].as_str().unwrap())["violations"].is_null());
}

#[test]
fn each_run_keeps_its_own_decisions() {
    let srv = HttpServer::start();
    let port = srv.port;
    let Some((d, _p)) = daemon_with(&[
        ("only-a", models(port, ", \"a.test\"")),
        ("only-b", models(port, ", \"b.test\"")),
    ]) else {
        return;
    };
    let mut c = d.client();
    let sa = open(&mut c, &d, "only-a");
    let sb = open(&mut c, &d, "only-b");
    // Both runs are live at once (each waits for the other's go file), so one proxy serves
    // both with their own policies.
    let go = d.workspace.join("go");
    let cmd = |mine: &str, theirs: &str| {
        format!(
            "touch {ws}/ready-{mine}; while [ ! -e {go} ]; do sleep 0.02; done; curl -sS -m 10 http://{mine}:{port}/{mine}; curl -sS -m 10 http://{theirs}:{port}/{theirs}",
            ws = d.workspace.display(),
            go = go.display()
        )
    };
    let ta = c.bash(&sa, &cmd("a.test", "b.test"), json!({"background": true}))["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let tb = c.bash(&sb, &cmd("b.test", "a.test"), json!({"background": true}))["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(wait_until(Duration::from_secs(30), || {
        d.workspace.join("ready-a.test").exists() && d.workspace.join("ready-b.test").exists()
    }));
    std::fs::write(&go, "").unwrap();
    let a = c.wait_settled(&ta);
    let b = c.wait_settled(&tb);
    assert!(c.output(&ta).contains("hello /a.test"), "{}", c.output(&ta));
    assert!(c.output(&tb).contains("hello /b.test"), "{}", c.output(&tb));
    assert_eq!(
        a["violations"],
        format!("network refused: b.test:{port} (not_allowed)")
    );
    assert_eq!(
        b["violations"],
        format!("network refused: a.test:{port} (not_allowed)")
    );
}

/// A background run that waits for `go-<n>` files in the workspace, curling `name` after
/// each, and writes what curl said to `said-<n>`.
fn stepwise(d: &Daemon, c: &mut Client, s: &str, port: u16, steps: u32) -> String {
    let ws = d.workspace.display();
    let mut cmd = String::new();
    for n in 1..=steps {
        cmd.push_str(&format!(
            "while [ ! -e {ws}/go-{n} ]; do sleep 0.02; done; curl -sS -m 10 http://models.test:{port}/step{n} > {ws}/said-{n}.tmp 2>&1; echo \"exit $?\" >> {ws}/said-{n}.tmp; mv {ws}/said-{n}.tmp {ws}/said-{n}; "
        ));
    }
    c.bash(s, &cmd, json!({"background": true}))["task_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn step(ws: &Path, n: u32) -> String {
    std::fs::write(ws.join(format!("go-{n}")), "").unwrap();
    let said = ws.join(format!("said-{n}"));
    assert!(
        wait_until(Duration::from_secs(30), || said.exists()),
        "step {n} did not finish"
    );
    std::fs::read_to_string(said).unwrap()
}

#[test]
fn a_reattached_run_is_served_again_after_a_restart() {
    let srv = HttpServer::start();
    let port = srv.port;
    let Some((mut d, _p)) = daemon_with(&[("net", models(port, ""))]) else {
        return;
    };
    let mut c = d.client();
    let s = open(&mut c, &d, "net");
    let t = stepwise(&d, &mut c, &s, port, 2);
    // Control: before the restart, the proxy serves.
    let said = step(&d.workspace, 1);
    assert!(said.contains("hello /step1"), "{said}");
    d.restart();
    let mut c = d.client();
    // The socket accepts before recovery is over; a reply means it is.
    c.ok("session.list", json!({}));
    let said = step(&d.workspace, 2);
    assert!(said.contains("hello /step2"), "{said}\n{}", d.log());
    assert!(d
        .log()
        .contains("egress proxy served again after the restart"));
    let task = c.wait_settled(&t);
    assert_eq!(task["state"], "succeeded", "{task}");
}

#[test]
fn while_the_daemon_is_down_a_run_has_no_way_out() {
    let srv = HttpServer::start();
    let port = srv.port;
    let Some((mut d, _p)) = daemon_with(&[("net", models(port, ""))]) else {
        return;
    };
    let mut c = d.client();
    let s = open(&mut c, &d, "net");
    let t = stepwise(&d, &mut c, &s, port, 2);
    d.kill9();
    let said = step(&d.workspace, 1);
    assert!(!said.contains("hello"), "{said}");
    assert!(!said.ends_with("exit 0\n"), "{said}");
    assert!(
        !srv.seen().iter().any(|l| l.contains("/step1")),
        "{:?}",
        srv.seen()
    );
    // Control: served again once the daemon is back.
    d.launch();
    let mut c = d.client();
    c.ok("session.list", json!({}));
    let said = step(&d.workspace, 2);
    assert!(said.contains("hello /step2"), "{said}");
    c.wait_settled(&t);
}

#[test]
fn a_call_may_narrow_the_sessions_allow_list_but_not_widen_it() {
    let srv = HttpServer::start();
    let port = srv.port;
    let Some((d, _p)) = daemon_with(&[
        ("session", models(port, ", \"a.test\"")),
        ("narrower", models(port, "")),
        ("wider", models(port, ", \"a.test\", \"b.test\"")),
    ]) else {
        return;
    };
    let mut c = d.client();
    let s = open(&mut c, &d, "session");
    let ok = c.bash(
        &s,
        &format!("curl -sS -m 10 http://a.test:{port}/"),
        json!({"profile": "narrower"}),
    );
    assert_eq!(ok["status"], "completed", "{ok}");
    assert!(ok["output"]
        .as_str()
        .unwrap()
        .contains("not on the profile's network.allow list"));
    let (code, kind) = c.err(
        "tool.call",
        json!({"session_id": s, "tool": "bash", "args": {"command": "true"}, "profile": "wider"}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    // Nor may a call take the host's whole network.
    let (code, _) = c.err(
        "tool.call",
        json!({"session_id": s, "tool": "bash", "args": {"command": "true"}, "profile": "network"}),
    );
    assert_eq!(code, -32602);
}
