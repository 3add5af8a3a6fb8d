//! The client commands, one function each.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::args::{Cli, LogFormat, Shell};
use super::call::exit_code_of;
use super::format::{format_ms, print_table, short_ids, Spinner};
use super::Client;
use crate::config::Config;
use crate::protocol::{DaemonStatusResult, Task, TaskState};

pub(super) fn serve(
    socket: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    config: Option<PathBuf>,
    log_format: LogFormat,
    metrics_addr: Option<std::net::SocketAddr>,
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
    if metrics_addr.is_some() {
        cfg.metrics_addr = metrics_addr;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("SIDEJOB_LOG")
        .unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        // One JSON object per line, with the span fields (session, task) it happened in.
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    crate::sys::one_heap_arena();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(crate::server::serve(cfg))?;
    Ok(0)
}

pub(super) struct TasksArgs {
    pub session: Option<String>,
    pub all: bool,
    pub states: Vec<String>,
    pub json: bool,
}

/// Finished tasks shown without `--all`.
const RECENT_FINISHED: usize = 10;

pub(super) fn tasks(socket: &Path, a: TasksArgs) -> Result<i32> {
    let mut states = Vec::new();
    for s in &a.states {
        states.push(TaskState::parse(s).with_context(|| {
            format!("unknown state {s:?}; states are queued, running, awaiting_input, scheduled, succeeded, failed, canceled")
        })?);
    }
    let mut client = Client::connect(socket)?;
    let mut all = client.all_tasks(a.session.as_deref())?;
    all.sort_by(|x, y| {
        x.created_at
            .cmp(&y.created_at)
            .then(x.task_id.cmp(&y.task_id))
    });
    all.dedup_by(|x, y| x.task_id == y.task_id);
    if !states.is_empty() {
        all.retain(|t| states.contains(&t.state));
    } else if !a.all {
        // Every live task, and the most recent finished ones.
        let finished: Vec<usize> = all
            .iter()
            .enumerate()
            .filter(|(_, t)| t.state.is_terminal())
            .map(|(i, _)| i)
            .collect();
        let drop_before = finished.len().saturating_sub(RECENT_FINISHED);
        let dropped: std::collections::HashSet<usize> =
            finished.into_iter().take(drop_before).collect();
        let mut i = 0;
        all.retain(|_| {
            i += 1;
            !dropped.contains(&(i - 1))
        });
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "tasks": all }))?
        );
        return Ok(0);
    }
    if all.is_empty() {
        println!("no tasks");
        return Ok(0);
    }
    let ids: Vec<&str> = all.iter().map(|t| t.task_id.as_str()).collect();
    let short = short_ids(&ids);
    let rows: Vec<[String; 7]> = all
        .iter()
        .zip(short)
        .map(|(t, id)| {
            [
                id,
                t.session_id.clone(),
                t.state.as_str().to_owned(),
                t.exit_code
                    .map(|c| c.to_string())
                    .or(t.signal.map(|s| format!("sig {s}")))
                    .unwrap_or_else(|| "-".into()),
                t.duration_ms.map(format_ms).unwrap_or_else(|| "-".into()),
                super::format::profile_with_grants(&t.profile, t.grants.as_ref()),
                t.summary.clone(),
            ]
        })
        .collect();
    print_table(
        &[
            "TASK", "SESSION", "STATE", "EXIT", "TOOK", "PROFILE", "SUMMARY",
        ],
        &rows,
    );
    Ok(0)
}

pub(super) fn logs(socket: &Path, task: &str, follow: bool, tail: Option<usize>) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let task = client.resolve_task(task)?;
    let mut out = std::io::stdout();
    let mut offset = 0u64;
    if let Some(lines) = tail {
        // Enough bytes for N ordinary lines; then keep only the last N.
        let want = (lines as u64 * 1024).clamp(64 * 1024, 8 * 1024 * 1024);
        let page = client.call(
            "task.output",
            json!({"task_id": task, "tail_bytes": want, "max_bytes": want}),
        )?;
        let data = page["data"].as_str().unwrap_or("");
        let body = data.strip_suffix('\n').unwrap_or(data);
        let start = if lines == 0 {
            body.len()
        } else {
            body.rmatch_indices('\n')
                .nth(lines - 1)
                .map(|(i, _)| i + 1)
                .unwrap_or(0)
        };
        out.write_all(&data.as_bytes()[start.min(data.len())..])?;
        out.flush()?;
        offset = page["next_offset"].as_u64().unwrap_or(0);
        if !follow || page["eof"].as_bool().unwrap_or(false) {
            return Ok(0);
        }
    }
    loop {
        let page = client.call_again_if_lost(
            socket,
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
            // Nothing new: block until the task settles or a moment passes.
            client.call_again_if_lost(
                socket,
                "task.wait",
                json!({"task_id": task, "timeout_ms": 200}),
            )?;
        }
        offset = next;
    }
}

