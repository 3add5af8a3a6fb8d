//! The tools sidejob offers, loaded from plugin libraries (docs/plugins.md).
//!
//! Tools are planners: they describe themselves and turn a call's arguments into a launch plan;
//! they never start processes. Every `*.so` in the plugin directories is opened once by
//! descriptor, checked (owner and mode of the file and of every directory above it, no
//! symlinks: `sys::fs`) and loaded through a private copy named by its hash (`loader.rs`), the
//! tools are indexed by name into a [`Catalog`], and the catalog is swapped atomically when a
//! watched directory changes (`watch.rs`). A task keeps nothing of the plugin that planned it,
//! so a reload never touches a running task or its delivery.

mod loader;
mod schema;
mod watch;

pub(crate) use loader::{LoadError, LoadedPlugin};
pub use schema::{helper_main as check_schemas_main, HELPER_COMMAND as CHECK_SCHEMAS};

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::Value;
use sidejob_plugin_api::abi_stable::std_types::RStr;
use sidejob_plugin_api::json;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::protocol::ToolInfo;
use crate::sys::{self, fs::Refusal, fs::TrustedDir};

/// File names of the plugins shipped with sidejob, next to the `sidejob` binary.
const SHIPPED_PREFIX: &str = "libsidejob_plugin_";

/// What a tool needs to know about the call it plans.
pub(crate) struct PlanContext<'a> {
    pub workspace: &'a Path,
    pub session_id: &'a str,
    pub task_id: &'a str,
    pub session_dir: &'a Path,
    /// The run's private tmp, where the plan's `files` are written.
    pub tmp_dir: &'a Path,
    /// The session's profile.
    pub profile: &'a str,
    /// How many sessions lie above the caller's.
    pub depth: u32,
    /// Daemon configuration meant for plugins.
    pub config: &'a Value,
}

/// A tool's plan for one call, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolPlan {
    pub argv: Vec<String>,
    /// Added to the scrubbed base environment.
    pub env: Vec<(String, String)>,
    /// Working directory (inside the workspace).
    pub cwd: PathBuf,
    /// One line for task lists.
    pub summary: String,
    /// Written to the command's stdin, which is then closed.
    pub stdin: Option<String>,
    /// Written into the run's private tmp before the run starts.
    pub files: Vec<json::PlanFile>,
    /// A narrower profile than the session's.
    pub profile: Option<String>,
    pub bridge: bool,
    pub child_session: bool,
    pub service: bool,
}

/// Why a call's arguments were refused; shown to the host as `invalid_params`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PlanError(pub String);

/// One tool of one loaded plugin.
#[derive(Clone)]
pub(crate) struct Tool {
    info: ToolInfo,
    plugin: Arc<LoadedPlugin>,
}

impl Tool {
    pub(crate) fn describe(&self) -> ToolInfo {
        self.info.clone()
    }

    /// The plugin file the tool comes from.
    pub(crate) fn source(&self) -> &Path {
        &self.plugin.source
    }

    /// Asks the plugin for a plan and checks it.
    pub(crate) fn plan(&self, args: &Value, ctx: &PlanContext) -> Result<ToolPlan, PlanError> {
        let context = json::PlanContext {
            session_id: ctx.session_id.into(),
            task_id: ctx.task_id.into(),
            workspace: ctx.workspace.display().to_string(),
            session_dir: ctx.session_dir.display().to_string(),
            tmp_dir: ctx.tmp_dir.display().to_string(),
            profile: ctx.profile.into(),
            depth: ctx.depth,
            config: ctx.config.clone(),
        };
        let context =
            serde_json::to_string(&context).map_err(|e| PlanError(format!("plan context: {e}")))?;
        let args = args.to_string();
        let out = (self.plugin.module.plan())(
            RStr::from(self.info.name.as_str()),
            RStr::from(args.as_str()),
            RStr::from(context.as_str()),
        )
        .into_result()
        .map_err(|e| {
            let message = e.into_string();
            if message.starts_with("the plugin panicked") {
                warn!(tool = %self.info.name, plugin = %self.plugin.source.display(), "{message}");
            }
            PlanError(message)
        })?;
        let plan: json::LaunchPlan = serde_json::from_str(out.as_str()).map_err(|e| {
            PlanError(format!(
                "the {} plugin returned an invalid plan: {e}",
                self.plugin.info.name
            ))
        })?;
        check_plan(plan, ctx)
    }

