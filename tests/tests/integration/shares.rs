//! Each user's share of the daemon (`[per_user]`): a second local user (uid 65534, through
//! the socket group) at a limit is refused with `limit_exceeded` naming the limit, and root's
//! calls are not delayed by it. Needs root (to act as another uid).

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{skip_without, Need};
use sidejob_tests::{Client, Daemon, NOBODY};

const LIMIT_EXCEEDED: i64 = -32004;

fn daemon(per_user: &str) -> Daemon {
    Daemon::start_with_config(&format!(
        "socket_group = \"{NOBODY}\"\nmax_running = 4\n[per_user]\n{per_user}\n"
    ))
}

/// Opens a session as 65534 in a workspace of its own.
fn nobody_session(d: &Daemon, c: &mut Client, name: &str) -> String {
    let ws = d.nobody_workspace(name);
    c.open_session_in(&ws)
}

fn assert_limit(err: &Value, limit: &str) {
    assert_eq!(err["code"], LIMIT_EXCEEDED, "{err}");
    assert_eq!(err["data"]["kind"], "limit_exceeded", "{err}");
    assert!(
        err["message"].as_str().unwrap_or("").contains(limit),
        "the refusal names {limit}: {err}"
    );
}

/// Whether a fresh connection is served: its `initialize` is answered. Until the daemon has
/// seen an earlier connection close, a new one is refused (an error line, then the close),
/// which is `false` here, not a failure.
fn admitted(c: &mut Client) -> bool {
    c.set_read_timeout(Duration::from_secs(5));
    let line = b"{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"initialize\", \"params\": {}}\n";
    if c.send_raw(line).is_err() {
        return false;
    }
    c.read_message().is_some_and(|m| m.get("result").is_some())
}

/// A connection from `connect` once one is admitted: connections that closed just before
/// (the test harness's own readiness probe included) may not have given their share back yet.
fn admitted_client(connect: impl Fn() -> Client) -> Client {
    let mut admitted_one = None;
    assert!(
        sidejob_tests::wait_until(Duration::from_secs(10), || {
            let mut c = connect();
            let ok = admitted(&mut c);
            if ok {
                admitted_one = Some(c);
            }
            ok
        }),
        "no connection was admitted within 10 s"
    );
    admitted_one.expect("admitted")
}
#[test]
fn one_users_runs_never_take_anothers_slot() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = daemon("running = 2\nqueued = 1");
    let mut n = d.nobody();
    let s = nobody_session(&d, &mut n, "ws");
    let gate = d.root.path().join("ws/gate");
    let held = format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display());
    let mut ids = Vec::new();
    for _ in 0..3 {
        let r = n.bash(&s, &held, json!({"background": true}));
        ids.push(r["task_id"].as_str().expect("id").to_owned());
    }
    let states: Vec<Value> = ids.iter().map(|id| n.task(id)["state"].clone()).collect();
    assert_eq!(
        states,
        vec!["running", "running", "queued"],
        "per_user.running = 2"
    );
    // Running 2 and waiting 1: a fourth is refused, naming the limit.
    let refused = n
        .call(
            "tool.call",
            json!({"session_id": s, "tool": "bash", "args": {"command": "true"}, "background": true}),
        )
        .expect_err("a fourth call of uid 65534");
    assert_limit(&refused, "per_user.queued");

    // Root's call runs at once, though the daemon allows 4 runs and uid 65534 asked for 4:
    // were it queued behind them, it could only start once the gate opens (below), and would
    // come back `running` after yield_after_ms instead of `completed`.
    let mut root = d.client();
    let rs = d.open_session(&mut root);
    let r = root.bash(&rs, "echo root", json!({"yield_after_ms": 60_000}));
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["output"], "root\n");

    // The queued one starts once a slot of its owner frees.
    std::fs::write(&gate, "").expect("gate");
    for id in &ids {
        let t = n.wait_settled(id);
        assert_eq!(t["state"], "succeeded", "{t}");
    }
}

#[test]
fn connections_past_the_share_are_refused_and_the_share_comes_back() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = daemon("connections = 3");
    let mut held: Vec<Client> = (0..3).map(|_| admitted_client(|| d.nobody())).collect();
    // The fourth is told why and closed.
    let mut fourth = d.nobody();
    fourth.set_read_timeout(Duration::from_secs(10));
    let msg = fourth.read_message().expect("a refusal before the close");
    assert_limit(&msg["error"], "per_user.connections");
    assert!(
        fourth.read_message().is_none(),
        "then the connection closes"
    );
    // Root is not affected.
    d.client().ok("initialize", json!({}));
    // A closed connection gives its share back.
    drop(held.pop());
    admitted_client(|| d.nobody());
}

