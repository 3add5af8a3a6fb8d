//! Plugins (docs/plugins.md): the shipped plugins load with no configuration; unsafe files, ABI
//! mismatches and duplicate tools are refused with one line each; a panicking plugin is an
//! error, not a dead daemon; hot reload swaps a plugin without touching running tasks.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use sidejob_tests::{sidejob_bin, wait_until, Client, Daemon, TempDir};

/// A plugin library built with the workspace (`lib<name>.so`, next to `sidejob` or in deps/).
pub(crate) fn built_plugin(name: &str) -> PathBuf {
    let bin = sidejob_bin();
    let dir = bin.parent().expect("target dir");
    let file = format!("lib{name}.so");
    // `cargo build` copies it next to the binary, `cargo test` leaves it in deps/: the newer.
    [dir.join(&file), dir.join("deps").join(&file)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| {
            panic!(
                "{file} is not built: run the tests through cargo (the tests crate depends on it)"
            )
        })
}

/// Installs a library into `dir` as `as_name` the way an operator should: a temporary name,
/// then a rename, so the watcher never sees half a file.
pub(crate) fn install(lib: &Path, dir: &Path, as_name: &str, mode: u32) -> PathBuf {
    let tmp = dir.join(format!(".{as_name}.tmp"));
    std::fs::copy(lib, &tmp).expect("copy plugin");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let dest = dir.join(as_name);
    std::fs::rename(&tmp, &dest).expect("install plugin");
    dest
}

/// A plugin directory (mode 0755) and a daemon that loads it.
pub(crate) fn daemon_with_plugin_dir(extra_toml: &str) -> (Daemon, TempDir) {
    let dir = TempDir::new("plugins");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let toml = format!(
        "plugin_dirs = [{:?}]\n{extra_toml}",
        dir.path().display().to_string()
    );
    (Daemon::start_with_config(&toml), dir)
}

pub(crate) fn tool_names(c: &mut Client) -> Vec<String> {
    c.ok("tool.list", json!({}))["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn the_shipped_plugins_load_with_no_configuration() {
    let d = Daemon::start();
    let mut c = d.client();
    let tools = c.ok("tool.list", json!({}));
    let names = tool_names(&mut c);
    for t in ["bash", "code", "subagent"] {
        assert!(names.contains(&t.to_string()), "{t} missing from {tools}");
    }
    let bash = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "bash")
        .unwrap()
        .clone();
    assert_eq!(bash["input_schema"]["required"], json!(["command"]));
    assert_eq!(bash["supports_background"], true);
    assert_eq!(bash["default_yield_after_ms"], 30_000);
    // Loaded from a private copy named by its hash.
    let copies: Vec<String> = std::fs::read_dir(d.state_dir.join("plugins"))
        .expect("copies dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        copies
            .iter()
            .any(|n| n.starts_with("libsidejob_plugin_bash-")
                && n.len() == "libsidejob_plugin_bash-".len() + 64 + 3),
        "{copies:?}"
    );
    // No test plugin is picked up from the build directory.
    assert!(
        !names.iter().any(|n| n == "panicky" || n == "greet"),
        "{names:?}"
    );
}

#[test]
fn a_panicking_plugin_is_an_error_and_the_daemon_lives() {
    let (d, dir) = daemon_with_plugin_dir("");
    install(
        &built_plugin("sidejob_testplugin_panicky"),
        dir.path(),
        "panicky.so",
        0o644,
    );
    let mut c = d.client();
    assert!(
        wait_until(Duration::from_secs(30), || tool_names(&mut c)
            .contains(&"panicky".into())),
        "{}",
        d.log()
    );
    let s = d.open_session(&mut c);
    let e = c
        .call(
            "tool.call",
            json!({"session_id": s, "tool": "panicky", "args": {}}),
        )
        .expect_err("a panicking plan is an error");
    assert_eq!(e["data"]["kind"], "invalid_params", "{e}");
    let msg = e["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("panicked in plan") && msg.contains("deliberate panic"),
        "{e}"
    );
    // The daemon carries on.
    let r = c.bash(&s, "echo still here", json!({}));
    assert_eq!(r["output"], "still here\n", "{r}");
}