    /// The plugin's rendering of a finished task, if it has one (errors are logged).
    pub(crate) fn render(&self, input: &json::RenderInput) -> Option<String> {
        let input = serde_json::to_string(input).ok()?;
        match (self.plugin.module.render())(RStr::from(input.as_str())).into_result() {
            Ok(text) if !text.is_empty() => Some(text.into_string()),
            Ok(_) => None,
            Err(e) => {
                warn!(tool = %self.info.name, "render failed: {e}");
                None
            }
        }
    }
}

fn check_plan(plan: json::LaunchPlan, ctx: &PlanContext) -> Result<ToolPlan, PlanError> {
    if plan.argv.is_empty() || plan.argv[0].is_empty() {
        return Err(PlanError("the plugin planned an empty command".into()));
    }
    let mut env = Vec::new();
    for (k, v) in plan.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(PlanError(format!(
                "the plugin planned a bad environment variable {k:?}"
            )));
        }
        if k.starts_with("SIDEJOB_") {
            return Err(PlanError(format!(
                "plugins may not set {k}: the daemon sets SIDEJOB_* itself"
            )));
        }
        env.push((k, v));
    }
    for f in &plan.files {
        let p = Path::new(&f.path);
        if f.path.is_empty()
            || p.is_absolute()
            || p.components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(PlanError(format!(
                "plan file {:?} must be a relative path inside the run's tmp",
                f.path
            )));
        }
    }
    // A `profile` is checked by the sandbox (`sandbox::call::for_call`): it may only narrow the
    // session's.
    let summary = plan
        .summary
        .unwrap_or_else(|| plan.argv.join(" "))
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(160)
        .collect();
    Ok(ToolPlan {
        cwd: resolve_workdir(ctx.workspace, plan.cwd.as_deref())?,
        argv: plan.argv,
        env,
        summary,
        stdin: plan.stdin,
        files: plan.files,
        profile: plan.profile,
        bridge: plan.bridge,
        child_session: plan.child_session,
        service: plan.service,
    })
}

/// The tools of every loaded plugin, by name. Replaced as a whole on reload.
#[derive(Default)]
struct Catalog {
    plugins: Vec<Arc<LoadedPlugin>>,
    tools: BTreeMap<String, Tool>,
}

/// Where plugins come from.
#[derive(Debug, Clone)]
struct SourceDir {
    path: PathBuf,
    /// Only `libsidejob_plugin_*.so` (the directory of the `sidejob` binary holds other
    /// libraries too); otherwise every `*.so`.
    shipped_only: bool,
}

/// Every tool, by name; reloads itself when a plugin directory changes.
pub(crate) struct ToolHost {
    catalog: RwLock<Arc<Catalog>>,
    dirs: Vec<SourceDir>,
    copies_dir: PathBuf,
    /// The one-line reasons of the last (re)load's refusals.
    errors: Mutex<Vec<String>>,
    /// Serialises reloads (start-up and the watcher).
    reloading: Mutex<()>,
    watcher: Mutex<Option<crate::dirwatch::DirWatch>>,
    /// The binary plugins' schemas are checked in (`schema.rs`); in-process when `None`.
    schema_helper: Option<PathBuf>,
    /// Bumped whenever a reload changes the tools offered (names, schemas, descriptions), so
    /// listeners above (MCP's `tools/list_changed`) hear of it without polling.
    changed: tokio::sync::watch::Sender<u64>,
}

