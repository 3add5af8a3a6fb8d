//! `sidejob call`: a person's shell command through the daemon. It waits until the command
//! ends and exits with its code, streaming the output as it comes (as `exec` does); moving to
//! the background is opt-in (`--background`, `--yield-after`). Ctrl+C cancels the run; a
//! second Ctrl+C, within the cancel's grace, takes the cancel back, leaves the run going and
//! prints its id (exit 75).
//!
//! The command's stderr goes to this process's stderr when that is a different file from its
//! stdout (`tool.call`'s `stderr: "separate"`, then `task.output`'s segments), else both to
//! stdout, as one stream; `--json` prints the result alone on stdout.
//!
//! The run is started detached (`background: true`), so the daemon's interactive deadline
//! never stops a long build, and a `task.wait` on a second connection takes its result: the
//! result is delivered to this command (no wake) unless the command leaves early.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use super::args::CallArgs;
use super::Client;
use crate::protocol::{CompletedCall, Delivery, FailReason, Task, TaskState, ToolCallResult};

/// Exit code when the command was canceled from this terminal (Ctrl+C), as shells use.
const EXIT_INTERRUPTED: i32 = 130;
/// Exit code when `--yield-after` left the run in the background (EX_TEMPFAIL): it has not
/// succeeded (yet), so `sidejob call ... && next` does not go on.
pub(super) const EXIT_YIELDED: i32 = 75;
/// The longest `task.wait` the daemon honours.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The session a CLI call uses when none is named: one per user and working directory,
/// `cli-<uid>-<hash>`. The uid is part of it so that root never lands in another user's
/// session by accident.
pub(super) fn default_session(uid: u32, cwd: &Path) -> String {
    derived_session("cli", uid, cwd)
}

/// The session of `call --profile P` in a directory: `cli-<uid>-<hash of the directory and
/// P>`, opened with that profile.
fn profile_session(uid: u32, cwd: &Path, profile: &str) -> String {
    let mut key = cwd.as_os_str().to_owned();
    key.push("\0");
    key.push(profile);
    derived_session("cli", uid, Path::new(&key))
}

