//! Schedule triggers through the daemon: `at` and `cron` fire, cron follows its time zone
//! across daylight-saving changes, and `catch_up` applies to `at` and `cron` occurrences
//! missed while the daemon was down. Counts are taken at the end, once nothing more can fire
//! (the monitor has settled, or every schedule's next occurrence is far in the future).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sidejob_tests::{wait_until, Client, Daemon};

const SEC: Duration = Duration::from_secs(1);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms as u64)).to_string()
}

fn ms_of(rfc: &str) -> i64 {
    humantime::parse_rfc3339(rfc)
        .unwrap_or_else(|e| panic!("{rfc}: {e}"))
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn create(c: &mut Client, params: Value) -> (String, String) {
    let r = c.ok("schedule.create", params);
    (
        r["schedule_id"].as_str().unwrap().to_owned(),
        r["task_id"].as_str().unwrap().to_owned(),
    )
}

/// The schedule prompts in the inbox (the durable record), per schedule id.
fn prompts_of(c: &mut Client, session: &str, schedule: &str) -> Vec<Value> {
    c.ok("inbox.list", json!({"session_id": session}))["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| {
            n["kind"] == "schedule"
                && n["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(&format!("schedule {schedule},")))
        })
        .cloned()
        .collect()
}

fn schedule_info(c: &mut Client, session: &str, schedule: &str) -> Value {
    c.ok("schedule.list", json!({"session_id": session}))["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["schedule_id"] == schedule)
        .cloned()
        .unwrap_or_else(|| panic!("schedule {schedule} is not listed"))
}

/// Rewrites when a schedule is next due, in the registry, with the daemon down (or not
/// looking: the scheduler reads the registry again when routes change).
fn set_next_due(d: &Daemon, schedule: &str, due_ms: i64) {
    let db = rusqlite::Connection::open(d.state_dir.join("sidejob.db")).unwrap();
    db.execute(
        "UPDATE schedules SET next_due_ms = ?1 WHERE schedule_id = ?2",
        rusqlite::params![due_ms, schedule],
    )
    .unwrap();
}

/// The `next_due_ms` each occurrence of a schedule recorded, in order (from the event log).
fn recorded_next_dues(d: &Daemon, schedule: &str) -> Vec<Option<i64>> {
    let db = rusqlite::Connection::open(d.state_dir.join("sidejob.db")).unwrap();
    let mut stmt = db
        .prepare(
            "SELECT patch FROM events WHERE kind = 'schedule.fired' AND entity_id = ?1 ORDER BY seq",
        )
        .unwrap();
    stmt.query_map([schedule], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|p| {
            let p: Value = serde_json::from_str(&p.unwrap()).unwrap();
            p["next_due_ms"].as_i64()
        })
        .collect()
}

#[test]
fn an_at_schedule_fires_once_at_its_time() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    let at = now_ms() + 300;
    let (sid, monitor) = create(
        &mut c,
        json!({"session_id": s, "at": rfc3339(at), "action": {"prompt": "at its time"}}),
    );
    let n = c.wait_push(20 * SEC, "the prompt", |m| {
        m["method"] == "notification" && m["params"]["notification"]["kind"] == "schedule"
    });
    let created = ms_of(n["params"]["notification"]["created_at"].as_str().unwrap());
    assert!(created >= at, "fired {} ms early", at - created);
    let t = c.wait_settled_quietly(&monitor);
    assert_eq!(t["state"], "succeeded", "{t}");
    // The monitor is done, so nothing more can fire: count now.
    assert_eq!(prompts_of(&mut c, &s, &sid).len(), 1);
    assert_eq!(schedule_info(&mut c, &s, &sid)["enabled"], false);
}

#[test]
fn a_cron_schedule_fires_through_the_daemon_and_advances_to_its_next_match() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // Every five minutes; nobody is subscribed yet, so nothing fires.
    let (sid, _) = create(
        &mut c,
        json!({"session_id": s, "cron": "*/5 * * * *", "action": {"prompt": "five"}}),
    );
    let first = ms_of(
        schedule_info(&mut c, &s, &sid)["next_due_at"]
            .as_str()
            .unwrap(),
    );
    assert_eq!(first % 300_000, 0, "a */5 minute: {}", rfc3339(first));
    assert!(first > now_ms() && first <= now_ms() + 300_000);
    // Rather than wait up to five minutes: the occurrence is due now (the daemon started
    // before it, so it is no missed one). A subscription makes the scheduler look again.
    let due = now_ms() - 1;
    set_next_due(&d, &sid, due);
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    let n = c.wait_push(20 * SEC, "the cron prompt", |m| {
        m["method"] == "notification" && m["params"]["notification"]["kind"] == "schedule"
    });
    assert!(n["params"]["notification"]["text"]
        .as_str()
        .unwrap()
        .contains("five"));
    // It advanced to the next */5 minute strictly after the occurrence it fired.
    let info = schedule_info(&mut c, &s, &sid);
    assert_eq!(info["occurrences"], 1, "{info}");
    let next = ms_of(info["next_due_at"].as_str().unwrap());
    let expected = (due / 300_000 + 1) * 300_000;
    assert_eq!(rfc3339(next), rfc3339(expected), "{info}");
    assert_eq!(prompts_of(&mut c, &s, &sid).len(), 1);
}

