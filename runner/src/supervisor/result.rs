//! `result.json` (docs/protocol.md): written once, atomically, by the supervisor.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{say, CancelRequest, StopReason};
pub(crate) use crate::egress::record::NetworkViolation;
use crate::protocol::{FailReason, TaskState};
use crate::run_dir::PrivateDir;
use crate::sys::{self, SigSet, Signal};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct RunResult {
    pub task_id: String,
    pub session_id: String,
    pub tool: String,
    pub state: TaskState,
    pub reason: Option<FailReason>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_at: String,
    pub ended_at: String,
    pub duration_ms: u64,
    pub output_path: String,
    pub output_bytes: u64,
    pub output_truncated: bool,
    pub leftover_processes: u32,
    pub profile: String,
    pub sandbox_layers: Vec<String>,
    /// What the run ran into: limits as names (`timeout`, `output_cap`, …), and refused
    /// network connections and lookups as objects (`{kind: "network", host, port, at, …}`).
    #[serde(default)]
    pub violations: Vec<Violation>,
    /// What went wrong, when the run could not start or was stopped by sidejob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One entry of `violations`. Limits stay plain strings, as they always were, so every
/// reader of older results keeps working; network refusals are objects; anything else (a
/// kind a later version adds) is kept as it is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub(crate) enum Violation {
    Limit(String),
    Network(NetworkViolation),
    Other(serde_json::Value),
}

impl From<&str> for Violation {
    fn from(s: &str) -> Violation {
        Violation::Limit(s.to_owned())
    }
}

impl From<String> for Violation {
    fn from(s: String) -> Violation {
        Violation::Limit(s)
    }
}

impl Violation {
    /// The limit's name, for a limit.
    pub(crate) fn limit(&self) -> Option<&str> {
        match self {
            Violation::Limit(s) => Some(s),
            Violation::Network(_) | Violation::Other(_) => None,
        }
    }
}

/// The longest summary line (`task.get`'s `violations`, `sidejob exec`'s note).
const MAX_SUMMARY: usize = 400;

/// One line saying what a run ran into: limits by name, then refused network targets with
/// their reason and count, e.g. `timeout; network refused: evil.test:443 (not_allowed) ×2`.
/// `None` when there was nothing.
pub(crate) fn summary(violations: &[Violation]) -> Option<String> {
    let limits: Vec<&str> = violations.iter().filter_map(Violation::limit).collect();
    let network: Vec<String> = violations
        .iter()
        .filter_map(|v| match v {
            Violation::Network(n) if n.count > 1 => {
                Some(format!("{} ({}) ×{}", n.target(), n.reason, n.count))
            }
            Violation::Network(n) => Some(format!("{} ({})", n.target(), n.reason)),
            Violation::Limit(_) | Violation::Other(_) => None,
        })
        .collect();
    let mut parts = Vec::new();
    if !limits.is_empty() {
        parts.push(format!("limits hit: {}", limits.join(", ")));
    }
    if !network.is_empty() {
        parts.push(format!("network refused: {}", network.join(", ")));
    }
    if parts.is_empty() {
        return None;
    }
    let mut line = parts.join("; ");
    if line.len() > MAX_SUMMARY {
        let mut cut = MAX_SUMMARY;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    Some(line)
}

impl RunResult {
    /// Writes `result.json` into the run's public directory, handed to `owner` (a fresh
    /// temporary file, renamed): every reader sees no result or the whole of it, and the
    /// caller makes it durable (the file's `sync_all`, then the directory's fsync) after
    /// reporting it.
    pub(crate) fn write_visible(
        &self,
        dir: BorrowedFd<'_>,
        owner: Option<(u32, u32)>,
    ) -> std::io::Result<std::fs::File> {
        crate::sys::dirfd::write_visible_at(
            dir,
            crate::run_dir::RESULT,
            &self.to_json(),
            0o600,
            owner,
        )
    }

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
        mut self,
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
            let e = match self.write_visible(dir, owner) {
                Ok(file) => return (self, Some(file)),
                Err(e) => e,
            };
            if !no_room(&e) {
                say(format_args!(
                    "cannot write {}: {e}; something is in the way, the run fails",
                    shown.display()
                ));
                self.state = TaskState::Failed;
                self.reason = Some(FailReason::SandboxError);
                self.error = Some(format!(
                    "cannot write result.json in the run directory: {e} (something is in the \
                     way there: a directory or a link at result.json or .result.json.tmp){}",
                    self.error
                        .as_deref()
                        .map_or(String::new(), |was| format!("; the run's own error: {was}"))
                ));
                return (self, None);
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
                        self.state = TaskState::Canceled;
                        self.reason = None;
                    }
                    StopReason::Timeout => {
                        self.state = TaskState::Failed;
                        self.reason = Some(FailReason::Timeout);
                    }
                }
                self.error = Some(match req.message {
                    Some(m) => format!("{m}; {waited}"),
                    None => format!("stopped while waiting; {waited}"),
                });
                say(format_args!("asked to stop; {waited}"));
                return (self, None);
            }
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    fn to_json(&self) -> Vec<u8> {
        // Infallible: every field serialises (strings, numbers, and JSON values).
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Sends the result to the daemon on its report pipe (`run_dir::SUPERVISOR_REPORT_FD`):
    /// one line of JSON. Never blocks: a daemon that is gone (`EPIPE`) or not reading (a
    /// full pipe) gets no report, or half of one, and settles from `result.json` once this
    /// supervisor has exited, as a restarted daemon does.
    pub(crate) fn send(&self, pipe: &OwnedFd) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        line.push(b'\n');
        crate::sys::set_nonblocking(pipe, true)?;
        let mut sent = 0;
        while sent < line.len() {
            match nix::unistd::write(pipe, &line[sent..]) {
                Ok(n) => sent += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The result a supervisor sent ([`RunResult::send`]): `Some` once `received` holds a
    /// whole line, `None` while it does not (or if the line is not a result).
    pub(crate) fn from_report(received: &[u8]) -> Option<RunResult> {
        let end = received.iter().position(|b| *b == b'\n')?;
        serde_json::from_slice(&received[..end]).ok()
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::egress::policy::Refusal;
    use crate::egress::record::Via;

    #[test]
    fn limits_stay_strings_and_network_refusals_are_objects() {
        let mut n =
            NetworkViolation::new("evil.test", Some(443), Refusal::NotAllowed, Via::Connect);
        n.count = 2;
        let v = vec![Violation::from("timeout"), Violation::Network(n)];
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json[0], "timeout");
        assert_eq!(json[1]["kind"], "network");
        assert_eq!(json[1]["host"], "evil.test");
        assert_eq!(json[1]["port"], 443);
        assert!(json[1]["at"].is_string());
        let back: Vec<Violation> = serde_json::from_value(json).unwrap();
        assert_eq!(back, v);
        // An older result (strings only) and an unknown kind both read.
        let old: Vec<Violation> =
            serde_json::from_str(r#"["oom_kill", {"kind": "future"}]"#).unwrap();
        assert_eq!(old[0], Violation::from("oom_kill"));
        assert!(matches!(old[1], Violation::Other(_)));
        assert_eq!(
            summary(&back).unwrap(),
            "limits hit: timeout; network refused: evil.test:443 (not_allowed) ×2"
        );
        assert_eq!(summary(&[]), None);
    }
}