/// `<prefix>-<uid>-<hash of the directory>`: the same id for every run of the same user
/// in the same directory (`cli` for the command line, `mcp` for `sidejob mcp`).
pub(super) fn derived_session(prefix: &str, uid: u32, cwd: &Path) -> String {
    // FNV-1a: stable across runs and versions, unlike std's hasher.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in cwd.as_os_str().as_encoded_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{prefix}-{uid}-{:08x}", h as u32)
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
pub(super) fn exit_code_of(
    task_state: TaskState,
    exit_code: Option<i32>,
    signal: Option<i32>,
    reason: Option<FailReason>,
) -> i32 {
    match (task_state, exit_code, signal) {
        (TaskState::Succeeded, _, _) => 0,
        _ if reason == Some(FailReason::Timeout) => 124,
        (_, Some(c), _) => c,
        (_, None, Some(s)) => 128 + s,
        _ => 1,
    }
}

/// `--env NAME` (value from this environment) and `--env NAME=VALUE`.
fn env_map(vars: &[String]) -> Result<Map<String, Value>> {
    let mut out = Map::new();
    for v in vars {
        let (name, value) = match v.split_once('=') {
            Some((n, val)) => (n.to_owned(), val.to_owned()),
            None => {
                let val = std::env::var(v).with_context(|| {
                    format!("--env {v}: {v} is not set here; write --env {v}=VALUE to set it")
                })?;
                (v.clone(), val)
            }
        };
        if name.is_empty() || name.contains('\0') {
            bail!("--env {v}: not a variable name");
        }
        out.insert(name, Value::String(value));
    }
    Ok(out)
}

/// What the command line asked to run, as a tool and its arguments.
fn tool_and_args(a: &CallArgs) -> Result<(String, Value)> {
    match (&a.tool, &a.args) {
        (Some(tool), Some(args)) => {
            let args: Value = serde_json::from_str(args)
                .with_context(|| format!("--args is not JSON: {args}"))?;
            if !args.is_object() {
                bail!("--args must be a JSON object, e.g. --args '{{\"command\": \"ls\"}}'");
            }
            if !a.env.is_empty() {
                bail!(
                    "--env applies to bash commands; give the {tool} tool its variables in --args"
                );
            }
            Ok((tool.clone(), args))
        }
        _ if a.command.is_empty() => {
            bail!("give the command after `--`, e.g. sidejob call -- make test (or --tool NAME --args JSON)")
        }
        _ => {
            let command = if a.command.len() == 1 {
                a.command[0].clone()
            } else {
                a.command
                    .iter()
                    .map(|s| shell_quote(s))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let mut args = json!({ "command": command });
            if !a.env.is_empty() {
                args["env"] = Value::Object(env_map(&a.env)?);
            }
            Ok(("bash".into(), args))
        }
    }
}

/// `--read`, `--write` and `--allow` as a call's `grants`; `None` when none was given.
/// Relative paths are taken from `cwd`, as `exec` takes them.
fn grants(a: &CallArgs, cwd: &Path) -> Result<Option<Value>> {
    if a.read.is_empty() && a.write.is_empty() && a.allow.is_empty() {
        return Ok(None);
    }
    let absolute = |flag: &str, p: &Path| {
        super::format::absolute_path(flag, cwd, p).map_err(anyhow::Error::msg)
    };
    let read = a
        .read
        .iter()
        .map(|p| absolute("--read", p))
        .collect::<Result<Vec<_>>>()?;
    let write = a
        .write
        .iter()
        .map(|p| absolute("--write", p))
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(
        json!({"readable": read, "writable": write, "allow": a.allow}),
    ))
}

enum Event {
    /// The waiting connection's answer: the task settled, or the wait ran out.
    Waited(Box<Result<Task, String>>),
    Interrupt,
}

pub(super) fn call(socket: &Path, a: CallArgs) -> Result<i32> {
    let (tool, args) = tool_and_args(&a)?;
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let grants = grants(&a, &cwd)?;
    // `--profile` without `--session`: this directory's session of that profile (a call may
    // only narrow its session's profile, and most profiles widen the default one).
    let session = match (&a.session, &a.profile) {
        (Some(s), _) => s.clone(),
        (None, None) => default_session(crate::sys::getuid(), &cwd),
        (None, Some(p)) => profile_session(crate::sys::getuid(), &cwd, p),
    };
    let mut client = Client::connect(socket)?;
    let mut open = json!({"session_id": session, "workspace": cwd});
    if a.session.is_none() {
        if let Some(p) = &a.profile {
            open["profile"] = json!(p);
        }
    }
    let mut params = json!({"session_id": session, "tool": tool, "args": args, "background": true});
    if a.adopt {
        open["adopt"] = json!(true);
        params["adopt"] = json!(true);
    }
    client.call("session.open", open)?;
    if let Some(t) = a.timeout {
        params["timeout_ms"] = json!(t.as_millis() as u64);
    }
    if let (Some(p), Some(_)) = (&a.profile, &a.session) {
        params["profile"] = json!(p);
    }
    if a.stdin {
        params["stdin"] = json!("pipe");
    }
    if let Some(g) = grants {
        params["grants"] = g;
    }
    // Ctrl+C is ours from before the run starts, so it never kills this command while the
    // run goes on unseen.
    let (tx, events) = mpsc::channel::<Event>();
    if !a.background {
        catch_interrupts(tx.clone())?;
    }
    // A daemon older than `stderr` refuses the parameter: the call is made again without it,
    // and the output is shown as one stream.
    let mut separate = !a.json && !a.background && super::exec::stderr_is_separate();
    if separate {
        params["stderr"] = json!("separate");
    }
    let reply = match client.call("tool.call", params.clone()) {
        Err(super::client::ClientError::Rpc(e))
            if separate && e.code == crate::protocol::ErrorKind::InvalidParams.code() =>
        {
            separate = false;
            if let Some(p) = params.as_object_mut() {
                p.remove("stderr");
            }
            client.call("tool.call", params)?
        }
        r => r?,
    };
    let started: ToolCallResult =
        serde_json::from_value(reply.clone()).context("unexpected tool.call result")?;
    let task_id = match started {
        ToolCallResult::Running(r) => r.task_id,
        // A run that could not start settles at once.
        ToolCallResult::Completed(c) => return finish_completed(&c, a.json),
    };
    if a.background {
        if a.json {
            println!("{}", serde_json::to_string_pretty(&reply)?);
        } else {
            println!("{task_id}");
        }
        return Ok(0);
    }
    if a.stdin {
        forward_stdin(socket, &task_id);
    }
    // The wait that takes the result, on its own connection (the daemon drops it if this
    // process goes away, so a result is never handed to a reader that is gone).
    {
        let (socket, task_id, tx) = (socket.to_path_buf(), task_id.clone(), tx.clone());
        let yield_after = a.yield_after;
        std::thread::spawn(move || {
            let waited = wait_for(&socket, &task_id, yield_after);
            let _ = tx.send(Event::Waited(Box::new(waited)));
        });
    }
    drop(tx);
    let show = if separate {
        Show::ByStream
    } else {
        Show::Stdout
    };
    stream(socket, &mut client, &task_id, &events, &a, show)
}

/// Where the streamed output goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Show {
    /// All of it to stdout.
    Stdout,
    /// Each stream to its own (the run has a separate stderr).
    ByStream,
}

