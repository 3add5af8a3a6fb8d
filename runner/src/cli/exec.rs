//! `sidejob exec`: one command in the sandbox, no daemon, through the same supervisor code
//! the daemon's runs use (called in-process: this process is still single-threaded).
//! The output goes to the terminal (the command's stderr to this process's stderr when that
//! is a different file from its stdout; with `--json`, both to stderr and the result alone
//! to stdout); the exit code is the command's (128+N when signal N
//! ended it, 124 on timeout, 125 when the sandbox could not be built, 126/127 when the
//! command could not be run).

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::egress::policy::Policy;
use crate::protocol::{FailReason, TaskState};
use crate::run::plan::{Stderr, Tee};
use crate::run::result::RunResult;
use crate::sandbox::call::CallSandbox;
use crate::sandbox::linux::offline_net;
use crate::sandbox::resolve::Context;
use crate::sandbox::{Catalog, Network, Profile, RunAs};
use crate::supervisor;

use super::args::ExecArgs;

/// `eprintln!` that lets a closed standard error pass: `exec` ignores SIGPIPE so that a run
/// whose reader went away is still reported, and `eprintln!` would panic instead.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Exit code when the sandbox cannot be built (as `env`, `timeout` and container runtimes use).
pub(super) const EXIT_SANDBOX: i32 = 125;
pub(super) const EXIT_TIMEOUT: i32 = 124;

/// How an unprivileged user gets cgroup limits for `exec`: a cgroup of their own, delegated.
const CGROUP_DELEGATION_HINT: &str = "cgroup limits need a cgroup delegated to you: run it as systemd-run --user --scope -p Delegate=yes sidejob exec ... (or ask an administrator to delegate one)";

fn fail(msg: impl std::fmt::Display, hint: Option<&str>) -> i32 {
    say!("sidejob exec: {msg}");
    if let Some(h) = hint {
        say!("  hint: {h}");
    }
    EXIT_SANDBOX
}

/// A private directory for the run's files (output.log; it is also where the sandbox's root
/// is staged in the run's own mount namespace). `/dev/shm` when usable: nothing there
/// needs to survive the run, so it need not touch a disk.
fn make_run_dir() -> std::io::Result<PathBuf> {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    make_private_dir(&base)
}

