//! What a completion says to the host (docs/protocol.md): an `[automatic]` prompt for proactive
//! sessions, a one-line notice otherwise. Pure.

use crate::protocol::{FailReason, TaskState};
use crate::registry::{Settlement, TaskRow};

/// Lines of output quoted in a wake.
const TAIL_LINES: usize = 20;

/// `(severity, kind, text)` of a background completion.
pub(crate) fn completion(
    task: &TaskRow,
    s: &Settlement,
    proactive: bool,
    output_tail: &str,
) -> (String, String, String) {
    let severity = match (s.state, s.reason) {
        (TaskState::Succeeded, _) => "success",
        (TaskState::Canceled, _) => "warn",
        (_, Some(FailReason::Lost | FailReason::SpawnError | FailReason::SandboxError)) => "error",
        _ => "error",
    };
    let outcome = outcome(s);
    let took = s
        .duration_ms
        .map(|d| format!(" after {}", human_ms(d)))
        .unwrap_or_default();
    if !proactive {
        let text = format!(
            "Background task {} ({}: {}) {outcome}{took}; result: {}",
            task.task_id,
            task.tool,
            task.summary,
            task.result_path()
        );
        return ("info".into(), "notice".into(), text);
    }
    let mut text = format!(
        "[automatic] Background task {} ({}) finished: {outcome}{took}.\nResult: {}\nOutput: {}\n",
        task.task_id,
        what_ran(&task.tool, &task.args, &task.summary),
        task.result_path(),
        task.output_path()
    );
    if let Some(err) = &s.error {
        text.push_str(&format!("Error: {err}\n"));
    }
    let lines: Vec<&str> = output_tail.lines().collect();
    let shown = &lines[lines.len().saturating_sub(TAIL_LINES)..];
    if shown.is_empty() {
        text.push_str("It printed nothing.\n");
    } else {
        text.push_str(&format!("Last {} lines of output:\n", shown.len()));
        for l in shown {
            text.push_str("  ");
            text.push_str(l);
            text.push('\n');
        }
    }
    text.push_str(
        "This is an automatic notification from sidejob, not a message from the user. \
         Read the result, then continue the work it belongs to.",
    );
    (severity.into(), "wake".into(), text)
}

/// What the task ran, as the wake names it: a command as code, with the caller's
/// description beside it (in quotes, never as if it were the command) when it gave one;
/// otherwise the tool's one-line summary, as words.
fn what_ran(tool: &str, args: &str, summary: &str) -> String {
    const MAX: usize = 160;
    let args: serde_json::Value = serde_json::from_str(args).unwrap_or_default();
    let Some(command) = args.get("command").and_then(|c| c.as_str()) else {
        return format!("{tool}: {summary}");
    };
    let mut line: String = command.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > MAX {
        line = line.chars().take(MAX).collect::<String>() + "…";
    }
    let line = line.replace('`', "'");
    match args
        .get("description")
        .and_then(|d| d.as_str())
        .map(str::trim)
    {
        Some(d) if !d.is_empty() => format!("{tool}: `{line}`, \"{d}\""),
        _ => format!("{tool}: `{line}`"),
    }
}

fn outcome(s: &Settlement) -> String {
    match (s.state, s.reason, s.exit_code, s.signal) {
        (TaskState::Succeeded, ..) => "succeeded (exit code 0)".into(),
        (TaskState::Canceled, ..) => "canceled".into(),
        (_, Some(FailReason::Timeout), ..) => "failed: timed out".into(),
        (_, Some(FailReason::Signal), _, Some(sig)) => format!("failed: killed by signal {sig}"),
        (_, Some(FailReason::Lost), ..) => {
            "failed: lost (its supervisor ended without a result)".into()
        }
        (_, Some(FailReason::SpawnError), ..) => "failed: could not be started".into(),
        (_, Some(FailReason::SandboxError), ..) => "failed: sandbox error".into(),
        (_, _, Some(code), _) => format!("failed (exit code {code})"),
        _ => s.state.as_str().to_owned(),
    }
}

fn human_ms(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 120_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

/// The text of a scheduled prompt occurrence.
pub(crate) fn scheduled_prompt(schedule_id: &str, occurrence: u32, prompt: &str) -> String {
    format!(
        "[automatic] Scheduled prompt (schedule {schedule_id}, occurrence {occurrence}):\n{prompt}\n\
         This is an automatic message from sidejob, not a message from the user."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_command_is_named_as_code_and_a_description_as_words() {
        let plain = json!({"command": "npm test"}).to_string();
        assert_eq!(what_ran("bash", &plain, "npm test"), "bash: `npm test`");
        let described =
            json!({"command": "cargo build --release", "description": "build it"}).to_string();
        assert_eq!(
            what_ran("bash", &described, "build it"),
            "bash: `cargo build --release`, \"build it\""
        );
        let code = json!({"code": "print(1)"}).to_string();
        assert_eq!(what_ran("code", &code, "print(1)"), "code: print(1)");
    }
}