impl ToolHost {
    /// Loads the shipped plugins and those in `plugin_dirs`, and watches their directories.
    /// `schema_helper` is the `sidejob` binary to check their schemas in.
    pub(crate) fn start(cfg: &Config, schema_helper: Option<PathBuf>) -> Arc<ToolHost> {
        let mut dirs = Vec::new();
        if cfg.shipped_plugins {
            if let Some(exe_dir) = std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(Path::to_path_buf))
            {
                // An installed layout: <prefix>/bin/sidejob and <prefix>/lib/sidejob/plugins
                // (deploy/install.sh puts them there).
                if let Some(prefix) = exe_dir.parent() {
                    dirs.push(SourceDir {
                        path: prefix.join("lib/sidejob/plugins"),
                        shipped_only: false,
                    });
                }
                dirs.push(SourceDir {
                    path: exe_dir.clone(),
                    shipped_only: true,
                });
                // In a cargo target directory, `cargo test`/`nextest` leave the plugins they
                // build as dependencies in deps/ (only `cargo build` copies them up).
                dirs.push(SourceDir {
                    path: exe_dir.join("deps"),
                    shipped_only: true,
                });
            }
        }
        for d in &cfg.plugin_dirs {
            dirs.push(SourceDir {
                path: d.clone(),
                shipped_only: false,
            });
        }
        let host = Arc::new(ToolHost {
            catalog: RwLock::new(Arc::new(Catalog::default())),
            dirs,
            copies_dir: cfg.state_dir.join("plugins"),
            errors: Mutex::new(Vec::new()),
            reloading: Mutex::new(()),
            watcher: Mutex::new(None),
            schema_helper,
            changed: tokio::sync::watch::channel(0).0,
        });
        // Watch first, then load: a file added in between is then seen by both.
        let watched: Vec<(PathBuf, bool)> = host
            .dirs
            .iter()
            .filter(|d| d.path.is_dir())
            .map(|d| (d.path.clone(), d.shipped_only))
            .collect();
        match watch::start(Arc::downgrade(&host), &watched) {
            Ok(w) => *host.watcher.lock().unwrap_or_else(|e| e.into_inner()) = Some(w),
            Err(e) => warn!("plugin hot reload is off: cannot watch the plugin directories: {e}"),
        }
        host.reload();
        host
    }

    fn current(&self) -> Arc<Catalog> {
        self.catalog
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn list(&self) -> Vec<ToolInfo> {
        self.current()
            .tools
            .values()
            .map(|t| t.info.clone())
            .collect()
    }

    pub(crate) fn get(&self, name: &str) -> Option<Tool> {
        self.current().tools.get(name).cloned()
    }

    /// A receiver that sees a new value each time the offered tools change.
    pub(crate) fn watch_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The refusals of the last (re)load, one line each.
    pub(crate) fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The plugin files in the source directories, in load order, each with its directory
    /// opened and checked (or the reason it is refused, which then refuses each of its files).
    fn candidates(&self) -> Vec<Candidate> {
        let mut out = Vec::new();
        // A shipped plugin may be both next to the binary and in deps/ (cargo build copies it
        // up, cargo test does not): load the newer of the two, once. (The times only choose
        // which file to try; the one chosen is then opened and checked like any other.)
        let mut shipped: BTreeMap<OsString, (std::time::SystemTime, Candidate)> = BTreeMap::new();
        for dir in &self.dirs {
            let opened = TrustedDir::open(&dir.path);
            let names = match &opened {
                Ok(d) => d.names().unwrap_or_default(),
                Err(why) if why.is_missing() => continue,
                // Listed by path only to name each file the refusal applies to.
                Err(_) => std::fs::read_dir(&dir.path)
                    .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
                    .unwrap_or_default(),
            };
            // The path as checked (absolute, no `..`) when the directory opened: plugins are
            // matched to their previous load by it.
            let base = opened
                .as_ref()
                .map_or_else(|_| dir.path.clone(), |d| d.path().to_path_buf());
            let opened = Arc::new(opened);
            let mut files: Vec<Candidate> = names
                .into_iter()
                .map(|name| Candidate {
                    path: base.join(&name),
                    name,
                    dir: opened.clone(),
                })
                .filter(|c| is_candidate(&c.path, dir.shipped_only))
                .collect();
            files.sort_by(|a, b| a.name.cmp(&b.name));
            if dir.shipped_only {
                for f in files {
                    let Ok(modified) =
                        std::fs::symlink_metadata(&f.path).and_then(|m| m.modified())
                    else {
                        continue;
                    };
                    match shipped.get(&f.name) {
                        Some((newer, _)) if *newer >= modified => {}
                        _ => {
                            shipped.insert(f.name.clone(), (modified, f));
                        }
                    }
                }
                continue;
            }
            out.extend(files);
        }
        let mut first: Vec<Candidate> = shipped.into_values().map(|(_, c)| c).collect();
        first.append(&mut out);
        first
    }

    /// Holds off rescans until dropped, so none is under way (a schema check is a child
    /// process): the daemon holds it across an in-place re-exec (`server/upgrade/`), after
    /// which the new image would not know that child.
    pub(crate) fn hold_reloads(&self) -> std::sync::MutexGuard<'_, ()> {
        self.reloading.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rescans the plugin directories and swaps in the new catalog. Every file is opened and
    /// checked again on each scan, so one that became writable by others (or whose directory
    /// did) is unloaded. A file whose contents are unchanged keeps its loaded plugin; a changed
    /// file that fails to load for any other reason keeps the version loaded before (and the
    /// failure is logged).
    pub(crate) fn reload(&self) {
        let _serial = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current();
        let previous_errors = self.errors();
        let copies = self.open_copies();
        // Each failure's line, logged once the scan's result is in place (below).
        let mut errors: Vec<String> = Vec::new();
        let mut plugins: Vec<Arc<LoadedPlugin>> = Vec::new();
        for candidate in self.candidates() {
            let source = candidate.path.clone();
            let previous = old.plugins.iter().find(|p| p.source == source).cloned();
            let loaded = match candidate.read() {
                Ok(None) => continue,
                Ok(Some(src)) => match &previous {
                    Some(prev) if prev.sha256 == src.sha256 => {
                        plugins.push(prev.clone());
                        continue;
                    }
                    _ => copies
                        .as_ref()
                        .map_err(|why| LoadError::Io {
                            step: "copy",
                            path: source.clone(),
                            message: why.to_string(),
                        })
                        .and_then(|copies| {
                            loader::load(&src, copies, self.schema_helper.as_deref())
                        }),
                },
                Err(e) => Err(e),
            };
            match loaded {
                Ok(p) => {
                    info!(plugin = %p.info.name, version = %p.info.version, source = %source.display(), copy = %p.copy.display(),
                          tools = ?p.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                          "{} plugin", if previous.is_some() { "reloaded" } else { "loaded" });
                    plugins.push(Arc::new(p));
                }
                Err(e) => {
                    let refused = matches!(e, LoadError::Unsafe { .. });
                    errors.push(e.to_string());
                    // A file that anyone else could now write is not trusted any more; any
                    // other failure (a bad build, a copy that could not be written) keeps what
                    // worked.
                    match previous {
                        Some(prev) if !refused => {
                            warn!(source = %source.display(), "keeping the previously loaded version");
                            plugins.push(prev);
                        }
                        Some(prev) => {
                            warn!(plugin = %prev.info.name, source = %source.display(), "plugin unloaded: its file is no longer trusted");
                        }
                        None => {}
                    }
                }
            }
        }
        for gone in old
            .plugins
            .iter()
            .filter(|p| !plugins.iter().any(|n| n.source == p.source))
        {
            info!(plugin = %gone.info.name, source = %gone.source.display(), "plugin removed");
        }
        let mut tools: BTreeMap<String, Tool> = BTreeMap::new();
        for p in &plugins {
            for t in &p.tools {
                if let Some(first) = tools.get(&t.name) {
                    let e = LoadError::DuplicateTool {
                        tool: t.name.clone(),
                        first: first.plugin.source.clone(),
                        second: p.source.clone(),
                    };
                    errors.push(e.to_string());
                    continue;
                }
                tools.insert(
                    t.name.clone(),
                    Tool {
                        info: t.clone(),
                        plugin: p.clone(),
                    },
                );
            }
        }
        if tools.is_empty() {
            warn!(dirs = ?self.dirs.iter().map(|d| d.path.display().to_string()).collect::<Vec<_>>(),
                  "no tools are loaded: build the workspace (cargo build) or set plugin_dirs");
        }
        self.remove_stale_copies(&plugins);
        let differs = old.tools.len() != tools.len()
            || old
                .tools
                .iter()
                .zip(tools.iter())
                .any(|((a, ta), (b, tb))| a != b || ta.info != tb.info);
        *self.catalog.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(Catalog { plugins, tools });
        if differs {
            self.changed.send_modify(|generation| *generation += 1);
        }
        // Logged only now, so that whoever reads a failure in the log and then asks (tool.list's
        // plugin_errors) finds it there. A failure is a warning the first time, then quiet
        // while it stays the same.
        *self.errors.lock().unwrap_or_else(|e| e.into_inner()) = errors.clone();
        for line in &errors {
            if previous_errors.contains(line) {
                debug!("{line}");
            } else {
                warn!("{line}");
            }
        }
    }

    /// The directory of private copies, created if needed and checked like a plugin
    /// directory; `Err` is the one-line reason no plugin can be copied now.
    fn open_copies(&self) -> Result<TrustedDir, CopiesError> {
        let (Some(parent), Some(name)) = (
            self.copies_dir.parent(),
            self.copies_dir.file_name().and_then(|n| n.to_str()),
        ) else {
            return Err(CopiesError::NotADirectoryPath(self.copies_dir.clone()));
        };
        let (dir, reclaimed) =
            TrustedDir::open_private(parent, name, 0o700).map_err(|why| CopiesError::Refused {
                dir: self.copies_dir.clone(),
                why,
            })?;
        match reclaimed {
            sys::fs::Reclaimed::No => {}
            sys::fs::Reclaimed::Emptied { mode, removed } => warn!(
                dir = %self.copies_dir.display(),
                "the plugin copies directory was writable by others (mode {mode:o}, e.g. a \
                 Kubernetes fsGroup change): closed it and removed its {removed} entries, \
                 the plugins are copied again"
            ),
        }
        Ok(dir)
    }

    /// Deletes the private copies no loaded plugin uses any more, so `<state_dir>/plugins`
    /// does not grow with every reload, and the temporary files of copies that were cut short
    /// (a full disk, a crash). Reloads are serialised and the state directory belongs to this
    /// daemon alone (it holds its lock), so no copy is being written meanwhile. (Code already
    /// mapped stays mapped: unlinking a file does not unmap it.)
    fn remove_stale_copies(&self, plugins: &[Arc<LoadedPlugin>]) {
        let Ok(dir) = TrustedDir::open(&self.copies_dir) else {
            return;
        };
        for name in dir.names().unwrap_or_default() {
            let path = dir.path().join(&name);
            let stale = if sys::fs::is_temp_name(&name) {
                true
            } else {
                path.extension().is_some_and(|x| x == "so")
                    && !plugins.iter().any(|p| p.copy == path)
            };
            if stale {
                if let Err(err) = dir.remove(&name) {
                    warn!(copy = %path.display(), "cannot remove a stale plugin copy: {err}");
                }
            }
        }
    }
}

