//! Faults the daemon must survive without losing a result: a full disk under the runs'
//! output, a full disk under the registry, a damaged or emptied registry. Needs root (tmpfs
//! mounts).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{sidejob_bin, wait_until, Daemon, TempDir};
use sidejob_tests::{skip_without, Need};

use crate::attacks::mode_uid;

/// A tmpfs mounted for the test, unmounted when dropped.
pub(crate) struct Tmpfs(PathBuf);

impl Tmpfs {
    pub(crate) fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).expect("mount point");
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("mount")
            .success();
        assert!(ok, "mount a tmpfs at {}", at.display());
        Tmpfs(at.to_path_buf())
    }

    fn resize(&self, size: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .expect("remount")
            .success();
        assert!(ok, "resize the tmpfs at {}", self.0.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // A daemon whose state directory this was named its runs' directory after it.
        sidejob_tests::remove_memory_runs_dir(&self.0);
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A run that waits for `gate` to exist (in the workspace), then runs `then`.
fn gated(gate: &Path, then: &str) -> String {
    format!(
        "while [ ! -e {} ]; do sleep 0.02; done; {then}",
        gate.display()
    )
}

#[test]
fn output_that_fills_the_disk_neither_loses_the_result_nor_contradicts_it() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let outside = TempDir::new("faults-sessions");
    let sessions = outside.path().join("sessions");
    let disk = Tmpfs::mount(&sessions, "1m");
    let mut d = Daemon::prepare(&format!("sessions_dir = \"{}\"\n", sessions.display()));
    d.launch();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // 4 MiB of output into a 1 MiB disk, then exit 0. The call yields after 1 s (its reply
    // says `running`, which is true); the run's result waits for room.
    let r = c.bash(
        &s,
        "head -c 4194304 /dev/zero | tr '\\0' x; echo; exit 0",
        json!({"yield_after_ms": 1000}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    match r["status"].as_str() {
        Some("running") => {}
        Some("completed") => panic!("a completed reply before the result could be written: {r}"),
        other => panic!("unexpected reply {other:?}: {r}"),
    }
    assert!(
        r.get("state").is_none(),
        "a running reply carries no state to contradict it: {r}"
    );
    // Nothing settles while the result cannot be written.
    let t = c.task(&id);
    assert_eq!(t["state"], "running", "{t}");
    // Room again: the result is written, and the task settles with the command's true code.
    disk.resize("64m");
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(t["exit_code"], 0, "{t}");
    let result: Value = serde_json::from_str(
        &std::fs::read_to_string(t["result_path"].as_str().expect("result_path"))
            .expect("result.json"),
    )
    .expect("json");
    assert!(
        result["violations"]
            .as_array()
            .is_some_and(|v| v.iter().any(|x| x == "output_lost")),
        "{result}"
    );
    let err = result["error"].as_str().unwrap_or("");
    assert!(
        err.contains("output.log") && err.contains("No space left"),
        "{result}"
    );
    // And the daemon is well: the next call runs.
    let r = c.bash(&s, "echo after", json!({}));
    assert_eq!(r["output"], "after\n", "{r}");
    drop(c);
    d.kill9();
    drop(disk);
}

#[test]
fn a_settlement_the_full_registry_cannot_record_is_retried_until_it_is() {
    if skip_without(&[Need::Root]) {
        return;
    }
    // The registry on a disk of its own; the runs' output elsewhere, so the run itself ends
    // and writes its result: only the settlement cannot be recorded.
    let outside = TempDir::new("faults-sessions");
    let mut d = Daemon::prepare(&format!(
        "sessions_dir = \"{}\"\n",
        outside.path().join("sessions").display()
    ));
    let disk = Tmpfs::mount(&d.state_dir, "128m");
    d.launch();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = d.workspace.join("gate");
    let r = c.bash(
        &s,
        &gated(&gate, "echo done; exit 3"),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    // The daemon, left alone, empties the registry's log file, so that the next commit needs
    // room of its own (where a log holding old pages would take it, and not say so).
    let wal = d.state_dir.join("sidejob.db-wal");
    assert!(
        wait_until(Duration::from_secs(10), || std::fs::metadata(&wal)
            .is_ok_and(|m| m.len() == 0)),
        "the registry's log is not emptied while the daemon is idle: {:?}",
        std::fs::metadata(&wal).map(|m| m.len())
    );
    // Fill the registry's disk to the last byte.
    let filler = d.state_dir.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", filler.display()))
        .output();
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}.small", filler.display()))
        .output();
    std::fs::write(&gate, "").expect("gate");
    // The run ends, but its settlement cannot be recorded: the task stays running (and the
    // daemon logs why, naming the registry).
    assert!(
        wait_until(Duration::from_secs(20), || d
            .log()
            .contains("cannot record the settlement")),
        "the daemon says it cannot record the settlement; log:\n{}",
        d.log()
    );
    assert!(d
        .log()
        .contains(&d.state_dir.join("sidejob.db").display().to_string()));
    let t = c.task(&id);
    assert_eq!(
        t["state"], "running",
        "nothing recorded, nothing contradicted: {t}"
    );
    // A backup taken now fails, saying why and naming the file once, and leaves no
    // half-written copy behind to hold on to the space.
    let backup = d.state_dir.join("sidejob.db.backup");
    let o = registry_cli(&d, &["backup"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("no space left"), "{err}");
    assert_eq!(
        err.matches(&backup.display().to_string()).count(),
        1,
        "{err}"
    );
    assert!(!err.contains("not an error"), "{err}");
    assert!(
        !d.state_dir.join("sidejob.db.backup.tmp").exists(),
        "a half-written backup is left: {err}"
    );
    // Room again: the settlement is recorded with the true exit code, and one wake is made.
    std::fs::remove_file(&filler).expect("free the disk");
    let _ = std::fs::remove_file(format!("{}.small", filler.display()));
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["reason"], "exit_code", "{t}");
    assert_eq!(t["exit_code"], 3, "{t}");
    assert_eq!(c.output(&id), "done\n");
    // And a backup can be taken again.
    let o = registry_cli(&d, &["backup"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(backup.exists());
    drop(c);
    d.kill9();
    drop(disk);
}

/// `sidejob registry ARGS` on `d`'s state, from a shell's usual umask (022).
fn registry_cli(d: &Daemon, args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(sidejob_bin());
    cmd.arg("registry")
        .args(args)
        .arg("--state-dir")
        .arg(&d.state_dir);
    // SAFETY: umask is async-signal-safe and touches nothing shared.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    cmd.output().expect("sidejob registry")
}

/// Starts `sidejob serve` on `d`'s socket and state and returns its exit status and stderr,
/// expecting it to refuse (it is killed if it listens).
fn refused_start(d: &Daemon) -> (Option<i32>, String) {
    let mut child = Command::new(sidejob_bin())
        .arg("serve")
        .arg("--socket")
        .arg(&d.socket)
        .arg("--state-dir")
        .arg(&d.state_dir)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    let exited = wait_until(Duration::from_secs(20), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !exited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_truncated_registry_is_refused_and_restored_from_its_backup() {
    let mut d = Daemon::start_with_config("backup_interval_ms = 100\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "echo kept", json!({}));
    let id = r["task_id"].as_str().expect("id").to_owned();
    drop(c);
    // A backup that holds the task (the daemon takes one within 100 ms of a change).
    let backup = d.state_dir.join("sidejob.db.backup");
    assert!(
        wait_until(Duration::from_secs(20), || {
            rusqlite::Connection::open(&backup)
                .and_then(|db| {
                    db.query_row(
                        "SELECT COUNT(*) FROM tasks WHERE task_id = ?1",
                        [&id],
                        |r| r.get::<_, i64>(0),
                    )
                })
                .is_ok_and(|n| n == 1)
        }),
        "a backup with the task"
    );
    assert_eq!(d.terminate(), Some(0));
    let db = d.state_dir.join("sidejob.db");
    std::fs::write(&db, b"").expect("truncate");
    let (code, stderr) = refused_start(&d);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&db.display().to_string()), "{stderr}");
    assert!(stderr.contains("registry restore"), "the way out: {stderr}");
    assert_eq!(
        stderr.matches(&db.display().to_string()).count(),
        1,
        "the file is named once: {stderr}"
    );
    let out = registry_cli(&d, &["restore"]);
    assert!(out.status.success(), "{out:?}");
    // Owner-only, like the registry, though taken and restored from a shell's umask.
    assert_eq!(mode_uid(&db).0, 0o600, "the restored registry");
    let out = registry_cli(&d, &["backup"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        mode_uid(&backup).0,
        0o600,
        "a backup taken from the command line"
    );
    d.launch();
    let mut c = d.client();
    let t = c.task(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&id), "kept\n");
}

#[test]
fn a_damaged_registry_is_refused_and_rebuilt_from_the_runs() {
    let mut d = Daemon::start_with_config("backup_interval_ms = 0\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = c.bash(&s, &format!("echo run{i}; exit {i}"), json!({}));
        ids.push(r["task_id"].as_str().expect("id").to_owned());
    }
    // A session with no finished run: nothing on disk says its profile either.
    let idle = d.open_session(&mut c);
    drop(c);
    assert_eq!(d.terminate(), Some(0));
    // Overwrite pages past the header with garbage.
    let db = d.state_dir.join("sidejob.db");
    let mut bytes = std::fs::read(&db).expect("db");
    for page in (1..bytes.len() / 4096).step_by(2) {
        for b in &mut bytes[page * 4096 + 8..page * 4096 + 600] {
            *b = 0xA5;
        }
    }
    std::fs::write(&db, &bytes).expect("damage");
    let check = registry_cli(&d, &["check"]);
    assert!(!check.status.success(), "check finds the damage: {check:?}");
    let (code, stderr) = refused_start(&d);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("damaged"), "{stderr}");
    assert!(stderr.contains("registry rebuild"), "{stderr}");
    let out = registry_cli(&d, &["rebuild"]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("3 finished runs"), "{said}");
    d.launch();
    let mut c = d.client();
    for (i, id) in ids.iter().enumerate() {
        let t = c.task(id);
        assert_eq!(t["exit_code"], i as i64, "{t}");
        assert_eq!(c.output(id), format!("run{i}\n"));
    }
    // The rebuilt session's workspace is unknown: reopening it names it, and work goes on
    // there (as `sidejob call` does from the same directory); from then on it is known.
    let r = c.ok(
        "session.open",
        json!({"session_id": s, "workspace": d.workspace}),
    );
    assert_eq!(r["workspace"], d.workspace.display().to_string(), "{r}");
    let r = c.bash(&s, "pwd", json!({}));
    assert_eq!(r["state"], "succeeded", "{r}");
    let id = r["task_id"].as_str().expect("id");
    assert_eq!(c.output(id), format!("{}\n", d.workspace.display()));
    let elsewhere = d.root.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    let (_, kind) = c.err(
        "session.open",
        json!({"session_id": s, "workspace": elsewhere}),
    );
    assert_eq!(kind, "invalid_params");
    c.ok(
        "session.open",
        json!({"session_id": idle, "workspace": d.workspace}),
    );
    let r = c.bash(&idle, "echo again", json!({}));
    assert_eq!(r["state"], "succeeded", "{r}");
    drop(c);
    assert_eq!(d.terminate(), Some(0));
    let check = registry_cli(&d, &["check"]);
    assert!(
        check.status.success(),
        "the rebuilt and reopened registry checks (its event log replays to its rows): {check:?}"
    );
}