#[test]
fn unsafe_plugin_files_and_directories_are_refused_with_one_line() {
    let (d, dir) = daemon_with_plugin_dir("");
    let greet = built_plugin("sidejob_testplugin_greet_v1");
    let world = install(&greet, dir.path(), "world-writable.so", 0o666);
    let group = install(&greet, dir.path(), "group-writable.so", 0o664);
    let foreign = install(&greet, dir.path(), "foreign.so", 0o644);
    std::os::unix::fs::chown(&foreign, Some(12345), None).expect("chown");
    let mut c = d.client();
    // The three files change the directory: wait until the reload has judged them.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let log = d.log();
            log.contains("foreign.so")
                && log.contains("world-writable.so")
                && log.contains("group-writable.so")
        }),
        "{}",
        d.log()
    );
    assert!(!tool_names(&mut c).contains(&"greet".into()));
    let log = d.log();
    let line = |needle: &str| {
        log.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no log line for {needle}:\n{log}"))
            .to_owned()
    };
    assert!(
        line(&world.display().to_string()).contains("refusing plugin")
            && line(&world.display().to_string()).contains("world-writable")
    );
    assert!(line(&group.display().to_string()).contains("group-writable"));
    assert!(line(&foreign.display().to_string()).contains("owned by uid 12345"));

    // A group-writable plugin directory is refused as a whole.
    let (d2, dir2) = daemon_with_plugin_dir("");
    install(&greet, dir2.path(), "greet.so", 0o644);
    std::fs::set_permissions(dir2.path(), std::fs::Permissions::from_mode(0o775)).expect("chmod");
    let mut c2 = d2.client();
    // Touch the directory so the watcher rescans it.
    install(&greet, dir2.path(), "greet2.so", 0o644);
    assert!(
        wait_until(Duration::from_secs(30), || d2
            .log()
            .contains("its directory is group-writable")),
        "{}",
        d2.log()
    );
    assert!(!tool_names(&mut c2).contains(&"greet".into()));
}

#[test]
fn an_abi_mismatch_is_one_line_naming_what_was_expected_and_found() {
    let (d, dir) = daemon_with_plugin_dir("");
    let path = install(
        &built_plugin("sidejob_testplugin_wrong_contract"),
        dir.path(),
        "wrong.so",
        0o644,
    );
    assert!(
        wait_until(Duration::from_secs(30), || d.log().contains("ABI mismatch")),
        "{}",
        d.log()
    );
    let log = d.log();
    let line = log.lines().find(|l| l.contains("ABI mismatch")).unwrap();
    assert!(line.contains(&path.display().to_string()), "{line}");
    // Hosts see the same line in tool.list.
    let mut c = d.client();
    let listed = c.ok("tool.list", json!({}));
    assert!(
        listed["plugin_errors"].as_array().is_some_and(|e| e
            .iter()
            .any(|l| l.as_str() == line.split("plugin_host: ").nth(1))),
        "{listed}"
    );
    assert!(
        line.contains("expected plugin contract version 1")
            && line.contains("found contract version 99"),
        "{line}"
    );
    // Not a sidejob plugin at all: one line too.
    std::fs::write(dir.path().join(".junk"), b"not an elf").unwrap();
    install(&dir.path().join(".junk"), dir.path(), "junk.so", 0o644);
    assert!(
        wait_until(Duration::from_secs(30), || d
            .log()
            .lines()
            .any(|l| l.contains("junk.so"))),
        "{}",
        d.log()
    );
    let mut c = d.client();
    assert!(tool_names(&mut c).contains(&"bash".into()));
}

#[test]
fn two_plugins_offering_the_same_tool_is_an_error_naming_both_files() {
    let (d, dir) = daemon_with_plugin_dir("");
    let a = install(
        &built_plugin("sidejob_testplugin_greet_v1"),
        dir.path(),
        "a-greet.so",
        0o644,
    );
    let b = install(
        &built_plugin("sidejob_testplugin_greet_v2"),
        dir.path(),
        "b-greet.so",
        0o644,
    );
    assert!(
        wait_until(Duration::from_secs(30), || d
            .log()
            .contains("is offered by both")),
        "{}",
        d.log()
    );
    let log = d.log();
    let line = log
        .lines()
        .find(|l| l.contains("is offered by both"))
        .unwrap();
    assert!(
        line.contains(&a.display().to_string()) && line.contains(&b.display().to_string()),
        "{line}"
    );
    // The first one (in name order) keeps the tool.
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "greet", "args": {}}),
    );
    assert_eq!(r["output"], "greet v1\n", "{r}");
}

