//! Exactly-once delivery (docs/protocol.md) and `task.wait`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sidejob_tests::{wait_until, Client, Daemon};

/// What the client saw of one call.
enum Seen {
    /// `tool.call` answered `completed`.
    Inline,
    /// `tool.call` answered `running`, and then a `task.wait` received the result.
    Waited(Value),
    /// `tool.call` answered `running`; nobody has received the result yet.
    Unclaimed,
}

/// ≥ 200 calls whose run time straddles `yield_after_ms`: every result is delivered exactly
/// once, and the recorded delivery matches what the client saw.
#[test]
fn every_result_is_delivered_exactly_once_at_the_yield_boundary() {
    const THREADS: usize = 4;
    const CALLS: usize = 55;
    let d = Daemon::start();
    let mut setup = d.client();
    let session = d.open_session(&mut setup);
    let started = Instant::now();

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let mut c = d.client();
            let s = session.clone();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for i in 0..CALLS {
                    // 0 to 94 ms of sleep around a 50 ms yield (plus the spawn's own cost).
                    let ms = (i * 7 + t * 13) % 95;
                    let r = c.bash(
                        &s,
                        &format!("sleep 0.{ms:03}; echo run-{t}-{i}"),
                        // Silent: results nobody claims stay `pending` for this test to
                        // claim with task.wait (wakes are counted in wakes.rs).
                        json!({"yield_after_ms": 50, "wake": "silent"}),
                    );
                    let id = r["task_id"].as_str().expect("task_id").to_owned();
                    match r["status"].as_str() {
                        Some("completed") => {
                            assert_eq!(r["state"], "succeeded", "{r}");
                            assert_eq!(r["output"], format!("run-{t}-{i}\n"), "{r}");
                            seen.push((id, Seen::Inline));
                        }
                        Some("running") => {
                            // A running reply never carries the result.
                            assert!(r.get("state").is_none(), "{r}");
                            if i % 2 == 0 {
                                let w = c.wait_settled(&id);
                                seen.push((id, Seen::Waited(w)));
                            } else {
                                seen.push((id, Seen::Unclaimed));
                            }
                        }
                        _ => panic!("unexpected tool.call answer {r}"),
                    }
                }
                (seen, c)
            })
        })
        .collect();

    let mut all = Vec::new();
    let mut clients: Vec<Client> = Vec::new();
    for w in workers {
        let (seen, c) = w.join().expect("worker");
        all.extend(seen);
        clients.push(c);
    }
    let c = &mut setup;
    let (mut inline, mut waited, mut unclaimed) = (0, 0, 0);
    for (id, seen) in &all {
        match seen {
            Seen::Inline => {
                inline += 1;
                let t = c.task(id);
                assert_eq!(t["delivery"], "inline", "returned inline: {t}");
            }
            Seen::Waited(w) => {
                waited += 1;
                assert_eq!(w["state"], "succeeded", "{w}");
                assert_eq!(
                    w["delivery"], "wait",
                    "a running reply, then a wait that received the result: {w}"
                );
                assert_eq!(c.task(id)["delivery"], "wait");
            }
            Seen::Unclaimed => {
                unclaimed += 1;
                // Nobody has claimed it: once settled it stays pending (for a wake).
                let mut last = Value::Null;
                assert!(
                    wait_until(Duration::from_secs(20), || {
                        last = c.task(id);
                        last["state"] == "succeeded"
                    }),
                    "task never settled: {last}"
                );
                assert_eq!(last["delivery"], "pending", "{last}");
                // The first wait to look claims it; a second one sees the claim.
                let w = c.wait_for(id, 1_000);
                assert_eq!(w["delivery"], "wait", "{w}");
                let w2 = c.wait_for(id, 1_000);
                assert_eq!(w2["delivery"], "wait", "{w2}");
            }
        }
    }
    // Every task of the session was one of the calls, and each is terminal and delivered.
    let listed = c.ok("task.list", json!({"session_id": session}));
    let live = listed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter(|t| {
            !matches!(
                t["state"].as_str(),
                Some("succeeded" | "failed" | "canceled")
            )
        })
        .count();
    assert_eq!(live, 0, "{listed}");
    assert_eq!(all.len(), THREADS * CALLS);
    eprintln!(
        "{} calls in {:?}: {inline} inline, {waited} waited, {unclaimed} left pending",
        all.len(),
        started.elapsed()
    );
    assert!(
        inline > 0,
        "no call completed inline: the test did not straddle the boundary"
    );
    assert!(
        waited + unclaimed > 0,
        "no call yielded: the test did not straddle the boundary"
    );
}

#[test]
fn task_wait_returns_the_task_when_it_settles() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "sleep 0.4; exit 4", json!({"background": true}));
    let id = r["task_id"].as_str().expect("id");
    let started = Instant::now();
    let t = c.wait_for(id, 20_000);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "exit_code");
    assert_eq!(t["exit_code"], 4);
    assert_eq!(t["delivery"], "wait");
    assert!(
        t["ended_at"].as_str().is_some_and(|s| s.ends_with('Z')),
        "{t}"
    );
}

