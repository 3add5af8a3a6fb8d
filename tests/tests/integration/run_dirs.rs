//! Where a root daemon keeps its runs' private halves: a directory of its own in `/dev/shm`
//! (no inode of the state directory's filesystem made or freed for them), found again after
//! a restart, never one someone else made, and the older layout (`<state_dir>/runs`) still
//! served after an upgrade.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use sidejob_tests::{skip_without, wait_until, Client, Daemon, Gate, Need, NOBODY};

/// The name a daemon with this state directory gives its directory in `/dev/shm`.
fn memory_dir_of(state_dir: &Path) -> PathBuf {
    sidejob_tests::memory_runs_dir(state_dir).expect("state dir")
}

/// Makes `dir` as uid 65534 would: theirs, open to all.
fn make_theirs(dir: &Path) {
    std::fs::create_dir(dir).expect("mkdir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).expect("chown");
}

fn is_tmpfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

fn background(c: &mut Client, s: &str, cmd: &str) -> String {
    let r = c.bash(s, cmd, json!({"background": true}));
    r["task_id"].as_str().expect("task id").to_owned()
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|e| {
            e.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_root_daemon_keeps_its_runs_private_halves_in_memory_and_finds_them_after_a_restart() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let mut d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "held");
    let id = background(&mut c, &s, &format!("{}; echo done", gate.wait_cmd()));
    let memory = memory_dir_of(&d.state_dir);
    let private = memory.join(&id);
    sidejob_tests::supervisor_pid(&private);
    assert!(
        is_tmpfs(&private),
        "{} is not on a tmpfs",
        private.display()
    );
    assert_eq!(
        (std::fs::symlink_metadata(&memory)
            .expect("memory dir")
            .mode()
            & 0o7777),
        0o700
    );
    assert!(private.join("plan.json").exists());
    assert_eq!(
        entries(&d.state_dir.join("runs")),
        Vec::<String>::new(),
        "nothing of the run in the state directory's runs"
    );

    // The next daemon finds the run's private half: it re-attaches, and its cancel request
    // (written there) reaches the supervisor, whose reason the result gives.
    d.kill9();
    d.restart();
    let mut c = d.client();
    assert_eq!(c.task(&id)["state"], "running", "re-attached");
    let r = c.ok("task.cancel", json!({"task_id": id, "grace_ms": 100}));
    assert_eq!(r["result"], "canceled", "{r}");
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "canceled", "{t}");
    assert!(
        wait_until(Duration::from_secs(10), || !private.exists()),
        "the private half is removed once the run has settled"
    );

    // A clean stop with no run left takes the directory with it.
    drop(c);
    assert_eq!(d.terminate(), Some(0));
    assert!(!memory.exists(), "{} left behind", memory.display());
}

/// A daemon that runs one run at a time, holding `first` at `gate`, with `second` (running
/// `command`) queued behind it.
struct Queued {
    d: Daemon,
    gate: Gate,
    first: String,
    supervisor: i32,
    second: String,
}

fn one_queued_behind_a_held_run(command: &str) -> Queued {
    let d = Daemon::start_with_config("max_running = 1\n");
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "held");
    let first = background(&mut c, &s, &gate.wait_cmd());
    let supervisor = sidejob_tests::supervisor_pid(&d.private_dir(&first));
    let second = background(&mut c, &s, command);
    assert_eq!(c.task(&second)["state"], "queued");
    Queued {
        d,
        gate,
        first,
        supervisor,
        second,
    }
}

/// A queued run of an older daemon has its private half in `<state_dir>/runs`: after the
/// upgrade (played by moving it there while the daemon is down) it still starts, directly
/// rather than through the spawner, whose requests must name its own directory.
#[test]
fn a_run_queued_in_the_older_layout_starts_after_an_upgrade() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let Queued {
        mut d,
        gate,
        second,
        ..
    } = one_queued_behind_a_held_run("echo queued-in-the-old-layout");
    d.kill9();
    let old = d.state_dir.join("runs").join(&second);
    let moved = std::process::Command::new("mv")
        .arg(memory_dir_of(&d.state_dir).join(&second))
        .arg(&old)
        .status()
        .expect("mv");
    assert!(moved.success());
    // An older daemon's plan names the private directory it made.
    let plan_file = old.join("plan.json");
    let mut plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&plan_file).expect("plan")).expect("plan json");
    plan["private_dir"] = json!(old);
    std::fs::write(&plan_file, serde_json::to_vec(&plan).expect("plan")).expect("plan");
    d.restart();
    let mut c = d.client();
    assert_eq!(c.task(&second)["state"], "queued");
    gate.open();
    let t = c.wait_settled(&second);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(c.output(&second), "queued-in-the-old-layout\n");
    assert!(
        wait_until(Duration::from_secs(10), || !old.exists()),
        "its private half is removed where it was"
    );
}

