//! The supervisor: one per run, single-threaded, no tokio (ARCHITECTURE.md).
//!
//! The daemon starts it as `sidejob supervise <run_dir>`. It reads `plan.json`, forks the run's
//! init into a new PID namespace (which starts the command), copies the output into
//! `output.log`, enforces the wall-clock cap, handles cancel (SIGTERM from the daemon, with
//! `cancel.json` saying why and how long the grace is), and writes `result.json` atomically.
//! It owns the run: the daemon can die and come back without the run noticing.

mod init;
pub mod output;
pub mod result;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

pub use result::{RunResult, Violation};

use crate::protocol::{FailReason, TaskState};
use crate::run_dir::PrivateDir;
use crate::sandbox::linux::{self, netns, PrepareError};
use crate::sandbox::{resolve_program, LaunchPlan, OUTPUT_TAIL_BYTES};
use crate::sys::{self, dirfd, Exit, Fork, SigSet, Signal};

/// How long output is still read after the run's init has exited. Everything in the
/// namespace is dead by then, so this only bounds a pathological pipe.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// Why a run is being stopped early; written by the daemon to `cancel.json` before it sends
/// SIGTERM to the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Canceled,
    Timeout,
}

/// `cancel.json` in the run's private directory (`run_dir::PrivateDir::cancel`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CancelRequest {
    pub reason: StopReason,
    pub grace_ms: u64,
    /// Shown as the result's `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("cannot read launch plan {path}: {source}")]
    Plan { path: PathBuf, source: io::Error },
    #[error("cannot open {path}: {source}")]
    Output { path: PathBuf, source: io::Error },
    #[error("command not found: {0}")]
    NotFound(String),
    /// The command exists on the host, but not in the run's view.
    #[error("command not found in the sandbox: {name} is {} on the host, outside this profile's view; add its directory to [paths] executable (for a toolchain in your home, \"{{home}}/...\"), or use a toolchain profile (rust, python, node)", path.display())]
    NotInView { name: String, path: PathBuf },
    #[error("argument, environment or path holds a NUL byte: {0:?}")]
    Nul(String),
    #[error("{step}: {source}")]
    Setup {
        step: &'static str,
        source: io::Error,
    },
    #[error("pid namespace unavailable: {0}")]
    PidNamespace(io::Error),
    #[error(transparent)]
    Sandbox(#[from] PrepareError),
}

impl SuperviseError {
    pub fn reason(&self) -> FailReason {
        match self {
            SuperviseError::PidNamespace(_) | SuperviseError::Sandbox(_) => {
                FailReason::SandboxError
            }
            SuperviseError::Plan { .. }
            | SuperviseError::Output { .. }
            | SuperviseError::NotFound(_)
            | SuperviseError::NotInView { .. }
            | SuperviseError::Nul(_)
            | SuperviseError::Setup { .. } => FailReason::SpawnError,
        }
    }
}

