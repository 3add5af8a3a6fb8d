//! Sessions and concurrency (docs/protocol.md): closing cancels, bounds queue, status shows it.

use std::time::Duration;

use serde_json::json;
use sidejob_tests::{pids_running, unique_sleep, wait_until, Client, Daemon};

/// Waits until the task's supervisor has started (state `running`).
fn wait_running(c: &mut Client, id: &str) {
    let mut t = serde_json::Value::Null;
    assert!(
        wait_until(Duration::from_secs(10), || {
            t = c.task(id);
            t["state"] == "running"
        }),
        "{t}"
    );
}

#[test]
fn closing_a_session_cancels_its_live_tasks() {
    let d = Daemon::start_with_config("cancel_grace_ms = 300\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mark = unique_sleep();
    let r = c.bash(&s, &format!("sleep {mark}"), json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    assert!(wait_until(Duration::from_secs(10), || pids_running(
        &format!("sleep {mark}")
    )
    .len()
        == 1));
    let closed = c.ok("session.close", json!({"session_id": s}));
    assert_eq!(closed["closed"], true);
    assert_eq!(closed["canceled_tasks"], json!([id]), "{closed}");
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "canceled", "{t}");
    assert!(pids_running(&format!("sleep {mark}")).is_empty());
}

#[test]
fn closing_a_parent_session_cancels_its_childrens_tasks() {
    let d = Daemon::start_with_config("cancel_grace_ms = 300\n");
    let mut c = d.client();
    let parent = d.open_session(&mut c);
    let child = c.ok(
        "session.open",
        json!({"workspace": d.workspace, "parent_session_id": parent}),
    )["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let r = c.bash(&child, "sleep 30", json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    c.ok("session.close", json!({"session_id": parent}));
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "canceled", "{t}");
    let (code, kind) = c.err(
        "tool.call",
        json!({"session_id": child, "tool": "bash", "args": {"command": "true"}}),
    );
    assert_eq!(
        (code, kind.as_str()),
        (-32005, "invalid_state"),
        "the child is closed too"
    );
}

#[test]
fn opens_of_one_new_session_at_once_all_succeed() {
    // Two `sidejob call`s started together in one directory open its session at once; both
    // found it missing, and the second one's insert failed ("UNIQUE constraint failed").
    let d = Daemon::start();
    for round in 0..10 {
        let id = format!("together-{round}");
        let barrier = std::sync::Barrier::new(6);
        let answers: Vec<Result<serde_json::Value, serde_json::Value>> =
            std::thread::scope(|scope| {
                let joins: Vec<_> = (0..6)
                    .map(|_| {
                        let (d, id, barrier) = (&d, &id, &barrier);
                        scope.spawn(move || {
                            let mut c = d.client();
                            barrier.wait();
                            c.call(
                                "session.open",
                                json!({"session_id": id, "workspace": d.workspace}),
                            )
                        })
                    })
                    .collect();
                joins.into_iter().map(|j| j.join().unwrap()).collect()
            });
        for a in &answers {
            let ok = a.as_ref().unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(ok["session_id"], id.as_str(), "{ok}");
        }
    }
}

#[test]
fn a_closed_session_can_be_reopened() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    c.ok("session.close", json!({"session_id": s}));
    let again = c.ok(
        "session.open",
        json!({"session_id": s, "workspace": d.workspace}),
    );
    assert_eq!(again["session_id"], s.as_str());
    let r = c.bash(&s, "echo back", json!({}));
    assert_eq!(r["output"], "back\n");
}

