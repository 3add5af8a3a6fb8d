//! One root daemon serving a host's users: a user with no daemon of their own reaches the
//! shared one on the system socket, and says so.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use sidejob_tests::{sidejob_bin, skip_unless, Daemon, NOBODY};

const SYSTEM_SOCKET: &str = "/run/sidejob/sidejob.sock";

/// `sidejob ARGS` as uid 65534 with a bare environment: no `SIDEJOB_SOCKET`, no
/// `XDG_RUNTIME_DIR`, so the CLI looks for the user's own socket, then the system one.
fn as_nobody(workspace: &Path, args: &[&str]) -> std::process::Output {
    Command::new(sidejob_bin())
        .args(args)
        .current_dir(workspace)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .output()
        .expect("run sidejob as uid 65534")
}

#[test]
fn a_user_without_a_daemon_of_their_own_reaches_the_shared_one() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Root]) {
        return;
    }
    let _lock = sidejob_tests::host::HostLock::take("system-paths");
    if skip_unless(
        !Path::new(SYSTEM_SOCKET).exists(),
        "a daemon already listens on /run/sidejob/sidejob.sock on this host",
    ) {
        return;
    }
    if skip_unless(
        !Path::new(&format!("/tmp/sidejob-{NOBODY}/sidejob.sock")).exists(),
        "uid 65534 has a daemon of its own here",
    ) {
        return;
    }
    let mut d = Daemon::prepare("");
    d.socket = SYSTEM_SOCKET.into();
    d.launch();
    d.let_everyone_connect();
    let ws = d.nobody_workspace("ws");
    let status = as_nobody(&ws, &["status"]);
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{status:?}");
    assert!(
        out.contains(SYSTEM_SOCKET) && out.contains("shared system daemon"),
        "status does not say which daemon it used:\n{out}"
    );
    let call = as_nobody(&ws, &["call", "--", "echo", "from-a-group-member"]);
    assert!(call.status.success(), "{call:?}");
    assert_eq!(
        String::from_utf8_lossy(&call.stdout),
        "from-a-group-member\n"
    );
    drop(d);
    let _ = std::fs::remove_file(SYSTEM_SOCKET);
    let _ = std::fs::remove_dir("/run/sidejob");
}

#[test]
fn call_profile_runs_under_a_profile_wider_than_the_default_and_tasks_shows_it() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Python3]) {
        return;
    }
    let d = Daemon::start();
    // `python` widens the default profile (its toolchain's paths): before, a call could
    // only narrow its session's profile, so this was refused.
    let out = d.cli(&[
        "call",
        "--profile",
        "python",
        "--",
        "python3",
        "-c",
        "print(6 * 7)",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    // The directory's default session is untouched by it.
    let plain = d.cli(&["call", "--", "echo", "plain"]);
    assert!(plain.status.success(), "{plain:?}");
    let tasks = String::from_utf8_lossy(&d.cli(&["tasks"]).stdout).into_owned();
    let line = |needle: &str| {
        tasks
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no task {needle}:\n{tasks}"))
            .to_owned()
    };
    assert!(line("print(6 * 7)").contains(" python "), "{tasks}");
    assert!(line("echo plain").contains(" workspace-write "), "{tasks}");
    assert!(tasks.lines().next().unwrap().contains("PROFILE"), "{tasks}");
}

#[test]
fn an_unprivileged_exec_refused_for_cgroups_is_told_how_to_delegate_one() {
    if sidejob_tests::skip_without(&[
        sidejob_tests::Need::Root,
        sidejob_tests::Need::UserNamespaces,
    ]) {
        return;
    }
    let ws = sidejob_tests::TempDir::new("exec-ci");
    std::os::unix::fs::chown(ws.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    let out = as_nobody(ws.path(), &["exec", "--profile", "ci", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("cgroup_memory") && err.contains("systemd-run --user --scope -p Delegate=yes"),
        "the refusal names no fix:\n{err}"
    );
}

#[test]
fn a_run_keeps_the_callers_supplementary_groups() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Root]) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    // A project shared through a group: root's directory, group-writable for group 4242,
    // which uid 65534 is a member of (as `SO_PEERGROUPS` says at connect).
    const TEAM: u32 = 4242;
    let d = Daemon::start();
    d.let_everyone_connect();
    let ws = d.root.path().join("team-project");
    std::fs::create_dir_all(&ws).unwrap();
    std::os::unix::fs::chown(&ws, Some(0), Some(TEAM)).unwrap();
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o2770)).unwrap();
    let stream =
        sidejob_tests::connect_with_groups(&d.socket, NOBODY, NOBODY, &[NOBODY, TEAM]).unwrap();
    let mut c = sidejob_tests::Client::from_stream(stream);
    let s = c.open_session_in(&ws);
    let r = c.bash(
        &s,
        "id -G; echo shared > written-by-the-team && echo wrote",
        serde_json::json!({}),
    );
    assert_eq!(
        r["exit_code"], 0,
        "the member could not write its group's workspace: {r}"
    );
    let out = r["output"].as_str().unwrap();
    assert!(out.split_whitespace().any(|g| g == "4242"), "{out}");
    let made = ws.join("written-by-the-team");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "shared\n");
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&made).unwrap()),
        NOBODY
    );
    // Control: the same user without the group cannot write there.
    let mut outsider = d.nobody();
    let s = outsider.open_session_in(&ws);
    let r = outsider.bash(&s, "echo x > by-an-outsider", serde_json::json!({}));
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(!ws.join("by-an-outsider").exists());
}

