//! stdin (docs/protocol.md): `/dev/null` by default; `stdin: "pipe"` plus `task.message`.

use std::time::Duration;

use serde_json::json;
use sidejob_tests::{Daemon, Gate};

#[test]
fn task_message_writes_to_a_piped_stdin_and_closes_it() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(
        &s,
        "read first; echo \"first=$first\"; cat; echo end",
        json!({"background": true, "stdin": "pipe"}),
    );
    assert_eq!(r["status"], "running");
    let id = r["task_id"].as_str().expect("id").to_owned();
    let m = c.ok("task.message", json!({"task_id": id, "data": "hello\n"}));
    assert_eq!(m["queued_bytes"], 6, "{m}");
    assert_eq!(m["eof"], false);
    c.ok("task.message", json!({"task_id": id, "data": "more\n"}));
    let m = c.ok(
        "task.message",
        json!({"task_id": id, "data": "last\n", "eof": true}),
    );
    assert_eq!(m["eof"], true);
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id), "first=hello\nmore\nlast\nend\n");
}

#[test]
fn eof_alone_ends_a_piped_stdin() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "wc -c", json!({"background": true, "stdin": "pipe"}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    c.ok(
        "task.message",
        json!({"task_id": id, "data": "", "eof": true}),
    );
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id).trim(), "0");
    // After eof, stdin is closed.
    let (code, kind) = c.err("task.message", json!({"task_id": id, "data": "x"}));
    assert_eq!((code, kind.as_str()), (-32005, "invalid_state"));
}

#[test]
fn a_foreground_call_with_a_piped_stdin_reads_a_message_sent_from_another_client() {
    let d = Daemon::start();
    let mut a = d.client();
    let s = d.open_session(&mut a);
    let sess = s.clone();
    let caller = std::thread::spawn(move || {
        a.bash(
            &sess,
            "read line; echo \"got $line\"",
            json!({"yield_after_ms": 20_000, "stdin": "pipe"}),
        )
    });
    let mut b = d.client();
    let mut id = String::new();
    assert!(sidejob_tests::wait_until(Duration::from_secs(10), || {
        let list = b.ok("task.list", json!({"session_id": s}));
        id = list["tasks"][0]["task_id"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        list["tasks"][0]["state"] == "running"
    }));
    b.ok(
        "task.message",
        json!({"task_id": id, "data": "ping\n", "eof": true}),
    );
    let r = caller.join().expect("caller");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["output"], "got ping\n");
}

#[test]
fn stdin_is_dev_null_by_default() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // A stdin left open would hold `cat` past the yield: the answer would be `running`.
    let r = c.bash(
        &s,
        "cat; readlink /proc/self/fd/0",
        json!({"yield_after_ms": 10_000}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "succeeded");
    assert_eq!(r["output"], "/dev/null\n");
}

#[test]
fn task_message_without_a_pipe_is_invalid_state() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "sleep 30", json!({"background": true}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    let (code, kind) = c.err("task.message", json!({"task_id": id, "data": "x\n"}));
    assert_eq!((code, kind.as_str()), (-32005, "invalid_state"));
    c.ok("task.cancel", json!({"task_id": id, "grace_ms": 100}));
    // A settled task has no stdin either.
    let (code, kind) = c.err("task.message", json!({"task_id": id, "data": "x\n"}));
    assert_eq!((code, kind.as_str()), (-32005, "invalid_state"));
}

#[test]
fn task_message_never_blocks_on_a_command_that_does_not_read() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The command reads nothing until the gate opens, which it never does here.
    let gate = Gate::new(&d.workspace, "never");
    let r = c.bash(
        &s,
        &format!("{}; cat", gate.wait_cmd()),
        json!({"background": true, "stdin": "pipe"}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    // Far more than a pipe buffer holds; every message is answered (a blocked one would
    // never be, and the client gives up after 30 s).
    c.set_read_timeout(Duration::from_secs(30));
    let chunk = "x".repeat(256 * 1024);
    for _ in 0..8 {
        let m = c.ok("task.message", json!({"task_id": id, "data": chunk}));
        assert_eq!(m["queued_bytes"], chunk.len());
    }
    // Another request on the same daemon is not held up either.
    let other = c.bash(&s, "echo free", json!({}));
    assert_eq!(other["output"], "free\n");
    c.ok("task.cancel", json!({"task_id": id, "grace_ms": 100}));
}

#[test]
fn a_message_to_a_queued_task_reaches_it_when_it_starts() {
    let d = Daemon::start_with_config("max_running = 1\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let first = c.bash(&s, "sleep 30", json!({"background": true}));
    let first = first["task_id"].as_str().expect("id").to_owned();
    assert!(sidejob_tests::wait_until(Duration::from_secs(10), || c
        .task(&first)["state"]
        == "running"));
    let r = c.bash(&s, "cat", json!({"background": true, "stdin": "pipe"}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    assert_eq!(c.task(&id)["state"], "queued");
    // A host may write as soon as tool.call answers, whether or not the run has started.
    let m = c.call(
        "task.message",
        json!({"task_id": id, "data": "queued-input\n", "eof": true}),
    );
    assert!(
        m.is_ok(),
        "a piped stdin accepts messages while queued: {m:?}"
    );
    c.ok("task.cancel", json!({"task_id": first, "grace_ms": 100}));
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id), "queued-input\n");
}

/// Past 16 MiB waiting for a command that does not read, `task.message` answers
/// `limit_exceeded` (nothing of that message is queued) and the task is unharmed: once the
/// command reads, it gets exactly the bytes that were accepted.
#[test]
fn a_message_over_the_stdin_queue_cap_is_limit_exceeded_and_the_task_is_unharmed() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "read");
    let r = c.bash(
        &s,
        &format!("{}; wc -c", gate.wait_cmd()),
        json!({"background": true, "stdin": "pipe"}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    let chunk = "y".repeat(512 * 1024);
    let (mut accepted, mut refused) = (0usize, 0usize);
    // 36 × 512 KiB = 18 MiB: more than the 16 MiB cap plus a pipe buffer.
    for _ in 0..36 {
        match c.call("task.message", json!({"task_id": id, "data": chunk})) {
            Ok(m) => {
                assert_eq!(refused, 0, "accepted after a refusal: {m}");
                accepted += chunk.len();
            }
            Err(e) => {
                assert_eq!(e["code"], -32004, "{e}");
                assert_eq!(e["data"]["kind"], "limit_exceeded", "{e}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "18 MiB were queued without a refusal");
    assert!(
        accepted >= 15 * 1024 * 1024,
        "refused well before the cap: {accepted} bytes accepted"
    );
    assert_eq!(c.task(&id)["state"], "running");
    gate.open();
    c.ok(
        "task.message",
        json!({"task_id": id, "data": "", "eof": true}),
    );
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id).trim(), accepted.to_string());
}
