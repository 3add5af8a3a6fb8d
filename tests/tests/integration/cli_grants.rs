//! `sidejob call --read/--write/--allow` as uid 1000 of a root daemon: the paths are the
//! caller's (checked with their credentials before anything starts, refused naming the
//! path), the hosts only those the daemon's `[grants] allow` lists, the grant shown in
//! `sidejob tasks`, and a run's bridge never granting more than its run had.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use sidejob_tests::net::HttpServer;
use sidejob_tests::{sidejob_bin, skip_without, Daemon, Need};

/// The unprivileged user of these tests.
const USER: u32 = 1000;
const SECRET: &str = "root-only-secret-5f1c";

/// `sidejob ARGS` as uid 1000 in `cwd`, against `d`.
fn as_user(d: &Daemon, cwd: &Path, args: &[&str]) -> Output {
    Command::new(sidejob_bin())
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .uid(USER)
        .gid(USER)
        .stdin(Stdio::null())
        .output()
        .expect("run sidejob as uid 1000")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A directory under the daemon's root with this owner and mode.
fn dir(d: &Daemon, name: &str, owner: u32, mode: u32) -> PathBuf {
    let p = d.root.path().join(name);
    std::fs::create_dir_all(&p).unwrap();
    std::os::unix::fs::chown(&p, Some(owner), Some(owner)).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

/// A root daemon uid 1000 may reach, and a workspace of theirs.
fn setup(toml: &str) -> Option<(Daemon, PathBuf)> {
    if skip_without(&[Need::Root]) {
        return None;
    }
    let d = Daemon::start_with_config(toml);
    d.let_everyone_connect();
    let ws = dir(&d, "ws", USER, 0o755);
    Some((d, ws))
}

/// A root-only directory (0700) holding [`SECRET`].
fn root_only(d: &Daemon) -> PathBuf {
    let p = dir(d, "root-only", 0, 0o700);
    std::fs::write(p.join("secret"), SECRET).unwrap();
    p
}

/// No file the daemon keeps for its sessions and runs holds [`SECRET`].
fn assert_secret_nowhere(d: &Daemon) {
    fn walk(p: &Path, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(p) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let holds = |p: &Path| {
                std::fs::read(p)
                    .is_ok_and(|b| b.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()))
            };
            match e.file_type() {
                Ok(t) if t.is_dir() => walk(&path, found),
                Ok(t) if t.is_file() && holds(&path) => found.push(path),
                _ => {}
            }
        }
    }
    let mut found = Vec::new();
    walk(&d.state_dir, &mut found);
    assert!(found.is_empty(), "the secret is in {found:?}");
}

#[test]
fn call_read_lets_the_run_read_a_directory_of_the_callers_and_only_with_it() {
    let Some((d, ws)) = setup("") else { return };
    let data = dir(&d, "data-1000", USER, 0o700);
    std::fs::write(data.join("f"), "mine\n").unwrap();
    std::os::unix::fs::chown(data.join("f"), Some(USER), Some(USER)).unwrap();
    let file = data.join("f");
    let file = file.to_str().unwrap();
    let with = as_user(
        &d,
        &ws,
        &["call", "--read", data.to_str().unwrap(), "--", "cat", file],
    );
    assert!(with.status.success(), "{}", text(&with));
    assert_eq!(String::from_utf8_lossy(&with.stdout), "mine\n");
    let without = as_user(&d, &ws, &["call", "--", "cat", file]);
    assert!(!without.status.success(), "{}", text(&without));
    // A relative path is the caller's working directory's.
    let rel = as_user(&d, &data, &["call", "--read", ".", "--", "cat", file]);
    assert!(rel.status.success(), "{}", text(&rel));
}