/// A fresh directory `<base>/sidejob-exec-<pid>-<ulid>`, mode 0700: made here (never one that
/// exists, so nothing planted in a shared `/tmp` is used), and swept by a later `exec` if
/// this process is killed before it removes it.
pub(crate) fn make_private_dir(base: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let name = format!("sidejob-exec-{}-{}", std::process::id(), crate::ids::ulid());
    sweep(base);
    let dir = base.join(name);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Removes run directories left by `sidejob exec` processes that were killed before they
/// could clean up (their pid is gone).
fn sweep(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("sidejob-exec-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if crate::sys::kill(pid, 0).is_err_and(|e| e.raw_os_error() == Some(libc::ESRCH)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Adds the caller's `--read`, `--write` and `--allow` to the profile: `sidejob exec` runs the
/// caller's own command with the caller's own authority, so it may widen its profile for this
/// run (the daemon's calls may only narrow their session's). Returns the paths it added.
fn add_to_profile(p: &mut Profile, a: &ExecArgs) -> Result<Vec<PathBuf>, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let mut added = Vec::new();
    for path in &a.read {
        let s = super::format::absolute_path("--read", &cwd, path)?;
        added.push(PathBuf::from(&s));
        if !p.readable.contains(&s) {
            p.readable.push(s);
        }
    }
    for path in &a.write {
        let s = super::format::absolute_path("--write", &cwd, path)?;
        added.push(PathBuf::from(&s));
        for list in [&mut p.readable, &mut p.writable] {
            if !list.contains(&s) {
                list.push(s.clone());
            }
        }
    }
    if !a.allow.is_empty() {
        if p.network == Network::Host {
            say!(
                "sidejob exec: --allow: profile {} has the host's network already",
                p.name
            );
            return Ok(added);
        }
        let allowed = Policy::allowing(&a.allow).map_err(|m| format!("--allow {m}"))?;
        p.network = Network::Loopback;
        p.egress
            .get_or_insert_with(Policy::default)
            .extend(&allowed);
    }
    Ok(added)
}

/// The command's environment: the profile's, then `--env` (a `NAME` alone passes the caller's
/// own value), with an allow-list run's proxy settings last, since the proxy is its only way
/// out.
fn command_env(
    mut env: Vec<(String, String)>,
    args: &[String],
    egress: bool,
) -> Result<Vec<(String, String)>, String> {
    for kv in args {
        let (k, v) = match kv.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => match std::env::var(kv) {
                Ok(v) => (kv.clone(), v),
                Err(_) => {
                    say!("sidejob exec: --env {kv}: not set here, not passed");
                    continue;
                }
            },
        };
        if k.is_empty() || k.contains('\0') || v.contains('\0') {
            return Err(format!("--env {kv:?}: expected NAME=VALUE or NAME"));
        }
        env.retain(|(name, _)| *name != k);
        env.push((k, v));
    }
    if egress {
        for (k, v) in crate::egress::proxy_env() {
            env.retain(|(name, _)| *name != k);
            env.push((k, v));
        }
    }
    Ok(env)
}

/// A command the run's `PATH` does not find, though the caller's does: say which profile
/// keys would bring it in.
fn not_on_sandbox_path(
    argv0: &str,
    env: &[(String, String)],
    home: &crate::sandbox::Home,
) -> Option<String> {
    if argv0.contains('/') {
        return None;
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    if crate::sandbox::resolve_program(argv0, path).is_some() {
        return None;
    }
    let mine = std::env::var("PATH").ok()?;
    let found = crate::sandbox::resolve_program(argv0, &mine)?;
    let dir = found.parent()?.to_path_buf();
    let shown = match home.get().and_then(|h| dir.strip_prefix(h).ok()) {
        Some(rest) => format!("{{home}}/{}", rest.display()),
        None => dir.display().to_string(),
    };
    Some(format!(
        "command not found in the sandbox: {argv0} (yours is {}, but the profile's PATH does not reach {})\n  hint: add \"{shown}\" (or the toolchain directory above it) to [paths] executable and to env.set.PATH in the profile, use a toolchain profile (--profile rust, python or node), or run with --read {} --env PATH",
        found.display(),
        dir.display(),
        dir.display(),
    ))
}

/// Runs `sidejob exec`; returns the process exit code.
pub(super) fn exec(a: ExecArgs) -> i32 {
    // This process stays on its own CPU, with its run's init, so that their hand-offs wake
    // no idle CPU (see `sys::cpu`); the command gets back every CPU before it execs.
    crate::sys::cpu::stay_here();
    let catalog = Catalog::new(Catalog::default_dir());
    let mut profile = match catalog.get_or_file(a.profile.as_deref().unwrap_or("workspace-write")) {
        Ok(p) => p,
        Err(e) => return fail(e, None),
    };
    let added = match add_to_profile(&mut profile, &a) {
        Ok(added) => added,
        Err(e) => return fail(e, None),
    };
    let workspace = match a
        .workspace
        .clone()
        .map_or_else(std::env::current_dir, Ok)
        .and_then(|w| w.canonicalize())
    {
        Ok(w) if w.is_dir() => w,
        Ok(w) => {
            return fail(
                format!("workspace {} is not a directory", w.display()),
                None,
            )
        }
        Err(e) => return fail(format!("workspace: {e}"), None),
    };
    let caller_env: Vec<(String, String)> = std::env::vars().collect();
    let home = crate::sandbox::Home::of(crate::sys::getuid());
    let (uid, gid) = match profile.run_as {
        RunAs::Ids { uid, gid } => (Some(uid), Some(gid)),
        RunAs::Caller => (None, None),
    };
    let run_ids = (
        uid.unwrap_or_else(crate::sys::getuid),
        gid.unwrap_or_else(crate::sys::getgid),
    );
    let state_dir = crate::config::default_state_dir();
    let caches = match crate::sandbox::caches::prepare(
        &state_dir,
        crate::sys::getuid(),
        &workspace,
        run_ids,
        &profile,
    ) {
        Ok(c) => c,
        Err(e) => {
            return fail(
                format!(
                    "cannot prepare the profile's caches under {}: {e}",
                    state_dir.display()
                ),
                Some("set SIDEJOB_STATE_DIR to a directory you can write"),
            )
        }
    };
    let resolved = match CallSandbox::resolve(
        &profile,
        &Context {
            workspace: &workspace,
            session_dir: None,
            home: &home,
            caller_env: &caller_env,
            caches: caches.as_deref(),
        },
    ) {
        Ok(r) => r,
        Err(e) => return fail(format!("profile {}: {e}", profile.name), None),
    };
    let mut sandbox = resolved.sandbox;
    // The sockets a run must not be handed through a caller's path: the daemons' this
    // user could reach (its own, the system one) and the bridges.
    sandbox.off_limits = [
        crate::config::default_socket_path(),
        crate::config::SYSTEM_SOCKET.into(),
    ]
    .iter()
    .filter_map(|s| s.parent().map(Path::to_path_buf))
    .chain([crate::config::default_bridge_dir()])
    .collect();
    // `--read` and `--write` name the caller's own paths: they are opened as `{home}` ones
    // are (no magic link, no kernel filesystem, none of the mounts below them).
    for m in &mut sandbox.mounts {
        if m.source.as_ref().is_some_and(|s| added.contains(s)) {
            m.as_caller = true;
        }
    }
    let env = match command_env(resolved.env, &a.env, sandbox.egress.is_some()) {
        Ok(env) => env,
        Err(e) => return fail(e, None),
    };
    if let Some(msg) = a
        .command
        .first()
        .and_then(|argv0| not_on_sandbox_path(argv0, &env, &home))
    {
        say!("sidejob exec: {msg}");
        return 127;
    }
    // Stay in the current directory when it is inside the workspace, like a shell would.
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|d| d.canonicalize().ok())
        .filter(|d| d.starts_with(&workspace))
        .unwrap_or_else(|| workspace.clone());
    let run_dir = match make_run_dir() {
        Ok(d) => d,
        Err(e) => return fail(format!("cannot create a run directory: {e}"), None),
    };
    let task_id = crate::ids::ulid();
    // An allow-list run: this process has no daemon, so it serves the proxy itself: the
    // socket is bound now, and the proxy process is forked when the run first uses it.
    let mut proxy = match &mut sandbox.egress {
        Some(egress) => match bind_proxy(&run_dir, &task_id, egress) {
            Ok(p) => Some(p),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&run_dir);
                return fail(format!("cannot start the egress proxy: {e}"), None);
            }
        },
        None => None,
    };
    let timeout_ms = a
        .timeout
        .map(|d| d.as_millis() as u64)
        .or(resolved.timeout_ms);
    let plan = CallSandbox {
        sandbox,
        env,
        ..resolved
    }
    .plan("exec", a.command.clone(), cwd, run_dir.clone())
    .task(&task_id, "exec")
    .run_as(uid, gid)
    .timeout_ms(timeout_ms)
    // With --json, stdout holds the result alone: the command's output goes to stderr.
    .tee(if a.json { Tee::Stderr } else { Tee::Stdout })
    // The command's stderr stays apart only where the caller keeps it apart: a second pipe
    // is made just then (see `Stderr`).
    .stderr(if !a.json && stderr_is_separate() {
        Stderr::Separate
    } else {
        Stderr::Merged
    })
    .build();
    let copier = match command_stdin(a.stdin) {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run_dir);
            return fail(format!("cannot set up the command's stdin: {e}"), None);
        }
    };
    let started = SystemTime::now();
    let has_proxy = proxy.is_some();
    let result = {
        let mut start_proxy = || {
            if let Some(p) = proxy.as_mut() {
                p.start();
            }
        };
        let hook: Option<&mut dyn FnMut()> = if has_proxy {
            Some(&mut start_proxy)
        } else {
            None
        };
        // Root's offline runs join the namespace its earlier ones made (`offline_net`).
        let netns = (plan.sandbox.network == Network::None)
            .then(|| offline_net::kept_for_exec(crate::sys::getuid(), run_ids.0, &workspace))
            .flatten();
        // And build their views in copies of the bare mount namespace it keeps.
        let bare = offline_net::kept_bare_for_exec();
        match crate::sys::dirfd::open_dir(&run_dir) {
            Ok(dir) => {
                match supervisor::supervise_with(&plan, started, dir.as_fd(), hook, netns, bare) {
                    Ok(r) => r,
                    Err(e) => {
                        let reason = e.reason();
                        supervisor::failed_result(&plan, started, reason, e.to_string())
                    }
                }
            }
            Err(e) => supervisor::failed_result(
                &plan,
                started,
                FailReason::SpawnError,
                format!("cannot open the run directory {}: {e}", run_dir.display()),
            ),
        }
    };
    // It may be blocked reading the terminal: it must not take the next line typed.
    stop_child(copier);
    // The proxy is done with: killed, not waited for (its exit is not this run's business,
    // and whoever inherits it reaps it).
    if let Some(pid) = proxy.as_ref().and_then(|p| p.pid) {
        let _ = crate::sys::kill(pid, libc::SIGKILL);
    }
    let _ = std::fs::remove_dir_all(&run_dir);
    let code = exit_code(&result);
    if a.json {
        let mut shown = result.clone();
        // The run directory is gone; the output went to the terminal.
        shown.output_path = String::new();
        // Not println!: with no one left reading (`| head`), it would panic, and the
        // command's exit code would be lost. The code is what matters then.
        let text = serde_json::to_string_pretty(&shown).unwrap_or_default();
        let _ = writeln!(std::io::stdout(), "{text}");
    } else if let Some(err) = &result.error {
        let hint = match result.reason {
            Some(FailReason::SandboxError) => Some(
                "`sidejob doctor` shows which sandbox layers this host has; a profile with best_effort = true runs without the missing ones",
            ),
            _ => None,
        };
        say!("sidejob exec: {err}");
        if let Some(h) = hint {
            say!("  hint: {h}");
        }
        if err.contains("not delegated to our uid") {
            say!("  hint: {CGROUP_DELEGATION_HINT}");
        }
    }
    if let (Some(line), false) = (crate::run::result::summary(&result.violations), a.json) {
        say!("sidejob exec: {line}");
        if line.contains("network refused") {
            say!("  hint: {}", super::format::NETWORK_HINT_EXEC);
        }
    }
    // Done. What this process still holds (the plan, the result, the profile) is left to the
    // kernel instead of being freed piece by piece, and the C library's exit handlers, none of
    // which sidejob needs, are skipped: about 0.08 ms of every `sidejob exec`, which its caller
    // waits for. Standard error is unbuffered; standard output is flushed first.
    let _ = std::io::stdout().flush();
    crate::sys::exit_now(code)
}

