//! Class 1 of issue 8: paths a caller names are used with the caller's authority. A
//! `session_dir` of theirs is checked as them (no root-made directory in /etc), and every
//! file the daemon or a supervisor makes or reads in a run directory goes through a
//! descriptor without following symlinks, so a run directory swapped under a live run
//! leads root nowhere.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::json;

use super::{
    as_nobody, daemon, mode_uid, nobody, present, refused, set_mode, start_gated, unique,
    NobodyDir, NOBODY,
};

#[test]
fn attack_session_dir_in_etc_is_refused_and_nothing_is_made_there() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let target = Path::new("/etc").join(unique("session-dir"));
    assert!(!present(&target));

    refused(
        &mut n,
        "session.open",
        json!({"workspace": ws.path(), "session_dir": target}),
        "permission_denied",
    );
    let made = present(&target);
    let _ = std::fs::remove_dir_all(&target);
    assert!(!made, "root made {} for uid {NOBODY}", target.display());

    // Positive control: a directory of their own, made for them, as them.
    let home = NobodyDir::new("home");
    let sd = home.join("sessions-here");
    let r = n.ok(
        "session.open",
        json!({"workspace": ws.path(), "session_dir": sd}),
    );
    assert_eq!(r["session_dir"], sd.display().to_string(), "{r}");
    assert_eq!(mode_uid(&sd), (0o700, NOBODY));
    assert_eq!(mode_uid(&sd.join(".background")), (0o700, NOBODY));
}

#[test]
fn attack_session_dir_relative_dotdot_in_workspace_or_state_is_refused() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let home = NobodyDir::new("home");
    let dotdot = format!("{}/x/../sd", home.path().display());
    let in_ws = ws.join("sd");
    let in_state = d.state_dir.join("sessions").join(unique("sd"));
    let cases = [
        ("relative", json!("relative/sd")),
        ("with ..", json!(dotdot)),
        ("with .", json!(format!("{}/./sd", home.path().display()))),
        ("inside the workspace", json!(in_ws)),
        ("inside the state dir", json!(in_state)),
        ("the state dir", json!(d.state_dir)),
    ];
    for (what, sd) in cases {
        let e = refused(
            &mut n,
            "session.open",
            json!({"workspace": ws.path(), "session_dir": sd}),
            "invalid_params",
        );
        eprintln!("{what}: {}", e["message"]);
    }
    // Root is held to the same rules (the daemon's own directories above all).
    let mut c = d.client();
    for sd in [json!(d.state_dir.join("mine")), json!(d.state_dir)] {
        refused(
            &mut c,
            "session.open",
            json!({"workspace": d.workspace, "session_dir": sd}),
            "invalid_params",
        );
    }
    assert!(
        !present(&in_ws),
        "a refused session_dir was made in the workspace"
    );
    assert!(
        !present(&in_state),
        "a refused session_dir was made in the state dir"
    );
    assert!(!present(&home.join("sd")) && !present(&home.join("x")));
}

/// The swap: uid 65534 renames its live run's directory away and plants one whose
/// `output.log` and `result.json` are symlinks to /etc/shadow and a new file in /etc.
#[test]
fn attack_swapped_run_directory_leads_root_nowhere() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let home = NobodyDir::new("home");
    let sd = home.join("sd");
    n.ok(
        "session.open",
        json!({"session_id": "swap", "workspace": ws.path(), "session_dir": sd}),
    );
    let shadow = Path::new("/etc/shadow");
    let shadow_before = (std::fs::read(shadow).expect("read shadow"), stat(shadow));
    let planted_result = Path::new("/etc").join(unique("result"));

    let (id, gate) = start_gated(&mut n, "swap", ws.path(), "echo real-output", json!({}));
    let bg = sd.join(".background");
    as_nobody(&format!(
        "cd {bg} && mv {id} moved && mkdir {id} && ln -s /etc/shadow {id}/output.log \
         && ln -s {planted} {id}/result.json",
        bg = bg.display(),
        planted = planted_result.display()
    ));
    gate.open();
    let t = n.wait_settled(&id);
    let output = n.output(&id);
    let root_reads = d.client().output(&id);

    let made = present(&planted_result);
    let _ = std::fs::remove_file(&planted_result);
    assert!(
        !made,
        "root created {} through the planted result.json",
        planted_result.display()
    );
    assert_eq!(
        (std::fs::read(shadow).expect("read shadow"), stat(shadow)),
        shadow_before,
        "/etc/shadow changed"
    );
    let secret = first_line(&shadow_before.0);
    assert!(
        !secret.is_empty(),
        "/etc/shadow is empty: nothing to look for"
    );
    for (who, out) in [("uid 65534", &output), ("root", &root_reads)] {
        assert!(
            !out.contains(&secret),
            "task.output as {who} returned /etc/shadow: {out:?}"
        );
    }
    // The run itself went on, through the directory the daemon made: its result is where
    // the run directory was moved to, the owner's file, and the daemon settled from it.
    assert_eq!(t["state"], "succeeded", "{t}");
    let moved = bg.join("moved");
    assert_eq!(mode_uid(&moved.join("result.json")), (0o600, NOBODY));
    assert_eq!(mode_uid(&moved.join("output.log")), (0o600, NOBODY));
    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(moved.join("result.json")).expect("result"))
            .expect("result.json");
    assert_eq!(result["task_id"], id.as_str(), "{result}");
    assert_eq!(
        std::fs::read_to_string(moved.join("output.log")).expect("output"),
        "real-output\n"
    );
}

/// `.background` itself swapped for a symlink to a directory root may write and the
/// session's owner may not: no run directory, output or result is made there.
#[test]
fn attack_background_symlink_is_not_followed() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let home = NobodyDir::new("home");
    let sd = home.join("sd");
    n.ok(
        "session.open",
        json!({"session_id": "bg-link", "workspace": ws.path(), "session_dir": sd}),
    );
    // Positive control: a run before the swap works.
    let r = n.bash("bg-link", "echo before", json!({}));
    assert_eq!(r["state"], "succeeded", "{r}");

    let host = sidejob_tests::TempDir::new("host-dir"); // root's, 0755: a stand-in for /etc
    set_mode(host.path(), 0o755);
    as_nobody(&format!(
        "cd {sd} && mv .background bg-old && ln -s {host} .background",
        sd = sd.display(),
        host = host.path().display()
    ));
    let after = n.call(
        "tool.call",
        json!({"session_id": "bg-link", "tool": "bash", "args": {"command": "echo after"}}),
    );
    let entries: Vec<_> = std::fs::read_dir(host.path())
        .expect("read host dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        entries.is_empty(),
        "root wrote through the planted .background symlink: {entries:?} (call: {after:?})"
    );
    match after {
        Err(e) => eprintln!("refused as expected: {e}"),
        Ok(r) => assert_ne!(r["state"], "succeeded", "the run went ahead: {r}"),
    }
}

fn stat(p: &Path) -> (u64, i64, i64, u32, u32) {
    let m = std::fs::symlink_metadata(p).expect("stat");
    (m.len(), m.mtime(), m.mtime_nsec(), m.mode(), m.uid())
}

/// The first line of a file (root's entry, for /etc/shadow): what a leak would show.
fn first_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}
