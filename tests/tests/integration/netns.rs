//! The network namespace of a run whose network is off (docs/security.md): the runs of one
//! session share one empty namespace, apart from the host's and from every other session's
//! and user's; within it, landlock still keeps each run from the others' abstract sockets.
//! Root's `sidejob exec` runs share one per workspace, kept on the host between runs. Needs
//! root (only root makes these namespaces).

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
fn an_exec_run_has_an_empty_namespace_apart_from_the_hosts() {
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

/// Where root's `sidejob exec` keeps the offline namespaces its runs share.
const KEPT: &str = "/run/sidejob-exec";

/// The namespace of each of these exec runs in `ws` (`net:[inode]`), started together so
/// that they overlap.
fn exec_namespaces(runs: &[(&Ws, &[&str])]) -> Vec<String> {
    let script = "readlink /proc/self/ns/net; sleep 1";
    let children: Vec<_> = runs
        .iter()
        .map(|(ws, extra)| {
            exec_command(ws, extra, &["sh", "-c", script])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("sidejob exec")
        })
        .collect();
    let host = std::fs::read_link("/proc/self/ns/net").expect("host namespace");
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().expect("sidejob exec");
            let ns = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            assert!(out.status.success() && ns.starts_with("net:["), "{ns}");
            assert_ne!(
                ns,
                host.display().to_string(),
                "a run in the host's namespace"
            );
            ns
        })
        .collect()
}

/// The kept namespaces on the host: mount point and namespace (`net:[inode]`), from the
/// host's mount table.
fn kept_on_host() -> Vec<(String, String)> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(4)?.starts_with(&format!("{KEPT}/")) && f.get(3)?.starts_with("net:["))
                .then(|| (f[4].to_owned(), f[3].to_owned()))
        })
        .collect()
}

/// Root's offline exec runs in one workspace share one empty namespace, kept on the host for
/// the next: apart from the host's, from another workspace's, and from every run with a
/// loopback or an allow-list (those each have their own).
#[test]
fn exec_runs_of_one_workspace_share_a_kept_namespace_and_no_other() {
    let Some(ws) = Ws::new() else { return };
    let Some(other) = Ws::new() else { return };
    let _kept = sidejob_tests::host::HostLock::take("exec-netns");
    let seen = exec_namespaces(&[
        (&ws, &[]),
        (&ws, &[]),
        (&other, &[]),
        (&ws, &["--profile", "ci-net"]),
        (&ws, &["--allow", "example.com"]),
    ]);
    assert_eq!(seen[0], seen[1], "one workspace's runs: {seen:?}");
    for (i, ns) in seen.iter().enumerate().skip(2) {
        assert!(
            !seen[..i].contains(ns),
            "run {i} shares {ns} with another: {seen:?}"
        );
    }
    // Both offline namespaces are kept on the host, for the workspace's next run.
    let kept = kept_on_host();
    for ns in &seen[1..3] {
        assert!(kept.iter().any(|(_, k)| k == ns), "{ns} not kept: {kept:?}");
    }
    let next = exec_namespaces(&[(&ws, &[])]);
    assert_eq!(next[0], seen[0], "the workspace's next run");
}

/// A kept namespace no run joined for ten minutes is let go when the next one is made, with
/// the marks no namespace is left for; runs never take one from a directory that is not
/// root's alone.
#[test]
fn exec_lets_go_of_idle_namespaces_and_trusts_only_roots_directory() {
    let Some(ws) = Ws::new() else { return };
    let Some(other) = Ws::new() else { return };
    let _kept = sidejob_tests::host::HostLock::take("exec-netns");
    let first = exec_namespaces(&[(&ws, &[])]).remove(0);
    let (point, _) = kept_on_host()
        .into_iter()
        .find(|(_, ns)| *ns == first)
        .expect("the workspace's namespace is kept");
    // Held open here, so that once it is let go its inode number is not handed to the next
    // namespace made (the kernel reuses the numbers of freed namespaces at once).
    let _first_held = std::fs::File::open(&point).expect("open the kept namespace");
    // Last joined eleven minutes ago.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(660);
    std::fs::File::options()
        .write(true)
        .open(format!("{point}.used"))
        .and_then(|f| f.set_modified(old))
        .expect("age the mark");
    // Marks without a namespace: one whose namespace was unmounted by hand, idle as long,
    // and one nothing reads.
    let orphan = format!("{KEPT}/net-0-0-unmounted-by-hand.used");
    let unread = format!("{KEPT}/mnt-bare.used");
    for mark in [&orphan, &unread] {
        std::fs::File::create(mark)
            .and_then(|f| f.set_modified(old))
            .expect("a mark");
    }
    // Another workspace's first run makes its own, and lets go of the idle one.
    exec_namespaces(&[(&other, &[])]);
    for mark in [&orphan, &unread, &format!("{point}.used")] {
        assert!(!std::path::Path::new(mark).exists(), "{mark} is left");
    }
    let kept = kept_on_host();
    assert!(
        !kept.iter().any(|(p, _)| *p == point),
        "the idle namespace is still kept: {kept:?}"
    );
    assert!(!std::path::Path::new(&point).exists(), "{point} is left");
    let again = exec_namespaces(&[(&ws, &[])]).remove(0);
    assert_ne!(again, first, "the namespace let go of was joined again");

    // Handed to another user, the directory is not used: each run makes its own.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(KEPT).expect("the directory");
    std::os::unix::fs::chown(KEPT, Some(NOBODY), None).expect("chown");
    let apart = exec_namespaces(&[(&ws, &[]), (&ws, &[])]);
    std::os::unix::fs::chown(KEPT, Some(meta.uid()), None).expect("chown back");
    assert_ne!(apart[0], apart[1], "runs shared a namespace from {KEPT}");
    assert!(!apart.contains(&again), "{apart:?} joined {again}");
}
