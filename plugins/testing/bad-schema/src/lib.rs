//! A plugin whose tool declares `{"type": "objekt"}` as its input schema: the loader must
//! refuse the plugin with one line, so MCP clients never see a tool list they would reject.

use serde_json::{json, Value};
use sidejob_plugin_api::json::{LaunchPlan, PlanContext, PluginInfo, ToolSpec};
use sidejob_plugin_api::sdk::Plugin;

pub struct BadSchema;

impl Plugin for BadSchema {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "bad-schema".into(),
            version: "1.0.0".into(),
            tools: vec![ToolSpec {
                name: "misspelled".into(),
                description: "Its schema names a type that does not exist (a test plugin)".into(),
                input_schema: json!({"type": "objekt"}),
                supports_background: true,
                default_yield_after_ms: 30_000,
            }],
        }
    }

    fn plan(_tool: &str, _args: Value, _ctx: PlanContext) -> Result<LaunchPlan, String> {
        Ok(LaunchPlan {
            argv: vec!["true".into()],
            ..LaunchPlan::default()
        })
    }
}

sidejob_plugin_api::export_plugin!(BadSchema);
