//! Claude Code as the `subagent`, the way a user installs it: under their own home (an npm
//! prefix, `~/.local`), its configuration there too, for a uid-1000 caller of a root daemon.
//! The `[subagent]` grants let it run from there (`executable`), read and write its
//! configuration (`writable`) and reach its model (`allow`): the scripted model on 127.0.0.1
//! (`sidejob_tests::agents`). It starts a job through its bridge with its own Bash tool,
//! tries a second port (refused), and reports back to the caller.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use sidejob_tests::agents::{call, client, deliveries, items, say, ModelServer};
use sidejob_tests::host::User1000;
use sidejob_tests::net::HttpServer;
use sidejob_tests::{skip_unless, skip_without, Client, Daemon, Need};

/// The agent's install directory under the user's home, removed on drop.
struct Installed(PathBuf);

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

/// Installs the Claude Code package found at `bin` (`node_modules/.bin/claude`) the way
/// `npm install --prefix <dir>` lays it out, owned by the user: `<dir>/lib/node_modules/...`
/// and `<dir>/bin/claude`. A copy, not a link: the daemon's user (root) does not own it.
fn install_claude(bin: &Path, dir: &Path, uid: u32, gid: u32) {
    let real = bin.canonicalize().expect("claude's binary");
    // .../node_modules/@anthropic-ai/claude-code/bin/claude.exe
    let package = real.parent().and_then(Path::parent).expect("its package");
    let relative = real.strip_prefix(package).expect("inside its package");
    let modules = dir.join("lib/node_modules/@anthropic-ai");
    std::fs::create_dir_all(&modules).expect("prefix");
    run(Command::new("cp")
        .arg("-a")
        .arg("--reflink=auto")
        .arg(package)
        .arg(modules.join("claude-code")));
    std::fs::create_dir_all(dir.join("bin")).expect("bin");
    std::os::unix::fs::symlink(
        Path::new("../lib/node_modules/@anthropic-ai/claude-code").join(relative),
        dir.join("bin/claude"),
    )
    .expect("bin/claude");
    run(Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(dir));
}

/// The job's task id in what the model was sent (`job <id> <state>`, the bridge script's line).
fn job_id(turns: &[Value]) -> Option<String> {
    turns
        .iter()
        .flat_map(|t| items(&t["body"]))
        .find_map(|item| {
            let at = item.find("job ")? + 4;
            let id: String = item[at..].chars().take(26).collect();
            (id.len() == 26 && id.chars().all(|c| c.is_ascii_alphanumeric())).then_some(id)
        })
}

/// A directory of its own under uid 1000's home, owned by that user; `None` (the skip
/// printed) without root or without a home for uid 1000.
fn home_dir_of_1000(tag: &str) -> Option<(User1000, String, Installed)> {
    if skip_without(&[Need::Root]) {
        return None;
    }
    let user = User1000::take();
    if skip_unless(
        user.home.is_dir(),
        "uid 1000's home directory does not exist",
    ) {
        return None;
    }
    let name = format!(
        ".sidejob-test-{tag}-{}-{}",
        std::process::id(),
        sidejob_tests::unique_sleep().replace('.', "")
    );
    let dir = user.home.join(&name);
    std::fs::create_dir_all(&dir).expect("install dir");
    std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid)).expect("chown install dir");
    Some((user, name, Installed(dir)))
}

/// A subagent call by `uid`, in a workspace of its own: its client and the call's result.
fn call_subagent_as(d: &Daemon, uid: u32, gid: u32, timeout_ms: u64) -> (Client, Value) {
    d.let_everyone_connect();
    let ws = d.root.path().join("user-workspace");
    std::fs::create_dir_all(&ws).expect("workspace");
    std::os::unix::fs::chown(&ws, Some(uid), Some(gid)).expect("chown workspace");
    let mut c = d.client_as(uid, gid);
    let s = c.open_session_in(&ws);
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "subagent", "args": {"prompt": "start the job and report"}, "yield_after_ms": timeout_ms}),
    );
    (c, r)
}

