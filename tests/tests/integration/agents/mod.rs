//! The agent CLIs people run, each with `sidejob mcp` as its MCP server and a scripted model
//! (see `sidejob_tests::agents`): what the model was sent when a call completes inline,
//! when it yields and the model keeps working, calls `job_wait`, or ends its turn; that a
//! client that goes away leaves no job running; and that repeated runs keep their tools.
//! One file per client; the scenarios they share are here.

mod claude;
mod codex;
mod inspector;
mod opencode;
mod stdio;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::agents::{
    call, call_until, deliveries, finish, items, kill_group, offers_sidejob, say, ModelServer, Ran,
};
use sidejob_tests::{pids_running, unique_sleep, wait_until, Daemon};

/// How long one client run may take before the test calls it hung: opencode runs with the
/// plugin (whose `.opencode/` opencode first fills with `@opencode-ai/plugin` from npm) went
/// past 90 s on a loaded two-core machine.
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// The job that yields: its output (`job-42`) is not in its command, so the marker reaches
/// the model only through the job's result.
const JOB: &str = "sleep 1; echo job-$((6*7))";
const JOB_MARKER: &str = "job-42";

/// One way of running a client against the scripted model, in the daemon's workspace.
trait Agent {
    /// One non-interactive run with `prompt`, to its end (bounded by [`RUN_LIMIT`]).
    fn run(&self, prompt: &str) -> Ran {
        let dir = self.run_dir();
        finish(self.spawn(prompt, &dir), &dir, RUN_LIMIT)
    }

    /// Starts a run and returns at once (its output goes to files in `dir`).
    fn spawn(&self, prompt: &str, dir: &Path) -> Child;

    /// A fresh directory for one run's output.
    fn run_dir(&self) -> PathBuf;
}

/// A directory for run `n`'s output under `root`.
fn next_run_dir(root: &Path) -> PathBuf {
    let n = std::fs::read_dir(root).map(|d| d.count()).unwrap_or(0);
    root.join(format!("run-{n}"))
}

/// A daemon (with `config`) and a model that follows `steps`.
fn setup(config: &str, steps: Vec<Value>, loop_steps: bool) -> (Daemon, ModelServer) {
    let d = Daemon::start_with_config(config);
    let server = ModelServer::start(&d.root.path().join("model"), steps, loop_steps);
    (d, server)
}

fn yielded_job() -> Value {
    call("bash", json!({"command": JOB, "yield_after_ms": 100}))
}