/// Bytes written to `s` that its peer has not read yet (`SIOCOUTQ`).
fn unread(s: &std::os::unix::net::UnixStream) -> i32 {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int through the pointer, which points at one.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    assert_eq!(r, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
    n
}

#[test]
fn unfinished_lines_past_the_byte_share_are_cut_off_and_others_are_served() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = daemon("buffered_bytes = 1048576");
    // Half a MiB with no newline on each of two connections: the second passes the share.
    let chunk = vec![b'x'; 600 * 1024];
    let mut first = sidejob_tests::connect_as(&d.socket, NOBODY, NOBODY).expect("connect");
    first
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"")
        .expect("write");
    first.write_all(&chunk).expect("write");
    // Only once the daemon holds all of it is the second connection the one that passes the
    // share (read in the other order, the first would be cut off instead).
    assert!(
        sidejob_tests::wait_until(Duration::from_secs(10), || unread(&first) == 0),
        "the daemon did not read the first connection's line"
    );
    let mut second = sidejob_tests::connect_as(&d.socket, NOBODY, NOBODY).expect("connect");
    second
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    // The daemon may close the connection before all of it is written.
    let _ = second.write_all(&chunk);
    let mut reply = String::new();
    let _ = second.read_to_string(&mut reply);
    let msg: Value = serde_json::from_str(reply.lines().next().unwrap_or("null")).expect("json");
    assert_limit(&msg["error"], "per_user.buffered_bytes");
    // Root is answered meanwhile, and the first connection can still finish its line.
    d.client().ok("initialize", json!({}));
    first
        .write_all(b"initialize\"}\n")
        .expect("finish the line");
    let mut c = Client::from_stream(first);
    let m = c.read_message().expect("a reply to the finished line");
    assert!(m.get("error").is_some(), "an unknown method: {m}");
}

#[test]
fn a_line_that_never_ends_is_cut_off_after_the_timeout() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = daemon("line_timeout_ms = 300");
    let mut s = sidejob_tests::connect_as(&d.socket, NOBODY, NOBODY).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.write_all(b"{\"jsonrpc\":\"2.0\",").expect("write");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("read until the close");
    let msg: Value = serde_json::from_str(reply.lines().next().unwrap_or("null")).expect("json");
    assert_limit(&msg["error"], "per_user.line_timeout_ms");
    // A connection that writes whole lines is never cut off.
    let mut c = d.nobody();
    c.ok("initialize", json!({}));
    std::thread::sleep(Duration::from_millis(500));
    c.ok("initialize", json!({}));
}

#[test]
fn sessions_and_schedules_past_the_share_are_refused() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = daemon("sessions = 2\nschedules = 1");
    let mut n = d.nobody();
    let a = nobody_session(&d, &mut n, "ws-a");
    nobody_session(&d, &mut n, "ws-b");
    let ws = d.nobody_workspace("ws-c");
    let refused = n
        .call("session.open", json!({ "workspace": ws }))
        .expect_err("a third session");
    assert_limit(&refused, "per_user.sessions");
    // Closing one gives its share back.
    n.ok("session.close", json!({ "session_id": a }));
    nobody_session(&d, &mut n, "ws-c");

    let s = nobody_session_after_close(&d, &mut n);
    let prompt = json!({"session_id": s, "delay_ms": 3_600_000, "action": {"prompt": "later"}});
    n.ok("schedule.create", prompt.clone());
    let refused = n
        .call("schedule.create", prompt)
        .expect_err("a second schedule");
    assert_limit(&refused, "per_user.schedules");
    // Root's own share is untouched.
    let mut root = d.client();
    let rs = d.open_session(&mut root);
    root.ok(
        "schedule.create",
        json!({"session_id": rs, "delay_ms": 3_600_000, "action": {"prompt": "root's"}}),
    );
}

/// One of 65534's open sessions (its share is full: reuse one).
fn nobody_session_after_close(d: &Daemon, n: &mut Client) -> String {
    let list = n.ok("session.list", json!({}));
    list["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|s| s["state"] == "open")
        .and_then(|s| s["session_id"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| nobody_session(d, n, "ws-d"))
}

#[test]
fn output_kept_past_the_share_is_refused_until_a_session_is_deleted() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = daemon("output_bytes = 10000");
    let mut n = d.nobody();
    let s = nobody_session(&d, &mut n, "ws");
    let r = n.bash(&s, "head -c 20000 /dev/zero | tr '\\0' x", json!({}));
    assert_eq!(r["state"], "succeeded", "{r}");
    let refused = n
        .call(
            "tool.call",
            json!({"session_id": s, "tool": "bash", "args": {"command": "true"}}),
        )
        .expect_err("past per_user.output_bytes");
    assert_limit(&refused, "per_user.output_bytes");
    let session_dir = n.ok("session.list", json!({}))["sessions"][0]["session_dir"]
        .as_str()
        .expect("session_dir")
        .to_owned();
    assert!(std::path::Path::new(&session_dir).exists());
    n.ok("session.close", json!({"session_id": s, "delete": true}));
    assert!(
        !std::path::Path::new(&session_dir).exists(),
        "delete removes the session's directory"
    );
    // The share is free again, and the deleted session can be opened again.
    let ws = d.root.path().join("ws");
    let again = n.ok("session.open", json!({"session_id": s, "workspace": ws}));
    assert_eq!(again["session_id"], s.as_str());
    let r = n.bash(&s, "echo again", json!({}));
    assert_eq!(r["output"], "again\n", "{r}");
}

#[test]
fn connections_past_the_daemons_cap_are_refused_with_the_limit_named() {
    let d = Daemon::start_with_config("max_connections = 3\n");
    let mut held: Vec<Client> = (0..3).map(|_| admitted_client(|| d.client())).collect();
    let mut fourth = d.client();
    fourth.set_read_timeout(Duration::from_secs(10));
    let msg = fourth.read_message().expect("a refusal before the close");
    assert_limit(&msg["error"], "max_connections");
    assert!(
        fourth.read_message().is_none(),
        "then the connection closes"
    );
    drop(held.pop());
    admitted_client(|| d.client());
}
