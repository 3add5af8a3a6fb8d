//! Durable schedules (issue 4, docs/protocol.md): leased claims, exactly-once occurrences, prompts
//! that wait for a route, calls whose completions wake, catch-up after downtime.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::push::is_update;
use sidejob_tests::{Client, Daemon};

const SEC: Duration = Duration::from_secs(1);

fn is_schedule_prompt(m: &Value) -> bool {
    m["method"] == "notification" && m["params"]["notification"]["kind"] == "schedule"
}

/// The schedule prompts in the inbox (the durable record) of one schedule.
fn prompts_of(c: &mut Client, session: &str, schedule: &str) -> Vec<String> {
    c.ok("inbox.list", json!({"session_id": session}))["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["kind"] == "schedule")
        .filter_map(|n| n["text"].as_str())
        .filter(|t| t.contains(&format!("schedule {schedule},")))
        .map(str::to_owned)
        .collect()
}

fn create(c: &mut Client, params: Value) -> (String, String) {
    let r = c.ok("schedule.create", params);
    (
        r["schedule_id"].as_str().unwrap().to_owned(),
        r["task_id"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn a_delayed_prompt_is_delivered_once_and_its_monitor_succeeds() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    let (sid, monitor) = create(
        &mut c,
        json!({"session_id": s, "delay_ms": 200, "action": {"prompt": "check the CI run"}}),
    );
    let t = c.ok("task.get", json!({"task_id": monitor}));
    assert_eq!(
        (t["kind"].as_str(), t["state"].as_str()),
        (Some("monitor"), Some("scheduled")),
        "{t}"
    );
    let n = c.wait_push(10 * SEC, "the scheduled prompt", is_schedule_prompt);
    let text = n["params"]["notification"]["text"].as_str().unwrap();
    assert!(
        text.contains("[automatic]") && text.contains("check the CI run") && text.contains(&sid),
        "{text}"
    );
    c.wait_push(10 * SEC, "monitor done", is_update(&monitor, "succeeded"));
    let list = c.ok("schedule.list", json!({"session_id": s}));
    assert_eq!(list["schedules"][0]["occurrences"], 1, "{list}");
    assert_eq!(list["schedules"][0]["enabled"], false);
    // Disabled, its monitor settled: nothing more can fire, so the count is final.
    assert_eq!(
        prompts_of(&mut c, &s, &sid).len(),
        1,
        "a one-shot fired twice"
    );
}

#[test]
fn a_recurring_schedule_fires_exactly_max_occurrences_times() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    let (sid, monitor) = create(
        &mut c,
        json!({"session_id": s, "every_ms": 100, "max_occurrences": 3, "action": {"prompt": "tick"}}),
    );
    c.wait_push(15 * SEC, "monitor done", is_update(&monitor, "succeeded"));
    // The monitor has settled: nothing more can fire, so the count is final.
    let prompts = prompts_of(&mut c, &s, &sid);
    let texts: HashSet<String> = prompts.iter().cloned().collect();
    assert_eq!(prompts.len(), 3, "{prompts:#?}");
    assert_eq!(texts.len(), 3, "each occurrence is distinct");
    for n in 1..=3 {
        assert!(
            texts
                .iter()
                .any(|t| t.contains(&format!("occurrence {n})"))),
            "occurrence {n} missing: {texts:?}"
        );
    }
}

#[test]
fn a_prompt_waits_durably_for_a_route() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let (_, monitor) = create(
        &mut c,
        json!({"session_id": s, "delay_ms": 0, "action": {"prompt": "are you there"}}),
    );
    // Another session, subscribed, with a prompt due after the first: once it has fired,
    // the scheduler has looked at the first one too, and left it for lack of a route.
    let mut other = d.client();
    let routed = d.open_session(&mut other);
    other.ok("events.subscribe", json!({"session_ids": [routed]}));
    create(
        &mut other,
        json!({"session_id": routed, "delay_ms": 0, "action": {"prompt": "routed"}}),
    );
    other.wait_push(10 * SEC, "the routed prompt", is_schedule_prompt);
    // Nobody is subscribed to the first: the occurrence stays due, the monitor stays armed.
    let t = c.task(&monitor);
    assert_eq!(t["state"], "scheduled", "{t}");
    assert!(
        c.ok("inbox.list", json!({"session_id": s}))["notifications"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    let n = c.wait_push(10 * SEC, "prompt once a route exists", is_schedule_prompt);
    assert!(n["params"]["notification"]["text"]
        .as_str()
        .unwrap()
        .contains("are you there"));
}

#[test]
fn a_scheduled_call_starts_a_task_whose_completion_wakes() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    let (_, monitor) = create(
        &mut c,
        json!({"session_id": s, "delay_ms": 50, "action": {"call": {"tool": "bash", "args": {"command": "echo from-schedule"}}}}),
    );
    let n = c.wait_push(10 * SEC, "wake of the scheduled run", |m| {
        m["method"] == "notification" && m["params"]["notification"]["kind"] == "wake"
    });
    let task_id = n["params"]["notification"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let t = c.ok("task.get", json!({"task_id": task_id}));
    assert_eq!(t["parent_task_id"], monitor.as_str(), "{t}");
    assert_eq!(t["state"], "succeeded");
    assert!(n["params"]["notification"]["text"]
        .as_str()
        .unwrap()
        .contains("from-schedule"));
}

#[test]
fn cancelling_a_schedule_disarms_it_and_its_monitor() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    let (sid, monitor) = create(
        &mut c,
        json!({"session_id": s, "every_ms": 60_000, "action": {"prompt": "hourly"}}),
    );
    let r = c.ok("schedule.cancel", json!({"schedule_id": sid}));
    assert_eq!(r["result"], "disarmed");
    assert_eq!(
        c.ok("task.get", json!({"task_id": monitor}))["state"],
        "canceled"
    );
    let (_, monitor2) = create(
        &mut c,
        json!({"session_id": s, "every_ms": 60_000, "action": {"prompt": "again"}}),
    );
    assert_eq!(
        c.ok("task.cancel", json!({"task_id": monitor2}))["result"],
        "disarmed"
    );
    assert_eq!(
        c.ok("task.cancel", json!({"task_id": monitor2}))["result"],
        "already_terminal"
    );
    let st = c.ok("session.status", json!({"session_id": s}));
    assert_eq!(st["scheduled"], 0, "{st}");
}

#[test]
fn bad_schedules_are_refused_with_the_reason() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    for (params, needle) in [
        (
            json!({"session_id": s, "action": {"prompt": "x"}}),
            "exactly one",
        ),
        (
            json!({"session_id": s, "delay_ms": 1, "every_ms": 100, "action": {"prompt": "x"}}),
            "exactly one",
        ),
        (
            json!({"session_id": s, "cron": "61 * * * *", "action": {"prompt": "x"}}),
            "minute",
        ),
        (
            json!({"session_id": s, "cron": "* * * * *", "timezone": "Mars/Olympus", "action": {"prompt": "x"}}),
            "timezone",
        ),
        (
            json!({"session_id": s, "at": "tomorrow", "action": {"prompt": "x"}}),
            "RFC 3339",
        ),
        (
            json!({"session_id": s, "delay_ms": 1, "action": {"call": {"tool": "nope"}}}),
            "unknown tool",
        ),
        (
            json!({"session_id": s, "delay_ms": 1, "action": {"wave": "x"}}),
            "schedule.create",
        ),
    ] {
        let e = c
            .call("schedule.create", params.clone())
            .expect_err("must be refused");
        assert_eq!(e["code"], -32602, "{params}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{params}: {e}"
        );
    }
    let e = c
        .call(
            "schedule.cancel",
            json!({"schedule_id": "01M8MR3A0TN9KQ05938VNEWNRX"}),
        )
        .unwrap_err();
    assert_eq!(e["code"], -32001);
}

#[test]
fn a_claim_left_by_a_dead_daemon_is_taken_over_after_its_lease_and_fires_once() {
    let mut d = Daemon::start_with_config("schedule_lease_ms = 30000\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let (sid, monitor) = create(
        &mut c,
        json!({"session_id": s, "delay_ms": 0, "action": {"prompt": "taken over"}}),
    );
    d.kill9();
    // A daemon that died holding the claim: its lease runs 1.5 s more.
    let db = rusqlite::Connection::open(d.state_dir.join("sidejob.db")).unwrap();
    let now: i64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    db.execute("UPDATE schedules SET claimed_by = 'dead-daemon', lease_until_ms = ?1 WHERE schedule_id = ?2", rusqlite::params![now + 1500, sid]).unwrap();
    drop(db);
    d.restart();
    let mut h = d.client();
    h.ok("events.subscribe", json!({"session_ids": [s]}));
    let n = h.wait_push(15 * SEC, "fired after the lease", is_schedule_prompt);
    let created =
        humantime::parse_rfc3339(n["params"]["notification"]["created_at"].as_str().unwrap())
            .unwrap();
    let created_ms = created
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        created_ms >= now + 1500,
        "fired {} ms before the other daemon's lease ran out",
        now + 1500 - created_ms
    );
    h.wait_push(10 * SEC, "monitor done", is_update(&monitor, "succeeded"));
    assert_eq!(prompts_of(&mut h, &s, &sid).len(), 1, "fired twice");
    // The direct edit above is not in the event log; everything sidejob wrote is.
}