#[test]
fn an_agent_in_the_users_home_runs_with_an_executable_grant_and_without_one_is_told_that_grant() {
    let Some((user, name, installed)) = home_dir_of_1000("agent") else {
        return;
    };
    let (uid, gid) = (user.uid, user.gid);
    let agent = installed.0.join("bin/my-agent");
    std::fs::create_dir_all(agent.parent().unwrap()).expect("bin");
    std::fs::write(
        &agent,
        "#!/bin/sh\necho \"my-agent ran as $(id -u): $AGENT_PROMPT\"\n",
    )
    .expect("agent");
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    run(Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(&installed.0));
    let command = format!("[subagent]\ncommand = [\"{}\"]\n", agent.display());
    // Without the grant the agent is outside the view, and the fix named is the grant (not
    // a profile's [paths] executable, which no one can set for the agent alone).
    let d = Daemon::start_with_config(&command);
    let (_, r) = call_subagent_as(&d, uid, gid, 60_000);
    let error = r["error"].as_str().unwrap_or_default();
    assert_eq!(r["state"], "failed", "{r}");
    assert!(
        error.contains("outside this profile's view")
            && error.contains("[subagent] executable")
            && !error.contains("[paths] executable"),
        "{r}"
    );
    drop(d);
    let d = Daemon::start_with_config(&format!(
        "{command}executable = [\"{{home}}/{name}/bin\"]\n"
    ));
    let (_, r) = call_subagent_as(&d, uid, gid, 60_000);
    assert_eq!(r["state"], "succeeded", "{r}\n{}", d.log());
    assert_eq!(
        r["output"].as_str().unwrap_or_default().trim(),
        format!("my-agent ran as {uid}: start the job and report"),
        "{r}"
    );
}

#[test]
fn an_executable_grant_through_a_symlink_the_user_planted_reaches_only_what_the_user_can_open() {
    // The user's home is theirs to arrange: the granted directory is a symlink to a
    // directory only root can enter, holding an "agent". The daemon resolves the grant as the
    // user, so the agent is not run from there.
    let Some((user, name, installed)) = home_dir_of_1000("planted") else {
        return;
    };
    let (uid, gid) = (user.uid, user.gid);
    let secret = sidejob_tests::TempDir::new("root-only-agent");
    let agent = secret.path().join("bin/my-agent");
    std::fs::create_dir_all(agent.parent().unwrap()).expect("bin");
    std::fs::write(&agent, "#!/bin/sh\necho root-only agent ran\n").expect("agent");
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    std::fs::set_permissions(
        secret.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let link = installed.0.join("tools");
    std::os::unix::fs::symlink(secret.path(), &link).expect("symlink");
    let _ = std::os::unix::fs::lchown(&link, Some(uid), Some(gid));
    let d = Daemon::start_with_config(&format!(
        "[subagent]\ncommand = [\"{}/bin/my-agent\"]\nexecutable = [\"{{home}}/{name}/tools\"]\n",
        link.display()
    ));
    let (_, r) = call_subagent_as(&d, uid, gid, 60_000);
    assert_eq!(r["state"], "failed", "{r}");
    assert!(
        !r["output"]
            .as_str()
            .unwrap_or_default()
            .contains("root-only agent ran"),
        "{r}"
    );
    let error = r["error"].as_str().unwrap_or_default().to_lowercase();
    assert!(error.contains("permission denied"), "{r}");
}

#[test]
fn a_subagent_profile_wider_than_the_default_stops_the_daemon_naming_the_grants() {
    let root = sidejob_tests::TempDir::new("wide-subagent");
    let config = root.path().join("config.toml");
    std::fs::write(
        &config,
        "[subagent]\ncommand = [\"my-agent\"]\nprofile = \"network\"\n",
    )
    .expect("config");
    let out = Command::new(sidejob_tests::sidejob_bin())
        .arg("serve")
        .arg("--socket")
        .arg(root.path().join("sidejob.sock"))
        .arg("--state-dir")
        .arg(root.path().join("state"))
        .arg("--config")
        .arg(&config)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("sidejob serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(
            "[subagent] profile = \"network\" cannot narrow default_profile = \"workspace-write\""
        ) && err.contains("executable")
            && err.contains("allow"),
        "{err}"
    );
    assert!(!root.path().join("sidejob.sock").exists());
}

