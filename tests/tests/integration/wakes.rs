//! Wakes, the inbox and live events (issue 4, docs/protocol.md): every background completion reaches
//! the host exactly once, also across restarts, and a stalled subscriber stalls nobody.

use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::push::{is_notification_for, is_update};
use sidejob_tests::{Client, Daemon};

const SEC: Duration = Duration::from_secs(1);

fn subscribe(c: &mut Client, session: &str) -> i64 {
    c.ok("events.subscribe", json!({"session_ids": [session]}))["seq"]
        .as_i64()
        .expect("seq")
}

fn background(c: &mut Client, s: &str, cmd: &str) -> String {
    let r = c.bash(s, cmd, json!({"background": true}));
    assert_eq!(r["status"], "running", "{r}");
    r["task_id"].as_str().expect("task id").to_owned()
}

#[test]
fn a_background_completion_pushes_task_updates_and_one_automatic_wake() {
    let d = Daemon::start();
    let mut host = d.client();
    let s = d.open_session(&mut host);
    subscribe(&mut host, &s);
    let mut other = d.client();
    let t = background(&mut other, &s, "echo line-one; echo line-two; exit 4");
    host.wait_push(10 * SEC, "task running", is_update(&t, "running"));
    host.wait_push(10 * SEC, "task failed", is_update(&t, "failed"));
    let n = host.wait_push(10 * SEC, "the wake", is_notification_for(&t));
    let n = &n["params"]["notification"];
    assert_eq!(n["kind"], "wake");
    assert_eq!(n["severity"], "error");
    assert_eq!(n["acked"], false);
    let text = n["text"].as_str().expect("text");
    for needle in [
        "[automatic]",
        t.as_str(),
        "bash",
        "exit 4",
        "failed (exit code 4)",
        "result.json",
        "line-two",
        "not a message from the user",
    ] {
        assert!(text.contains(needle), "wake text lacks {needle:?}:\n{text}");
    }
    let task = host.ok("task.get", json!({"task_id": t}));
    assert_eq!(task["delivery"], "wake");
    // Exactly one wake for the task.
    let more = host.collect_pushes(SEC / 2, is_notification_for(&t));
    assert!(more.is_empty(), "a second wake arrived: {more:?}");
    let inbox = host.ok("inbox.list", json!({"session_id": s}));
    let mine: Vec<&Value> = inbox["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["task_id"] == t.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{inbox}");
}

