//! Class 1 of issue 8: paths a caller names are used with the caller's authority. A
//! `session_dir` of theirs is checked as them (no root-made directory in /etc), and every
//! file the daemon or a supervisor makes or reads in a run directory goes through a
//! descriptor without following symlinks, so a run directory swapped under a live run
//! leads root nowhere.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use serde_json::json;

use super::{
    as_nobody, daemon, mode_uid, nobody, open_with_own_session_dir, present, refused, set_mode,
    start_gated, unique, NobodyDir, NOBODY,
};

#[test]
fn attack_session_dir_in_etc_is_refused_and_nothing_is_made_there() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let target = Removed(Path::new("/etc").join(unique("session-dir")));
    assert!(!present(&target.0));

    refused(
        &mut n,
        "session.open",
        json!({"workspace": ws.path(), "session_dir": target.0}),
        "permission_denied",
    );
    assert!(
        !present(&target.0),
        "root made {} for uid {NOBODY}",
        target.0.display()
    );

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
    swap_attack(|sd, id, planted| {
        format!(
            "cd {sd}/.background && mv {id} moved && mkdir {id} \
             && ln -s /etc/shadow {id}/output.log && ln -s {planted} {id}/result.json",
            sd = sd.display(),
            planted = planted.display(),
        )
    });
}

/// The same swap one level up: the whole session directory is renamed away and a new one
/// planted, `.background` and all (uid 65534 owns the directory holding it).
#[test]
fn attack_swapped_session_directory_leads_root_nowhere() {
    swap_attack(|sd, id, planted| {
        format!(
            "mv {sd} {sd}.moved && mkdir -p {sd}/.background/{id} \
             && ln -s /etc/shadow {sd}/.background/{id}/output.log \
             && ln -s {planted} {sd}/.background/{id}/result.json \
             && ln -s {sd}.moved/.background/{id} {sd}/.background/moved",
            sd = sd.display(),
            planted = planted.display(),
        )
    });
}

/// Runs a gated command in a session of uid 65534 with its own session directory; while
/// it waits, does the swap `swap(session_dir, task_id, planted_result)` gives as uid
/// 65534; then checks the host. The real run directory must end up at
/// `<session_dir>/.background/moved`.
fn swap_attack(swap: impl Fn(&Path, &str, &Path) -> String) {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let (ws, _home, sd) = open_with_own_session_dir(&mut n, "swap");
    let shadow = Path::new("/etc/shadow");
    let shadow_before = (std::fs::read(shadow).expect("read shadow"), stat(shadow));
    let secret = first_line(&shadow_before.0);
    assert!(
        !secret.is_empty(),
        "/etc/shadow is empty: nothing to look for"
    );
    let planted_result = Removed(Path::new("/etc").join(unique("result")));

    let (id, gate) = start_gated(&mut n, "swap", ws.path(), "echo real-output", json!({}));
    as_nobody(&swap(&sd, &id, &planted_result.0));
    gate.open();
    let t = n.wait_settled(&id);
    let output = n.output(&id);
    let root_reads = d.client().output(&id);

    assert!(
        !present(&planted_result.0),
        "root created {} through the planted result.json",
        planted_result.0.display()
    );
    assert_eq!(
        (std::fs::read(shadow).expect("read shadow"), stat(shadow)),
        shadow_before,
        "/etc/shadow changed"
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
    let moved = sd.join(".background/moved");
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

/// A path in a shared place (/etc) that an attack may make: removed when the test ends,
/// whatever happened.
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `.background` itself a symlink to a directory root may write and the session's owner
/// may not: no run directory, output or result is made there.
#[test]
fn attack_background_symlink_is_not_followed() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let (_ws, _home, sd) = open_with_own_session_dir(&mut n, "bg-link");
    // Positive control: a run before the swap works.
    let r = n.bash("bg-link", "echo before", json!({}));
    assert_eq!(r["state"], "succeeded", "{r}");

    let host = sidejob_tests::TempDir::new("host-dir"); // root's, 0755: a stand-in for /etc
    set_mode(host.path(), 0o755);
    // They own the directory holding the session directory: whoever owns `.background`,
    // they can put a new session directory in its place whose `.background` is a symlink.
    as_nobody(&format!(
        "mv {sd} {sd}.old && mkdir {sd} && ln -s {host} {sd}/.background",
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

/// A FIFO planted as `output.log` in a swapped run directory: were it opened blocking, each
/// `task.output` would hold one of the daemon's worker threads until someone opened the FIFO
/// for writing, and a few calls from uid 65534 would stop the daemon answering anyone. It is
/// opened `O_NONBLOCK` and refused as not a regular file.
#[test]
fn a_fifo_planted_as_output_log_stalls_nobody() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let (_ws, _home, sd) = open_with_own_session_dir(&mut n, "fifo");
    let r = n.bash("fifo", "echo done", json!({}));
    assert_eq!(r["state"], "succeeded", "{r}");
    let id = r["task_id"].as_str().expect("task_id").to_owned();
    let answers = |d: &sidejob_tests::Daemon| {
        let mut c = d.client();
        c.set_read_timeout(std::time::Duration::from_secs(10));
        c.send_value(&json!({"jsonrpc": "2.0", "id": 7, "method": "session.list", "params": {}}));
        c.read_message_timeout().is_some()
    };
    // Positive control: the same calls on the real output.log, then the probe is answered.
    for _ in 0..8 {
        n.ok("task.output", json!({"task_id": id}));
    }
    assert!(answers(&d), "control: the daemon does not answer");
    let bg = sd.join(".background");
    as_nobody(&format!(
        "cd {bg} && mv {id} moved && mkdir {id} && mkfifo {id}/output.log",
        bg = bg.display()
    ));
    // More requests than the daemon has worker threads, without waiting for replies.
    let calls = std::thread::available_parallelism().map_or(8, |n| n.get()) * 2 + 2;
    for _ in 0..calls {
        n.send_value(&json!({"jsonrpc": "2.0", "id": 1, "method": "task.output",
            "params": {"task_id": id}}));
    }
    // Another user (root) asks the daemon something.
    let fifo = bg.join(&id).join("output.log");
    let answered = std::thread::scope(|s| {
        let probe = s.spawn(|| answers(&d));
        let answered = probe.join().expect("probe");
        // Unblock whatever is stuck on the FIFO, so the daemon can be stopped.
        for _ in 0..calls {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo);
        }
        answered
    });
    assert!(
        answered,
        "the daemon stopped answering other users after {calls} task.output calls on a planted FIFO"
    );
}