/// `30 2 * * *` in Europe/Berlin across both changes of 2026: on 29 March 02:30 does not
/// exist (it fires once, at 03:30 summer time), on 25 October it exists twice (it fires once,
/// at the first). Replayed with `catch_up: all` from occurrences long past, so the daemon
/// computes each next occurrence itself; the event log records each one.
#[test]
fn a_cron_schedule_fires_once_a_day_across_daylight_saving_changes() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mut ids = Vec::new();
    for start in [1_774_661_400_000i64, 1_792_801_800_000] {
        // 2026-03-28 02:30 CET, 2026-10-24 02:30 CEST.
        let (sid, monitor) = create(
            &mut c,
            json!({"session_id": s, "cron": "30 2 * * *", "timezone": "Europe/Berlin",
                   "catch_up": "all", "max_occurrences": 3, "action": {"prompt": "nightly"}}),
        );
        ids.push((sid, monitor, start));
    }
    d.kill9();
    for (sid, _, start) in &ids {
        set_next_due(&d, sid, *start);
    }
    d.restart();
    let mut c = d.client();
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    for (_, monitor, _) in &ids {
        let t = c.wait_settled_quietly(monitor);
        assert_eq!(t["state"], "succeeded", "{t}");
    }
    let spring = recorded_next_dues(&d, &ids[0].0);
    assert_eq!(
        spring,
        [
            // 29 March: 02:30 falls in the gap; 03:30 CEST (01:30 UTC).
            Some(1_774_747_800_000),
            // 30 March: 02:30 CEST (00:30 UTC).
            Some(1_774_830_600_000),
            None,
        ],
        "{:?}",
        spring.iter().map(|m| m.map(rfc3339)).collect::<Vec<_>>()
    );
    let autumn = recorded_next_dues(&d, &ids[1].0);
    assert_eq!(
        autumn,
        [
            // 25 October: the first 02:30 (CEST, 00:30 UTC), not the repeated one.
            Some(1_792_888_200_000),
            // 26 October: 02:30 CET (01:30 UTC).
            Some(1_792_978_200_000),
            None,
        ],
        "{:?}",
        autumn.iter().map(|m| m.map(rfc3339)).collect::<Vec<_>>()
    );
    for (sid, _, _) in &ids {
        assert_eq!(prompts_of(&mut c, &s, sid).len(), 3);
    }
}

/// An `at` occurrence that fell due while the daemon was down: `once` and `all` deliver it
/// once, `skip` drops it; every monitor settles.
#[test]
fn an_at_occurrence_missed_while_down_follows_catch_up() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // Nobody is subscribed, so nothing fires before the daemon dies.
    let at = now_ms() + 200;
    let mut ids = Vec::new();
    for mode in ["once", "all", "skip"] {
        let (sid, monitor) = create(
            &mut c,
            json!({"session_id": s, "at": rfc3339(at), "catch_up": mode, "action": {"prompt": mode}}),
        );
        ids.push((mode, sid, monitor));
    }
    d.kill9();
    assert!(wait_until(10 * SEC, || now_ms() > at));
    d.restart();
    let mut c = d.client();
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    for (mode, sid, monitor) in &ids {
        let t = c.wait_settled_quietly(monitor);
        assert_eq!(t["state"], "succeeded", "{mode}: {t}");
        let want = if *mode == "skip" { 0 } else { 1 };
        assert_eq!(prompts_of(&mut c, &s, sid).len(), want, "catch_up {mode}");
    }
}

/// Cron occurrences missed while down: `once` delivers one, `skip` none, `all` every one (up
/// to `max_occurrences`); the next regular occurrence is a year away, so the count is final
/// once every schedule points there.
#[test]
fn cron_occurrences_missed_while_down_follow_catch_up() {
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mut ids = Vec::new();
    for mode in ["once", "skip", "all"] {
        let mut p = json!({"session_id": s, "cron": "0 0 1 1 *", "catch_up": mode,
                           "action": {"prompt": mode}});
        if mode == "all" {
            p["max_occurrences"] = json!(2);
        }
        let (sid, monitor) = create(&mut c, p);
        ids.push((mode, sid, monitor));
    }
    d.kill9();
    // Down since before 1 January 2024: every New Year since fell due meanwhile.
    for (_, sid, _) in &ids {
        set_next_due(&d, sid, 1_704_067_200_000);
    }
    let restarted = now_ms();
    d.restart();
    let mut c = d.client();
    c.ok("events.subscribe", json!({"session_ids": [s]}));
    let settled = |c: &mut Client, mode: &str, sid: &str, monitor: &str| {
        if mode == "all" {
            c.task(monitor)["state"] == "succeeded"
        } else {
            let info = schedule_info(c, &s, sid);
            info["next_due_at"]
                .as_str()
                .is_some_and(|n| ms_of(n) > restarted)
        }
    };
    for (mode, sid, monitor) in &ids {
        assert!(
            wait_until(20 * SEC, || settled(&mut c, mode, sid, monitor)),
            "catch_up {mode} did not finish: {}",
            schedule_info(&mut c, &s, sid)
        );
    }
    for ((mode, sid, _), want) in ids.iter().zip([1, 0, 2]) {
        assert_eq!(prompts_of(&mut c, &s, sid).len(), want, "catch_up {mode}");
    }
}