#[test]
fn occurrences_missed_while_down_follow_catch_up() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mut ids = Vec::new();
    for mode in ["once", "skip", "all"] {
        let (sid, _) = create(
            &mut c,
            json!({"session_id": s, "every_ms": 600_000, "catch_up": mode, "action": {"prompt": mode}}),
        );
        ids.push((mode, sid));
    }
    d.kill9();
    // As if the daemon had been down for 25 min of a schedule every 10 min: two occurrences
    // of each fell due meanwhile (nobody was subscribed before, so none fired), and the next
    // regular one is 5 min away.
    let db = rusqlite::Connection::open(d.state_dir.join("sidejob.db")).unwrap();
    let now: i64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let anchor = now - 1_500_000;
    for (_, sid) in &ids {
        let trigger =
            json!({"kind": "every", "every_ms": 600_000, "anchor_ms": anchor}).to_string();
        db.execute(
            "UPDATE schedules SET trigger = ?1, next_due_ms = ?2 WHERE schedule_id = ?3",
            rusqlite::params![trigger, anchor + 600_000, sid],
        )
        .unwrap();
    }
    drop(db);
    d.restart();
    let mut h = d.client();
    h.ok("events.subscribe", json!({"session_ids": [s]}));
    // Catch-up is over once every schedule points at its next regular occurrence, 5 min
    // away: the counts are final then.
    let regular = anchor + 3 * 600_000;
    for (mode, sid) in &ids {
        assert!(
            sidejob_tests::wait_until(20 * SEC, || {
                h.ok("schedule.list", json!({"session_id": s}))["schedules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| {
                        x["schedule_id"] == sid.as_str()
                            && x["next_due_at"].as_str().is_some_and(|n| {
                                humantime::parse_rfc3339(n).unwrap()
                                    >= std::time::UNIX_EPOCH + Duration::from_millis(regular as u64)
                            })
                    })
            }),
            "catch_up {mode} did not finish"
        );
    }
    let expected = [("once", 1), ("skip", 0), ("all", 2)];
    for ((mode, sid), (_, want)) in ids.iter().zip(expected) {
        assert_eq!(prompts_of(&mut h, &s, sid).len(), want, "catch_up {mode}");
    }
}