/// Writes one page of output: by stream when asked and the daemon cut it so, else `data`.
fn show_page(page: &Value, show: Show) -> std::io::Result<()> {
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    match (show, page["segments"].as_array()) {
        (Show::ByStream, Some(segments)) => {
            for seg in segments {
                let text = seg["text"].as_str().unwrap_or("");
                if seg["stream"] == "stderr" {
                    out.flush()?;
                    err.write_all(text.as_bytes())?;
                } else {
                    out.write_all(text.as_bytes())?;
                }
            }
        }
        (Show::ByStream, None) | (Show::Stdout, _) => {
            out.write_all(page["data"].as_str().unwrap_or("").as_bytes())?
        }
    }
    out.flush()
}

/// Takes back the cancel of the first Ctrl+C (`task.cancel` with `withdraw`). That cancel
/// went out on a connection of its own and the daemon answers each request in a task of its
/// own, so this one can overtake it: answered `withdrawn` with nothing `taken_back`, it is
/// asked again until the cancel has reached the run (and is taken back) or the run ends.
fn withdraw(socket: &Path, task_id: &str, cancel_sent: bool) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut c = Client::connect(socket)?;
    loop {
        // Asking twice takes back no more than once.
        let r = c.call_again_if_lost(
            socket,
            "task.cancel",
            json!({"task_id": task_id, "withdraw": true}),
        )?;
        // An older daemon says nothing of it: what it withdrew stood.
        let overtook = r["result"] == "withdrawn" && r["taken_back"] == false;
        if !(overtook && cancel_sent) || Instant::now() >= deadline {
            return Ok(r);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the task settles, or until `yield_after` passes.
fn wait_for(socket: &Path, task_id: &str, yield_after: Option<Duration>) -> Result<Task, String> {
    let mut c = Client::connect(socket).map_err(|e| e.to_string())?;
    let timeout = yield_after.unwrap_or(MAX_WAIT).min(MAX_WAIT).as_millis() as u64;
    loop {
        let t: Task = c
            .call_again_if_lost(
                socket,
                "task.wait",
                json!({"task_id": task_id, "timeout_ms": timeout}),
            )
            .map_err(|e| e.to_string())
            .and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string()))?;
        if t.state.is_terminal() || yield_after.is_some() {
            return Ok(t);
        }
    }
}

/// Acks the inbox entry `task`'s completion made (nothing is said if that fails: it only
/// stays unread, as it would have).
fn dismiss_wake(socket: &Path, client: &mut Client, task: &Task) {
    let Ok(list) = client.call_again_if_lost(
        socket,
        "inbox.list",
        json!({"session_id": task.session_id, "unread_only": true}),
    ) else {
        return;
    };
    let ids: Vec<&str> = list["notifications"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["kind"] == "wake" && n["task_id"] == task.task_id.as_str())
        .filter_map(|n| n["id"].as_str())
        .collect();
    if !ids.is_empty() {
        let _ = client.call_again_if_lost(socket, "inbox.ack", json!({ "ids": ids }));
    }
}