#[test]
fn task_wait_returns_the_live_task_at_its_timeout() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "sleep 30", json!({"background": true}));
    let id = r["task_id"].as_str().expect("id");
    let started = Instant::now();
    let t = c.wait_for(id, 400);
    let took = started.elapsed();
    assert_eq!(t["state"], "running", "{t}");
    assert!(t["delivery"].is_null(), "nothing delivered yet: {t}");
    assert!(
        took >= Duration::from_millis(380) && took < Duration::from_secs(3),
        "returned after {took:?}"
    );
    c.ok("task.cancel", json!({"task_id": id, "grace_ms": 100}));
}

#[test]
fn a_pending_result_goes_to_the_first_wait() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(
        &s,
        "echo quick",
        json!({"background": true, "wake": "silent"}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    let mut t = Value::Null;
    assert!(wait_until(Duration::from_secs(10), || {
        t = c.task(&id);
        t["state"] == "succeeded"
    }));
    assert_eq!(t["delivery"], "pending", "{t}");
    let w = c.wait_for(&id, 1_000);
    assert_eq!(w["state"], "succeeded");
    assert_eq!(w["delivery"], "wait", "{w}");
    assert_eq!(c.task(&id)["delivery"], "wait");
}

#[test]
fn a_result_whose_caller_hung_up_stays_pending() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // Send the call and hang up without reading the answer.
    {
        let mut gone = d.client();
        gone.send_value(&json!({"jsonrpc": "2.0", "id": 1, "method": "tool.call",
            "params": {"session_id": s, "tool": "bash", "args": {"command": "sleep 0.5; echo orphan"},
                       "yield_after_ms": 30_000, "wake": "silent"}}));
        let mut found = false;
        assert!(wait_until(Duration::from_secs(10), || {
            let list = c.ok("task.list", json!({"session_id": s}));
            found = list["tasks"].as_array().is_some_and(|t| !t.is_empty());
            found
        }));
    }
    let list = c.ok("task.list", json!({"session_id": s}));
    let id = list["tasks"][0]["task_id"].as_str().expect("id").to_owned();
    let mut t = Value::Null;
    assert!(wait_until(Duration::from_secs(10), || {
        t = c.task(&id);
        t["state"] == "succeeded"
    }));
    assert_eq!(
        t["delivery"], "pending",
        "nobody received it inline, so it is left for a wait or a wake: {t}"
    );
}

#[test]
fn a_hundred_detached_runs_all_settle_with_their_own_results() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let ids: Vec<String> = (0..100)
        .map(|i| {
            let r = c.bash(
                &s,
                &format!("sleep 0.3; exit {}", i % 7),
                json!({"background": true, "wake": "silent"}),
            );
            assert_eq!(r["status"], "running");
            r["task_id"].as_str().expect("id").to_owned()
        })
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let t = c.wait_settled(id);
        assert_eq!(t["exit_code"], i % 7, "{t}");
        assert_eq!(t["delivery"], "wait");
    }
}

/// `task.wait` timeouts that straddle the settle: a wait that answered with a live task did not
/// receive the result, so the result must stay `pending`; a wait that answered with the settled
/// task received it, so it is recorded as `wait`.
#[test]
fn a_wait_timing_out_as_the_task_settles_never_swallows_the_result() {
    const THREADS: usize = 4;
    const CALLS: usize = 50;
    let d = Daemon::start();
    let mut setup = d.client();
    let session = d.open_session(&mut setup);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let mut c = d.client();
            let s = session.clone();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for i in 0..CALLS {
                    let ms = 10 + (i * 11 + t * 17) % 80;
                    let r = c.bash(
                        &s,
                        &format!("sleep 0.{ms:03}"),
                        json!({"background": true, "wake": "silent"}),
                    );
                    let id = r["task_id"].as_str().expect("task_id").to_owned();
                    let w = c.wait_for(&id, 50);
                    let got_it = matches!(
                        w["state"].as_str(),
                        Some("succeeded" | "failed" | "canceled")
                    );
                    seen.push((id, got_it, w));
                }
                seen
            })
        })
        .collect();
    let mut outcomes = (0, 0);
    for w in workers {
        for (id, got_it, w) in w.join().expect("worker") {
            let c = &mut setup;
            let mut t = Value::Null;
            assert!(wait_until(Duration::from_secs(20), || {
                t = c.task(&id);
                t["state"] == "succeeded"
            }));
            if got_it {
                outcomes.0 += 1;
                assert_eq!(w["delivery"], "wait", "{w}");
                assert_eq!(t["delivery"], "wait", "{t}");
            } else {
                outcomes.1 += 1;
                assert_eq!(
                    t["delivery"], "pending",
                    "the wait answered {} but the result is recorded as delivered: {t}",
                    w["state"]
                );
            }
        }
    }
    eprintln!(
        "{} waits received the result, {} timed out first",
        outcomes.0, outcomes.1
    );
    assert!(
        outcomes.0 > 0 && outcomes.1 > 0,
        "the waits did not straddle the settle"
    );
}
