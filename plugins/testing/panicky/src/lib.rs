//! A plugin whose `plan` and `render` panic: the SDK must turn that into an error, and the
//! daemon must live on. Its `describe` works, so the tool is listed.

use serde_json::{json, Value};
use sidejob_plugin_api::json::{LaunchPlan, PlanContext, PluginInfo, RenderInput, ToolSpec};
use sidejob_plugin_api::sdk::Plugin;

pub struct Panicky;

impl Plugin for Panicky {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "panicky".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            tools: vec![ToolSpec {
                name: "panicky".into(),
                description: "Panics when planning (a test plugin)".into(),
                input_schema: json!({"type": "object"}),
                supports_background: true,
                default_yield_after_ms: 30_000,
            }],
        }
    }

    fn plan(_tool: &str, _args: Value, _ctx: PlanContext) -> Result<LaunchPlan, String> {
        panic!("deliberate panic in plan")
    }

    fn render(_result: RenderInput) -> String {
        panic!("deliberate panic in render")
    }
}

sidejob_plugin_api::export_plugin!(Panicky);