#[test]
fn hot_reload_swaps_a_plugin_without_touching_a_running_task() {
    let (d, dir) = daemon_with_plugin_dir("");
    install(
        &built_plugin("sidejob_testplugin_greet_v1"),
        dir.path(),
        "greet.so",
        0o644,
    );
    let mut c = d.client();
    assert!(
        wait_until(Duration::from_secs(30), || tool_names(&mut c)
            .contains(&"greet".into())),
        "{}",
        d.log()
    );
    let s = d.open_session(&mut c);
    // A background task planned by v1, held running across the swap: its `sleep` has a
    // duration unique to this test, and ends only when the test kills it (then v1's plan
    // goes on to print its greeting).
    let sleep_ms = 3_600_000 + u64::from(std::process::id() % 1000);
    let sleep_cmd = format!("sleep {}", sleep_ms as f64 / 1000.0);
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "greet", "args": {"sleep_ms": sleep_ms}, "background": true}),
    );
    assert_eq!(r["status"], "running", "{r}");
    let old = r["task_id"].as_str().unwrap().to_owned();
    let v1_copies = greet_copies(&d);
    assert_eq!(v1_copies.len(), 1, "{v1_copies:?}");
    // … then v2 replaces the file.
    install(
        &built_plugin("sidejob_testplugin_greet_v2"),
        dir.path(),
        "greet.so",
        0o644,
    );
    assert!(
        wait_until(Duration::from_secs(30), || {
            c.ok("tool.list", json!({}))["tools"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| {
                    t["name"] == "greet" && t["description"].as_str().unwrap_or("").contains("v2")
                })
        }),
        "{}",
        d.log()
    );
    // New calls use v2.
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "greet", "args": {}}),
    );
    assert_eq!(r["output"], "greet v2\n", "{r}");
    // The v1 task was running all along; released now, it still settles, and its result is
    // delivered.
    assert_eq!(c.task(&old)["state"], "running");
    let sleeps = sidejob_tests::pids_running(&sleep_cmd);
    assert_eq!(sleeps.len(), 1, "{sleep_cmd}: {sleeps:?}");
    let t = c.wait_then(&d, &old, || sidejob_tests::signal(sleeps[0], libc::SIGTERM));
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(t["delivery"], "wait", "{t}");
    // (The shell reports the killed sleep first.)
    let out = c.output(&old);
    assert!(out.ends_with("greet v1\n"), "{out:?}");
    // v2 runs from its own copy; v1's copy, no longer used, is gone.
    let copies = greet_copies(&d);
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_ne!(copies, v1_copies, "{copies:?}");
}

fn greet_copies(d: &Daemon) -> Vec<String> {
    std::fs::read_dir(d.state_dir.join("plugins"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("greet-"))
        .collect()
}

#[test]
fn a_plugin_gets_fixed_stdin_and_files_from_its_plan() {
    let (d, dir) = daemon_with_plugin_dir("");
    install(
        &built_plugin("sidejob_testplugin_greet_v1"),
        dir.path(),
        "greet.so",
        0o644,
    );
    let mut c = d.client();
    assert!(
        wait_until(Duration::from_secs(30), || tool_names(&mut c)
            .contains(&"greet".into())),
        "{}",
        d.log()
    );
    let s = d.open_session(&mut c);
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "greet", "args": {"stdin": "fed by the plan\n"}}),
    );
    assert_eq!(r["output"], "fed by the plan\n", "{r}");
    // A file the plan places in the run's tmp is in the run's view, where the plan says.
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "greet", "args": {"file": "placed by the plan\n"}}),
    );
    assert_eq!(r["output"], "placed by the plan\n", "{r}");
}

