//! `sidejob mcp`: the daemon's tools over MCP on stdio, wakes riding along in results.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{sidejob_bin, wait_until, Daemon};

struct Mcp {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    id: u64,
}

impl Mcp {
    fn start(d: &Daemon) -> Mcp {
        let mut child = Command::new(sidejob_bin())
            .arg("--socket")
            .arg(&d.socket)
            .arg("mcp")
            .current_dir(&d.workspace)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Mcp {
            child,
            stdin,
            stdout,
            id: 0,
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        writeln!(
            self.stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        )
        .unwrap();
        // Notifications (a background job's completion) may come before the reply.
        loop {
            let mut line = String::new();
            self.stdout.read_line(&mut line).unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("id").is_none() && v.get("method").is_some() {
                continue;
            }
            assert_eq!(v["id"], self.id, "{v}");
            return v;
        }
    }

    /// The call's own text, and whether it is an error.
    fn tool(&mut self, name: &str, arguments: Value) -> (String, bool) {
        let (text, err, _) = self.tool_with_reports(name, arguments);
        (text, err)
    }

    /// The call's own text, whether it is an error, and the background reports that came
    /// with it (separate content blocks).
    fn tool_with_reports(&mut self, name: &str, arguments: Value) -> (String, bool, Vec<String>) {
        let r = self.request("tools/call", json!({"name": name, "arguments": arguments}));
        let res = &r["result"];
        let blocks = res["content"].as_array().unwrap();
        (
            blocks[0]["text"].as_str().unwrap().to_owned(),
            res["isError"].as_bool().unwrap(),
            blocks[1..]
                .iter()
                .map(|b| b["text"].as_str().unwrap().to_owned())
                .collect(),
        )
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_mcp_client_runs_tools_and_hears_about_background_jobs() {
    let d = Daemon::start();
    let mut m = Mcp::start(&d);
    let init = m.request("initialize", json!({"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}));
    assert_eq!(init["result"]["serverInfo"]["name"], "sidejob", "{init}");
    writeln!(
        m.stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    let tools = m.request("tools/list", json!({}));
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for n in ["bash", "job_list", "job_output", "job_wait", "job_stop"] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    let bash = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "bash")
        .unwrap();
    assert!(
        bash["inputSchema"]["properties"]["background"].is_object(),
        "{bash}"
    );

    let (text, err) = m.tool("bash", json!({"command": "echo via-mcp"}));
    assert_eq!((text.trim(), err), ("via-mcp", false));
    let (text, err) = m.tool("bash", json!({"command": "exit 3"}));
    assert!(err && text.contains("exit code 3"), "{text}");

    let (text, _) = m.tool(
        "bash",
        json!({"command": "echo from-the-background", "background": true}),
    );
    let job = text
        .split("as job ")
        .nth(1)
        .and_then(|t| t.split(';').next())
        .unwrap()
        .to_owned();
    let (waited, _) = m.tool("job_wait", json!({"task_id": job, "timeout_ms": 20_000}));
    assert!(waited.contains("succeeded"), "{waited}");
    let (out, _) = m.tool("job_output", json!({"task_id": job}));
    assert!(out.contains("from-the-background"), "{out}");

    // A job left to finish on its own is reported with a result, once: the first result after
    // the daemon's push reached the MCP server (it may trail the settle by a moment).
    let (text, _) = m.tool("bash", json!({"command": "echo later", "background": true}));
    let job2 = text
        .split("as job ")
        .nth(1)
        .and_then(|t| t.split(';').next())
        .unwrap()
        .to_owned();
    let mut c = d.client();
    c.wait_settled_quietly(&job2);
    let mut reports = Vec::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (list, _, r) = m.tool_with_reports("job_list", json!({}));
            assert!(
                !list.contains("[automatic]"),
                "never inside another call's output: {list}"
            );
            reports = r;
            !reports.is_empty()
        }),
        "the finished job was never reported"
    );
    assert!(
        reports.len() == 1 && reports[0].contains("[automatic]") && reports[0].contains(&job2),
        "{reports:?}"
    );
    let (_, _, again) = m.tool_with_reports("job_list", json!({}));
    assert!(again.is_empty(), "reported twice: {again:?}");
}
