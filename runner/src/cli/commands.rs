//! The client commands, one function each.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::Client;
use crate::config::Config;
use crate::protocol::{Task, TaskState, ToolCallResult};

pub fn serve(
    socket: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    config: Option<PathBuf>,
    socket_group: Option<String>,
) -> Result<i32> {
    let mut cfg = match &config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(s) = socket {
        cfg.socket = s;
    }
    if let Some(d) = state_dir {
        cfg.state_dir = d;
    }
    if socket_group.is_some() {
        cfg.socket_group = socket_group;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SIDEJOB_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(crate::server::serve(cfg))?;
    Ok(0)
}

/// The session a CLI call uses when none is named: one per working directory.
pub(super) fn default_session(cwd: &Path) -> String {
    // FNV-1a: stable across runs and versions, unlike std's hasher.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in cwd.as_os_str().as_encoded_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("cli-{:08x}", h as u32)
}

fn shell_quote(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The exit code a settled task maps to: its own, 128+signal, 124 on timeout, else 1.
fn exit_code_of(
    state: TaskState,
    exit_code: Option<i32>,
    signal: Option<i32>,
    timeout: bool,
) -> i32 {
    match (state, exit_code, signal) {
        (TaskState::Succeeded, _, _) => 0,
        _ if timeout => 124,
        (_, Some(c), _) => c,
        (_, None, Some(s)) => 128 + s,
        _ => 1,
    }
}

pub fn call(
    socket: &Path,
    session: Option<String>,
    background: bool,
    yield_after: Option<u64>,
    timeout: Option<u64>,
    json_out: bool,
    command: Vec<String>,
) -> Result<i32> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let mut client = Client::connect(socket)?;
    let session = session.unwrap_or_else(|| default_session(&cwd));
    client.call(
        "session.open",
        json!({"session_id": session, "workspace": cwd}),
    )?;
    let command = if command.len() == 1 {
        command[0].clone()
    } else {
        command
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut params = json!({"session_id": session, "tool": "bash", "args": {"command": command}, "background": background});
    if let Some(y) = yield_after {
        params["yield_after_ms"] = json!(y);
    }
    if let Some(t) = timeout {
        params["timeout_ms"] = json!(t);
    }
    let spinner = Spinner::start(!json_out && !background, "running");
    let result = client.call("tool.call", params);
    drop(spinner);
    let result = result?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    let parsed: ToolCallResult =
        serde_json::from_value(result).context("unexpected tool.call result")?;
    match parsed {
        ToolCallResult::Completed(c) => {
            if !json_out {
                print!("{}", c.output);
                std::io::stdout().flush()?;
                if let Some(err) = &c.error {
                    eprintln!("sidejob: {err}");
                }
                if let Some(hint) = &c.hint {
                    eprintln!("hint: {hint}");
                }
            }
            Ok(exit_code_of(
                c.state,
                c.exit_code,
                c.signal,
                c.reason == Some(crate::protocol::FailReason::Timeout),
            ))
        }
        ToolCallResult::Running(r) => {
            if !json_out {
                print!("{}", r.output);
                eprintln!("sidejob: task {} is running in the background", r.task_id);
                eprintln!("  sidejob logs -f {0}   follow its output\n  sidejob wait {0}      wait for it to finish", r.task_id);
            }
            Ok(0)
        }
    }
}

pub fn tasks(socket: &Path, session: Option<String>, json_out: bool) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let sessions: Vec<String> = match session {
        Some(s) => vec![s],
        None => {
            let list = client.call("session.list", json!({}))?;
            list["sessions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["session_id"].as_str().map(str::to_owned))
                .collect()
        }
    };
    let mut all: Vec<Task> = Vec::new();
    for s in sessions {
        let r = client.call("task.list", json!({"session_id": s}))?;
        all.extend(
            serde_json::from_value::<Vec<Task>>(r["tasks"].clone())
                .context("unexpected task.list result")?,
        );
    }
    if json_out {
        println!("{}", serde_json::to_string_pretty(&json!({"tasks": all}))?);
        return Ok(0);
    }
    if all.is_empty() {
        println!("no tasks");
        return Ok(0);
    }
    let rows: Vec<[String; 6]> = all
        .iter()
        .map(|t| {
            [
                t.task_id.clone(),
                t.session_id.clone(),
                t.state.as_str().to_owned(),
                t.exit_code
                    .map(|c| c.to_string())
                    .or(t.signal.map(|s| format!("sig {s}")))
                    .unwrap_or_else(|| "-".into()),
                t.duration_ms
                    .map(|d| format!("{:.1}s", d as f64 / 1000.0))
                    .unwrap_or_else(|| "-".into()),
                t.summary.clone(),
            ]
        })
        .collect();
    print_table(
        &["TASK", "SESSION", "STATE", "EXIT", "TOOK", "SUMMARY"],
        &rows,
    );
    Ok(0)
}

fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(|h| h.chars().count());
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == N {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

pub fn logs(socket: &Path, task: &str, follow: bool) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let mut offset = 0u64;
    let mut out = std::io::stdout();
    loop {
        let page = client.call(
            "task.output",
            json!({"task_id": task, "offset": offset, "max_bytes": 512 * 1024}),
        )?;
        let data = page["data"].as_str().unwrap_or("");
        out.write_all(data.as_bytes())?;
        out.flush()?;
        let next = page["next_offset"].as_u64().unwrap_or(offset);
        let eof = page["eof"].as_bool().unwrap_or(false);
        let size = page["size"].as_u64().unwrap_or(0);
        if eof || (!follow && next >= size) {
            return Ok(0);
        }
        if next == offset {
            // Nothing new: block until the task settles or half a second passes.
            client.call("task.wait", json!({"task_id": task, "timeout_ms": 500}))?;
        }
        offset = next;
    }
}

pub fn wait(socket: &Path, task: &str, timeout: Option<u64>, json_out: bool) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let started = Instant::now();
    let limit = timeout.map(Duration::from_millis);
    let spinner = Spinner::start(!json_out, &format!("waiting for {task}"));
    let task: Task = loop {
        let slice = limit
            .map(|l| l.saturating_sub(started.elapsed()).as_millis() as u64)
            .unwrap_or(u64::MAX)
            .min(1_000);
        let t: Task = serde_json::from_value(
            client.call("task.wait", json!({"task_id": task, "timeout_ms": slice}))?,
        )
        .context("unexpected task.wait result")?;
        if t.state.is_terminal() || limit.is_some_and(|l| started.elapsed() >= l) {
            break t;
        }
    };
    drop(spinner);
    if json_out {
        println!("{}", serde_json::to_string_pretty(&task)?);
    } else if task.state.is_terminal() {
        println!(
            "{} {}{}{}",
            task.task_id,
            task.state.as_str(),
            task.reason
                .map(|r| format!(" ({})", r.as_str()))
                .unwrap_or_default(),
            task.exit_code
                .map(|c| format!(" exit {c}"))
                .unwrap_or_default()
        );
    } else {
        println!(
            "{} still {} after the timeout",
            task.task_id,
            task.state.as_str()
        );
        return Ok(124);
    }
    if !task.state.is_terminal() {
        return Ok(124);
    }
    Ok(exit_code_of(
        task.state,
        task.exit_code,
        task.signal,
        task.reason == Some(crate::protocol::FailReason::Timeout),
    ))
}

pub fn cancel(socket: &Path, task: &str, grace: Option<u64>, json_out: bool) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let mut params = json!({"task_id": task});
    if let Some(g) = grace {
        params["grace_ms"] = json!(g);
    }
    let r = client.call("task.cancel", params)?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("{} {}", task, r["result"].as_str().unwrap_or("?"));
    }
    Ok(0)
}

