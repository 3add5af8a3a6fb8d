//! Wakes, the inbox and live events (issue 4, docs/protocol.md): every background completion reaches
//! the host exactly once, also across restarts, and a stalled subscriber stalls nobody.

use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::push::{is_notification_for, is_update};
use sidejob_tests::{skip_without, Client, Daemon, Gate, Need};

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

/// Starts a background task in `s` after everything else and reads `host`'s stream up to
/// its wake: every push that came before it is returned (the sentinel's wake last), so a
/// test can count wakes at the end without waiting out a fixed window.
fn read_to_sentinel(host: &mut Client, starter: &mut Client, s: &str) -> Vec<Value> {
    let sentinel = background(starter, s, "echo sentinel");
    host.read_until(
        30 * SEC,
        "the sentinel's wake",
        is_notification_for(&sentinel),
    )
}

fn wakes_for(pushes: &[Value], task: &str) -> usize {
    pushes
        .iter()
        .filter(|m| is_notification_for(task)(m))
        .count()
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
    // Exactly one wake for the task: none more before a later task's wake.
    let rest = read_to_sentinel(&mut host, &mut other, &s);
    assert_eq!(wakes_for(&rest, &t), 0, "a second wake arrived: {rest:#?}");
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
    // Observed by task.wait before it settled. On a loaded machine the wait may reach the
    // daemon after the settle (then the result wakes, rightly): such attempts do not count,
    // and their wakes are expected below.
    let mut late = Vec::new();
    loop {
        let waited = background(&mut c, &s, "sleep 0.3");
        let t = c.ok(
            "task.wait",
            json!({"task_id": waited, "timeout_ms": 10_000}),
        );
        if t["delivery"] == "wait" {
            break;
        }
        assert_eq!(t["delivery"], "wake", "{t}");
        late.push(waited);
        assert!(
            late.len() < 5,
            "no wait reached the daemon before the settle"
        );
    }
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
    // A later task that does wake: nothing may have come before its wake.
    let mut starter = d.client();
    let pushes = read_to_sentinel(&mut c, &mut starter, &s);
    let is_late = |n: &Value| late.iter().any(|t| n["task_id"] == t.as_str());
    let wakes: Vec<&Value> = pushes
        .iter()
        .filter(|m| m["method"] == "notification" && !is_late(&m["params"]["notification"]))
        .collect();
    assert_eq!(wakes.len(), 1, "only the sentinel wakes: {wakes:#?}");
    let inbox = c.ok("inbox.list", json!({"session_id": s}));
    let listed = inbox["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| !is_late(n))
        .count();
    assert_eq!(
        listed, 1,
        "only the sentinel's wake is in the inbox: {inbox}"
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
    let unread = h3.ok("inbox.list", json!({"session_id": s, "unread_only": true}));
    assert!(
        unread["notifications"].as_array().unwrap().is_empty(),
        "{unread}"
    );
    let mut h4 = d.client();
    subscribe(&mut h4, &s);
    // The replay on subscribe comes at once, before any later wake.
    let pushes = read_to_sentinel(&mut h4, &mut h3, &s);
    assert_eq!(wakes_for(&pushes, &t), 0, "an acked wake came back");
    let all = h4.ok("inbox.list", json!({"session_id": s}));
    let mine = all["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["task_id"] == t.as_str())
        .expect("the acked wake is still listed")
        .clone();
    assert_eq!(mine["acked"], true, "{all}");
}

#[test]
fn a_wake_is_created_for_a_run_that_finished_while_the_daemon_was_down() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The run cannot finish before the daemon is gone: it waits for the gate.
    let gate = Gate::new(&d.workspace, "finish");
    let t = background(
        &mut c,
        &s,
        &format!("{}; echo finished-while-down", gate.wait_cmd()),
    );
    d.kill9();
    gate.open();
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

/// Root's session, with an unacked wake in it, and another uid that asks for it.
#[test]
fn subscribing_to_another_users_session_is_refused() {
    const NOBODY: u32 = 65534;
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = Daemon::start();
    let mut root = d.client();
    let s = d.open_session(&mut root);
    let t = background(&mut root, &s, "echo roots-output");
    root.wait_settled_quietly(&t);
    let inbox = root.ok("inbox.list", json!({"session_id": s}));
    let note = inbox["notifications"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("root's wake is in the inbox: {inbox}"))
        .to_owned();
    d.let_everyone_connect();
    let mut other = d.client_as(NOBODY, NOBODY);
    let (code, kind) = other.err("events.subscribe", json!({"session_ids": [s]}));
    assert_eq!((code, kind.as_str()), (-32002, "permission_denied"));
    let (code, kind) = other.err("inbox.ack", json!({"ids": [note]}));
    assert_eq!((code, kind.as_str()), (-32002, "permission_denied"));
    let (code, kind) = other.err("inbox.list", json!({"session_id": s}));
    assert_eq!((code, kind.as_str()), (-32002, "permission_denied"));
    // Its default subscription covers its own sessions only: its own task's wake arrives,
    // and nothing of root's before it (root's unacked wake would be replayed at once).
    let ws = d.root.path().join("nobody-ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::os::unix::fs::chown(&ws, Some(NOBODY), Some(NOBODY)).unwrap();
    let own = other.ok("session.open", json!({"workspace": ws}))["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    other.ok("events.subscribe", json!({}));
    let mine = background(&mut other, &own, "echo nobodys-output");
    let pushes = other.read_until(30 * SEC, "its own wake", is_notification_for(&mine));
    for m in &pushes {
        let text = m.to_string();
        assert!(
            !text.contains(&s) && !text.contains(&t),
            "root's session reached another uid: {m}"
        );
    }
    // Root's wake is untouched.
    let inbox = root.ok("inbox.list", json!({"session_id": s, "unread_only": true}));
    assert_eq!(inbox["notifications"][0]["id"], note.as_str(), "{inbox}");
}

#[test]
fn subscribing_to_an_unknown_or_malformed_session_is_refused() {
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
    // The stalled one finds a gap once it reads, and can resume with since_seq.
    let mut read = stalled.read_until(30 * SEC, "the gap", |m| m["method"] == "events.gap");
    let from = read.last().unwrap()["params"]["from_seq"].as_i64().unwrap();
    stalled.ok(
        "events.subscribe",
        json!({"session_ids": [s], "since_seq": from - 1}),
    );
    read.extend(stalled.read_until(30 * SEC, "resumed stream", is_update(&last_id, "succeeded")));
    // Counted at the end, over everything that connection received: one gap, nothing more.
    let gaps = read.iter().filter(|m| m["method"] == "events.gap").count();
    assert_eq!(gaps, 1, "exactly one events.gap expected");
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
    // The host reads its stream as it comes (so no queue fills), up to a sentinel's wake that
    // the test causes after everything else has settled.
    let mut host = d.client();
    subscribe(&mut host, &s);
    let marker = format!("sentinel-{}", std::process::id());
    let host = {
        let marker = marker.clone();
        std::thread::spawn(move || {
            host.read_until(600 * SEC, "the sentinel's wake", |m| {
                m["method"] == "notification"
                    && m["params"]["notification"]["text"]
                        .as_str()
                        .is_some_and(|t| t.contains(&marker))
            })
        })
    };
    let socket = d.socket.clone();
    // Calls whose run time straddles yield_after_ms, half of the yielded ones then waited on.
    let (seen, inline, yielded) = crate::delivery::straddle(80, |yield_ms| {
        let callers: Vec<_> = (0..4u64)
            .map(|t| {
                let (socket, s) = (socket.clone(), s.clone());
                std::thread::spawn(move || {
                    let mut c = Client::connect(&socket);
                    let mut seen = Vec::new();
                    for i in 0..25u64 {
                        let ms = (i * 37 + t * 13) % (2 * yield_ms + 1);
                        let r = c.bash(
                            &s,
                            &format!("sleep {}", ms as f64 / 1000.0),
                            json!({"yield_after_ms": yield_ms}),
                        );
                        let id = r["task_id"].as_str().unwrap().to_owned();
                        let how = match (r["status"].as_str(), i % 2) {
                            (Some("completed"), _) => "inline",
                            (Some("running"), 0) => {
                                let w =
                                    c.ok("task.wait", json!({"task_id": id, "timeout_ms": 30_000}));
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
        let inline = seen.iter().filter(|(_, how)| *how == "inline").count();
        let yielded = seen.len() - inline;
        (seen, inline, yielded)
    });
    // Wait until every task has settled, then cause the sentinel and read up to it.
    for (id, _) in &seen {
        setup.wait_settled_quietly(id);
    }
    let sentinel = background(&mut setup, &s, &format!("echo {marker}"));
    let pushes = host.join().expect("host reader");
    let mut per_task: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for w in pushes.iter().filter(|m| m["method"] == "notification") {
        *per_task
            .entry(
                w["params"]["notification"]["task_id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
            .or_default() += 1;
    }
    assert_eq!(per_task.get(&sentinel), Some(&1));
    // The inbox is the durable record: it must agree with what was pushed.
    let inbox = setup.ok("inbox.list", json!({"session_id": s}));
    let mut in_inbox: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for n in inbox["notifications"].as_array().unwrap() {
        *in_inbox
            .entry(n["task_id"].as_str().unwrap_or("").to_owned())
            .or_default() += 1;
    }
    let (mut waited, mut woken) = (0, 0);
    for (id, how) in &seen {
        let n_wakes = per_task.get(id).copied().unwrap_or(0);
        assert_eq!(
            in_inbox.get(id).copied().unwrap_or(0),
            n_wakes,
            "task {id}: the inbox and the pushes disagree"
        );
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
            "wait" => waited += 1,
            "wake" => woken += 1,
            _ => {}
        }
    }
    eprintln!(
        "{} calls: {inline} inline, {waited} to task.wait, {woken} woken ({yielded} yielded)",
        seen.len()
    );
}
