//! The spawner (ARCHITECTURE.md): supervisors are forked by a process the daemon started
//! once, yet each is the daemon's own child, and a spawner that dies loses no run.

use std::time::Duration;

use serde_json::json;
use sidejob_tests::{pids_mentioning, signal, wait_until, Daemon, Gate};

/// Field `n` (1-based, as in proc(5)) of `/proc/<pid>/stat`, or `None` once the process
/// is gone (a listed process may exit, and be reaped, before its stat is read).
fn stat_field(pid: i32, n: usize) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')').expect("comm").1;
    let field = after.split_whitespace().nth(n - 3).expect("the field");
    Some(field.parse().expect("a number"))
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The live spawner of a daemon: its command line names the daemon's runs directory (as
/// do the supervisors it forked, which are named `sidejob-run`).
fn spawners(d: &Daemon) -> Vec<i32> {
    let needle = format!(
        "spawner {}",
        sidejob_tests::runs_dir(&d.state_dir).display()
    );
    pids_mentioning(&needle)
        .into_iter()
        .filter(|p| stat_field(*p, 4) == Some(d.pid() as i64) && comm(*p) == "sidejob")
        .collect()
}

fn supervisor_of(d: &Daemon, task_id: &str) -> i32 {
    sidejob_tests::supervisor_pid(&d.private_dir(task_id))
}

#[test]
fn a_supervisor_is_the_daemons_child_in_a_process_group_of_its_own() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let gate = Gate::new(&d.workspace, "held");
    let r = c.bash(
        &s,
        &format!("echo started; {}", gate.wait_cmd()),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("id").to_owned();
    let sup = supervisor_of(&d, &id);
    // The command runs: the supervisor is past its set-up (descriptors, process group).
    c.wait_for_output(&id, "started");
    // Forked by the spawner, yet the daemon's child: it reaps it and watches its pidfd.
    // It keeps the spawner's command line, and is named for what it is.
    assert_eq!(comm(sup), "sidejob-run", "the name of supervisor {sup}");
    assert_eq!(spawners(&d).len(), 1, "one spawner");
    assert_eq!(
        stat_field(sup, 4),
        Some(d.pid() as i64),
        "parent of supervisor {sup}"
    );
    assert_eq!(
        stat_field(sup, 5),
        Some(sup as i64),
        "process group of supervisor {sup}"
    );
    // Its descriptors are the five it is given and its own: nothing of the spawner's.
    let spawner_socket = std::fs::read_link(format!("/proc/{}/fd/16", spawners(&d)[0]))
        .expect("the spawner's socket");
    for fd in std::fs::read_dir(format!("/proc/{sup}/fd"))
        .expect("fds")
        .flatten()
    {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        assert_ne!(
            target, spawner_socket,
            "supervisor {sup} holds the spawner's socket"
        );
    }
    gate.open();
    let t = c.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    // Reaped by the daemon, not left a zombie.
    assert!(
        wait_until(Duration::from_secs(10), || !std::path::Path::new(&format!(
            "/proc/{sup}"
        ))
        .exists()),
        "supervisor {sup} was not reaped"
    );
}

#[test]
fn a_spawner_that_dies_loses_no_run_and_is_started_again() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "echo one", json!({}));
    assert_eq!(r["output"], "one\n", "{r}");
    let first = spawners(&d);
    assert_eq!(first.len(), 1, "{first:?}");
    signal(first[0], libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || spawners(&d)
        .iter()
        .all(|p| !first.contains(p))));
    // The next run's supervisor is started directly, and the one after through a new
    // spawner; every run goes through as if nothing had happened.
    for word in ["two", "three", "four"] {
        let r = c.bash(&s, &format!("echo {word}"), json!({}));
        assert_eq!(r["state"], "succeeded", "{r}");
        assert_eq!(r["output"], format!("{word}\n"), "{r}");
    }
    let now = spawners(&d);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, first);
}

