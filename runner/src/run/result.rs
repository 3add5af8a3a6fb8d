//! `result.json` (docs/protocol.md): what it holds, how it is written (once, atomically, by
//! the supervisor), sent on the report pipe, and read back (by the daemon).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use serde::{Deserialize, Serialize};

use super::dir::{open_file, RESULT};
pub(crate) use crate::egress::record::NetworkViolation;
use crate::protocol::{FailReason, TaskState};

/// The largest `result.json` the daemon reads back (a real one is about 1 KiB).
const MAX_RESULT_BYTES: u64 = 256 * 1024;

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
        crate::sys::dirfd::write_visible_at(dir, RESULT, &self.to_json(), 0o600, owner)
    }

    fn to_json(&self) -> Vec<u8> {
        // Infallible: every field serialises (strings, numbers, and JSON values).
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Sends the result to the daemon on its report pipe (`run::fds::SUPERVISOR_REPORT_FD`):
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

/// Reads `result.json` from a public half; `Ok(None)` if there is none (yet). What it says is
/// data about the run, never authority: the caller checks it names the task it expects.
pub(crate) fn read(dir: BorrowedFd<'_>, owner_uid: u32) -> io::Result<Option<RunResult>> {
    use std::io::Read;
    let f = match open_file(dir, RESULT, owner_uid) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    f.take(MAX_RESULT_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_RESULT_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "result.json is too large",
        ));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
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
