//! Real agent CLIs (Claude Code, Codex, opencode, the MCP Inspector) driven against a scripted
//! model on 127.0.0.1 (`tests/fixtures/agents/model_server.py`), with `sidejob mcp` as their
//! MCP server: the tests decide what the model does and assert on what it was sent.
//!
//! The CLIs are npm packages `.ci/run` installs into `target/ci-agents`
//! (`$SIDEJOB_TEST_AGENTS` names another directory of their binaries). A test whose client is
//! missing skips with a printed reason, or fails where the run declared [`Need::Agents`].

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::need::{declared, record_skip, Need};

/// The binaries the agent tests run, as npm installs them.
pub const CLIENTS: [&str; 4] = ["claude", "codex", "opencode", "mcp-inspector"];

/// Where the agent CLIs are: `$SIDEJOB_TEST_AGENTS`, else `.ci/run`'s prefix.
pub fn agents_dir() -> PathBuf {
    match std::env::var_os("SIDEJOB_TEST_AGENTS") {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ci-agents/node_modules/.bin")
        }
    }
}

fn find_client(name: &str) -> Option<PathBuf> {
    let p = agents_dir().join(name);
    p.exists().then_some(p)
}

/// `None` when every client is installed, else which are not (for [`Need::Agents`]).
pub fn missing_clients() -> Option<String> {
    let missing: Vec<&str> = CLIENTS
        .into_iter()
        .filter(|c| find_client(c).is_none())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "no {} in {} (.ci/run installs them; SIDEJOB_TEST_AGENTS names another directory)",
            missing.join(", "),
            agents_dir().display()
        )
    })
}

/// The client's binary; `None` (the skip printed and recorded) when it is not installed,
/// a failure when this run declared `agents`.
pub fn client(name: &str) -> Option<PathBuf> {
    if let Some(p) = find_client(name) {
        return Some(p);
    }
    let why = format!(
        "no {name} in {} (.ci/run installs it; SIDEJOB_TEST_AGENTS names another directory)",
        agents_dir().display()
    );
    assert!(
        !declared().contains(&Need::Agents),
        "this machine was declared to provide the agent CLIs (SIDEJOB_TEST_REQUIRE), but {why}"
    );
    record_skip(&format!("needs agents: {why}"));
    None
}

// ---- The script --------------------------------------------------------------------------

/// A model turn that calls the sidejob tool `tool` (whatever prefix the client gives it).
pub fn call(tool: &str, args: Value) -> Value {
    json!({"call": tool, "args": args})
}

/// The same call, made again while the newest tool result lacks `until` (at most `max`).
pub fn call_until(tool: &str, args: Value, until: &str, max: u32) -> Value {
    json!({"call": tool, "args": args, "until": until, "max": max})
}

/// A model turn that says `text` and ends the turn.
pub fn say(text: &str) -> Value {
    json!({ "say": text })
}

// ---- The scripted model ------------------------------------------------------------------

/// The scripted model server: answers the Anthropic Messages, OpenAI Responses and Chat
/// Completions APIs by its script, and records every request it gets.
pub struct ModelServer {
    child: Child,
    pub port: u16,
    record: PathBuf,
}

impl ModelServer {
    /// Starts the server in `dir` with `steps` as its script (`loop_steps`: start again at
    /// the end, for repeated runs).
    pub fn start(dir: &Path, steps: Vec<Value>, loop_steps: bool) -> ModelServer {
        Self::start_script(dir, json!({"steps": steps, "loop": loop_steps}))
    }

    /// Starts the server with `steps`, taken by the requests that offer the client's own
    /// tool `offered` (e.g. Claude Code's `Bash`), whose calls name tools exactly.
    pub fn start_offering(dir: &Path, steps: Vec<Value>, offered: &str) -> ModelServer {
        Self::start_script(dir, json!({"steps": steps, "offered": offered}))
    }

    fn start_script(dir: &Path, script_json: Value) -> ModelServer {
        std::fs::create_dir_all(dir).expect("model server dir");
        let script = dir.join("script.json");
        let record = dir.join("requests.jsonl");
        std::fs::write(&script, script_json.to_string()).expect("script");
        let mut child = Command::new("python3")
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/agents/model_server.py"))
            .arg(&script)
            .arg(&record)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the model server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the model server's port");
        let port = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the model server said {line:?}, not its port"));
        ModelServer {
            child,
            port,
            record,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far: `{n, method, path, step, action, body}`.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a recorded request"))
            .collect()
    }

    /// The requests that took a step of the script (the model's turns), in order.
    pub fn turns(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| !r["step"].is_null())
            .collect()
    }

