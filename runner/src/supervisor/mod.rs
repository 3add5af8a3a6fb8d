//! The supervisor: one per run, single-threaded, no tokio (ARCHITECTURE.md).
//!
//! The daemon starts it as `sidejob supervise <run_dir>`. It reads `plan.json`, forks the run's
//! init into a new PID namespace (which starts the command), copies the output into
//! `output.log`, enforces the wall-clock cap, handles cancel (SIGTERM from the daemon, with
//! `cancel.json` saying why and how long the grace is), and writes `result.json` atomically.
//! It owns the run: the daemon can die and come back without the run noticing.

mod cancel;
mod init;
mod outcome;
pub mod output;
pub mod report;
pub mod result;
pub mod spawner;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

pub use cancel::{CancelRequest, StopReason};
pub use result::{RunResult, Violation};

use crate::protocol::{FailReason, TaskState};
use crate::run_dir::PrivateDir;
use crate::sandbox::linux::{self, netns, PrepareError};
use crate::sandbox::{resolve_program, LaunchPlan, OUTPUT_TAIL_BYTES};
use crate::sys::{self, dirfd, Exit, Fork, SigSet, Signal};

/// How long output is still read after the run's init has exited. Everything in the
/// namespace is dead by then, so this only bounds a pathological pipe.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

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

/// Who records the supervisor's `pid start_time` in the private directory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PidFile {
    /// The supervisor, first thing (`sidejob supervise`, started with `posix_spawn`).
    Write,
    /// The spawner did, before it told the daemon the pid.
    Written,
}

/// Entry point of `sidejob supervise <private_dir>`; returns the process exit code. The
/// run's public directory is descriptor 3; descriptor 4, when open, is the daemon's report
/// pipe (`executor::spawn`).
pub fn main(private_dir: &Path) -> i32 {
    run(private_dir, PidFile::Write)
}

/// [`main`] for a supervisor the spawner forked (and whose pid file it wrote).
fn forked_main(private_dir: &Path) -> i32 {
    run(private_dir, PidFile::Written)
}

fn run(private_dir: &Path, pid_file: PidFile) -> i32 {
    let started = SystemTime::now();
    // Block the stop signals first: one that arrives during set-up stays pending and is read
    // from the signalfd later, instead of killing the supervisor before it can settle the run.
    let _ = stop_signals().block();
    // Nothing the daemon might have leaked stays open here (stdio, the run directory and the
    // report pipe excepted).
    let _ = sys::close_from(crate::run_dir::SUPERVISOR_REPORT_FD as u32 + 1);
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
    // Optional: a daemon restarted since has no pipe, and reads result.json instead.
    let report = sys::take_inherited_fd(crate::run_dir::SUPERVISOR_REPORT_FD).ok();
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
    if pid_file == PidFile::Write {
        write_pid_file(&private, sys::getpid());
    }
    let opts = Options {
        egress_first_use: None,
        report,
    };
    let (result, output, report) = match supervise_run(&plan, started, public.as_fd(), opts) {
        Ok(s) => (s.result, Some(s.output), s.report),
        Err((e, report)) => (
            failed_result(&plan, started, e.reason(), e.to_string()),
            None,
            report,
        ),
    };
    // The run is over and this is its only record: a write that fails (a full disk) is tried
    // again until it succeeds. The daemon sees this supervisor alive meanwhile, so it neither
    // settles the run as lost nor reports it as finished too early.
    let mut pause = Duration::from_millis(100);
    let written = loop {
        match result.write_visible(public.as_fd(), plan.output_owner) {
            Ok(file) => break file,
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
    };
    // output.log and result.json are complete (every reader sees them whole): the daemon can
    // settle the run now, while this process makes them durable and exits (see
    // `RunResult::send`).
    if let Some(pipe) = report {
        if let Err(e) = result.send(&pipe) {
            say(format_args!("cannot report to the daemon: {e}"));
        }
    }
    // One pass, in order: the output's data, then result.json's, then the rename.
    let durable = output
        .map_or(Ok(()), |f| f.sync_data())
        .and_then(|()| written.sync_all())
        .and_then(|()| dirfd::fsync_dir(public.as_fd()));
    if let Err(e) = durable {
        say(format_args!("cannot make the run's files durable: {e}"));
    }
    0
}

/// A line to the supervisor's log (its stderr). Never panics, unlike `eprintln`: the log may
/// be on a full disk.
fn say(msg: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "sidejob supervise: {msg}");
}