/// Kills the daemon's spawner with `strace` fault injection on the `nth` (1-based) `call` it
/// makes from now on, as it makes it (the call is not made). Returns once it is attached.
fn kill_spawner_at(d: &Daemon, call: &str, nth: u32) -> std::process::Child {
    let spawner = spawners(d)[0];
    let strace = std::process::Command::new("strace")
        .args(["-qq", "-o", "/dev/null", "-e", &format!("trace={call}")])
        .arg("-e")
        .arg(format!("inject={call}:error=EIO:signal=SIGKILL:when={nth}"))
        .args(["-p", &spawner.to_string()])
        .spawn()
        .expect("strace");
    let traced = || {
        std::fs::read_to_string(format!("/proc/{spawner}/status")).is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0"))
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), traced),
        "strace did not attach"
    );
    strace
}

/// A daemon whose spawner is killed at the first `call` it makes once it is up (see
/// [`kill_spawner_at`]), and the run that call served: it succeeds, and its command (which
/// records each time it runs, in the workspace) ran once. Returns the daemon, a client, the
/// session and the spawner that was killed; `None` when the test is skipped.
fn one_run_with_the_spawner_killed_at(
    call: &str,
) -> Option<(Daemon, sidejob_tests::Client, String, Vec<i32>)> {
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Root, sidejob_tests::Need::Strace]) {
        return None;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "echo one", json!({}));
    assert_eq!(r["output"], "one\n", "{r}");
    let killed = spawners(&d);
    let mut strace = kill_spawner_at(&d, call, 1);
    let r = c.bash(&s, "echo ran >> count; echo ran", json!({}));
    assert_eq!(r["state"], "succeeded", "{r}");
    assert_eq!(r["output"], "ran\n", "{r}");
    // A second copy of the run, had one been started behind the daemon's back, would be done
    // by now too.
    std::thread::sleep(Duration::from_millis(300));
    let count = std::fs::read_to_string(d.workspace.join("count")).unwrap_or_default();
    assert_eq!(count.lines().count(), 1, "the command ran more than once");
    let _ = strace.wait();
    Some((d, c, s, killed))
}

/// The spawner is killed after it forked and wrote the pid file, as it sends its reply: the
/// daemon finds the supervisor by that file, and the run goes through, once.
#[test]
fn a_spawner_killed_before_its_reply_loses_no_run() {
    let Some((d, mut c, s, killed)) = one_run_with_the_spawner_killed_at("sendto") else {
        return;
    };
    let r = c.bash(&s, "echo after", json!({}));
    assert_eq!(r["output"], "after\n", "{r}");
    assert_ne!(spawners(&d), killed, "the spawner was not started again");
}

/// The spawner is killed after its fork, before it wrote the pid file (at its first write):
/// the supervisor it forked runs nothing, the daemon starts one directly, and the command
/// runs once.
#[test]
fn a_spawner_killed_before_its_pid_file_runs_the_command_once() {
    let Some((d, ..)) = one_run_with_the_spawner_killed_at("write") else {
        return;
    };
    // The supervisor the spawner forked is the daemon's unreaped child (the daemon never
    // heard of it): it exited with 2 at the missing go-ahead, having started nothing. (Let
    // go ahead, it runs the command beside the one the daemon started, and exits with 0.)
    let tree = sidejob_tests::children_by_parent();
    let forked: Vec<i32> = tree
        .get(&(d.pid() as i32))
        .into_iter()
        .flatten()
        .copied()
        .filter(|p| comm(*p) == "sidejob-run")
        .collect();
    assert_eq!(forked.len(), 1, "{forked:?}");
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", forked[0])).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("comm")
        .1
        .split_whitespace()
        .collect();
    assert_eq!(fields[0], "Z", "the forked supervisor is not gone: {stat}");
    // Field 52 of proc(5), the exit status as waitpid reports it.
    assert_eq!(fields.last(), Some(&"512"), "its exit status: {stat}");
}
