//! How a run ended, decided from what the supervisor observed: a pure function, so every
//! combination (a start failure, a stop, a signal, no report at all) is decided in one place
//! and tested without running anything.

use crate::protocol::{FailReason, TaskState};
use crate::run::cancel::StopReason;
use crate::run::report::{InitReport, StartFailure};
use crate::run::result::Violation;
use crate::sys::Exit;

/// A stop the supervisor carried out: the daemon's cancel or timeout, or the plan's
/// wall-clock cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stop {
    pub reason: StopReason,
    /// The request's message, shown as the result's `error`.
    pub message: Option<String>,
}

/// Everything the decision rests on.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Observed {
    /// The command's side could not start the command.
    pub start_failure: Option<StartFailure>,
    /// Init's report; `None` when it ended without a whole one.
    pub report: Option<InitReport>,
    /// Init's own exit status, when the supervisor reaped it.
    pub init_exit: Option<Exit>,
    pub stop: Option<Stop>,
    /// The plan's wall-clock cap (named in a timeout's error).
    pub timeout_ms: Option<u64>,
    /// Limits already recorded (the cgroup's, the git quarantine's): not repeated.
    pub recorded: Vec<Violation>,
}

/// The result's fields the outcome decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Outcome {
    pub state: TaskState,
    pub reason: Option<FailReason>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub leftover_processes: u32,
    /// Limits to add to the ones already recorded.
    pub violations: Vec<String>,
    pub error: Option<String>,
}