pub fn replay(state_dir: Option<PathBuf>) -> Result<i32> {
    let state_dir = state_dir.unwrap_or_else(crate::config::default_state_dir);
    let db = state_dir.join("sidejob.db");
    if !db.exists() {
        bail!("no registry at {}", db.display());
    }
    let report = crate::registry::replay_check(&db)?;
    for d in &report.differences {
        println!("difference: {d}");
    }
    println!(
        "replayed {} events, checked {} rows: {}",
        report.events,
        report.rows_checked,
        if report.ok() {
            "the event log rebuilds the registry exactly".to_owned()
        } else {
            format!("{} differences", report.differences.len())
        }
    );
    Ok(if report.ok() { 0 } else { 1 })
}

fn state_dir_or_default(state_dir: Option<PathBuf>) -> PathBuf {
    state_dir.unwrap_or_else(crate::config::default_state_dir)
}

/// `sidejob registry check`.
pub fn registry_check(state_dir: Option<PathBuf>) -> Result<i32> {
    let state_dir = state_dir_or_default(state_dir);
    let db = state_dir.join("sidejob.db");
    if !db.exists() {
        bail!("no registry at {} (is --state-dir right?)", db.display());
    }
    crate::registry::health::check_file(&db, &state_dir)?;
    println!("{}: the file is sound", db.display());
    replay(Some(state_dir))
}