fn expect_ok(ran: &Ran, server: &ModelServer, d: &Daemon) {
    assert!(
        ran.status.is_some_and(|s| s.success()),
        "the client run failed: {}\nrequests:\n{}\ndaemon log (tail):\n{}",
        ran.describe(),
        server.summary(),
        tail(&d.log(), 40)
    );
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---- The scenarios -----------------------------------------------------------------------

fn inline_script() -> Vec<Value> {
    vec![
        call("bash", json!({"command": "echo inline-$((6*7))"})),
        say("done"),
    ]
}

/// The model was sent the command's output as the result of its call.
fn check_inline(server: &ModelServer) {
    let turns = server.turns();
    assert!(
        turns.len() >= 2 && offers_sidejob(&turns[0]["body"]),
        "the model was never offered sidejob's tools:\n{}",
        server.summary()
    );
    let got = deliveries(&turns, "inline-42");
    assert!(
        got.len() == 1 && got[0].step == 1,
        "the call's output should reach the model once, as its result: {got:#?}\n{}",
        server.summary()
    );
}

/// The model yields a job, then keeps calling sidejob until a result carries the job's
/// completion, then makes one more call.
fn keeps_working_script() -> Vec<Value> {
    vec![
        yielded_job(),
        call_until(
            "bash",
            json!({"command": "sleep 0.2; echo working"}),
            JOB_MARKER,
            100,
        ),
        call("bash", json!({"command": "echo after"})),
        say("done"),
    ]
}

/// The completion reached the model once, with the result of a later sidejob call, and was
/// not repeated after.
fn check_keeps_working(server: &ModelServer) {
    let got = deliveries(&server.turns(), JOB_MARKER);
    assert!(
        got.len() == 1 && got[0].step == 2,
        "the completion should reach the model exactly once, on the result of a later call: {got:#?}\n{}",
        server.summary()
    );
    assert!(
        got[0].items.iter().any(|i| i.contains("[automatic]")),
        "delivered as the job's completion: {got:#?}"
    );
}

fn job_wait_script() -> Vec<Value> {
    vec![
        yielded_job(),
        call(
            "job_wait",
            json!({"task_id": "{{running_task_id}}", "timeout_ms": 30_000}),
        ),
        call("bash", json!({"command": "echo after"})),
        say("done"),
    ]
}

/// `job_wait`'s result carried the job's output, and nothing after it repeated the job.
fn check_job_wait(server: &ModelServer) {
    let got = deliveries(&server.turns(), JOB_MARKER);
    assert!(
        got.len() == 1 && got[0].step == 2,
        "job_wait's result should carry the job, and no later result: {got:#?}\n{}",
        server.summary()
    );
}

/// The model yields a job and ends its turn on it; the integration brings it back.
fn ends_turn_script(after: Vec<Value>) -> Vec<Value> {
    let mut steps = vec![yielded_job(), say("it is still running; I will wait")];
    steps.extend(after);
    steps
}

/// The completion reached the model exactly once, at script step `step`, marked as
/// sidejob's automatic wake.
fn check_delivered_once_at(server: &ModelServer, step: u64) {
    let got = deliveries(&server.turns(), JOB_MARKER);
    assert!(
        got.len() == 1 && got[0].step == step,
        "the completion should reach the model exactly once, at step {step}: {got:#?}\n{}",
        server.summary()
    );
    assert!(
        got[0].items.iter().any(|i| i.contains("[automatic]")),
        "delivered as sidejob's wake: {got:#?}"
    );
}

/// The task id of the job the model was told is running.
fn running_job(server: &ModelServer) -> String {
    sidejob_tests::agents::running_task_ids(&server.turns())
        .into_iter()
        .next()
        .unwrap_or_else(|| {
            panic!(
                "the model was never told of a running job:\n{}",
                server.summary()
            )
        })
}

/// The model starts a long foreground call; the client is killed while it runs.
fn abandoned_script(sleep: &str) -> Vec<Value> {
    vec![call(
        "bash",
        json!({"command": format!("sleep {sleep}"), "yield_after_ms": 120_000}),
    )]
}

/// Kills the client (its whole process group) in the middle of the call; its job must not
/// run on.
fn check_abandoned(d: &Daemon, mut client: Child, sleep: &str, model: &str) {
    let cmdline = format!("sleep {sleep}");
    let started = wait_until(Duration::from_secs(60), || {
        !pids_running(&cmdline).is_empty()
    });
    if !started {
        kill_group(&mut client);
        panic!("the model's call never started its command:\n{model}");
    }
    kill_group(&mut client);
    let gone = wait_until(Duration::from_secs(30), || {
        pids_running(&cmdline).is_empty()
    });
    let mut running = String::new();
    let settled = wait_until(Duration::from_secs(30), || {
        let o = d.cli(&["tasks", "--json", "--state", "running"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(json!({}));
        running = v["tasks"].to_string();
        v["tasks"].as_array().is_some_and(Vec::is_empty)
    });
    assert!(
        gone && settled,
        "the abandoned call's job runs on (process gone: {gone}); running tasks: {running}\ndaemon log (tail):\n{}",
        tail(&d.log(), 30)
    );
}

/// The config under which the old one-session-per-connection `sidejob mcp` ran out of
/// sessions after four runs.
const FEW_SESSIONS: &str = "[per_user]\nsessions = 4\n";

fn repeated_script() -> Vec<Value> {
    vec![
        call("bash", json!({"command": "echo run-$((6*7))"})),
        say("done"),
    ]
}

/// Runs the client `runs` times in one workspace: every run's model was offered sidejob's
/// tools and got its call's result.
fn check_repeated_runs(agent: &dyn Agent, server: &ModelServer, d: &Daemon, runs: usize) {
    // The suite runs a few; SIDEJOB_TEST_REPEATED_RUNS=1000 runs the thousand.
    let runs = std::env::var("SIDEJOB_TEST_REPEATED_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(runs);
    let mut seen = 0;
    for i in 0..runs {
        let ran = agent.run("run it");
        expect_ok(&ran, server, d);
        let turns = server.turns();
        let new = &turns[seen..];
        assert!(
            new.len() >= 2 && offers_sidejob(&new[0]["body"]),
            "run {i}: the model was not offered sidejob's tools ({} turns): {}\n{}",
            new.len(),
            ran.describe(),
            server.summary()
        );
        let last = items(&new[new.len() - 1]["body"]).join("\n");
        assert!(
            last.contains("run-42"),
            "run {i}: the model never got its call's result:\n{}",
            server.summary()
        );
        seen = turns.len();
    }
}

/// A sleep unique to this test, for finding its process.
fn long_sleep() -> String {
    unique_sleep()
}