#[test]
fn call_read_of_a_root_only_directory_is_refused_up_front_naming_it() {
    let Some((d, ws)) = setup("") else { return };
    let secret_dir = root_only(&d);
    let path = secret_dir.to_str().unwrap();
    let out = as_user(
        &d,
        &ws,
        &[
            "call",
            "--read",
            path,
            "--",
            "cat",
            &format!("{path}/secret"),
        ],
    );
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(path) && said.contains("uid 1000 may not read it"),
        "the refusal does not name the path: {said}"
    );
    assert!(!said.contains(SECRET), "{said}");
    // Refused before anything started: no task, no run directory.
    let tasks = as_user(&d, &ws, &["tasks", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&tasks.stdout).unwrap();
    assert_eq!(
        listed["tasks"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );
    assert_secret_nowhere(&d);
    // Kernel filesystems and the daemon's own directories are no grant either.
    for (p, why) in [
        ("/proc", "kernel filesystem"),
        (d.state_dir.to_str().unwrap(), "sidejob's own"),
    ] {
        let out = as_user(&d, &ws, &["call", "--read", p, "--", "true"]);
        let said = text(&out);
        assert!(
            !out.status.success() && said.contains(p) && said.contains(why),
            "--read {p}: {said}"
        );
    }
}

#[test]
fn call_write_writes_where_the_caller_may_and_is_refused_where_they_may_not() {
    let Some((d, ws)) = setup("") else { return };
    let out_dir = dir(&d, "out-1000", USER, 0o755);
    let target = out_dir.join("made-by-the-run");
    let script = format!("echo written > {}", target.display());
    let ok = as_user(
        &d,
        &ws,
        &["call", "--write", out_dir.to_str().unwrap(), "--", &script],
    );
    assert!(ok.status.success(), "{}", text(&ok));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "written\n");
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), USER);
    // Root's directory, readable by all but writable by root only.
    let roots = dir(&d, "root-755", 0, 0o755);
    let script = format!("echo x > {}/nope", roots.display());
    let refused = as_user(
        &d,
        &ws,
        &["call", "--write", roots.to_str().unwrap(), "--", &script],
    );
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains(roots.to_str().unwrap()) && said.contains("uid 1000 may not write it"),
        "{said}"
    );
    assert!(!roots.join("nope").exists());
}

#[test]
fn call_allow_reaches_a_host_in_grants_allow_and_is_refused_one_outside_naming_the_key() {
    let srv = HttpServer::start();
    let Some((d, ws)) = setup("[grants]\nallow = [\"127.0.0.1\"]\n") else {
        return;
    };
    let port = srv.port;
    // The proxy is the run's only way out; 127.0.0.1 is in NO_PROXY, so say so to curl.
    let curl = |host: &str| {
        format!("env -u NO_PROXY -u no_proxy curl -sS -m 10 http://{host}:{port}/granted")
    };
    let inside = format!("127.0.0.1:{port}");
    let ok = as_user(
        &d,
        &ws,
        &["call", "--allow", &inside, "--", &curl("127.0.0.1")],
    );
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("hello /granted"),
        "{}",
        text(&ok)
    );
    // Without the grant the run has no network at all.
    let none = as_user(&d, &ws, &["call", "--", &curl("127.0.0.1")]);
    assert!(!none.status.success(), "{}", text(&none));
    let outside = format!("127.0.0.2:{port}");
    let refused = as_user(
        &d,
        &ws,
        &["call", "--allow", &outside, "--", &curl("127.0.0.2")],
    );
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains(&outside) && said.contains("[grants] allow"),
        "the refusal names neither the host nor the key: {said}"
    );
    assert_eq!(
        srv.seen().len(),
        1,
        "only the granted call reached the server"
    );
}

