//! Issue 32, item 6: the supervisor writes `result.json` into a directory the session's owner
//! controls. Something planted in the way there (a `.result.json.tmp/` directory) fails the
//! run at once, saying so, instead of being retried for ever; a full disk is still waited out
//! (the run's only record), and `task.cancel` ends that wait too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{process_alive, supervisor_pid, wait_until, Client};

use super::{
    as_nobody, daemon, mode_uid, nobody, open_with_own_session_dir, present, result_json,
    start_gated, NobodyDir, NOBODY,
};
use crate::faults::Tmpfs;

fn run_dir(sd: &Path, task_id: &str) -> PathBuf {
    sd.join(".background").join(task_id)
}

/// Waits up to `within` for the task to settle; panics with it otherwise.
fn settles_within(c: &mut Client, task_id: &str, within: Duration) -> Value {
    let t = c.wait_for(task_id, within.as_millis() as u64);
    assert!(
        matches!(
            t["state"].as_str(),
            Some("succeeded" | "failed" | "canceled")
        ),
        "task {task_id} is still {} after {within:?}: {t}",
        t["state"]
    );
    t
}

/// The run's supervisor is gone, soon after it settled.
fn supervisor_gone(pid: i32) {
    assert!(
        wait_until(Duration::from_secs(10), || !process_alive(pid)),
        "the supervisor ({pid}) is still there"
    );
}

#[test]
fn attack_a_planted_result_tmp_directory_fails_the_run_at_once() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let (ws, _home, sd) = open_with_own_session_dir(&mut n, "planted-tmp");
    let (id, gate) = start_gated(&mut n, "planted-tmp", ws.path(), "echo done", json!({}));
    let pid = supervisor_pid(&d.private_dir(&id));
    let tmp = run_dir(&sd, &id).join(".result.json.tmp");
    as_nobody(&format!("mkdir {t} && touch {t}/x", t = tmp.display()));
    gate.open();

    let t = settles_within(&mut n, &id, Duration::from_secs(15));
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "sandbox_error", "{t}");
    let error = t["error"].as_str().unwrap_or("");
    assert!(
        error.contains("result.json") && error.contains(".result.json.tmp"),
        "the reason does not say what is in the way: {t}"
    );
    // On the host: the supervisor is gone, nothing of the planted directory was touched,
    // and no result.json was made anywhere in the run directory.
    supervisor_gone(pid);
    assert_eq!(mode_uid(&tmp).1, NOBODY);
    assert!(tmp.is_dir() && tmp.join("x").is_file());
    assert!(!present(&run_dir(&sd, &id).join("result.json")));
    let cancel = n.ok("task.cancel", json!({"task_id": id}));
    assert_eq!(cancel["result"], "already_terminal", "{cancel}");

    // Positive control: the next run in the same session writes its result.json as always.
    let ok = n.bash("planted-tmp", "echo fine", json!({}));
    assert_eq!(ok["state"], "succeeded", "{ok}");
    let task = n.task(ok["task_id"].as_str().expect("task_id"));
    let result = result_json(&task);
    assert_eq!(result["task_id"], task["task_id"], "{result}");
    assert_eq!(result["state"], "succeeded", "{result}");
}

/// A small disk of its own (a tmpfs), unmounted before its directory is removed.
struct SmallDisk {
    disk: Tmpfs,
    _parent: sidejob_tests::TempDir,
}

/// Opens uid 65534's session `id` with its session directory on a small disk handed to
/// them, for the full-disk case; returns the workspace, the disk and the session directory.
fn session_dir_on_small_disk(n: &mut Client, id: &str) -> (NobodyDir, SmallDisk, PathBuf) {
    let ws = NobodyDir::new("ws");
    let parent = sidejob_tests::TempDir::new("disk");
    super::set_mode(parent.path(), 0o755);
    let at = parent.path().join("disk");
    let disk = Tmpfs::mount(&at, "512k");
    std::os::unix::fs::chown(&at, Some(NOBODY), Some(NOBODY)).expect("chown disk");
    let sd = at.join("sd");
    n.ok(
        "session.open",
        json!({"session_id": id, "workspace": ws.path(), "session_dir": sd}),
    );
    let disk = SmallDisk {
        disk,
        _parent: parent,
    };
    (ws, disk, sd)
}

#[test]
fn attack_a_run_waiting_for_room_for_its_result_can_still_be_canceled() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let (ws, disk, sd) = session_dir_on_small_disk(&mut n, "full-disk");
    let (id, gate) = start_gated(&mut n, "full-disk", ws.path(), "echo done", json!({}));
    let pid = supervisor_pid(&d.private_dir(&id));
    // Fill the disk the run's result goes to.
    let fill = sd.join("fill");
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=4096"])
        .arg(format!("of={}", fill.display()))
        .stderr(std::process::Stdio::null())
        .status();
    gate.open();
    // No room: the result is waited for (nothing settles while it cannot be written) ...
    let t = n.wait_for(&id, 1500);
    assert_eq!(t["state"], "running", "{t}");
    // ... until the run is canceled, which ends the wait at once.
    let cancel = n.ok("task.cancel", json!({"task_id": id, "grace_ms": 500}));
    assert_eq!(cancel["result"], "canceled", "{cancel}");
    let t = settles_within(&mut n, &id, Duration::from_secs(10));
    assert_eq!(t["state"], "canceled", "{t}");
    let error = t["error"].as_str().unwrap_or("");
    assert!(
        error.contains("result.json") && error.contains("no room"),
        "{t}"
    );
    supervisor_gone(pid);
    assert!(!present(&run_dir(&sd, &id).join("result.json")));
    drop(disk.disk);
}
