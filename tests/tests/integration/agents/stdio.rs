//! `sidejob mcp` driven over its stdio directly: many connections in a row (each a new agent
//! run), and many quick calls through the official Python SDK.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use sidejob_tests::{sidejob_bin, skip_unless, Daemon};

use super::{tail, FEW_SESSIONS};
use crate::mcp_sdk::python;

/// One connection: initialize, tools/list, one call; the names of the tools listed and the
/// call's structured result (or why not).
fn one_connection(d: &Daemon, n: usize) -> Result<(Vec<String>, Value), String> {
    let mut child = Command::new(sidejob_bin())
        .arg("--socket")
        .arg(&d.socket)
        .arg("mcp")
        .current_dir(&d.workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sidejob mcp");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ask = |id: u64, method: &str, params: Value| -> Result<Value, String> {
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        )
        .map_err(|e| format!("write {method}: {e}"))?;
        if method == "initialize" {
            // The client's half of the handshake, before anything else.
            let _ = writeln!(
                stdin,
                "{}",
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
            );
        }
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err(format!(
                    "sidejob mcp closed the connection before answering {method}"
                ));
            }
            let v: Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
            if v["id"] == id {
                return match v.get("error") {
                    Some(e) => Err(format!("{method} failed: {e}")),
                    None => Ok(v["result"].clone()),
                };
            }
        }
    };
    let outcome = (|| {
        ask(
            1,
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "runs", "version": "0"}}),
        )?;
        let listed = ask(2, "tools/list", json!({}))?;
        let names = listed["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let ran = ask(
            3,
            "tools/call",
            json!({"name": "bash", "arguments": {"command": format!("echo run-{n}")}}),
        )?;
        Ok((names, ran))
    })();
    drop(stdin);
    let _ = child.wait();
    outcome
}

#[test]
fn mcp_three_hundred_connections_in_a_row_all_get_their_tools() {
    // Four sessions allowed: one session per connection, never closed, ran out at the fifth.
    let d = Daemon::start_with_log(FEW_SESSIONS, "info");
    for n in 0..300 {
        let (names, ran) = one_connection(&d, n).unwrap_or_else(|e| {
            panic!(
                "connection {n}: {e}\ndaemon log (tail):\n{}",
                tail(&d.log(), 20)
            )
        });
        assert!(
            names.iter().any(|t| t == "bash") && names.iter().any(|t| t == "job_wait"),
            "connection {n} listed {names:?}"
        );
        assert_eq!(
            ran["structuredContent"]["output"],
            format!("run-{n}\n"),
            "connection {n}: {ran}\ndaemon log (tail):\n{}",
            tail(&d.log(), 20)
        );
    }
}

#[test]
fn mcp_sdk_quick_calls_never_carry_their_own_completion() {
    let Some(py) = python() else {
        skip_unless(
            false,
            "the MCP Python SDK is not installed (pip install -r tests/requirements.txt)",
        );
        return;
    };
    let d = Daemon::start_with_log("", "info");
    let o = Command::new(py)
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agents/quick_calls.py"),
        )
        .arg(sidejob_bin())
        .arg(&d.socket)
        .arg(&d.workspace)
        .arg("200")
        .stdin(Stdio::null())
        .output()
        .expect("run the SDK client");
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
