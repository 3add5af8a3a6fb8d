//! Issue 32, items 3 and 9: a profile's persistent cache is kept per owner, profile and
//! workspace, so what a run in one workspace leaves there (a tool's configuration, which the
//! tool runs) never reaches a run in another; and `sidejob cache clear` removes a cache however
//! deep it is, with a few descriptors, without following its links, and every cache after it.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;
use sidejob_tests::sidejob_bin;

use super::{daemon_with_profiles, mode_uid, nobody, present, NobodyDir, NOBODY};
use crate::toolchains::{cache_list, cache_path};

/// A profile that keeps one cache, `name`, at `/cache/<name>`.
fn keeping(name: &str) -> String {
    format!("extends = \"workspace-write\"\n[caches]\n{name} = \"/cache/{name}\"\n")
}

/// A stand-in for a build tool that reads its configuration from its cache (as `cargo` reads
/// `$CARGO_HOME/config.toml`, which can name a program to run): it sources
/// `/cache/tool/config.sh` when there is one.
const TOOL: &str = "if [ -f /cache/tool/config.sh ]; then . /cache/tool/config.sh; fi\necho \"tool ran in $PWD\"\n";

fn with_tool(tag: &str) -> NobodyDir {
    let ws = NobodyDir::new(tag);
    std::fs::write(ws.join("tool.sh"), TOOL).expect("tool.sh");
    ws
}

#[test]
fn attack_configuration_planted_in_a_cache_runs_in_no_other_workspace() {
    let Some((d, _profiles)) = daemon_with_profiles(&[("keeper", &keeping("tool"))]) else {
        return;
    };
    let mut n = nobody(&d);
    let (a, b) = (with_tool("ws-a"), with_tool("ws-b"));
    let open = |n: &mut sidejob_tests::Client, ws: &NobodyDir| {
        n.ok(
            "session.open",
            json!({"workspace": ws.path(), "profile": "keeper"}),
        )["session_id"]
            .as_str()
            .expect("session_id")
            .to_owned()
    };
    let (sa, sb) = (open(&mut n, &a), open(&mut n, &b));
    let tool_in = |ws: &NobodyDir| format!("cd {} && sh tool.sh", ws.path().display());

    // Workspace A (a hostile checkout) plants configuration the tool will run.
    let planted = "echo PLANTED-FROM-A; touch \"$PWD/pwned\"";
    let plant = n.bash(
        &sa,
        &format!(
            "printf '%s\\n' '{planted}' > /cache/tool/config.sh && {}",
            tool_in(&a)
        ),
        json!({}),
    );
    assert_eq!(plant["state"], "succeeded", "{plant}");
    // Positive control: the same workspace keeps its cache, configuration and all.
    let again = n.bash(&sa, &tool_in(&a), json!({}));
    assert_eq!(again["state"], "succeeded", "{again}");
    assert!(
        again["output"]
            .as_str()
            .is_some_and(|o| o.contains("PLANTED-FROM-A")),
        "{again}"
    );
    assert_eq!(mode_uid(&a.join("pwned")).1, NOBODY);

    // A cache of the older layout (kept per owner and profile only) holding the same file,
    // as a daemon before this change would have left it: never used again.
    let legacy = d
        .state_dir
        .join(format!("caches/{NOBODY}/keeper/tool/config.sh"));
    if !present(&legacy) {
        std::fs::create_dir_all(legacy.parent().expect("parent")).expect("legacy cache");
        std::fs::write(&legacy, format!("{planted}\n")).expect("legacy config");
    }

    // Workspace B, same user, same profile: the tool runs without A's configuration.
    let other = n.bash(
        &sb,
        &format!("{}; ls -A /cache/tool | wc -l", tool_in(&b)),
        json!({}),
    );
    assert_eq!(other["state"], "succeeded", "{other}");
    let out = other["output"].as_str().unwrap_or("");
    assert!(
        !out.contains("PLANTED"),
        "A's configuration ran in B: {out}"
    );
    assert!(out.ends_with("0\n"), "B's cache is not empty: {out}");
    // On the host: nothing was done in B, and the two workspaces' caches are apart.
    assert!(
        !present(&b.join("pwned")),
        "A's configuration touched B's workspace"
    );
    let (in_a, in_b) = (
        cache_path(&d.state_dir, "keeper", a.path(), "tool"),
        cache_path(&d.state_dir, "keeper", b.path(), "tool"),
    );
    assert_ne!(in_a, in_b);
    assert!(in_a.join("config.sh").is_file() && !present(&in_b.join("config.sh")));
    // The old one is listed (with no workspace) so that it can be cleared.
    assert!(
        cache_list(&d.state_dir)
            .iter()
            .any(|c| c["workspace"].is_null() && c["name"] == "tool"),
        "{:?}",
        cache_list(&d.state_dir)
    );
}