#[test]
fn tasks_shows_a_calls_grants_in_its_profile_column() {
    let Some((d, ws)) = setup("") else { return };
    let data = dir(&d, "shown-1000", USER, 0o755);
    let path = data.to_str().unwrap();
    let out = as_user(
        &d,
        &ws,
        &["call", "--read", path, "--", "echo", "granted-run"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let tasks = as_user(&d, &ws, &["tasks"]);
    let table = String::from_utf8_lossy(&tasks.stdout).into_owned();
    let line = table
        .lines()
        .find(|l| l.contains("granted-run"))
        .unwrap_or_else(|| panic!("no task in:\n{table}"));
    assert!(
        line.contains(&format!("workspace-write+read:{path}")),
        "the PROFILE column does not show the grant:\n{table}"
    );
    let json = as_user(&d, &ws, &["tasks", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["tasks"][0]["grants"]["readable"][0], path, "{v}");
    // The grant is in the event log too: replaying it rebuilds the same row.
    let replay = Command::new(sidejob_bin())
        .args(["replay", "--check", "--state-dir"])
        .arg(&d.state_dir)
        .output()
        .expect("run sidejob replay");
    assert!(replay.status.success(), "{}", text(&replay));
}

#[test]
fn root_may_allow_any_host_and_a_user_none_while_grants_allow_is_empty() {
    let srv = HttpServer::start();
    let Some((d, ws)) = setup("") else { return };
    let port = srv.port;
    let host = format!("127.0.0.1:{port}");
    let curl = format!("env -u NO_PROXY -u no_proxy curl -sS -m 10 http://{host}/by-root");
    let user = as_user(&d, &ws, &["call", "--allow", &host, "--", &curl]);
    let said = text(&user);
    assert!(
        !user.status.success() && said.contains("[grants] allow (it lists none)"),
        "{said}"
    );
    let root = d.cli(&["call", "--allow", &host, "--", &curl]);
    assert!(root.status.success(), "{}", text(&root));
    assert!(
        String::from_utf8_lossy(&root.stdout).contains("hello /by-root"),
        "{}",
        text(&root)
    );
}

#[test]
fn a_symlink_the_caller_planted_to_a_root_only_file_is_refused() {
    let Some((d, ws)) = setup("") else { return };
    let secret = root_only(&d);
    // Readable by everyone, but in root's 0700 directory: the caller cannot reach it.
    std::fs::set_permissions(
        secret.join("secret"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    // A 0600 root file in a directory everyone may enter.
    let open = dir(&d, "root-open", 0, 0o755);
    std::fs::write(open.join("secret"), SECRET).unwrap();
    std::fs::set_permissions(open.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let mine = dir(&d, "links-1000", USER, 0o755);
    for (name, to) in [
        ("to-dir", secret.clone()),
        ("to-file", secret.join("secret")),
        ("to-0600", open.join("secret")),
        ("to-state", d.state_dir.clone()),
    ] {
        let link = mine.join(name);
        std::os::unix::fs::symlink(&to, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(USER), Some(USER)).unwrap();
        let l = link.to_str().unwrap();
        let out = as_user(&d, &ws, &["call", "--read", l, "--", "cat", l]);
        let said = text(&out);
        assert!(
            !out.status.success(),
            "--read {l} -> {}: {said}",
            to.display()
        );
        assert!(said.contains(l), "the refusal does not name {l}: {said}");
        assert!(!said.contains(SECRET), "{said}");
    }
    // A writable grant that is a symlink, even to the caller's own directory.
    let own = dir(&d, "own-1000", USER, 0o755);
    let link = mine.join("to-own");
    std::os::unix::fs::symlink(&own, &link).unwrap();
    let l = link.to_str().unwrap();
    let out = as_user(&d, &ws, &["call", "--write", l, "--", "true"]);
    assert!(
        !out.status.success() && text(&out).contains("symlink"),
        "{}",
        text(&out)
    );
    assert_secret_nowhere(&d);
}

#[test]
fn a_runs_bridge_grants_no_more_than_the_run_was_granted() {
    if skip_without(&[Need::Python3]) {
        return;
    }
    let Some((d, ws)) = setup("") else { return };
    let granted = dir(&d, "granted-1000", USER, 0o700);
    std::fs::write(granted.join("f"), "through-the-bridge\n").unwrap();
    std::os::unix::fs::chown(granted.join("f"), Some(USER), Some(USER)).unwrap();
    let other = dir(&d, "other-1000", USER, 0o700);
    let g = granted.to_str().unwrap();
    let o = other.to_str().unwrap();
    let code = format!(
        r#"
r = tools.call("bash", {{"command": "cat {g}/f"}}, grants={{"readable": ["{g}"]}})
print("nested:", r["output"].strip())
for grants in ({{"readable": ["{o}"]}}, {{"writable": ["{g}"]}}, {{"allow": ["example.org"]}}):
    try:
        tools.call("bash", {{"command": "true"}}, grants=grants)
        print("widened:", grants)
    except tools.ToolError as e:
        print("refused:", e)
"#
    );
    let args = serde_json::json!({"language": "python", "code": code}).to_string();
    let out = as_user(
        &d,
        &ws,
        &["call", "--read", g, "--tool", "code", "--args", &args],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("nested: through-the-bridge"), "{said}");
    assert!(!said.contains("widened"), "{said}");
    assert_eq!(
        said.matches("refused:").count(),
        3,
        "each wider grant should be refused: {said}"
    );
    assert!(said.contains("was not granted"), "{said}");
}
