//! Sandbox profiles on disk: edits apply without a restart, and an edit that does not validate
//! keeps the previous version in force and says why.

use std::time::Duration;

use serde_json::json;
use sidejob_tests::{wait_until, Daemon, TempDir};

fn profile_text(mark: &str) -> String {
    let shipped = include_str!("../../../sandbox-profiles/workspace-write.toml");
    assert!(shipped.contains("[env.set]\n"));
    shipped.replace("[env.set]\n", &format!("[env.set]\nMARK = \"{mark}\"\n"))
}

#[test]
fn a_profile_edit_applies_without_a_restart_and_a_broken_one_keeps_the_previous() {
    let dir = TempDir::new("profiles");
    std::fs::write(dir.path().join("mine.toml"), profile_text("v1")).unwrap();
    let d = Daemon::start_with_config(&format!("profiles_dir = \"{}\"\n", dir.path().display()));
    let mut c = d.client();
    let s = c.ok(
        "session.open",
        json!({"workspace": d.workspace, "profile": "mine"}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mark = |c: &mut sidejob_tests::Client| {
        c.bash(&s, "echo $MARK", json!({}))["output"]
            .as_str()
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(mark(&mut c), "v1");

    // A broken edit: reported by the watch, and the previous version stays in force.
    std::fs::write(dir.path().join("mine.toml"), "[limits]\npids = -1\n").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || d
            .log()
            .contains("keeping the previous version")),
        "the broken edit was not reported:\n{}",
        d.log()
    );
    assert!(
        d.log().contains("mine.toml:2: limits.pids"),
        "the report names file, line and field"
    );
    assert_eq!(mark(&mut c), "v1");

    // A good edit takes effect for the next run.
    std::fs::write(dir.path().join("mine.toml"), profile_text("v2")).unwrap();
    assert_eq!(mark(&mut c), "v2");
}
