//! The supervisor's side of `result.json`: writing it when the disk may be full.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use super::say;
use crate::protocol::{FailReason, TaskState};
use crate::run::cancel::{CancelRequest, StopReason};
use crate::run::dir::PrivateDir;
use crate::run::result::RunResult;
use crate::sys::{self, SigSet, Signal};

/// Writes `result.json` ([`RunResult::write_visible`]) and returns the result to report
/// with the file, or without one when it cannot be written:
/// - no room (`ENOSPC`, `EDQUOT`): tried again until there is, since the file is the
///   run's only record — but a stop the daemon asks for meanwhile (`task.cancel`, a
///   session closed: SIGTERM, with `cancel.json` saying why) ends the wait, and the run
///   settles as asked, from the report alone;
/// - anything else (`EISDIR`, `EEXIST`, `ELOOP`, `EACCES`, …) is something in the way in
///   a directory the session's owner controls (a directory or a link planted at
///   `result.json` or its temporary name), which waiting does not move: tried once, and
///   the run fails saying so.
///
/// `shown` is the file's path as hosts see it, for the log.
pub(crate) fn write_or_give_up(
    mut result: RunResult,
    dir: BorrowedFd<'_>,
    owner: Option<(u32, u32)>,
    private: &PrivateDir,
    shown: &Path,
) -> (RunResult, Option<std::fs::File>) {
    // The stop signals are blocked (the supervisor's first step): a SIGTERM that came
    // after the run loop let go of its signalfd is still pending, and read here.
    let stops = SigSet::of(&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP]);
    let stop = stops.signalfd().ok();
    let mut pause = Duration::from_millis(100);
    let mut last_error = String::new();
    loop {
        let e = match result.write_visible(dir, owner) {
            Ok(file) => return (result, Some(file)),
            Err(e) => e,
        };
        if !no_room(&e) {
            say(format_args!(
                "cannot write {}: {e}; something is in the way, the run fails",
                shown.display()
            ));
            result.state = TaskState::Failed;
            result.reason = Some(FailReason::SandboxError);
            result.error = Some(format!(
                "cannot write result.json in the run directory: {e} (something is in the \
                 way there: a directory or a link at result.json or .result.json.tmp){}",
                result
                    .error
                    .as_deref()
                    .map_or(String::new(), |was| format!("; the run's own error: {was}"))
            ));
            return (result, None);
        }
        // One line per kind of failure, not one per attempt: the log is in the state
        // directory, which may be on the disk that is full.
        if e.to_string() != last_error {
            say(format_args!(
                "cannot write {}: {e}; trying again until there is room",
                shown.display()
            ));
            last_error = e.to_string();
        }
        if stop_within(stop.as_ref(), pause) {
            let req = CancelRequest::read_or_cancel(private, 0);
            let waited = format!("result.json was not written: no room ({e})");
            match req.reason {
                StopReason::Canceled => {
                    result.state = TaskState::Canceled;
                    result.reason = None;
                }
                StopReason::Timeout => {
                    result.state = TaskState::Failed;
                    result.reason = Some(FailReason::Timeout);
                }
            }
            result.error = Some(match req.message {
                Some(m) => format!("{m}; {waited}"),
                None => format!("stopped while waiting; {waited}"),
            });
            say(format_args!("asked to stop; {waited}"));
            return (result, None);
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// A full disk or an exhausted quota: room that may come.
fn no_room(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Waits up to `pause` for a stop signal on `stop`; true if one came. Without a signalfd,
/// only waits.
fn stop_within(stop: Option<&OwnedFd>, pause: Duration) -> bool {
    let Some(fd) = stop else {
        std::thread::sleep(pause);
        return false;
    };
    let ms = i32::try_from(pause.as_millis()).unwrap_or(i32::MAX);
    match sys::poll_readable(&[Some(fd.as_fd())], ms) {
        Ok(ready) if ready.first() == Some(&true) => {
            matches!(sys::read_signalfd(fd), Ok(Some(_)))
        }
        Ok(_) => false,
        Err(_) => {
            std::thread::sleep(pause);
            false
        }
    }
}