/// The shell commands of the README's shared-daemon section ("### One daemon for a host's
/// users"), its first ```sh block, line by line.
fn readme_shared_daemon_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let at = readme
        .find("### One daemon for a host's users")
        .expect("README.md has no section \"### One daemon for a host's users\"");
    let section = &readme[at..];
    let start = section
        .find("```sh\n")
        .expect("a ```sh block in the section")
        + "```sh\n".len();
    let end = start + section[start..].find("```").expect("the block's end");
    section[start..end].lines().map(str::to_owned).collect()
}

/// A user and group made for one test (`useradd`/`groupadd`), removed with what the
/// README's commands created on the system paths (each absent before: the test checks).
struct Host {
    users: Vec<String>,
    group: String,
    daemon: Option<std::process::Child>,
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            // The daemon's shell and the daemon share a process group of their own.
            sidejob_tests::signal(-(d.id() as i32), libc::SIGTERM);
            let _ = d.wait();
        }
        // The socket's directory may be shared with other tests' daemons: only when empty.
        let _ = std::fs::remove_file(SYSTEM_SOCKET);
        let _ = std::fs::remove_dir("/run/sidejob");
        for p in ["/var/lib/sidejob", "/etc/sidejob"] {
            let _ = std::fs::remove_dir_all(p);
        }
        for u in &self.users {
            let _ = Command::new("userdel").args(["-r", u]).output();
        }
        let _ = Command::new("groupdel").arg(&self.group).output();
    }
}

