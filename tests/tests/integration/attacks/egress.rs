//! Attacks on the egress proxy of a root daemon (issue 32): uid 65534's allow-list runs
//! hold tunnels open past their end and past any share, trickle a request head, and make
//! the refusals the proxy used to leave out of `result.json`. The side effects are checked
//! on the host: the daemon's open descriptors in `/proc/<pid>/fd`, what the allowed server
//! was asked and when, the run's `result.json`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use sidejob_tests::net::HttpServer;
use sidejob_tests::{skip_without, wait_until, Client, Daemon, Need, TempDir};

use super::{daemon_with, kind, nobody, result_json, set_mode, Gate, NobodyDir};
use crate::network::network_violations;

/// A root daemon serving group 65534, with one profile, `net`: workspace-write with this
/// `[network]` table; `extra` is more configuration. `None` (skipped) without root or a
/// python3 for the sandbox.
fn daemon_net(network: &str, extra: &str) -> Option<(Daemon, TempDir)> {
    if skip_without(&[Need::Root, Need::Python3]) {
        return None;
    }
    let profiles = TempDir::new("profiles");
    set_mode(profiles.path(), 0o755);
    std::fs::write(
        profiles.path().join("net.toml"),
        format!("extends = \"workspace-write\"\n[network]\n{network}\n"),
    )
    .expect("write the profile");
    let d = daemon_with(&format!(
        "profiles_dir = \"{}\"\n{extra}",
        profiles.path().display()
    ))?;
    Some((d, profiles))
}

/// A workspace of uid 65534's holding the attack script, and their session there under
/// `net`; returns the workspace, the session and the script's path.
fn nobody_net_session(n: &mut Client) -> (NobodyDir, String, String) {
    let ws = NobodyDir::new("egress-ws");
    let script = ws.join("attacks.py");
    std::fs::write(&script, include_str!("../../../fixtures/egress_attacks.py"))
        .expect("write the script");
    let s = n.ok(
        "session.open",
        json!({"workspace": ws.path(), "profile": "net"}),
    )["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    (ws, s, script.display().to_string())
}

/// The daemon's open descriptors, as the host counts them.
fn open_fds(d: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .expect("read the daemon's /proc/<pid>/fd")
        .count()
}

/// Sets the daemon's soft descriptor limit from the host (the hard one stays, so it can be
/// set back).
fn set_fd_limit(d: &Daemon, soft: u64) {
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &d.pid().to_string(), &format!("--nofile={soft}:")])
        .output()
        .expect("run prlimit");
    assert!(out.status.success(), "prlimit: {out:?}");
}

/// The daemon's soft descriptor limit.
fn fd_limit(d: &Daemon) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    line.split_whitespace()
        .nth(3)
        .and_then(|n| n.parse().ok())
        .expect("a soft limit")
}