/// SIGINT becomes an [`Event::Interrupt`]. It is blocked before this returns, so from then
/// on it waits for the thread that takes it (no handshake with that thread: on a busy machine
/// the one there was waited for a CPU for). Every thread of this command is started after
/// this and inherits the block.
fn catch_interrupts(tx: mpsc::Sender<Event>) -> Result<()> {
    let sigint = crate::sys::SigSet::of(&[nix::sys::signal::Signal::SIGINT]);
    sigint.block().context("cannot handle Ctrl+C")?;
    std::thread::Builder::new()
        .name("interrupts".into())
        .spawn(move || {
            while sigint.wait().is_ok() {
                if tx.send(Event::Interrupt).is_err() {
                    return;
                }
            }
        })
        .context("cannot start the interrupt handler")?;
    Ok(())
}

/// Copies this process's stdin to the run's (`task.message`), then closes it.
fn forward_stdin(socket: &Path, task_id: &str) {
    let (socket, task_id) = (socket.to_path_buf(), task_id.to_owned());
    std::thread::spawn(move || {
        let Ok(mut c) = Client::connect(&socket) else {
            return;
        };
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        let mut pending = Vec::new();
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            pending.extend_from_slice(&buf[..n]);
            // Send whole UTF-8 characters only (the protocol carries text).
            let cut = match std::str::from_utf8(&pending) {
                Ok(_) => pending.len(),
                Err(e) if e.error_len().is_none() && n > 0 => e.valid_up_to(),
                Err(_) => pending.len(),
            };
            let data: Vec<u8> = pending.drain(..cut).collect();
            let eof = n == 0;
            let msg =
                json!({"task_id": task_id, "data": String::from_utf8_lossy(&data), "eof": eof});
            if c.call("task.message", msg).is_err() || eof {
                return;
            }
        }
    });
}

