//! The host protocol's framing and dispatch (docs/protocol.md): ids, notifications, pipelining.

use serde_json::json;
use sidejob_tests::{Daemon, Gate};

#[test]
fn initialize_reports_protocol_1_and_refuses_other_versions() {
    let d = Daemon::start();
    let mut c = d.client();
    let r = c.ok("initialize", json!({"protocol_version": 1}));
    assert_eq!(r["protocol_version"], 1);
    // The daemon reports the peer's uid (SO_PEERCRED): ours, whoever we are.
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    assert_eq!(r["uid"], uid, "{r}");
    let methods = r["methods"].as_array().expect("methods");
    for m in [
        "session.open",
        "session.close",
        "session.status",
        "session.list",
        "tool.list",
        "tool.call",
        "task.list",
        "task.get",
        "task.output",
        "task.wait",
        "task.cancel",
        "task.message",
        "task.background",
    ] {
        assert!(
            methods.iter().any(|x| x == m),
            "initialize does not list {m}"
        );
    }
    let (code, kind) = c.err("initialize", json!({"protocol_version": 2}));
    assert_eq!((code, kind.as_str()), (-32602, "invalid_params"));
}

#[test]
fn tool_list_describes_bash_with_a_schema() {
    let d = Daemon::start();
    let mut c = d.client();
    let r = c.ok("tool.list", json!({}));
    let bash = r["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["name"] == "bash")
        .expect("a bash tool")
        .clone();
    assert_eq!(bash["supports_background"], true);
    assert!(bash["default_yield_after_ms"].is_u64(), "{bash}");
    assert!(bash["description"].as_str().is_some_and(|s| !s.is_empty()));
    let schema = &bash["input_schema"];
    assert_eq!(schema["type"], "object", "{schema}");
    assert!(schema["properties"]["command"].is_object(), "{schema}");
    assert!(
        schema["required"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x == "command")),
        "{schema}"
    );
}

#[test]
fn string_ids_are_echoed_and_notifications_get_no_reply() {
    let d = Daemon::start();
    let mut c = d.client();
    // A notification (no id) is carried out but never answered.
    c.send_value(&json!({"jsonrpc": "2.0", "method": "initialize", "params": {}}));
    c.send_value(&json!({"jsonrpc": "2.0", "method": "no.such.method"}));
    c.send_value(&json!({"jsonrpc": "2.0", "id": "abc-1", "method": "initialize"}));
    let msg = c.read_message().expect("reply");
    assert_eq!(
        msg["id"], "abc-1",
        "only the request with an id is answered: {msg}"
    );
    assert_eq!(msg["result"]["protocol_version"], 1);
}

#[test]
fn a_blocked_call_does_not_hold_up_other_requests_on_the_same_connection() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // The call cannot answer before the test opens the gate, and the test opens it only
    // after the quick request has been answered.
    let gate = Gate::new(&d.workspace, "slow");
    c.send_value(&json!({"jsonrpc": "2.0", "id": 100, "method": "tool.call",
        "params": {"session_id": s, "tool": "bash", "args": {"command": format!("{}; echo slow", gate.wait_cmd())},
                   "yield_after_ms": 30_000}}));
    c.send_value(
        &json!({"jsonrpc": "2.0", "id": 101, "method": "session.status",
        "params": {"session_id": s}}),
    );
    let first = c.read_message().expect("reply");
    assert_eq!(
        first["id"], 101,
        "the quick request is answered first: {first}"
    );
    gate.open();
    let second = c.read_message().expect("reply");
    assert_eq!(second["id"], 100, "{second}");
    assert_eq!(second["result"]["status"], "completed");
    assert_eq!(second["result"]["output"], "slow\n");
}

#[test]
fn many_clients_at_once_each_get_their_own_answers() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let mut c = d.client();
            let s = s.clone();
            std::thread::spawn(move || {
                for j in 0..5 {
                    let r = c.bash(&s, &format!("echo {i}-{j}"), json!({}));
                    assert_eq!(r["output"], format!("{i}-{j}\n"), "{r}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
}
