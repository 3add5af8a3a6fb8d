//! `sidejob integrate`: writes (or prints) what an agent client needs to use sidejob in a
//! workspace: `sidejob mcp` as its MCP server, and the hook or plugin that hands it finished
//! background jobs after its turn ends (`sidejob hook`). Existing settings are kept: only
//! sidejob's own entries are added or replaced.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use serde_json::{json, Map, Value};

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum AgentClient {
    /// Claude Code: .mcp.json and the hooks in .claude/settings.json
    Claude,
    /// Codex CLI: the [mcp_servers.sidejob] section of $CODEX_HOME/config.toml
    Codex,
    /// opencode: the "mcp" entry of opencode.json and .opencode/plugin/sidejob.js
    Opencode,
}

/// The opencode plugin (integrations/opencode/sidejob.js), written as shipped.
const OPENCODE_PLUGIN: &str = include_str!("../../../integrations/opencode/sidejob.js");

/// The plugin's line naming the binary, replaced by the one that wrote it.
const OPENCODE_BINARY_LINE: &str = "const SIDEJOB = process.env.SIDEJOB_BIN || \"sidejob\"";

/// How long Claude Code lets the Stop hook wait for a running job (seconds): a little more
/// than the hook's own `--wait`.
const CLAUDE_HOOK_TIMEOUT_S: u64 = 600;

/// One file to write: where, and its whole new text.
struct Planned {
    path: PathBuf,
    text: String,
}

pub(super) fn run(client: AgentClient, workspace: Option<PathBuf>, print: bool) -> Result<i32> {
    let workspace = match workspace {
        Some(w) => w,
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let workspace = workspace
        .canonicalize()
        .with_context(|| format!("cannot open the workspace {}", workspace.display()))?;
    let exe = std::env::current_exe().context("cannot find the sidejob binary")?;
    let sidejob = exe.display().to_string();
    let files = match client {
        AgentClient::Claude => claude(&workspace, &sidejob)?,
        AgentClient::Codex => codex(&sidejob)?,
        AgentClient::Opencode => opencode(&workspace, &sidejob)?,
    };
    for f in &files {
        if print {
            println!("# {}\n{}", f.path.display(), f.text.trim_end());
            continue;
        }
        if let Some(dir) = f.path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&f.path, &f.text)
            .with_context(|| format!("cannot write {}", f.path.display()))?;
        eprintln!("wrote {}", f.path.display());
    }
    if let (AgentClient::Claude, false) = (client, print) {
        // Claude Code ignores a project's permissions until the project is trusted.
        eprintln!(
            "note: until you have trusted this project in Claude Code, `claude -p` needs --allowedTools mcp__sidejob (see integrations/claude/README.md)"
        );
    }
    Ok(0)
}

/// A JSON settings file as it is (an empty object when there is none).
fn read_json(path: &Path) -> Result<Map<String, Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(Map::new()),
        Ok(text) => match serde_json::from_str(&text) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => bail!("{} is not a JSON object; fix or remove it", path.display()),
            Err(e) => bail!(
                "{} is not valid JSON ({e}); fix or remove it",
                path.display()
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Map::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// `map[key]` as an object, made if absent.
fn object<'a>(map: &'a mut Map<String, Value>, key: &str) -> Result<&'a mut Map<String, Value>> {
    map.entry(key)
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .with_context(|| format!("\"{key}\" is not a JSON object"))
}

fn pretty(v: &Map<String, Value>) -> Result<String> {
    Ok(serde_json::to_string_pretty(v)? + "\n")
}

/// Claude Code: the server in the project's `.mcp.json`; in `.claude/settings.json` the
/// server enabled and its tools allowed (so `claude -p` may call them), and `sidejob hook
/// claude` as the Stop, SessionStart and UserPromptSubmit hook.
fn claude(workspace: &Path, sidejob: &str) -> Result<Vec<Planned>> {
    let mcp_path = workspace.join(".mcp.json");
    let mut mcp = read_json(&mcp_path)?;
    object(&mut mcp, "mcpServers")?.insert(
        "sidejob".into(),
        json!({"type": "stdio", "command": sidejob, "args": ["mcp"]}),
    );
    let settings_path = workspace.join(".claude/settings.json");
    let mut settings = read_json(&settings_path)?;
    add_unique(&mut settings, "enabledMcpjsonServers", "sidejob")?;
    add_unique(
        object(&mut settings, "permissions")?,
        "allow",
        "mcp__sidejob",
    )?;
    let hooks = object(&mut settings, "hooks")?;
    let command = format!("{sidejob} hook claude");
    for event in ["Stop", "SessionStart", "UserPromptSubmit"] {
        let entries = hooks.entry(event).or_insert_with(|| json!([]));
        let Some(list) = entries.as_array_mut() else {
            bail!("hooks.{event} in {} is not a list", settings_path.display());
        };
        // Replace an earlier sidejob hook (another binary path, say), keep everyone else's.
        list.retain(|e| !e.to_string().contains("hook claude"));
        list.push(json!({"hooks": [{"type": "command", "command": command, "timeout": CLAUDE_HOOK_TIMEOUT_S}]}));
    }
    Ok(vec![
        Planned {
            path: mcp_path,
            text: pretty(&mcp)?,
        },
        Planned {
            path: settings_path,
            text: pretty(&settings)?,
        },
    ])
}

