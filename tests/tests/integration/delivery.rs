//! Exactly-once delivery (docs/protocol.md) and `task.wait`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sidejob_tests::{wait_until, Daemon, Gate};

/// What the client saw of one call.
enum Seen {
    /// `tool.call` answered `completed`.
    Inline,
    /// `tool.call` answered `running`, and then a `task.wait` received the result.
    Waited(Value),
    /// `tool.call` answered `running`; nobody has received the result yet.
    Unclaimed,
}

/// Runs rounds of calls around a timing boundary (`yield_after_ms`, a `task.wait` timeout)
/// until both sides of it were seen: runs that settled first (`fast`) and runs the boundary
/// came before (`slow`). `round(boundary_ms)` makes one round, with run times spread over
/// 0..2 × boundary, and returns what it saw and how many were fast and slow. A round that saw
/// one side only is followed by one with the boundary moved towards the other (a loaded
/// machine makes every run slow: the boundary doubles), so both sides are exercised on any
/// machine, and every call of every round is checked.
pub(crate) fn straddle<T>(
    first_boundary_ms: u64,
    mut round: impl FnMut(u64) -> (Vec<T>, usize, usize),
) -> (Vec<T>, usize, usize) {
    const ROUNDS: usize = 6;
    let mut boundary = first_boundary_ms;
    let (mut all, mut fast, mut slow) = (Vec::new(), 0, 0);
    for _ in 0..ROUNDS {
        let (seen, f, sl) = round(boundary);
        eprintln!("boundary {boundary} ms: {f} fast, {sl} slow");
        all.extend(seen);
        fast += f;
        slow += sl;
        if fast > 0 && slow > 0 {
            return (all, fast, slow);
        }
        boundary = if f == 0 {
            boundary * 2
        } else {
            (boundary / 2).max(10)
        };
    }
    panic!("{ROUNDS} rounds never straddled the boundary: {fast} fast, {slow} slow");
}

/// Calls whose run time straddles `yield_after_ms`: every result is delivered exactly once,
/// and the recorded delivery matches what the client saw.
#[test]
fn every_result_is_delivered_exactly_once_at_the_yield_boundary() {
    const THREADS: usize = 4;
    const CALLS: usize = 30;
    let d = Daemon::start();
    let mut setup = d.client();
    let session = d.open_session(&mut setup);
    let started = Instant::now();

    let (all, inline, yielded) = straddle(50, |yield_ms| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let mut c = d.client();
                let s = session.clone();
                std::thread::spawn(move || {
                    let mut seen = Vec::new();
                    for i in 0..CALLS {
                        // 0 to 2 × yield of sleep (plus the spawn's own cost).
                        let ms = (i as u64 * 7 + t as u64 * 13) % (2 * yield_ms + 1);
                        let r = c.bash(
                            &s,
                            &format!("sleep {}; echo run-{t}-{i}", ms as f64 / 1000.0),
                            // Silent: results nobody claims stay `pending` for this test to
                            // claim with task.wait (wakes are counted in wakes.rs).
                            json!({"yield_after_ms": yield_ms, "wake": "silent"}),
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
                    seen
                })
            })
            .collect();
        let seen: Vec<(String, Seen)> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect();
        let inline = seen
            .iter()
            .filter(|(_, s)| matches!(s, Seen::Inline))
            .count();
        let yielded = seen.len() - inline;
        (seen, inline, yielded)
    });

    let c = &mut setup;
    let (mut waited, mut unclaimed) = (0, 0);
    for (id, seen) in &all {
        match seen {
            Seen::Inline => {
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
    assert_eq!(yielded, waited + unclaimed);
    eprintln!(
        "{} calls in {:?}: {inline} inline, {waited} waited, {unclaimed} left pending",
        all.len(),
        started.elapsed()
    );
}

#[test]
fn task_wait_returns_the_task_when_it_settles() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "settle");
    // Silent, so the result goes to the wait whichever reaches the daemon first: the wait
    // or the settle the gate lets happen once the wait has been sent.
    let r = c.bash(
        &s,
        &format!("{}; exit 4", gate.wait_cmd()),
        json!({"background": true, "wake": "silent"}),
    );
    let id = r["task_id"].as_str().expect("id");
    // The wait's own timeout is far beyond the client's 120 s read timeout: the answer can
    // only come from the settle, which comes only once the gate is open.
    let t = c.wait_then(&d, id, || gate.open());
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
    // The run never ends on its own: only the timeout can answer the wait.
    let gate = Gate::new(&d.workspace, "never");
    let r = c.bash(&s, &gate.wait_cmd(), json!({"background": true}));
    let id = r["task_id"].as_str().expect("id");
    let started = Instant::now();
    let t = c.wait_for(id, 400);
    let took = started.elapsed();
    assert_eq!(t["state"], "running", "{t}");
    assert!(t["delivery"].is_null(), "nothing delivered yet: {t}");
    assert!(
        took >= Duration::from_millis(400),
        "returned before its timeout, after {took:?}"
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
    // Send the call and hang up without reading the answer; the run ends only after that.
    let gate = Gate::new(&d.workspace, "hung-up");
    {
        let mut gone = d.client();
        gone.send_value(&json!({"jsonrpc": "2.0", "id": 1, "method": "tool.call",
            "params": {"session_id": s, "tool": "bash", "args": {"command": format!("{}; echo orphan", gate.wait_cmd())},
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
    gate.open();
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
    const CALLS: usize = 30;
    let d = Daemon::start();
    let mut setup = d.client();
    let session = d.open_session(&mut setup);
    let (all, got, missed) = straddle(50, |wait_ms| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let mut c = d.client();
                let s = session.clone();
                std::thread::spawn(move || {
                    let mut seen = Vec::new();
                    for i in 0..CALLS {
                        let ms = (i as u64 * 11 + t as u64 * 17) % (2 * wait_ms + 1);
                        let r = c.bash(
                            &s,
                            &format!("sleep {}", ms as f64 / 1000.0),
                            json!({"background": true, "wake": "silent"}),
                        );
                        let id = r["task_id"].as_str().expect("task_id").to_owned();
                        let w = c.wait_for(&id, wait_ms);
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
        let seen: Vec<(String, bool, Value)> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect();
        let got = seen.iter().filter(|(_, g, _)| *g).count();
        let missed = seen.len() - got;
        (seen, got, missed)
    });
    for (id, got_it, w) in &all {
        let c = &mut setup;
        let mut t = Value::Null;
        assert!(wait_until(Duration::from_secs(20), || {
            t = c.task(id);
            t["state"] == "succeeded"
        }));
        if *got_it {
            assert_eq!(w["delivery"], "wait", "{w}");
            assert_eq!(t["delivery"], "wait", "{t}");
        } else {
            assert_eq!(
                t["delivery"], "pending",
                "the wait answered {} but the result is recorded as delivered: {t}",
                w["state"]
            );
        }
    }
    eprintln!("{got} waits received the result, {missed} timed out first");
}
