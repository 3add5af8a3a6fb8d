//! The network namespace of a run whose network is off (docs/security.md): the runs of one
//! session share one empty namespace, apart from the host's and from every other session's
//! and user's; within it, landlock still keeps each run from the others' abstract sockets.
//! A `sidejob exec` run has an empty namespace of its own. Needs root (the daemon makes these
//! namespaces only as root).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

use serde_json::{json, Value};
use sidejob_tests::{skip_without, Client, Daemon, Need};

use crate::containment::{exec, exec_command, probe_bin, Ws};
use crate::isolation::NOBODY;

fn daemon() -> Option<Daemon> {
    if skip_without(&[Need::Root]) {
        return None;
    }
    let d = Daemon::start_with_config(&format!("socket_group = \"{NOBODY}\"\n"));
    let probe = d.workspace.join("probe");
    std::fs::copy(probe_bin(), &probe).expect("copy probe");
    Some(d)
}

/// A foreground run's output, once it succeeded.
fn run(c: &mut Client, session: &str, command: &str) -> String {
    let r = c.bash(session, command, json!({"yield_after_ms": 60_000}));
    assert_eq!(r["state"], "succeeded", "{command}: {r}");
    r["output"].as_str().expect("output").to_owned()
}

/// The network namespace a run of `session` is in (`net:[inode]`).
fn netns_of(c: &mut Client, session: &str) -> String {
    run(c, session, "readlink /proc/self/ns/net")
        .trim()
        .to_owned()
}

/// The probe's report, from a run that may fail.
fn probe(c: &mut Client, d: &Daemon, session: &str, args: &str) -> Value {
    let r = c.bash(
        session,
        &format!("{}/probe {args}", d.workspace.display()),
        json!({"yield_after_ms": 60_000}),
    );
    let out = r["output"].as_str().unwrap_or_default();
    out.lines()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or_else(|| panic!("no probe report for {args}: {r}"))
}

