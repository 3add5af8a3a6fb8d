//! The daemon's state on the host is private. The state directory is passable but not
//! readable (0711), and everything in it is its owner's alone: the registry 0600, the runs'
//! private halves 0700; session and run directories and the files in them belong to the
//! session's owner and no one else (root aside) — for uid 65534's session too, who reads
//! them at the paths its results name.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::{daemon, mode_uid, nobody, start_gated, NobodyDir, NOBODY};

fn run_dir(task: &serde_json::Value) -> PathBuf {
    Path::new(task["result_path"].as_str().expect("result_path"))
        .parent()
        .expect("run dir")
        .to_path_buf()
}

/// Can uid 65534 read `path` on the host (`cat`, `ls`)?
fn nobody_reads(path: &Path) -> bool {
    reads_as(NOBODY, path)
}

/// Can `uid` (with no groups but its own) read `path` on the host?
fn reads_as(uid: u32, path: &Path) -> bool {
    let cmd = if path.is_dir() { "ls" } else { "cat" };
    sidejob_tests::sh_as(
        uid,
        uid,
        &format!("{cmd} {} >/dev/null 2>&1", path.display()),
    )
    .status
    .success()
}

#[test]
fn attack_host_state_is_private_to_its_owners() {
    let Some(d) = daemon() else { return };
    let mut c = d.client();
    let root_ws = sidejob_tests::TempDir::new("root-ws");
    let root_s = c.ok("session.open", json!({"workspace": root_ws.path()}))["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    // A root run whose plan (argv, env) holds a secret, held at a gate while the host looks.
    let (root_task, gate) = start_gated(
        &mut c,
        &root_s,
        root_ws.path(),
        "echo root-secret-output",
        json!({}),
    );
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let opened = n.ok("session.open", json!({"workspace": ws.path()}));
    let s = opened["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    let session_dir = PathBuf::from(opened["session_dir"].as_str().expect("session_dir"));
    let mine = n.bash(&s, "echo mine", json!({}));
    assert_eq!(mine["state"], "succeeded", "{mine}");

    // The daemon's own files.
    let state = &d.state_dir;
    assert_eq!(mode_uid(state), (0o711, 0));
    // Passable, so each owner reaches its own: then every entry must close itself.
    for e in std::fs::read_dir(state).expect("state dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let (mode, uid) = mode_uid(&e.path());
        let passable = matches!(name.as_str(), "sessions" | "caches");
        assert!(
            uid == 0 && (mode & 0o077 == 0 || (passable && mode & 0o066 == 0)),
            "{name} in the state directory is {mode:o}, uid {uid}"
        );
    }
    for f in ["sidejob.db", "sidejob.db-wal", "sidejob.db-shm"] {
        let p = state.join(f);
        if p.exists() {
            assert_eq!(mode_uid(&p), (0o600, 0), "{f}");
        }
    }
    // The runs' private halves: a root daemon's directory in /dev/shm, or `runs` above.
    let runs = sidejob_tests::runs_dir(state);
    assert_eq!(mode_uid(&runs), (0o700, 0), "{}", runs.display());
    let private = d.private_dir(&root_task);
    assert_eq!(mode_uid(&private).0, 0o700);
    assert_eq!(
        mode_uid(&private.join("plan.json")).0 & 0o077,
        0,
        "plan.json"
    );

    // uid 65534's session: its directories and files are theirs, 0700/0600.
    assert_eq!(mode_uid(&session_dir), (0o700, NOBODY));
    assert_eq!(mode_uid(&session_dir.join(".background")), (0o700, NOBODY));
    let theirs = run_dir(&mine);
    assert_eq!(mode_uid(&theirs), (0o700, NOBODY));
    assert_eq!(mode_uid(&theirs.join("output.log")), (0o600, NOBODY));
    assert_eq!(mode_uid(&theirs.join("result.json")), (0o600, NOBODY));

    // Root's run files: root's alone.
    let root_run = state
        .join("sessions")
        .join(&root_s)
        .join(".background")
        .join(&root_task);
    assert_eq!(mode_uid(&root_run), (0o700, 0));
    assert_eq!(mode_uid(&root_run.join("output.log")), (0o600, 0));

    // What uid 65534 can and cannot read on the host.
    assert!(
        nobody_reads(ws.path()),
        "control: uid {NOBODY} reads its own workspace"
    );
    for p in [
        state.join("sidejob.db"),
        state.to_path_buf(),
        private.join("plan.json"),
        root_run.join("output.log"),
    ] {
        assert!(!nobody_reads(&p), "uid {NOBODY} reads {}", p.display());
    }
    gate.open();
    let t = c.wait_settled(&root_task);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(mode_uid(&root_run.join("result.json")), (0o600, 0));
}

/// A session directory the daemon chooses lies in the state directory: its owner reads
/// the run's files there, at the paths its results name, with its own credentials (another
/// user cannot); through `task.output` too; and one that wants the files elsewhere names a
/// session directory of its own.
#[test]
fn a_users_own_output_is_theirs_to_read_and_no_one_elses() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let s = n.open_session_in(ws.path());
    let r = n.bash(&s, "head -c 200000 /dev/zero | tr '\\0' m", json!({}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    let output_path = Path::new(r["output_path"].as_str().expect("output_path"));
    let result_path = Path::new(r["result_path"].as_str().expect("result_path"));
    assert!(
        output_path.starts_with(&d.state_dir),
        "{}",
        output_path.display()
    );
    assert_eq!(mode_uid(output_path), (0o600, NOBODY), "the file is theirs");
    for p in [output_path, result_path] {
        assert!(
            nobody_reads(p),
            "uid {NOBODY} cannot read its own {}",
            p.display()
        );
        assert!(
            !reads_as(NOBODY - 1, p),
            "another user reads {}",
            p.display()
        );
    }
    let result: serde_json::Value = serde_json::from_str(
        &sidejob_tests::sh_as(NOBODY, NOBODY, &format!("cat {}", result_path.display()))
            .stdout
            .iter()
            .map(|b| *b as char)
            .collect::<String>(),
    )
    .expect("result.json read as its owner");
    assert_eq!(result["task_id"], id.as_str(), "{result}");
    assert_eq!(n.output(&id).len(), 200_000, "task.output gives all of it");

    let home = NobodyDir::new("home");
    let own = home.join("sessions");
    let s2 = n.ok(
        "session.open",
        json!({"workspace": ws.path(), "session_id": "own-dir", "session_dir": own}),
    )["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    let r = n.bash(&s2, "echo mine", json!({}));
    let output_path = Path::new(r["output_path"].as_str().expect("output_path"));
    assert!(output_path.starts_with(&own));
    assert!(
        nobody_reads(output_path),
        "uid {NOBODY} reads the output in the session directory it chose"
    );
}