/// Whether this process's stdout and stderr are different files (`> out 2> err`, or one of
/// them a pipe): then a command's stderr is kept apart from its stdout. The same terminal,
/// file or pipe on both (`2>&1`) is one stream, as it would be without sidejob.
pub(super) fn stderr_is_separate() -> bool {
    use std::os::fd::AsFd;
    let id = |fd: std::os::fd::BorrowedFd<'_>| {
        crate::sys::dirfd::stat_fd(fd)
            .ok()
            .map(|st| (st.st_dev, st.st_ino))
    };
    match (id(std::io::stdout().as_fd()), id(std::io::stderr().as_fd())) {
        (Some(out), Some(err)) => out != err,
        _ => false,
    }
}

/// The proxy of an `exec` run: its socket, bound before the run, and the process that serves
/// it, forked on first use ([`LazyProxy::start`]).
struct LazyProxy {
    waiting: Option<(std::os::unix::net::UnixListener, crate::egress::Run)>,
    pid: Option<i32>,
}

impl LazyProxy {
    fn start(&mut self) {
        if let Some((listener, run)) = self.waiting.take() {
            match crate::egress::standalone::spawn(listener, run) {
                Ok(pid) => self.pid = Some(pid),
                // The run's connections then find nobody: closed, never open.
                Err(e) => say!("sidejob exec: cannot start the egress proxy: {e}"),
            }
        }
    }
}

