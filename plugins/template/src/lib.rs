//! A template sidejob plugin: the `hello` tool, `{name}` → prints `Hello, <name>!`.
//!
//! A plugin only plans: it describes its tools and turns a call's arguments into a launch plan
//! (argv, env, files, ...). The daemon runs the plan in the session's sandbox, captures the
//! output, and handles backgrounding, cancellation and delivery.

use serde::Deserialize;
use serde_json::{json, Value};
use sidejob_plugin_api::json::{LaunchPlan, PlanContext, PluginInfo, RenderInput, ToolSpec};
use sidejob_plugin_api::sdk::Plugin;

pub struct Hello;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    name: String,
}

impl Plugin for Hello {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "hello".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            tools: vec![ToolSpec {
                name: "hello".into(),
                description: "Greets someone (a template plugin)".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {"name": {"type": "string", "minLength": 1}},
                    "required": ["name"],
                    "additionalProperties": false
                }),
                supports_background: true,
                default_yield_after_ms: 30_000,
            }],
        }
    }

    fn plan(_tool: &str, args: Value, _ctx: PlanContext) -> Result<LaunchPlan, String> {
        // A returned Err is shown to the host as invalid params; a panic becomes an error too.
        let args: Args =
            serde_json::from_value(args).map_err(|e| format!("hello arguments: {e}"))?;
        Ok(LaunchPlan {
            // No shell: the name is one argument, whatever it contains.
            argv: vec!["printf".into(), "Hello, %s!\\n".into(), args.name.clone()],
            summary: Some(format!("greet {}", args.name)),
            ..LaunchPlan::default()
        })
    }

    fn render(result: RenderInput) -> String {
        // The text the model sees; an empty string keeps the output as it is.
        format!("{} ({})", result.output.trim_end(), result.state)
    }
}

sidejob_plugin_api::export_plugin!(Hello);