pub(super) fn wait(
    socket: &Path,
    task: &str,
    timeout: Option<Duration>,
    json_out: bool,
) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let task = client.resolve_task(task)?;
    let started = Instant::now();
    let spinner = Spinner::start(!json_out, &format!("waiting for {task}"));
    let task: Task = loop {
        let slice = timeout
            .map(|l| l.saturating_sub(started.elapsed()).as_millis() as u64)
            .unwrap_or(u64::MAX)
            .min(1_000);
        let t: Task = serde_json::from_value(client.call_again_if_lost(
            socket,
            "task.wait",
            json!({"task_id": task, "timeout_ms": slice}),
        )?)
        .context("unexpected task.wait result")?;
        if t.state.is_terminal() || timeout.is_some_and(|l| started.elapsed() >= l) {
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
    }
    if !task.state.is_terminal() {
        return Ok(124);
    }
    Ok(exit_code_of(
        task.state,
        task.exit_code,
        task.signal,
        task.reason,
    ))
}

pub(super) fn cancel(
    socket: &Path,
    tasks: &[String],
    grace: Option<Duration>,
    json_out: bool,
) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let mut code = 0;
    for given in tasks {
        let task = match client.resolve_task(given) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("sidejob: {e}");
                code = 1;
                continue;
            }
        };
        let mut params = json!({ "task_id": task });
        if let Some(g) = grace {
            params["grace_ms"] = json!(g.as_millis() as u64);
        }
        let r = match client.call("task.cancel", params) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("sidejob: {task}: {e}");
                code = 1;
                continue;
            }
        };
        if json_out {
            println!("{}", serde_json::to_string(&r)?);
            continue;
        }
        match r["result"].as_str().unwrap_or("?") {
            "already_terminal" => {
                let state = client
                    .call("task.get", json!({ "task_id": task }))
                    .ok()
                    .and_then(|t| t["state"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| "finished".into());
                println!("{task} had already finished ({state}); nothing to cancel");
            }
            "cancellation_pending" => {
                println!("{task} is stopping: SIGTERM sent, SIGKILL follows after the grace")
            }
            other => println!("{task} {other}"),
        }
    }
    Ok(code)
}

/// The tools of the plugins sidejob ships (deploy/install.sh installs them): a daemon without
/// one of them is alive but not ready.
const SHIPPED_TOOLS: [&str; 3] = ["bash", "code", "subagent"];

/// What `sidejob status` prints and decides.
#[derive(Debug, Clone, Copy)]
pub(super) struct StatusOutput {
    /// The daemon.status result as JSON.
    pub json: bool,
    /// Exit 1 unless every shipped tool is loaded.
    pub ready: bool,
}

/// `sidejob status`: 0 when the daemon answers, degraded or not; with `--ready`, 1 while a
/// shipped tool is missing (each named on stderr, with the plugin errors that say why).
pub(super) fn status(socket: &Path, out: StatusOutput) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let v = client.call("daemon.status", json!({}))?;
    let s: DaemonStatusResult =
        serde_json::from_value(v.clone()).context("unexpected daemon.status result")?;
    let missing: Vec<&str> = SHIPPED_TOOLS
        .into_iter()
        .filter(|name| !s.tools.iter().any(|t| t.name == *name))
        .collect();
    let code = if out.ready && !missing.is_empty() {
        eprintln!(
            "sidejob status: not ready: the shipped tool{} {} {} not loaded",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
            if missing.len() == 1 { "is" } else { "are" }
        );
        for e in &s.plugin_errors {
            eprintln!("  plugin error: {e}");
        }
        eprintln!(
            "  hint: install the plugins into <prefix>/lib/sidejob/plugins (deploy/install.sh), \
             and see the daemon's log for why they did not load"
        );
        1
    } else {
        0
    };
    if out.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(code);
    }
    let n = |k: TaskState| s.tasks.get(k.as_str()).copied().unwrap_or(0);
    println!(
        "sidejob {} (pid {}), up {} since {}",
        s.version,
        s.pid,
        format_ms(s.uptime_ms),
        s.started_at
    );
    let whose = if crate::sys::getuid() != 0 && socket == Path::new(crate::config::SYSTEM_SOCKET) {
        " (the shared system daemon: you run none of your own)"
    } else {
        ""
    };
    println!(
        "socket     {}{}{whose}",
        s.socket,
        if s.socket_activated {
            " (from the service manager)"
        } else {
            ""
        }
    );
    println!("state dir  {}", s.state_dir);
    println!("sessions   {} open", s.sessions);
    println!(
        "tasks      {} running, {} queued, {} awaiting input, {} scheduled",
        n(TaskState::Running),
        n(TaskState::Queued),
        n(TaskState::AwaitingInput),
        n(TaskState::Scheduled)
    );
    if s.daemon_wide_counters {
        println!(
            "since start {} succeeded, {} failed, {} canceled; {} wakes pushed; {} limits hit",
            n(TaskState::Succeeded),
            n(TaskState::Failed),
            n(TaskState::Canceled),
            s.wakes_pushed,
            s.violations
        );
    }
    if s.tools.is_empty() {
        println!("tools      none loaded: install the plugins (see README, \"Install\") or set plugin_dirs");
    }
    for (i, t) in s.tools.iter().enumerate() {
        println!(
            "{}{:<10} {}",
            if i == 0 { "tools      " } else { "           " },
            t.name,
            t.plugin
        );
    }
    for e in &s.plugin_errors {
        println!("plugin error: {e}");
    }
    for e in &s.profile_errors {
        println!("profile error: {e}");
    }
    Ok(code)
}

