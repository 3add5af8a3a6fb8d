//! The supervisor: one per run, single-threaded, no tokio (ARCHITECTURE.md).
//!
//! The spawner forks it for the daemon (`spawner.rs`), or the daemon starts it as
//! `sidejob supervise <run_dir>`. It reads `plan.json`, forks the run's init into a new PID
//! namespace (which starts the command), copies the output into `output.log`, enforces the
//! wall-clock cap, handles cancel (SIGTERM from the daemon, with `cancel.json` saying why and
//! how long the grace is: `cancel.rs`), decides the outcome (`outcome.rs`) from init's report
//! (`report.rs`), writes `result.json` atomically, tells the daemon, and then makes both
//! files durable (`run.rs` has the run itself). It owns the run: the daemon can die and come
//! back without the run noticing.

mod init;
mod outcome;
pub(crate) mod output;

pub(crate) mod result;
mod run;
pub mod spawner;

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::protocol::{FailReason, TaskState};
use crate::run::dir::PrivateDir;
use crate::run::fds;
use crate::run::plan::LaunchPlan;
use crate::run::result::RunResult;
use crate::sandbox::linux::PrepareError;
use crate::sys::{self, dirfd, SigSet, Signal};

#[derive(Debug, thiserror::Error)]
pub(crate) enum SuperviseError {
    #[error("cannot read launch plan {path}: {source}")]
    Plan { path: PathBuf, source: io::Error },
    #[error("cannot open {path}: {source}")]
    Output { path: PathBuf, source: io::Error },
    #[error("command not found: {0}")]
    NotFound(String),
    /// The command exists on the host, but not in the run's view.
    #[error("command not found in the sandbox: {name} is {} on the host, outside this profile's view; {fix}", path.display())]
    NotInView {
        name: String,
        path: PathBuf,
        /// What makes it visible: a profile's `[paths] executable`, or for the subagent's
        /// agent, which runs under the daemon's `[subagent]` section, its grant there.
        fix: &'static str,
    },
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
    pub(crate) fn reason(&self) -> FailReason {
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
    supervisor_main(private_dir, PidFile::Write, false, false)
}

/// [`main`] for a supervisor the spawner forked (and whose pid file it wrote), with the
/// shared offline network namespace the run may join at [`fds::SHARED_NETNS_FD`] when
/// `shared_netns`, and the bare mount namespace at [`fds::bare_mntns_fd`] when `bare`.
fn forked_main(private_dir: &Path, shared_netns: bool, bare: bool) -> i32 {
    supervisor_main(private_dir, PidFile::Written, shared_netns, bare)
}

fn supervisor_main(private_dir: &Path, pid_file: PidFile, shared_netns: bool, bare: bool) -> i32 {
    let started = SystemTime::now();
    // Block the stop signals first: one that arrives during set-up stays pending and is read
    // from the signalfd later, instead of killing the supervisor before it can settle the run.
    let _ = stop_signals().block();
    // Nothing the daemon might have leaked stays open here (stdio, the run directory, the
    // report pipe, and from the spawner the go-ahead pipe and a shared network namespace
    // excepted).
    let keep = match pid_file {
        PidFile::Written => fds::bare_mntns_fd(shared_netns) - 1 + bare as i32,
        PidFile::Write => crate::run::fds::SUPERVISOR_REPORT_FD,
    };
    let _ = sys::close_from(keep as u32 + 1);
    let netns = shared_netns
        .then(|| sys::take_inherited_fd(fds::SHARED_NETNS_FD).ok())
        .flatten();
    let bare_mntns = bare
        .then(|| sys::take_inherited_fd(fds::bare_mntns_fd(shared_netns)).ok())
        .flatten();
    let public =
        match sys::take_inherited_fd(crate::run::fds::SUPERVISOR_PUBLIC_FD).and_then(|fd| {
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
    let report = sys::take_inherited_fd(crate::run::fds::SUPERVISOR_REPORT_FD).ok();
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
    match pid_file {
        PidFile::Write => {
            if let Err(e) = write_pid_file(&private, sys::getpid()) {
                say(format_args!("cannot record this supervisor's pid: {e}"));
            }
        }
        // Read as late as this, the spawner's go-ahead has long been given.
        PidFile::Written => {
            if let Err(e) = spawner_go_ahead() {
                say(format_args!("{e}; nothing was run"));
                return 2;
            }
        }
    }
    let opts = Options {
        egress_first_use: None,
        report,
        netns,
        bare_mntns,
    };
    let (result, output, report) = match supervise_run(&plan, started, public.as_fd(), opts) {
        Ok(s) => (s.result, Some(s.output), s.report),
        Err((e, report)) => (
            failed_result(&plan, started, e.reason(), e.to_string()),
            None,
            report,
        ),
    };
    // The run is over and this is its only record: a write that fails for want of room is
    // tried again until there is (or the daemon asks the run to stop), so the daemon, which
    // sees this supervisor alive meanwhile, neither settles the run as lost nor reports it
    // finished too early; anything else in the way fails the run at once (see
    // `result::write_or_give_up`).
    let (result, written) = result::write_or_give_up(
        result,
        public.as_fd(),
        plan.public_owner,
        &private,
        &plan.public_dir.join(crate::run::dir::RESULT),
    );
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
        .and_then(|()| written.as_ref().map_or(Ok(()), |f| f.sync_all()))
        .and_then(|()| dirfd::fsync_dir(public.as_fd()));
    if let Err(e) = durable {
        say(format_args!("cannot make the run's files durable: {e}"));
    }
    // Without a report, a daemon settles from this exit and the log's last lines.
    if written.is_some() {
        0
    } else {
        3
    }
}

/// A line to the supervisor's log (its stderr). Never panics, unlike `eprintln`: the log may
/// be on a full disk.
fn say(msg: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "sidejob supervise: {msg}");
}

/// Waits for the spawner's go-ahead (see `spawner::fork_supervisor`).
fn spawner_go_ahead() -> io::Result<()> {
    let go = sys::take_inherited_fd(fds::GO_FD)?;
    match sys::read_fd(&go, &mut [0u8; 1])? {
        1 => Ok(()),
        _ => Err(io::Error::other(
            "the spawner did not let the run go ahead (it could not record this supervisor's \
             pid, or it is gone)",
        )),
    }
}

/// Records the supervisor's `pid start_time`, so a daemon that restarts before it recorded
/// the spawn can still find it.
fn write_pid_file(private: &PrivateDir, pid: i32) -> io::Result<()> {
    let start = sys::process_start_time(pid)?;
    std::fs::write(private.pid_file(), format!("{pid} {start}\n"))
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
pub(crate) struct Options<'a> {
    /// Called once, when the run's relay first has a connection or query to hand over
    /// (`sidejob exec` starts its proxy then, so a run that never uses the network never pays
    /// for one). It runs in this single-threaded process, before the hand-over.
    pub egress_first_use: Option<&'a mut dyn FnMut()>,
    /// The daemon's report pipe: kept out of the run's init (nothing of the run may hold it)
    /// and handed back with the result.
    pub report: Option<OwnedFd>,
    /// The session's shared offline network namespace, which init joins when it may (see
    /// `sandbox::linux::Prepared::give_shared_netns`).
    pub netns: Option<OwnedFd>,
    /// The spawner's bare mount namespace, whose copy init builds the view in (see
    /// `sandbox::linux::Prepared::give_bare_mntns`).
    pub bare_mntns: Option<OwnedFd>,
}

/// A supervised run: its result, `output.log` (complete, not yet made durable) and the
/// report pipe it came with.
pub(crate) struct Supervised {
    pub result: RunResult,
    pub output: std::fs::File,
    pub report: Option<OwnedFd>,
}

/// Runs the plan to the end and describes how it went. `out_dir` is the run's public
/// directory: `output.log` is created there (never one that exists), handed to the session's
/// owner.
pub(crate) fn supervise(
    plan: &LaunchPlan,
    started: SystemTime,
    out_dir: BorrowedFd<'_>,
) -> Result<RunResult, SuperviseError> {
    supervise_with(plan, started, out_dir, None, None, None)
}

/// [`supervise`], calling `egress_first_use` once, when the run's relay first has a
/// connection or query to hand over, and giving the run an offline network namespace to
/// join and the bare mount namespace to build its view in a copy of (see [`Options`]).
pub(crate) fn supervise_with(
    plan: &LaunchPlan,
    started: SystemTime,
    out_dir: BorrowedFd<'_>,
    egress_first_use: Option<&mut dyn FnMut()>,
    netns: Option<OwnedFd>,
    bare_mntns: Option<OwnedFd>,
) -> Result<RunResult, SuperviseError> {
    let opts = Options {
        egress_first_use,
        report: None,
        netns,
        bare_mntns,
    };
    supervise_run(plan, started, out_dir, opts)
        .map(|s| s.result)
        .map_err(|(e, _)| e)
}

/// The whole run: set up and fork init ([`run::Run::start`]), watch it until it is over
/// ([`run::Run::watch`]), then collect what happened into the result
/// ([`run::Run::finish`]). On an
/// error the report pipe is handed back too.
pub(crate) fn supervise_run(
    plan: &LaunchPlan,
    started: SystemTime,
    out_dir: BorrowedFd<'_>,
    opts: Options<'_>,
) -> Result<Supervised, (SuperviseError, Option<OwnedFd>)> {
    let Options {
        egress_first_use,
        mut report,
        netns,
        bare_mntns,
    } = opts;
    let mut run = match run::Run::start(plan, out_dir, &mut report, netns, bare_mntns) {
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

/// The result of a run that never got going.
pub(crate) fn failed_result(
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