/// `sidejob cache clear` over `state`, as root, with a soft descriptor limit of 1024.
fn clear_under_1024_descriptors(state: &Path) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg("ulimit -Sn 1024 && exec \"$0\" cache clear --state-dir \"$1\"")
        .arg(sidejob_bin())
        .arg(state)
        .stdin(Stdio::null())
        .output()
        .expect("sidejob cache clear")
}

#[test]
fn attack_a_cache_1200_directories_deep_is_cleared_and_so_is_every_cache_after_it() {
    // Caches are listed (and cleared) by profile: the deep one comes first.
    let Some((d, _profiles)) =
        daemon_with_profiles(&[("a-deep", &keeping("deep")), ("b-small", &keeping("small"))])
    else {
        return;
    };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    // Something on the host a link in the cache points to: clearing must not follow it.
    let keep = sidejob_tests::TempDir::new("keep");
    std::fs::write(keep.path().join("file"), "kept").expect("keep");
    let open = |n: &mut sidejob_tests::Client, profile: &str| {
        n.ok(
            "session.open",
            json!({"workspace": ws.path(), "profile": profile}),
        )["session_id"]
            .as_str()
            .expect("session_id")
            .to_owned()
    };
    let (deep, small) = (open(&mut n, "a-deep"), open(&mut n, "b-small"));
    let made = n.bash(
        &deep,
        &format!(
            "cd /cache/deep && ln -s {keep} top-link && p=d && i=1 && \
             while [ $i -lt 1200 ]; do p=$p/d; i=$((i+1)); done && mkdir -p $p && cd $p && \
             ln -s {keep} link && ln -s {keep}/file file-link && echo deep > f && echo made",
            keep = keep.path().display()
        ),
        json!({}),
    );
    assert_eq!(made["state"], "succeeded", "{made}");
    let wrote = n.bash(&small, "echo small > /cache/small/f", json!({}));
    assert_eq!(wrote["state"], "succeeded", "{wrote}");
    let deep_cache = cache_path(&d.state_dir, "a-deep", ws.path(), "deep");
    let small_cache = cache_path(&d.state_dir, "b-small", ws.path(), "small");
    assert!(deep_cache.join("d/d/d").is_dir() && small_cache.join("f").is_file());

    let out = clear_under_1024_descriptors(&d.state_dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each cache is reported, and on disk both are gone; what the links named is not.
    for c in [&deep_cache, &small_cache] {
        assert!(
            stdout.contains(&format!("removed {}", c.display())),
            "{stdout}"
        );
        assert!(!present(c), "{} is still there", c.display());
    }
    assert_eq!(
        std::fs::read_to_string(keep.path().join("file")).expect("kept"),
        "kept"
    );
    assert!(cache_list(&d.state_dir).is_empty());
    // Positive control: the profile's next run starts with an empty cache of its own again.
    let fresh = n.bash(&small, "ls -A /cache/small | wc -l", json!({}));
    assert_eq!(fresh["output"], "0\n", "{fresh}");
}