#[test]
fn disarming_while_an_occurrence_winds_down_is_cancellation_pending() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    // Each occurrence runs a command that ignores SIGTERM, so it winds down only at SIGKILL.
    let (sid, monitor) = create(
        &mut c,
        json!({"session_id": s, "every_ms": 1000,
               "action": {"call": {"tool": "bash", "args": {"command": "trap '' TERM; echo started; sleep 30"}}}}),
    );
    // Wait for the first occurrence's run to be running.
    let run = c.wait_push(10 * SEC, "the occurrence's run", |m| {
        m["method"] == "task.updated"
            && m["params"]["task"]["parent_task_id"] == monitor.as_str()
            && m["params"]["task"]["state"] == "running"
    });
    let run_id = run["params"]["task"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Its SIGTERM trap is set once it has printed.
    assert!(sidejob_tests::wait_until(10 * SEC, || c
        .output(&run_id)
        .contains("started")));
    let r = c.ok("schedule.cancel", json!({"schedule_id": sid}));
    assert_eq!(r["result"], "cancellation_pending", "{r}");
    assert_eq!(
        c.ok("task.get", json!({"task_id": monitor}))["state"],
        "canceled"
    );
    // The run still ends: SIGKILL after the grace.
    let t = c.wait_settled(&run_id);
    assert_eq!(t["state"], "canceled", "{t}");
    assert_eq!(
        c.ok("schedule.cancel", json!({"schedule_id": sid}))["result"],
        "disarmed"
    );
}