/// `sidejob registry backup`.
pub fn registry_backup(state_dir: Option<PathBuf>) -> Result<i32> {
    let state_dir = state_dir_or_default(state_dir);
    let to = crate::registry::health::backup(&state_dir)?;
    println!("backed up to {}", to.display());
    Ok(0)
}

/// The state directory's lock, so nothing replaces the registry under a running daemon.
fn stopped_daemon(state_dir: &Path) -> Result<std::fs::File> {
    crate::server::lock_state_dir(state_dir)
        .map_err(|e| anyhow::anyhow!("{e}; stop it first (the registry is in use)"))
}

/// `sidejob registry restore`.
pub fn registry_restore(state_dir: Option<PathBuf>) -> Result<i32> {
    let state_dir = state_dir_or_default(state_dir);
    let _lock = stopped_daemon(&state_dir)?;
    let aside = crate::registry::health::restore(&state_dir)?;
    if let Some(a) = aside {
        println!("the previous registry is kept as {}", a.display());
    }
    println!(
        "restored {} from {}",
        state_dir.join("sidejob.db").display(),
        crate::registry::health::backup_path(&state_dir).display()
    );
    Ok(0)
}

/// `sidejob registry rebuild`.
pub fn registry_rebuild(state_dir: Option<PathBuf>, sessions_dir: Option<PathBuf>) -> Result<i32> {
    let state_dir = state_dir_or_default(state_dir);
    let sessions_dir = sessions_dir.unwrap_or_else(|| state_dir.join("sessions"));
    let _lock = stopped_daemon(&state_dir)?;
    let r = crate::registry::health::rebuild(&state_dir, &sessions_dir)?;
    if let Some(a) = &r.set_aside {
        println!("the previous registry is kept as {}", a.display());
    }
    println!(
        "rebuilt {} with {} sessions and {} finished runs from {}",
        state_dir.join("sidejob.db").display(),
        r.sessions,
        r.tasks,
        sessions_dir.display()
    );
    Ok(0)
}

pub fn rpc(socket: &Path, method: &str, params: &str) -> Result<i32> {
    let params: Value = serde_json::from_str(params).context("params must be JSON")?;
    let mut client = Client::connect(socket)?;
    let r = client.call(method, params)?;
    println!("{}", serde_json::to_string_pretty(&r)?);
    Ok(0)
}

/// Elapsed time on stderr while the CLI waits, when stderr is a terminal.
struct Spinner {
    stop: Option<std::sync::mpsc::Sender<()>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    fn start(enabled: bool, what: &str) -> Spinner {
        if !enabled || !std::io::stderr().is_terminal() {
            return Spinner {
                stop: None,
                handle: None,
            };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let what = what.to_owned();
        let handle = std::thread::spawn(move || {
            let frames = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
            let start = Instant::now();
            // Stay quiet for short waits.
            if rx.recv_timeout(Duration::from_millis(500)).is_ok() {
                return;
            }
            for i in 0.. {
                eprint!(
                    "\r{} {what} {:.0}s ",
                    frames[i % frames.len()],
                    start.elapsed().as_secs_f64()
                );
                if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
                    break;
                }
            }
            eprint!("\r\x1b[2K");
        });
        Spinner {
            stop: Some(tx),
            handle: Some(handle),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
