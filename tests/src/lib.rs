//! The sidejob integration harness: starts the real daemon on a private socket and state
//! directory, and talks JSON-RPC to it over the real socket.
//!
//! Waiting is event-driven: tests wait on replies (`task.wait`), never on fixed sleeps. The
//! only loop that retries is the start-up wait for the socket to accept, bounded by a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test harness fails by panicking

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub mod agents;
pub mod bench;
pub mod gate;
pub mod host;
pub mod lines;
pub mod need;
pub mod net;
pub mod push;

pub use gate::Gate;
pub use lines::Lines;
pub use need::{sandbox_program, skip_without, Need};

/// The `sidejob` binary built with this workspace (`SIDEJOB_BIN` overrides).
pub fn sidejob_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SIDEJOB_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<test-binary> → target/<profile>/sidejob
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("sidejob");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p sidejob` (cargo test --workspace does)",
        bin.display()
    );
    bin
}

/// Is this process root? Tests that need root skip (with a printed reason) when it is not.
pub fn is_root() -> bool {
    // SAFETY: getuid cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::getuid() == 0
    }
}

/// Prints why a test is skipped, records the skip for the run's summary (see [`need`]), and
/// returns true when `cond` is false. For a need the CI machine declares, use
/// [`skip_without`]: it fails instead of skipping where the need was declared.
pub fn skip_unless(cond: bool, reason: &str) -> bool {
    if !cond {
        need::record_skip(reason);
    }
    !cond
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A private directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("sidejob-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    /// Also removes the `/dev/shm` directory of any daemon whose state directory was in here
    /// (see [`memory_runs_dir`]): a daemon a test started itself and killed, or stopped while
    /// a run's supervisor was finishing, leaves it, and it is named after a directory about
    /// to be gone.
    fn drop(&mut self) {
        // Level by level, so that the shallow directories, where state directories are, are
        // all looked at before the entry bound below is reached.
        let mut dirs = std::collections::VecDeque::from([(self.0.clone(), 0)]);
        let mut looked = 0;
        while let Some((dir, depth)) = dirs.pop_front() {
            if let Some(runs) = memory_runs_dir(&dir).filter(|r| r.is_dir()) {
                let _ = std::fs::remove_dir_all(runs);
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            // State directories are near the top; a big workspace is not walked.
            for e in entries.flatten().take(200) {
                looked += 1;
                if depth < 3 && looked < 2000 && e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push_back((e.path(), depth + 1));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running daemon with its own socket, state directory and a workspace to run in.
pub struct Daemon {
    pub root: TempDir,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub workspace: PathBuf,
    config: Option<PathBuf>,
    child: Option<Child>,
    /// `SIDEJOB_LOG` for the daemon: `debug` for tests (the log explains a failure).
    log_level: &'static str,
}

impl Daemon {
    /// Starts a daemon with the default configuration.
    pub fn start() -> Daemon {
        Self::start_with_config("")
    }

    /// Starts a daemon with extra TOML configuration (empty for none).
    pub fn start_with_config(toml: &str) -> Daemon {
        let mut d = Self::prepare(toml);
        d.spawn();
        d
    }

    /// Sets up the directories and configuration of a daemon without starting it (see
    /// [`Daemon::launch`]), so a test can arrange the socket path first.
    pub fn prepare(toml: &str) -> Daemon {
        let root = TempDir::new("daemon");
        let socket = root.path().join("run/sidejob.sock");
        let state_dir = root.path().join("state");
        let workspace = root.path().join("workspace");
        std::fs::create_dir_all(&workspace).expect("workspace");
        let config = (!toml.is_empty()).then(|| {
            let p = root.path().join("config.toml");
            std::fs::write(&p, toml).expect("config");
            p
        });
        Daemon {
            root,
            socket,
            state_dir,
            workspace,
            config,
            child: None,
            log_level: "debug",
        }
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log");
        let mut cmd = Command::new(sidejob_bin());
        cmd.arg("serve")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state_dir);
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        cmd.env("SIDEJOB_LOG", self.log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = cmd.spawn().expect("spawn sidejob serve");
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&self.socket).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "sidejob serve exited with {status} before listening; log:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "sidejob serve did not listen within 20 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child = Some(child);
    }

    pub fn log_path(&self) -> PathBuf {
        self.root.path().join("daemon.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket)
    }

    /// `kill -9` the daemon (its runs keep going under their supervisors).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM the daemon and wait for it to exit; returns its exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        // SAFETY: signalling our own child by pid, which we have not reaped yet.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        c.wait().ok().and_then(|s| s.code())
    }

    /// Starts the daemon again on the same socket and state.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// `cmd` (the CLI, or what runs it) given this daemon's socket and `args`, in its
    /// workspace, with no stdin.
    fn against(&self, mut cmd: Command, args: &[&str]) -> Command {
        cmd.arg("--socket")
            .arg(&self.socket)
            .args(args)
            .current_dir(&self.workspace)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs the CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.against(Command::new(sidejob_bin()), args)
            .output()
            .expect("run sidejob")
    }

    /// Runs the CLI against this daemon on a pseudo-terminal (tests/fixtures/pty_run.py),
    /// which plays `steps` (what to type, signals to send) while it runs.
    pub fn cli_on_a_terminal(&self, steps: &[&str], args: &[&str]) -> std::process::Output {
        let mut pty = Command::new("python3");
        pty.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/pty_run.py"))
            .args(steps)
            .arg("--")
            .arg(sidejob_bin());
        self.against(pty, args)
            .output()
            .expect("python3 runs tests/fixtures/pty_run.py")
    }

    /// Opens a session on the daemon's workspace; returns its id.
    pub fn open_session(&self, client: &mut Client) -> String {
        client.open_session_in(&self.workspace)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
        // Stop every supervisor of this daemon's runs (their command lines name our root, or
        // the runs directory the daemon keeps in /dev/shm); `root`, dropped next, removes
        // that directory with the state directory it is named after.
        kill_processes_mentioning(&self.root.path().display().to_string());
        let runs = runs_dir(&self.state_dir);
        if !runs.starts_with(self.root.path()) {
            kill_processes_mentioning(&runs.display().to_string());
        }
    }
}

/// Removes the directory a root daemon kept its runs' private halves in under `/dev/shm`
/// (see [`runs_dir`]), for a test or bench that is done with the daemon and its state dir.
pub fn remove_memory_runs_dir(state_dir: &Path) {
    let runs = runs_dir(state_dir);
    if !runs.starts_with(state_dir) {
        let _ = std::fs::remove_dir_all(&runs);
    }
}

/// SIGKILLs every process whose command line contains `needle`.
pub fn kill_processes_mentioning(needle: &str) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(needle) && pid != std::process::id() as i32 {
            // SAFETY: kill with a pid and a signal number.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// A JSON-RPC client over the daemon's socket. Server pushes (lines without our id) are kept
/// in `pushes`.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    pub pushes: Vec<Value>,
}

impl Client {
    pub fn connect(socket: &Path) -> Client {
        let s = UnixStream::connect(socket)
            .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        Client {
            reader: BufReader::new(s.try_clone().expect("clone")),
            writer: s,
            next_id: 1,
            pushes: Vec::new(),
        }
    }

    /// Calls a method; `Ok(result)` or `Err(error object)`.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send_value(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.reply_to(json!(id))
    }

    /// Like `call`, but panics with the error on failure.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        match self.call(method, params.clone()) {
            Ok(v) => v,
            Err(e) => panic!("{method} {params} failed: {e}"),
        }
    }

    /// Sends a `task.wait` for `task_id`, lets the daemon take it (a round trip on another
    /// connection of `d`), then runs `release` (what lets the run end) and returns the wait's
    /// answer: a run that settles at once still goes to this wait, not to a wake.
    pub fn wait_then(&mut self, d: &Daemon, task_id: &str, release: impl FnOnce()) -> Value {
        let id = json!(format!("wait-{}", self.next_id));
        self.next_id += 1;
        let mut status = d.client();
        let mut waits = || {
            status.ok("daemon.status", json!({}))["waits"]
                .as_u64()
                .unwrap()
        };
        let before = waits();
        self.send_value(&json!({"jsonrpc": "2.0", "id": id, "method": "task.wait",
            "params": {"task_id": task_id, "timeout_ms": 600_000}}));
        // The daemon answers each request in a task of its own: `waits` says when this one
        // is waiting on the run.
        assert!(
            wait_until(Duration::from_secs(30), || waits() > before),
            "the daemon never counted the task.wait as waiting"
        );
        assert_eq!(d.client().task(task_id)["state"], "running");
        release();
        self.reply_to(id).expect("task.wait")
    }

    /// Opens a session on `workspace`; returns its id.
    pub fn open_session_in(&mut self, workspace: &Path) -> String {
        let r = self.ok("session.open", json!({ "workspace": workspace }));
        r["session_id"].as_str().expect("session_id").to_owned()
    }

    /// Calls a method that must fail; returns `(code, data.kind)`.
    pub fn err(&mut self, method: &str, params: Value) -> (i64, String) {
        match self.call(method, params.clone()) {
            Ok(v) => panic!("{method} {params} should fail, got {v}"),
            Err(e) => (
                e["code"].as_i64().unwrap_or(0),
                e["data"]["kind"].as_str().unwrap_or("").to_owned(),
            ),
        }
    }

    pub fn send_value(&mut self, v: &Value) {
        let mut line = serde_json::to_vec(v).expect("encode");
        line.push(b'\n');
        self.writer.write_all(&line).expect("write");
    }

    /// Writes raw bytes (a newline is not added).
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.writer.write_all(bytes)
    }

    pub fn set_read_timeout(&mut self, t: Duration) {
        let _ = self
            .reader
            .get_ref()
            .set_read_timeout(Some(t.max(Duration::from_millis(1))));
    }

    /// Like `read_message`, but `None` also when the read timeout passes.
    pub fn read_message_timeout(&mut self) -> Option<Value> {
        let mut buf = String::new();
        match self.reader.read_line(&mut buf) {
            Ok(0) | Err(_) => None,
            Ok(_) => serde_json::from_str(&buf).ok(),
        }
    }

    /// Reads the next line from the server as JSON (`None` at end of stream).
    pub fn read_message(&mut self) -> Option<Value> {
        let mut buf = String::new();
        match self.reader.read_line(&mut buf) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(
                serde_json::from_str(&buf)
                    .unwrap_or_else(|e| panic!("server sent non-JSON {buf:?}: {e}")),
            ),
        }
    }

    /// Reads until the reply with `id`; pushes met on the way are kept.
    pub fn reply_to(&mut self, id: Value) -> Result<Value, Value> {
        loop {
            let msg = self
                .read_message()
                .expect("connection closed before the reply");
            if msg.get("id") == Some(&id)
                && (msg.get("result").is_some() || msg.get("error").is_some())
            {
                return match msg.get("error") {
                    Some(e) => Err(e.clone()),
                    None => Ok(msg["result"].clone()),
                };
            }
            self.pushes.push(msg);
        }
    }

    /// Runs a bash command through `tool.call` with extra parameters merged in.
    pub fn bash(&mut self, session: &str, command: &str, extra: Value) -> Value {
        let mut p = json!({"session_id": session, "tool": "bash", "args": {"command": command}});
        if let (Some(p), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                p.insert(k.clone(), v.clone());
            }
        }
        self.ok("tool.call", p)
    }

    /// Waits (up to 60 s) for a task to settle and returns it.
    pub fn wait_settled(&mut self, task_id: &str) -> Value {
        let t = self.ok(
            "task.wait",
            json!({"task_id": task_id, "timeout_ms": 60_000}),
        );
        assert!(
            matches!(
                t["state"].as_str(),
                Some("succeeded" | "failed" | "canceled")
            ),
            "task {task_id} did not settle within 60 s: {t}"
        );
        t
    }

    /// Waits for a task to settle and returns it without claiming its delivery: polls
    /// `task.get` (a `task.wait` would take the result for itself), for tests of wakes.
    pub fn wait_settled_quietly(&mut self, task_id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let t = self.ok("task.get", json!({"task_id": task_id}));
            if matches!(
                t["state"].as_str(),
                Some("succeeded" | "failed" | "canceled")
            ) {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "task {task_id} did not settle: {t}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The whole output of a task.
    pub fn output(&mut self, task_id: &str) -> String {
        let mut out = String::new();
        let mut offset = 0;
        loop {
            let page = self.ok(
                "task.output",
                json!({"task_id": task_id, "offset": offset, "max_bytes": 512 * 1024}),
            );
            out.push_str(page["data"].as_str().unwrap_or(""));
            let next = page["next_offset"].as_u64().unwrap_or(0);
            if next >= page["size"].as_u64().unwrap_or(0) {
                return out;
            }
            offset = next;
        }
    }

    /// Waits (up to 10 s) until the task's output contains `needle`: the command says it
    /// is ready, so everything before it has happened.
    pub fn wait_for_output(&mut self, task_id: &str, needle: &str) {
        let mut out = String::new();
        assert!(
            wait_until(Duration::from_secs(10), || {
                out = self.output(task_id);
                out.contains(needle)
            }),
            "the run never printed {needle:?}; output: {out:?}"
        );
    }
}

/// Is `pid` alive (and not a zombie)?
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X"),
        Err(_) => false,
    }
}

// ---- Helpers for the core-runner tests (issue 2) ----

/// A well-formed task id (a 26-character ULID) that no daemon has issued.
pub const UNKNOWN_TASK_ID: &str = "01ARZ3NDEKTSV4RRFFQ69G5FAV";

impl Daemon {
    /// Starts a daemon made with [`Daemon::prepare`], or starts this one again after
    /// [`Daemon::terminate`] (waits until the socket accepts).
    pub fn launch(&mut self) {
        assert!(self.child.is_none(), "the daemon is already running");
        self.spawn();
    }

    /// The config file this daemon was started with, if any.
    pub fn config_path(&self) -> Option<&Path> {
        self.config.as_deref()
    }

    /// Runs the CLI against this daemon as another user (root only).
    pub fn cli_as(&self, uid: u32, gid: u32, args: &[&str]) -> std::process::Output {
        use std::os::unix::process::CommandExt;
        Command::new(sidejob_bin())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .current_dir("/")
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::null())
            .output()
            .expect("run sidejob as another user")
    }
}

impl Client {
    /// `task.wait` with a timeout; returns the Task as the daemon answered.
    pub fn wait_for(&mut self, task_id: &str, timeout_ms: u64) -> Value {
        self.ok(
            "task.wait",
            json!({"task_id": task_id, "timeout_ms": timeout_ms}),
        )
    }

    /// `task.get`.
    pub fn task(&mut self, task_id: &str) -> Value {
        self.ok("task.get", json!({"task_id": task_id}))
    }
}

/// Checks `cond` every few milliseconds until it holds or `within` passes; returns whether it
/// held. Only for conditions no event announces (a process gone, a file written while the
/// daemon is down); everything the daemon reports is waited on through the daemon.
pub fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The value of `key` in `/proc/<who>/status` (`who`: a pid, `self` or `thread-self`),
/// trimmed; `None` when the process is gone or has no such line.
pub fn proc_status(who: &str, key: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{who}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    })
}

/// Every process's children as this process's PID namespace sees them (parent pid → child
/// pids), from one pass over `/proc`.
pub fn children_by_parent() -> std::collections::HashMap<i32, Vec<i32>> {
    let mut map: std::collections::HashMap<i32, Vec<i32>> = std::collections::HashMap::new();
    for pid in std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        if let Some(ppid) = proc_status(&pid.to_string(), "PPid").and_then(|p| p.parse().ok()) {
            map.entry(ppid).or_default().push(pid);
        }
    }
    map
}

/// Live (non-zombie) processes whose command line contains `needle`, this process excluded.
pub fn pids_mentioning(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline: Vec<u8> = cmdline
            .into_iter()
            .map(|b| if b == 0 { b' ' } else { b })
            .collect();
        if String::from_utf8_lossy(&cmdline).contains(needle) && process_alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// A `sleep` duration unique to this call, to find a run's processes by their argv:
/// `300.<pid><n>` (sleep takes fractional seconds).
pub fn unique_sleep() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("300.{}{:04}", std::process::id(), n)
}

/// Sends a signal to a pid.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill with a pid and a signal number has no memory-safety preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Live processes whose whole command line (arguments joined by spaces) is `cmdline`.
pub fn pids_running(cmdline: &str) -> Vec<i32> {
    pids_mentioning(cmdline)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<String> = c
                    .split(|b| *b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                args.join(" ") == cmdline
            })
        })
        .collect()
}

// ---- Acting as another local user ----

/// The uid (and gid) tests use as a second, unprivileged local user.
pub const NOBODY: u32 = 65534;

/// Connects `stream_fn`'s socket as `uid`/`gid` with no supplementary groups: the connect is
/// made on a thread of its own whose credentials are switched with the raw system calls (the
/// kernel keeps credentials per thread; the daemon reads them with `SO_PEERCRED` as they were
/// at `connect`), so the rest of the test process stays root. Root only.
pub fn connect_as(socket: &Path, uid: u32, gid: u32) -> std::io::Result<UnixStream> {
    connect_with_groups(socket, uid, gid, &[])
}

/// [`connect_as`] with `groups` as the supplementary groups (`SO_PEERGROUPS`).
pub fn connect_with_groups(
    socket: &Path,
    uid: u32,
    gid: u32,
    groups: &[u32],
) -> std::io::Result<UnixStream> {
    let socket = socket.to_path_buf();
    let groups: Vec<libc::gid_t> = groups.to_vec();
    std::thread::spawn(move || {
        // SAFETY: integer arguments and a list of `groups.len()` gids that lives across the
        // call; these change only the calling thread's credentials, and the thread ends
        // right after the connect.
        #[allow(unsafe_code)]
        unsafe {
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        UnixStream::connect(&socket)
    })
    .join()
    .expect("connect thread")
}

impl Client {
    /// A client connected as another user (see [`connect_as`]).
    pub fn connect_as(socket: &Path, uid: u32, gid: u32) -> Client {
        let s = connect_as(socket, uid, gid)
            .unwrap_or_else(|e| panic!("connect {} as uid {uid}: {e}", socket.display()));
        Client::from_stream(s)
    }

    /// A client over a connected stream.
    pub fn from_stream(s: UnixStream) -> Client {
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        Client {
            reader: BufReader::new(s.try_clone().expect("clone")),
            writer: s,
            next_id: 1,
            pushes: Vec::new(),
        }
    }
}

// ---- Helpers for a suite that cannot pass by accident (issue 14) ----

impl Daemon {
    /// Waits up to `within` for the daemon to exit on its own (no signal sent); its exit
    /// code, or `None` if it is still running then (it is killed when dropped).
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut().expect("daemon running");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Client {
    /// Reads until the server closes the connection (end of stream or a reset), keeping what
    /// arrives in `pushes`; false if it is still open after `within`.
    pub fn wait_closed(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let closed = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break false;
            }
            self.set_read_timeout(left);
            let mut buf = String::new();
            match self.reader.read_line(&mut buf) {
                Ok(0) => break true,
                Ok(_) => {
                    if let Ok(v) = serde_json::from_str(&buf) {
                        self.pushes.push(v);
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break true,
            }
        };
        self.set_read_timeout(Duration::from_secs(120));
        closed
    }
}

impl Daemon {
    /// A client of this daemon connected as uid/gid [`NOBODY`] (start the daemon with
    /// `socket_group = "65534"` so that user may connect).
    pub fn nobody(&self) -> Client {
        Client::connect_as(&self.socket, NOBODY, NOBODY)
    }

    /// A workspace directory owned by [`NOBODY`] under this daemon's root.
    pub fn nobody_workspace(&self, name: &str) -> PathBuf {
        let ws = self.root.path().join(name);
        std::fs::create_dir_all(&ws).expect("workspace");
        std::os::unix::fs::chown(&ws, Some(NOBODY), Some(NOBODY)).expect("chown workspace");
        ws
    }
}

impl Daemon {
    /// Lets every user reach the socket (the daemon makes it 0660 and root-owned), for tests
    /// that connect as another uid.
    pub fn let_everyone_connect(&self) {
        use std::os::unix::fs::PermissionsExt;
        let mut dir = self.socket.parent();
        while let Some(p) = dir {
            let mode = std::fs::metadata(p).expect("stat").permissions().mode();
            if mode & 0o001 == 0 {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o011))
                    .expect("chmod dir");
            }
            if p == std::env::temp_dir() || p.parent().is_none() {
                break;
            }
            dir = p.parent();
        }
        std::fs::set_permissions(&self.socket, std::fs::Permissions::from_mode(0o666))
            .expect("chmod socket");
    }

    /// A JSON-RPC client whose connection belongs to `uid`/`gid` (root only; call
    /// [`Daemon::let_everyone_connect`] first): a relay process with that uid holds the
    /// connection, so the daemon sees that uid through `SO_PEERCRED`.
    pub fn client_as(&self, uid: u32, gid: u32) -> Client {
        use std::os::fd::OwnedFd;
        use std::os::unix::process::CommandExt;
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let probe = sidejob_bin()
            .parent()
            .expect("target dir")
            .join("sidejob-probe");
        let mut relay = Command::new(probe)
            .arg("relay")
            .arg(&self.socket)
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::from(OwnedFd::from(
                theirs.try_clone().expect("clone"),
            )))
            .stdout(Stdio::from(OwnedFd::from(theirs)))
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the relay");
        // Reaped when the test's end of the pair closes and the relay exits.
        std::thread::spawn(move || relay.wait());
        ours.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        let mut c = Client {
            reader: BufReader::new(ours.try_clone().expect("clone")),
            writer: ours,
            next_id: 1,
            pushes: Vec::new(),
        };
        // The first answer proves the relay is connected (and as whom).
        let init = c.ok("initialize", json!({}));
        assert_eq!(init["uid"], uid, "the relay connected as {init}");
        c
    }
}

/// The name a root daemon whose state directory is `state_dir` gives its directory in
/// `/dev/shm`: `sidejob-runs-<dev>-<inode>` of the state directory (`None` without one).
pub fn memory_runs_dir(state_dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(state_dir).ok()?;
    Some(PathBuf::from(format!(
        "/dev/shm/sidejob-runs-{}-{}",
        m.dev(),
        m.ino()
    )))
}

/// Where a daemon whose state directory is `state_dir` keeps its runs' private halves: its
/// directory in `/dev/shm` ([`memory_runs_dir`]) once it has one, else `<state_dir>/runs`.
pub fn runs_dir(state_dir: &Path) -> PathBuf {
    memory_runs_dir(state_dir)
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| state_dir.join("runs"))
}

impl Daemon {
    /// A run's private directory, `<runs_dir>/<task_id>` (its launch plan, the supervisor's
    /// pid file and log): the daemon's, out of every caller's reach. See [`runs_dir`].
    pub fn private_dir(&self, task_id: &str) -> PathBuf {
        runs_dir(&self.state_dir).join(task_id)
    }

    /// Starts a daemon logging at `level` (`SIDEJOB_LOG`) instead of `debug`: for
    /// measurements, where debug logging would slow the daemon down.
    pub fn start_with_log(toml: &str, level: &'static str) -> Daemon {
        let mut d = Self::prepare(toml);
        d.log_level = level;
        d.spawn();
        d
    }
}

/// The pid in a run's `supervisor.pid` (in its private directory), once it has been
/// written whole; fails the test after 10 s without one.
pub fn supervisor_pid(private_dir: &Path) -> i32 {
    let file = private_dir.join("supervisor.pid");
    assert!(
        wait_until(Duration::from_secs(10), || std::fs::read_to_string(&file)
            .is_ok_and(|s| s.ends_with('\n'))),
        "no supervisor.pid in {}",
        private_dir.display()
    );
    std::fs::read_to_string(&file)
        .expect("supervisor.pid")
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a pid")
}

/// Runs `sh -c script` as `uid`/`gid` in `/` (std drops root's supplementary groups): what
/// another local user does on the host between calls. Returns its output. Root only.
pub fn sh_as(uid: u32, gid: u32, script: &str) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir("/")
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null())
        .output()
        .expect("run sh as another user")
}