/// Why no plugin can be copied now: the directory of private copies is unusable.
#[derive(Debug, thiserror::Error)]
enum CopiesError {
    #[error("{} is not a directory path", .0.display())]
    NotADirectoryPath(PathBuf),
    #[error("the copies directory {}: {why}; {}", .dir.display(), .why.hint())]
    Refused { dir: PathBuf, why: Refusal },
}

/// A plugin file found in a source directory.
struct Candidate {
    name: OsString,
    path: PathBuf,
    /// Its directory, opened and checked, or why it is refused.
    dir: Arc<Result<TrustedDir, Refusal>>,
}

impl Candidate {
    /// Opens, checks and reads the file; `Ok(None)` when it is gone.
    fn read(&self) -> Result<Option<loader::Source>, LoadError> {
        match &*self.dir {
            Ok(dir) => loader::read_source(dir, &self.name),
            Err(why) => Err(LoadError::refused(&self.path, why)),
        }
    }
}

fn is_candidate(p: &Path, shipped_only: bool) -> bool {
    let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    name.ends_with(".so")
        && !name.starts_with('.')
        && (!shipped_only || name.starts_with(SHIPPED_PREFIX))
}

/// Resolves `workdir` (relative to the workspace, or absolute) and refuses anything that
/// lands outside the workspace once symlinks are followed.
pub(crate) fn resolve_workdir(
    workspace: &Path,
    workdir: Option<&str>,
) -> Result<PathBuf, PlanError> {
    let Some(dir) = workdir.filter(|d| !d.is_empty()) else {
        return Ok(workspace.to_path_buf());
    };
    let joined = workspace.join(dir);
    let real = joined
        .canonicalize()
        .map_err(|e| PlanError(format!("workdir {}: {e}", joined.display())))?;
    let root = workspace
        .canonicalize()
        .map_err(|e| PlanError(format!("workspace {}: {e}", workspace.display())))?;
    if !real.starts_with(&root) {
        return Err(PlanError(format!(
            "workdir {} is outside the workspace {}",
            real.display(),
            root.display()
        )));
    }
    if !real.is_dir() {
        return Err(PlanError(format!(
            "workdir {} is not a directory",
            real.display()
        )));
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn workdir_outside_the_workspace_is_refused() {
        let ws = std::env::temp_dir();
        let err = resolve_workdir(&ws, Some("../..")).unwrap_err();
        assert!(err.0.contains("outside the workspace"), "{err}");
        assert_eq!(resolve_workdir(&ws, None).unwrap(), ws);
    }

    #[test]
    fn only_shipped_names_count_next_to_the_binary() {
        assert!(is_candidate(
            Path::new("/x/libsidejob_plugin_bash.so"),
            true
        ));
        assert!(!is_candidate(
            Path::new("/x/libsidejob_testplugin_greet_v1.so"),
            true
        ));
        assert!(is_candidate(
            Path::new("/x/libsidejob_testplugin_greet_v1.so"),
            false
        ));
        assert!(!is_candidate(Path::new("/x/.tmp.so"), false));
        assert!(!is_candidate(Path::new("/x/readme.txt"), false));
    }
}

#[cfg(test)]
mod plan_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn check(plan: json::LaunchPlan) -> Result<ToolPlan, PlanError> {
        let ws = std::env::temp_dir();
        let ctx = PlanContext {
            workspace: &ws,
            session_id: "s",
            task_id: "t",
            session_dir: &ws,
            tmp_dir: &ws,
            profile: "workspace-write",
            depth: 0,
            config: &Value::Null,
        };
        check_plan(plan, &ctx)
    }

    #[test]
    fn plans_are_checked_before_they_run() {
        let ok = check(json::LaunchPlan {
            argv: vec!["true".into()],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(ok.summary, "true");
        assert_eq!(ok.cwd, std::env::temp_dir());
        assert!(check(json::LaunchPlan::default()).is_err(), "empty argv");
        let env = |k: &str| json::LaunchPlan {
            argv: vec!["true".into()],
            env: [(k.to_string(), "v".to_string())].into(),
            ..Default::default()
        };
        assert!(check(env("SIDEJOB_BRIDGE"))
            .unwrap_err()
            .0
            .contains("SIDEJOB_"));
        assert!(check(env("A=B")).is_err());
        assert!(check(env("FINE")).is_ok());
        for bad in ["../x", "/etc/passwd", "a/../../b", ""] {
            let p = json::LaunchPlan {
                argv: vec!["true".into()],
                files: vec![json::PlanFile {
                    path: bad.into(),
                    content: String::new(),
                    executable: false,
                }],
                ..Default::default()
            };
            assert!(check(p).is_err(), "{bad:?}");
        }
    }
}
