//! `sidejob mcp`: the daemon's tools over MCP on stdio, wakes riding along in results.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{sidejob_bin, wait_until, Daemon};

/// `sidejob mcp` driven over its stdio as a raw JSON-RPC client.
pub(crate) struct Mcp {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    id: u64,
    /// Notifications that came while waiting for replies.
    pub notifications: Vec<Value>,
}

impl Mcp {
    pub(crate) fn start(d: &Daemon) -> Mcp {
        Mcp::start_with(d, &[])
    }

    /// `sidejob mcp ARGS` in the daemon's workspace.
    pub(crate) fn start_with(d: &Daemon, args: &[&str]) -> Mcp {
        let mut child = Command::new(sidejob_bin())
            .arg("--socket")
            .arg(&d.socket)
            .arg("mcp")
            .args(args)
            .current_dir(&d.workspace)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Mcp {
            child,
            stdin,
            stdout,
            id: 0,
            notifications: Vec::new(),
        }
    }

    /// The handshake; returns the `initialize` result.
    pub(crate) fn init(&mut self) -> Value {
        let init = self.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}));
        self.notify("notifications/initialized", json!({}));
        init["result"].clone()
    }

    pub(crate) fn notify(&mut self, method: &str, params: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc": "2.0", "method": method, "params": params})
        )
        .unwrap();
    }

    /// Sends a request without waiting for its reply; returns its id.
    pub(crate) fn send(&mut self, method: &str, params: Value) -> u64 {
        self.id += 1;
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        )
        .unwrap();
        self.id
    }

    /// Closes the server's stdin: the client went away.
    pub(crate) fn hang_up(&mut self) {
        self.stdin = None;
    }

    pub(crate) fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.reply(id)
    }

    /// Reads until the reply to `id`, keeping the notifications met on the way.
    pub(crate) fn reply(&mut self, id: u64) -> Value {
        loop {
            let mut line = String::new();
            self.stdout.read_line(&mut line).unwrap();
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
            if v.get("id").is_none() && v.get("method").is_some() {
                self.notifications.push(v);
                continue;
            }
            assert_eq!(v["id"], id, "{v}");
            return v;
        }
    }

    /// A tool call's `result`.
    pub(crate) fn call(&mut self, name: &str, arguments: Value) -> Value {
        let r = self.request("tools/call", json!({"name": name, "arguments": arguments}));
        assert!(r.get("result").is_some(), "{r}");
        r["result"].clone()
    }

    /// The call's own text, and whether it is an error.
    fn tool(&mut self, name: &str, arguments: Value) -> (String, bool) {
        let (text, err, _) = self.tool_with_reports(name, arguments);
        (text, err)
    }

    /// The call's own text, whether it is an error, and the background reports that came
    /// with it (separate content blocks).
    pub(crate) fn tool_with_reports(
        &mut self,
        name: &str,
        arguments: Value,
    ) -> (String, bool, Vec<String>) {
        let res = self.call(name, arguments);
        (
            text_of(&res),
            res["isError"].as_bool().unwrap(),
            reports_of(&res),
        )
    }
}

/// A result's own text (its first content block).
pub(crate) fn text_of(result: &Value) -> String {
    result["content"][0]["text"].as_str().unwrap().to_owned()
}

/// The background reports a result carries as content blocks after its own.
pub(crate) fn reports_of(result: &Value) -> Vec<String> {
    result["content"].as_array().unwrap()[1..]
        .iter()
        .map(|b| b["text"].as_str().unwrap().to_owned())
        .collect()
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
    let init = m.init();
    assert_eq!(init["serverInfo"]["name"], "sidejob", "{init}");
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

    let started = m.call(
        "bash",
        json!({"command": "echo from-the-background", "background": true}),
    );
    assert_eq!(
        started["structuredContent"]["status"], "running",
        "{started}"
    );
    let job = started["structuredContent"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text_of(&started).contains(&job), "{started}");
    let (waited, _) = m.tool("job_wait", json!({"task_id": job, "timeout_ms": 20_000}));
    assert!(waited.contains("succeeded"), "{waited}");
    let (out, _) = m.tool("job_output", json!({"task_id": job}));
    assert!(out.contains("from-the-background"), "{out}");

    // A job left to finish on its own is reported with a result, once: the first result after
    // the daemon's push reached the MCP server (it may trail the settle by a moment).
    let later = m.call("bash", json!({"command": "echo later", "background": true}));
    let job2 = later["structuredContent"]["task_id"]
        .as_str()
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
