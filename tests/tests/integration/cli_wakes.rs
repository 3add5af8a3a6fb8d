//! `sidejob inbox`, `sidejob schedule` and `sidejob events` against a real daemon.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{sidejob_bin, Daemon, Lines};

fn stdout(o: &std::process::Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn inbox_lists_and_acks_wakes() {
    let d = Daemon::start();
    let out = stdout(&d.cli(&["call", "--background", "--json", "--", "echo for-the-inbox"]));
    let task: Value = serde_json::from_str(&out).unwrap();
    let id = task["task_id"].as_str().unwrap().to_owned();
    let mut c = d.client();
    c.wait_settled_quietly(&id);
    let listed = stdout(&d.cli(&["inbox", "--unread"]));
    assert!(
        listed.contains("(unread)") && listed.contains(&id),
        "{listed}"
    );
    let acked = d.cli(&["inbox", "--unread", "--ack"]);
    assert!(
        String::from_utf8_lossy(&acked.stderr).contains("acked 1"),
        "{acked:?}"
    );
    assert_eq!(
        stdout(&d.cli(&["inbox", "--unread"])).trim(),
        "inbox is empty"
    );
    let all: Value = serde_json::from_str(&stdout(&d.cli(&["inbox", "--json"]))).unwrap();
    assert_eq!(all["notifications"][0]["acked"], true, "{all}");
}

#[test]
fn schedule_add_list_and_cancel() {
    let d = Daemon::start();
    let added: Value = serde_json::from_str(&stdout(&d.cli(&[
        "schedule",
        "add",
        "--every",
        "1h",
        "--prompt",
        "hourly check",
        "--json",
    ])))
    .unwrap();
    let sid = added["schedule_id"].as_str().unwrap().to_owned();
    let listed = stdout(&d.cli(&["schedule", "list"]));
    assert!(
        listed.contains(&sid) && listed.contains("armed"),
        "{listed}"
    );
    let canceled = stdout(&d.cli(&["schedule", "cancel", &sid]));
    assert_eq!(canceled.trim(), format!("{sid} disarmed"));
    let listed = stdout(&d.cli(&["schedule", "list"]));
    assert!(listed.contains("disarmed"), "{listed}");
    let bad = d.cli(&["schedule", "add", "--cron", "99 * * * *", "--prompt", "x"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("minute"),
        "{bad:?}"
    );
}

#[test]
fn events_follows_task_changes_and_wakes() {
    let d = Daemon::start();
    let mut c = d.client();
    // The CLI's session for this directory, so `events` without --session sees it.
    let s = c.ok(
        "session.open",
        json!({"session_id": "watched", "workspace": d.workspace}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut child = Command::new(sidejob_bin())
        .args(["--socket"])
        .arg(&d.socket)
        .args(["events", "--json", "--session", &s])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read on threads of their own: a CLI that goes quiet fails the test instead of hanging it.
    let err = Lines::spawn(child.stderr.take().unwrap());
    let out = Lines::spawn(child.stdout.take().unwrap());
    // It prints "following events" on stderr once subscribed.
    let line = err
        .next_within(Duration::from_secs(20), "the subscription")
        .unwrap_or_default();
    let kill = |child: &mut std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
    };
    if !line.contains("following events") {
        kill(&mut child);
        panic!("{line}");
    }
    let t = c.bash(&s, "echo watched", json!({"background": true}))["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (mut saw_update, mut saw_wake) = (false, false);
    while !(saw_update && saw_wake) {
        let Some(l) = out.next_within(Duration::from_secs(20), "the task's update and wake") else {
            break;
        };
        let m: Value = serde_json::from_str(&l).unwrap();
        saw_update |= m["method"] == "task.updated"
            && m["params"]["task"]["task_id"] == t.as_str()
            && m["params"]["task"]["state"] == "succeeded";
        saw_wake |=
            m["method"] == "notification" && m["params"]["notification"]["task_id"] == t.as_str();
    }
    kill(&mut child);
    assert!(saw_update && saw_wake, "the stream ended first");
}
