//! The `code` tool: `{language: "python" | "javascript", code}` runs a script with `python3`
//! or `node`, with a prelude that exposes `tools` — `tools.call(name, args)`,
//! `tools.bash(command, options)`, `tools.jobs.list|get|output|wait|stop`,
//! `tools.request_input(schema, prompt)` — over the run's bridge. Calls made through it are
//! tasks of the same session, with this task as their parent.

use serde::Deserialize;
use serde_json::{json, Value};
use sidejob_plugin_api::json::{LaunchPlan, PlanContext, PluginInfo, ToolSpec};
use sidejob_plugin_api::sdk::Plugin;

const PRELUDE_PY: &str = include_str!("prelude.py");
const PRELUDE_JS: &str = include_str!("prelude.js");

/// A script travels as one argument, which Linux caps at 128 KiB.
const MAX_CODE_BYTES: usize = 96 * 1024;

pub struct Code;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    language: Language,
    code: String,
    #[serde(default)]
    description: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Language {
    Python,
    Javascript,
}

impl Plugin for Code {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "code".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            tools: vec![ToolSpec {
                name: "code".into(),
                description: "Run a Python or JavaScript script in the session's sandbox. The script has a `tools` \
                              object: tools.call(name, args), tools.bash(command, options), \
                              tools.jobs.list|get|output|wait|stop(task_id), tools.request_input(schema, prompt) \
                              (in JavaScript every call returns a Promise; top-level await works). Jobs it starts \
                              are tasks of this session. What it prints is the result."
                    .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "language": {"type": "string", "enum": ["python", "javascript"]},
                        "code": {"type": "string", "minLength": 1, "maxLength": MAX_CODE_BYTES},
                        "description": {"type": "string", "description": "A few words on what the script does, for task lists"}
                    },
                    "required": ["language", "code"],
                    "additionalProperties": false
                }),
                supports_background: true,
                default_yield_after_ms: 30_000,
            }],
        }
    }

    fn plan(_tool: &str, args: Value, _ctx: PlanContext) -> Result<LaunchPlan, String> {
        let args: Args =
            serde_json::from_value(args).map_err(|e| format!("code arguments: {e}"))?;
        if args.code.trim().is_empty() {
            return Err("code arguments: code is empty".into());
        }
        if args.code.len() > MAX_CODE_BYTES {
            return Err(format!(
                "code arguments: the script is {} bytes; the limit is {MAX_CODE_BYTES} (write it to a file in the workspace and run that)",
                args.code.len()
            ));
        }
        // A JSON string literal is also a valid Python and JavaScript string literal.
        let code = serde_json::to_string(&args.code).map_err(|e| e.to_string())?;
        let argv = match args.language {
            Language::Python => {
                let script = format!(
                    "{PRELUDE_PY}\nexec(compile({code}, \"<code>\", \"exec\"), {{\"tools\": tools, \"ToolError\": ToolError, \"__name__\": \"__main__\"}})\n"
                );
                vec!["python3".into(), "-c".into(), script]
            }
            Language::Javascript => {
                let script = format!(
                    "{PRELUDE_JS}\nconst __code = {code};\n\
                     (async () => {{ const AsyncFunction = Object.getPrototypeOf(async function(){{}}).constructor; \
                     await new AsyncFunction(\"tools\", \"ToolError\", \"require\", __code)(tools, ToolError, require); }})()\n\
                     .then(() => __bridge.close(), (e) => {{ console.error(e && e.stack || String(e)); process.exitCode = 1; __bridge.close(); }});\n"
                );
                vec!["node".into(), "-e".into(), script]
            }
        };
        let summary = args
            .description
            .filter(|d| !d.trim().is_empty())
            .unwrap_or_else(|| {
                args.code
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            });
        Ok(LaunchPlan {
            argv,
            env: [("PYTHONUNBUFFERED".to_string(), "1".to_string())].into(),
            bridge: true,
            summary: Some(summary),
            ..LaunchPlan::default()
        })
    }
}

sidejob_plugin_api::export_plugin!(Code);

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
    fn plans_python_and_javascript_with_the_bridge() {
        let p = Code::plan(
            "code",
            json!({"language": "python", "code": "print(1)"}),
            ctx(),
        )
        .unwrap();
        assert_eq!(p.argv[0], "python3");
        assert!(p.bridge);
        let p = Code::plan(
            "code",
            json!({"language": "javascript", "code": "console.log(1)"}),
            ctx(),
        )
        .unwrap();
        assert_eq!(p.argv[0], "node");
        assert!(Code::plan("code", json!({"language": "ruby", "code": "1"}), ctx()).is_err());
        assert!(Code::plan("code", json!({"language": "python", "code": " "}), ctx()).is_err());
    }
}
