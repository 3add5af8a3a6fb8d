//! The `subagent` tool (docs/plugins.md): a child session, waiting for the child's jobs, services
//! handed over to the parent, cancellation of every descendant, the depth limit.

use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{skip_without, wait_until, Client, Daemon, Need};

fn agent_daemon() -> Option<Daemon> {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Python3]) {
        return None;
    }
    // The fake agent travels in the command line, so it needs no file inside the sandbox.
    let script = include_str!("../../fixtures/fake_agent.py");
    Some(Daemon::start_with_config(&format!(
        "[subagent]\ncommand = [\"python3\", \"-c\", '''{script}''']\n"
    )))
}

fn subagent(c: &mut Client, session: &str, prompt: &str, extra: Value) -> Value {
    let mut p = json!({"session_id": session, "tool": "subagent", "args": {"prompt": prompt}});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        p[k] = v;
    }
    c.ok("tool.call", p)
}

fn id_after(output: &str, word: &str) -> String {
    output
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{word} ")))
        .unwrap_or_else(|| panic!("no {word} line in {output:?}"))
        .trim()
        .to_owned()
}

#[test]
fn a_subagent_waits_for_its_jobs_and_hands_its_service_to_the_parent() {
    let Some(d) = agent_daemon() else { return };
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = subagent(&mut c, &s, "work", json!({"yield_after_ms": 60_000}));
    assert_eq!(r["status"], "completed", "{r}\n{}", d.log());
    assert_eq!(r["state"], "succeeded", "{r}");
    let agent_task = r["task_id"].as_str().unwrap().to_owned();
    let out = c.output(&agent_task);
    let job = id_after(&out, "job");
    let service = id_after(&out, "service");
    // The ordinary job had settled before the subagent reported back.
    let job_row = c.task(&job);
    assert_eq!(job_row["state"], "succeeded", "{job_row}");
    assert_eq!(job_row["parent_task_id"], agent_task.as_str());
    assert_eq!(
        job_row["session_id"],
        format!("sub-{}", agent_task.to_ascii_lowercase())
    );
    // The service is still running, now in the parent session, and listed in the result.
    let svc = c.task(&service);
    assert_eq!(svc["state"], "running", "{svc}");
    assert_eq!(svc["session_id"], s.as_str(), "{svc}");
    assert!(
        out.contains("services handed over") && out.contains(&service),
        "{out}"
    );
    let listed: Vec<String> = c.ok("task.list", json!({"session_id": s}))["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap().to_owned())
        .collect();
    assert!(listed.contains(&service), "{listed:?}");
    // The child session records its parent.
    let sessions = c.ok("session.list", json!({}));
    let child = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["session_id"] == format!("sub-{}", agent_task.to_ascii_lowercase()))
        .expect("child session")
        .clone();
    assert_eq!(child["parent_session_id"], s.as_str());
    // The subagent's own job reported through the subagent: it woke nobody.
    let all = c.ok("inbox.list", json!({}));
    assert!(
        !all["notifications"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["task_id"] == job.as_str()),
        "the subagent's job woke the host: {all}"
    );
    // The parent gets the service's wake.
    c.ok("task.cancel", json!({"task_id": service, "grace_ms": 500}));
    let inbox = c.ok("inbox.list", json!({"session_id": s}));
    assert!(
        inbox["notifications"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["task_id"] == service.as_str()),
        "the parent has no wake for the service: {inbox}"
    );
    assert_replays(&d);
}

#[test]
fn cancelling_a_subagent_cancels_every_descendant() {
    let Some(d) = agent_daemon() else { return };
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = subagent(&mut c, &s, "hold", json!({"background": true}));
    let agent_task = r["task_id"].as_str().unwrap().to_owned();
    let child = format!("sub-{}", agent_task.to_ascii_lowercase());
    let mut job = String::new();
    assert!(
        wait_until(Duration::from_secs(20), || {
            let tasks = c.ok("task.list", json!({"session_id": child}));
            match tasks["tasks"].as_array().and_then(|t| t.first()) {
                Some(t) if t["state"] == "running" => {
                    job = t["task_id"].as_str().unwrap().to_owned();
                    true
                }
                _ => false,
            }
        }),
        "{}",
        d.log()
    );
    let cancel = c.ok(
        "task.cancel",
        json!({"task_id": agent_task, "grace_ms": 500}),
    );
    assert_ne!(cancel["result"], "already_terminal", "{cancel}");
    let t = c.wait_settled(&agent_task);
    assert_eq!(t["state"], "canceled", "{t}");
    let j = c.wait_settled(&job);
    assert_eq!(j["state"], "canceled", "{j}");
}

