//! Poll-proofing (docs/protocol.md): consecutive foreground calls that look like waiting on an external
//! event get a hint naming `background: true`, so the host stops spending turns on polling.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use crate::protocol::ToolCallResult;

pub(super) const POLL_HINT: &str = "this looks like waiting on an external event (CI, a deploy, a rollout); \
    run it once with background: true (or yield_after_ms: 0) and end the turn: you get a wake when it \
    finishes, instead of polling";

/// Counts consecutive waiting-like foreground calls per session.
#[derive(Default)]
pub(super) struct Polling {
    streak: Mutex<HashMap<String, u32>>,
}

impl Polling {
    /// Forgets a closed session's streak.
    pub(super) fn forget(&self, session_id: &str) {
        self.streak
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session_id);
    }

    /// Records one call; returns the hint if this is the second waiting-like foreground call
    /// in a row in the session.
    pub(super) fn observe(&self, session_id: &str, args: &Value, detached: bool) -> Option<String> {
        let command = args.get("command").and_then(Value::as_str).unwrap_or("");
        let waiting = !detached && looks_like_waiting(command);
        let mut map = self.streak.lock().unwrap_or_else(|e| e.into_inner());
        if !waiting {
            // Only sessions on a streak are kept: the map does not grow with every session.
            map.remove(session_id);
            return None;
        }
        let n = map.entry(session_id.to_owned()).or_insert(0);
        *n += 1;
        (*n >= 2).then(|| POLL_HINT.to_owned())
    }
}

/// Does a shell command look like it waits for something outside the sandbox?
pub(super) fn looks_like_waiting(command: &str) -> bool {
    let c = command.trim();
    let words: Vec<&str> = c
        .split(|ch: char| ch.is_whitespace() || ch == ';' || ch == '&' || ch == '|')
        .filter(|w| !w.is_empty())
        .collect();
    let has = |seq: &[&str]| words.windows(seq.len()).any(|w| w == seq);
    let first = words.first().copied().unwrap_or("");
    let loops = (c.starts_with("while ")
        || c.starts_with("until ")
        || c.contains("; do")
        || c.contains(";do"))
        && words.contains(&"sleep");
    first == "sleep"
        || has(&["gh", "pr", "checks"])
        || has(&["gh", "run", "watch"])
        || has(&["gh", "run", "view"])
        || has(&["kubectl", "rollout", "status"])
        || has(&["kubectl", "wait"])
        || loops
        || (words.contains(&"curl")
            && (words.iter().any(|w| w.starts_with("--retry")) || words.contains(&"sleep")))
}

/// Adds a hint to a `tool.call` result (after any hint it already has).
pub(super) fn with_hint(mut result: ToolCallResult, hint: Option<String>) -> ToolCallResult {
    let Some(hint) = hint else { return result };
    let slot = match &mut result {
        ToolCallResult::Completed(c) => &mut c.hint,
        ToolCallResult::Running(r) => &mut r.hint,
    };
    *slot = Some(match slot.take() {
        Some(existing) => format!("{existing}; {hint}"),
        None => hint,
    });
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn recognises_waiting_commands() {
        for c in [
            "sleep 30",
            "sleep 5 && gh pr checks 12",
            "gh pr checks 42 --watch",
            "gh run watch 123",
            "gh run view 99 --log",
            "while ! curl -sf localhost:8080; do sleep 2; done",
            "until kubectl get pod x; do sleep 1; done",
            "kubectl rollout status deploy/web",
            "curl --retry 10 --retry-delay 5 https://example.invalid",
        ] {
            assert!(looks_like_waiting(c), "{c}");
        }
        for c in ["cargo test", "ls -la", "echo sleep", "make build && ./run"] {
            assert!(!looks_like_waiting(c), "{c}");
        }
    }

    #[test]
    fn hints_from_the_second_consecutive_waiting_call() {
        let p = Polling::default();
        let wait = json!({"command": "gh pr checks 1"});
        assert_eq!(p.observe("s", &wait, false), None);
        assert!(p.observe("s", &wait, false).is_some());
        assert_eq!(p.observe("s", &json!({"command": "ls"}), false), None);
        assert_eq!(p.observe("s", &wait, false), None);
        // Detached waits are the fix, not the problem.
        assert_eq!(p.observe("s", &wait, true), None);
        assert_eq!(p.observe("other", &wait, false), None);
    }
}