#[test]
fn claude_code_from_the_users_home_is_the_subagent_reaches_only_its_model_and_reports_back() {
    if skip_without(&[Need::Python3]) {
        return;
    }
    let Some(claude) = client("claude") else {
        return;
    };
    let Some((user, name, installed)) = home_dir_of_1000("claude") else {
        return;
    };
    let (uid, gid) = (user.uid, user.gid);
    let dir = installed.0.clone();
    install_claude(&claude, &dir, uid, gid);
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agents/bridge_job.py"),
        dir.join("bridge_job.py"),
    )
    .expect("bridge_job.py");
    // A second port on the model's host that the agent may not reach: it must see nothing.
    let other = HttpServer::start();
    let model_dir = sidejob_tests::TempDir::new("claude-subagent-model");
    let bridge_job = format!(
        "python3 {0}/bridge_job.py 'echo job-$((6*7)) as-uid-$(id -u); test -e {0}/bin/claude || echo job-without-the-agent-install'",
        dir.display()
    );
    let second = format!(
        "curl -sS -m 10 -o /dev/null -w '%{{http_code}}' http://models.test:{}/second || true",
        other.port
    );
    let server = ModelServer::start_offering(
        model_dir.path(),
        vec![
            call(
                "Bash",
                json!({"command": bridge_job, "description": "start a job"}),
            ),
            call(
                "Bash",
                json!({"command": second, "description": "try another port"}),
            ),
            say("subagent report: the job printed its answer"),
        ],
        "Bash",
    );
    // Its configuration, under its home, names the model (nothing else does).
    let config = dir.join("config");
    std::fs::create_dir_all(&config).expect("config dir");
    std::fs::write(
        config.join("settings.json"),
        json!({"env": {"ANTHROPIC_BASE_URL": format!("http://models.test:{}", server.port)}})
            .to_string(),
    )
    .expect("settings.json");
    run(Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(&config));
    let d = Daemon::start_with_config(&format!(
        r#"[subagent]
command = ["{bin}", "-p", "--output-format", "text", "--allowedTools", "Bash"]
executable = ["{{home}}/{name}"]
writable = ["{{home}}/{name}/config"]
allow = ["models.test:{port}", "127.0.0.1:{port}"]
hosts = {{ "models.test" = "127.0.0.1" }}
env = {{ HOME = "{{home}}", CLAUDE_CONFIG_DIR = "{{home}}/{name}/config", ANTHROPIC_API_KEY = "dummy", DISABLE_AUTOUPDATER = "1", DISABLE_TELEMETRY = "1", DISABLE_ERROR_REPORTING = "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1" }}
"#,
        bin = dir.join("bin/claude").display(),
        port = server.port,
    ));
    let (mut c, r) = call_subagent_as(&d, uid, gid, 240_000);
    let turns = server.turns();
    let context = format!(
        "{r}\nrequests:\n{}\ndaemon log:\n{}",
        server.summary(),
        d.log()
    );
    assert_eq!(r["status"], "completed", "{context}");
    // What the caller was shown: the agent's report, after it ran to its end.
    let out = r["output"].as_str().unwrap_or_default();
    assert_eq!(r["state"], "succeeded", "{out}\n{context}");
    assert!(
        out.contains("subagent report: the job printed its answer"),
        "{out}\n{context}"
    );
    // The model was reached through the name its configuration gave and took every step;
    // the bridge job's output came back to it.
    assert_eq!(turns.len(), 3, "{context}");
    let got = deliveries(&turns, "job-42");
    assert!(
        got.first().is_some_and(|g| g.step == 1),
        "the job's output never reached the model: {got:#?}\n{context}"
    );
    assert!(
        !deliveries(&turns, &format!("job-42 as-uid-{uid}")).is_empty(),
        "the job did not run as the caller\n{context}"
    );
    // The job has none of the agent's grants: not even where the agent is installed.
    assert!(
        !deliveries(&turns, "job-without-the-agent-install").is_empty(),
        "the job saw the agent's install directory\n{context}"
    );
    // The job ran in the child session, as the user, started by the agent's task.
    let agent_task = r["task_id"].as_str().unwrap().to_owned();
    let job = job_id(&turns).unwrap_or_else(|| panic!("no job id sent to the model\n{context}"));
    let row = c.task(&job);
    assert_eq!(row["state"], "succeeded", "{row}");
    assert_eq!(row["parent_task_id"], agent_task.as_str(), "{row}");
    assert_eq!(
        row["session_id"],
        format!("sub-{}", agent_task.to_ascii_lowercase()),
        "{row}"
    );
    // The second port was refused by the proxy (403 to the agent) and nothing reached it.
    assert!(
        deliveries(&turns, "403").iter().any(|g| g.step == 2),
        "the agent was not told the second port was refused\n{context}"
    );
    assert!(other.seen().is_empty(), "{:?}", other.seen());
    let agent = c.task(&agent_task);
    assert_eq!(agent["profile"], "agent", "{agent}");
    assert!(
        agent["violations"]
            .as_str()
            .is_some_and(|v| v.contains(&format!("models.test:{}", other.port))),
        "{agent}"
    );
    eprintln!("the caller was shown:\n{out}\nthe agent's task: {agent}");
    drop(installed);
}