pub(super) fn replay(state_dir: Option<PathBuf>) -> Result<i32> {
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

pub(super) fn state_dir_or_default(state_dir: Option<PathBuf>) -> PathBuf {
    state_dir.unwrap_or_else(crate::config::default_state_dir)
}

/// `sidejob registry check`.
pub(super) fn registry_check(state_dir: Option<PathBuf>) -> Result<i32> {
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
pub(super) fn registry_backup(state_dir: Option<PathBuf>) -> Result<i32> {
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
pub(super) fn registry_restore(state_dir: Option<PathBuf>) -> Result<i32> {
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
pub(super) fn registry_rebuild(
    state_dir: Option<PathBuf>,
    sessions_dir: Option<PathBuf>,
) -> Result<i32> {
    let state_dir = state_dir_or_default(state_dir);
    let sessions_dir = sessions_dir.unwrap_or_else(|| state_dir.join("sessions"));
    let _lock = stopped_daemon(&state_dir)?;
    let r = crate::registry::health::rebuild(
        &state_dir,
        crate::session::dirs::found_on_disk(&sessions_dir),
    )?;
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

pub(super) fn rpc(socket: &Path, method: &str, params: &str) -> Result<i32> {
    let params: Value = serde_json::from_str(params).with_context(|| {
        format!("params must be a JSON object, e.g. '{{\"session_id\": \"s\"}}', not {params}")
    })?;
    let mut client = Client::connect(socket)?;
    let r = client.call(method, params)?;
    println!("{}", serde_json::to_string_pretty(&r)?);
    Ok(0)
}

/// The whole command tree, built, for the completion generators. Each command's arguments
/// are built only when it runs (see `args::Command`), so clap's `help` command gets copies of
/// commands without their own subcommands, and `sidejob help schedule <TAB>` would offer
/// nothing: they are put back here, from the built tree.
fn command_for_completions() -> clap::Command {
    fn copy_for_help(c: &clap::Command, parent: &str) -> clap::Command {
        let bin_name = format!("{parent} {}", c.get_name());
        let mut copy = clap::Command::new(c.get_name().to_owned())
            .bin_name(bin_name.clone())
            .hide(c.is_hide_set())
            .disable_help_flag(true)
            .disable_version_flag(true)
            .disable_help_subcommand(true)
            .subcommands(nested(c, &bin_name));
        if let Some(about) = c.get_about() {
            copy = copy.about(about.clone());
        }
        copy
    }
    fn nested(c: &clap::Command, bin_name: &str) -> Vec<clap::Command> {
        c.get_subcommands()
            .filter(|s| s.get_name() != "help")
            .map(|s| copy_for_help(s, bin_name))
            .collect()
    }
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    let built: Vec<clap::Command> = cmd.get_subcommands().cloned().collect();
    cmd.mut_subcommand("help", |help| {
        let help_bin = help.get_bin_name().unwrap_or("sidejob help").to_owned();
        help.mut_subcommands(|entry| {
            match built.iter().find(|c| c.get_name() == entry.get_name()) {
                Some(c) if c.get_name() != "help" && entry.get_subcommands().next().is_none() => {
                    let bin_name = format!("{help_bin} {}", c.get_name());
                    entry.subcommands(nested(c, &bin_name))
                }
                _ => entry,
            }
        })
    })
}

/// `sidejob completions SHELL`: the completion script, from the same definitions as --help.
pub(super) fn completions(shell: Shell) -> Result<i32> {
    let mut cmd = command_for_completions();
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut cmd, "sidejob", &mut std::io::stdout());
    Ok(0)
}

/// `sidejob man`: sidejob.1 on stdout, or one page per command into a directory.
pub(super) fn man(dir: Option<PathBuf>) -> Result<i32> {
    let cmd = <Cli as clap::CommandFactory>::command();
    match dir {
        None => {
            clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
        }
    }
    Ok(0)
}