#[test]
fn reopening_a_session_with_another_session_dir_is_refused() {
    let d = Daemon::start();
    let mut c = d.client();
    let opened = c.ok(
        "session.open",
        json!({"session_id": "sd", "workspace": d.workspace}),
    );
    let other = d.root.path().join("elsewhere");
    let (code, kind) = c.err(
        "session.open",
        json!({"session_id": "sd", "workspace": d.workspace, "session_dir": other}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    assert!(!other.exists(), "nothing is made for the refused directory");
    // Naming the session's own directory (or none) reopens it.
    let again = c.ok(
        "session.open",
        json!({"session_id": "sd", "workspace": d.workspace, "session_dir": opened["session_dir"]}),
    );
    assert_eq!(again["session_dir"], opened["session_dir"]);
}

#[test]
fn calls_above_the_concurrency_bound_wait_as_queued() {
    let d = Daemon::start_with_config("max_running = 1\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let first = c.bash(&s, "sleep 30", json!({"background": true}));
    let first = first["task_id"].as_str().expect("id").to_owned();
    wait_running(&mut c, &first);
    let second = c.bash(&s, "echo second", json!({"background": true}));
    let second = second["task_id"].as_str().expect("id").to_owned();
    let t = c.wait_for(&second, 300);
    assert_eq!(t["state"], "queued", "{t}");
    let st = c.ok("session.status", json!({"session_id": s}));
    assert_eq!(st["queued"], 1, "{st}");
    assert_eq!(st["running"], 1, "{st}");
    assert_eq!(st["active"], true);
    c.ok("task.cancel", json!({"task_id": first, "grace_ms": 100}));
    let t = c.wait_settled(&second);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&second), "second\n");
    let st = c.ok("session.status", json!({"session_id": s}));
    assert_eq!(
        (st["queued"].as_u64(), st["running"].as_u64()),
        (Some(0), Some(0)),
        "{st}"
    );
}

#[test]
fn canceling_a_queued_task_cancels_it_at_once() {
    let d = Daemon::start_with_config("max_running = 1\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let first = c.bash(&s, "sleep 30", json!({"background": true}));
    wait_running(&mut c, first["task_id"].as_str().expect("id"));
    let queued = c.bash(&s, "echo never", json!({"background": true}));
    let queued = queued["task_id"].as_str().expect("id").to_owned();
    assert_eq!(c.task(&queued)["state"], "queued");
    let res = c.ok("task.cancel", json!({"task_id": queued}));
    assert_eq!(res["result"], "canceled", "{res}");
    assert_eq!(c.task(&queued)["state"], "canceled");
    c.ok(
        "task.cancel",
        json!({"task_id": first["task_id"], "grace_ms": 100}),
    );
    // The canceled queued task never runs.
    let t = c.wait_settled(&queued);
    assert_eq!(t["state"], "canceled");
    assert_eq!(c.output(&queued), "");
}

#[test]
fn a_session_outlives_the_connection_that_opened_it() {
    let d = Daemon::start();
    let s = {
        let mut c = d.client();
        d.open_session(&mut c)
    };
    let mut c = d.client();
    let r = c.bash(&s, "echo later", json!({}));
    assert_eq!(r["output"], "later\n");
    let list = c.ok("session.list", json!({}));
    assert!(list["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .any(|x| x["session_id"] == s.as_str()));
}

#[test]
fn queued_calls_start_in_the_order_they_were_made() {
    let d = Daemon::start_with_config("max_running = 1\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let ids: Vec<String> = (0..6)
        .map(|i| {
            let r = c.bash(
                &s,
                &format!("echo {i}; sleep 0.05"),
                json!({"background": true}),
            );
            r["task_id"].as_str().expect("id").to_owned()
        })
        .collect();
    let mut started = Vec::new();
    for id in &ids {
        let t = c.wait_settled(id);
        assert_eq!(t["state"], "succeeded", "{t}");
        started.push((
            t["started_at"].as_str().expect("started_at").to_owned(),
            id.clone(),
        ));
    }
    let mut by_start = started.clone();
    by_start.sort();
    assert_eq!(
        by_start.iter().map(|(_, id)| id).collect::<Vec<_>>(),
        ids.iter().collect::<Vec<_>>(),
        "a queue runs first come, first served: {started:?}"
    );
}

#[test]
fn session_open_is_idempotent_for_the_same_workspace_and_refuses_another() {
    let d = Daemon::start();
    let mut c = d.client();
    let a = c.ok(
        "session.open",
        json!({"session_id": "same", "workspace": d.workspace}),
    );
    let b = c.ok(
        "session.open",
        json!({"session_id": "same", "workspace": d.workspace}),
    );
    assert_eq!(a, b);
    let other = d.root.path().join("other-ws");
    std::fs::create_dir_all(&other).expect("dir");
    let (code, kind) = c.err(
        "session.open",
        json!({"session_id": "same", "workspace": other}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
}

#[test]
fn session_open_refuses_bad_workspaces_and_a_session_dir_inside_the_workspace() {
    let d = Daemon::start();
    let mut c = d.client();
    for ws in [json!("relative/dir"), json!("/no/such/dir"), json!(42)] {
        let (code, kind) = c.err("session.open", json!({"workspace": ws}));
        assert_eq!((code, kind.as_str()), (-32602, "invalid_params"), "{ws}");
    }
    // Under a directory the run's view makes anew: said at once, not by every run failing.
    let shm = std::path::Path::new("/dev/shm").join(format!("sidejob-ws-{}", std::process::id()));
    std::fs::create_dir_all(&shm).expect("a directory in /dev/shm");
    let refused = c.call("session.open", json!({"workspace": shm}));
    std::fs::remove_dir(&shm).expect("remove it");
    let e = refused.expect_err("a workspace under /dev");
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"].as_str().unwrap_or("").contains("under /dev"),
        "{e}"
    );
    let inside = d.workspace.join("sessions-here");
    let (code, kind) = c.err(
        "session.open",
        json!({"workspace": d.workspace, "session_dir": inside}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
    let (code, kind) = c.err(
        "session.open",
        json!({"workspace": d.workspace, "profile": "no-such-profile"}),
    );
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
}

#[test]
fn closing_a_session_without_cancel_lets_its_tasks_finish() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The task can only finish after the session is closed: it waits for the gate.
    let gate = sidejob_tests::Gate::new(&d.workspace, "finish");
    let r = c.bash(
        &s,
        &format!("{}; echo finished", gate.wait_cmd()),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    let closed = c.ok("session.close", json!({"session_id": s, "cancel": false}));
    assert_eq!(closed["canceled_tasks"], json!([]), "{closed}");
    gate.open();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id), "finished\n");
}