/// Adds `item` to the list `map[key]` unless it is there.
fn add_unique(map: &mut Map<String, Value>, key: &str, item: &str) -> Result<()> {
    let list = map
        .entry(key)
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .with_context(|| format!("\"{key}\" is not a list"))?;
    if !list.iter().any(|v| v == item) {
        list.push(json!(item));
    }
    Ok(())
}

/// Codex: `[mcp_servers.sidejob]` in `$CODEX_HOME/config.toml` (default `~/.codex`), with
/// its tools approved (Codex's default approval refuses MCP calls under `codex exec`) and a
/// tool timeout long enough for a call that runs until it yields. Appended, so the file's
/// comments stay; a file that has the section already is left for its owner to edit.
fn codex(sidejob: &str) -> Result<Vec<Planned>> {
    let home = match std::env::var_os("CODEX_HOME") {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".codex"),
    };
    let path = home.join("config.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let doc: toml::Table = toml::from_str(&text)
        .with_context(|| format!("{} is not valid TOML; fix it first", path.display()))?;
    if doc
        .get("mcp_servers")
        .and_then(|s| s.get("sidejob"))
        .is_some()
    {
        bail!(
            "{} already has [mcp_servers.sidejob]; edit it by hand (`sidejob integrate codex --print` shows the section)",
            path.display()
        );
    }
    let section = codex_section(sidejob);
    let sep = if text.is_empty() || text.ends_with("\n\n") {
        ""
    } else if text.ends_with('\n') {
        "\n"
    } else {
        "\n\n"
    };
    Ok(vec![Planned {
        path,
        text: format!("{text}{sep}{section}"),
    }])
}

fn codex_section(sidejob: &str) -> String {
    let mut server = toml::Table::new();
    server.insert("command".into(), sidejob.into());
    server.insert("args".into(), toml::Value::Array(vec!["mcp".into()]));
    server.insert("default_tools_approval_mode".into(), "approve".into());
    server.insert("supports_parallel_tool_calls".into(), true.into());
    server.insert("tool_timeout_sec".into(), 600.into());
    let body = toml::to_string(&server).unwrap_or_default();
    format!(
        "# sidejob's tools for Codex (`sidejob integrate codex`)\n[mcp_servers.sidejob]\n{body}"
    )
}

/// opencode: the `mcp` entry in the project's `opencode.json`, and the plugin that prompts
/// the session with finished jobs when it goes idle.
fn opencode(workspace: &Path, sidejob: &str) -> Result<Vec<Planned>> {
    let path = workspace.join("opencode.json");
    let mut config = read_json(&path)?;
    config
        .entry("$schema")
        .or_insert_with(|| json!("https://opencode.ai/config.json"));
    object(&mut config, "mcp")?.insert(
        "sidejob".into(),
        json!({"type": "local", "command": [sidejob, "mcp"], "enabled": true}),
    );
    Ok(vec![
        Planned {
            path,
            text: pretty(&config)?,
        },
        Planned {
            path: workspace.join(".opencode/plugin/sidejob.js"),
            text: OPENCODE_PLUGIN.replacen(
                OPENCODE_BINARY_LINE,
                &format!("const SIDEJOB = {}", serde_json::to_string(sidejob)?),
                1,
            ),
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opencode_plugin_names_its_binary_on_the_line_integrate_replaces() {
        assert!(OPENCODE_PLUGIN.contains(OPENCODE_BINARY_LINE));
    }

    #[test]
    fn the_codex_section_is_valid_toml_with_the_server() {
        let doc: toml::Table = toml::from_str(&codex_section("/usr/bin/sidejob")).unwrap();
        let s = &doc["mcp_servers"]["sidejob"];
        assert_eq!(s["command"].as_str(), Some("/usr/bin/sidejob"));
        assert_eq!(s["args"][0].as_str(), Some("mcp"));
    }
}