/// Streams the output until the task settles (or the wait runs out, or the person detaches).
fn stream(
    socket: &Path,
    client: &mut Client,
    task_id: &str,
    events: &mpsc::Receiver<Event>,
    a: &CallArgs,
    show: Show,
) -> Result<i32> {
    let mut offset = 0u64;
    let mut interrupted = false;
    // Whether the cancel of the first Ctrl+C went out (a second one then takes it back).
    let mut cancel_sent = false;
    let mut settled: Option<Task> = None;
    let mut output = String::new();
    loop {
        let mut req = json!({"task_id": task_id, "offset": offset, "max_bytes": 256 * 1024});
        if show == Show::ByStream {
            req["streams"] = json!(true);
        }
        let page = client.call_again_if_lost(socket, "task.output", req)?;
        let data = page["data"].as_str().unwrap_or("");
        if a.json {
            output.push_str(data);
        } else if !data.is_empty() {
            show_page(&page, show)?;
        }
        let next = page["next_offset"].as_u64().unwrap_or(offset);
        if page["eof"].as_bool().unwrap_or(false) {
            break;
        }
        if next != offset {
            offset = next;
            continue;
        }
        // Nothing new: wait for news (the result, a Ctrl+C) or a moment for more output.
        let event = match events.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::Waited(w)) => Ok(*w),
            Ok(Event::Interrupt) => Err(Ok(())),
            Err(e) => Err(Err(e)),
        };
        match event {
            Ok(Ok(t)) if t.state.is_terminal() => settled = Some(t),
            Ok(Ok(t)) => {
                eprintln!(
                    "sidejob: {} is still {} after --yield-after; it goes on in the background\n  \
                     sidejob logs -f {0}   follow it\n  sidejob wait {0}      wait for it (exits with its code)",
                    t.task_id,
                    t.state.as_str()
                );
                return Ok(EXIT_YIELDED);
            }
            Ok(Err(e)) => bail!("lost the wait for task {task_id}: {e}"),
            Err(Ok(())) if !interrupted => {
                interrupted = true;
                // The cancel is sent before anything is said, so a second Ctrl+C cannot
                // come before it; its answer waits while the run winds down (up to the
                // grace), so it is read on a thread and a second Ctrl+C is still heard.
                let cancel = Client::connect(socket).and_then(|mut c| {
                    let id = c.send("task.cancel", json!({ "task_id": task_id }))?;
                    Ok((c, id))
                });
                cancel_sent = cancel.is_ok();
                match cancel {
                    Ok((mut c, id)) => {
                        eprintln!("\nsidejob: canceling {task_id}; Ctrl+C again leaves it running");
                        let task_id = task_id.to_owned();
                        std::thread::spawn(move || {
                            if let Err(e) = c.reply(id) {
                                eprintln!("sidejob: cannot cancel {task_id}: {e}");
                            }
                        });
                    }
                    Err(e) => eprintln!("\nsidejob: cannot cancel {task_id}: {e}"),
                }
            }
            Err(Ok(())) => {
                // Take the cancel back, so the run is not killed when its grace runs out.
                let withdrawn = withdraw(socket, task_id, cancel_sent);
                match withdrawn.as_ref().map(|r| r["result"].as_str()) {
                    Ok(Some("withdrawn")) => {
                        eprintln!("\nsidejob: left {task_id} running in the background\n  sidejob logs -f {task_id}   follow it\n  sidejob wait {task_id}      wait for it (exits with its code)");
                        println!("{task_id}");
                        return Ok(EXIT_YIELDED);
                    }
                    Ok(_) => eprintln!("\nsidejob: {task_id} is already ending; waiting for it"),
                    Err(e) => eprintln!("\nsidejob: cannot leave {task_id} running: {e}"),
                }
            }
            Err(Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected)) => {}
        }
    }
    // The output is complete; the task has settled. Take its result from the wait.
    let task = match settled {
        Some(t) => t,
        None => loop {
            match events.recv() {
                Ok(Event::Waited(w)) if w.is_ok() => {
                    if let Ok(t) = *w {
                        break t;
                    }
                }
                Ok(Event::Waited(_)) | Err(_) => {
                    break serde_json::from_value(client.call_again_if_lost(
                        socket,
                        "task.get",
                        json!({ "task_id": task_id }),
                    )?)?
                }
                Ok(Event::Interrupt) => {}
            }
        },
    };
    // A run that ended before the wait reached the daemon made a wake as well; this command
    // has shown its result, so that wake would tell the session's inbox of it a second time.
    if task.delivery == Some(Delivery::Wake) {
        dismiss_wake(socket, client, &task);
    }
    if a.json {
        // As tool.call would answer inline: at most the last MiB.
        let keep = 1024 * 1024;
        let cut = output.len() > keep;
        if cut {
            let mut start = output.len() - keep;
            while !output.is_char_boundary(start) {
                start += 1;
            }
            output.drain(..start);
        }
        let c = CompletedCall {
            task_id: task.task_id.clone(),
            state: task.state,
            reason: task.reason,
            exit_code: task.exit_code,
            signal: task.signal,
            output,
            output_truncated: cut || task.output_truncated.unwrap_or(false),
            duration_ms: task.duration_ms.unwrap_or(0),
            hint: None,
            error: task.error.clone(),
            output_path: task.output_path.clone(),
            result_path: task.result_path.clone(),
            rendered: None,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&ToolCallResult::Completed(c))?
        );
    } else {
        describe_end(&task);
        if let Some(line) = &task.violations {
            eprintln!("sidejob: {line}");
            if line.contains("network refused") {
                eprintln!("  hint: {}", super::format::NETWORK_HINT_PROFILE);
            }
        }
    }
    if interrupted && task.state == TaskState::Canceled {
        return Ok(EXIT_INTERRUPTED);
    }
    Ok(exit_code_of(
        task.state,
        task.exit_code,
        task.signal,
        task.reason,
    ))
}

/// One line on stderr when the run did not simply exit: why it ended.
fn describe_end(t: &Task) {
    let why = match (t.state, t.reason) {
        (TaskState::Succeeded, _) | (_, Some(FailReason::ExitCode)) => return,
        (TaskState::Canceled, _) => "was canceled".to_owned(),
        (_, Some(FailReason::Timeout)) => "timed out".to_owned(),
        (_, Some(FailReason::Signal)) => format!("was killed by signal {}", t.signal.unwrap_or(0)),
        (_, Some(r)) => format!("failed ({})", r.as_str().replace('_', " ")),
        (_, None) => format!("ended {}", t.state.as_str()),
    };
    match &t.error {
        Some(e) => eprintln!("sidejob: the command {why}: {e}"),
        None => eprintln!("sidejob: the command {why}"),
    }
}

fn finish_completed(c: &CompletedCall, json_out: bool) -> Result<i32> {
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&ToolCallResult::Completed(c.clone()))?
        );
    } else {
        print!("{}", c.output);
        std::io::stdout().flush()?;
        if let Some(err) = &c.error {
            eprintln!("sidejob: {err}");
        }
    }
    Ok(exit_code_of(c.state, c.exit_code, c.signal, c.reason))
}
