//! The inbox and routes: `inbox.ack` checks every id before it acks any, and a subscription
//! without `session_ids` routes every session the caller owns, also ones opened later.

use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::push::is_notification_for;
use sidejob_tests::{Client, Daemon, UNKNOWN_TASK_ID};

const SEC: Duration = Duration::from_secs(1);

fn background(c: &mut Client, s: &str, cmd: &str) -> String {
    let r = c.bash(s, cmd, json!({"background": true}));
    assert_eq!(r["status"], "running", "{r}");
    r["task_id"].as_str().expect("task id").to_owned()
}

fn unread_ids(c: &mut Client, s: &str) -> Vec<String> {
    let mut ids: Vec<String> = c.ok("inbox.list", json!({"session_id": s, "unread_only": true}))
        ["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

#[test]
fn inbox_ack_with_one_unknown_id_among_good_ones_acks_nothing() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    for cmd in ["echo one", "echo two"] {
        let t = background(&mut c, &s, cmd);
        c.wait_settled_quietly(&t);
    }
    let good = unread_ids(&mut c, &s);
    assert_eq!(good.len(), 2, "two wakes: {good:?}");
    // A well-formed notification id that no daemon issued, between the two good ones.
    let ids = json!([good[0], UNKNOWN_TASK_ID, good[1]]);
    let (code, kind) = c.err("inbox.ack", json!({"ids": ids}));
    assert_eq!((code, kind.as_str()), (-32001, "not_found"));
    assert_eq!(
        unread_ids(&mut c, &s),
        good,
        "a refused ack must ack nothing"
    );
    // The good ones alone are acked.
    let acked = c.ok("inbox.ack", json!({"ids": good}));
    let mut got: Vec<String> = serde_json::from_value(acked["acked"].clone()).unwrap();
    got.sort();
    assert_eq!(got, good, "{acked}");
    assert!(unread_ids(&mut c, &s).is_empty());
}

#[test]
fn events_subscribe_without_session_ids_routes_every_session_of_the_caller() {
    let d = Daemon::start();
    let mut c = d.client();
    let a = d.open_session(&mut c);
    let b = d.open_session(&mut c);
    let mut host = d.client();
    let r = host.ok("events.subscribe", json!({}));
    assert!(r["seq"].is_i64(), "{r}");
    // A session opened after the subscription is routed too.
    let later = d.open_session(&mut c);
    let tasks: Vec<(String, String)> = [&a, &b, &later]
        .into_iter()
        .map(|s| (s.clone(), background(&mut c, s, &format!("echo in-{s}"))))
        .collect();
    let mut got: Vec<Value> = Vec::new();
    for (s, t) in &tasks {
        let n = host.wait_push(
            30 * SEC,
            &format!("the wake of {s}"),
            is_notification_for(t),
        );
        assert_eq!(n["params"]["notification"]["session_id"], s.as_str(), "{n}");
        got.push(n);
    }
    assert_eq!(got.len(), 3);
}
