//! Sandbox profiles on disk: edits apply without a restart, and an edit that does not validate
//! keeps the previous version in force and says why. Profiles are policy: a file another user
//! could have written (or a symlink) is refused the same way, and a profile that runs as root
//! is for root's sessions only (these need root, to act as uid 65534).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use sidejob_tests::{wait_until, Daemon, TempDir};

use crate::isolation::{open_socket_to_everyone, rpc_as_nobody, NOBODY};
use sidejob_tests::{skip_without, Need};

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

/// A profile file written the way an administrator should: a temporary name, then a rename.
fn write_profile(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn root_profiles_dir() -> TempDir {
    let dir = TempDir::new("profiles");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Runs `sh -c script` as uid `NOBODY` with `input` on its stdin, and checks that it
/// succeeded.
fn as_nobody(script: &str, input: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_profile_another_user_could_write_is_refused_and_the_previous_stays_in_force() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let dir = root_profiles_dir();
    let mine = dir.path().join("mine.toml");
    write_profile(dir.path(), "mine.toml", &profile_text("v1"));
    let d = Daemon::start_with_config(&format!("profiles_dir = \"{}\"\n", dir.path().display()));
    let mut c = d.client();
    let s = c.ok(
        "session.open",
        json!({"workspace": d.workspace, "profile": "mine"}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut mark = || {
        c.bash(&s, "echo $MARK", json!({}))["output"]
            .as_str()
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(mark(), "v1");
    let refusal = |needle: &str| {
        let log = d.log();
        let prefix = format!("refusing profile {}: ", mine.display());
        assert!(
            log.lines().any(|l| l.contains(&prefix)
                && l.contains(needle)
                && l.contains("keeping the previous version")),
            "no refusal saying {needle:?}:\n{log}"
        );
    };

    // 1. The file belongs to uid 65534, who edits it.
    std::os::unix::fs::chown(&mine, Some(NOBODY), Some(NOBODY)).unwrap();
    as_nobody(
        &format!("cat > {}", mine.display()),
        &profile_text("by-65534-file"),
    );
    assert_eq!(mark(), "v1");
    refusal(&format!(
        "the file is owned by uid {NOBODY}, not by root; chown root {}",
        mine.display()
    ));

    // 2. A symlink into a directory uid 65534 writes.
    let theirs = TempDir::new("nobody-profiles");
    std::fs::set_permissions(theirs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(theirs.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    as_nobody(
        &format!("cat > {}/p.toml", theirs.path().display()),
        &profile_text("by-65534-link"),
    );
    std::fs::remove_file(&mine).unwrap();
    std::os::unix::fs::symlink(theirs.path().join("p.toml"), &mine).unwrap();
    assert_eq!(mark(), "v1");
    refusal("the file is a symbolic link");

    // 3. The directory is writable by uid 65534, who renames another of root's profiles over
    //    this one.
    std::fs::remove_file(&mine).unwrap();
    write_profile(dir.path(), "mine.toml", &profile_text("v1-again"));
    write_profile(dir.path(), "other.toml", &profile_text("by-65534-rename"));
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), None).unwrap();
    as_nobody(
        &format!("mv {0}/other.toml {0}/mine.toml", dir.path().display()),
        "",
    );
    assert_eq!(mark(), "v1");
    refusal(&format!("its directory is owned by uid {NOBODY}"));

    // The positive control: root's directory again, and root's own edit applies.
    std::os::unix::fs::chown(dir.path(), Some(0), None).unwrap();
    write_profile(dir.path(), "mine.toml", &profile_text("v2"));
    assert_eq!(mark(), "v2");
}

#[test]
fn a_profile_that_runs_as_root_is_for_roots_sessions_only() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let shipped = include_str!("../../../sandbox-profiles/workspace-write.toml");
    assert!(shipped.contains("run_as = \"caller\"\n"));
    let as_root = shipped.replace("run_as = \"caller\"\n", "run_as = \"0:0\"\n");
    let dir = root_profiles_dir();
    write_profile(dir.path(), "rootish.toml", &as_root);
    write_profile(dir.path(), "mine.toml", shipped);
    let d = Daemon::start_with_config(&format!("profiles_dir = \"{}\"\n", dir.path().display()));
    open_socket_to_everyone(&d);
    let ws = d.root.path().join("nobody-ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::os::unix::fs::chown(&ws, Some(NOBODY), Some(NOBODY)).unwrap();

    // Uid 65534 cannot open a session with it …
    let e = rpc_as_nobody(
        &d,
        "session.open",
        json!({"session_id": "nobody-root", "workspace": ws, "profile": "rootish"}),
    )
    .expect_err("uid 65534 opened a session that runs as root");
    assert!(
        e.contains("(invalid_params)") && e.contains("only root's sessions"),
        "{e}"
    );
    // … root can, and its runs are uid 0.
    let mut c = d.client();
    let s = c.ok(
        "session.open",
        json!({"workspace": d.workspace, "profile": "rootish"}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = c.bash(&s, "id -u", json!({}));
    assert_eq!(r["output"], "0\n", "{r}");

    // A session uid 65534 opened under a harmless profile runs as 65534 …
    rpc_as_nobody(
        &d,
        "session.open",
        json!({"session_id": "nobody-s", "workspace": ws, "profile": "mine"}),
    )
    .expect("session.open as nobody");
    let call = json!({"session_id": "nobody-s", "tool": "bash", "args": {"command": "id -u"}});
    let r = rpc_as_nobody(&d, "tool.call", call.clone()).expect("tool.call as nobody");
    assert_eq!(r["output"], format!("{NOBODY}\n"), "{r}");
    // … and once root edits that profile to run as root, its next call is refused.
    write_profile(dir.path(), "mine.toml", &as_root);
    let e = rpc_as_nobody(&d, "tool.call", call).expect_err("ran as root");
    assert!(
        e.contains("(invalid_params)") && e.contains("only root's sessions"),
        "{e}"
    );
}