    /// The requests, one line each, for a failure message.
    pub fn summary(&self) -> String {
        self.requests()
            .iter()
            .map(|r| {
                format!(
                    "#{} {} {} step {} -> {}",
                    r["n"], r["method"], r["path"], r["step"], r["action"]
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- What the model was sent -------------------------------------------------------------

/// A request's conversation as separate items: each message (or Responses input item), a
/// message's content blocks each on its own, `cache_control` marks removed (clients move
/// them between requests), as JSON text.
pub fn items(body: &Value) -> Vec<String> {
    let conversation = body
        .get("messages")
        .or_else(|| body.get("input"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for mut item in conversation {
        strip_cache_control(&mut item);
        match item.get("content").and_then(Value::as_array) {
            Some(blocks) => {
                for b in blocks {
                    out.push(json!({"role": item["role"], "block": b}).to_string());
                }
            }
            None => out.push(item.to_string()),
        }
    }
    out
}

fn strip_cache_control(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("cache_control");
            m.values_mut().for_each(strip_cache_control);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_cache_control),
        _ => {}
    }
}

/// A turn at which the model was sent something carrying a marker it had not been sent.
#[derive(Debug)]
pub struct Delivery {
    /// Its index among the turns.
    pub turn: usize,
    /// The script step that turn took.
    pub step: u64,
    /// The new conversation items that carry the marker.
    pub items: Vec<String>,
}

/// Every turn at which `marker` newly reached the model: a completion delivered once shows
/// up as one delivery (in however many items that client puts it), one delivered again as
/// a second. Turns of several runs count together (a later run's conversation is new).
pub fn deliveries(turns: &[Value], marker: &str) -> Vec<Delivery> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, t) in turns.iter().enumerate() {
        let new: Vec<String> = items(&t["body"])
            .into_iter()
            .filter(|item| item.contains(marker) && !seen.contains(item))
            .collect();
        if !new.is_empty() {
            seen.extend(new.iter().cloned());
            out.push(Delivery {
                turn: i,
                step: t["step"].as_u64().unwrap_or(0),
                items: new,
            });
        }
    }
    out
}

/// The task ids of "running" results the model was sent, oldest first (from
/// `structuredContent`, or the text "Job <id> is still running" where a client shows only
/// text).
pub fn running_task_ids(turns: &[Value]) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if m.get("status") == Some(&json!("running")) {
                    if let Some(id) = m.get("task_id").and_then(Value::as_str) {
                        out.push(id.to_owned());
                    }
                }
                m.values().for_each(|x| walk(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::String(s) => {
                if let Ok(inner @ (Value::Object(_) | Value::Array(_))) =
                    serde_json::from_str::<Value>(s)
                {
                    walk(&inner, out);
                } else if let Some(i) = s.find(" is still running") {
                    let id: String = s[..i].chars().rev().take(26).collect();
                    let id: String = id.chars().rev().collect();
                    if id.len() == 26 && id.chars().all(|c| c.is_ascii_alphanumeric()) {
                        out.push(id);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for t in turns {
        walk(&t["body"], &mut out);
    }
    let mut unique = Vec::new();
    for id in out {
        if !unique.contains(&id) {
            unique.push(id);
        }
    }
    unique
}

/// Whether a request offered the model a sidejob tool.
pub fn offers_sidejob(body: &Value) -> bool {
    body["tools"].as_array().is_some_and(|tools| {
        tools
            .iter()
            .any(|t| t.to_string().to_lowercase().contains("sidejob"))
    })
}

// ---- Running a client --------------------------------------------------------------------

/// What a client run left: its exit status (`None`: killed at the deadline) and output.
pub struct Ran {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn describe(&self) -> String {
        format!(
            "status {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` (stdin closed, output to files in `dir`), killing it after `within`.
pub fn run_bounded(mut cmd: Command, dir: &Path, within: Duration) -> Ran {
    let child = spawn_logged(&mut cmd, dir);
    finish(child, dir, within)
}

/// Spawns `cmd` in a process group of its own (the npm launchers are node scripts that
/// start the real binary: [`kill_group`] stops both), with stdin closed and its output going
/// to `dir/stdout` and `dir/stderr`.
pub fn spawn_logged(cmd: &mut Command, dir: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(dir).expect("run dir");
    let out = std::fs::File::create(dir.join("stdout")).expect("stdout file");
    let err = std::fs::File::create(dir.join("stderr")).expect("stderr file");
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// Waits for a child of [`spawn_logged`] until `within`, then kills it.
pub fn finish(mut child: Child, dir: &Path, within: Duration) -> Ran {
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break Some(s);
        }
        if Instant::now() >= deadline {
            kill_group(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        status,
        stdout: std::fs::read_to_string(dir.join("stdout")).unwrap_or_default(),
        stderr: std::fs::read_to_string(dir.join("stderr")).unwrap_or_default(),
    }
}

/// SIGKILLs a child of [`spawn_logged`] and everything in its process group (what a
/// terminal's Ctrl+C reaches, without the chance to clean up), and reaps it.
/// A client started with [`spawn_logged`] that outlives its turns (`opencode serve`): its
/// whole group is killed when this is dropped, so a test that fails on the way leaves
/// nothing running.
pub struct Served(pub Child);

impl Drop for Served {
    fn drop(&mut self) {
        kill_group(&mut self.0);
    }
}

pub fn kill_group(child: &mut Child) {
    crate::signal(-(child.id() as i32), libc::SIGKILL);
    let _ = child.wait();
}

/// A clean environment for a client: `PATH` (the system's, and the clients' own directory
/// for the node launchers), `HOME`, `TMPDIR` and the XDG directories under `home`, nothing
/// else.
pub fn isolated(cmd: &mut Command, home: &Path) {
    for d in [".config", ".local/share", ".cache", ".local/state", "tmp"] {
        std::fs::create_dir_all(home.join(d)).expect("home dirs");
    }
    let node_dir = which("node").and_then(|p| p.parent().map(Path::to_path_buf));
    let mut path = agents_dir().display().to_string();
    if let Some(n) = node_dir {
        path.push_str(&format!(":{}", n.display()));
    }
    path.push_str(":/usr/local/bin:/usr/bin:/bin");
    cmd.env_clear()
        .env("PATH", path)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        // Its own temporary directory too: clients keep locks and sockets there.
        .env("TMPDIR", home.join("tmp"));
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}