/// Entry point of `sidejob supervise <private_dir>`; returns the process exit code. The
/// run's public directory is descriptor 3 (`executor::spawn`).
pub fn main(private_dir: &Path) -> i32 {
    let started = SystemTime::now();
    // Block the stop signals first: one that arrives during set-up stays pending and is read
    // from the signalfd later, instead of killing the supervisor before it can settle the run.
    let _ = SigSet::of(&[
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ])
    .block();
    // Nothing the daemon might have leaked stays open here (stdio and the run directory
    // excepted).
    let _ = sys::close_from(crate::run_dir::SUPERVISOR_PUBLIC_FD as u32 + 1);
    let public = match sys::take_inherited_fd(crate::run_dir::SUPERVISOR_PUBLIC_FD).and_then(|fd| {
        if dirfd::is_dir(&dirfd::stat_fd(fd.as_fd())?) {
            Ok(fd)
        } else {
            Err(io::Error::other("descriptor 3 is not a directory"))
        }
    }) {
        Ok(fd) => fd,
        Err(e) => {
            say(format_args!(
                "the run directory (inherited descriptor): {e}"
            ));
            return 2;
        }
    };
    // The daemon's umask (077) is not the run's: commands get the usual one.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let private = PrivateDir::at(private_dir.to_path_buf());
    let plan_path = private.plan();
    let plan: LaunchPlan = match std::fs::read(&plan_path).and_then(|b| {
        serde_json::from_slice(&b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }) {
        Ok(plan) => plan,
        Err(source) => {
            say(format_args!(
                "{}",
                SuperviseError::Plan {
                    path: plan_path,
                    source
                }
            ));
            return 2;
        }
    };
    write_pid_file(&private);
    let result = match supervise(&plan, started, public.as_fd()) {
        Ok(result) => result,
        Err(e) => failed_result(&plan, started, e.reason(), e.to_string()),
    };
    // The run is over and this is its only record: a write that fails (a full disk) is tried
    // again until it succeeds. The daemon sees this supervisor alive meanwhile, so it neither
    // settles the run as lost nor reports it as finished too early.
    let mut pause = Duration::from_millis(100);
    loop {
        match result.write_atomically(public.as_fd(), plan.output_owner) {
            Ok(()) => return 0,
            Err(e) => {
                say(format_args!(
                    "cannot write {}: {e}; trying again in {} ms",
                    plan.output_dir.join(crate::run_dir::RESULT).display(),
                    pause.as_millis()
                ));
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// A line to the supervisor's log (its stderr). Never panics, unlike `eprintln`: the log may
/// be on a full disk.
fn say(msg: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "sidejob supervise: {msg}");
}

/// Records `pid start_time`, so a daemon that restarts before it recorded the spawn can still
/// find this supervisor.
fn write_pid_file(private: &PrivateDir) {
    let pid = sys::getpid();
    let start = sys::process_start_time(pid).unwrap_or(0);
    let _ = std::fs::write(private.pid_file(), format!("{pid} {start}\n"));
}

/// Runs the plan to the end and describes how it went. `out_dir` is the run's public
/// directory: `output.log` is created there (never one that exists), handed to the session's
/// owner.
pub fn supervise(
    plan: &LaunchPlan,
    started: SystemTime,
    out_dir: BorrowedFd<'_>,
) -> Result<RunResult, SuperviseError> {
    supervise_with(plan, started, out_dir, None)
}

/// [`supervise`], calling `egress_first_use` once, when the run's relay first has a
/// connection or query to hand over (`sidejob exec` starts its proxy then, so a run that
/// never uses the network never pays for one). It runs in this single-threaded process,
/// before the hand-over.
pub fn supervise_with(
    plan: &LaunchPlan,
    started: SystemTime,
    out_dir: BorrowedFd<'_>,
    mut egress_first_use: Option<&mut dyn FnMut()>,
) -> Result<RunResult, SuperviseError> {
    let clock = Instant::now();
    let setup =
        |step: &'static str| move |source: io::Error| SuperviseError::Setup { step, source };

    // Signals arrive through a descriptor we poll, never as asynchronous handlers.
    let signals = SigSet::of(&[
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ]);
    signals.block().map_err(setup("block signals"))?;
    let sigfd = signals.signalfd().map_err(setup("signalfd"))?;

    let out_path = plan.output_path();
    let file = crate::run_dir::create_file(out_dir, crate::run_dir::OUTPUT, plan.output_owner)
        .map_err(|source| SuperviseError::Output {
            path: out_path.clone(),
            source,
        })?;
    let mut capture = output::Capture::new(
        file,
        plan.max_output_bytes,
        OUTPUT_TAIL_BYTES,
        plan.tee_stdout,
    );

    let cmd = prepare_command(plan)?;
    // Checks the plan against this host, creates the run's cgroup, compiles the filters:
    // everything that can fail or allocate happens here, before any fork.
    let mut sandbox = linux::prepare(plan)?;
    let (out_r, out_w) = sys::pipe().map_err(setup("output pipe"))?;
    // Best effort: a smaller pipe only means more wake-ups.
    let _ = sys::set_pipe_size(&out_r, output::PIPE_SIZE);
    let (err_r, err_w) = sys::pipe().map_err(setup("exec error pipe"))?;
    let (status_r, status_w) = sys::pipe().map_err(setup("status pipe"))?;
    let (lifeline_r, lifeline_w) = sys::pipe().map_err(setup("lifeline pipe"))?;
    // An allow-list run: init sends the relay's listening sockets here, and this loop relays
    // them to the proxy's socket (see `sandbox::linux::netns`).
    let (mut relay_r, relay_w) = match &plan.sandbox.egress {
        Some(_) => {
            let (r, w) = netns::channel().map_err(setup("relay channel"))?;
            (Some(r), Some(w))
        }
        None => (None, None),
    };
    let relay_socket = plan
        .sandbox
        .egress
        .as_ref()
        .map(|e| e.socket_dir.join(crate::egress::SOCKET));
    let mut relay: Option<netns::Relay> = None;

    let mut layers = enter_pid_namespace()?;
    layers.extend(sandbox.layers.iter().cloned());
    layers.sort();

    let init_pid = match sys::fork().map_err(setup("fork run init"))? {
        Fork::Child => {
            drop((out_r, err_r, status_r, sigfd, lifeline_w, relay_r));
            init::run(
                &cmd,
                &sandbox,
                init::Pipes {
                    output: out_w,
                    exec_error: err_w,
                    status: status_w,
                    lifeline: lifeline_r,
                    relay: relay_w,
                },
            )
        }
        Fork::Parent(pid) => pid,
    };
    drop((out_w, err_w, status_w, lifeline_r, relay_w));
    // Held (never written) until the supervisor exits.
    let _lifeline = lifeline_w;
    sys::set_nonblocking(&out_r, true).map_err(setup("output pipe"))?;
    sys::set_nonblocking(&status_r, true).map_err(setup("status pipe"))?;
    sys::set_nonblocking(&err_r, true).map_err(setup("exec error pipe"))?;

    let deadline = plan.timeout_ms.map(|ms| clock + Duration::from_millis(ms));
    let mut stop: Option<StopReason> = None;
    let mut stop_message: Option<String> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let mut init_exit: Option<Exit> = None;
    let mut drain_until: Option<Instant> = None;
    let mut out_open = true;
    let mut status_open = true;
    let mut status_buf = Vec::new();

    loop {
        let now = Instant::now();
        // The run is over when its init has exited, or has closed the status pipe after its
        // report: everything in the namespace is dead by then, and what is left of init's exit
        // (tearing down the namespaces) need not delay the result.
        let init_done = init_exit.is_some() || (!status_open && !status_buf.is_empty());
        if init_done && (!out_open || drain_until.is_some_and(|t| now >= t)) {
            break;
        }
        if stop.is_none() && deadline.is_some_and(|d| now >= d) {
            stop = Some(StopReason::Timeout);
            kill_at = Some(now + Duration::from_millis(plan.kill_grace_ms));
            let _ = sys::kill(init_pid, libc::SIGTERM);
        }
        if !killed && kill_at.is_some_and(|t| now >= t) {
            // SIGKILL to the namespace's init takes every process of the run with it.
            let _ = sys::kill(init_pid, libc::SIGKILL);
            killed = true;
        }
        let next = [
            if stop.is_none() { deadline } else { None },
            if killed { None } else { kill_at },
            drain_until,
        ];
        let timeout = next
            .iter()
            .flatten()
            .min()
            .map(|t| {
                t.saturating_duration_since(now)
                    .as_millis()
                    .min(i32::MAX as u128) as i32
                    + 1
            })
            .unwrap_or(-1);

        // A closed pipe is left out without shifting the others' positions.
        let relay_fds = relay.as_ref().map(|r| r.fds());
        let fds = [
            Some(sigfd.as_fd()),
            status_open.then(|| status_r.as_fd()),
            out_open.then(|| out_r.as_fd()),
            match (&relay, &relay_r) {
                (None, Some(chan)) => Some(chan.as_fd()),
                _ => None,
            },
            relay_fds.map(|f| f[0]),
            relay_fds.map(|f| f[1]),
            relay_fds.map(|f| f[2]),
        ];
        let ready = sys::poll_readable(&fds, timeout).map_err(setup("poll"))?;
        if ready[3] {
            // Init's sockets (or its end closing, when it failed before sending them).
            if let (Some(chan), Some(socket)) = (&relay_r, &relay_socket) {
                match netns::Relay::receive(chan, socket) {
                    Ok(r) => relay = Some(r),
                    Err(e) => eprintln!("sidejob supervise: the network relay: {e}"),
                }
            }
            relay_r.take();
        }
        if let Some(r) = relay.as_mut() {
            let ready = [ready[4], ready[5], ready[6]];
            if ready.contains(&true) {
                if let Some(first) = egress_first_use.take() {
                    first();
                }
            }
            r.ready(ready);
        }

        if out_open && ready[2] {
            // Bounded per wake-up so signals are not starved by a flood.
            for _ in 0..64 {
                match capture.fill_from(out_r.as_fd()) {
                    Ok(0) => {
                        out_open = false;
                        break;
                    }
                    // A write error (a full disk) is kept by the capture, which goes on
                    // reading: the command is never blocked, and the run still settles.
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        return Err(SuperviseError::Setup {
                            step: "read output",
                            source: e,
                        })
                    }
                }
            }
        }
        if ready[1] && read_available(&status_r, &mut status_buf) {
            status_open = false;
            drain_until.get_or_insert(Instant::now() + DRAIN_AFTER_EXIT);
        }
        if ready[0] {
            while let Ok(Some(sig)) = sys::read_signalfd(&sigfd) {
                match sig {
                    libc::SIGTERM | libc::SIGINT if stop.is_none() => {
                        let req = read_cancel_request(&plan.private_dir(), plan.kill_grace_ms);
                        stop = Some(req.reason);
                        stop_message = req.message;
                        kill_at = Some(Instant::now() + Duration::from_millis(req.grace_ms));
                        let _ = sys::kill(init_pid, libc::SIGTERM);
                    }
                    libc::SIGCHLD => {
                        if let Ok(Some((_, exit))) = sys::waitpid(init_pid, true) {
                            init_exit = Some(exit);
                            drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    read_available(&status_r, &mut status_buf);
    let mut exec_error = Vec::new();
    read_available(&err_r, &mut exec_error);
    let (output_bytes, output_truncated, output_error) = capture.finish();

    let ended = SystemTime::now();
    let mut result = RunResult {
        task_id: plan.task_id.clone(),
        session_id: plan.session_id.clone(),
        tool: plan.tool.clone(),
        state: TaskState::Failed,
        reason: None,
        exit_code: None,
        signal: None,
        started_at: crate::ids::rfc3339(started),
        ended_at: crate::ids::rfc3339(ended),
        duration_ms: clock.elapsed().as_millis() as u64,
        output_path: out_path.display().to_string(),
        output_bytes,
        output_truncated,
        leftover_processes: 0,
        profile: plan.profile.clone(),
        sandbox_layers: layers,
        violations: Vec::new(),
        error: None,
    };
    if output_truncated {
        result.violations.push("output_cap".into());
    }
    if let Some(e) = &output_error {
        result.violations.push("output_lost".into());
        result.error = Some(format!(
            "output.log ({}) could not be written beyond some point: {e}; the rest of the output was read and dropped",
            out_path.display()
        ));
    }
    if init_exit.is_none() {
        // A cgroup can only be removed once init has left it; otherwise the reaping can be
        // left to whoever inherits it (init has nothing left to do but exit).
        let _ = sys::waitpid(init_pid, sandbox.cgroup.is_none());
    }
    if let Some(cg) = &sandbox.cgroup {
        result
            .violations
            .extend(cg.violations().into_iter().map(Violation::from));
        cg.remove();
    }
    let set_aside = sandbox.quarantine_git();
    if !set_aside.is_empty() {
        if !result
            .violations
            .iter()
            .any(|v| v.limit() == Some("git_repository"))
        {
            result.violations.push("git_repository".into());
        }
        let note = format!(
            "repositories the run staged in the workspace's index were set aside, so host git does not run their configuration: {} (renamed .git.quarantined-by-sidejob)",
            set_aside.join(", ")
        );
        result.error = Some(match result.error.take() {
            Some(e) => format!("{e}; {note}"),
            None => note,
        });
    }
    sandbox.release_git();
    let status = String::from_utf8_lossy(&status_buf).into_owned();
    let mut words = status.split_whitespace();
    let ended_how = match (
        words.next(),
        words.next().and_then(|w| w.parse::<i32>().ok()),
    ) {
        (Some("exit"), Some(code)) => Some(Exit::Code(code)),
        (Some("signal"), Some(sig)) => Some(Exit::Signal(sig)),
        _ => None,
    };
    result.leftover_processes = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    // What init saw of the view after the command: only names it is known to send.
    result.violations.extend(
        words
            .filter(|w| *w == "git_repository")
            .map(Violation::from),
    );
    // Connections and lookups the egress proxy refused (written by the proxy before it
    // answered, so every refusal the command saw is there).
    if plan.sandbox.egress.is_some() {
        result.violations.extend(
            crate::egress::record::read(&plan.run_dir.join(crate::egress::record::FILE))
                .into_iter()
                .map(Violation::Network),
        );
    }
    match ended_how {
        Some(Exit::Code(c)) => result.exit_code = Some(c),
        Some(Exit::Signal(s)) => result.signal = Some(s),
        None => {}
    }
    // Rlimit kills: the signal itself, or a shell's 128+N for a child it lost that way.
    let killed_by =
        |sig: i32| ended_how == Some(Exit::Signal(sig)) || ended_how == Some(Exit::Code(128 + sig));
    if killed_by(libc::SIGXFSZ) {
        result.violations.push("file_size".into());
    }
    if killed_by(libc::SIGXCPU)
        && !result
            .violations
            .iter()
            .any(|v| v.limit() == Some("cpu_limit"))
    {
        result.violations.push("cpu_limit".into());
    }

    if !exec_error.is_empty() {
        result.reason = Some(if exec_error.starts_with(b"sandbox ") {
            FailReason::SandboxError
        } else {
            FailReason::SpawnError
        });
        result.exit_code = None;
        result.error = Some(String::from_utf8_lossy(&exec_error).into_owned());
    } else if let Some(reason) = stop {
        match reason {
            StopReason::Canceled => {
                result.state = TaskState::Canceled;
                result.error = stop_message;
            }
            StopReason::Timeout => {
                result.reason = Some(FailReason::Timeout);
                result.violations.push("timeout".into());
                result.error = Some(stop_message.unwrap_or_else(|| {
                    format!(
                        "wall-clock cap of {} ms reached",
                        plan.timeout_ms.unwrap_or(0)
                    )
                }));
            }
        }
    } else {
        match ended_how {
            Some(Exit::Code(0)) => result.state = TaskState::Succeeded,
            Some(Exit::Code(_)) => result.reason = Some(FailReason::ExitCode),
            Some(Exit::Signal(_)) => result.reason = Some(FailReason::Signal),
            None => {
                result.reason = Some(FailReason::SandboxError);
                result.error = Some(if status.starts_with("error ") {
                    status.trim_start_matches("error ").to_owned()
                } else {
                    format!("the run's init ended without a report ({init_exit:?})")
                });
            }
        }
    }
    Ok(result)
}

/// Makes the supervisor's next child the init of a new PID namespace. Root does this directly;
/// an unprivileged supervisor first enters a user namespace that maps only its own ids.
fn enter_pid_namespace() -> Result<Vec<String>, SuperviseError> {
    if sys::getuid() == 0 {
        sys::unshare(libc::CLONE_NEWPID).map_err(SuperviseError::PidNamespace)?;
        return Ok(vec!["pid_namespace".into()]);
    }
    let (uid, gid) = (sys::getuid(), sys::getgid());
    sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID).map_err(SuperviseError::PidNamespace)?;
    let write =
        |file: &str, text: String| std::fs::write(file, text).map_err(SuperviseError::PidNamespace);
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    Ok(vec!["pid_namespace".into(), "user_namespace".into()])
}

/// Converts the plan's command into exec-ready strings before any fork.
fn prepare_command(plan: &LaunchPlan) -> Result<linux::Command, SuperviseError> {
    let cstr = |s: &str| CString::new(s).map_err(|_| SuperviseError::Nul(s.to_owned()));
    let argv0 = plan
        .argv
        .first()
        .ok_or_else(|| SuperviseError::NotFound("(empty argv)".into()))?;
    let path_var = plan
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    let program =
        resolve_program(argv0, path_var).ok_or_else(|| SuperviseError::NotFound(argv0.clone()))?;
    // Resolved on the host: it must also be in the view, or exec would only say ENOENT.
    let on_host = if program.is_absolute() {
        program.clone()
    } else {
        plan.cwd.join(&program)
    };
    if !crate::sandbox::in_view(&on_host, &plan.sandbox) {
        return Err(SuperviseError::NotInView {
            name: argv0.clone(),
            path: program,
        });
    }
    Ok(linux::Command {
        program: cstr(&program.to_string_lossy())?,
        argv: plan
            .argv
            .iter()
            .map(|a| cstr(a))
            .collect::<Result<_, _>>()?,
        envp: plan
            .env
            .iter()
            .map(|(k, v)| cstr(&format!("{k}={v}")))
            .collect::<Result<_, _>>()?,
        cwd: plan.cwd.clone(),
        uid: plan.uid,
        gid: plan.gid,
    })
}

/// Reads what a non-blocking pipe holds; true once its writers are all gone.
fn read_available(fd: &OwnedFd, out: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match sys::read_fd(fd, &mut buf) {
            Ok(0) => return true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return false,
        }
    }
}

fn read_cancel_request(private: &PrivateDir, default_grace_ms: u64) -> CancelRequest {
    std::fs::read(private.cancel())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(CancelRequest {
            reason: StopReason::Canceled,
            grace_ms: default_grace_ms,
            message: None,
        })
}

/// The result of a run that never got going.
pub fn failed_result(
    plan: &LaunchPlan,
    started: SystemTime,
    reason: FailReason,
    error: String,
) -> RunResult {
    let now = SystemTime::now();
    RunResult {
        task_id: plan.task_id.clone(),
        session_id: plan.session_id.clone(),
        tool: plan.tool.clone(),
        state: TaskState::Failed,
        reason: Some(reason),
        exit_code: None,
        signal: None,
        started_at: crate::ids::rfc3339(started),
        ended_at: crate::ids::rfc3339(now),
        duration_ms: now
            .duration_since(started)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        output_path: plan.output_path().display().to_string(),
        output_bytes: 0,
        output_truncated: false,
        leftover_processes: 0,
        profile: plan.profile.clone(),
        sandbox_layers: Vec::new(),
        violations: Vec::new(),
        error: Some(error),
    }
}
