//! The built-in `bash` tool: `{command, workdir?, description?}`.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{resolve_workdir, PlanContext, PlanError, Planner, ToolPlan};
use crate::protocol::ToolInfo;

pub struct Bash;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    command: String,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    description: Option<String>,
}

impl Planner for Bash {
    fn describe(&self) -> ToolInfo {
        ToolInfo {
            name: "bash".into(),
            description: "Run a shell command in the session's sandbox. Output (stdout and stderr, interleaved) \
                          is returned when it finishes within yield_after_ms; otherwise the call returns \
                          status \"running\" and the command keeps going in the background. Start servers \
                          and watches with background: true, not with '&'."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "minLength": 1, "description": "The command, run with bash -c"},
                    "workdir": {"type": "string", "description": "Directory to run in, relative to the workspace"},
                    "description": {"type": "string", "description": "A few words on what the command does, for task lists"}
                },
                "required": ["command"],
                "additionalProperties": false
            }),
            supports_background: true,
            default_yield_after_ms: 30_000,
        }
    }

    fn plan(&self, args: &Value, ctx: &PlanContext) -> Result<ToolPlan, PlanError> {
        let args: Args = serde_json::from_value(args.clone())
            .map_err(|e| PlanError(format!("bash arguments: {e}")))?;
        if args.command.trim().is_empty() {
            return Err(PlanError("bash arguments: command is empty".into()));
        }
        let shell = if std::path::Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        };
        let summary = args
            .description
            .filter(|d| !d.trim().is_empty())
            .unwrap_or_else(|| args.command.clone());
        Ok(ToolPlan {
            argv: vec![shell.into(), "-c".into(), args.command],
            env: Vec::new(),
            cwd: resolve_workdir(ctx.workspace, args.workdir.as_deref())?,
            summary: one_line(&summary, 160),
        })
    }
}

/// The first line of `s`, at most `max` characters.
fn one_line(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("").trim();
    if line.chars().count() > max || s.trim().lines().count() > 1 {
        let cut: String = line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_a_command_in_the_workspace() {
        let ws = std::env::temp_dir();
        let ctx = PlanContext {
            workspace: &ws,
            session_id: "s",
            task_id: "t",
        };
        let plan = Bash.plan(&json!({"command": "echo hi"}), &ctx).unwrap();
        assert_eq!(plan.argv[1..], ["-c".to_string(), "echo hi".to_string()]);
        assert_eq!(plan.summary, "echo hi");
    }

    #[test]
    fn refuses_bad_arguments() {
        let ws = std::env::temp_dir();
        let ctx = PlanContext {
            workspace: &ws,
            session_id: "s",
            task_id: "t",
        };
        for bad in [
            json!({}),
            json!({"command": ""}),
            json!({"command": 3}),
            json!({"command": "x", "extra": 1}),
        ] {
            assert!(Bash.plan(&bad, &ctx).is_err(), "{bad}");
        }
        let err = Bash
            .plan(&json!({"command": "x", "workdir": "../.."}), &ctx)
            .unwrap_err();
        assert!(
            err.0.contains("outside the workspace") || err.0.contains("workdir"),
            "{err}"
        );
    }

    #[test]
    fn summaries_are_one_line() {
        assert_eq!(one_line("a\nb", 10), "a…");
        assert_eq!(one_line("abcdef", 4), "abc…");
    }
}