pub(super) fn classify(o: &Observed) -> Outcome {
    let (ended, leftovers, git_repository) = match &o.report {
        Some(InitReport::Ended {
            exit,
            leftovers,
            git_repository,
        }) => (Some(*exit), *leftovers, *git_repository),
        Some(InitReport::Failed(_)) | None => (None, 0, false),
    };
    let mut out = Outcome {
        state: TaskState::Failed,
        reason: None,
        exit_code: None,
        signal: None,
        leftover_processes: leftovers,
        violations: Vec::new(),
        error: None,
    };
    match ended {
        Some(Exit::Code(c)) => out.exit_code = Some(c),
        Some(Exit::Signal(s)) => out.signal = Some(s),
        None => {}
    }
    let recorded = |name: &str, out: &Outcome| {
        o.recorded.iter().any(|v| v.limit() == Some(name))
            || out.violations.iter().any(|v| v == name)
    };
    // A repository the run made on the `.git` stand-in (init looked after the command).
    if git_repository && !recorded("git_repository", &out) {
        out.violations.push("git_repository".into());
    }
    // Rlimit kills: the signal itself, or a shell's 128+N for a child it lost that way.
    let killed_by =
        |sig: i32| ended == Some(Exit::Signal(sig)) || ended == Some(Exit::Code(128 + sig));
    if killed_by(libc::SIGXFSZ) {
        out.violations.push("file_size".into());
    }
    if killed_by(libc::SIGXCPU) && !recorded("cpu_limit", &out) {
        out.violations.push("cpu_limit".into());
    }

    if let Some(failure) = &o.start_failure {
        out.reason = Some(match failure {
            StartFailure::Sandbox(_) => FailReason::SandboxError,
            StartFailure::Exec(_) => FailReason::SpawnError,
        });
        out.exit_code = None;
        out.error = Some(failure.to_string());
        return out;
    }
    if let Some(stop) = &o.stop {
        match stop.reason {
            StopReason::Canceled => {
                out.state = TaskState::Canceled;
                out.error = stop.message.clone();
            }
            StopReason::Timeout => {
                out.reason = Some(FailReason::Timeout);
                out.violations.push("timeout".into());
                out.error = Some(stop.message.clone().unwrap_or_else(|| {
                    format!("wall-clock cap of {} ms reached", o.timeout_ms.unwrap_or(0))
                }));
            }
        }
        return out;
    }
    match ended {
        Some(Exit::Code(0)) => out.state = TaskState::Succeeded,
        Some(Exit::Code(_)) => out.reason = Some(FailReason::ExitCode),
        Some(Exit::Signal(_)) => out.reason = Some(FailReason::Signal),
        None => {
            out.reason = Some(FailReason::SandboxError);
            out.error = Some(match &o.report {
                Some(InitReport::Failed(why)) => why.clone(),
                Some(InitReport::Ended { .. }) | None => {
                    format!("the run's init ended without a report ({:?})", o.init_exit)
                }
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(exit: Exit) -> Observed {
        Observed {
            start_failure: None,
            report: Some(InitReport::Ended {
                exit,
                leftovers: 0,
                git_repository: false,
            }),
            init_exit: Some(Exit::Code(0)),
            stop: None,
            timeout_ms: Some(1000),
            recorded: Vec::new(),
        }
    }

    #[test]
    fn exit_codes_and_signals() {
        let ok = classify(&ended(Exit::Code(0)));
        assert_eq!(
            (ok.state, ok.reason, ok.exit_code),
            (TaskState::Succeeded, None, Some(0))
        );
        assert_eq!(ok.error, None);
        assert!(ok.violations.is_empty());
        let bad = classify(&ended(Exit::Code(3)));
        assert_eq!(
            (bad.state, bad.reason, bad.exit_code),
            (TaskState::Failed, Some(FailReason::ExitCode), Some(3))
        );
        let sig = classify(&ended(Exit::Signal(libc::SIGSEGV)));
        assert_eq!(
            (sig.reason, sig.exit_code, sig.signal),
            (Some(FailReason::Signal), None, Some(libc::SIGSEGV))
        );
    }

    #[test]
    fn rlimit_kills_are_named_once() {
        assert_eq!(
            classify(&ended(Exit::Signal(libc::SIGXFSZ))).violations,
            ["file_size"]
        );
        // A shell's 128+N says the same.
        assert_eq!(
            classify(&ended(Exit::Code(128 + libc::SIGXFSZ))).violations,
            ["file_size"]
        );
        assert_eq!(
            classify(&ended(Exit::Signal(libc::SIGXCPU))).violations,
            ["cpu_limit"]
        );
        let mut o = ended(Exit::Signal(libc::SIGXCPU));
        o.recorded.push("cpu_limit".into());
        assert!(
            classify(&o).violations.is_empty(),
            "the cgroup already named it"
        );
    }

    #[test]
    fn leftovers_and_a_repository_made_in_the_view() {
        let mut o = ended(Exit::Code(0));
        o.report = Some(InitReport::Ended {
            exit: Exit::Code(0),
            leftovers: 3,
            git_repository: true,
        });
        let out = classify(&o);
        assert_eq!(out.leftover_processes, 3);
        assert_eq!(out.violations, ["git_repository"]);
        o.recorded.push("git_repository".into());
        assert!(
            classify(&o).violations.is_empty(),
            "the quarantine already named it"
        );
    }

    #[test]
    fn a_start_failure_outranks_everything() {
        let mut o = ended(Exit::Code(127));
        o.stop = Some(Stop {
            reason: StopReason::Canceled,
            message: None,
        });
        o.start_failure = Some(StartFailure::Exec(
            "/bin/nope: No such file or directory".into(),
        ));
        let out = classify(&o);
        assert_eq!(
            (out.state, out.reason, out.exit_code),
            (TaskState::Failed, Some(FailReason::SpawnError), None)
        );
        assert_eq!(
            out.error.as_deref(),
            Some("exec /bin/nope: No such file or directory")
        );
        o.start_failure = Some(StartFailure::Sandbox("seccomp: invalid".into()));
        assert_eq!(classify(&o).reason, Some(FailReason::SandboxError));
    }

    #[test]
    fn stops() {
        let mut o = ended(Exit::Signal(libc::SIGTERM));
        o.stop = Some(Stop {
            reason: StopReason::Canceled,
            message: Some("by the host".into()),
        });
        let out = classify(&o);
        assert_eq!((out.state, out.reason), (TaskState::Canceled, None));
        assert_eq!(out.error.as_deref(), Some("by the host"));
        o.stop = Some(Stop {
            reason: StopReason::Timeout,
            message: None,
        });
        let out = classify(&o);
        assert_eq!(
            (out.state, out.reason),
            (TaskState::Failed, Some(FailReason::Timeout))
        );
        assert_eq!(out.violations, ["timeout"]);
        assert_eq!(
            out.error.as_deref(),
            Some("wall-clock cap of 1000 ms reached")
        );
        // The exit is still reported as it was.
        assert_eq!(out.signal, Some(libc::SIGTERM));
    }

    #[test]
    fn no_report_is_a_sandbox_error_that_says_why() {
        let mut o = ended(Exit::Code(0));
        o.report = Some(InitReport::Failed("sandbox: pivot_root: EINVAL".into()));
        let out = classify(&o);
        assert_eq!(
            (out.state, out.reason),
            (TaskState::Failed, Some(FailReason::SandboxError))
        );
        assert_eq!(out.error.as_deref(), Some("sandbox: pivot_root: EINVAL"));
        o.report = None;
        o.init_exit = Some(Exit::Signal(9));
        assert_eq!(
            classify(&o).error.as_deref(),
            Some("the run's init ended without a report (Some(Signal(9)))")
        );
    }
}