#[test]
fn subagents_nest_at_most_three_deep() {
    let Some(d) = agent_daemon() else { return };
    let mut c = d.client();
    // A session already three levels below the host's.
    let mut parent = d.open_session(&mut c);
    for _ in 0..3 {
        let r = c.ok(
            "session.open",
            json!({"workspace": d.workspace, "parent_session_id": parent}),
        );
        parent = r["session_id"].as_str().unwrap().to_owned();
    }
    let e = c
        .call(
            "tool.call",
            json!({"session_id": parent, "tool": "subagent", "args": {"prompt": "work"}}),
        )
        .expect_err("too deep");
    assert_eq!(e["data"]["kind"], "invalid_params", "{e}");
    assert!(e["message"].as_str().unwrap().contains('3'), "{e}");
    // Without configuration the tool says what to set.
    let d2 = Daemon::start();
    let mut c2 = d2.client();
    let s2 = d2.open_session(&mut c2);
    let e = c2
        .call(
            "tool.call",
            json!({"session_id": s2, "tool": "subagent", "args": {"prompt": "x"}}),
        )
        .expect_err("unconfigured");
    assert!(e["message"].as_str().unwrap().contains("[subagent]"), "{e}");
}

#[test]
fn closing_the_parent_session_cancels_a_handed_over_service() {
    let Some(d) = agent_daemon() else { return };
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = subagent(&mut c, &s, "work", json!({"yield_after_ms": 60_000}));
    assert_eq!(r["state"], "succeeded", "{r}");
    let service = id_after(&c.output(r["task_id"].as_str().unwrap()), "service");
    c.ok("session.close", json!({"session_id": s}));
    let svc = c.wait_settled(&service);
    assert_eq!(svc["state"], "canceled", "{svc}");
}

#[test]
fn a_question_asked_inside_a_subagent_reaches_the_host_and_its_answer_comes_back() {
    let Some(d) = agent_daemon() else { return };
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = subagent(&mut c, &s, "ask", json!({"background": true}));
    let agent_task = r["task_id"].as_str().unwrap().to_owned();
    // The question is a task of the child session, but the host hears it in its own.
    let mut asker = String::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let inbox = c.ok("inbox.list", json!({"session_id": s}));
            match inbox["notifications"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["severity"] == "action_required")
            {
                Some(n) => {
                    asker = n["task_id"].as_str().unwrap().to_owned();
                    true
                }
                None => false,
            }
        }),
        "{}",
        d.log()
    );
    assert_eq!(c.task(&asker)["state"], "awaiting_input");
    assert_eq!(
        c.task(&asker)["session_id"],
        format!("sub-{}", agent_task.to_ascii_lowercase())
    );
    c.ok("task.answer", json!({"task_id": asker, "answer": "main"}));
    // The subagent reports back once the asker has its answer and settles.
    let t = c.wait_settled(&agent_task);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.task(&asker)["state"], "succeeded");
    assert!(
        c.output(&asker).contains("got main"),
        "{}",
        c.output(&asker)
    );
    assert_replays(&d);
}

/// The events this area writes (questions, answers, hand-overs) rebuild the same rows.
fn assert_replays(d: &Daemon) {
    let out = std::process::Command::new(sidejob_tests::sidejob_bin())
        .args(["replay", "--check", "--state-dir"])
        .arg(&d.state_dir)
        .output()
        .expect("run sidejob replay");
    assert!(
        out.status.success(),
        "replay --check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An agent that parses its arguments the way many do (Python's argparse) and prints what it
/// understood: whether it got the flag, its positional prompt, its stdin and `AGENT_PROMPT`.
const ARGPARSE_AGENT: &str = r#"
import argparse, os, sys
p = argparse.ArgumentParser()
p.add_argument("--dangerously-skip-permissions", action="store_true")
p.add_argument("prompt", nargs="?")
a = p.parse_args()
print(f"skip={a.dangerously_skip_permissions} prompt={a.prompt!r} stdin={sys.stdin.read()!r} env={os.environ.get('AGENT_PROMPT')!r}")
"#;

#[test]
fn a_prompt_that_looks_like_a_flag_reaches_the_agent_as_a_prompt() {
    if skip_without(&[Need::Python3]) {
        return;
    }
    let flag = "--dangerously-skip-permissions";
    let run = |extra: &str| {
        let d = Daemon::start_with_config(&format!(
            "[subagent]\ncommand = [\"python3\", \"-c\", '''{ARGPARSE_AGENT}''']\n{extra}"
        ));
        let mut c = d.client();
        let s = d.open_session(&mut c);
        let r = subagent(&mut c, &s, flag, json!({"yield_after_ms": 60_000}));
        assert_eq!(r["state"], "succeeded", "{r}\n{}", d.log());
        c.output(r["task_id"].as_str().unwrap())
    };
    // The default: the prompt follows `--`, so it is the positional prompt, not the flag.
    assert_eq!(
        run(""),
        format!("skip=False prompt='{flag}' stdin='' env='{flag}'\n")
    );
    // The positive control: the same agent does take the flag when it is one.
    let d = Daemon::start_with_config(&format!(
        "[subagent]\ncommand = [\"python3\", \"-c\", '''{ARGPARSE_AGENT}''', \"{flag}\"]\n"
    ));
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = subagent(&mut c, &s, "hello", json!({"yield_after_ms": 60_000}));
    assert_eq!(
        c.output(r["task_id"].as_str().unwrap()),
        "skip=True prompt='hello' stdin='' env='hello'\n"
    );
    // Configured to, the prompt travels on stdin and is not in the argv at all.
    assert_eq!(
        run("prompt = \"stdin\"\n"),
        format!("skip=False prompt=None stdin='{flag}' env='{flag}'\n")
    );
}
