//! One run, from set-up to result: [`Run::start`] (signals, output.log, the sandbox prepared,
//! the pipes, the PID namespace, init forked), [`Run::watch`] (the run loop; its state is
//! [`Watch`]), [`Run::finish`] (the pipes drained, the cgroup and git cleaned up, the outcome
//! decided by [`outcome::classify`] and written into the result).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use super::{init, outcome, output, say, stop_signals, SuperviseError};
use crate::run::cancel::{CancelRequest, StopReason};
use crate::run::plan::{LaunchPlan, Stderr, OUTPUT_TAIL_BYTES};
use crate::run::report;
use crate::run::result::{RunResult, Violation};
use crate::run::streams::Stream;
use crate::sandbox::linux::{self, netns};
use crate::sandbox::resolve_program;
use crate::sys::{self, Exit, Fork};

/// How long output is still read after the run's init has exited. Everything in the
/// namespace is dead by then, so this only bounds a pathological pipe.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// A run whose init has been forked: what the loop watches and what the end collects.
pub(super) struct Run<'p> {
    plan: &'p LaunchPlan,
    clock: Instant,
    sigfd: OwnedFd,
    capture: output::Capture,
    sandbox: linux::Prepared,
    layers: Vec<String>,
    init_pid: i32,
    /// Read ends: the command's output, its own stderr (a plan's `Stderr::Separate`), the
    /// start-failure pipe, init's status pipe.
    output: OwnedFd,
    stderr: Option<OwnedFd>,
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
    /// PID namespace, and init forked into it. `keep_from_init` is closed in init;
    /// `netns` is a network namespace init joins instead of making one, `bare_mntns` the mount
    /// namespace whose copy it builds the view in.
    pub(super) fn start(
        plan: &'p LaunchPlan,
        out_dir: BorrowedFd<'_>,
        keep_from_init: &mut Option<OwnedFd>,
        netns: Option<OwnedFd>,
        bare_mntns: Option<OwnedFd>,
    ) -> Result<Run<'p>, SuperviseError> {
        let clock = Instant::now();
        let setup =
            |step: &'static str| move |source: io::Error| SuperviseError::Setup { step, source };

        // Signals arrive through a descriptor we poll, never as asynchronous handlers.
        let signals = stop_signals();
        signals.block().map_err(setup("block signals"))?;
        let sigfd = signals.signalfd().map_err(setup("signalfd"))?;

        let file =
            crate::run::dir::create_file(out_dir, crate::run::dir::OUTPUT, plan.public_owner)
                .map_err(|source| SuperviseError::Output {
                    path: plan.output_path(),
                    source,
                })?;
        // A separate stderr's ranges are recorded beside the log (`run::streams`).
        let index = match plan.stderr {
            Stderr::Merged => None,
            Stderr::Separate => Some(
                crate::run::dir::create_file(out_dir, crate::run::dir::STREAMS, plan.public_owner)
                    .map_err(|source| SuperviseError::Output {
                        path: plan.public_dir.join(crate::run::dir::STREAMS),
                        source,
                    })?,
            ),
        };
        let capture = output::Capture::new(
            file,
            plan.max_output_bytes,
            OUTPUT_TAIL_BYTES,
            plan.tee,
            index,
        );

        let cmd = prepare_command(plan)?;
        // Checks the plan against this host, creates the run's cgroup, compiles the filters:
        // everything that can fail or allocate happens here, before any fork.
        let mut sandbox = linux::prepare(plan)?;
        let (out_r, out_w) = sys::pipe().map_err(setup("output pipe"))?;
        // Best effort: a smaller pipe only means more wake-ups.
        let _ = sys::set_pipe_size(&out_r, output::PIPE_SIZE);
        // Only a run that asks gets the second pipe: one pipe is the common, cheaper case.
        let (stderr_r, stderr_w) = match plan.stderr {
            Stderr::Merged => (None, None),
            Stderr::Separate => {
                let (r, w) = sys::pipe().map_err(setup("stderr pipe"))?;
                let _ = sys::set_pipe_size(&r, output::PIPE_SIZE);
                (Some(r), Some(w))
            }
        };
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
        if let Some(netns) = netns {
            sandbox.give_shared_netns(netns);
        }
        if let Some(bare) = bare_mntns {
            sandbox.give_bare_mntns(bare);
        }
        layers.extend(sandbox.layers.iter().cloned());
        layers.sort();

        let init_pid = match sys::spawn::lean_fork().map_err(setup("fork run init"))? {
            Fork::Child => {
                drop((out_r, stderr_r, err_r, status_r, sigfd, lifeline_w, relay_r));
                drop(keep_from_init.take());
                init::run(
                    &cmd,
                    &sandbox,
                    init::Pipes {
                        output: out_w,
                        stderr: stderr_w,
                        exec_error: err_w,
                        status: status_w,
                        lifeline: lifeline_r,
                        relay: relay_w,
                    },
                )
            }
            Fork::Parent(pid) => pid,
        };
        drop((out_w, stderr_w, err_w, status_w, lifeline_r, relay_w));
        sys::set_nonblocking(&out_r, true).map_err(setup("output pipe"))?;
        if let Some(r) = &stderr_r {
            sys::set_nonblocking(r, true).map_err(setup("stderr pipe"))?;
        }
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
            stderr: stderr_r,
            start_failure: err_r,
            status: status_r,
            relay_channel: relay_r,
            relay_socket,
            _lifeline: lifeline_w,
        })
    }

    /// The run loop: output copied, signals and timers handled, the relay served, until the
    /// run is over (see [`Watch::over`]).
    pub(super) fn watch(
        &mut self,
        mut egress_first_use: Option<&mut dyn FnMut()>,
    ) -> Result<Watch, SuperviseError> {
        let loop_err =
            |step: &'static str| move |source: io::Error| SuperviseError::Setup { step, source };
        let deadline = self
            .plan
            .timeout_ms
            .map(|ms| self.clock + Duration::from_millis(ms));
        let mut w = Watch::new(deadline, self.plan.stderr);
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
                self.stderr
                    .as_ref()
                    .filter(|_| w.stderr_open)
                    .map(|e| e.as_fd()),
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
            // Stdout first: of two writes that came between the same two wake-ups, the log
            // cannot tell which was first (see `output`).
            if w.output_open && ready[2] {
                w.output_open = self
                    .copy_output(Stream::Stdout)
                    .map_err(loop_err("read output"))?;
            }
            if w.stderr_open && ready[7] {
                w.stderr_open = self
                    .copy_output(Stream::Stderr)
                    .map_err(loop_err("read stderr"))?;
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
    fn copy_output(&mut self, stream: Stream) -> io::Result<bool> {
        let pipe = match (stream, &self.stderr) {
            (Stream::Stderr, Some(e)) => e.as_fd(),
            (Stream::Stderr, None) | (Stream::Stdout, _) => self.output.as_fd(),
        };
        for _ in 0..64 {
            match self.capture.fill_from(pipe, stream) {
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
    pub(super) fn finish(
        mut self,
        mut w: Watch,
        started: SystemTime,
    ) -> (RunResult, std::fs::File) {
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
                crate::egress::record::read(&plan.private().network_record())
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
pub(super) struct Watch {
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
    /// The command's own stderr pipe (open only when it has one).
    stderr_open: bool,
    status_open: bool,
    /// Init's report as read so far.
    status: Vec<u8>,
    relay: Option<netns::Relay>,
}

impl Watch {
    fn new(deadline: Option<Instant>, stderr: Stderr) -> Watch {
        Watch {
            deadline,
            stop: None,
            kill_at: None,
            killed: false,
            init_exit: None,
            drain_until: None,
            output_open: true,
            stderr_open: stderr == Stderr::Separate,
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
        let read = !self.output_open && !self.stderr_open;
        init_done && (read || self.drain_until.is_some_and(|t| now >= t))
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
                    CancelRequest::read_or_cancel(&run.plan.private(), run.plan.kill_grace_ms);
                if req.withdrawn {
                    // The cancel and its withdrawal came as one signal: nothing to stop.
                    return;
                }
                let stop = outcome::Stop {
                    reason: req.reason,
                    message: req.message,
                };
                self.begin_stop(stop, req.grace_ms, run.init_pid);
            }
            // A cancel taken back within its grace: no SIGKILL, and the run is not canceled.
            libc::SIGTERM
                if !self.killed
                    && self
                        .stop
                        .as_ref()
                        .is_some_and(|s| s.reason == StopReason::Canceled)
                    && CancelRequest::read(&run.plan.private()).is_some_and(|r| r.withdrawn) =>
            {
                self.stop = None;
                self.kill_at = None;
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
        let fix = if plan.tool == "subagent" {
            "add its directory to [subagent] executable in the daemon's config (for an agent \
             installed in the caller's home, \"{home}/...\", e.g. \"{home}/.local\")"
        } else {
            "add its directory to [paths] executable (for a toolchain in your home, \
             \"{home}/...\"), or use a toolchain profile (rust, python, node)"
        };
        return Err(SuperviseError::NotInView {
            name: argv0.clone(),
            path: program,
            fix,
        });
    }
    Ok(linux::Command {
        oneshot: linux::oneshot::plan(&program, &plan.argv, &plan.env),
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
        groups: run_groups(plan),
    })
}

/// The supplementary groups the command keeps: the caller's own, when it runs as the
/// caller (they are part of the caller's authority: a workspace group-writable for one of
/// them is writable in the run too); none when it runs as anyone else.
fn run_groups(plan: &LaunchPlan) -> Vec<u32> {
    match (&plan.caller, plan.uid, plan.gid) {
        (Some(c), Some(uid), Some(gid)) if c.uid == uid && c.gid == gid => c
            .groups
            .iter()
            .copied()
            .filter(|g| *g != 0 && *g != gid)
            .collect(),
        _ => Vec::new(),
    }
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
