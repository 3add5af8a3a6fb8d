//! The `bash` tool: `{command, workdir?, description?, env?}` runs `bash -c <command>` in the
//! session's sandbox.

use serde::Deserialize;
use serde_json::{json, Value};
use sidejob_plugin_api::json::{LaunchPlan, PlanContext, PluginInfo, ToolSpec};
use sidejob_plugin_api::sdk::Plugin;

pub struct Bash;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    command: String,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    description: Option<String>,
    /// Variables added to the command's environment (on top of what the profile passes).
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
}

impl Plugin for Bash {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "bash".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            tools: vec![ToolSpec {
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
                        "description": {"type": "string", "description": "A few words on what the command does, for task lists"},
                        "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Variables to set in the command's environment"}
                    },
                    "required": ["command"],
                    "additionalProperties": false
                }),
                supports_background: true,
                default_yield_after_ms: 30_000,
            }],
        }
    }

    fn plan(_tool: &str, args: Value, _ctx: PlanContext) -> Result<LaunchPlan, String> {
        let args: Args =
            serde_json::from_value(args).map_err(|e| format!("bash arguments: {e}"))?;
        if args.command.trim().is_empty() {
            return Err("bash arguments: command is empty".into());
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
        Ok(LaunchPlan {
            argv: vec![shell.into(), "-c".into(), args.command],
            cwd: args.workdir.filter(|d| !d.is_empty()),
            summary: Some(one_line(&summary, 160)),
            env: args.env,
            ..LaunchPlan::default()
        })
    }
}

sidejob_plugin_api::export_plugin!(Bash);

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
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ctx() -> PlanContext {
        PlanContext {
            session_id: "s".into(),
            task_id: "t".into(),
            workspace: "/tmp".into(),
            session_dir: "/tmp/s".into(),
            tmp_dir: "/tmp/s/t".into(),
            profile: "workspace-write".into(),
            depth: 0,
            config: Value::Null,
        }
    }

    #[test]
    fn plans_a_command_in_the_workspace() {
        let plan = Bash::plan("bash", json!({"command": "echo hi"}), ctx()).unwrap();
        assert_eq!(plan.argv[1..], ["-c".to_string(), "echo hi".to_string()]);
        assert_eq!(plan.summary.as_deref(), Some("echo hi"));
        assert_eq!(plan.cwd, None);
    }

    #[test]
    fn refuses_bad_arguments() {
        for bad in [
            json!({}),
            json!({"command": ""}),
            json!({"command": 3}),
            json!({"command": "x", "extra": 1}),
        ] {
            assert!(Bash::plan("bash", bad.clone(), ctx()).is_err(), "{bad}");
        }
    }

    #[test]
    fn summaries_are_one_line() {
        assert_eq!(one_line("a\nb", 10), "a…");
        assert_eq!(one_line("abcdef", 4), "abc…");
    }
}