#[test]
fn offline_runs_share_one_empty_namespace_with_their_own_session_only() {
    let Some(d) = daemon() else { return };
    let host = std::fs::read_link("/proc/self/ns/net")
        .expect("host namespace")
        .display()
        .to_string();
    let mut c = d.client();
    let s1 = d.open_session(&mut c);
    let s2 = d.open_session(&mut c);
    let first = netns_of(&mut c, &s1);
    assert!(first.starts_with("net:["), "{first}");
    assert_ne!(
        first, host,
        "a run whose network is off is in the host's namespace"
    );
    // The session's next run, in the foreground or the background, joins the same one.
    assert_eq!(netns_of(&mut c, &s1), first);
    let bg = c.bash(
        &s1,
        "readlink /proc/self/ns/net",
        json!({"background": true}),
    );
    let id = bg["task_id"].as_str().expect("task id").to_owned();
    assert_eq!(c.wait_settled(&id)["state"], "succeeded");
    assert_eq!(c.output(&id).trim(), first);
    // Another session of the same user has one of its own, and so has another user.
    let other = netns_of(&mut c, &s2);
    assert_ne!(other, first);
    assert_ne!(other, host);
    let mut n = d.nobody();
    let ns = n.open_session_in(&d.nobody_workspace("nobody-ws"));
    let theirs = netns_of(&mut n, &ns);
    for seen in [&first, &other, &host] {
        assert_ne!(&theirs, seen, "uid {NOBODY}'s run shares a namespace");
    }

    // Empty: no interface but the loopback, none of the host's sockets.
    let dev = run(&mut c, &s1, "cat /proc/net/dev");
    let interfaces: Vec<&str> = dev
        .lines()
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
        .collect();
    assert_eq!(interfaces, ["lo"], "{dev}");
    // lo is down: it has no address (IPv6 lists the addresses of interfaces that are up).
    let host_v6 = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
    if host_v6.lines().any(|l| l.ends_with(" lo")) {
        let v6 = run(&mut c, &s1, "cat /proc/net/if_inet6");
        assert_eq!(v6.trim(), "", "lo is up");
    }
    let name = format!("sidejob-netns-host-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("address");
    let _held = UnixListener::bind_addr(&addr).expect("a host socket");
    let host_unix = std::fs::read_to_string("/proc/net/unix").expect("host sockets");
    assert!(host_unix.contains(&name), "control: the host lists @{name}");
    let inside = run(&mut c, &s1, "cat /proc/net/unix");
    assert!(!inside.contains(&name), "{inside}");
    assert!(
        inside.lines().count() <= 2,
        "another run's sockets: {inside}"
    );
}

#[test]
fn an_abstract_socket_stays_with_its_run() {
    let Some(d) = daemon() else { return };
    let mut c = d.client();
    let s1 = d.open_session(&mut c);
    let s2 = d.open_session(&mut c);
    let name = format!("sidejob-netns-test-{}", std::process::id());
    let listener = c.bash(
        &s1,
        &format!("{}/probe abstract-listen {name} 120", d.workspace.display()),
        json!({"background": true}),
    );
    let listener = listener["task_id"].as_str().expect("task id").to_owned();
    c.wait_for_output(&listener, "listening");

    // The session's next run shares the namespace: the name is taken there...
    let r = probe(&mut c, &d, &s1, &format!("abstract-listen {name} 0"));
    assert_eq!(r["errno"], libc::EADDRINUSE, "{r}");
    // ...and landlock keeps it from connecting all the same.
    let r = probe(&mut c, &d, &s1, &format!("abstract {name}"));
    assert_eq!(r["errno"], libc::EPERM, "{r}");
    // Another session's run and the host do not see the name at all.
    let r = probe(&mut c, &d, &s2, &format!("abstract {name}"));
    assert_eq!(r["errno"], libc::ECONNREFUSED, "{r}");
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("address");
    let e = UnixStream::connect_addr(&addr).expect_err("the host reached the run's socket");
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");

    // The listener's side: nobody ever connected.
    c.ok("task.cancel", json!({"task_id": listener, "grace_ms": 0}));
    c.wait_settled(&listener);
    let out = c.output(&listener);
    assert!(!out.contains("accepted"), "{out}");
}

#[test]
fn an_exec_run_has_an_empty_namespace_of_its_own() {
    let Some(ws) = Ws::new() else { return };
    let host = std::fs::read_link("/proc/self/ns/net")
        .expect("host namespace")
        .display()
        .to_string();
    let name = format!("sidejob-netns-exec-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("address");
    let held = UnixListener::bind_addr(&addr).expect("a host socket");
    let script =
        "readlink /proc/self/ns/net; echo ---; cat /proc/net/dev; echo ---; cat /proc/net/unix";
    let out = exec(&ws, &[], &["sh", "-c", script]);
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    let parts: Vec<&str> = out.stdout.split("---\n").collect();
    let [ns, dev, unix] = parts[..] else {
        panic!("{}", out.stdout)
    };
    assert!(ns.trim().starts_with("net:["), "{ns}");
    assert_ne!(ns.trim(), host, "an exec run is in the host's namespace");
    let interfaces: Vec<&str> = dev
        .lines()
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
        .collect();
    assert_eq!(interfaces, ["lo"], "{dev}");
    assert!(!unix.contains(&name), "the host's socket is listed: {unix}");
    drop(held);

    // A name the run binds stays in its namespace: the host cannot reach it.
    let mut listener = exec_command(&ws, &[], &[&ws.probe(), "abstract-listen", &name, "60"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sidejob exec");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(listener.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("the run's first line");
    assert_eq!(line.trim(), "listening");
    let reached = UnixStream::connect_addr(&addr);
    // SAFETY: a signal to our own child, which we reap next. SIGINT lets exec clean up.
    unsafe { libc::kill(listener.id() as i32, libc::SIGINT) };
    let _ = listener.wait();
    let e = reached.expect_err("the host reached the run's socket");
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
}

/// `sidejob exec` has its namespace made ahead of the run, by a child of its own: each run
/// still gets one of its own, never another's, including when they overlap, with or without
/// loopback.
#[test]
fn overlapping_exec_runs_never_share_a_namespace() {
    let Some(ws) = Ws::new() else { return };
    let script = "readlink /proc/self/ns/net; sleep 1";
    let spawn = |extra: &[&str]| {
        exec_command(&ws, extra, &["sh", "-c", script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sidejob exec")
    };
    let children = [
        spawn(&[]),
        spawn(&[]),
        spawn(&["--profile", "ci-net"]),
        spawn(&["--allow", "example.com"]),
    ];
    let mut seen = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("sidejob exec");
        let ns = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(out.status.success() && ns.starts_with("net:["), "{ns}");
        seen.push(ns);
    }
    let host = std::fs::read_link("/proc/self/ns/net").expect("host namespace");
    let host = host.display().to_string();
    for (i, ns) in seen.iter().enumerate() {
        assert_ne!(*ns, host, "run {i} is in the host's namespace");
        assert!(
            !seen[..i].contains(ns),
            "two overlapping runs share {ns}: {seen:?}"
        );
    }
}