/// Binds the run's proxy socket in `<run_dir>/egress/` (the run's supervisor, in this process,
/// relays the run's connections to it).
fn bind_proxy(
    run_dir: &Path,
    task_id: &str,
    egress: &mut crate::egress::EgressPlan,
) -> std::io::Result<LazyProxy> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = crate::run::dir::PrivateDir::at(run_dir.to_path_buf()).exec_egress_dir();
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let sock = dir.join(crate::egress::SOCKET);
    let listener = std::os::unix::net::UnixListener::bind(&sock)?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
    let run = crate::egress::Run::new(
        task_id,
        egress.policy.clone(),
        &crate::run::dir::PrivateDir::at(run_dir.to_path_buf()).network_record(),
    )?;
    egress.socket_dir = dir;
    Ok(LazyProxy {
        waiting: Some((listener, run)),
        pid: None,
    })
}

fn stop_child(pid: Option<i32>) {
    if let Some(pid) = pid {
        let _ = crate::sys::kill(pid, libc::SIGKILL);
        let _ = crate::sys::waitpid(pid, false);
    }
}

/// Makes descriptor 0 what the command gets as stdin (the run inherits it): `/dev/null`, or
/// with `--stdin` this process's own stdin — through a pipe fed by a small copier process
/// when it is a terminal, so the command never holds the terminal itself (it could change its
/// settings, or read what is typed after the run ends). Returns the copier's pid.
fn command_stdin(want: bool) -> std::io::Result<Option<i32>> {
    use crate::sys;
    if !want {
        let null = std::fs::File::open("/dev/null")?;
        sys::dup2(&null, 0)?;
        return Ok(None);
    }
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        return Ok(None); // a pipe or a file: the command may read it as it is
    }
    let (r, w) = sys::pipe()?;
    match sys::fork()? {
        sys::Fork::Child => {
            drop(r);
            sys::cpu::free_to_move();
            let stdin = std::io::stdin();
            let mut buf = [0u8; 8192];
            loop {
                match std::io::Read::read(&mut stdin.lock(), &mut buf) {
                    Ok(0) | Err(_) => sys::exit_now(0),
                    Ok(n) => sys::write_all_fd(&w, &buf[..n]),
                }
            }
        }
        sys::Fork::Parent(pid) => {
            drop(w);
            sys::dup2(&r, 0)?;
            Ok(Some(pid))
        }
    }
}

/// The exit code `sidejob exec` passes through for a result.
pub(super) fn exit_code(r: &RunResult) -> i32 {
    match (r.state, r.reason) {
        (TaskState::Succeeded, _) => 0,
        (_, Some(FailReason::Timeout)) => EXIT_TIMEOUT,
        (_, Some(FailReason::SandboxError)) => EXIT_SANDBOX,
        (_, Some(FailReason::SpawnError)) => {
            let e = r.error.as_deref().unwrap_or("");
            if e.contains("not found") || e.contains("No such file") {
                127
            } else {
                126
            }
        }
        (TaskState::Canceled, _) => 128 + libc::SIGINT,
        _ => match (r.exit_code, r.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 1,
        },
    }
}