/// An allowed server that greets every connection with `hi` and never closes its end, as
/// the attack's did: whatever ends a tunnel, it is not this server.
struct HoldingServer {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl HoldingServer {
    fn start() -> HoldingServer {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let count = accepted.clone();
        std::thread::spawn(move || {
            for mut conn in l.incoming().flatten() {
                count.fetch_add(1, Ordering::SeqCst);
                let _ = conn.write_all(b"hi\n");
                let held = held.clone();
                std::thread::spawn(move || {
                    // Reads to the end of what the proxy sends, then keeps the connection.
                    let mut sink = Vec::new();
                    let _ = conn.read_to_end(&mut sink);
                    held.lock().expect("lock").push(conn);
                });
            }
        });
        HoldingServer { port, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Starts uid 65534's run that opens `n` tunnels to `srv` and holds them until the gate
/// opens; returns the task and the gate, once the tunnels are open.
fn hold_tunnels(
    c: &mut Client,
    s: &str,
    ws: &Path,
    py: &str,
    srv: &HoldingServer,
    n: usize,
) -> (String, Gate) {
    let gate = Gate::new(ws);
    let r = c.bash(
        s,
        &format!(
            "python3 {py} tunnels 127.0.0.1 {} {n} {} {}",
            srv.port,
            gate.ready.display(),
            gate.gate.display()
        ),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("task_id").to_owned();
    gate.wait_ready(c, &id);
    (id, gate)
}

#[test]
fn a_settled_runs_tunnels_stayed_open_in_the_root_daemon() {
    const N: usize = 64;
    let srv = HoldingServer::start();
    let Some((d, _p)) = daemon_net(&format!("allow = [\"127.0.0.1:{}\"]", srv.port), "") else {
        return;
    };
    let mut n = nobody(&d);
    let (ws, s, py) = nobody_net_session(&mut n);
    let before = open_fds(&d);
    let (id, gate) = hold_tunnels(&mut n, &s, ws.path(), &py, &srv, N);
    // Control: while the run lives, its tunnels work, and the daemon holds them.
    assert_eq!(srv.accepted(), N);
    let during = open_fds(&d);
    assert!(
        during >= before + 2 * N,
        "{N} tunnels, but the daemon went from {before} to {during} descriptors"
    );
    gate.open();
    let t = n.wait_settled(&id);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert!(
        n.output(&id).contains(&format!("tunnels: {N} of {N}")),
        "{}",
        n.output(&id)
    );
    // The run is over and the server keeps its ends open: the daemon must still let go of
    // every tunnel, at once.
    let mut now = 0;
    assert!(
        wait_until(Duration::from_secs(5), || {
            now = open_fds(&d);
            now <= before + 8
        }),
        "the daemon had {before} descriptors before the run, {during} during it and still {now} after it settled"
    );
}

#[test]
fn one_users_tunnels_took_the_descriptors_everyones_calls_need() {
    let srv = HoldingServer::start();
    let http = HttpServer::start();
    let Some((d, _p)) = daemon_net(
        &format!(
            "allow = [\"models.test\", \"127.0.0.1:{}\", \"127.0.0.1:{}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\" }}",
            srv.port, http.port
        ),
        "[per_user]\negress_connections = 16\n",
    ) else {
        return;
    };
    let mut n = nobody(&d);
    let (ws, s, py) = nobody_net_session(&mut n);
    let mut root = d.client();
    let rs = root.ok(
        "session.open",
        json!({"workspace": d.workspace, "profile": "net"}),
    )["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    // Control: root's call runs (and the daemon has started what runs need).
    let warm = root.bash(&rs, "echo warm", json!({}));
    assert_eq!(warm["status"], "completed", "{warm}");
    // The daemon gets a small descriptor limit: 200 tunnels of uid 65534 would take more.
    let limit = open_fds(&d) + 600;
    set_fd_limit(&d, limit as u64);
    let (id, gate) = hold_tunnels(&mut n, &s, ws.path(), &py, &srv, 200);
    // uid 65534 got its share, and no more.
    assert_eq!(srv.accepted(), 16);
    let held = open_fds(&d);
    assert!(held < limit - 100, "{held} of {limit} descriptors");
    // Root's calls, with and without the network, are not failed meanwhile.
    let plain = root.bash(&rs, "echo plain-ok", json!({}));
    assert_eq!(plain["status"], "completed", "{plain}");
    assert!(plain["output"].as_str().unwrap_or("").contains("plain-ok"));
    let net = root.bash(
        &rs,
        &format!("curl -sS -m 10 http://models.test:{}/root", http.port),
        json!({}),
    );
    assert!(
        net["output"].as_str().unwrap_or("").contains("hello /root"),
        "{net}"
    );
    gate.open();
    n.wait_settled(&id);
    assert!(
        n.output(&id).contains("tunnels: 16 of 200"),
        "{}",
        n.output(&id)
    );
}

#[test]
fn a_daemon_near_its_descriptor_limit_failed_calls_with_too_many_open_files() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let was = fd_limit(&d);
    // Control: with room, a call runs.
    assert_eq!(c.bash(&s, "true", json!({}))["status"], "completed");
    let near = open_fds(&d) as u64 + 30;
    set_fd_limit(&d, near);
    let e = c
        .call(
            "tool.call",
            json!({"session_id": s, "tool": "bash", "args": {"command": "true"}}),
        )
        .expect_err("a call with 30 descriptors left");
    assert_eq!(
        (e["code"].as_i64(), kind(&e)),
        (Some(-32004), "limit_exceeded"),
        "{e}"
    );
    assert!(
        e["message"].as_str().unwrap_or("").contains("descriptors"),
        "{e}"
    );
    // The daemon itself is fine, and takes calls again once it has room.
    c.ok("session.list", json!({}));
    set_fd_limit(&d, was);
    assert_eq!(c.bash(&s, "true", json!({}))["status"], "completed");
}

#[test]
fn a_request_head_trickled_byte_by_byte_was_served_long_after_the_head_timeout() {
    let srv = HttpServer::start();
    let port = srv.port;
    let Some((d, _p)) = daemon_net(
        &format!("allow = [\"models.test\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\" }}"),
        "[egress]\nhead_timeout_ms = 3000\n",
    ) else {
        return;
    };
    let mut n = nobody(&d);
    let (_ws, s, py) = nobody_net_session(&mut n);
    let t0 = Instant::now();
    // About 55 bytes, 0.25 s apart: 14 s for the head, each read well within 3 s.
    let r = n.bash(
        &s,
        &format!(
            "python3 {py} trickle {port} /trickled 0.25; python3 {py} trickle {port} /quick 0.005; curl -sS -m 10 http://models.test:{port}/normal"
        ),
        json!({"yield_after_ms": 60_000}),
    );
    let took = t0.elapsed();
    let out = r["output"].as_str().unwrap_or("");
    assert_eq!(r["status"], "completed", "{r}");
    let seen = srv.seen();
    assert!(
        !seen.iter().any(|l| l.contains("/trickled")),
        "the trickled head was served: {seen:?}\n{out}"
    );
    assert!(out.contains("trickle /trickled: closed"), "{out}");
    assert!(
        took < Duration::from_secs(10),
        "the run took {took:?}\n{out}"
    );
    // Controls: a head trickled within the deadline, and a plain one, are served.
    assert!(
        seen.iter().any(|l| l.contains("GET /quick")),
        "{seen:?}\n{out}"
    );
    assert!(out.contains("hello /normal"), "{out}");
}

#[test]
fn refusals_of_requests_the_proxy_cannot_serve_were_missing_from_result_json() {
    let srv = HttpServer::start();
    let port = srv.port;
    let Some((d, _p)) = daemon_net(
        &format!(
            "allow = [\"models.test\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\", \"evil.test\" = \"127.0.0.1\" }}"
        ),
        "",
    ) else {
        return;
    };
    let mut n = nobody(&d);
    let (_ws, s, py) = nobody_net_session(&mut n);
    let r = n.bash(
        &s,
        &format!("python3 {py} refusals models.test evil.test {port}"),
        json!({"yield_after_ms": 60_000}),
    );
    let out = r["output"].as_str().unwrap_or("").to_owned();
    assert_eq!(r["status"], "completed", "{r}");
    // Each was refused, as before.
    for line in [
        "http: models.test@evil.test:443 HTTP/1.1 400 Bad Request",
        "http: http://models.test@evil.test/ HTTP/1.1 400 Bad Request",
        "socks5 bind: 05070001000000000000",
        "socks5 udp: 05070001000000000000",
        "socks4: 005b000000000000",
        "dns txt evil.test: rcode 5 answers 0",
        "dns mx evil.test: rcode 5 answers 0",
        "dns ptr: rcode 5 answers 0",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }
    // Controls: the allowed forms are answered.
    for line in [
        "dns a models.test: rcode 0 answers 1",
        "dns txt models.test: rcode 0 answers 0",
        "connect allowed: HTTP/1.1 200 Connection established",
        "socks5 connect allowed: 0500",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }
    // On the host: every refusal is in result.json, and nothing allowed is.
    let task = n.task(r["task_id"].as_str().expect("task_id"));
    let result = result_json(&task);
    let v = network_violations(&result);
    let s = |h: &str| h.to_owned();
    for want in [
        (
            s("models.test@evil.test:443"),
            None,
            s("bad_request"),
            s("connect"),
        ),
        (
            s("http://models.test@evil.test/"),
            None,
            s("bad_request"),
            s("http"),
        ),
        (
            s("evil.test"),
            Some(80),
            s("unsupported_command"),
            s("socks5"),
        ),
        (
            s("evil.test"),
            Some(53),
            s("unsupported_command"),
            s("socks5"),
        ),
        (
            s("evil.test"),
            Some(80),
            s("unsupported_protocol"),
            s("socks4"),
        ),
        (s("evil.test"), None, s("not_allowed"), s("dns")),
        (
            s("1.0.0.127.in-addr.arpa"),
            None,
            s("not_allowed"),
            s("dns"),
        ),
    ] {
        assert!(v.contains(&want), "{want:?} not in {v:?}");
    }
    assert!(
        !v.iter().any(|(h, ..)| h == "models.test"),
        "an allowed request was recorded: {v:?}"
    );
    let txt_and_mx = result["violations"]
        .as_array()
        .expect("violations")
        .iter()
        .find(|x| x["host"] == "evil.test" && x["via"] == "dns")
        .expect("the dns refusals of evil.test");
    assert_eq!(txt_and_mx["count"], 2, "{txt_and_mx}");
}