/// Records the supervisor's `pid start_time`, so a daemon that restarts before it recorded
/// the spawn can still find it.
fn write_pid_file(private: &PrivateDir, pid: i32) {
    let start = sys::process_start_time(pid).unwrap_or(0);
    let _ = std::fs::write(private.pid_file(), format!("{pid} {start}\n"));
}

fn stop_signals() -> SigSet {
    SigSet::of(&[
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ])
}

/// What a run is supervised with, besides its plan.
pub struct Options<'a> {
    /// Called once, when the run's relay first has a connection or query to hand over
    /// (`sidejob exec` starts its proxy then, so a run that never uses the network never pays
    /// for one). It runs in this single-threaded process, before the hand-over.
    pub egress_first_use: Option<&'a mut dyn FnMut()>,
    /// The daemon's report pipe: kept out of the run's init (nothing of the run may hold it)
    /// and handed back with the result.
    pub report: Option<OwnedFd>,
}

/// A supervised run: its result, `output.log` (complete, not yet made durable) and the
/// report pipe it came with.
pub struct Supervised {
    pub result: RunResult,
    pub output: std::fs::File,
    pub report: Option<OwnedFd>,
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
/// connection or query to hand over (see [`Options`]).
pub fn supervise_with(
    plan: &LaunchPlan,
    started: SystemTime,
    out_dir: BorrowedFd<'_>,
    egress_first_use: Option<&mut dyn FnMut()>,
) -> Result<RunResult, SuperviseError> {
    let opts = Options {
        egress_first_use,
        report: None,
    };
    supervise_run(plan, started, out_dir, opts)
        .map(|s| s.result)
        .map_err(|(e, _)| e)
}

/// The whole run: set up and fork init ([`Run::start`]), watch it until it is over
/// ([`Run::watch`]), then collect what happened into the result ([`Run::finish`]). On an
/// error the report pipe is handed back too.
pub fn supervise_run(
    plan: &LaunchPlan,
    started: SystemTime,
    out_dir: BorrowedFd<'_>,
    opts: Options<'_>,
) -> Result<Supervised, (SuperviseError, Option<OwnedFd>)> {
    let Options {
        egress_first_use,
        mut report,
    } = opts;
    let mut run = match Run::start(plan, out_dir, &mut report) {
        Ok(run) => run,
        Err(e) => return Err((e, report)),
    };
    let watched = match run.watch(egress_first_use) {
        Ok(w) => w,
        Err(e) => return Err((e, report)),
    };
    let (result, output) = run.finish(watched, started);
    Ok(Supervised {
        result,
        output,
        report,
    })
}

/// A run whose init has been forked: what the loop watches and what the end collects.
struct Run<'p> {
    plan: &'p LaunchPlan,
    clock: Instant,
    sigfd: OwnedFd,
    capture: output::Capture,
    sandbox: linux::Prepared,
    layers: Vec<String>,
    init_pid: i32,
    /// Read ends: the command's output, the start-failure pipe, init's status pipe.
    output: OwnedFd,
    start_failure: OwnedFd,
    status: OwnedFd,
    /// An allow-list run: where init sends the relay's listening sockets, and the proxy's
    /// socket they are relayed to (see `sandbox::linux::netns`).
    relay_channel: Option<OwnedFd>,
    relay_socket: Option<PathBuf>,
    /// Held (never written) until the supervisor exits: init's lifeline.
    _lifeline: OwnedFd,
}

impl<'p> Run<'p> {
    /// Everything before the run: signals, output.log, the sandbox prepared, the pipes, the
    /// PID namespace, and init forked into it. `keep_from_init` is closed in init.
    fn start(
        plan: &'p LaunchPlan,
        out_dir: BorrowedFd<'_>,
        keep_from_init: &mut Option<OwnedFd>,
    ) -> Result<Run<'p>, SuperviseError> {
        let clock = Instant::now();
        let setup =
            |step: &'static str| move |source: io::Error| SuperviseError::Setup { step, source };

