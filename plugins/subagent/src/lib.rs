//! The `subagent` tool: `{prompt, agent?}` runs the configured agent command
//! (`[subagent] command = [...]` in the daemon config) in a child session of the caller's, with
//! a bridge scoped to that child session (`SIDEJOB_BRIDGE`, set by the daemon). The prompt is
//! in `AGENT_PROMPT` and, as `[subagent] prompt` says, also after `--` as the last argument
//! (`"argument"`, the default: `--` ends the agent's options, so a prompt such as
//! `--dangerously-skip-permissions` stays a prompt), on stdin (`"stdin"`), or nowhere else
//! (`"env"`). `agent` is passed as `AGENT_NAME`. The agent runs under `[subagent] profile`
//! (default `agent`). The daemon waits for the child's non-service background tasks when
//! the agent exits and hands its services over to the parent session (see `docs/plugins.md`).

use serde::Deserialize;
use serde_json::{json, Value};
use sidejob_plugin_api::json::{LaunchPlan, PlanContext, PluginInfo, ToolSpec};
use sidejob_plugin_api::sdk::Plugin;

/// How many sessions may lie above a subagent's own (the daemon enforces it too).
const MAX_DEPTH: u32 = 3;

pub struct Subagent;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    prompt: String,
    #[serde(default)]
    agent: Option<String>,
}

impl Plugin for Subagent {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "subagent".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            tools: vec![ToolSpec {
                name: "subagent".into(),
                description: "Run the configured agent on a prompt in a child session. Its own tool calls are tasks \
                              of the child session. It reports back once its background jobs have settled; servers \
                              it started with service: true are handed over to your session and listed in the result."
                    .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "prompt": {"type": "string", "minLength": 1},
                        "agent": {"type": "string", "description": "Which agent, if the configured command knows several (passed as AGENT_NAME)"}
                    },
                    "required": ["prompt"],
                    "additionalProperties": false
                }),
                supports_background: true,
                default_yield_after_ms: 30_000,
            }],
        }
    }

    fn plan(_tool: &str, args: Value, ctx: PlanContext) -> Result<LaunchPlan, String> {
        let args: Args =
            serde_json::from_value(args).map_err(|e| format!("subagent arguments: {e}"))?;
        if args.prompt.trim().is_empty() {
            return Err("subagent arguments: prompt is empty".into());
        }
        if ctx.depth >= MAX_DEPTH {
            return Err(format!(
                "subagents nest at most {MAX_DEPTH} deep; this session is already {} below the host's",
                ctx.depth
            ));
        }
        let command: Vec<String> = ctx
            .config
            .pointer("/subagent/command")
            .and_then(|c| serde_json::from_value(c.clone()).ok())
            .unwrap_or_default();
        if command.is_empty() {
            return Err("no agent is configured: set [subagent] command = [\"my-agent\", ...] in the daemon's config file".into());
        }
        let mut argv = command;
        let mut stdin = None;
        match ctx
            .config
            .pointer("/subagent/prompt")
            .and_then(Value::as_str)
            .unwrap_or("argument")
        {
            "argument" => {
                argv.push("--".into());
                argv.push(args.prompt.clone());
            }
            "stdin" => stdin = Some(args.prompt.clone()),
            "env" => {}
            other => {
                return Err(format!(
                    "[subagent] prompt = {other:?}: use \"argument\", \"stdin\" or \"env\""
                ))
            }
        }
        let mut env: std::collections::BTreeMap<String, String> =
            [("AGENT_PROMPT".to_string(), args.prompt.clone())].into();
        if let Some(agent) = args.agent {
            env.insert("AGENT_NAME".into(), agent);
        }
        let first = args.prompt.lines().next().unwrap_or("").trim().to_owned();
        // The agent runs under `[subagent] profile` (the daemon checks it narrows the
        // caller's, then adds the section's grants: the agent's configuration and its model
        // API hosts).
        let profile = ctx
            .config
            .pointer("/subagent/profile")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .map(str::to_owned);
        Ok(LaunchPlan {
            argv,
            env,
            stdin,
            profile,
            child_session: true,
            bridge: true,
            summary: Some(format!("subagent: {first}")),
            ..LaunchPlan::default()
        })
    }
}

sidejob_plugin_api::export_plugin!(Subagent);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ctx(subagent: Value) -> PlanContext {
        PlanContext {
            session_id: "s".into(),
            task_id: "t".into(),
            workspace: "/tmp".into(),
            session_dir: "/tmp/s".into(),
            tmp_dir: "/tmp/s/t".into(),
            profile: "workspace-write".into(),
            depth: 0,
            config: json!({ "subagent": subagent }),
        }
    }

    const FLAG: &str = "--dangerously-skip-permissions";

    #[test]
    fn the_prompt_comes_after_the_end_of_options() {
        let plan = Subagent::plan(
            "subagent",
            json!({"prompt": FLAG}),
            ctx(json!({"command": ["agent", "-p"]})),
        )
        .unwrap();
        assert_eq!(plan.argv, ["agent", "-p", "--", FLAG]);
        assert_eq!(plan.env["AGENT_PROMPT"], FLAG);
        assert_eq!(plan.stdin, None);
    }

    #[test]
    fn the_prompt_can_travel_on_stdin_or_only_in_the_environment() {
        let stdin = Subagent::plan(
            "subagent",
            json!({"prompt": FLAG, "agent": "a"}),
            ctx(json!({"command": ["agent"], "prompt": "stdin"})),
        )
        .unwrap();
        assert_eq!(stdin.argv, ["agent"]);
        assert_eq!(stdin.stdin.as_deref(), Some(FLAG));
        assert_eq!(stdin.env["AGENT_NAME"], "a");
        let env = Subagent::plan(
            "subagent",
            json!({"prompt": FLAG}),
            ctx(json!({"command": ["agent"], "prompt": "env"})),
        )
        .unwrap();
        assert_eq!(env.argv, ["agent"]);
        assert_eq!(env.stdin, None);
        assert_eq!(env.env["AGENT_PROMPT"], FLAG);
    }
}