/// uid 65534 makes the directory's name first, as a directory of their own and as a symlink
/// to one: the daemon uses neither (its runs' private halves stay in the state directory,
/// and it says why), and nothing is written where they can reach.
#[test]
fn attack_a_name_taken_in_dev_shm_is_never_used() {
    if skip_without(&[Need::Root]) {
        return;
    }
    for squat in ["directory", "symlink"] {
        let mut d = Daemon::prepare("");
        std::fs::create_dir(&d.state_dir).expect("state dir");
        std::fs::set_permissions(&d.state_dir, std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        let name = memory_dir_of(&d.state_dir);
        let theirs = d.root.path().join("theirs");
        make_theirs(&theirs);
        match squat {
            "directory" => make_theirs(&name),
            _ => std::os::unix::fs::symlink(&theirs, &name).expect("squat"),
        }
        d.launch();
        let mut c = d.client();
        let s = d.open_session(&mut c);
        let gate = Gate::new(&d.workspace, "held");
        let id = background(&mut c, &s, &gate.wait_cmd());
        let private = d.state_dir.join("runs").join(&id);
        sidejob_tests::supervisor_pid(&private);
        assert!(private.join("plan.json").exists(), "{squat}");
        assert_eq!(entries(&theirs), Vec::<String>::new(), "{squat}");
        if squat == "directory" {
            assert_eq!(entries(&name), Vec::<String>::new(), "{squat}");
        }
        let meta = std::fs::symlink_metadata(&name).expect("the squat is left alone");
        assert_eq!(meta.file_type().is_symlink(), squat == "symlink");
        let log = std::fs::read_to_string(d.log_path()).unwrap_or_default();
        assert!(
            log.contains("is not a directory of root's with mode 0700"),
            "{squat}: the log does not say why: {log}"
        );
        gate.open();
        let t = c.wait_settled(&id);
        assert_eq!(t["state"], "succeeded", "{squat}: {t}");
        let _ = std::fs::remove_file(&name).or_else(|_| std::fs::remove_dir(&name));
    }
}

/// A reboot empties `/dev/shm`, and with it the launch plan of a run that was still queued:
/// it settles `failed/lost` saying so. Played by killing the daemon and the running run,
/// removing the directory and making the recorded boot another one.
#[test]
fn a_run_queued_across_a_reboot_is_lost_saying_so() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let Queued {
        mut d,
        first,
        supervisor,
        second,
        ..
    } = one_queued_behind_a_held_run("echo never-runs");
    d.kill9();
    sidejob_tests::signal(-supervisor, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || {
        !sidejob_tests::process_alive(supervisor)
    }));
    std::fs::remove_dir_all(memory_dir_of(&d.state_dir)).expect("empty /dev/shm");
    let record = d.state_dir.join("daemon.instance");
    let text = std::fs::read_to_string(&record).expect("the daemon records where runs live");
    let fields: Vec<&str> = text.split_whitespace().collect();
    std::fs::write(
        &record,
        format!("another-boot {} {}\n", fields[1], fields[2]),
    )
    .expect("rewrite");
    d.restart();
    let mut c = d.client();
    for id in [&first, &second] {
        let t = c.wait_settled_quietly(id);
        assert_eq!(
            (&t["state"], &t["reason"]),
            (&json!("failed"), &json!("lost")),
            "{t}"
        );
        assert!(
            t["error"]
                .as_str()
                .unwrap_or("")
                .contains("the machine restarted"),
            "{t}"
        );
    }
    let t = c.task(&second);
    assert!(
        t["error"]
            .as_str()
            .unwrap_or("")
            .contains("launch plan is gone"),
        "{t}"
    );
}

/// The directory in /dev/shm removed while the daemon serves (as `rm -rf /dev/shm/*` would),
/// then made again by uid 65534: the runs after keep their private halves on disk, and
/// nothing is written in theirs; a run that was going on when it went still settles.
#[test]
fn runs_go_on_on_disk_when_the_directory_in_dev_shm_is_removed_or_taken() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let memory = memory_dir_of(&d.state_dir);
    let gate = Gate::new(&d.workspace, "going");
    let ready = d.workspace.join("going-ready");
    let going = background(
        &mut c,
        &s,
        &format!("touch {}; {}; echo going", ready.display(), gate.wait_cmd()),
    );
    assert!(
        wait_until(Duration::from_secs(10), || ready.exists()),
        "the run never started"
    );
    std::fs::remove_dir_all(&memory).expect("remove it");
    let on_disk = |c: &mut Client, word: &str| {
        let id = background(c, &s, &format!("{}; echo {word}", gate.wait_cmd()));
        sidejob_tests::supervisor_pid(&d.state_dir.join("runs").join(&id));
        id
    };
    let removed = on_disk(&mut c, "removed");
    assert!(!memory.exists(), "made again where anyone could have");
    make_theirs(&memory);
    let taken = on_disk(&mut c, "taken");
    // A cancel of the run that was going writes nothing in theirs either.
    let r = c.ok("task.cancel", json!({"task_id": going, "grace_ms": 100}));
    assert_eq!(r["result"], "canceled", "{r}");
    assert_eq!(c.wait_settled(&going)["state"], "canceled");
    assert_eq!(entries(&memory), Vec::<String>::new());
    gate.open();
    for (id, word) in [(&removed, "removed"), (&taken, "taken")] {
        assert_eq!(c.wait_settled(id)["state"], "succeeded");
        assert_eq!(c.output(id), format!("{word}\n"));
        let private = d.state_dir.join("runs").join(id);
        assert!(
            wait_until(Duration::from_secs(10), || !private.exists()),
            "its private half is removed once it has settled"
        );
    }
    assert_eq!(entries(&memory), Vec::<String>::new());
    std::fs::remove_dir(&memory).expect("unsquat");
}