fn sh(script: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .env_remove("SIDEJOB_SOCKET")
        .env_remove("SIDEJOB_STATE_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("sh")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_readme_shared_daemon_section_works_as_written_for_a_new_group_member() {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Root]) {
        return;
    }
    let _lock = sidejob_tests::host::HostLock::take("system-paths");
    for p in [SYSTEM_SOCKET, "/var/lib/sidejob", "/etc/sidejob"] {
        if skip_unless(
            !Path::new(p).exists(),
            &format!("{p} exists on this host: the README's commands would change it"),
        ) {
            return;
        }
    }
    let tag = format!("sjt{}", std::process::id() % 1_000_000);
    let (user, other, group) = (format!("{tag}a"), format!("{tag}b"), format!("{tag}g"));
    let mut host = Host {
        users: vec![user.clone(), other.clone()],
        group: group.clone(),
        daemon: None,
    };
    for u in [&user, &other] {
        let o = sh(&format!("useradd -m -U {u}"));
        assert!(o.status.success(), "useradd: {}", text(&o));
    }
    // The README's commands, with this test's names for its group and user ("sidejob",
    // "alice"), the built binary first on PATH, and `sudo` as nothing more than root's own
    // shell (the test is root; sudo may not be installed).
    let bin_dir = sidejob_bin()
        .parent()
        .expect("bin dir")
        .display()
        .to_string();
    let lines: Vec<String> = readme_shared_daemon_commands()
        .into_iter()
        .map(|l| {
            l.replace("groupadd -f sidejob", &format!("groupadd -f {group}"))
                .replace("-aG sidejob ", &format!("-aG {group} "))
                .replace(
                    "socket_group = \"sidejob\"",
                    &format!("socket_group = \"{group}\""),
                )
                .replace("alice", &user)
        })
        .collect();
    let joined = lines.join("\n");
    assert!(
        joined.contains(&format!("groupadd -f {group}"))
            && joined.contains(&format!("usermod -aG {group} {user}"))
            && joined.contains(&format!("socket_group = \"{group}\"")),
        "the README's shared-daemon section no longer makes the group, adds the user to it and names it as socket_group:\n{joined}"
    );
    let as_user_from = lines
        .iter()
        .position(|l| l.trim_start().starts_with("# as "))
        .expect("a \"# as alice\" line between root's commands and the user's");
    let root_prelude = format!("sudo() {{ \"$@\"; }}; PATH={bin_dir}:$PATH; set -e");
    let mut daemon_started = false;
    for line in lines[..as_user_from]
        .iter()
        .filter(|l| !l.trim().is_empty())
    {
        if line.contains("sidejob serve") {
            // The daemon runs until stopped: in the background here, as in its own terminal.
            use std::os::unix::process::CommandExt;
            let log = std::fs::File::create(std::env::temp_dir().join(format!("{tag}-daemon.log")))
                .expect("daemon log");
            host.daemon = Some(
                Command::new("sh")
                    .arg("-c")
                    // `sudo` execs here, so that the daemon is this child and stops with it.
                    .arg(format!(
                        "sudo() {{ exec \"$@\"; }}; PATH={bin_dir}:$PATH; {line}"
                    ))
                    .env_remove("SIDEJOB_SOCKET")
                    .env_remove("SIDEJOB_STATE_DIR")
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().expect("log"))
                    .stderr(log)
                    .process_group(0)
                    .spawn()
                    .expect("start the daemon"),
            );
            assert!(
                sidejob_tests::wait_until(std::time::Duration::from_secs(20), || {
                    std::os::unix::net::UnixStream::connect(SYSTEM_SOCKET).is_ok()
                }),
                "the README's daemon did not listen on {SYSTEM_SOCKET}"
            );
            daemon_started = true;
            continue;
        }
        let o = sh(&format!("{root_prelude}; {line}"));
        assert!(o.status.success(), "{line}: {}", text(&o));
    }
    assert!(daemon_started, "the section starts no daemon:\n{joined}");
    // Another user, a member of the group too, for what members cannot see of each other.
    let o = sh(&format!("usermod -aG {group} {other}"));
    assert!(o.status.success(), "{}", text(&o));
    // The user's project, for `make test`.
    let home = sh(&format!("getent passwd {user} | cut -d: -f6"));
    let project = format!("{}/project", String::from_utf8_lossy(&home.stdout).trim());
    let o = sh(&format!(
        "mkdir {project} && printf 'test:\\n\\t@echo all $$((6*7)) tests passed\\n' > {project}/Makefile && chown -R {user}:{user} {project}"
    ));
    assert!(o.status.success(), "{}", text(&o));
    // The user's commands, each in a new login (`su -l`: the new group applies), with no
    // daemon of their own.
    let as_login = |who: &str, line: &str| {
        Command::new("su")
            .args(["-l", who, "-c"])
            .arg(format!(
                "PATH={bin_dir}:$PATH; cd {project} 2>/dev/null || cd; {line}"
            ))
            .stdin(Stdio::null())
            .output()
            .expect("su")
    };
    let mut shown = Vec::new();
    for line in lines[as_user_from + 1..]
        .iter()
        .filter(|l| !l.trim().is_empty())
    {
        let o = as_login(&user, line);
        assert!(o.status.success(), "{line} as {user}: {}", text(&o));
        shown.push((
            line.clone(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        ));
    }
    let output_of = |cmd: &str| {
        shown
            .iter()
            .find(|(l, _)| l.starts_with(cmd))
            .map(|(_, o)| o.clone())
            .unwrap_or_else(|| panic!("the section runs no {cmd:?}:\n{joined}"))
    };
    let status = output_of("sidejob status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("socket") && l.contains(SYSTEM_SOCKET))
            && status.contains("shared system daemon"),
        "{status}"
    );
    assert_eq!(output_of("sidejob call"), "all 42 tests passed\n");
    // The run's files are the user's to read, from the host, with their own credentials;
    // another member of the group cannot.
    let uid = sh(&format!("id -u {user}"));
    let uid = String::from_utf8_lossy(&uid.stdout).trim().to_owned();
    let find = sh(&format!(
        "find /var/lib/sidejob/sessions -path '*/cli-{uid}-*' -name output.log"
    ));
    let output_log = String::from_utf8_lossy(&find.stdout).trim().to_owned();
    assert!(
        output_log.starts_with("/var/lib/sidejob/sessions/") && !output_log.contains('\n'),
        "{}",
        text(&find)
    );
    let result_json = Path::new(&output_log).with_file_name("result.json");
    let result_json = result_json.display();
    let own = as_login(&user, &format!("cat {output_log} {result_json}"));
    let own_text = String::from_utf8_lossy(&own.stdout);
    assert!(
        own.status.success()
            && own_text.contains("all 42 tests passed")
            && own_text.contains(&format!("\"output_path\": \"{output_log}\"")),
        "{}",
        text(&own)
    );
    for file in [output_log.clone(), result_json.to_string()] {
        let theirs = as_login(&other, &format!("cat {file}"));
        assert!(
            !theirs.status.success() && text(&theirs).contains("Permission denied"),
            "{other} could read {file}: {}",
            text(&theirs)
        );
    }
    drop(host);
    assert!(!Path::new(SYSTEM_SOCKET).exists());
}
