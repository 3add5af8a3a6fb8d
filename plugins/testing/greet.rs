// Shared body of the `greet` test plugins: `greet {sleep_ms?}` prints `greet v<VERSION>`
// (after an optional pause) so a test can tell which version planned a call; with `stdin`,
// it plans `cat` with that text as the command's stdin instead, and with `file`, `cat` of a
// file the plan places in the run's tmp.

use serde_json::{json, Value};
use sidejob_plugin_api::json::{LaunchPlan, PlanContext, PluginInfo, ToolSpec};
use sidejob_plugin_api::sdk::Plugin;

pub struct Greet;

impl Plugin for Greet {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "greet".into(),
            version: format!("{VERSION}.0.0"),
            tools: vec![ToolSpec {
                name: "greet".into(),
                description: format!("Prints which version of the plugin planned it (v{VERSION})"),
                input_schema: json!({"type": "object", "properties": {"sleep_ms": {"type": "integer"}}}),
                supports_background: true,
                default_yield_after_ms: 30_000,
            }],
        }
    }

    fn plan(_tool: &str, args: Value, ctx: PlanContext) -> Result<LaunchPlan, String> {
        if let Some(text) = args.get("file").and_then(Value::as_str) {
            return Ok(LaunchPlan {
                argv: vec!["cat".into(), format!("{}/sub/greeting.txt", ctx.tmp_dir)],
                files: vec![sidejob_plugin_api::json::PlanFile {
                    path: "sub/greeting.txt".into(),
                    content: text.into(),
                    executable: false,
                }],
                ..LaunchPlan::default()
            });
        }
        if let Some(text) = args.get("stdin").and_then(Value::as_str) {
            return Ok(LaunchPlan {
                argv: vec!["cat".into()],
                stdin: Some(text.into()),
                ..LaunchPlan::default()
            });
        }
        let sleep_ms = args.get("sleep_ms").and_then(Value::as_u64).unwrap_or(0);
        let script = format!("sleep {}; echo greet v{VERSION}", sleep_ms as f64 / 1000.0);
        Ok(LaunchPlan {
            argv: vec!["/bin/sh".into(), "-c".into(), script],
            summary: Some(format!("greet v{VERSION}")),
            ..LaunchPlan::default()
        })
    }
}

sidejob_plugin_api::export_plugin!(Greet);