        // Signals arrive through a descriptor we poll, never as asynchronous handlers.
        let signals = stop_signals();
        signals.block().map_err(setup("block signals"))?;
        let sigfd = signals.signalfd().map_err(setup("signalfd"))?;

        let file = crate::run_dir::create_file(out_dir, crate::run_dir::OUTPUT, plan.output_owner)
            .map_err(|source| SuperviseError::Output {
                path: plan.output_path(),
                source,
            })?;
        let capture = output::Capture::new(
            file,
            plan.max_output_bytes,
            OUTPUT_TAIL_BYTES,
            plan.tee_stdout,
        );

        let cmd = prepare_command(plan)?;
        // Checks the plan against this host, creates the run's cgroup, compiles the filters:
        // everything that can fail or allocate happens here, before any fork.
        let sandbox = linux::prepare(plan)?;
        let (out_r, out_w) = sys::pipe().map_err(setup("output pipe"))?;
        // Best effort: a smaller pipe only means more wake-ups.
        let _ = sys::set_pipe_size(&out_r, output::PIPE_SIZE);
        let (err_r, err_w) = sys::pipe().map_err(setup("exec error pipe"))?;
        let (status_r, status_w) = sys::pipe().map_err(setup("status pipe"))?;
        let (lifeline_r, lifeline_w) = sys::pipe().map_err(setup("lifeline pipe"))?;
        let (relay_r, relay_w) = match &plan.sandbox.egress {
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

        let mut layers = enter_pid_namespace()?;
        layers.extend(sandbox.layers.iter().cloned());
        layers.sort();

        let init_pid = match sys::fork().map_err(setup("fork run init"))? {
            Fork::Child => {
                drop((out_r, err_r, status_r, sigfd, lifeline_w, relay_r));
                drop(keep_from_init.take());
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
        sys::set_nonblocking(&out_r, true).map_err(setup("output pipe"))?;
        sys::set_nonblocking(&status_r, true).map_err(setup("status pipe"))?;
        sys::set_nonblocking(&err_r, true).map_err(setup("exec error pipe"))?;
        Ok(Run {
            plan,
            clock,
            sigfd,
            capture,
            sandbox,
            layers,
            init_pid,
            output: out_r,
            start_failure: err_r,
            status: status_r,
            relay_channel: relay_r,
            relay_socket,
            _lifeline: lifeline_w,
        })
    }

    /// The run loop: output copied, signals and timers handled, the relay served, until the
    /// run is over (see [`Watch::over`]).
    fn watch(
        &mut self,
        mut egress_first_use: Option<&mut dyn FnMut()>,
    ) -> Result<Watch, SuperviseError> {
        let loop_err =
            |step: &'static str| move |source: io::Error| SuperviseError::Setup { step, source };
        let deadline = self
            .plan
            .timeout_ms
            .map(|ms| self.clock + Duration::from_millis(ms));
        let mut w = Watch::new(deadline);
        loop {
            let now = Instant::now();
            if w.over(now) {
                return Ok(w);
            }
            w.on_timers(now, self.init_pid, self.plan.kill_grace_ms);

            // A closed pipe is left out without shifting the others' positions.
            let relay_fds = w.relay.as_ref().map(|r| r.fds());
            let fds = [
                Some(self.sigfd.as_fd()),
                w.status_open.then(|| self.status.as_fd()),
                w.output_open.then(|| self.output.as_fd()),
                match (&w.relay, &self.relay_channel) {
                    (None, Some(chan)) => Some(chan.as_fd()),
                    _ => None,
                },
                relay_fds.map(|f| f[0]),
                relay_fds.map(|f| f[1]),
                relay_fds.map(|f| f[2]),
            ];
            let ready = sys::poll_readable(&fds, w.poll_timeout(now)).map_err(loop_err("poll"))?;
            if ready[3] {
                // Init's sockets (or its end closing, when it failed before sending them).
                if let (Some(chan), Some(socket)) = (&self.relay_channel, &self.relay_socket) {
                    match netns::Relay::receive(chan, socket) {
                        Ok(r) => w.relay = Some(r),
                        Err(e) => say(format_args!("the network relay: {e}")),
                    }
                }
                self.relay_channel = None;
            }
            if let Some(r) = w.relay.as_mut() {
                let ready = [ready[4], ready[5], ready[6]];
                if ready.contains(&true) {
                    if let Some(first) = egress_first_use.take() {
                        first();
                    }
                }
                r.ready(ready);
            }
            if w.output_open && ready[2] {
                w.output_open = self.copy_output().map_err(loop_err("read output"))?;
            }
            if ready[1] && read_available(&self.status, &mut w.status) {
                w.status_open = false;
                w.drain_until
                    .get_or_insert(Instant::now() + DRAIN_AFTER_EXIT);
            }
            if ready[0] {
                while let Ok(Some(sig)) = sys::read_signalfd(&self.sigfd) {
                    w.on_signal(sig, self);
                }
            }
        }
    }

    /// Copies what the output pipe holds (bounded per wake-up, so signals are not starved by
    /// a flood); false once every writer is gone.
    fn copy_output(&mut self) -> io::Result<bool> {
        for _ in 0..64 {
            match self.capture.fill_from(self.output.as_fd()) {
                Ok(0) => return Ok(false),
                // A write error (a full disk) is kept by the capture, which goes on reading:
                // the command is never blocked, and the run still settles.
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// After the loop: the rest of the pipes, the cgroup and git cleaned up, and the result
    /// (with output.log, complete but not yet durable).
    fn finish(mut self, mut w: Watch, started: SystemTime) -> (RunResult, std::fs::File) {
        let plan = self.plan;
        read_available(&self.status, &mut w.status);
        let mut start_failure = Vec::new();
        read_available(&self.start_failure, &mut start_failure);
        let captured = self.capture.finish();
        let out_path = plan.output_path();

        let mut violations: Vec<Violation> = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        if captured.truncated {
            violations.push("output_cap".into());
        }
        if let Some(e) = &captured.error {
            violations.push("output_lost".into());
            notes.push(format!(
                "output.log ({}) could not be written beyond some point: {e}; the rest of the output was read and dropped",
                out_path.display()
            ));
        }
        if w.init_exit.is_none() {
            // A cgroup can only be removed once init has left it; otherwise the reaping can
            // be left to whoever inherits it (init has nothing left to do but exit).
            let _ = sys::waitpid(self.init_pid, self.sandbox.cgroup.is_none());
        }
        if let Some(cg) = &self.sandbox.cgroup {
            violations.extend(cg.violations().into_iter().map(Violation::from));
            cg.remove();
        }
        let set_aside = self.sandbox.quarantine_git();
        if !set_aside.is_empty() {
            if !violations
                .iter()
                .any(|v| v.limit() == Some("git_repository"))
            {
                violations.push("git_repository".into());
            }
            notes.push(format!(
                "repositories the run staged in the workspace's index were set aside, so host git does not run their configuration: {} (renamed .git.quarantined-by-sidejob)",
                set_aside.join(", ")
            ));
        }
        self.sandbox.release_git();

        let outcome = outcome::classify(&outcome::Observed {
            start_failure: report::StartFailure::decode(&start_failure),
            report: report::InitReport::decode(&w.status),
            init_exit: w.init_exit,
            stop: w.stop.take(),
            timeout_ms: plan.timeout_ms,
            recorded: violations.clone(),
        });
        violations.extend(outcome.violations.into_iter().map(Violation::from));
        // Connections and lookups the egress proxy refused (written by the proxy before it
        // answered, so every refusal the command saw is there).
        if plan.sandbox.egress.is_some() {
            violations.extend(
                crate::egress::record::read(&plan.run_dir.join(crate::egress::record::FILE))
                    .into_iter()
                    .map(Violation::Network),
            );
        }
        let error = outcome.error.into_iter().chain(notes).collect::<Vec<_>>();
        let result = RunResult {
            task_id: plan.task_id.clone(),
            session_id: plan.session_id.clone(),
            tool: plan.tool.clone(),
            state: outcome.state,
            reason: outcome.reason,
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            started_at: crate::ids::rfc3339(started),
            ended_at: crate::ids::rfc3339(SystemTime::now()),
            duration_ms: self.clock.elapsed().as_millis() as u64,
            output_path: out_path.display().to_string(),
            output_bytes: captured.bytes,
            output_truncated: captured.truncated,
            leftover_processes: outcome.leftover_processes,
            profile: plan.profile.clone(),
            sandbox_layers: std::mem::take(&mut self.layers),
            violations,
            error: (!error.is_empty()).then(|| error.join("; ")),
        };
        (result, captured.file)
    }
}

/// The run loop's state.
struct Watch {
    /// The plan's wall-clock cap.
    deadline: Option<Instant>,
    /// A stop under way (cancel, timeout) and when it escalates to SIGKILL.
    stop: Option<outcome::Stop>,
    kill_at: Option<Instant>,
    killed: bool,
    /// Init's exit, once reaped.
    init_exit: Option<Exit>,
    /// How long output is still read once init is done.
    drain_until: Option<Instant>,
    output_open: bool,
    status_open: bool,
    /// Init's report as read so far.
    status: Vec<u8>,
    relay: Option<netns::Relay>,
}

impl Watch {
    fn new(deadline: Option<Instant>) -> Watch {
        Watch {
            deadline,
            stop: None,
            kill_at: None,
            killed: false,
            init_exit: None,
            drain_until: None,
            output_open: true,
            status_open: true,
            status: Vec::new(),
            relay: None,
        }
    }

    /// The run is over when its init has exited, or has closed the status pipe after its
    /// report (everything in the namespace is dead by then, and what is left of init's exit
    /// — tearing down the namespaces — need not delay the result), and the output is read.
    fn over(&self, now: Instant) -> bool {
        let init_done = self.init_exit.is_some() || (!self.status_open && !self.status.is_empty());
        init_done && (!self.output_open || self.drain_until.is_some_and(|t| now >= t))
    }

    /// The wall-clock cap, and SIGKILL once a stop's grace is over (SIGKILL to the
    /// namespace's init takes every process of the run with it).
    fn on_timers(&mut self, now: Instant, init_pid: i32, grace_ms: u64) {
        if self.stop.is_none() && self.deadline.is_some_and(|d| now >= d) {
            self.begin_stop(
                outcome::Stop {
                    reason: StopReason::Timeout,
                    message: None,
                },
                grace_ms,
                init_pid,
            );
        }
        if !self.killed && self.kill_at.is_some_and(|t| now >= t) {
            let _ = sys::kill(init_pid, libc::SIGKILL);
            self.killed = true;
        }
    }

    fn begin_stop(&mut self, stop: outcome::Stop, grace_ms: u64, init_pid: i32) {
        self.stop = Some(stop);
        self.kill_at = Some(Instant::now() + Duration::from_millis(grace_ms));
        let _ = sys::kill(init_pid, libc::SIGTERM);
    }

    fn on_signal(&mut self, sig: i32, run: &Run<'_>) {
        match sig {
            libc::SIGTERM | libc::SIGINT if self.stop.is_none() => {
                let req =
                    CancelRequest::read_or_cancel(&run.plan.private_dir(), run.plan.kill_grace_ms);
                let stop = outcome::Stop {
                    reason: req.reason,
                    message: req.message,
                };
                self.begin_stop(stop, req.grace_ms, run.init_pid);
            }
            libc::SIGCHLD => {
                if let Ok(Some((_, exit))) = sys::waitpid(run.init_pid, true) {
                    self.init_exit = Some(exit);
                    self.drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                }
            }
            _ => {}
        }
    }

    /// Milliseconds until the next timer, for poll (-1: none).
    fn poll_timeout(&self, now: Instant) -> i32 {
        let next = [
            if self.stop.is_none() {
                self.deadline
            } else {
                None
            },
            if self.killed { None } else { self.kill_at },
            self.drain_until,
        ];
        next.iter()
            .flatten()
            .min()
            .map(|t| {
                t.saturating_duration_since(now)
                    .as_millis()
                    .min(i32::MAX as u128) as i32
                    + 1
            })
            .unwrap_or(-1)
    }
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