/// Builds `plugins/template` the way a third party builds a plugin: its own Cargo project
/// outside the workspace, depending on the plugin API at `api` by path, offline, under the
/// package name `package`. Its target directory lives under the shared target/ so later runs
/// (and the other build) reuse the dependencies.
fn build_template(api: &Path, package: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let project = TempDir::new("template");
    let manifest = std::fs::read_to_string(root.join("plugins/template/Cargo.toml"))
        .expect("template manifest")
        .replace(
            "path = \"../../plugin-api\"",
            &format!("path = {:?}", api.display().to_string()),
        )
        .replace("name = \"hello-plugin\"", &format!("name = {package:?}"));
    std::fs::write(project.path().join("Cargo.toml"), manifest).unwrap();
    std::fs::create_dir_all(project.path().join("src")).unwrap();
    std::fs::copy(
        root.join("plugins/template/src/lib.rs"),
        project.path().join("src/lib.rs"),
    )
    .unwrap();
    let target = sidejob_bin()
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("plugin-template");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["build", "--offline", "--manifest-path"])
        .arg(project.path().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo build of the template failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join(format!("debug/lib{}.so", package.replace('-', "_")))
}

#[test]
fn a_plugin_built_outside_the_workspace_loads_into_a_running_daemon() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let lib = build_template(&root.join("plugin-api"), "hello-plugin");

    // Hot-load it into a daemon that is already running.
    let (d, dir) = daemon_with_plugin_dir("");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    assert!(!tool_names(&mut c).contains(&"hello".into()));
    install(&lib, dir.path(), "hello.so", 0o644);
    assert!(
        wait_until(Duration::from_secs(30), || tool_names(&mut c)
            .contains(&"hello".into())),
        "{}",
        d.log()
    );
    let r = c.ok(
        "tool.call",
        json!({"session_id": s, "tool": "hello", "args": {"name": "sidejob"}}),
    );
    assert_eq!(r["output"], "Hello, sidejob!\n", "{r}");
    assert_eq!(r["rendered"], "Hello, sidejob! (succeeded)", "{r}");
}

/// A plugin built against another major version of the plugin API: abi_stable refuses it, and
/// the daemon says so in one line naming both versions.
#[test]
fn a_plugin_built_against_another_major_version_is_refused_naming_both_versions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    // plugin-api as it would be at 2.0.0, as a crate of its own.
    let api2 = TempDir::new("plugin-api-2");
    let manifest = std::fs::read_to_string(root.join("plugin-api/Cargo.toml"))
        .unwrap()
        .replace("version = \"1.0.0\"", "version = \"2.0.0\"")
        .replace("edition.workspace = true", "edition = \"2021\"")
        .replace("license.workspace = true", "license = \"Apache-2.0\"")
        .replace("rust-version.workspace = true", "")
        .replace("[lints]\nworkspace = true\n", "")
        .replace(
            "abi_stable.workspace = true",
            "abi_stable = { version = \"0.11\", default-features = false }",
        )
        .replace(
            "serde.workspace = true",
            "serde = { version = \"1\", features = [\"derive\"] }",
        )
        .replace("serde_json.workspace = true", "serde_json = \"1\"");
    std::fs::write(api2.path().join("Cargo.toml"), manifest).unwrap();
    std::fs::create_dir_all(api2.path().join("src")).unwrap();
    for f in ["lib.rs", "json.rs", "sdk.rs"] {
        std::fs::copy(
            root.join("plugin-api/src").join(f),
            api2.path().join("src").join(f),
        )
        .unwrap();
    }
    let lib = build_template(api2.path(), "hello-plugin-api2");

    let (d, dir) = daemon_with_plugin_dir("");
    let path = install(&lib, dir.path(), "hello2.so", 0o644);
    assert!(
        wait_until(Duration::from_secs(30), || d.log().contains("hello2.so")),
        "{}",
        d.log()
    );
    let log = d.log();
    let line = log.lines().find(|l| l.contains("hello2.so")).unwrap();
    assert!(line.contains(&path.display().to_string()), "{line}");
    assert!(
        line.contains("ABI mismatch") && line.contains("1.0.0") && line.contains("2.0.0"),
        "{line}"
    );
    let mut c = d.client();
    assert!(!tool_names(&mut c).contains(&"hello".into()));
}