#[test]
fn a_session_without_proactive_wake_gets_a_one_line_notice() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = c.ok(
        "session.open",
        json!({"workspace": d.workspace, "proactive_wake": false}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    subscribe(&mut c, &s);
    let t = background(&mut c, &s, "echo hi");
    let n = c.wait_push(10 * SEC, "the notice", is_notification_for(&t));
    let n = &n["params"]["notification"];
    assert_eq!(n["severity"], "info");
    assert_eq!(n["kind"], "notice");
    let text = n["text"].as_str().unwrap();
    assert!(!text.contains("[automatic]"), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains(&t) && text.contains("succeeded"), "{text}");
}

#[test]
fn silent_calls_and_results_already_delivered_create_no_wake() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    subscribe(&mut c, &s);
    // Inline.
    let inline = c.bash(&s, "true", json!({}));
    assert_eq!(inline["status"], "completed");
    // Observed by task.wait before it settled.
    let waited = background(&mut c, &s, "sleep 0.3");
    let t = c.ok(
        "task.wait",
        json!({"task_id": waited, "timeout_ms": 10_000}),
    );
    assert_eq!(t["delivery"], "wait");
    // Silent.
    let silent = c.bash(&s, "true", json!({"background": true, "wake": "silent"}))["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    c.wait_push(10 * SEC, "silent settles", is_update(&silent, "succeeded"));
    assert_eq!(
        c.ok("task.get", json!({"task_id": silent}))["delivery"],
        "pending"
    );
    let wakes = c.collect_pushes(SEC / 2, |m| m["method"] == "notification");
    assert!(wakes.is_empty(), "no wake expected, got {wakes:?}");
    assert!(
        c.ok("inbox.list", json!({"session_id": s}))["notifications"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn unacked_wakes_come_back_on_every_subscribe_and_across_a_restart_until_acked() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // Nobody is subscribed while it finishes: nothing may be lost.
    let t = background(&mut c, &s, "echo done");
    let settled = c.wait_settled_quietly(&t);
    assert_eq!(settled["delivery"], "wake", "{settled}");

    let mut h1 = d.client();
    subscribe(&mut h1, &s);
    let n1 = h1.wait_push(5 * SEC, "replayed wake", is_notification_for(&t));
    let id = n1["params"]["notification"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut h2 = d.client();
    subscribe(&mut h2, &s);
    h2.wait_push(5 * SEC, "replayed again", is_notification_for(&t));

    d.restart();
    let mut h3 = d.client();
    subscribe(&mut h3, &s);
    let n3 = h3.wait_push(5 * SEC, "replayed after restart", is_notification_for(&t));
    assert_eq!(n3["params"]["notification"]["id"], id.as_str());
    assert_eq!(
        n3["params"]["seq"], n1["params"]["seq"],
        "a notification keeps its seq"
    );

    let acked = h3.ok("inbox.ack", json!({"ids": [id]}));
    assert_eq!(acked["acked"], json!([id]));
    assert_eq!(
        h3.ok("inbox.ack", json!({"ids": [id]}))["already_acked"],
        json!([id])
    );
    let mut h4 = d.client();
    subscribe(&mut h4, &s);
    assert!(
        h4.collect_pushes(SEC / 2, is_notification_for(&t))
            .is_empty(),
        "an acked wake came back"
    );
    let unread = h4.ok("inbox.list", json!({"session_id": s, "unread_only": true}));
    assert!(
        unread["notifications"].as_array().unwrap().is_empty(),
        "{unread}"
    );
    let all = h4.ok("inbox.list", json!({"session_id": s}));
    assert_eq!(all["notifications"][0]["acked"], true);
}

#[test]
fn a_wake_is_created_for_a_run_that_finished_while_the_daemon_was_down() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let t = background(&mut c, &s, "sleep 0.5; echo finished-while-down");
    d.kill9();
    // Let it finish with nobody watching: wait for its result file.
    let result = std::path::PathBuf::from(c_result_path(&d, &s, &t));
    let deadline = std::time::Instant::now() + 20 * SEC;
    while !result.exists() {
        assert!(std::time::Instant::now() < deadline, "run never finished");
        std::thread::sleep(Duration::from_millis(20));
    }
    d.restart();
    let mut h = d.client();
    subscribe(&mut h, &s);
    let n = h.wait_push(10 * SEC, "wake after restart", is_notification_for(&t));
    assert!(n["params"]["notification"]["text"]
        .as_str()
        .unwrap()
        .contains("finished-while-down"));
}

fn c_result_path(d: &Daemon, session: &str, task: &str) -> String {
    format!(
        "{}/sessions/{session}/.background/{task}/result.json",
        d.state_dir.display()
    )
}

#[test]
fn since_seq_replays_the_task_changes_a_host_missed() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let seq = subscribe(&mut c, &s);
    drop(c);
    let mut w = d.client();
    let t = background(&mut w, &s, "true");
    w.wait_settled(&t);
    let mut back = d.client();
    back.ok(
        "events.subscribe",
        json!({"session_ids": [s], "since_seq": seq}),
    );
    let u = back.wait_push(5 * SEC, "missed update", is_update(&t, "succeeded"));
    assert!(u["params"]["seq"].as_i64().unwrap() > seq);
}

#[test]
fn subscribing_to_another_users_session_is_refused() {
    let d = Daemon::start();
    let mut c = d.client();
    let (code, kind) = c.err(
        "events.subscribe",
        json!({"session_ids": ["no-such-session"]}),
    );
    assert_eq!((code, kind.as_str()), (-32001, "not_found"));
    let (code, kind) = c.err("events.subscribe", json!({"session_ids": ["../etc"]}));
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    let (code, _) = c.err("inbox.ack", json!({"ids": ["01M8MR3A0TN9KQ05938VNEWNRX"]}));
    assert_eq!(code, -32001);
}

#[test]
fn a_subscriber_that_never_reads_gets_a_gap_and_stalls_nobody() {
    let d = Daemon::start_with_config("push_queue = 8\n");
    let mut setup = d.client();
    let s = d.open_session(&mut setup);
    // The stalled subscriber: subscribes, then does not read.
    let mut stalled = d.client();
    subscribe(&mut stalled, &s);
    // A healthy subscriber reads as it goes, until the final task settles.
    let mut healthy = d.client();
    subscribe(&mut healthy, &s);
    let reader = std::thread::spawn(move || {
        let last = healthy.wait_push(120 * SEC, "the final task", |m| {
            m["method"] == "task.updated"
                && m["params"]["task"]["summary"] == "final"
                && m["params"]["task"]["state"] == "succeeded"
        });
        let gaps = healthy
            .pushes
            .iter()
            .filter(|m| m["method"] == "events.gap")
            .count();
        (last, gaps)
    });
    // Enough traffic to fill the stalled socket's kernel buffer and its queue.
    let filler = "x".repeat(2000);
    for i in 0..150 {
        let description = if i == 149 {
            "final".to_owned()
        } else {
            filler.clone()
        };
        let r = setup.ok("tool.call", json!({"session_id": s, "tool": "bash", "args": {"command": format!("echo {i} {filler}"), "description": description}}));
        assert_eq!(r["status"], "completed", "the daemon must keep answering");
    }
    let (last, healthy_gaps) = reader.join().expect("healthy reader");
    assert_eq!(healthy_gaps, 0, "a reading subscriber must not be cut off");
    let last_id = last["params"]["task"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The stalled one finds exactly one gap once it reads, and can resume with since_seq.
    let gaps = stalled.collect_pushes(2 * SEC, |m| m["method"] == "events.gap");
    assert_eq!(gaps.len(), 1, "exactly one events.gap expected");
    let from = gaps[0]["params"]["from_seq"].as_i64().unwrap();
    stalled.pushes.clear();
    stalled.ok(
        "events.subscribe",
        json!({"session_ids": [s], "since_seq": from - 1}),
    );
    stalled.wait_push(10 * SEC, "resumed stream", is_update(&last_id, "succeeded"));
}

#[test]
fn session_status_counts_running_queued_and_scheduled() {
    let d = Daemon::start_with_config("max_running_per_session = 1\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let a = background(&mut c, &s, "sleep 30");
    let b = background(&mut c, &s, "sleep 30");
    c.ok(
        "schedule.create",
        json!({"session_id": s, "delay_ms": 3_600_000, "action": {"prompt": "later"}}),
    );
    let st = c.ok("session.status", json!({"session_id": s}));
    assert_eq!(st["running"], 1, "{st}");
    assert_eq!(st["queued"], 1, "{st}");
    assert_eq!(st["scheduled"], 1, "{st}");
    assert_eq!(st["active"], true);
    for t in [a, b] {
        c.ok("task.cancel", json!({"task_id": t, "grace_ms": 100}));
    }
    let st = c.ok("session.status", json!({"session_id": s}));
    assert_eq!(
        (
            st["running"].as_u64(),
            st["queued"].as_u64(),
            st["scheduled"].as_u64()
        ),
        (Some(0), Some(0), Some(1)),
        "{st}"
    );
    assert_eq!(
        st["active"], false,
        "an armed schedule alone is not activity: {st}"
    );
}

#[test]
fn consecutive_polling_calls_get_a_hint_naming_background() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let first = c.bash(&s, "sleep 0.05", json!({}));
    assert!(
        first.get("hint").is_none() || first["hint"].is_null(),
        "{first}"
    );
    let second = c.bash(&s, "sleep 0.05; echo checking", json!({}));
    let hint = second["hint"].as_str().unwrap_or_default();
    assert!(hint.contains("background: true"), "{second}");
    let normal = c.bash(&s, "echo unrelated", json!({}));
    assert!(
        normal.get("hint").is_none() || normal["hint"].is_null(),
        "{normal}"
    );
}

#[test]
fn every_result_is_delivered_exactly_once_across_inline_wait_and_wake() {
    let d = Daemon::start();
    let mut setup = d.client();
    let s = d.open_session(&mut setup);
    let mut host = d.client();
    subscribe(&mut host, &s);
    let socket = d.socket.clone();
    // 4 callers × 50 calls whose run time straddles yield_after_ms = 80.
    let callers: Vec<_> = (0..4)
        .map(|t| {
            let (socket, s) = (socket.clone(), s.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket);
                let mut seen = Vec::new();
                for i in 0..50 {
                    let ms = (i * 37 + t * 13) % 161; // 0..160 ms around the 80 ms yield
                    let r = c.bash(
                        &s,
                        &format!("sleep {}", ms as f64 / 1000.0),
                        json!({"yield_after_ms": 80}),
                    );
                    let id = r["task_id"].as_str().unwrap().to_owned();
                    let how = match (r["status"].as_str(), i % 2) {
                        (Some("completed"), _) => "inline",
                        (Some("running"), 0) => {
                            let w = c.ok("task.wait", json!({"task_id": id, "timeout_ms": 30_000}));
                            if w["delivery"] == "wait" {
                                "wait"
                            } else {
                                "left to the wake"
                            }
                        }
                        _ => "left to the wake",
                    };
                    seen.push((id, how));
                }
                seen
            })
        })
        .collect();
    let seen: Vec<(String, &str)> = callers
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert_eq!(seen.len(), 200);
    // Wait until every task has settled, then count the wakes.
    for (id, _) in &seen {
        setup.wait_settled_quietly(id);
    }
    let wakes = host.collect_pushes(2 * SEC, |m| m["method"] == "notification");
    let mut per_task: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for w in &wakes {
        *per_task
            .entry(
                w["params"]["notification"]["task_id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
            .or_default() += 1;
    }
    let (mut inline, mut waited, mut woken) = (0, 0, 0);
    for (id, how) in &seen {
        let n_wakes = per_task.get(id).copied().unwrap_or(0);
        let delivery = setup.ok("task.get", json!({"task_id": id}))["delivery"]
            .as_str()
            .unwrap()
            .to_owned();
        let deliveries = (*how == "inline") as usize + (*how == "wait") as usize + n_wakes;
        assert_eq!(
            deliveries, 1,
            "task {id}: seen {how}, {n_wakes} wakes, delivery {delivery}"
        );
        let expected = match (*how, n_wakes) {
            ("inline", 0) => "inline",
            ("wait", 0) => "wait",
            (_, 1) => "wake",
            _ => unreachable!(),
        };
        assert_eq!(delivery, expected, "task {id}");
        match expected {
            "inline" => inline += 1,
            "wait" => waited += 1,
            _ => woken += 1,
        }
    }
    eprintln!("200 calls: {inline} inline, {waited} to task.wait, {woken} woken");
    assert!(
        inline > 0 && woken > 0,
        "the run times must straddle the yield: {inline} inline, {woken} woken"
    );
}
